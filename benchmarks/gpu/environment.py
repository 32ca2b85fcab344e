"""The versions a part's figures were taken with, and any requirement of the carried packages the
machine's own packages do not meet (pyarrow for datasets 5.2, say): one line each, read into the
environment row. Exits non-zero when a carried package does not import.

    python -m benchmarks.gpu.environment [--import]
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from importlib.metadata import PackageNotFoundError, requires, version

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
CARRIED = ("datasets", "trl", "transformers", "peft")
"""The carried packages whose own requirements are checked (their import names are the same)."""


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def unmet_requirements(package: str) -> list[str]:
    """`package`'s requirements (no extras) that the installed versions do not satisfy."""
    unmet = []
    for line in requires(package) or []:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        have = installed(requirement.name)
        if have is None or not requirement.specifier.contains(have, prereleases=True):
            unmet.append(f"{package} needs {requirement.name}{requirement.specifier} (have {have or 'none'})")
    return unmet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--import", dest="check_import", action="store_true", help="also import the carried packages")
    args = parser.parse_args(argv)
    print("python", platform.python_version(), *(f"{name} {installed(name) or '-'}" for name in REPORTED))
    unmet = [line for package in CARRIED if installed(package) for line in unmet_requirements(package)]
    print("unmet: " + ("; ".join(unmet) if unmet else "none"))
    if args.check_import:
        for module in CARRIED:
            importlib.import_module(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
