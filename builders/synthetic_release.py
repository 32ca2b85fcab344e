"""What every synthetic raw release is made of, whatever its dataset: a note saying it is synthetic,
the manifest that proves it (`builders.provenance`), splits of consecutive item numbers, annotation
files written split by split, and images written in chunks on a process pool.

A dataset's generator says what its releases are (`ReleaseKind`) and how to write one split's
annotations and one chunk of images; item *i* of a release depends only on (seed, i), so chunks can be
written in any order and in parallel. What is written is a `SyntheticRelease`, whatever the dataset.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from builders.provenance import ManifestWriter

NOTE_NAME = "SYNTHETIC.md"
QUIET_BELOW = 1024
"""Releases of fewer items than this write without progress bars (a test's, a demo's)."""


@dataclass(frozen=True)
class ReleaseKind:
    """What every synthetic release of one dataset is, whatever its size and seed."""

    dataset: str
    """The name `cxr-vqa synthesize` and `cxr-vqa build` take."""
    title: str
    note: str
    """The release's `SYNTHETIC.md`."""
    item: str
    """What a split is counted in and its images written by: `image`, `study`."""
    items: str
    """`item`, plural."""
    chunk_size: int
    """Items an image-writing call writes."""
    annotations: tuple[str, ...]
    """The folders under the root that hold the annotation files (several: the same questions in each)."""
    images: str
    """The folder under the root that holds the image files."""
    image_root: str
    """The folder under the root the annotations' image paths are relative to (`build --images`)."""


@dataclass(frozen=True)
class SyntheticRelease:
    """A synthetic release as written: its kind, its folder, its items and questions per split."""

    kind: ReleaseKind
    root: Path
    items: dict[str, int]
    questions: dict[str, int]

    @property
    def image_root(self) -> Path:
        return self.root / self.kind.image_root

    def build_command(self) -> str:
        """The `cxr-vqa build` command that makes a dataset of this release from its first layout, beside
        it: named for the dataset (`raw-gemex` -> `gemex`), or `<root>-dataset` where the root has that name."""
        source = self.root / self.kind.annotations[0] if len(self.kind.annotations) > 1 else self.root
        out = self.root.with_name(self.kind.dataset)
        if out == self.root:
            out = self.root.with_name(self.root.name + "-dataset")
        return shlex.join(
            ["cxr-vqa", "build", self.kind.dataset, "--source", str(source), "--images", str(self.image_root)]
            + ["--out", str(out)]
        )

    def summary(self) -> list[str]:
        """What `cxr-vqa synthesize` tells of the release: its counts, where its files are, how to build it."""
        kind = self.kind
        annotations = ", ".join(str(self.root / folder) for folder in kind.annotations)
        if len(kind.annotations) > 1:
            annotations += " (the same questions)"
        return [
            f"{self.root}: synthetic {kind.title} release, {kind.items} per split {self.items}, "
            f"questions per split {self.questions}",
            f"  annotations: {annotations}; images: {self.root / kind.images}",
            "build it:",
            f"  {self.build_command()}",
        ]


@dataclass(frozen=True)
class Chunk:
    """Items `first` to `first + count - 1` of one split: the work of one image-writing call."""

    split: str
    first: int
    count: int


WriteAnnotations = Callable[[str, int, int, ManifestWriter, tqdm], int]
"""(split, first item, items, manifest, question progress) -> questions written; lists its files in the manifest."""
WriteImages = Callable[[Chunk], int]
"""Writes one chunk's images; returns its number of items. Must pickle (a module-level function or a partial of one)."""


def split_starts(sizes: dict[str, int]) -> dict[str, int]:
    """Each split's first item number: the splits take consecutive runs of items, in `sizes`' order."""
    starts, first = {}, 0
    for split, count in sizes.items():
        starts[split], first = first, first + count
    return starts


def chunks(sizes: dict[str, int], size: int) -> Iterator[Chunk]:
    """Each split's items in runs of at most `size`."""
    for split, first in split_starts(sizes).items():
        end = first + sizes[split]
        for start in range(first, end, size):
            yield Chunk(split, start, min(size, end - start))


def write_release(
    out: Path,
    kind: ReleaseKind,
    sizes: dict[str, int],
    write_annotations: WriteAnnotations,
    write_images: WriteImages | None,
    num_proc: int = 1,
) -> SyntheticRelease:
    """Write a synthetic release of `kind` and `sizes` items per split into `out`: its note, every split's
    annotations (then the manifest of them), and unless `write_images` is None its images, the kind's
    `chunk_size` items a call on `num_proc` processes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / NOTE_NAME).write_text(kind.note, encoding="utf-8")
    manifest = ManifestWriter(out, f"cxr-vqa synthesize {kind.dataset}")
    starts = split_starts(sizes)
    quiet = sum(sizes.values()) < QUIET_BELOW
    with tqdm(desc="synthetic questions", unit="question", disable=quiet or None) as bar:
        questions = {
            split: write_annotations(split, starts[split], count, manifest, bar) for split, count in sizes.items()
        }
    manifest.save()
    if write_images is not None:
        work = chunks(sizes, kind.chunk_size)
        with tqdm(total=sum(sizes.values()), desc="synthetic images", unit=kind.item, disable=quiet or None) as bar:
            if num_proc > 1:
                with ProcessPoolExecutor(num_proc) as pool:
                    for written in pool.map(write_images, work):
                        bar.update(written)
            else:
                for chunk in work:
                    bar.update(write_images(chunk))
    return SyntheticRelease(kind, out, sizes, questions)
