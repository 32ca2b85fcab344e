"""Reading raw JSON releases record by record, so that damaged bytes cost only the records they touch.

A release file is one JSON object keyed by record id (ReXVQA) or one JSON array of records
(GEMeX LLaVA), up to hundreds of MB. `RecordStream` decodes one record at a time with
`json.JSONDecoder.raw_decode` over a buffered text stream (like the releases, it reads bare
`NaN`). Where a record does not parse (a bad token, a cut, nesting too deep for Python's
json), the stream reports the damaged region once and resynchronises at the next top-level
record start: `"<id>": {` in an object keyed by id, `{` in an array, at the indentation of
the file's first record when the file is pretty-printed. A candidate start is taken only if
its record parses and is followed by `,` or the file's end, so a nested object is not
mistaken for a record. Bad UTF-8 is read with errors="surrogateescape" and costs only the
record whose text holds it. A UTF-8 byte order mark at the start of a file is skipped.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

_BAD_BYTE = re.compile("[\udc80-\udcff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SPACE = re.compile(r"\s*")
_KEY = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_DECODER = json.JSONDecoder()
_OPENER = {"object": "{", "array": "["}
_CLOSER = {"object": "}", "array": "]"}


def open_text(path: Path) -> TextIO:
    """`path` as UTF-8 text, a leading BOM skipped; undecodable bytes stay as lone surrogates for the reader to find."""
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")


def printable(text: str) -> str:
    """`text` with undecodable bytes shown as `\\xNN` (other lone surrogates as `\\udNNN`), for a reject's record or reason."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def lone_surrogate(value: object, where: str = "$") -> str | None:
    """Where `value` holds a string (a key or a value) with a lone surrogate, or None.

    Python's json turns an escape such as `\\ud800` that is half of no pair into a lone
    surrogate, which no UTF-8 column can store; such a record is damaged, not crashed on.
    """
    if isinstance(value, str):
        return where if _has_bad_bytes(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = f"{where}.{printable(key)}" if _has_bad_bytes(key) else lone_surrogate(item, f"{where}.{key}")
            if found:
                return found
    elif isinstance(value, list):
        for k, item in enumerate(value):
            if found := lone_surrogate(item, f"{where}[{k}]"):
                return found
    return None


def lone_surrogate_reason(where: str) -> str:
    return f"a \\u escape with no pair (a lone surrogate, which UTF-8 cannot store) at {where}"


def bad_utf8_at(text: str, start: int = 0, end: int | None = None) -> int | None:
    """Offset (in characters from `start`) of the first byte of `text[start:end]` that was not UTF-8, or None."""
    match = _BAD_BYTE.search(text, start, len(text) if end is None else end)
    return None if match is None else match.start() - start


def _has_bad_bytes(text: str) -> bool:
    """Whether `text` holds undecodable bytes: they alone (lone surrogates) fail a strict encoding, which runs in C."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class LineError(ValueError):
    """A JSON Lines line that cannot be read; the message is the reject's reason."""


def loads_line(raw: bytes) -> object:
    """The value of one JSON Lines line (a leading BOM skipped); raises LineError for bad UTF-8, bad JSON or deep nesting."""
    try:
        text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as err:
        raise LineError(f"not valid UTF-8 (byte {err.start} of the line)") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise LineError(f"malformed JSON: {err.msg} at column {err.colno}") from None
    except RecursionError:
        raise LineError("JSON nested too deeply to read") from None
    if _SURROGATE_ESCAPE.search(text) and (where := lone_surrogate(value)):
        raise LineError(lone_surrogate_reason(where))
    return value


@dataclass
class Damage:
    """A damaged region of a file: `record` names the record it starts in (its id or `index N`), None for the whole file."""

    record: str | None
    reason: str


class RecordStream:
    """The records of one JSON object keyed by id (`kind="object"`) or JSON array (`kind="array"`).

    Iterating yields `(record, value)` for each record that parses, `record` being the id or
    `index N`, and a `Damage` for each region that does not. Memory holds one record's text
    (and, after damage, the text up to the next record start).
    """

    def __init__(self, file: TextIO, kind: Literal["object", "array"], block: int = 1 << 20):
        self.file, self.kind, self.block = file, kind, block
        self.text, self.pos, self.consumed, self.eof = "", 0, 0, False
        self.holds_bad_bytes = False  # whether the text held may have undecodable bytes: only then is a record searched for them
        self.record_start: re.Pattern | None = None
        self.key: str | None = None  # the id of the record being read, once its key has parsed

    # -- buffer ---------------------------------------------------------------------------------

    def _more(self) -> bool:
        if self.eof:
            return False
        data = self.file.read(self.block)
        if not data:
            self.eof = True
            return False
        self.text += data
        self.holds_bad_bytes = self.holds_bad_bytes or _has_bad_bytes(data)
        return True

    def _forget_read(self) -> None:
        """Drop the text before the current position once it is a block's worth (copying what is left after
        every record cost a buffer's copy per record); called only between records so positions stay valid within one."""
        if self.pos < self.block:
            return
        self.consumed += self.pos
        self.text, self.pos = self.text[self.pos:], 0
        self.holds_bad_bytes = self.holds_bad_bytes and _has_bad_bytes(self.text)

    def _peek(self) -> str:
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self._more():
                return self.text[self.pos:self.pos + 1]

    def _value(self) -> object:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as err:
                # Only a cut at the buffer's end is worth more text; a bad token fails again wherever the buffer ends.
                if self._cut(err) and self._more():
                    continue
                raise
            if end == len(self.text) and self._more():  # a number may go on in the next block
                continue
            self.pos = end
            return value

    def _cut(self, err: json.JSONDecodeError) -> bool:
        """Whether `err` comes from the text ending (a cut), not from a bad token."""
        return err.pos >= len(self.text) - 16 or err.msg.startswith("Unterminated string")

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            found = self.text[self.pos:self.pos + 1]
            raise json.JSONDecodeError(f"expected {char!r}, found {found!r}" if found else f"expected {char!r}, found the end of the file",
                                       self.text, self.pos)
        self.pos += 1

    # -- records --------------------------------------------------------------------------------

    def _member(self, index: int) -> tuple[str, object]:
        if self.kind == "array":
            return f"index {index}", self._value()
        key = self._value()
        if not isinstance(key, str):
            raise json.JSONDecodeError("expected a record id (a string)", self.text, self.pos)
        self.key = key
        self._expect(":")
        return key, self._value()

    def _label_at(self, start: int, index: int) -> str:
        if self.kind == "array":
            return f"index {index}"
        if self.key is not None:
            return printable(self.key)
        key = _KEY.match(self.text, start)
        return printable(key.group(1)) if key else f"the record after index {index - 1}" if index else "the first record"

    def _learn_layout(self) -> None:
        """The pattern of a top-level record start, from the whitespace before the first record."""
        lead = _SPACE.match(self.text, self.pos).group()
        indent = re.escape(lead[lead.rindex("\n"):]) if "\n" in lead else r"(?<=[,\[{])\s*"
        start = r'"(?:[^"\\\n]|\\.)*"\s*:\s*\{' if self.kind == "object" else r"\{"
        self.record_start = re.compile(f"{indent}(?={start})")

    def _starts_record(self, at: int, look_ahead: int = 3) -> bool:
        """Whether a top-level record starts at `at`: it and the next records (up to `look_ahead`) parse,
        each followed by `,` or by the closing bracket and the end of the file."""
        saved, key = self.pos, self.key
        self.pos = at
        try:
            for _ in range(look_ahead):
                self._member(0)
                after = self._peek()
                self.pos += 1
                if after == _CLOSER[self.kind]:
                    return self._peek() == ""
                if after != ",":
                    return False
            return True
        except (json.JSONDecodeError, RecursionError):
            return False
        finally:
            self.pos, self.key = saved, key

    def _resync(self, search_from: int) -> bool:
        """Move to the next top-level record start at or after `search_from`; False if the file has none."""
        while True:
            for match in self.record_start.finditer(self.text, search_from):
                if self._starts_record(match.end()):
                    self.pos = match.end()
                    return True
            search_from = max(search_from, len(self.text) - 256)
            if not self._more():
                return False

    def __iter__(self) -> Iterator[tuple[str, object] | Damage]:
        opener, closer = _OPENER[self.kind], _CLOSER[self.kind]
        if self._peek() != opener:
            what = "a JSON object keyed by record id" if self.kind == "object" else "a JSON array of records"
            yield Damage(None, f"expected {what}; none of its records can be read")
            return
        self.pos += 1
        self._learn_layout()
        if self._peek() == closer:
            self.pos += 1
            yield from self._end()
            return
        index = 0
        while True:
            self._forget_read()
            start, label, self.key = self.pos, None, None
            try:
                label, value = self._member(index)
                after = self._peek()
                if after not in (",", closer):
                    raise json.JSONDecodeError(f"expected ',' or {closer!r} after the record", self.text, self.pos)
            except (json.JSONDecodeError, RecursionError) as err:
                label = printable(label) if label is not None else self._label_at(start, index)
                if isinstance(err, RecursionError):
                    reason, search_from = "JSON nested too deeply to read", start + 1
                else:
                    reason, search_from = f"malformed JSON at character {self.consumed + err.pos}: {err.msg}", max(start + 1, err.pos)
                if not self._resync(search_from):
                    cut = isinstance(err, json.JSONDecodeError) and self._cut(err)
                    yield Damage(label, f"{reason}; " + ("the file ends inside this record" if cut else "no record after it can be read"))
                    return
                yield Damage(label, reason)
                index += 1
                continue
            bad = bad_utf8_at(self.text, start, self.pos) if self.holds_bad_bytes else None
            lone = None
            if _SURROGATE_ESCAPE.search(self.text, start, self.pos):
                lone = "the record id" if _has_bad_bytes(label) else lone_surrogate(value)
            if bad is not None:
                yield Damage(printable(label), f"not valid UTF-8 at character {self.consumed + start + bad}")
            elif lone:
                yield Damage(printable(label), lone_surrogate_reason(lone))
            else:
                yield label, value
            index += 1
            self.pos += 1
            if after == closer:
                yield from self._end()
                return

    def _end(self) -> Iterator[Damage]:
        if self._peek() != "":
            yield Damage(None, f"text after the end of the top-level JSON value at character {self.consumed + self.pos}")
