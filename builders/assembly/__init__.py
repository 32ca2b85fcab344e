"""Assembling a dataset folder from typed rows: the build pipeline, its image reading, Parquet
shards, the card, the build report and the `sft` messages."""
