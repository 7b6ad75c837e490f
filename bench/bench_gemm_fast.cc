// bench_gemm_fast — the `fast` scaled_mm model (src/cpu/gemm_fast.h) against oneDNN's bf16 matmul alone on the
// same shape, in the same run (issue 5, "Speed"). Compares, never asserts.
//
// Rows per shape (M, N, K), blockwise scales (1x128 activations, 128x128 weights; --scaling for others),
// e4m3fn x e4m3fn, bf16 output:
//   * onednn bf16   : dnnl::matmul, A bf16 [M,K] (ab), B bf16 [N,K] (ba), bf16 dst — the anchor; its inputs are
//                     already bf16 (no conversion counted), its kernel is printed (ONEDNN_VERBOSE shows the same);
//   * fast          : cpu::scaled_mm_fast from fp8 codes: A and B converted and packed, scales, output rounding;
//   * fast, B packed: cpu::FastGemmB made once outside the timing (a weight converted once), then scaled_mm_fast.
//   For M <= 64 on CPUs with AVX-512 BF16 (the small-M kernels: B read as codes), also:
//   * read pass     : one pass over B's N·K code bytes on the same threads (a sum of 64-bit words) — the memory
//                     floor of a decode-sized product, which must read every weight once;
//   * fast, tile path: both calls with the small-M kernels switched off (oneDNN per K group, as for larger M);
//   * fast, small-M kernel on vdpbf16ps: the packed-B call on gemm16_fast whatever this CPU's default limit. On
//                     CPUs with AMX the default rows run the tiles' kernel for M >= 4 (3 for B per call): these rows
//                     and the tile path's settle the limits.
// Rounds are interleaved (anchor, fast, fast packed, then again); best of R (median in parentheses).
// TFLOP/s = 2·M·N·K / time. Run with OMP_WAIT_POLICY=passive on this 2-core VM.
//
// Usage: bench_gemm_fast [--reps R] [--scaling blockwise|tensor|rowwise|group] [--shape M,N,K]...
//        (default: blockwise, the four shapes)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm_fast.h"
#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/convert.h"
#include "fp8ref/gemm.h"

namespace {

using namespace fp8ref;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// CPU time of the whole process (all threads): on a shared, busy machine the work done per CPU-second is steadier
// than wall time (OMP_WAIT_POLICY=passive, so idle workers sleep instead of spinning).
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Stat {
  std::vector<double> t, cpu;
  double best_cpu() const { return *std::min_element(cpu.begin(), cpu.end()); }
  double best() const { return *std::min_element(t.begin(), t.end()); }
  double median() const {
    std::vector<double> s = t;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

void run_shape(int64_t M, int64_t N, int64_t K, int reps, GemmScaling scaling) {
  std::mt19937_64 rng(static_cast<uint64_t>(M * 1000003 + N * 1009 + K));
  std::vector<uint8_t> a(static_cast<size_t>(M * K)), bt(static_cast<size_t>(N * K));
  auto code = [&] {  // finite e4m3fn codes, |x| in [2^-4, 448] mostly (typical quantized data)
    for (;;) {
      const uint8_t c = static_cast<uint8_t>(rng());
      if ((c & 0x7F) != 0x7F) return c;
    }
  };
  for (auto& x : a) x = code();
  for (auto& x : bt) x = code();
  ScaledMmSpec spec;
  spec.scaling = scaling;
  spec.out = Format::bf16;
  spec.model = GemmModel::fast;
  const GemmShape g{M, N, K};
  auto count = [](const std::vector<int64_t>& shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  };
  std::vector<float> sa(count(gemm_sa_shape(spec, g))), sb(count(gemm_sb_shape(spec, g)));
  std::uniform_real_distribution<float> u(0.001f, 0.01f);
  for (auto& s : sa) s = u(rng);
  for (auto& s : sb) s = u(rng);
  std::vector<uint16_t> out(static_cast<size_t>(M * N));

  // The anchor: oneDNN bf16 matmul on the same values (bf16 inputs prepared outside the timing).
  std::vector<uint16_t> a16(a.size()), b16(bt.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = static_cast<uint16_t>(ref::decode_f32_bits(Format::e4m3fn, a[i], {}) >> 16);
  for (size_t i = 0; i < bt.size(); ++i) b16[i] = static_cast<uint16_t>(ref::decode_f32_bits(Format::e4m3fn, bt[i], {}) >> 16);
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  const memory::desc ad({M, K}, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc bd({K, N}, memory::data_type::bf16, memory::format_tag::ba);
  const memory::desc cd({M, N}, memory::data_type::bf16, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), eng);
  dnnl::matmul mm(pd);
  memory am(ad, eng, a16.data()), bm(bd, eng, b16.data()), cm(cd, eng, out.data());
  auto onednn = [&] {
    mm.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    st.wait();
  };
  auto fast = [&] { cpu::scaled_mm_fast(spec, g, a.data(), bt.data(), sa.data(), sb.data(), nullptr, out.data()); };
  const cpu::FastGemmB packed(spec, g, bt.data());
  auto fast_packed = [&] { cpu::scaled_mm_fast(spec, g, a.data(), packed, sa.data(), sb.data(), nullptr, out.data()); };

  // small M: the tile path beside the packed small-M kernel, and a read pass over B's codes
  const bool small = M <= 64 && cpu::avx512bf16_kernels();
  auto tile_packed = [&] {
    cpu::set_avx512bf16_kernels_for_test(false);
    fast_packed();
    cpu::set_avx512bf16_kernels_for_test(true);
  };
  auto tile_fast = [&] {
    cpu::set_avx512bf16_kernels_for_test(false);
    fast();
    cpu::set_avx512bf16_kernels_for_test(true);
  };
  auto kernel_packed = [&] {  // (on vdpbf16ps)
    cpu::set_gemm16_max_m_for_test(64);
    cpu::set_gemm16_amx_for_test(false);
    fast_packed();
    cpu::set_gemm16_amx_for_test(true);
    cpu::set_gemm16_max_m_for_test(-1);
  };
  std::vector<uint64_t> words(small ? bt.size() / 8 : 0);
  if (small) std::memcpy(words.data(), bt.data(), words.size() * 8);
  uint64_t sink = 0;
  auto read_pass = [&] {
    uint64_t sum = 0;
    const int64_t n = static_cast<int64_t>(words.size());
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < n; ++i) sum += words[static_cast<size_t>(i)];
    sink += sum;
  };

  Stat s_dnnl, s_fast, s_packed, s_tile_fast, s_tile, s_kernel, s_read;
  onednn();  // warm-up (primitive caches, AMX permission, page faults)
  fast_packed();
  if (small) {
    tile_fast();
    tile_packed();
    kernel_packed();
    read_pass();
  }
  auto timed = [](Stat& s, const auto& fn) {
    const double t0 = now_s(), c0 = cpu_s();
    fn();
    s.t.push_back(now_s() - t0);
    s.cpu.push_back(cpu_s() - c0);
  };
  for (int r = 0; r < reps; ++r) {
    timed(s_dnnl, onednn);
    timed(s_fast, fast);
    timed(s_packed, fast_packed);
    if (small) {
      timed(s_tile_fast, tile_fast);
      timed(s_tile, tile_packed);
      timed(s_kernel, kernel_packed);
      timed(s_read, read_pass);
    }
  }
  const double flop = 2.0 * M * N * K;
  auto row = [&](const std::string& name, const Stat& s) {
    std::printf("| %ld,%ld,%ld | %s | %.2f ms (%.2f) | %.3f | %.2f | %.1f ms | %.3f | %.2f |\n", static_cast<long>(M),
                static_cast<long>(N), static_cast<long>(K), name.c_str(), s.best() * 1e3, s.median() * 1e3,
                flop / s.best() / 1e12, s_dnnl.best() / s.best(), s.best_cpu() * 1e3, flop / s.best_cpu() / 1e12,
                s_dnnl.best_cpu() / s.best_cpu());
  };
  row(std::string("onednn bf16 (") + pd.impl_info_str() + ")", s_dnnl);
  row(std::string("fast ") + to_string(scaling) + " (fp8 in, B converted per call)", s_fast);
  row(std::string("fast ") + to_string(scaling) + " (fp8 in, B packed once)", s_packed);
  if (small) {
    row(std::string("fast ") + to_string(scaling) + " (B converted per call, tile path: small-M kernels off)", s_tile_fast);
    row(std::string("fast ") + to_string(scaling) + " (B packed once, tile path: small-M kernels off)", s_tile);
    row(std::string("fast ") + to_string(scaling) + " (B packed once, small-M kernel on vdpbf16ps)", s_kernel);
    std::printf("| %ld,%ld,%ld | anchor: read pass over B's %.1f MB of codes | %.2f ms (%.2f) | | | | | "
                "fast packed / read pass: %.2f |\n",
                static_cast<long>(M), static_cast<long>(N), static_cast<long>(K), static_cast<double>(bt.size()) / 1e6,
                s_read.best() * 1e3, s_read.median() * 1e3, s_read.best() / s_packed.best());
  }
  if (sink == 42) std::printf(" ");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  GemmScaling scaling = GemmScaling::blockwise;
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--scaling" && i + 1 < argc) {
      if (!parse_gemm_scaling(argv[++i], &scaling) || scaling == GemmScaling::mx) {
        std::fprintf(stderr, "bench_gemm_fast: --scaling tensor|rowwise|blockwise|group\n");
        return 2;
      }
    } else if (arg == "--shape" && i + 1 < argc) {
      long m, n, k;
      if (std::sscanf(argv[++i], "%ld,%ld,%ld", &m, &n, &k) != 3) {
        std::fprintf(stderr, "bench_gemm_fast: --shape M,N,K\n");
        return 2;
      }
      shapes.push_back({m, n, k});
    } else {
      std::fprintf(stderr, "usage: bench_gemm_fast [--reps R] [--scaling S] [--shape M,N,K]...\n");
      return 2;
    }
  }
  if (shapes.empty()) shapes = {{128, 7168, 2048}, {512, 4096, 7168}, {16, 7168, 7168}, {4096, 7168, 7168}};
  std::printf("threads %d, oneDNN %d.%d.%d, best of %d interleaved rounds (median)\n\n", omp_get_max_threads(),
              dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, reps);
  std::printf("| M,N,K | kernel | wall, best (median) | TFLOP/s | / onednn | CPU time, best | TFLOP/CPU-s | / onednn |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& s : shapes) run_shape(s[0], s[1], s[2], reps, scaling);
  return 0;
}
