"""Reading an answer, a reason and boxes out of a model's raw reply.

Shared by both datasets. No official extractor exists for GEMeX or ReXVQA, so these rules
are the reference; each is stated once here and tested on a table of real-looking replies
(`tests/test_extraction.py`).

Where the answer is looked for, first match wins:

1. GEMeX tags: ``<answer> ... <reason> ... <location> ...`` (the paper's training target;
   closing tags such as ``</answer>`` are tolerated).
2. JSON (bare or in a fenced block): keys ``answer``/``final_answer``, ``reason``/``reasoning``/
   ``explanation``, ``boxes``/``bbox``/``bbox_2d``/``location``; a Qwen-style list of
   ``{"bbox_2d": [...], "label": ...}`` gives boxes only.
3. Labelled lines, markdown or not: ``Answer: C``, ``**Final answer:** C``, ``### Answer`` on its
   own line; the last answer label wins (chains of thought end with the final one).
4. LaTeX ``\\boxed{...}`` (the last one).
5. Otherwise the whole reply.

Inside that answer segment:

- yes/no: the first standalone "yes" or "no" (case-insensitive).
- one letter (single choice): a cue such as "answer is (C)" or "option C" first; else every
  standalone capital letter among the question's option letters, skipping the article "A"
  (and "I") when a lowercase word follows. Exactly one distinct letter is an answer; two or
  more ("A or C") is a failed extraction, not a guess. With no letter at all, the option
  texts are matched instead: the reply naming exactly one option text (an option contained in
  a longer matched option does not count) gives that option's letter.
- a set of letters (multi choice): the same, all distinct letters form the set; with none,
  the set of option texts named.
- A reply from which nothing can be read gives ``None``; scorers count it wrong and count it.

Boxes: every group of four numbers in brackets or parentheses in the location segment (or,
without one, in the whole reply, ``bbox_2d`` entries first). Coordinates are read in the
convention the caller names (`builders.box_frame.BOX_CONVENTIONS`) and returned in the
image's pixels through `builders.box_frame.from_model_frame`; a box written with x2 < x1 or
y2 < y1 is put in order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from builders.box_frame import from_model_frame
from builders.pixel_budget import PixelBudget

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_TAG = re.compile(r"<\s*(answer|reason|location)\s*>", re.IGNORECASE)
_CLOSING_TAG = re.compile(r"<\s*/\s*(answer|reason|location)\s*>", re.IGNORECASE)
_LABEL = re.compile(
    r"^[ \t>#*_-]*+(final answer|answer|reasoning|reason|explanation|rationale|location|bounding boxes|boxes)"
    r"[ \t*_]*+(?::|$)[ \t*_]*+",
    re.IGNORECASE | re.MULTILINE,
)
_LABEL_SECTION = {
    "final answer": "answer",
    "answer": "answer",
    "reasoning": "reason",
    "reason": "reason",
    "explanation": "reason",
    "rationale": "reason",
    "location": "location",
    "bounding boxes": "location",
    "boxes": "location",
}
_FENCE = re.compile(r"```(?:json|JSON)?\s*+(.*?)```", re.DOTALL)
_NUMBER = r"-?\d+(?:\.\d+)?"
_BOX = re.compile(rf"[\[(]\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*[\])]")
_BBOX_2D = re.compile(
    rf"[\"']bbox_2d[\"']\s*:\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]"
)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_LETTER_CUE = re.compile(
    r"(answer|option|choice)s?\s*+(?:is|are|would be|:|=|-)?[:\s]*+[(\[]?\s*+([A-Z])(?![A-Za-z0-9])"
    r"((?:\s*+[)\]]?\s*+(?:,|and|&|/|\+|or)\s*+[(\[]?\s*+[A-Z](?![A-Za-z0-9]))*+)",
    re.IGNORECASE,
)
_LETTER_TOKEN = re.compile(r"(?<![A-Za-z0-9'])([A-Z])(?![A-Za-z0-9'-])")
_QUOTED_LETTER = re.compile(r"[\"']([A-Z])[\"']")
_ARTICLE_FOLLOWS = re.compile(r"\s++(?!and\b|or\b)[a-z]")
_BOXED = re.compile(r"\\boxed\s*+\{")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm)\s*+\{([^{}]*+)\}")

MAX_REPLY_CHARS = 131_072
"""Replies longer than this are read as their first and last `MAX_REPLY_CHARS // 2` characters.

Every pattern here runs in time linear in what it scans (possessive quantifiers, no nested
ambiguity); the cap bounds that time and the text metrics' work (ROUGE-L is quadratic in
tokens) on runaway generations: 128 Ki characters is beyond any generation budget the
recipes use (about 32k tokens), and keeps both a leading ``<answer>`` and a final answer
at the end of a chain of thought."""


@dataclass(frozen=True)
class Reply:
    """A reply cut into its parts; `answer` is the whole reply when no structure was found."""

    raw: str
    answer: str
    reason: str = ""
    location: str = ""
    structured: bool = False
    json_boxes: list[list[float]] = field(default_factory=list)


def split_reply(text: str) -> Reply:
    """Cut a reply into answer, reason and location segments (rules 1-5 of the module doc)."""
    text = bounded(text or "")
    return _split_tags(text) or _split_json(text) or _split_labels(text) or _split_boxed(text) or Reply(text, text)


def bounded(text: str) -> str:
    """`text`, or its first and last `MAX_REPLY_CHARS // 2` characters when it is longer (module doc)."""
    if len(text) <= MAX_REPLY_CHARS:
        return text
    half = MAX_REPLY_CHARS // 2
    return f"{text[:half]}\n{text[-half:]}"


def _split_tags(text: str) -> Reply | None:
    parts = _TAG.split(text)
    if len(parts) < 3:
        return None
    sections: dict[str, str] = {}
    for name, content in zip(parts[1::2], parts[2::2]):
        sections.setdefault(name.lower(), _CLOSING_TAG.sub(" ", content).strip())
    return Reply(text, sections.get("answer", ""), sections.get("reason", ""), sections.get("location", ""), True)


def _json_candidates(text: str) -> list[str]:
    fenced = [m.group(1).strip() for m in _FENCE.finditer(text)]
    stripped = text.strip()
    bare = []
    for opening, closing in (("{", "}"), ("[", "]")):
        start, end = stripped.find(opening), stripped.rfind(closing)
        if 0 <= start < end:
            bare.append(stripped[start : end + 1])
    return fenced + bare


def _split_json(text: str) -> Reply | None:
    for candidate in _json_candidates(text):
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            continue
        if isinstance(value, dict):
            keys = {k.lower(): v for k, v in value.items()}
            answer = _first(keys, "answer", "final_answer", "final answer")
            reason = _first(keys, "reason", "reasoning", "explanation", "rationale")
            boxes = _first(keys, "boxes", "bbox", "bbox_2d", "location", "locations", "visual_locations")
            if answer is None and reason is None and boxes is None:
                continue
            return Reply(text, _as_text(answer), _as_text(reason), "", True, _json_box_list(boxes))
        if isinstance(value, list) and value and all(isinstance(v, dict) and "bbox_2d" in v for v in value):
            outside = text.replace(candidate, " ")
            inner = _split_labels(outside) or _split_boxed(outside)
            if inner is None:
                inner = Reply(text, outside.replace("```json", " ").replace("```", " ").strip())
            return Reply(
                text, inner.answer, inner.reason, "", inner.structured, _json_box_list([v["bbox_2d"] for v in value])
            )
    return None


def _first(mapping: dict, *keys: str):
    for key in keys:
        if key in mapping:
            return mapping[key]
    return None


def _as_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "Yes" if value else "No"
    if isinstance(value, list):
        return ", ".join(_as_text(v) for v in value)
    return str(value).strip()


def _json_box_list(value) -> list[list[float]]:
    if not isinstance(value, list):
        return []
    if len(value) == 4 and all(isinstance(v, (int, float)) for v in value):
        value = [value]
    boxes = []
    for item in value:
        if isinstance(item, dict):
            item = item.get("bbox_2d") or item.get("bbox") or item.get("box")
        if isinstance(item, list) and len(item) == 4 and all(isinstance(v, (int, float)) for v in item):
            boxes.append([float(v) for v in item])
    return boxes


def _split_labels(text: str) -> Reply | None:
    matches = list(_LABEL.finditer(text))
    if not any(_LABEL_SECTION[m.group(1).lower()] == "answer" for m in matches):
        return None
    sections: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        sections[_LABEL_SECTION[match.group(1).lower()]] = text[match.end() : end].strip()
    return Reply(text, sections.get("answer", ""), sections.get("reason", ""), sections.get("location", ""), True)


def _split_boxed(text: str) -> Reply | None:
    contents = _boxed_contents(text)
    if not contents:
        return None
    return Reply(text, contents[-1], "", "", True)


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}``, braces balanced (``\\boxed{\\text{C}}`` works)."""
    found = []
    end = 0
    for match in _BOXED.finditer(text):
        if match.start() < end:
            continue  # nested in the previous one: its content already holds it
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        found.append(text[match.end() : end - 1] if not depth else text[match.end() :])
    return found


def _clean(segment: str) -> str:
    """Drop markdown emphasis, LaTeX wrappers and math delimiters around an answer."""
    segment = _BOXED.sub(" ", segment)
    segment = _LATEX_TEXT.sub(r"\1", segment)
    return re.sub(r"[*_`$]", " ", segment).strip()


def extract_yes_no(text: str) -> str | None:
    """ "yes", "no", or None: the first standalone yes/no of the answer segment."""
    match = _YES_NO.search(_clean(split_reply(text).answer))
    return match.group(1).lower() if match else None


def _letters_in(segment: str, valid: str) -> list[str]:
    """Option letters written in a segment, in order, cues first (see the module doc)."""
    segment = _clean(segment)
    stripped = segment.strip(" .:;,!()[]{}\"'\n\t")
    if len(stripped) == 1 and stripped.upper() in valid:
        return [stripped.upper()]
    quoted = [m for m in _QUOTED_LETTER.findall(segment) if m in valid]
    if quoted:
        return quoted
    cued: dict[str, list[str]] = {"answer": [], "option": []}
    for match in _LETTER_CUE.finditer(segment):
        letters = [match.group(2)] + re.findall(r"[A-Z]", match.group(3))
        if all(letter in valid for letter in letters) and match.group(2).isupper():
            cued["answer" if match.group(1).lower() == "answer" else "option"].extend(letters)
    if cued["answer"] or cued["option"]:
        return cued["answer"] or cued["option"]
    letters = []
    for match in _LETTER_TOKEN.finditer(segment):
        letter = match.group(1)
        if letter not in valid:
            continue
        if letter in "AI" and _ARTICLE_FOLLOWS.match(segment, match.end()):
            continue
        letters.append(letter)
    return letters


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def _options_named(segment: str, options: Sequence[str]) -> list[str]:
    """Letters of the option texts a segment names; an option inside a longer named one is dropped."""
    haystack = f" {_normalise(_clean(segment))} "
    named = {i: _normalise(o) for i, o in enumerate(options) if _normalise(o) and f" {_normalise(o)} " in haystack}
    kept = [i for i, t in named.items() if not any(j != i and t in u for j, u in named.items())]
    return [LETTERS[i] for i in sorted(kept)]


def extract_letter(text: str, options: Sequence[str]) -> str | None:
    """The one option letter a reply chooses, or None (none found, or several)."""
    valid = LETTERS[: len(options)]
    segment = split_reply(text).answer
    letters = set(_letters_in(segment, valid)) or set(_options_named(segment, options))
    return letters.pop() if len(letters) == 1 else None


def extract_letter_set(text: str, options: Sequence[str]) -> frozenset[str] | None:
    """The set of option letters a reply chooses, or None when it names none."""
    valid = LETTERS[: len(options)]
    segment = split_reply(text).answer
    letters = set(_letters_in(segment, valid)) or set(_options_named(segment, options))
    return frozenset(letters) or None


def answer_and_reason(text: str) -> str:
    """The text the AR scores compare: answer + reason of a structured reply, else the whole
    reply; box coordinates and tags are removed either way (they are scored by the V-score)."""
    reply = split_reply(text)
    body = f"{reply.answer} {reply.reason}" if reply.structured else reply.raw
    body = _BOX.sub(" ", _TAG.sub(" ", _CLOSING_TAG.sub(" ", body)))
    body = re.sub(r"```(?:json)?|\[\s*\]|[*`#]", " ", body)
    return " ".join(body.split())


def extract_raw_boxes(text: str) -> list[list[float]]:
    """Boxes as written, in the model's convention (module doc: location segment, JSON, bbox_2d, any 4-tuple)."""
    reply = split_reply(text)
    if reply.json_boxes:
        return reply.json_boxes
    source = reply.location if reply.location else reply.raw
    found = _BBOX_2D.findall(source) or _BOX.findall(source)
    return [[float(v) for v in match] for match in found]


def ordered_box(box: Sequence[float]) -> list[float]:
    """``[x1, y1, x2, y2]`` with x1 <= x2 and y1 <= y2."""
    x1, y1, x2, y2 = box
    return [min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)]


def extract_boxes(
    text: str, width: int, height: int, convention: str = "pixels", budget: PixelBudget | None = None
) -> list[list[float]]:
    """Boxes of a reply in the image's pixels, read in `convention` (see `builders.box_frame`) at `budget`."""
    return [ordered_box(from_model_frame(box, width, height, convention, budget)) for box in extract_raw_boxes(text)]
