"""The skeleton both synthetic generators write through (`builders.synthetic_release`)."""

from builders.synthetic_release import Chunk, SyntheticRelease, chunks, split_starts


def test_splits_take_consecutive_items_and_chunks_cover_each_item_once_within_its_split():
    sizes = {"train": 7, "valid": 2, "test": 3}
    assert split_starts(sizes) == {"train": 0, "valid": 7, "test": 9}
    work = list(chunks(sizes, 3))
    assert work[:3] == [Chunk("train", 0, 3), Chunk("train", 3, 3), Chunk("train", 6, 1)]
    items = [(c.split, i) for c in work for i in range(c.first, c.first + c.count)]
    assert [i for _, i in items] == list(range(12))
    assert {s for s, i in items if i >= 9} == {"test"}


def test_each_generator_writes_the_one_release_class_that_says_where_its_files_are(tmp_path):
    from gemex_dataset.synthetic.release import generate as generate_gemex
    from rexvqa_dataset.synthetic.release import generate as generate_rexvqa

    gemex = generate_gemex(tmp_path / "g", num_images=6, images=False)
    rexvqa = generate_rexvqa(tmp_path / "r", num_studies=3, images=False)
    assert type(gemex) is type(rexvqa) is SyntheticRelease
    assert (gemex.image_root, rexvqa.image_root) == (tmp_path / "g" / "files", tmp_path / "r" / "metadata")
    assert gemex.summary()[0] == (
        f"{tmp_path / 'g'}: synthetic GEMeX release, images per split {gemex.items}, "
        f"questions per split {gemex.questions}"
    )
    assert gemex.summary()[1].startswith(f"  annotations: {tmp_path / 'g' / 'per_type'}, ")
    assert rexvqa.summary()[1] == f"  annotations: {tmp_path / 'r' / 'metadata'}; images: {tmp_path / 'r' / 'deid_png'}"
    assert rexvqa.build_command().split()[:3] == ["cxr-vqa", "build", "rexvqa"]
    assert all((folder / "SYNTHETIC.md").is_file() for folder in (gemex.root, rexvqa.root))
