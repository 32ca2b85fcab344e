"""The build report: every raw record is either written or rejected with its reason.

`build_report.json` holds records read, rows written, the rejects (file, record, field,
reason), counts per split and config (the conversation config's rows apart, in
`conversation_rows`: they hold the same questions again), what was noticed without rejecting (clipped boxes,
unknown region names, missing images), the settings, the shards' checksums and the card's
configs as built, each with the files it reads and the rows it counts per split
(`config_files`; `cxr-vqa validate` checks the folder against all of it).
`read == written + rejected` is checked before the report is saved.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from builders.json_stream import printable


@dataclass
class Reject:
    """A raw record (or a whole file, `record=None`) that will not become a row, and why."""

    file: str
    record: str | None
    field: str | None
    reason: str

    def line(self) -> str:
        where = ", ".join(filter(None, [self.file, self.record, f"field {self.field}" if self.field else None]))
        return f"{where}: {self.reason}"


class BuildError(RuntimeError):
    """A build that must stop; the message is the one line the CLI prints."""


@dataclass
class BuildReport:
    dataset: str
    settings: dict
    records_read: int = 0
    rows_written: int = 0
    rejects: list[Reject] = field(default_factory=list)
    rows: Counter = field(default_factory=Counter)  # "split/config" -> rows
    conversation_rows: Counter = field(
        default_factory=Counter
    )  # "split/sft_per_image" -> rows: the same questions as conversations
    notices: Counter = field(default_factory=Counter)  # e.g. "boxes clipped to the frame"
    unknown_values: dict[str, Counter] = field(default_factory=dict)  # e.g. "region" -> name -> count
    images: Counter = field(default_factory=Counter)  # "split" -> distinct images written
    shards: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    configs: list[str] = field(default_factory=list)  # the card's configs as built
    config_files: dict = field(
        default_factory=dict
    )  # config -> its filters, and per split its files and rows (card.config_record)
    provenance: dict = field(default_factory=dict)  # synthetic or real, and why (builders.provenance)
    source_note: str = ""  # which copy was read where the source holds the same records more than once

    def reject(self, item: Reject) -> None:
        self.rejects.append(item)

    def count_unknown(self, kind: str, value: str, times: int = 1) -> None:
        self.unknown_values.setdefault(kind, Counter())[value] += times

    @property
    def rejected(self) -> int:
        return len(self.rejects)

    def reject_reasons(self) -> Counter:
        """Rejects per reason, with the record-specific part of the reason cut off."""
        return Counter(r.reason.split(":")[0].split(" (")[0] if len(r.reason) > 60 else r.reason for r in self.rejects)

    def check_accounts(self) -> None:
        if self.records_read != self.rows_written + self.rejected:
            raise BuildError(
                f"internal error: read {self.records_read} records but wrote {self.rows_written} and rejected {self.rejected}"
            )

    def to_dict(self) -> dict:
        return {
            "dataset": self.dataset,
            "records_read": self.records_read,
            "rows_written": self.rows_written,
            "rejected": self.rejected,
            "rows": dict(sorted(self.rows.items())),
            "conversation_rows": dict(sorted(self.conversation_rows.items())),
            "images": dict(sorted(self.images.items())),
            "notices": dict(self.notices),
            "unknown_values": {k: dict(v.most_common()) for k, v in self.unknown_values.items()},
            "reject_reasons": dict(self.reject_reasons().most_common()),
            "rejects": [asdict(r) for r in self.rejects],
            "settings": self.settings,
            "shards": self.shards,
            "configs": self.configs,
            "config_files": self.config_files,
            "provenance": self.provenance,
            "source_note": self.source_note,
        }

    def save(self, path: Path) -> None:
        self.check_accounts()
        data = self.to_dict()
        text = json.dumps(data, indent=2, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a path that is not UTF-8 (a setting, a notice): shown with \x escapes
            text = json.dumps(_printable_strings(data), indent=2, ensure_ascii=False)
        path.write_text(text + "\n", encoding="utf-8")

    @staticmethod
    def add_files(
        path: Path, shards: dict[str, str], files: dict[str, str], config: str | None = None, record: dict | None = None
    ) -> None:
        """Record, in a saved report, data files a tool added to the build after it (`preview --add-config`):
        shards and other files with their sha256, and the config they make with what it reads (`record`,
        `card.config_record`). `validate` checks them like the build's own, and `publish` uploads nothing
        the report does not list."""
        from builders.files import write_text

        report = json.loads(path.read_text(encoding="utf-8"))
        report["shards"] = {**report.get("shards", {}), **shards}
        report["files"] = {**report.get("files", {}), **files}
        if config and config not in report.setdefault("configs", []):
            report["configs"].append(config)
        if config and record is not None:
            report["config_files"] = {**report.get("config_files", {}), config: record}
        write_text(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")

    def summary(self) -> str:
        text = f"{self.records_read} records read, {self.rows_written} rows written, {self.rejected} rejected"
        if self.rejected:
            top = "; ".join(f"{n} x {reason}" for reason, n in self.reject_reasons().most_common(3))
            text += f" ({top})"
        if self.source_note:
            text += f"; {self.source_note}"
        return text


def _printable_strings(value: object) -> object:
    """`value` with every string (keys too) `printable`: UTF-8 can write it."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable_strings(k): _printable_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_strings(v) for v in value]
    return value
