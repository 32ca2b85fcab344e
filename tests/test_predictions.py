import json

import pytest

from builders.scoring.predictions import (
    PredictionsError,
    detect_layout,
    match_to_split,
    read_predictions,
    rexrank_record,
    write_rexrank,
)

from .scoring_fixtures import write_jsonl


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [("q1", "<answer> Yes."), ("q2", "C\nwith a newline")])
    records = read_predictions(path)
    assert [(r.question_id, r.prediction, r.line) for r in records] == [
        ("q1", "<answer> Yes.", 1),
        ("q2", "C\nwith a newline", 2),
    ]
    assert detect_layout(path) == "jsonl"


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"question_id": "q1", "prediction": "A"}\n{oops\n')
    with pytest.raises(PredictionsError, match=r"p\.jsonl:2: not valid JSON"):
        read_predictions(path)
    path.write_text('{"question_id": "q1"}\n')
    with pytest.raises(PredictionsError, match=r"p\.jsonl:1: expected an object"):
        read_predictions(path)


def test_missing_unknown_and_duplicate_are_reported(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [("q1", "A"), ("q9", "B"), ("q1", "C")])
    check = match_to_split(read_predictions(path), ["q1", "q2"], source=str(path))
    assert check.predictions == {"q1": "A"}
    assert check.missing == ["q2"]
    assert [(p.question_id, p.line) for p in check.unknown] == [("q9", 2)]
    assert [(p.question_id, p.line) for p in check.duplicates] == [("q1", 3)]
    text = "\n".join(check.problems())
    assert "p.jsonl" in text and "'q9' (line 2)" in text and "'q1' (line 3)" in text and "count as wrong: q2" in text
    assert not check.ok


def test_rexrank_layout_round_trip(tmp_path):
    row = {
        "question_id": "r1",
        "question": "Where is the opacity?",
        "options": ["Left lung", "Right lung", "Both", "None"],
        "answer": "B",
        "task_name_raw": "Location and Distribution Assessment",
        "category": "Lung and Pleural Opacity",
        "subcategory": "Airspace Opacity",
        "extra": json.dumps({"validation_code": 1}),
    }
    record = rexrank_record(row)
    assert (
        record["options"][1] == "B. Right lung" and record["correct_answer"] == "B" and record["validation_code"] == 1
    )
    path = tmp_path / "sub.json"
    write_rexrank(path, {"r1": record}, {"r1": "The answer is B."})
    assert detect_layout(path) == "rexrank"
    [prediction] = read_predictions(path)
    assert (prediction.question_id, prediction.prediction) == ("r1", "The answer is B.")
    assert json.loads(path.read_text())["r1"]["category"] == "Lung and Pleural Opacity"


def test_rexrank_record_without_model_prediction_is_an_error(tmp_path):
    path = tmp_path / "sub.json"
    path.write_text(json.dumps({"r1": {"question": "x"}}))
    with pytest.raises(PredictionsError, match="model_prediction"):
        read_predictions(path, layout="rexrank")


def test_a_record_with_other_keys_names_the_keys_it_found(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "q1", "answer": "Yes."}\n')
    with pytest.raises(PredictionsError, match=r"p\.jsonl:1: expected .*; its keys: 'id', 'answer'$"):
        read_predictions(path)
    path.write_text('["q1", "Yes."]\n')
    with pytest.raises(PredictionsError, match=r"found a JSON list$"):
        read_predictions(path)
    path = tmp_path / "sub.json"
    path.write_text(json.dumps({"r1": {"question": "x", "prediction": "B"}}))
    with pytest.raises(
        PredictionsError, match=r"record 'r1' has no 'model_prediction'; its keys: 'question', 'prediction'$"
    ):
        read_predictions(path, layout="rexrank")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(PredictionsError, match="no such predictions file"):
        read_predictions(tmp_path / "nope.jsonl")


@pytest.mark.conformance
def test_real_rexrank_example_reads_as_a_submission(request):
    """Opt-in: the real ReXrank example in ``--samples DIR`` (``rexvqa/rexrank_round2_vqa_prediction_example.json``)."""
    samples = request.config.getoption("--samples", default=None)
    if not samples:
        pytest.skip("needs --samples DIR")
    from pathlib import Path

    from builders.scoring.extraction import extract_letter

    path = Path(samples) / "rexvqa" / "rexrank_round2_vqa_prediction_example.json"
    assert detect_layout(path) == "rexrank"
    records = read_predictions(path)
    raw = json.loads(path.read_text())
    assert [r.question_id for r in records] == list(raw)
    for record in records:
        options = [o.split(". ", 1)[1] for o in raw[record.question_id]["options"]]
        assert extract_letter(record.prediction, options) == raw[record.question_id]["correct_answer"]


def _line(question_id: str = "q1", prediction: str = "A") -> bytes:
    return json.dumps({"question_id": question_id, "prediction": prediction}).encode() + b"\n"


def test_a_utf8_bom_is_accepted_as_the_build_accepts_it(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _line() + _line("q2", "B"))
    assert [r.question_id for r in read_predictions(path)] == ["q1", "q2"]
    rexrank = tmp_path / "rexrank.json"
    rexrank.write_bytes(b"\xef\xbb\xbf" + json.dumps({"q1": {"model_prediction": "A"}}).encode())
    assert detect_layout(rexrank) == "rexrank" and read_predictions(rexrank)[0].prediction == "A"


def test_a_bad_byte_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(_line() + _line("q2") + b'{"question_id": "q3", "prediction": "\xff"}\n')
    with pytest.raises(PredictionsError, match=r"p\.jsonl:3: not UTF-8 \(byte 0xff"):
        read_predictions(path)
    rexrank = tmp_path / "rexrank.json"
    rexrank.write_bytes(b'{\n"q1": {"model_prediction": "A"},\n"q2": {"model_prediction": "\xfe"}}')
    with pytest.raises(PredictionsError, match=r"rexrank\.json:3: not UTF-8 \(byte 0xfe"):
        read_predictions(rexrank, "rexrank")


def test_a_deeply_nested_line_is_an_error_naming_it(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(_line() + b'{"question_id": "q2", "prediction": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n")
    with pytest.raises(PredictionsError, match=r"p\.jsonl:2: JSON nested deeper than the parser reads"):
        read_predictions(path)


def test_a_lone_surrogate_id_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(_line() + b'{"question_id": "q\\ud800", "prediction": "A"}\n')
    with pytest.raises(PredictionsError, match=r"p\.jsonl:2: question_id holds a lone surrogate"):
        read_predictions(path)
