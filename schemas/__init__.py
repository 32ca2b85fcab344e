"""JSON Schema files for every raw record layout, and the one way to check a record against them."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match


@cache
def validator(name: str) -> Draft202012Validator:
    """The validator for `schemas/<name>.json` (e.g. `gemex_per_type`)."""
    schema = json.loads(resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def first_error(name: str, record: object) -> tuple[str, str] | None:
    """(field, message) of the most relevant schema violation of `record`, or None if it is valid.

    `field` is the JSON path of the offending value (`visual_locations[1]`), or the missing
    key's name when a required key is absent.
    """
    check = validator(name)
    if check.is_valid(record):
        return None
    error = best_match(check.iter_errors(record))
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        field = ".".join(filter(None, [field, missing[0]])) if missing else field
    return field or "(record)", error.message
