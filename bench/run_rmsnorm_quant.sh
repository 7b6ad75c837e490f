#!/usr/bin/env bash
# rmsnorm_quant benchmark (issue 4, "Speed"): cpu::rmsnorm_quant on bf16 [4096, 7168] -> e4m3fn + f32 group-128
# scales, with memcpy bandwidth and a numpy + ml_dtypes version measured in the same run. Prints markdown for
# bench/RESULTS.md.
#
#   bash bench/run_rmsnorm_quant.sh [bench_rmsnorm_quant options, e.g. --reps 5]
#
# Environment: BUILD (build dir, default build), PYTHON (default python3), OMP_WAIT_POLICY (default passive).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j2 --target bench_rmsnorm_quant >/dev/null
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
np_gbs=$("$PYTHON" bench/anchor_rmsnorm_quant.py | sed -n 's/^numpy_gbs=//p')
"$BUILD/bench/bench_rmsnorm_quant" --numpy-gbs "$np_gbs" "$@" >"$BUILD/bench_rmsnorm_quant.md"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`bash bench/run_rmsnorm_quant.sh${*:+ $*}\`"
echo "- Load average (1/5/15 min): before ${load_before}, after ${load_after} ($(nproc) CPUs)"
echo
cat "$BUILD/bench_rmsnorm_quant.md"
