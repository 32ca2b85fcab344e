import re

import pytest

from builders.box_frame import to_model_frame
from builders.scoring import extraction
from builders.scoring.extraction import (
    MAX_REPLY_CHARS,
    answer_and_reason,
    extract_boxes,
    extract_letter,
    extract_letter_set,
    extract_raw_boxes,
    extract_yes_no,
    split_reply,
)

OPTIONS = ["Left lower lung zone", "Right lung", "Cardiac region", "Left lung"]

YES_NO = [
    ("<answer> Yes. <reason> A rounded opacity is seen. <location> [[48, 116, 118, 135]]", "yes"),
    ("No.", "no"),
    ("no", "no"),
    ("Based on the image, yes, there is a small left effusion.", "yes"),
    ("**Answer:** No\n\n**Reason:** The costophrenic angles are sharp.", "no"),
    ('{"answer": "Yes", "reason": "Enlarged cardiac silhouette."}', "yes"),
    ('```json\n{"answer": false, "reason": "clear lungs"}\n```', "no"),
    ("The final answer is $\\boxed{\\text{Yes}}$", "yes"),
    ("There is no pneumothorax.", "no"),
    ("I cannot determine this from the image.", None),
    ("", None),
]

SINGLE = [
    ("<answer> C <reason> The heart is enlarged. <location> [[60, 90, 170, 180]]", "C"),
    ("C", "C"),
    ("(B)", "B"),
    ("B. Right lung", "B"),
    ("The correct answer is D.", "D"),
    ("Looking at the film, option A seems wrong; the answer is (C) because the heart is big.", "C"),
    ("**Answer:** B\n**Explanation:** A dense opacity projects over the right lung.", "B"),
    ("### Answer\nD\n### Reason\nThe left lung is hyperlucent.", "D"),
    ('{"answer": "A", "reason": "Opacity at the left base."}', "A"),
    ("Reasoning about the options...\nThe final answer is $\\boxed{B}$.", "B"),
    ("Cardiac region", "C"),
    ("The abnormality is in the left lower lung zone.", "A"),
    ("Answer: Left lung", "D"),
    ("<answer>C</answer>\n<reason>Big heart.</reason>", "C"),
    ("Answer: (B) Right lung", "B"),
    ("The answer is: **C. Cardiac region**", "C"),
    ("Based on the radiograph, I would choose B because the opacity is on the right.", "B"),
    ("The answer is C, not A.", "C"),
    ("answer: d", "D"),
    ("A or C", None),
    ("A small effusion is seen.", None),
    ("I am not sure.", None),
]

MULTI = [
    (
        '<answer> ["A", "C"] <reason> Both regions show opacity. <location> [[1, 2, 30, 40], [50, 60, 90, 100]]',
        {"A", "C"},
    ),
    ("['B', 'D']", {"B", "D"}),
    ("A, B, D", {"A", "B", "D"}),
    ("The correct answers are A and C.", {"A", "C"}),
    ("**Answer:** B, C\n**Reason:** ...", {"B", "C"}),
    ('{"answer": ["A", "D"], "reason": "x"}', {"A", "D"}),
    ("$\\boxed{A, C}$", {"A", "C"}),
    ("C", {"C"}),
    ("Right lung and cardiac region", {"B", "C"}),
    ("Options A and C are correct, while B is not.", {"A", "C"}),
    ("<answer> A, D </answer>", {"A", "D"}),
    ("Nothing can be said.", None),
]


@pytest.mark.parametrize("reply, expected", YES_NO)
def test_yes_no(reply, expected):
    assert extract_yes_no(reply) == expected


@pytest.mark.parametrize("reply, expected", SINGLE)
def test_single_letter(reply, expected):
    assert extract_letter(reply, OPTIONS) == expected


@pytest.mark.parametrize("reply, expected", MULTI)
def test_letter_set(reply, expected):
    got = extract_letter_set(reply, OPTIONS)
    assert (set(got) if got is not None else None) == expected


def test_letters_beyond_the_options_are_not_answers():
    assert extract_letter("E", ["x", "y", "z", "w"]) is None
    assert extract_letter("B", ["Yes", "No"]) == "B"


def test_reason_from_tags_labels_and_json():
    assert split_reply("<answer> Yes. <reason> Opacity at base. <location> [[1, 2, 3, 4]]").reason == "Opacity at base."
    assert split_reply("Answer: C\nReason: The heart is enlarged.").reason == "The heart is enlarged."
    assert split_reply('{"answer": "C", "reasoning": "big heart"}').reason == "big heart"
    assert split_reply("C").reason == ""


def test_answer_and_reason_drops_tags_and_boxes():
    text = "<answer> Yes. <reason> Opacity at base. <location> [[1, 2, 3, 4]]"
    assert answer_and_reason(text) == "Yes. Opacity at base."
    assert answer_and_reason("There is cardiomegaly [10, 20, 30, 40].") == "There is cardiomegaly ."


BOX_REPLIES = [
    (
        "<answer> Yes <reason> r <location> [[48, 116, 118, 135], [10, 20, 30, 40]]",
        [[48, 116, 118, 135], [10, 20, 30, 40]],
    ),
    ('```json\n[{"bbox_2d": [100, 200, 300, 400], "label": "cardiac region"}]\n```\nAnswer: C', [[100, 200, 300, 400]]),
    ('{"answer": "C", "reason": "x", "boxes": [[1, 2, 3, 4]]}', [[1, 2, 3, 4]]),
    ("The opacity lies at (12.5, 30, 80, 90.5).", [[12.5, 30, 80, 90.5]]),
    ("No boxes here.", []),
]


@pytest.mark.parametrize("reply, expected", BOX_REPLIES)
def test_raw_boxes(reply, expected):
    assert extract_raw_boxes(reply) == expected


def test_qwen_json_reply_keeps_its_answer():
    reply = '```json\n[{"bbox_2d": [100, 200, 300, 400], "label": "cardiac region"}]\n```\nAnswer: C'
    assert extract_letter(reply, OPTIONS) == "C"


@pytest.mark.parametrize("convention", ["pixels", "qwen2.5-vl", "norm1000", "frame224"])
def test_boxes_come_back_in_image_pixels_from_every_convention(convention):
    width, height = 2544, 3056
    truth = [400.0, 600.0, 1800.0, 2400.0]
    written = to_model_frame(truth, width, height, convention)
    got = extract_boxes(f"<answer> Yes <reason> r <location> [{written}]", width, height, convention)
    tolerance = 15 if convention == "frame224" else 3
    assert got[0] == pytest.approx(truth, abs=tolerance)


def test_inverted_box_is_put_in_order():
    assert extract_boxes("[30, 40, 10, 20]", 100, 100) == [[10.0, 20.0, 30.0, 40.0]]


def test_unstructured_reply_is_all_answer():
    reply = split_reply("Just some text.")
    assert reply.answer == "Just some text." and not reply.structured


ADVERSARIAL = [  # shapes that make a naive pattern backtrack without end
    "The answer" + "\n" * 1000 + "text",
    "The answer is" + " " * 1000 + "(" + " " * 1000 + "x",
    "option " + " \n" * 1000 + "and",
    "Answer" + " " * 5000 + "x",
    "```" + "\n" * 100_000,
    "\\boxed{" * 100_000,
    "[ " * 100_000 + "(",
    "{" * 100_000 + "}",  # nested deeper than the JSON parser goes
]


@pytest.mark.parametrize("reply", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_replies_are_read_not_hung(reply):
    assert extract_yes_no(reply) is None
    assert extract_letter(reply, OPTIONS) is None
    assert extract_raw_boxes(reply) == []
    assert len(answer_and_reason(reply)) <= MAX_REPLY_CHARS


def test_an_answer_after_a_thousand_newlines_is_still_found():
    assert extract_letter("The answer" + "\n" * 1000 + "is (C)", OPTIONS) == "C"
    assert extract_yes_no("Answer:" + " " * 1000 + "Yes") == "yes"


class _Recording:
    """A compiled pattern that records the length of every string it is asked to scan."""

    def __init__(self, pattern, seen):
        self.pattern, self.seen = pattern, seen

    def __getattr__(self, name):
        method = getattr(self.pattern, name)

        def scan(string, *args, **kwargs):
            self.seen.append(len(string))
            return method(string, *args, **kwargs)

        return scan


def test_scanning_is_bounded_on_a_10_mb_reply(monkeypatch):
    """Each pattern runs in linear time; the cap bounds what any of them is given to scan."""
    seen: list[int] = []
    for name in [n for n in vars(extraction) if n.startswith("_") and isinstance(getattr(extraction, n), re.Pattern)]:
        monkeypatch.setattr(extraction, name, _Recording(getattr(extraction, name), seen))
    reply = ("The answer" + "\n" * 1000 + "is (B) and [1, 2, 3, 4] ") * 9_700
    assert len(reply) > 10_000_000
    assert extract_letter(reply, OPTIONS) == "B"
    assert extract_raw_boxes(reply)[0] == [1.0, 2.0, 3.0, 4.0]
    answer_and_reason(reply)
    assert seen and max(seen) <= MAX_REPLY_CHARS + 1


def test_a_long_reply_keeps_its_start_and_its_end():
    filler = "x" * MAX_REPLY_CHARS
    assert extract_yes_no(f"<answer> Yes <reason> {filler}") == "yes"
    assert extract_letter(f"Let me think. {filler}\nFinal answer: D", OPTIONS) == "D"
