import itertools
import random

import pyarrow as pa

from builders.assembly.staging import Staging


def test_sorted_batches_are_stable_and_never_cut_a_run_of_one_key(tmp_path):
    staging = Staging(tmp_path, pa.schema([("image_path", pa.string()), ("n", pa.int64())]), "image_path")
    staging.BATCH, staging.SPILL, staging.RUN_ROWS, staging.RUN_BATCH = 7, 5, 12, 5
    rng = random.Random(0)
    rows = [{"image_path": f"p{rng.randrange(30):02d}.jpg", "n": i} for i in range(500)]
    for row in rows:
        staging.add("train", row)
    chunks = list(staging.sorted_batches("train"))
    assert [r for chunk in chunks for r in chunk.to_pylist()] == sorted(rows, key=lambda r: r["image_path"])
    keys = [set(chunk.column("image_path").to_pylist()) for chunk in chunks]
    assert all(not (a & b) for a, b in itertools.pairwise(keys))
    longest_run = max(sum(r["image_path"] == key for r in rows) for key in {r["image_path"] for r in rows})
    assert all(len(chunk) < 7 + longest_run for chunk in chunks)


def test_tables_and_rows_staged_together_keep_release_order_and_chunks_can_be_larger(tmp_path):
    staging = Staging(tmp_path, pa.schema([("image_path", pa.string()), ("n", pa.int64())]), "image_path")
    staging.BATCH, staging.SPILL, staging.RUN_ROWS, staging.RUN_BATCH = 7, 5, 12, 5
    rng = random.Random(1)
    rows = [{"image_path": f"p{rng.randrange(30):02d}.jpg", "n": i} for i in range(500)]
    for start in range(0, len(rows), 50):  # rows one at a time and tables, alternately
        if start % 100:
            staging.add_table("train", pa.Table.from_pylist(rows[start : start + 50]).select(["n", "image_path"]))
        else:
            for row in rows[start : start + 50]:
                staging.add("train", row)
    chunks = list(staging.sorted_batches("train", chunk_rows=40))
    assert [r for chunk in chunks for r in chunk.to_pylist()] == sorted(rows, key=lambda r: r["image_path"])
    assert max(len(chunk) for chunk in chunks) > 20


def test_the_runs_are_removed_once_read_or_when_reading_stops(tmp_path):
    staging = Staging(tmp_path, pa.schema([("image_path", pa.string()), ("n", pa.int64())]), "image_path")
    staging.RUN_ROWS, staging.RUN_BATCH = 12, 5
    for split in ("train", "test"):
        for i in range(100):
            staging.add_table(split, pa.table({"image_path": [f"p{(i * 7) % 30:02d}.jpg"], "n": [i]}))
    chunks = staging.sorted_batches("train", chunk_rows=10)
    first = next(chunks)
    assert first["image_path"][0].as_py() == "p00.jpg" and len(list(tmp_path.glob("train.run-*"))) == 9
    chunks.close()
    assert not list(tmp_path.glob("train.run-*"))
    assert sum(len(chunk) for chunk in staging.sorted_batches("test")) == 100
    assert not list(tmp_path.iterdir())
    staging.close()
