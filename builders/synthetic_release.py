"""What every synthetic raw release is made of, whatever its dataset: a note saying it is synthetic,
the manifest that proves it (`builders.provenance`), splits of consecutive item numbers, annotation
files written split by split, and images written in chunks on a process pool.

A dataset's generator says how to write one split's annotations and one chunk of images; item *i*
of a release depends only on (seed, i), so chunks can be written in any order and in parallel.
"""

from __future__ import annotations

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
    *,
    note: str,
    made_by: str,
    sizes: dict[str, int],
    write_annotations: WriteAnnotations,
    write_images: WriteImages | None,
    chunk_size: int,
    num_proc: int = 1,
    item_unit: str = "image",
) -> dict[str, int]:
    """Write a synthetic release into `out`: its note, every split's annotations (then the manifest of
    them), and unless `write_images` is None its images, `chunk_size` items a call on `num_proc`
    processes. Returns the questions written per split."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / NOTE_NAME).write_text(note, encoding="utf-8")
    manifest = ManifestWriter(out, made_by)
    starts = split_starts(sizes)
    quiet = sum(sizes.values()) < QUIET_BELOW
    with tqdm(desc="synthetic questions", unit="question", disable=quiet or None) as bar:
        questions = {
            split: write_annotations(split, starts[split], count, manifest, bar) for split, count in sizes.items()
        }
    manifest.save()
    if write_images is not None:
        work = chunks(sizes, chunk_size)
        with tqdm(total=sum(sizes.values()), desc="synthetic images", unit=item_unit, disable=quiet or None) as bar:
            if num_proc > 1:
                with ProcessPoolExecutor(num_proc) as pool:
                    for written in pool.map(write_images, work):
                        bar.update(written)
            else:
                for chunk in work:
                    bar.update(write_images(chunk))
    return questions
