#!/usr/bin/env bash
# The one command of a device call (benchmarks/gpu/README.md): installs the carried wheels, then runs
# one part of plan.yaml, every result under $OUT (results.md, results.jsonl, logs.tar.gz).
#
#   bash benchmarks/gpu/run.sh 1            # device call 1 (carry .whl): data, B.1, B.2, B.4
#   bash benchmarks/gpu/run.sh 2            # device call 2 (carry .whl): data, B.3, the rest of B.1
#   bash benchmarks/gpu/run.sh 3 --seconds 330   # call 3, if 8 minutes are left: speed-ups side by side
#   bash benchmarks/gpu/run.sh 4 --seconds 560   # a call of its own: B.5, the learning signal of a larger probe
#   bash benchmarks/gpu/run.sh 1 --tiny     # the same on CPU with the tiny model (tests/test_gpu_kit.py), in /tmp/gpu-kit-tiny
set -uo pipefail
cd "$(dirname "$0")/../.."
PART=${1:-1}
shift || true
PY=${PYTHON:-python3}
: "${OUT:=$PWD/gpu-kit-out}"
export OUT PYTHONUNBUFFERED=1
# --tiny runs in this checkout's own environment; the wheels are CPython 3.12's, for the GPU machine.
if [[ " $* " != *" --tiny "* ]] && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
exec "$PY" -m benchmarks.gpu.kit --part "$PART" --out "$OUT" "$@"
