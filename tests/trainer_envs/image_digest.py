"""What the trainer-tool checks compare of an image: its size and a SHA-256 of its RGB pixels. Imported by
the side environments' reader scripts (their folder is on their path) and by `tests/test_other_trainers.py`."""

import hashlib


def image_digests(images: list) -> list[dict]:
    return [{"size": list(i.size), "sha256": hashlib.sha256(i.convert("RGB").tobytes()).hexdigest()} for i in images]
