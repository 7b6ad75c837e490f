#!/usr/bin/env bash
# Packs this machine's build of the unit tests and the CPU benchmarks (attention, quantize, rmsnorm_quant and its
# passes, the fast GEMM), with the shared libraries the device machine lacks (oneDNN, Highway, the OpenCL loader that Debian's oneDNN
# links), into .devbuild/db.tar.xz (git-ignored, ~11 MB xz: the 40 MB libdnnl would push the carried tree over the
# device tool's 64 MiB). The device machine's host CPU (a Xeon with AVX-512, AVX-512-FP16 and AMX, Ubuntu 24.04,
# glibc 2.39 >= Debian 12's 2.36) then runs the paths this CPU may lack: Highway's AVX3 target, the AMX attention
# path, oneDNN's bf16 matmul.
#
#   bash tools/device/pack_cpu_tests.sh            # after cmake --build build
#   run(carry=[".devbuild"], command=
#     "mkdir -p /work/main/tests && ln -sfn $PWD/tests/data /work/main/tests/data && cd .devbuild &&
#      tar xJf db.tar.xz && LD_LIBRARY_PATH=$PWD OMP_WAIT_POLICY=passive ./fp8ref_tests &&
#      OMP_NUM_THREADS=2 ./bench_attention --conv fast --reps 3")
# (the test binary finds tests/data by the absolute path it was built with: /work/main/tests/data here)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
cmake --build "$BUILD" -j2 --target fp8ref_tests fp8ref_exhaustive bench_attention bench_quant bench_rmsnorm_quant bench_gemm_fast \
  bench_rmsnorm_passes >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$BUILD/tests/fp8ref_tests" "$BUILD/tests/fp8ref_exhaustive" "$BUILD/bench/bench_attention" \
   "$BUILD/bench/bench_quant" "$BUILD/bench/bench_gemm_fast" \
   "$BUILD/bench/bench_rmsnorm_quant" "$BUILD/bench/bench_rmsnorm_passes" "$stage/"
for lib in libdnnl.so.2 libhwy.so.1 libOpenCL.so.1; do
  path=$(ldd "$BUILD/tests/fp8ref_tests" | awk -v l="$lib" '$1 == l { print $3 }')
  [[ -n $path ]] || path=$(ldd "$(ldd "$BUILD/tests/fp8ref_tests" | awk '$1 == "libdnnl.so.2" { print $3 }')" |
                           awk -v l="$lib" '$1 == l { print $3 }')
  [[ -n $path ]] || { echo "pack_cpu_tests: $lib not found by ldd" >&2; exit 2; }
  cp -L "$path" "$stage/$lib"
done
mkdir -p .devbuild
rm -f .devbuild/db.tar.xz
tar -C "$stage" -cJf .devbuild/db.tar.xz .
ls -la .devbuild/db.tar.xz
