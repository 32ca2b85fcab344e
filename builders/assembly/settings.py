"""The options of a dataset build (`BuildSettings`) and the checks they must pass before anything is read."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from builders.assembly.conversations import TEXT_TOKENS, TURN_SEED
from builders.assembly.report import BuildError
from builders.assembly.shards import SHARD_LAYOUTS

IMAGE_MODES = ("reference", "embed", "none")


@dataclass
class BuildSettings:
    source: Path
    out: Path
    images: Path | None = None
    image_mode: str = "reference"
    image_size: int | None = None
    split: str | None = None
    strict: bool = False
    overwrite: bool = False
    num_proc: int = 1
    image_ext: str | None = None
    keep_16bit: bool = False
    shard_layout: str = "auto"
    turn_seed: int = TURN_SEED
    conversation_tokens: int = TEXT_TOKENS

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
                raise BuildError(f"--out {self.out} holds {name} {given}: writing it would replace the raw release; "
                                 "choose an --out outside it")
        if self.image_mode != "none" and self.images is None:
            raise BuildError(f"--images is needed with --image-mode {self.image_mode} (or use --image-mode none)")
        if self.images is not None and not Path(self.images).is_dir():
            raise BuildError(f"--images {self.images}: no such folder")
        if self.image_size is not None and self.image_mode != "embed":
            raise BuildError("--image-size resizes embedded images: use it with --image-mode embed")
        if self.image_size is not None and self.image_size < 16:
            raise BuildError(f"--image-size {self.image_size}: the long side must be at least 16 pixels")
        if self.image_mode == "reference" and (self.image_ext or "").lstrip(".").lower() == "dcm":
            raise BuildError("--image-ext dcm needs --image-mode embed: DICOM files cannot be decoded from a path when rows are read")
        if self.shard_layout not in SHARD_LAYOUTS:
            raise BuildError(f"--shard-layout must be one of {', '.join(SHARD_LAYOUTS)}, got {self.shard_layout!r}")
        if self.conversation_tokens < 1:
            raise BuildError(f"--conversation-tokens must be at least 1, got {self.conversation_tokens}")
        if self.num_proc < 1:
            raise BuildError(f"--num-proc must be at least 1, got {self.num_proc}")

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
