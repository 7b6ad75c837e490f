// bench_gemm — throughput of the bit-exact scaled_mm models on the CPU (issue 5, "Speed"): exact, f32-kblock and
// hopper-tc (cpu backend), blockwise scales (1x128 x 128x128), bf16 output, on the shapes. Compares, never
// asserts. The anchor, measured in the same run on the same shape: the `fast` model (oneDNN bf16 matmul + scale
// epilogue; bench_gemm_fast compares it with oneDNN alone).
//
// GFLOP/s = 2·M·N·K / seconds (the best of --reps runs after one warm-up). M is cut to --max-m rows (default 512)
// for the slow models and said so in the table: the work per row is the same for every row.
//
// Usage: OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive bench_gemm [--reps 3] [--max-m 512] [--only exact|f32-kblock|hopper-tc] [--shape MxNxK]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <ctime>
#include <vector>

#include "fp8ref/gemm.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Shape {
  int64_t M, N, K;
};

double cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best wall time of `reps` runs; *cpu: the process CPU time of that run (all threads; OMP_WAIT_POLICY=passive keeps
// idle workers from spinning), which a shared machine's load inflates far less than the wall time.
double time_model(fp8ref::ScaledMmSpec s, const fp8ref::GemmShape& g, const std::vector<uint8_t>& a,
                  const std::vector<uint8_t>& b, const std::vector<float>& sa, const std::vector<float>& sb, int reps,
                  double* cpu = nullptr) {
  std::vector<uint16_t> out(static_cast<size_t>(g.M * g.N));
  fp8ref::cpu::scaled_mm(s, g, a.data(), b.data(), sa.data(), sb.data(), nullptr, out.data());  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s(), c0 = cpu_s();
    fp8ref::cpu::scaled_mm(s, g, a.data(), b.data(), sa.data(), sb.data(), nullptr, out.data());
    const double t = now_s() - t0;
    if (t < best && cpu) *cpu = cpu_s() - c0;
    best = std::min(best, t);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  int64_t max_m = 512;
  std::string only;
  int64_t sel[3] = {0, 0, 0};  // --shape MxNxK: only that shape
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--max-m" && i + 1 < argc) max_m = std::atoll(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--shape" && i + 1 < argc) {
      long long m = 0, n = 0, k = 0;
      if (std::sscanf(argv[++i], "%lldx%lldx%lld", &m, &n, &k) != 3) return 2;
      sel[0] = m, sel[1] = n, sel[2] = k;
    } else {
      std::fprintf(stderr, "usage: bench_gemm [--reps N] [--max-m M] [--only MODEL] [--shape MxNxK]\n");
      return 2;
    }
  }
  const Shape shapes[] = {{128, 7168, 2048}, {512, 4096, 7168}, {16, 7168, 7168}, {4096, 7168, 7168}};
  std::printf("threads %d; blockwise scales, e4m3fn x e4m3fn, bf16 out; GFLOP/s = 2MNK/s, best of %d\n",
              omp_get_max_threads(), reps);
  std::printf("| shape (M,N,K) | M run | model | GFLOP/s | fast (anchor) GFLOP/s | ratio to fast | GFLOP per CPU-s |\n"
              "|---|---|---|---|---|---|---|\n");
  std::mt19937_64 rng(1);
  for (const Shape& sh : shapes) {
    if (sel[0] && (sh.M != sel[0] || sh.N != sel[1] || sh.K != sel[2])) continue;
    fp8ref::GemmShape g{std::min(sh.M, max_m), sh.N, sh.K};
    std::vector<uint8_t> a(static_cast<size_t>(g.M * g.K)), b(static_cast<size_t>(g.N * g.K));
    std::normal_distribution<float> nd(0, 1);
    for (auto* v : {&a, &b})
      for (auto& x : *v) {
        uint8_t c = static_cast<uint8_t>(rng() & 0xFF);
        if ((c & 0x7F) == 0x7F) c = 0x7E;
        x = (rng() % 4 == 0) ? 0 : static_cast<uint8_t>((c & 0x80) | (0x28 + (c & 0x1F)));  // |v| in [2^-2, 2^2)
      }
    fp8ref::ScaledMmSpec s;
    s.scaling = fp8ref::GemmScaling::blockwise;
    s.out = fp8ref::Format::bf16;
    std::vector<float> sa(static_cast<size_t>(g.M * ((g.K + 127) / 128)));
    std::vector<float> sb(static_cast<size_t>(((g.N + 127) / 128) * ((g.K + 127) / 128)));
    for (auto* v : {&sa, &sb})
      for (auto& x : *v) x = std::exp2(nd(rng));
    const double flop = 2.0 * static_cast<double>(g.M) * g.N * g.K;
    s.model = fp8ref::GemmModel::fast;
    const double t_fast = time_model(s, g, a, b, sa, sb, reps);
    for (fp8ref::GemmModel m : {fp8ref::GemmModel::exact, fp8ref::GemmModel::f32_kblock, fp8ref::GemmModel::hopper_tc}) {
      if (!only.empty() && only != fp8ref::to_string(m)) continue;
      s.model = m;
      double cpu = 0;
      const double t = time_model(s, g, a, b, sa, sb, reps, &cpu);
      std::printf("| (%lld,%lld,%lld) | %lld | %s | %.1f | %.1f | %.3f | %.1f |\n", static_cast<long long>(sh.M),
                  static_cast<long long>(sh.N), static_cast<long long>(sh.K), static_cast<long long>(g.M),
                  fp8ref::to_string(m), flop / t * 1e-9, flop / t_fast * 1e-9, t_fast / t, flop / cpu * 1e-9);
      std::fflush(stdout);
    }
  }
  return 0;
}
