// bench_rmsnorm_quant — fused RMSNorm + FP8 group quant (issue 4, "Speed"): bf16 [4096, 7168] -> e4m3fn codes +
// f32 group-128 scales, against this machine's memory bandwidth measured in the same run.
//
// Compares, never asserts. Rows, timed in interleaved rounds (best of --reps, medians printed too):
//   * memcpy    : glibc memcpy of the bf16 input (M·K·2 bytes) into a buffer of the same size, on the bench's
//                 thread count (each thread one contiguous half) — the bandwidth anchor;
//   * copy, non-temporal stores: the same copy by bench_common.h stream_copy (no read for ownership of the
//                 destination, which glibc's memcpy of this size pays) — the stricter anchor, ratios printed below;
//   * cpu::rmsnorm_quant per convention (with and without the residual), 2 threads and 1; with --highway also the
//                 conventions the AVX-512 BF16 passes serve on the Highway path (cpu::RmsNormPath::highway), "[highway]"
//                 rows: the two kernels side by side in one run;
//   * numpy     : a vectorised numpy + ml_dtypes rmsnorm + group quant on the same shape, measured by
//                 bench/anchor_rmsnorm_quant.py and passed in with --numpy-gbs (bench/run_rmsnorm_quant.sh).
// Bandwidth = bytes read + bytes written per second: x (2 B/elem) [+ residual 2 B + residual out 2 B] + weight
// (K·2) + codes (1 B/elem) + scales (4 B per group).
//
// Usage: bench_rmsnorm_quant [--m 4096] [--k 7168] [--reps 5] [--numpy-gbs G] [--only PAT[|PAT...]] [--highway]
//                            [--residual-sum f32|dtype]  (every convention's residual sum overridden)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "fp8ref/convert.h"
#include "fp8ref/rmsnorm.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Row {
  std::string name;
  int threads;
  double bytes;
  std::function<void()> fn;
  std::vector<double> times;
  double best() const { return *std::min_element(times.begin(), times.end()); }
  double median() const {
    std::vector<double> t = times;
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  double gbs() const { return bytes / best() / 1e9; }
};

// residual_sum: "" (the convention's) or an override of every convention's residual-sum (f32, dtype)
fp8ref::RmsNormQuantSpec spec_of(const char* name, const std::string& residual_sum) {
  std::string err;
  auto s = fp8ref::resolve_rmsnorm_quant_convention(name, fp8ref::Format::e4m3fn, &err);
  if (s && !residual_sum.empty() && !fp8ref::apply_rmsnorm_override("residual-sum", residual_sum, &*s, &err)) s.reset();
  if (!s) {
    std::fprintf(stderr, "bench_rmsnorm_quant: %s\n", err.c_str());
    std::exit(2);
  }
  fp8ref::finalize_rmsnorm_quant_spec(&*s);
  return *s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 4096, K = 7168;
  int reps = 5;
  double numpy_gbs = 0;
  std::string only;  // time only the matching rows: prefixes or whole names (NAME$), '|' between alternatives
  bool highway = false;
  std::string residual_sum;  // --residual-sum: every convention's, overridden
  for (int a = 1; a < argc; ++a) {
    const std::string s = argv[a];
    auto val = [&]() -> std::string {
      if (a + 1 >= argc) {
        std::fprintf(stderr, "bench_rmsnorm_quant: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++a];
    };
    if (s == "--m") M = std::stoll(val());
    else if (s == "--k") K = std::stoll(val());
    else if (s == "--reps") reps = std::stoi(val());
    else if (s == "--numpy-gbs") numpy_gbs = std::stod(val());
    else if (s == "--only") only = val();
    else if (s == "--highway") highway = true;
    else if (s == "--residual-sum") residual_sum = val();
    else {
      std::fprintf(stderr,
                   "usage: bench_rmsnorm_quant [--m 4096] [--k 7168] [--reps 5] [--numpy-gbs G] [--only PAT[|PAT...]] "
                   "[--highway] [--residual-sum f32|dtype]\n");
      return 2;
    }
  }
  const size_t n = static_cast<size_t>(M * K);
  const int max_threads = omp_get_max_threads();
  std::fprintf(stderr, "bench_rmsnorm_quant: [%lld, %lld] bf16, SIMD target %s, OpenMP max threads %d\n",
               static_cast<long long>(M), static_cast<long long>(K), fp8ref::cpu::simd_target(), max_threads);

  // Inputs: x and residual ~ N(0, 1)·2^(row-dependent exponent), bf16; weight ~ 1 + N(0, 0.1).
  std::vector<uint16_t> x(n), res(n), res_out(n), w(static_cast<size_t>(K)), copy_dst(n);
  std::vector<uint8_t> q(n);
  std::vector<float> scales(static_cast<size_t>(M * ((K + 127) / 128)));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto gauss = [&]() {  // sum of 4 uniforms: a cheap bell shape
    double s = 0;
    for (int i = 0; i < 4; ++i) s += static_cast<double>(next() >> 11) * 0x1p-53;
    return (s - 2.0) * 1.7;
  };
  auto to_bf16 = [](double v) {
    const float f = static_cast<float>(v);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return static_cast<uint16_t>(fp8ref::ref::narrow(fp8ref::Format::f32, b, fp8ref::Format::bf16));
  };
  for (int64_t m = 0; m < M; ++m) {
    const double scale = std::ldexp(1.0, static_cast<int>(m % 13) - 6);
    for (int64_t k = 0; k < K; ++k) {
      x[static_cast<size_t>(m * K + k)] = to_bf16(gauss() * scale);
      res[static_cast<size_t>(m * K + k)] = to_bf16(gauss() * scale);
    }
  }
  for (int64_t k = 0; k < K; ++k) w[static_cast<size_t>(k)] = to_bf16(1.0 + 0.1 * gauss());

  const double out_bytes = static_cast<double>(n) + 4.0 * static_cast<double>(scales.size()) + 2.0 * static_cast<double>(K);
  const double plain = 2.0 * static_cast<double>(n) + out_bytes;
  const double with_res = plain + 4.0 * static_cast<double>(n);

  std::vector<Row> rows;
  for (int t : {max_threads, 1}) {
    rows.push_back({"memcpy: bf16 input -> same size", t, 4.0 * static_cast<double>(n), [&, t] {
                      (void)t;
#pragma omp parallel
                      {
                        const size_t nt = static_cast<size_t>(omp_get_num_threads());
                        const size_t id = static_cast<size_t>(omp_get_thread_num());
                        const size_t per = (n + nt - 1) / nt, b = std::min(n, id * per), e = std::min(n, b + per);
                        std::memcpy(copy_dst.data() + b, x.data() + b, (e - b) * 2);
                      }
                    },
                    {}});
    rows.push_back({"copy, non-temporal stores", t, 4.0 * static_cast<double>(n), [&] {
#pragma omp parallel
                      {
                        const size_t nt = static_cast<size_t>(omp_get_num_threads());
                        const size_t id = static_cast<size_t>(omp_get_thread_num());
                        const size_t per = (n + nt - 1) / nt, b = std::min(n, id * per), e = std::min(n, b + per);
                        fp8ref::bench::stream_copy(copy_dst.data() + b, x.data() + b, (e - b) * 2);
                      }
                    },
                    {}});
    for (const char* conv : {"vllm-rmsnorm-quant", "aiter-rmsnorm-quant", "deepseek-rmsnorm", "exact"}) {
      for (int v = 0; v < 4; ++v) {
        const bool residual = v % 2 == 1;
        const auto path = v < 2 ? fp8ref::cpu::RmsNormPath::automatic : fp8ref::cpu::RmsNormPath::highway;
        if (std::string(conv) == "exact" && (residual || t != max_threads)) continue;
        const fp8ref::RmsNormQuantSpec spec = spec_of(conv, residual_sum);
        const bool bf16_weights = spec.weight != fp8ref::NormWeight::f32;
        if (v >= 2 && !(highway && bf16_weights && fp8ref::cpu::rmsnorm_quant_has_avx512bf16())) continue;
        rows.push_back({std::string(conv) + (residual ? " + residual" : "") + (v >= 2 ? " [highway]" : ""), t,
                        residual ? with_res : plain, [&, spec, residual, path] {
                          fp8ref::RmsNormQuantArgs a;
                          a.from = fp8ref::Format::bf16;
                          a.x = x.data();
                          a.weight = w.data();
                          a.shape = {M, K};
                          a.weight_shape = {K};
                          a.q = q.data();
                          a.scales = scales.data();
                          if (residual) {
                            a.residual = res.data();
                            a.residual_out = res_out.data();
                          }
                          fp8ref::cpu::rmsnorm_quant(spec, a, path);
                        },
                        {}});
      }
    }
  }
  if (!only.empty()) {  // prefixes, or whole names with a trailing '$' (memcpy among them gives the same-run ratio)
    std::vector<std::string> keys;  // alternatives separated by '|'
    for (size_t b = 0; b <= only.size();) {
      const size_t e = std::min(only.find('|', b), only.size());
      keys.push_back(only.substr(b, e - b));
      b = e + 1;
    }
    auto match = [&](const std::string& name) {
      for (const std::string& k : keys) {
        const bool whole = !k.empty() && k.back() == '$';
        if (whole ? name == k.substr(0, k.size() - 1) : name.rfind(k, 0) == 0) return true;
      }
      return false;
    };
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const Row& r) { return !match(r.name); }), rows.end());
  }
  if (rows.empty()) return 0;
  for (int r = -1; r < reps; ++r)
    for (Row& row : rows) {
      omp_set_num_threads(row.threads);
      const double t0 = now_s();
      row.fn();
      if (r >= 0) row.times.push_back(now_s() - t0);
    }
  for (const Row& row : rows)
    std::fprintf(stderr, "  %-40s %dT  best %9.3f ms  median %9.3f ms  %7.2f GB/s\n", row.name.c_str(), row.threads,
                 row.best() * 1e3, row.median() * 1e3, row.gbs());

  auto memcpy_gbs = [&](int t) {
    for (const Row& r : rows)
      if (r.threads == t && r.name.rfind("memcpy", 0) == 0) return r.gbs();
    return 0.0;
  };
  std::printf("| kernel (bf16 [%lld, %lld] -> e4m3fn + f32 group-128 scales) | threads | moved (R+W) | best of %d (median) "
              "| GB/s | / memcpy (same T) | / numpy + ml_dtypes |\n|---|---:|---:|---:|---:|---:|---:|\n",
              static_cast<long long>(M), static_cast<long long>(K), reps);
  for (const Row& r : rows) {
    char ratio_np[32] = "—";
    if (numpy_gbs > 0 && r.name.rfind("memcpy", 0) != 0) std::snprintf(ratio_np, sizeof ratio_np, "%.1f", r.gbs() / numpy_gbs);
    const int dp = r.best() < 1e-3 ? 4 : 2;  // (decode-sized calls: microseconds)
    std::printf("| %s | %d | %.*f MB | %.*f ms (%.*f) | %.2f | %.2f | %s |\n", r.name.c_str(), r.threads, dp - 1,
                r.bytes / 1e6, dp, r.best() * 1e3, dp, r.median() * 1e3, r.gbs(), r.gbs() / memcpy_gbs(r.threads),
                ratio_np);
  }
  if (numpy_gbs > 0)
    std::printf("| numpy + ml_dtypes (aiter-style f32 rmsnorm + group quant, bench/anchor_rmsnorm_quant.py) | 1 | %.1f MB "
                "| | %.2f | %.2f | 1.0 |\n",
                plain / 1e6, numpy_gbs, numpy_gbs / memcpy_gbs(1));
  for (const Row& nt : rows)
    if (nt.threads == max_threads && nt.name.rfind("copy, non-temporal", 0) == 0) {
      std::printf("\nAgainst the non-temporal copy (%dT, %.2f GB/s):", max_threads, nt.gbs());
      for (const Row& r : rows)
        if (r.threads == max_threads && r.name.rfind("memcpy", 0) != 0 && &r != &nt)
          std::printf(" %s %.2f;", r.name.c_str(), r.gbs() / nt.gbs());
      std::printf("\n");
    }
  return 0;
}
