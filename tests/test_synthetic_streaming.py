"""The streaming generators write the bytes a whole-release dump would.

GEMeX releases and a ReXVQA one at fixed seeds are held to pinned digests, byte for byte (annotations,
manifest and images); ReXVQA's streamed files are compared with `json.dumps` of the whole split made in the
test, and its images with a one-process run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gemex_dataset.synthetic.layouts import JsonArrayWriter
from gemex_dataset.synthetic.release import generate
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa
from rexvqa_dataset.synthetic.release import make_study, split_sizes

PINNED_DIGESTS = {  # sha256 over every file of a GEMeX release at a fixed seed; a deliberate change of the data re-pins them
    "gemex": "ac898f818f367453fd62502c4ebda3355998cd8e0def5be100403682aaf0cbd7",
    "gemex2": "1d1bff286e1c2cca981371a5abc4ba52042a320ea24d025655d44b9a1ed1b5ab",
    "rexvqa": "f3cf0bb166fc65255ff4a6a6526449424c96c3a8d1c98e8f8e08f17c233ca41b",
}


def release_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize(
    "name, make",
    [
        ("gemex", lambda out: generate(out, num_images=12, seed=3)),
        ("gemex2", lambda out: generate(out, num_images=7, seed=1, num_proc=2, layouts=("llava", "grouped"))),
    ],
)
def test_gemex_releases_keep_their_pinned_bytes(tmp_path, name, make):
    assert release_digest(make(tmp_path / name).root) == PINNED_DIGESTS[name]


def test_rexvqa_release_keeps_its_pinned_bytes(tmp_path):
    """The default drawing, images included: `--plain-findings` must leave it as it was."""
    release = generate_rexvqa(tmp_path / "rexvqa", num_studies=6, seed=4, downscale=8)
    assert release_digest(release.root) == PINNED_DIGESTS["rexvqa"]


def test_rexvqa_streamed_files_are_json_dumps_of_the_whole_split(tmp_path):
    release = generate_rexvqa(tmp_path / "one", num_studies=10, seed=3, downscale=8)
    first = 0
    for split, count in split_sizes(10).items():
        whole = {}
        for index in range(first, first + count):
            whole.update(make_study(3, index, split, 8).records)
        first += count
        text = (release.root / "metadata" / f"{split}_vqa_data.json").read_text(encoding="utf-8")
        assert text == json.dumps(whole, indent=1, allow_nan=True)


def test_rexvqa_images_do_not_depend_on_the_number_of_workers(tmp_path):
    one = generate_rexvqa(tmp_path / "one", num_studies=3, seed=2, downscale=8)
    two = generate_rexvqa(tmp_path / "two", num_studies=3, seed=2, downscale=8, num_proc=2)
    assert release_digest(one.root) == release_digest(two.root)


@pytest.mark.parametrize("items", [[], [{"a": [1, {"b": "x\ny"}]}], [{"a": 1}, {"b": [], "c": {}}, {"d": None}]])
def test_json_array_writer_matches_json_dumps(tmp_path, items):
    writer = JsonArrayWriter(tmp_path / "a.json")
    for item in items:
        writer.add(item)
    writer.close()
    assert (tmp_path / "a.json").read_text(encoding="utf-8") == json.dumps(items, indent=1)
