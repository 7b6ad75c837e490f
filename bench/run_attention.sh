#!/usr/bin/env bash
# bench_attention (paged decode over an FP8 cache vs a read pass over the cache, same run) and, where torch is
# importable, the torch CPU SDPA anchor on the same problem (bench/anchor_torch_sdpa.py) right after it. torch is no
# project dependency: point TORCH_PYTHON at an interpreter that has it (e.g. a venv with `pip install torch`).
# Usage: BUILD=build-NAME bash bench/run_attention.sh [bench_attention options, e.g. --reps 5]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${TORCH_PYTHON:-python3}
export OMP_WAIT_POLICY=passive
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/bench_attention" "$@"
echo
if "$PY" -c "import torch" 2>/dev/null; then
  "$PY" bench/anchor_torch_sdpa.py
else
  echo "torch CPU SDPA anchor: not run ($PY cannot import torch)"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
