"""The GPU kit (README.md): `bash benchmarks/gpu/run.sh PART` runs one part of plan.yaml."""
