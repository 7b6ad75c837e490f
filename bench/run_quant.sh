#!/usr/bin/env bash
# Quantization benchmark (issue 4, "Speed"): fp8ref's cpu::quantize / cpu::dequantize on bf16 [4096, 7168] group:128,
# the machine's memcpy bandwidth of the same bytes and the numpy + ml_dtypes version of the same ops, all measured in
# the same run. Prints markdown for bench/RESULTS.md.
#
#   bash bench/run_quant.sh [bench_quant options, e.g. --reps 9]
#
# Environment: BUILD (build dir, default build), PYTHON (default python3), ANCHOR_REPS (default 3), QUIET_WAIT_S (how
# long to wait for the 1-minute load average to fall below 1.5, default 60), OMP_WAIT_POLICY (default passive: idle
# OpenMP workers otherwise spin and take the core the next single-threaded row needs on this 2-core VM).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

M=4096
K=7168
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [[ ${args[i]} == --m ]] && M=${args[i + 1]}
  [[ ${args[i]} == --k ]] && K=${args[i + 1]}
done

cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j2 --target bench_quant >/dev/null

waited=0
while ((waited < ${QUIET_WAIT_S:-60})) && awk '{ exit !($1 >= 1.5) }' /proc/loadavg; do
  sleep 5
  waited=$((waited + 5))
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

anchor=$("$PYTHON" bench/anchor_quant.py --m "$M" --k "$K" --reps "${ANCHOR_REPS:-3}" 2>"$BUILD/anchor_quant.log")
cat "$BUILD/anchor_quant.log" >&2
anchors=()
while IFS= read -r line; do anchors+=(--anchor "$line"); done <<<"$anchor"
load_mid=$(cut -d' ' -f1-3 /proc/loadavg)
"$BUILD/bench/bench_quant" "${anchors[@]}" "$@" >"$BUILD/bench_quant.md" 2>"$BUILD/bench_quant.log"
cat "$BUILD/bench_quant.log" >&2
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`bash bench/run_quant.sh${*:+ $*}\` (BUILD=$BUILD)"
echo "- Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(sed -n 's/^bench_quant: .*\(SIMD target [^,]*\), \(OpenMP threads [0-9]*\).*/\1, \2/p' "$BUILD/bench_quant.log"); OMP_WAIT_POLICY=${OMP_WAIT_POLICY}"
echo "- Load average (1/5/15 min): before ${load_before} (after waiting ${waited} s), after the numpy anchor ${load_mid}, after bench_quant ${load_after}"
echo "- $(grep -m1 'check:' "$BUILD/bench_quant.log" | sed 's/^ *//')"
echo "- numpy + ml_dtypes $(sed -n 's/^anchor_quant: ml_dtypes \([^,]*\), numpy \([^,]*\),.*/\1 \/ \2/p' "$BUILD/anchor_quant.log"); vllm-group checksums: anchor \`$(sed -n 's/.*vllm-group: .*checksums: //p' "$BUILD/anchor_quant.log")\`, fp8ref \`$(sed -n 's/.*checksums: vllm-group \([^;]*\);.*/\1/p' "$BUILD/bench_quant.log")\`"
echo
cat "$BUILD/bench_quant.md"
