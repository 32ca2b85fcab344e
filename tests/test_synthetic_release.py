"""The skeleton both synthetic generators write through (`builders.synthetic_release`)."""

from builders.synthetic_release import Chunk, chunks, split_starts


def test_splits_take_consecutive_items_and_chunks_cover_each_item_once_within_its_split():
    sizes = {"train": 7, "valid": 2, "test": 3}
    assert split_starts(sizes) == {"train": 0, "valid": 7, "test": 9}
    work = list(chunks(sizes, 3))
    assert work[:3] == [Chunk("train", 0, 3), Chunk("train", 3, 3), Chunk("train", 6, 1)]
    items = [(c.split, i) for c in work for i in range(c.first, c.first + c.count)]
    assert [i for _, i in items] == list(range(12))
    assert {s for s, i in items if i >= 9} == {"test"}
