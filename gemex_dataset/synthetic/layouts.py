"""The synthetic GEMeX release's annotation files, in the three layouts the real release comes in: per
question type (`per_type/<split>/<type>_question.jsonl`), LLaVA conversations
(`llava/<split>/<split>_conversations.json`) and grouped by image (`grouped/<split>/<split>_questions.jsonl`
with `<split>_images.csv`), written an image at a time, byte for byte as the release's files are laid out.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from builders.provenance import ManifestWriter
from gemex_dataset.features import LLAVA_Q_TYPES
from gemex_dataset.prompts import TYPE_PROMPTS
from gemex_dataset.synthetic.distributions import QUESTIONS_PER_IMAGE

LAYOUTS = ("per_type", "llava", "grouped")


def llava_record(q: dict, qtype: str, row: int, image_path: str) -> dict:
    human = f"<image>\n{q['question']}"
    if "choices" in q:
        human += " <choices>: [" + ", ".join(q["choices"]) + "]"
    answer = repr(q["answer"]) if qtype == "multi_choice" else q["answer"]
    gpt = f"<answer> {answer} <reason> {q['reason']} <location> {json.dumps(q['visual_locations'])}"
    return {
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}],
        "row_id": row,
        "q_type": LLAVA_Q_TYPES[qtype],
        "type_prompt": TYPE_PROMPTS[qtype],
        "image": image_path,
    }


class JsonArrayWriter:
    """Writes a JSON array one element at a time, byte for byte as `json.dumps(items, indent=1)` would."""

    def __init__(self, path: Path):
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close(), one element at a time
        self.count = 0

    def add(self, item: dict) -> None:
        self.file.write(("[\n " if self.count == 0 else ",\n ") + json.dumps(item, indent=1).replace("\n", "\n "))
        self.count += 1

    def close(self) -> None:
        self.file.write("\n]" if self.count else "[]")
        self.file.close()


class SplitWriter:
    """One split's annotation files in each layout, open while the split's images are generated."""

    def __init__(self, out: Path, split: str, layouts: tuple[str, ...]):
        self.paths: list[Path] = []
        self.per_type: dict[str, object] = {}
        self.llava = self.grouped = self.csv_file = None
        if "per_type" in layouts:
            folder = out / "per_type" / split
            folder.mkdir(parents=True, exist_ok=True)
            self.per_type = {t: self._open(folder / f"{t}_question.jsonl") for t in QUESTIONS_PER_IMAGE}
        if "llava" in layouts:
            folder = out / "llava" / split
            folder.mkdir(parents=True, exist_ok=True)
            self.paths.append(folder / f"{split}_conversations.json")
            self.llava = JsonArrayWriter(self.paths[-1])
        if "grouped" in layouts:
            folder = out / "grouped" / split
            folder.mkdir(parents=True, exist_ok=True)
            self.grouped = self._open(folder / f"{split}_questions.jsonl")
            self.csv_file = self._open(folder / f"{split}_images.csv", newline="")
            self.csv = csv.writer(self.csv_file)
            self.csv.writerow(["mimic_image_file_path"])
        self.counts = dict.fromkeys(QUESTIONS_PER_IMAGE, 0)

    def _open(self, path: Path, **options):
        self.paths.append(path)
        return open(path, "w", encoding="utf-8", **options)

    def add_image(self, row: int, image_path: str, qs: dict[str, list[dict]], text: str) -> int:
        """Write one image's questions in every layout; returns how many."""
        for qtype, items in qs.items():
            for q in items:
                if self.per_type:  # the release's files end without a trailing newline
                    rec = {"question": q["question"]}
                    if "choices" in q:
                        rec["choices"] = q["choices"]
                    rec.update({k: q[k] for k in ("type", "answer", "reason", "visual_regions", "visual_locations")})
                    rec.update(
                        {
                            "image_path": image_path,
                            "ori_report": text,
                            "q_id": self.counts[qtype],
                            "row_id": f"row_{row}",
                        }
                    )
                    self.per_type[qtype].write(("\n" if self.counts[qtype] else "") + json.dumps(rec))
                if self.llava:
                    self.llava.add(llava_record(q, qtype, row, image_path))
                self.counts[qtype] += 1
        if self.grouped:
            self.grouped.write(
                json.dumps(
                    {
                        f"{t}_questions": [
                            {k: q[k] for k in ("question", "choices", "answer", "reason", "visual_locations") if k in q}
                            for q in items
                        ]
                        for t, items in qs.items()
                    }
                )
                + "\n"
            )
            self.csv.writerow([f"files/{image_path}"])
        return sum(len(items) for items in qs.values())

    def close(self, manifest: ManifestWriter) -> None:
        for file in [*self.per_type.values(), self.llava, self.grouped, self.csv_file]:
            if file is not None:
                file.close()
        for path in self.paths:
            manifest.add(path)
