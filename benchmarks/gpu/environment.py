"""The versions a part's figures were taken with, any requirement the machine's own packages do not
meet (pyarrow for datasets 5.2, say; torchdata for the recipes' stateful loader), and the device: one
line each, read into the environment row. Requirements are those of the carried packages and the
project's own (pyproject.toml: its dependencies and the extras a part runs). Exits non-zero when a
carried package does not import.

    python -m benchmarks.gpu.environment [--import]
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

REPORTED = (
    "torch",
    "transformers",
    "trl",
    "datasets",
    "peft",
    "accelerate",
    "pyarrow",
    "fsspec",
    "huggingface-hub",
    "liger-kernel",
    "triton",
)
CARRIED = ("datasets", "trl", "transformers", "peft", "torchdata")
"""The carried packages whose own requirements are checked (their import names are the same)."""
PROJECT_EXTRAS = ("train", "eval")
"""The extras whose code a part runs: the recipes (B.1-B.3, B.5) and `cxr-vqa evaluate`'s text metrics."""
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def unmet(owner: str, lines: Iterable[str]) -> list[str]:
    """The requirements among `lines` (no extras of their own) that the installed versions do not satisfy."""
    missing = []
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        have = installed(requirement.name)
        if have is None or not requirement.specifier.contains(have, prereleases=True):
            missing.append(f"{owner} needs {requirement.name}{requirement.specifier} (have {have or 'none'})")
    return missing


def unmet_requirements(package: str) -> list[str]:
    """An installed package's requirements that the installed versions do not satisfy."""
    return unmet(package, requires(package) or [])


def project_requirements(pyproject: Path = PYPROJECT, extras: Iterable[str] = PROJECT_EXTRAS) -> list[str]:
    """The project's dependencies and those of `extras`: the machine runs the checkout, never an installed
    copy, so no installer has checked them."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *(line for extra in extras for line in project["optional-dependencies"][extra])]


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--import", dest="check_import", action="store_true", help="also import the carried packages")
    args = parser.parse_args(argv)
    print("python", platform.python_version(), *(f"{name} {installed(name) or '-'}" for name in REPORTED))
    missing = [line for package in CARRIED if installed(package) for line in unmet_requirements(package)]
    missing += unmet("cxr-vqa", project_requirements())
    print("unmet: " + ("; ".join(dict.fromkeys(missing)) if missing else "none"))
    print("device:", device_name())
    if args.check_import:
        for module in CARRIED:
            importlib.import_module(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
