"""The ReXVQA reader streams a release file record by record: same records as json.load, bounded memory."""

import io
import json
import math

import pytest

from builders.build.report import Reject
from rexvqa_dataset.reader import RawRecord, _ObjectStream, read_file


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_members_match_json_load_whatever_the_block_size(block):
    text = json.dumps({"q1": {"a": [1, 2.5, None], "b": "x" * 50}, "q2": {"n": 12345678}, "q3": {}}, indent=2)
    text = text.replace('"b"', '"nan": NaN, "b"')
    members = dict(_ObjectStream(io.StringIO(text), block=block).members())
    expected = json.loads(text)
    assert members.keys() == expected.keys() and members["q2"] == {"n": 12345678}
    assert math.isnan(members["q1"]["nan"]) and members["q1"]["b"] == "x" * 50


def test_empty_object():
    assert list(_ObjectStream(io.StringIO(" { } ")).members()) == []


def _release_file(tmp_path, text):
    path = tmp_path / "test_vqa_data.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_records_before_bad_json_are_kept_and_the_rest_is_one_reject(tmp_path):
    path = _release_file(tmp_path, '{"q1": {"question": "x"}, "q2": {"question": oops}, "q3": {}}')
    items = list(read_file(path, "test"))
    first = items[0]
    assert (first.question_id if isinstance(first, RawRecord) else first.record) == "q1"
    assert isinstance(items[-1], Reject) and "malformed JSON at character" in items[-1].reason and items[-1].record is None
    assert len(items) == 2


def test_a_repeated_question_id_is_rejected(tmp_path):
    path = _release_file(tmp_path, '{"q1": {"question": "x"}, "q1": {"question": "y"}}')
    items = list(read_file(path, "test"))
    assert isinstance(items[1], Reject) and items[1].record == "q1" and "twice" in items[1].reason


def test_not_an_object(tmp_path):
    items = list(read_file(_release_file(tmp_path, "[1, 2]"), "test"))
    assert len(items) == 1 and "expected a JSON object keyed by question id" in items[0].reason
