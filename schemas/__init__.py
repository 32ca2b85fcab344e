"""JSON Schema files (draft-07) for every raw record layout, and the one way to check a record against them.

A build checks every one of up to millions of records, so the schema is also compiled to
Python by `fastjsonschema` for the yes/no answer; `jsonschema` explains the records that fail.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache
from importlib import resources

import fastjsonschema
from jsonschema import Draft7Validator
from jsonschema.exceptions import best_match


@cache
def schema(name: str) -> dict:
    """The JSON Schema `schemas/<name>.json` (e.g. `gemex_per_type`)."""
    return json.loads(resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8"))


@cache
def validator(name: str) -> Draft7Validator:
    Draft7Validator.check_schema(schema(name))
    return Draft7Validator(schema(name))


@cache
def _compiled(name: str) -> Callable[[object], object]:
    return fastjsonschema.compile(schema(name))


def _compiled_error(name: str, record: object) -> fastjsonschema.JsonSchemaValueException | None:
    try:
        _compiled(name)(record)
    except fastjsonschema.JsonSchemaValueException as err:
        return err
    return None


def _json_path(parts: Iterable[str | int]) -> str:
    """['visual_locations', 1] -> 'visual_locations[1]'."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def first_error(name: str, record: object) -> tuple[str, str] | None:
    """(field, message) of the most relevant schema violation of `record`, or None if it is valid.

    `field` is the JSON path of the offending value (`visual_locations[1]`), or the missing
    key's name when a required key is absent.
    """
    compiled = _compiled_error(name, record)
    if compiled is None:
        return None
    error = best_match(validator(name).iter_errors(record))
    if error is None:
        # The two disagree only on a `pattern` with `$`: Python's `re` (jsonschema) lets a final newline
        # through, ECMA-262's (the standard's, and fastjsonschema's) does not. The standard decides.
        return _json_path(compiled.path[1:]) or "(record)", compiled.message.removeprefix(f"{compiled.name} ")
    field = _json_path(error.absolute_path)
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        field = ".".join(filter(None, [field, missing[0]])) if missing else field
    return field or "(record)", error.message
