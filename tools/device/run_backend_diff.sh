#!/usr/bin/env bash
# On the device machine (its host CPU: AVX-512, AVX-512 BF16/FP16 and AMX — the cpu backend's AVX3 targets, the AMX
# attention path and the AVX-512 BF16 rmsnorm passes, which a 2-core AVX2 development VM cannot run): the unit tests,
# then the random differential cpu == reference harness (tests/support/backend_diff.h) in P processes of 2 OpenMP
# threads, each its own seed, for at most S seconds each. Logs to $OUT (or ./diff_logs).
#
#   bash tools/device/pack_cpu_tests.sh
#   run(carry=[".devbuild"], command="bash tools/device/run_backend_diff.sh 8 20000 300")
#   (P processes, N inputs each, S seconds at most each)
set -uo pipefail
P=${1:-8} N=${2:-20000} S=${3:-300}
out=${OUT:-$PWD/diff_logs}
mkdir -p "$out" /work/main/tests
ln -sfn "$PWD/tests/data" /work/main/tests/data  # the test binary's data path (absolute, as built)
cd .devbuild && tar xJf db.tar.xz
export LD_LIBRARY_PATH=$PWD OMP_WAIT_POLICY=passive
lscpu | grep -E '^Model name|^CPU\(s\)' | tee "$out/cpu.txt"
grep -o -w -E 'avx512f|avx512bw|avx512vbmi|avx512_bf16|avx512_fp16|amx_tile|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' | tee -a "$out/cpu.txt"
echo
start=$(date +%s)
./fp8ref_tests > "$out/unit.txt" 2>&1
echo "unit: rc $? in $(( $(date +%s) - start )) s; $(tail -3 "$out/unit.txt" | tr '\n' ' ')"
for i in $(seq 1 "$P"); do
  OMP_NUM_THREADS=2 FP8REF_DIFF_INPUTS=$N FP8REF_DIFF_SEED=$((1000 + i)) timeout "$S" \
    ./fp8ref_tests -tc='backend diff*' > "diff_$i.txt" 2>&1 &
done
wait
for i in $(seq 1 "$P"); do  # one log of them all ($OUT brings back at most 8 files)
  echo "== seed $((1000 + i))"
  cat "diff_$i.txt"
done > "$out/diff_all.txt"
for i in $(seq 1 "$P"); do
  echo "seed $((1000 + i)): $(grep -E 'MESSAGE|Status' "diff_$i.txt" | tr '\n' ' ' | cut -c1-400)"
  grep -E 'ERROR' -A2 "diff_$i.txt" | head -12 || true
done
