"""Reading raw JSON releases record by record, so that damaged bytes cost only the records they touch.

A release file is one JSON object keyed by record id (ReXVQA) or one JSON array of records
(GEMeX LLaVA), up to hundreds of MB. `RecordStream` decodes one record at a time with
`json.JSONDecoder.raw_decode` over a buffered text stream (like the releases, it reads bare
`NaN`). A record is taken only when it is certainly whole: in a pretty-printed file its
closing bracket must stand first on its line at the indentation it opened at (a stray bracket
inside a record closes it early, after a value on the same line). Where a record is not whole
or does not parse (a bad token, a cut, nesting too deep for Python's json, an integer longer
than Python reads), the stream reports the damaged region once and resynchronises at the next
line at the records' indentation (learnt from the records read, and before the first is read
from the file's first lines) that starts a record: `"<id>":` in an object keyed by id, a value
in an array. In a file on one line, where nested objects look like records, a candidate
`"<id>": {` or `{` is taken only if it and the next two records are whole. The search goes
forward only, so a damaged run costs time in proportion to its length. Bad UTF-8 is read with
errors="surrogateescape" and costs only the record whose text holds it. A UTF-8 byte order
mark at the start of a file is skipped.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
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


def name_not_utf8(path: Path) -> str | None:
    """`path` shown with `\\xNN` escapes where its name is not UTF-8 (no column or report can hold it), else None."""
    name = str(path)
    return printable(name) if _has_bad_bytes(name) else None


NAME_NOT_UTF8 = "the file's name is not UTF-8 (shown with \\x escapes), so no row or report could name it: rename the file to read it"


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


def too_long_integer(text: str, start: int = 0) -> tuple[str | None, str, int]:
    """(field, reason, offset) of the first integer at or after `start` with more digits than Python reads.

    Python's `int` refuses a string of more than `sys.get_int_max_str_digits()` digits (4,300 by
    default, against a denial of service), so its json raises a plain ValueError, with no position.
    """
    limit = sys.get_int_max_str_digits()
    found = re.compile(rf'(?:"((?:[^"\\\n]|\\.)*)"\s*:\s*)?-?([0-9]{{{limit + 1},}})').search(text, start)
    if found is None:
        return None, f"an integer of more than {limit} digits, more than Python reads", start
    field = printable(found.group(1)) if found.group(1) is not None else None
    return field, f"an integer of {len(found.group(2))} digits, more than Python reads ({limit})", found.start(2)


class LineError(ValueError):
    """A JSON Lines line that cannot be read; the message is the reject's reason, `field` the field at fault if known."""

    def __init__(self, reason: str, field: str | None = None):
        super().__init__(reason)
        self.field = field


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
    except ValueError:
        field, reason, _ = too_long_integer(text)
        raise LineError(reason, field) from None
    if _SURROGATE_ESCAPE.search(text) and (where := lone_surrogate(value)):
        raise LineError(lone_surrogate_reason(where))
    return value


@dataclass
class Damage:
    """A damaged region of a file: `record` names the record it starts in (its id or `index N`), None for the whole file."""

    record: str | None
    reason: str
    field: str | None = None


_KEY_PATTERN = r'"(?:[^"\\\n]|\\.)*"'
_OBJECT_RECORD_START = {"object": _KEY_PATTERN + r"\s*:\s*\{", "array": r"\{"}
"""A record start that structure alone cannot place: an object-valued member, as any nested object also looks."""
_INDENTED_START = {"object": _KEY_PATTERN + r"[ \t]*:", "array": r"[^\s\]]"}
"""A record start on a line of its own at the records' indentation, which nested values never share."""
_LINE_LEAD = re.compile(r"\n([ \t]*)(?=\S)")
_FIRST_LINES = 8192
"""Characters after the opening bracket whose lines' indentation gives the records' (`_indent_from_first_lines`)."""
_LOOSE_START = {
    kind: re.compile(rf"(?:(?<=[,\[{{\n])|^)[ \t\r\n]*(?={start})") for kind, start in _OBJECT_RECORD_START.items()
}
_NEXT_OBJECT_RECORD = {kind: re.compile(rf"\s*{start}") for kind, start in _OBJECT_RECORD_START.items()}
_FORGET_AFTER = 4096
"""While resynchronising, text this far behind the search is dropped: a failed parse costs the decoder the
offset it fails at (it counts the lines before it), so that offset must stay near the record tried."""
_LONGEST_START = 1024
"""Characters a record start's pattern may need past its first one: near the buffer's end, a match waits for more text."""


class RecordStream:
    """The records of one JSON object keyed by id (`kind="object"`) or JSON array (`kind="array"`).

    Iterating yields `(record, value)` for each record that parses, `record` being the id or
    `index N`, and a `Damage` for each region that does not. Memory holds one record's text
    (and, after damage, a few KiB before the next record start).

    A record is taken only when it is certainly whole. In a pretty-printed file a record that
    spans lines must end with its closing bracket first on its line: a record that a stray
    bracket inside it closes early ends after a value on the same line. A record on one line
    must be followed by `,` and a record start alike (another `"<id>": {` or `{`), the closing
    bracket, or the end of the file. After damage, reading resynchronises at the next line at
    the records' indentation (learnt from the records read, or hinted by the file's first lines
    while none has been) that starts a record, or, in a file on one line, at the next
    `"<id>": {` or `{` whose record and the next two are whole.
    The search and the parses it tries go over each character a bounded number of times:
    `work` counts the characters the decoder and the search went over.
    """

    def __init__(self, file: TextIO, kind: Literal["object", "array"], block: int = 1 << 16):
        self.file, self.kind, self.block = file, kind, block
        self.opener, self.closer = _OPENER[kind], _CLOSER[kind]
        self.text, self.pos, self.consumed, self.eof = "", 0, 0, False
        self.holds_bad_bytes = (
            False  # whether the text held may have undecodable bytes: only then is a record searched for them
        )
        self.indents: Counter[str | None] = Counter()  # the indentation of the records read whole on lines of their own
        self.records_indent: str | None = (
            None  # the most common of them: the records' indentation in a pretty-printed file
        )
        self.indent_hint: str | None = (
            None  # the records' indentation as the file's first lines show it (`_indent_from_first_lines`)
        )
        self.key: str | None = None  # the id of the record being read, once its key has parsed
        self.record_end = 0  # where the record last read ends
        self.record_indent: str | None = None  # and its indentation, if it starts a line
        self.damaged_field: str | None = None  # the field a record's damage was found in, where known
        self.work = 0

    # -- buffer ---------------------------------------------------------------------------------

    def _more(self, at_least: int = 0) -> bool:
        if self.eof:
            return False
        data = self.file.read(max(self.block, at_least))
        if not data:
            self.eof = True
            return False
        self.text += data
        self.holds_bad_bytes = self.holds_bad_bytes or _has_bad_bytes(data)
        return True

    def _forget(self, before: int) -> None:
        """Drop the text before offset `before`; offsets held elsewhere must be moved by the caller."""
        self.consumed += before
        self.text, self.pos = self.text[before:], self.pos - before
        self.holds_bad_bytes = self.holds_bad_bytes and _has_bad_bytes(self.text)

    def _forget_read(self) -> None:
        """Drop the text before the current position once it is a block's worth (copying what is left after
        every record cost a buffer's copy per record); called only between records so positions stay valid within one."""
        if self.pos >= self.block:
            self._forget(self.pos)

    def _peek(self) -> str:
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self._more():
                return self.text[self.pos : self.pos + 1]

    def _value(self) -> object:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as err:
                self.work += err.pos
                # Only a cut at the buffer's end is worth more text (as much again as the record holds, so a long
                # record is parsed a bounded number of times); a bad token fails again wherever the buffer ends.
                if self._cut(err) and self._more(len(self.text) - self.pos):
                    continue
                raise
            except RecursionError:
                self.work += len(self.text)
                raise
            except ValueError:
                self.damaged_field, reason, at = too_long_integer(self.text, self.pos)
                raise self._error(reason, at) from None
            self.work += end - self.pos
            if end == len(self.text) and self._more():  # a number may go on in the next block
                continue
            self.pos = end
            return value

    def _cut(self, err: json.JSONDecodeError) -> bool:
        """Whether `err` comes from the text ending (a cut), not from a bad token."""
        return err.pos >= len(self.text) - 16 or err.msg.startswith("Unterminated string")

    def _error(self, message: str, at: int) -> json.JSONDecodeError:
        self.work += at
        return json.JSONDecodeError(message, self.text, at)

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            found = self.text[self.pos : self.pos + 1]
            raise self._error(
                f"expected {char!r}, found {found!r}" if found else f"expected {char!r}, found the end of the file",
                self.pos,
            )
        self.pos += 1

    # -- records --------------------------------------------------------------------------------

    def _member(self, index: int) -> tuple[str, object]:
        if self.kind == "array":
            return f"index {index}", self._value()
        key = self._value()
        if not isinstance(key, str):
            raise self._error("expected a record id (a string)", self.pos)
        self.key = key
        self._expect(":")
        return key, self._value()

    def _closes_at(self, indent: str | None, start: int, end: int) -> bool | None:
        """Whether the value in `text[start:end]`, which spans lines, ends with its closing bracket first on its
        line, at `indent` when that is known; None for a value on one line."""
        last_line = self.text.rfind("\n", start, end - 1)
        if last_line < 0:
            return None
        lead = self.text[last_line + 1 : end - 1]
        return lead == indent if indent is not None else not lead.strip(" \t\r")

    def _indent(self, start: int) -> str | None:
        """The indentation of a record starting at `start`, if it starts a line."""
        line = self.text.rfind("\n", max(0, start - 256), start)
        lead = self.text[line + 1 : start]
        return lead if line >= 0 and not lead.strip(" \t\r") else None

    def _record(self, index: int) -> tuple[str, object, str, bool | None]:
        """The record at the current position, the first after whitespace (`_peek`): (label, value, what follows it,
        whether it closed on its own line).

        Raises JSONDecodeError where it does not parse or is not certainly whole; the position is then left inside it.
        """
        start = self.pos
        indent = self.record_indent = self._indent(start)
        records = self.records_indent
        if indent is not None and records is not None and indent != records:
            raise self._error(
                f"the record starts at an indentation of {len(indent)}, the file's records at {len(records)}", start
            )
        label, value = self._member(index)
        end = self.record_end = self.pos
        own_line = self._closes_at(indent, start, end)
        if own_line is False:
            raise self._error(
                "the record ends early: its closing bracket is not on a line of its own at the indentation "
                "it opened at (a stray bracket inside it?)",
                end - 1,
            )
        after = self._peek()
        if (
            after == ","
            and own_line is None
            and isinstance(value, dict)
            and not self._object_record_at(self.pos + 1)
            and self._leftover_members(self.pos + 1)
        ):
            raise self._error(
                "the record ends early: what follows its ',' is the rest of an object (a stray bracket inside it?)",
                self.pos,
            )
        if after not in (",", self.closer, ""):
            if own_line:
                return label, value, after, own_line
            raise self._error(f"expected ',' or {self.closer!r} after the record", self.pos)
        return label, value, after, own_line

    def _object_record_at(self, at: int) -> bool:
        """Whether an object-valued record starts at `at` (after whitespace), or only whitespace and the closing bracket follow."""
        while len(self.text) < at + _LONGEST_START and self._more():
            pass
        if _NEXT_OBJECT_RECORD[self.kind].match(self.text, at):
            return True
        saved, self.pos = self.pos, at
        try:
            return self._peek() in (self.closer, "")
        finally:
            self.pos = saved

    def _reads_at(self, at: int, check: Callable[[], bool]) -> bool:
        """`check()` read from offset `at`, False where the text there does not parse; the position is left as it was."""
        saved, key = self.pos, self.key
        self.pos = at
        try:
            return check()
        except (json.JSONDecodeError, RecursionError):
            return False
        finally:
            self.pos, self.key = saved, key

    def _leftover_members(self, at: int) -> bool:
        """Whether the text at `at` reads as the rest of an object's members and its closing brace: what a stray
        bracket that closed a record early leaves behind it."""
        return self._reads_at(at, self._rest_of_object)

    def _rest_of_object(self) -> bool:
        while self._peek() == '"':
            self._value()
            self._expect(":")
            self._value()
            after = self._peek()
            if after == "}":
                return True
            if after != ",":
                return False
            self.pos += 1
        return False

    def _label_at(self, start: int, index: int) -> str:
        if self.kind == "array":
            return f"index {index}"
        if self.key is not None:
            return printable(self.key)
        key = _KEY.match(self.text, start)
        return (
            printable(key.group(1)) if key else f"the record after index {index - 1}" if index else "the first record"
        )

    def _learn_indent(self, indent: str) -> None:
        """Count a whole record's indentation: the file's records are at the most common one (`records_indent`)."""
        self.indents[indent] += 1
        if indent != self.records_indent and self.indents[indent] > self.indents[self.records_indent]:
            self.records_indent = indent

    def _indent_from_first_lines(self, start: int) -> None:
        """Take a hint of the records' indentation from the file's own structure before any record is read, so that
        damage in the first record resynchronises at the next record even where the one after that is damaged too.

        A pretty-printed file indents each level by the same step, and its records by one step: the hint is
        the greatest step that divides the indentation of every line in the first `_FIRST_LINES` characters
        after the opening bracket, where a line stands at that step (a record's first or last line). Damage to
        one line can make it smaller (then no record start is at it), and not larger where another line of the
        sample stands at an odd number of steps; a nested value is never at one step. Until a
        record has been read whole (`records_indent`), a record start at the hinted indentation is taken once
        its record is whole and closes on its own line there; a start elsewhere still needs the records after
        it whole (`_starts_record`).
        """
        while len(self.text) < start + _FIRST_LINES and self._more():
            pass
        leads = {lead.group(1) for lead in _LINE_LEAD.finditer(self.text, start, start + _FIRST_LINES)} - {""}
        chars = set("".join(leads))
        if len(chars) == 1:
            step = chars.pop() * math.gcd(*map(len, leads))
            self.indent_hint = step if step in leads else None

    def _start_pattern(self) -> tuple[re.Pattern, str | None]:
        """The pattern of a top-level record start, and the records' indentation in a pretty-printed file (learnt,
        or else hinted by the file's first lines); where that is known, the pattern's group `exact` matches a
        start at it."""
        indent = self.records_indent
        if indent is not None:
            return re.compile(f"(?P<exact>\\n{re.escape(indent)}(?={_INDENTED_START[self.kind]}))"), indent
        if (hint := self.indent_hint) is not None:
            return re.compile(
                f"(?P<exact>\\n{re.escape(hint)}(?={_INDENTED_START[self.kind]}))|{_LOOSE_START[self.kind].pattern}"
            ), hint
        return _LOOSE_START[self.kind], None

    def _starts_record(self, at: int, indent: str | None, look_ahead: int = 3, at_least: int = 1) -> bool:
        """Whether a top-level record starts at `at`: it is whole; where it does not close on its own line at
        `indent` (the records' indentation, None where unknown), the next records (up to `look_ahead`)
        are whole too and alike (at the same indentation, their objects' first key the same), the last
        followed by the closing bracket and the end of the file."""
        return self._reads_at(at, lambda: self._records_follow(indent, look_ahead, at_least))

    def _records_follow(self, indent: str | None, look_ahead: int, at_least: int) -> bool:
        indents, first_keys = set(), set()
        for count in range(1, look_ahead + 1):
            self._peek()
            _, value, after, own_line = self._record(0)
            if own_line and indent is not None and self.record_indent == indent:
                return True
            indents.add(self.record_indent)
            first_keys.add(next(iter(value), None) if isinstance(value, dict) else None)
            if len(indents) > 1 or len(first_keys) > 1:
                return False
            if after != ",":
                self.pos += after == self.closer
                return after == self.closer and self._peek() == "" and count >= at_least
            self.pos += 1
        return True

    def _resync(self, search_from: int, at_least: int = 1) -> bool:
        """Move to the next top-level record start at or after `search_from`; False if the file has none.

        The search goes forward only, dropping the text behind it, so a damaged run costs time in proportion to its length.
        `at_least`: the records a start found by look-ahead must lead (`_starts_record`).
        """
        pattern, indent = self._start_pattern()
        at = search_from
        while True:
            if at > _FORGET_AFTER:
                self._forget(at - 1)
                at = 1
            match = pattern.search(self.text, at)
            self.work += (match.end() if match else len(self.text)) - at
            if match and (self.eof or match.start() < len(self.text) - _LONGEST_START):
                exact = "exact" in pattern.groupindex and match["exact"] is not None
                if self._starts_record(match.start(), indent if exact else None, at_least=at_least):
                    self.pos = match.start()
                    return True
                at = max(match.end(), match.start() + 1)
                continue
            if not self._more():
                if match is None:
                    return False
                continue
            at = max(at, len(self.text) - self.block - _LONGEST_START)

    def _damage(self, start: int, index: int, label: str | None, err: Exception) -> tuple[Damage, bool]:
        """The damage of the record at `start` that failed with `err`, and whether reading can go on after it."""
        label = printable(label) if label is not None else self._label_at(start, index)
        field = self.damaged_field
        if isinstance(err, RecursionError):
            reason = "JSON nested too deeply to read"
        else:
            reason = f"malformed JSON at character {self.consumed + err.pos}: {err.msg}"
        cut = isinstance(err, json.JSONDecodeError) and self._cut(err)
        if not self._resync(start + 1):
            return Damage(
                label,
                f"{reason}; " + ("the file ends inside this record" if cut else "no record after it can be read"),
                field,
            ), False
        return Damage(label, reason, field), True

    def __iter__(self) -> Iterator[tuple[str, object] | Damage]:
        if self._peek() == self.opener:
            self.pos += 1
            self._indent_from_first_lines(self.pos)
        else:
            what = "a JSON object keyed by record id" if self.kind == "object" else "a JSON array of records"
            at = self.consumed + self.pos
            if not self._resync(0):
                yield Damage(None, f"expected {what}; none of its records can be read")
                return
            yield Damage(
                None,
                f"expected {what}, found {self.text[at - self.consumed : at - self.consumed + 1]!r} at character {at}"
                f"; reading starts at the first record found, character {self.consumed + self.pos}",
            )
        if self._peek() == self.closer:
            self.pos += 1
            if (yield from self._end(None)):
                return
        index = 0
        while True:
            self._forget_read()
            if self._peek() == "":
                yield Damage(None, f"the file ends without its closing {self.closer!r} (cut after a record?)")
                return
            start, label, self.key, self.damaged_field = self.pos, None, None, None
            try:
                label, value, after, own_line = self._record(index)
            except (json.JSONDecodeError, RecursionError) as err:
                damage, more = self._damage(start, index, label, err)
                yield damage
                if not more:
                    return
                index += 1
                continue
            if own_line and self.record_indent:
                self._learn_indent(self.record_indent)
            if after == "" and own_line is None and self._resync(start + 1, at_least=2):
                yield Damage(
                    printable(label),
                    "the file ends in this record, and records start inside it: it swallowed "
                    "the records after it (a closing bracket lost?)",
                )
                index += 1
                continue
            yield self._checked(start, label, value)
            index += 1
            if after == ",":
                self.pos += 1
                continue
            if after == self.closer:
                self.pos += 1
                if (yield from self._end(label)):
                    return
                continue
            if after == "":
                yield Damage(None, f"the file ends without its closing {self.closer!r} (cut after a record?)")
                return
            at = self.consumed + self.pos
            if not self._resync(self.record_end):
                yield Damage(
                    f"after {printable(label)}",
                    f"unexpected {after!r} at character {at} after the record; no record after it can be read",
                )
                return
            yield Damage(f"after {printable(label)}", f"unexpected {after!r} at character {at} after the record")

    def _checked(self, start: int, label: str, value: object) -> tuple[str, object] | Damage:
        """The record, or its damage where its text holds bad UTF-8 or a lone surrogate."""
        if self.holds_bad_bytes and (bad := bad_utf8_at(self.text, start, self.pos)) is not None:
            return Damage(printable(label), f"not valid UTF-8 at character {self.consumed + start + bad}")
        if _SURROGATE_ESCAPE.search(self.text, start, self.pos):
            lone = "the record id" if _has_bad_bytes(label) else lone_surrogate(value)
            if lone:
                return Damage(printable(label), lone_surrogate_reason(lone))
        return label, value

    def _end(self, last: str | None) -> Iterator[Damage]:
        """After the closing bracket: nothing, or damage; True (the generator's value) where the file ends here.

        A closing bracket with records after it was a stray one: reading goes on at the next record.
        """
        closed_at = self.pos
        if self._peek() == "":
            return True
        at = self.consumed + self.pos
        if self._resync(closed_at):
            yield Damage(
                None if last is None else f"after {printable(last)}",
                f"unexpected {self.closer!r} at character {self.consumed + closed_at - 1} between records",
            )
            return False
        yield Damage(None, f"text after the end of the top-level JSON value at character {at}")
        return True
