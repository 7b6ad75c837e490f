// bench_core_roof — the vector-instruction roof of this CPU's cores: how many 512-bit instructions (on CPUs without
// AVX-512: 256-bit, AVX2 + FMA) a core retires per nanosecond and per cycle, on 1 thread and on every thread at once
// (issue 4: the compute floor of a bit-exact kernel is its vector-instruction count divided by this rate;
// bench/RESULTS.md, sessions 7 and 11).
//
// Compares, never asserts. Three streams of 12 independent instructions (no memory operands, no dependencies
// between them beyond each register's own chain): vfmadd231ps (ports 0 and 5 on Intel cores with two 512-bit units;
// Zen 3: two FMA pipes), vpaddd (the same ports; Zen 3: four pipes), vpermd (port 5 only: the shuffle roof). The
// core clock is measured in the same run by a chain of dependent vfmadd231ps (4 cycles each on Intel Ice Lake /
// Sapphire Rapids and AMD Zen 3; an assumption, printed). Best of --reps rounds of --iters loop iterations (12
// instructions each).
// Usage: bench_core_roof [--reps 5] [--iters 50000000]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FP8REF_ROOF_X86 1
// OP into R D from R 14, R 15 (R: "zmm" or "ymm"); twelve of them into registers 0..11 (independent) or all into
// register 0 (one chain)
#define FP8REF_ROOF_1(OP, R, D) OP " %%" R "14,%%" R "15,%%" R #D "\n"
#define FP8REF_ROOF_12(OP, R)                                                                                       \
  FP8REF_ROOF_1(OP, R, 0) FP8REF_ROOF_1(OP, R, 1) FP8REF_ROOF_1(OP, R, 2) FP8REF_ROOF_1(OP, R, 3)                   \
  FP8REF_ROOF_1(OP, R, 4) FP8REF_ROOF_1(OP, R, 5) FP8REF_ROOF_1(OP, R, 6) FP8REF_ROOF_1(OP, R, 7)                   \
  FP8REF_ROOF_1(OP, R, 8) FP8REF_ROOF_1(OP, R, 9) FP8REF_ROOF_1(OP, R, 10) FP8REF_ROOF_1(OP, R, 11)
#define FP8REF_ROOF_CHAIN4(OP, R) \
  FP8REF_ROOF_1(OP, R, 0) FP8REF_ROOF_1(OP, R, 0) FP8REF_ROOF_1(OP, R, 0) FP8REF_ROOF_1(OP, R, 0)
#define FP8REF_ROOF_CHAIN12(OP, R) FP8REF_ROOF_CHAIN4(OP, R) FP8REF_ROOF_CHAIN4(OP, R) FP8REF_ROOF_CHAIN4(OP, R)
// every register used zeroed first, in the same asm statement (no denormal or garbage operand can slow a stream)
#define FP8REF_ROOF_MOV(MOV, R, D) MOV " %%" R "0,%%" R #D "\n"
#define FP8REF_ROOF_ZERO(R, XOR, MOV)                                                                               \
  XOR " %%" R "0,%%" R "0,%%" R "0\n" FP8REF_ROOF_MOV(MOV, R, 1) FP8REF_ROOF_MOV(MOV, R, 2)                          \
  FP8REF_ROOF_MOV(MOV, R, 3) FP8REF_ROOF_MOV(MOV, R, 4) FP8REF_ROOF_MOV(MOV, R, 5) FP8REF_ROOF_MOV(MOV, R, 6)       \
  FP8REF_ROOF_MOV(MOV, R, 7) FP8REF_ROOF_MOV(MOV, R, 8) FP8REF_ROOF_MOV(MOV, R, 9) FP8REF_ROOF_MOV(MOV, R, 10)      \
  FP8REF_ROOF_MOV(MOV, R, 11) FP8REF_ROOF_MOV(MOV, R, 14) FP8REF_ROOF_MOV(MOV, R, 15)
#define FP8REF_ROOF_LOOP(Z, BODY) Z "1:\n" BODY "dec %0\n jnz 1b\n"
#define FP8REF_ROOF_CLOBBER \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm14", "xmm15", "cc"
// Seconds for n iterations of 12 independent instructions of kind k (0 fma, 1 vpaddd, 2 vpermd), or of one
// dependent FMA chain (k = 3: n·12 dependent instructions), on registers R zeroed by XOR / MOV.
#define FP8REF_ROOF_RUN(R, XOR, MOV)                                                                                \
  const double t0 = now_s();                                                                                        \
  if (k == 0)                                                                                                       \
    __asm__ volatile(FP8REF_ROOF_LOOP(FP8REF_ROOF_ZERO(R, XOR, MOV), FP8REF_ROOF_12("vfmadd231ps", R))               \
                     : "+r"(n)::FP8REF_ROOF_CLOBBER);                                                               \
  if (k == 1)                                                                                                       \
    __asm__ volatile(FP8REF_ROOF_LOOP(FP8REF_ROOF_ZERO(R, XOR, MOV), FP8REF_ROOF_12("vpaddd", R))                    \
                     : "+r"(n)::FP8REF_ROOF_CLOBBER);                                                               \
  if (k == 2)                                                                                                       \
    __asm__ volatile(FP8REF_ROOF_LOOP(FP8REF_ROOF_ZERO(R, XOR, MOV), FP8REF_ROOF_12("vpermd", R))                    \
                     : "+r"(n)::FP8REF_ROOF_CLOBBER);                                                               \
  if (k == 3)                                                                                                       \
    __asm__ volatile(FP8REF_ROOF_LOOP(FP8REF_ROOF_ZERO(R, XOR, MOV), FP8REF_ROOF_CHAIN12("vfmadd231ps", R))          \
                     : "+r"(n)::FP8REF_ROOF_CLOBBER);                                                               \
  return now_s() - t0;

__attribute__((target("avx512f"))) double run(int k, long n) { FP8REF_ROOF_RUN("zmm", "vpxord", "vmovdqa64") }
// The same streams on 256-bit registers (CPUs without AVX-512: AVX2 + FMA; Zen 3: two FMA pipes, four integer).
__attribute__((target("avx2,fma"))) double run_ymm(int k, long n) { FP8REF_ROOF_RUN("ymm", "vpxor", "vmovdqa") }
#else
#define FP8REF_ROOF_X86 0
#endif

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  long iters = 50000000;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if ((s == "--reps" || s == "--iters") && i + 1 < argc) {
      const long v = std::atol(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "bench_core_roof: %s needs a positive integer\n", s.c_str());
        return 2;
      }
      if (s == "--reps") reps = static_cast<int>(v);
      else iters = v;
    } else {
      std::fprintf(stderr, "usage: bench_core_roof [--reps 5] [--iters 50000000]\n");
      return 2;
    }
  }
#if FP8REF_ROOF_X86
  const bool zmm = __builtin_cpu_supports("avx512f");
  if (!zmm && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    std::printf("bench_core_roof: this CPU has neither AVX-512 nor AVX2 + FMA (nothing measured)\n");
    return 0;
  }
  const char* names_z[] = {"vfmadd231ps zmm (12 independent)", "vpaddd zmm (12 independent)",
                           "vpermd zmm (12 independent)", "vfmadd231ps zmm, one dependent chain"};
  const char* names_y[] = {"vfmadd231ps ymm (12 independent)", "vpaddd ymm (12 independent)",
                           "vpermd ymm (12 independent)", "vfmadd231ps ymm, one dependent chain"};
  const char* const* names = zmm ? names_z : names_y;
  const int max_threads = omp_get_max_threads();
  std::printf("| instruction stream | threads | best of %d: per core, instructions / ns | per cycle at the clock "
              "measured (4-cycle FMA chain) |\n|---|---:|---:|---:|\n",
              reps);
  for (int t : {1, max_threads}) {
    std::vector<double> best(4, 1e30);
    for (int r = 0; r < reps; ++r)
      for (int k = 0; k < 4; ++k) {
        std::vector<double> sec(static_cast<size_t>(t));
#pragma omp parallel num_threads(t)
        sec[static_cast<size_t>(omp_get_thread_num())] = zmm ? run(k, iters) : run_ymm(k, iters);
        best[static_cast<size_t>(k)] = std::min(best[static_cast<size_t>(k)], *std::max_element(sec.begin(), sec.end()));
      }
    const double ghz = 12.0 * static_cast<double>(iters) * 4.0 / best[3] / 1e9;
    for (int k = 0; k < 3; ++k) {
      const double per_ns = 12.0 * static_cast<double>(iters) / best[static_cast<size_t>(k)] / 1e9;
      std::printf("| %s | %d | %.2f | %.2f |\n", names[k], t, per_ns, per_ns / ghz);
    }
    std::printf("| core clock from the dependent FMA chain | %d | %.2f GHz | — |\n", t, ghz);
    if (max_threads == 1) break;
  }
#else
  std::printf("bench_core_roof: x86-64 only (nothing measured)\n");
#endif
  return 0;
}
