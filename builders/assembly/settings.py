"""The options of a dataset build, each declared once, and the checks they must pass before anything is read.

Every field of `BuildSettings` carries its help (and its choices) in `field(metadata=...)`, as
`transformers.HfArgumentParser` reads a dataclass: `cxr-vqa build gemex|rexvqa` makes its
options from the fields (`image_mode` is `--image-mode`), and a dataset's build module words the
help of the options whose meaning is its own (`OPTION_HELP`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from builders.assembly.conversations import TEXT_TOKENS, TURN_SEED
from builders.assembly.report import BuildError
from builders.assembly.shards import SHARD_LAYOUTS

IMAGE_MODES = ("reference", "embed", "none")


def layout_help(
    config_kind: tuple[str, str], conversation: str, by_config: tuple[str, str], shared: tuple[str, str]
) -> dict[str, str]:
    """A dataset's words for `--shard-layout` and `--no-conversations`: what its question configs are split by
    (`config_kind`, singular and plural), its conversation config, and the local Parquet bytes of an embed build
    in each layout, as multiples of the distinct image and text bytes (with conversations, and without)."""
    one, many = config_kind
    return {
        "shard_layout": f"by-config (auto, the default): a shard set per {one}, what the Hub's viewer shows; an embedded "
        f"image is in each of its {many}' files and in {conversation}'s (local Parquet about {by_config[0]}x the distinct "
        f"image and text bytes, {by_config[1]}x with --no-conversations; the Hub stores each image about once). shared: "
        "one set per split, configs select rows by a Parquet filter (about "
        f"{shared[0]}x: each image once, and once more in {conversation}; {shared[1]}x with --no-conversations); not for "
        "the Hub: its viewer ignores filters",
        "no_conversations": f"write no {conversation} config: with --image-mode embed its own files hold every image once "
        "more, which doubles the shared layout's local bytes",
    }


@dataclass
class BuildSettings:
    """How to build one dataset folder from a raw release."""

    source: Path = field(metadata={"help": "the raw release: a folder (or one annotation file)"})
    out: Path = field(metadata={"help": "the dataset folder to write"})
    images: Path | None = field(default=None, metadata={"help": "the folder image paths are relative to"})
    image_mode: str = field(
        default="reference",
        metadata={
            "choices": IMAGE_MODES,
            "help": "reference: absolute paths to your files (default); embed: image bytes in the Parquet; none: no image column",
        },
    )
    image_size: int | None = field(
        default=None, metadata={"help": "with --image-mode embed: resize so the long side is N pixels (aspect kept)"}
    )
    split: str | None = field(
        default=None, metadata={"help": "the split of every file read (default: from the release's names)"}
    )
    strict: bool = field(default=False, metadata={"help": "fail on the first rejected record instead of reporting it"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out folder"})
    num_proc: int = field(
        default=1,
        metadata={"help": "threads that encode embedded images; worker processes that read image headers (reference)"},
    )
    image_ext: str | None = field(
        default=None,
        metadata={"help": "image files carry this suffix instead of the released one (e.g. dcm for DICOM)"},
    )
    keep_16bit: bool = field(
        default=False, metadata={"help": "embed 16-bit sources as 16-bit PNG instead of windowing them to 8 bits"}
    )
    shard_layout: str = field(
        default="auto",
        metadata={
            "choices": SHARD_LAYOUTS,
            "help": "by-config (auto, the default): a shard set per question type/task, what the Hub's viewer shows "
            "(an embedded image is in each of its types' files; the Hub stores it once); shared: one set per split, "
            "configs select rows by a Parquet filter (each image once in it, and once more in the conversation "
            "config's files unless --no-conversations; not for the Hub: its viewer ignores filters)",
        },
    )
    turn_seed: int = field(
        default=TURN_SEED,
        metadata={
            "help": f"seed of the turn order in sft_per_image/sft_per_study (default {TURN_SEED}); the order carries no signal"
        },
    )
    conversation_tokens: int = field(
        default=TEXT_TOKENS,
        metadata={
            "help": "sft_per_image/sft_per_study: text tokens of one conversation row (about 4 characters a token), "
            f"a longer one is cut into balanced rows of the same image (default {TEXT_TOKENS}: with the "
            "at most 640 image tokens of the default 501,760-pixel budget a row stays under 3,000 tokens)"
        },
    )
    no_conversations: bool = field(
        default=False,
        metadata={
            "help": "write no one-conversation-per-image config (sft_per_image/sft_per_study): with --image-mode embed "
            "that config holds every image once more, so leaving it out keeps --shard-layout shared at one copy "
            "of each image on local disk"
        },
    )

    @property
    def shared_shards(self) -> bool:
        """Whether every config reads one shared shard set per split (see `builders.assembly.shards`): only when asked for."""
        return self.shard_layout == "shared"

    def check(self) -> None:
        if self.image_mode not in IMAGE_MODES:
            raise BuildError(f"--image-mode must be one of {', '.join(IMAGE_MODES)}, got {self.image_mode!r}")
        if not Path(self.source).exists():
            raise BuildError(f"--source {self.source}: no such file or folder")
        out = Path(self.out).resolve()
        for name, given in (("--source", self.source), ("--images", self.images)):
            if given is not None and out in (Path(given).resolve(), *Path(given).resolve().parents):
                raise BuildError(
                    f"--out {self.out} holds {name} {given}: writing it would replace the raw release; "
                    "choose an --out outside it"
                )
        if self.image_mode != "none" and self.images is None:
            raise BuildError(f"--images is needed with --image-mode {self.image_mode} (or use --image-mode none)")
        if self.images is not None and not Path(self.images).is_dir():
            raise BuildError(f"--images {self.images}: no such folder")
        if self.image_size is not None and self.image_mode != "embed":
            raise BuildError("--image-size resizes embedded images: use it with --image-mode embed")
        if self.image_size is not None and self.image_size < 16:
            raise BuildError(f"--image-size {self.image_size}: the long side must be at least 16 pixels")
        if self.image_mode == "reference" and (self.image_ext or "").lstrip(".").lower() == "dcm":
            raise BuildError(
                "--image-ext dcm needs --image-mode embed: DICOM files cannot be decoded from a path when rows are read"
            )
        if self.shard_layout not in SHARD_LAYOUTS:
            raise BuildError(f"--shard-layout must be one of {', '.join(SHARD_LAYOUTS)}, got {self.shard_layout!r}")
        if self.conversation_tokens < 1:
            raise BuildError(f"--conversation-tokens must be at least 1, got {self.conversation_tokens}")
        if self.num_proc < 1:
            raise BuildError(f"--num-proc must be at least 1, got {self.num_proc}")

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
