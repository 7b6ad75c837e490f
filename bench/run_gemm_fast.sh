#!/usr/bin/env bash
# bench_gemm_fast (the `fast` scaled_mm vs oneDNN bf16 in the same run) and, where torch is importable, the torch CPU
# _scaled_mm anchor (tensorwise; bench/anchor_torch_scaled_mm.py) right after it. torch is no project dependency:
# point TORCH_PYTHON at an interpreter that has it (e.g. a venv with `pip install torch`).
# Usage: BUILD=build-NAME bash bench/run_gemm_fast.sh [--reps R] [--shape M,N,K ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${TORCH_PYTHON:-python3}
export OMP_WAIT_POLICY=passive
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/bench_gemm_fast" "$@"
echo
if "$PY" -c "import torch" 2>/dev/null; then
  "$PY" bench/anchor_torch_scaled_mm.py "$@"
else
  echo "torch CPU _scaled_mm anchor: not run ($PY cannot import torch)"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
