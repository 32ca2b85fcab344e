#!/usr/bin/env bash
# Make the wheelhouse .whl/ (repo root, git-ignored) that benchmarks/gpu/run.sh installs on the GPU
# machine, which has torch, torchvision, accelerate, pyarrow, pandas, huggingface-hub and sacrebleu but
# no `datasets`, `trl`, `torchdata` or package index (/work/.library/device/KINDS.md lists what it has).
#
#   bash benchmarks/gpu/prepare.sh          # then carry ".whl" in the device call (benchmarks/gpu/README.md)
#
# Versions are the ones the CPU tests run with. transformers and peft are there in older versions
# (transformers 5.17); they travel too, so the GPU runs the code the tests ran. fsspec travels at
# the newest version datasets 5.2 accepts (<=2026.9.0; the machine's own is not known). No
# liger-kernel: its Qwen2.5-VL patch does not load with transformers 5.23 (train_throughput.apply_liger).
# pyarrow stays the machine's own: its wheel is 47 MiB, and with the rest over the 64 MiB a call
# carries; datasets 5.2 asks for pyarrow>=24, which the environment row of every part checks, with
# the project's own requirements (torchdata: the recipes' trainer reads through a StatefulDataLoader).
# Python 3.12, x86-64.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT_DIR=.whl

# Pure-python wheels (no platform), and multiprocess's py312 wheel.
PURE=(
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
  trl==1.16.0 transformers==5.24.0 peft==0.21.2
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 fastjsonschema==2.22.3
  pydicom==3.0.2 nltk==3.10.4 defusedxml==0.7.1
  torchdata==0.11.0
)
# Compiled wheels: manylinux x86-64 for CPython 3.12 (regex: transformers 5.24 checks regex>=2025.10.22 at import).
BINARY=(rpds-py==2026.9.1 regex==2026.11.15)
# Published as a source distribution only: built here into a pure-python wheel.
SDIST=(rouge-score==0.1.2)

PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done

rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" --platform any -d "$OUT_DIR" "${PURE[@]}" "${BINARY[@]}"
"$PY" -m pip wheel -q --no-deps -w "$OUT_DIR" "${SDIST[@]}"

# One version of each package: two would stop the whole install on the device.
dupes=$(ls "$OUT_DIR"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dupes" ]; then echo "two versions of: $dupes" >&2; exit 1; fi

wheels=$(du -cb "$OUT_DIR"/*.whl | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
ls "$OUT_DIR"
echo "wheelhouse: $(ls "$OUT_DIR"/*.whl | wc -l) wheels, $((wheels / 1024 / 1024)) MiB ($wheels bytes);" \
     "tracked tree $((tree / 1024)) KiB; together $(((wheels + tree) / 1024 / 1024)) MiB of the 64 MiB a device call carries"
