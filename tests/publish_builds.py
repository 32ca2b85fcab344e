"""Small GEMeX builds shared by the publish, validate and preview tests, built once per session.

`synthetic-*` come from the synthetic generator (its manifest and image tags make the build
synthetic); `real-*` are the same files with the manifest removed, which is how a build of the
real release looks to the publishing rules.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from builders.assembly.settings import BuildSettings

_cache: dict[str, Path] = {}


def _release(root: Path, synthetic: bool) -> Path:
    from builders.provenance import MANIFEST_NAME
    from gemex_dataset.synthetic.release import generate

    key = f"raw-{synthetic}"
    if key not in _cache:
        release = generate(root / key, num_images=8)
        if not synthetic:
            (root / key / MANIFEST_NAME).unlink()
        _cache[key] = release.root
    return _cache[key]


def built(kind: str, root: Path) -> Path:
    """A build `synthetic-embed`, `synthetic-none`, `real-none`, `real-embed`, `synthetic-reference`, ...

    Treat it as read-only: copy it (`copy_build`) before changing anything.
    """
    if kind not in _cache:
        from gemex_dataset.build import build_gemex

        origin, mode = kind.rsplit("-", 1)
        raw = _release(root, synthetic=origin == "synthetic")
        out = root / kind
        build_gemex(
            BuildSettings(source=raw / "per_type", out=out, images=raw / "files", image_mode=mode, overwrite=True)
        )
        _cache[kind] = out
    return _cache[kind]


def copy_build(kind: str, root: Path, dest: Path) -> Path:
    shutil.copytree(built(kind, root), dest)
    return dest
