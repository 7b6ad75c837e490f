#!/usr/bin/env bash
# Conversion benchmark (issue 2, "Speed"): fp8ref's streaming conversion and exhaustive sweep, with the machine's
# copy bandwidth and ml_dtypes' astype measured in the same run. Prints markdown for bench/RESULTS.md.
#
#   bash bench/run_convert.sh [bench_convert options, e.g. --log2n 26 --reps 5]
#
# Environment: BUILD (build dir, default build), QUIET_WAIT_S (how long to wait for other processes to go quiet,
# default 120), OMP_WAIT_POLICY (default passive: on this 2-core VM an idle OpenMP worker spinning after a
# parallel region steals the core the single-threaded steps need), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

LOG2N=28
args=("$@")
for ((k = 0; k < ${#args[@]}; ++k)); do
  [[ ${args[k]} == --log2n ]] && LOG2N=${args[k + 1]}
done

cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j2 --target bench_convert >/dev/null

# Busy fraction of all CPUs over one second, from /proc/stat (user+nice+system+irq+softirq+steal over total).
busy() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  awk -v u=$((b[1] + b[2] + b[3] + b[6] + b[7] + b[8] - a[1] - a[2] - a[3] - a[6] - a[7] - a[8])) \
      -v t=$((b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] + b[8] - a[1] - a[2] - a[3] - a[4] - a[5] - a[6] - a[7] - a[8])) \
      'BEGIN { printf "%.2f", (t > 0 ? u / t : 0) * '"$(nproc)"' }'
}
# Wait for a quiet moment: less than 0.25 CPUs busy over 3 consecutive seconds (the 1-minute load average lags).
waited=0
quiet=0
while ((waited < ${QUIET_WAIT_S:-120})); do
  b=$(busy)
  if awk -v b="$b" 'BEGIN { exit !(b < 0.25) }'; then quiet=$((quiet + 1)); else quiet=0; fi
  ((quiet >= 3)) && break
  waited=$((waited + 1))
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
busy_before=$(busy)
echo "run_convert: waited ${waited} s for quiet; load average ${load_before}; CPUs busy ${busy_before}" >&2

# CPU time of everything on the machine during the measurements (jiffies, /proc/stat) minus our own (bash `time`):
# what other processes took from the 2 cores while we measured.
jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
hz=$(getconf CLK_TCK)
j0=$(jiffies)
TIMEFORMAT='%3U %3S'
{ time "$PYTHON" bench/anchor_ml_dtypes.py --log2n "$LOG2N" --reps 3 \
    >"$BUILD/anchor_ml_dtypes.out" 2>"$BUILD/anchor_ml_dtypes.log" ; } 2>"$BUILD/anchor_ml_dtypes.time"
cat "$BUILD/anchor_ml_dtypes.log" >&2
anchor=$(cat "$BUILD/anchor_ml_dtypes.out")
ml_f32=$(sed -n 's/^ml_dtypes_f32_gbs=//p' <<<"$anchor")
ml_bf16=$(sed -n 's/^ml_dtypes_bf16_gbs=//p' <<<"$anchor")

j_mid=$(jiffies)
{ time "$BUILD/bench/bench_convert" --ml-dtypes-gbs "$ml_f32" --ml-dtypes-bf16-gbs "$ml_bf16" "$@" \
    >"$BUILD/bench_convert.md" 2>"$BUILD/bench_convert.log" ; } 2>"$BUILD/bench_convert.time"
j1=$(jiffies)
tables=$(cat "$BUILD/bench_convert.md")
cat "$BUILD/bench_convert.log" >&2
# CPU·s that other processes used while $1 (the .time file of one of our steps) ran between jiffies $2 and $3
others_during() {
  awk -v j=$(($3 - $2)) -v hz="$hz" '{ own = $1 + $2 } END { o = j / hz - own; printf "%.1f", o < 0 ? 0 : o }' "$1"
}
others_py=$(others_during "$BUILD/anchor_ml_dtypes.time" "$j0" "$j_mid")
others=$(others_during "$BUILD/bench_convert.time" "$j_mid" "$j1")
own=$(awk '{ printf "%.1f", $1 + $2 }' "$BUILD/bench_convert.time")
target=$(sed -n 's/^bench_convert: .*SIMD target \([^,]*\),.*/\1/p' "$BUILD/bench_convert.log")
threads=$(sed -n 's/^bench_convert: .*OpenMP max threads \([0-9]*\),.*/\1/p' "$BUILD/bench_convert.log")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

model=$(lscpu | sed -n 's/^Model name: *//p')
echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC'); command: \`bash bench/run_convert.sh${*:+ $*}\`"
echo "- Machine: ${model}, $(nproc) CPUs ($(lscpu | sed -n 's/^Flags:.*\(avx512_fp16\).*/AVX-512 incl. FP16/p')), $(free -g | awk '/^Mem:/ {print $2}') GiB;" \
     "Highway target chosen at run time: ${target}; OpenMP threads: ${threads} (and 1); OMP_WAIT_POLICY=${OMP_WAIT_POLICY}"
echo "- Load: before ${load_before} (1/5/15-min averages; ${busy_before} CPUs busy over 1 s, after waiting ${waited} s)," \
     "after ${load_after}; other processes used ${others} CPU·s during bench_convert's ${own} CPU·s" \
     "(and ${others_py} CPU·s during the ml_dtypes anchor)"
echo "- ml_dtypes $("$PYTHON" -c 'import ml_dtypes; print(ml_dtypes.__version__)'), numpy $("$PYTHON" -c 'import numpy; print(numpy.__version__)'), single-threaded (numpy casts are)"
echo
echo "$tables"
echo
grep -E 'checksum|^  check ' "$BUILD/bench_convert.log" | sed 's/^ */    /' || true
