"""The floors of the house, read from the code's own imports (`ast`, every import statement of every
module: module level, inside functions and under `TYPE_CHECKING` alike).

- `cxr_vqa/` (the application) stands on the dataset packages; nothing stands on it.
- `gemex_dataset/` and `rexvqa_dataset/` stand on `builders/` and not on each other.
- `builders/` (what every dataset shares) names no dataset.
- No module reaches itself through its imports.

And the synthetic generators (test data) in their own rooms, `gemex_dataset/synthetic/`,
`rexvqa_dataset/synthetic/` and their shared skeleton `builders/synthetic_release.py`: only they and the
application import them, and a real build loads none of them.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cxr_vqa", "builders", "gemex_dataset", "rexvqa_dataset", "schemas", "cards", "training_recipes")
DATASETS = ("gemex_dataset", "rexvqa_dataset")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules that `path` (module `name`) imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def most_specific(dotted: str) -> None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        if dotted:
            found.add(dotted)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                most_specific(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                most_specific(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    found.discard(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported(path, name, modules) for name, path in modules.items()}


def test_the_graph_is_read(graph):
    assert "builders.assembly.dataset_build" in graph["gemex_dataset.build"]
    assert "builders.assembly.settings" in graph["builders.assembly.image_source"]  # a parameter's type
    assert "gemex_dataset.scoring" in graph["cxr_vqa.evaluate"]  # inside a function


def package_of(module: str) -> str:
    return module.split(".")[0]


def crossings(graph: dict[str, set[str]], source: str, targets: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets_of in graph.items()
        if package_of(module) == source
        for target in targets_of
        if package_of(target) in targets
    )


def test_builders_name_no_dataset_and_not_the_application(graph):
    assert crossings(graph, "builders", (*DATASETS, "cxr_vqa", "training_recipes")) == []


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_dataset_package_stands_on_builders_alone(graph, dataset):
    others = tuple(package for package in PACKAGES if package not in (dataset, "builders", "schemas", "cards"))
    assert crossings(graph, dataset, others) == []


def test_nothing_imports_the_application(graph):
    assert [
        line for package in PACKAGES if package != "cxr_vqa" for line in crossings(graph, package, ("cxr_vqa",))
    ] == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_circles(graph):
    assert circles(graph) == []


def test_a_circle_would_be_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


SYNTHETIC = ("gemex_dataset.synthetic", "rexvqa_dataset.synthetic", "builders.synthetic_release")


def is_synthetic(module: str) -> bool:
    return any(module == room or module.startswith(room + ".") for room in SYNTHETIC)


def test_the_synthetic_generators_live_in_their_own_rooms(graph):
    assert {"gemex_dataset.synthetic.release", "rexvqa_dataset.synthetic.release"} <= set(graph)
    assert [module for module in graph if "synthetic" in module and not is_synthetic(module)] == []


def test_only_the_generators_and_the_application_import_a_generator(graph):
    assert "gemex_dataset.synthetic.release" in graph["cxr_vqa.cli"]  # the test would see an import
    assert (
        sorted(
            f"{module} -> {target}"
            for module, targets in graph.items()
            if not is_synthetic(module) and package_of(module) != "cxr_vqa"
            for target in targets
            if is_synthetic(target)
        )
        == []
    )


BUILD_AND_LIST_MODULES = """
import json, sys
from cxr_vqa.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("dataset", ["gemex", "rexvqa"])
def test_a_real_build_loads_no_synthetic_module(dataset, gemex_release, tmp_path):
    """The generators are test data: a build of a release, through the command line, never imports them."""
    if dataset == "gemex":
        source = gemex_release.root / "per_type"
    else:
        from rexvqa_dataset.synthetic.release import generate

        source = generate(tmp_path / "release", num_studies=4).root
    argv = ["build", dataset, "--source", str(source), "--out", str(tmp_path / "out"), "--image-mode", "none"]
    result = subprocess.run(
        [sys.executable, "-c", BUILD_AND_LIST_MODULES, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"},
        check=False,
        timeout=300,
    )
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["status"] == 0, result.stderr
    assert f"{dataset}_dataset.build" in outcome["modules"]
    assert [name for name in outcome["modules"] if "synthetic" in name] == []
