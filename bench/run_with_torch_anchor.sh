#!/usr/bin/env bash
# Shared by run_gemm_fast.sh and run_attention.sh: runs BENCH (a bench binary in $BUILD/bench) with the given options,
# then, where torch is importable, the torch CPU anchor script ANCHOR right after it. torch is no project dependency:
# point TORCH_PYTHON at an interpreter that has it (e.g. a venv with `pip install torch`).
# Usage: run_with_torch_anchor.sh BENCH ANCHOR.py "ANCHOR ARGS" [bench options ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${TORCH_PYTHON:-python3}
export OMP_WAIT_POLICY=passive
bench=$1 anchor=$2 anchor_args=$3
shift 3
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/$bench" "$@"
echo
if "$PY" -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  "$PY" "bench/$anchor" $anchor_args
else
  echo "torch CPU anchor $anchor: not run ($PY cannot import torch)"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
