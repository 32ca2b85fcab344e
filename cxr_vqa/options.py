"""Command-line options made from a documented dataclass, the way `transformers.HfArgumentParser` makes them.

Each field is one option: `--` and its name with dashes, its type (the `X` of `X | None`), its
default (none: the option is required), `choices` and `help` from `field(metadata=...)`; a
`bool` field is a flag (`--x` sets True; one that defaults to True takes `--no-x`), a `tuple[str, ...]`
one comma-separated value. The options are declared once, on the dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

Options = TypeVar("Options")

FOLDER_HELP = "the built dataset folder (the --out of `cxr-vqa build`)"


def folder_command(
    commands: argparse._SubParsersAction, name: str, summary: str, **settings: Any
) -> argparse.ArgumentParser:
    """A subcommand that reads a build: the folder comes first, positionally (`FOLDER`), in every one of them."""
    parser = commands.add_parser(name, help=summary, **settings)
    parser.add_argument("dataset", type=Path, metavar="FOLDER", help=FOLDER_HELP)
    return parser


def _value_type(hint: Any) -> Any:
    """`X` from `X` or `X | None`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return hint


def comma_separated(value: str) -> tuple[str, ...]:
    return tuple(part for part in value.split(",") if part)


def add_options(parser: argparse.ArgumentParser, options: type, help_of: Mapping[str, str] | None = None) -> None:
    """An option on `parser` for each field of the dataclass `options`; `help_of` words a field's help otherwise."""
    hints = typing.get_type_hints(options)
    for field in dataclasses.fields(options):
        kind = _value_type(hints[field.name])
        settings: dict[str, Any] = {"help": (help_of or {}).get(field.name, field.metadata["help"])}
        if field.default is dataclasses.MISSING:
            settings["required"] = True
        else:
            settings["default"] = field.default
        if kind is bool:
            settings["action"] = argparse.BooleanOptionalAction if field.default is True else "store_true"
        elif typing.get_origin(kind) is tuple:
            settings["type"] = comma_separated
        else:
            settings["type"] = kind
            if "choices" in field.metadata:
                settings["choices"] = field.metadata["choices"]
        parser.add_argument(f"--{field.name.replace('_', '-')}", **settings)


def parsed_options(options: type[Options], args: argparse.Namespace) -> Options:
    """The dataclass `options` filled from the parsed command line."""
    return options(**{field.name: getattr(args, field.name) for field in dataclasses.fields(options)})


def options_from_command_line(options: type[Options], argv: list[str] | None, description: str | None) -> Options:
    """A script's dataclass of options from its command line, `description` (its docstring) above the options."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser, options)
    return parsed_options(options, parser.parse_args(argv))
