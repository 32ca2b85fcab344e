"""The one way a raw record is checked against its schema (`schemas.first_error`)."""

from schemas import first_error

RECORD = {
    "question": "q",
    "type": "t",
    "answer": "a",
    "reason": "r",
    "visual_regions": [],
    "visual_locations": [],
    "image_path": "p10/p1/s2/x.jpg",
    "ori_report": "r",
    "q_id": 1,
    "row_id": "row_1",
}


def test_a_valid_record_has_no_error():
    assert first_error("gemex_per_type", RECORD) is None


def test_an_error_names_its_field():
    assert first_error("gemex_per_type", RECORD | {"visual_locations": [[1, 2, 3]]})[0] == "visual_locations[0]"


def test_a_pattern_end_does_not_let_a_final_newline_through():
    """jsonschema's `re` lets "row_1\\n" match `^row_[0-9]+$`; the standard (ECMA-262) does not, nor the build."""
    assert first_error("gemex_per_type", RECORD | {"row_id": "row_1\n"}) == (
        "row_id",
        "must match pattern ^row_[0-9]+$",
    )
