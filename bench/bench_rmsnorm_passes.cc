// bench_rmsnorm_passes — the two AVX-512 BF16 passes of rmsnorm_quant (src/cpu/rmsnorm_quant_avx512.h) on one row
// held in L1/L2, in cycles per value: the compute floor of vllm-rmsnorm-quant's fast path on this core, without the
// memory traffic, the variance pass or the per-row work (bench_rmsnorm_quant times the whole op). Compares, never
// asserts.
//
// norm_pass: y = bf16(bf16(x·r)·w) (dtype-twice, vLLM) with the group maxima and the subnormal guard; quant_pass:
// the e4m3fn codes of y per group of 128 by x/s (Markstein's correction). The clock is measured in the same run by a
// chain of dependent integer multiplies (three cycles each on current x86 cores). Best of --reps rounds of --iters
// calls.
// Usage: bench_rmsnorm_passes [--k 7168] [--reps 15] [--iters 4000]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/rmsnorm_quant_avx512.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Cycles per second from a chain of dependent 64-bit multiplies (3 cycles each on Intel since Nehalem and AMD since
// Zen; a chain of adds would not do: Golden Cove's renamer folds immediate adds); 0 elsewhere.
double clock_hz() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const long n = 20000000;
    long x = 1;
    const double t0 = now_s();
    for (long i = 0; i < n; i += 8)
      __asm__ volatile(
          "imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0\n"
          "imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0"
          : "+r"(x));
    best = std::max(best, 3.0 * static_cast<double>(n) / (now_s() - t0));
  }
  return best;
#else
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  size_t K = 7168;
  int reps = 15, iters = 4000;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto val = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", s.c_str());
        std::exit(2);
      }
      return std::atol(argv[++i]);
    };
    if (s == "--k") K = static_cast<size_t>(val());
    else if (s == "--reps") reps = static_cast<int>(val());
    else if (s == "--iters") iters = static_cast<int>(val());
    else {
      std::fprintf(stderr, "usage: bench_rmsnorm_passes [--k 7168] [--reps 15] [--iters 4000]\n");
      return 2;
    }
  }
  const size_t G = 128;
  if (K == 0 || K % G != 0 || reps < 1 || iters < 1) {
    std::fprintf(stderr, "bench_rmsnorm_passes: --k must be a positive multiple of 128, --reps and --iters positive\n");
    return 2;
  }
  if (!fp8ref::cpu::cpu_has_avx512bf16()) {
    std::printf("bench_rmsnorm_passes: this CPU has no AVX-512 BF16 + VBMI: nothing to measure\n");
    return 0;
  }
  namespace rq = fp8ref::cpu::rq512;
  std::vector<float> wf(K);
  // 64-byte aligned buffers, as rmsnorm_quant_cpu.cc allocates them
  auto alloc = [](size_t bytes) { return static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)); };
  float* wperm = reinterpret_cast<float*>(alloc(K * 4));
  uint16_t* x = reinterpret_cast<uint16_t*>(alloc(K * 2));
  uint16_t* y = reinterpret_cast<uint16_t*>(alloc(K * 2));
  uint8_t* q = alloc(K);
  std::vector<float> gmax(K / G);
  std::vector<float> gsv(K / G), grb(K / G);
  for (size_t k = 0; k < K; ++k) {
    wf[k] = 0.5f + static_cast<float>(k % 7) * 0.1f;
    const float v = std::sin(static_cast<float>(k) * 0.37f) * 3.0f;
    uint32_t b;
    std::memcpy(&b, &v, 4);
    x[k] = static_cast<uint16_t>(b >> 16);
  }
  rq::Plan plan;
  rq::make_plan(1, rq::ZKind::bf16, wf.data(), K, wperm, &plan);
  const float r = 0.7f;
  if (!rq::norm_pass(plan, x, nullptr, nullptr, K, G, r, y, gmax.data())) {
    std::fprintf(stderr, "bench_rmsnorm_passes: norm_pass declined the row\n");
    return 1;
  }
  for (size_t g = 0; g < K / G; ++g) {  // s = amax / 448, as vLLM's group scale
    gsv[g] = gmax[g] / 448.0f;
    grb[g] = 1.0f / gsv[g];
  }
  double tn = 1e30, tq = 1e30;
  unsigned sink = 0;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = now_s();
    for (int i = 0; i < iters; ++i) sink += rq::norm_pass(plan, x, nullptr, nullptr, K, G, r, y, gmax.data());
    tn = std::min(tn, now_s() - t0);
    t0 = now_s();
    for (int i = 0; i < iters; ++i)
      rq::quant_pass(plan, y, K, G, gsv.data(), grb.data(), true, 448.0f, q, false);
    tq = std::min(tq, now_s() - t0);
    sink += q[rep % K];
  }
  const double hz = clock_hz(), n = static_cast<double>(iters) * static_cast<double>(K);
  std::printf("bench_rmsnorm_passes: one bf16 row of %zu values in cache, 1 thread, best of %d x %d calls; "
              "clock %.2f GHz (dependent multiplies) [%u]\n\n",
              K, reps, iters, hz / 1e9, sink % 2);
  std::printf("| pass | ns per value | cycles per value |\n|---|---:|---:|\n");
  std::printf("| norm_pass (dtype-twice: bf16(bf16(x·r)·w), group maxima, guard) | %.4f | %.3f |\n", tn / n * 1e9,
              tn / n * hz);
  std::printf("| quant_pass (x/s, e4m3fn, groups of 128) | %.4f | %.3f |\n", tq / n * 1e9, tq / n * hz);
  std::printf("| both | %.4f | %.3f |\n", (tn + tq) / n * 1e9, (tn + tq) / n * hz);
  std::free(wperm);
  std::free(x);
  std::free(y);
  std::free(q);
  return 0;
}
