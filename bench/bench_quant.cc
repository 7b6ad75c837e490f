// bench_quant — group quantization bf16 [M, K] -> e4m3fn + f32 scales (group:128) and its dequantization, against
// the memory bandwidth of this machine measured in the same run (issue 4, "Speed").
//
// Compares, never asserts. Rows (each timed in interleaved rounds, best of --reps; bandwidth = bytes read + bytes
// written per second, as STREAM counts, no write-allocate traffic):
//   * memcpy of the bf16 input into another buffer (glibc; 2·M·K bytes read + 2·M·K written) — the anchor "memory
//     bandwidth of the same bytes";
//   * the same copy with non-temporal stores (bench_common.h stream_copy): glibc's memcpy of ~30 MB per thread stores
//     through the cache (a read for ownership per destination line: 1.5× the counted bytes), this one does not —
//     the machine's streaming bandwidth, the stricter anchor (ratios to it printed under the table);
//   * cpu::quantize, conventions vllm-group (x/s, IEEE) and deepseek-act-quant (Triton division): reads 2·M·K,
//     writes M·K codes + 4·M·K/128 scale bytes;
//   * cpu::dequantize e4m3fn + f32 scales -> bf16 (group:128): reads M·K + 4·M·K/128, writes 2·M·K;
//   * the numpy + ml_dtypes implementation of the same ops (bench/anchor_quant.py, single-threaded, run by
//     bench/run_quant.sh just before, on the identical input): --anchor NAME=GBS.
// On 2 threads (OpenMP max, the machine's cores) and 1. After timing, the outputs are checked against the scalar
// reference on a sample of rows, and their checksums printed (anchor_quant.py prints the same for vllm-group).
//
// Usage: bench_quant [--m 4096] [--k 7168] [--reps 7] [--anchor NAME=GBS ...]
// Run with OMP_WAIT_POLICY=passive (bench/run_quant.sh does).
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench_common.h"
#include "fp8ref/convert.h"
#include "fp8ref/quant.h"

namespace {

using namespace fp8ref;

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <typename T>
T* big_buffer(size_t n) {
  const size_t align = size_t{2} << 20, bytes = (n * sizeof(T) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  if (!p) {
    std::fprintf(stderr, "bench_quant: out of memory\n");
    std::exit(2);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  return static_cast<T*>(p);
}

// The input: bf16 bit patterns from a counter hash (anchor_quant.py computes the same): sign random, exponent
// 2^-8 .. 2^7, 7 random fraction bits; 1/4096 of the elements zero.
uint16_t bf16_input(uint32_t i) {
  const uint32_t h = lowbias32(i ^ 0x9E3779B9u);
  if ((h & 4095u) == 7u) return 0;
  const uint32_t sign = (h >> 31) << 15, e = 119u + ((h >> 12) % 16u), frac = (h >> 4) & 0x7Fu;
  return static_cast<uint16_t>(sign | (e << 7) | frac);
}

// convention[,key=value...]: a named convention (group:128 unless overridden) with the CLI's overrides
QuantSpec spec_of(const std::string& text) {
  std::string err;
  const size_t comma = text.find(',');
  ScaleDtype sd = ScaleDtype::f32;  // the convention is resolved for the scale dtype an override names
  const size_t at_sd = text.find(",scale-dtype=");
  if (at_sd != std::string::npos) {
    const size_t b = at_sd + 13, e = text.find(',', b);
    parse_scale_dtype(text.substr(b, e == std::string::npos ? std::string::npos : e - b), &sd);
  }
  auto s = resolve_quant_convention(text.substr(0, comma), Format::e4m3fn, sd, &err);
  bool ok = s && apply_quant_override("granularity", "group:128", &*s, &err);
  for (size_t at = comma; ok && at != std::string::npos;) {
    const size_t next = text.find(',', at + 1);
    const std::string kv = text.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    const size_t eq = kv.find('=');
    ok = eq != std::string::npos &&
         (kv.substr(0, eq) == "scale-dtype" || apply_quant_override(kv.substr(0, eq), kv.substr(eq + 1), &*s, &err));
    if (eq == std::string::npos) err = "override '" + kv + "' is not key=value";
    at = next;
  }
  if (!ok) {
    std::fprintf(stderr, "bench_quant: %s: %s\n", text.c_str(), err.c_str());
    std::exit(2);
  }
  finalize_quant_spec(&*s, true);
  return *s;
}

struct Row {
  std::string name;
  int threads;
  double bytes;
  std::function<void()> fn;
  std::vector<double> t;
  double best() const { return *std::min_element(t.begin(), t.end()); }
  double median() const {
    std::vector<double> s = t;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double gbs() const { return bytes / best() / 1e9; }
};

// Σ byte[i] · (i | 1) mod 2^64 (bench/anchor_quant.py computes the same in numpy).
uint64_t checksum(const uint8_t* p, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) h += p[i] * (static_cast<uint64_t>(i) | 1u);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 4096, K = 7168;
  int reps = 7;
  std::map<std::string, double> anchors;
  std::vector<std::string> extra;  // --conv: more quantize rows
  for (int a = 1; a < argc; ++a) {
    const std::string s = argv[a];
    const char* v = a + 1 < argc ? argv[a + 1] : nullptr;
    if (s == "--m" && v) M = std::stoll(argv[++a]);
    else if (s == "--k" && v) K = std::stoll(argv[++a]);
    else if (s == "--reps" && v) reps = std::stoi(argv[++a]);
    else if (s == "--conv" && v) extra.push_back(argv[++a]);
    else if (s == "--anchor" && v) {
      const std::string kv = argv[++a];
      const size_t eq = kv.find('=');
      anchors[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
    } else {
      std::fprintf(stderr, "usage: bench_quant [--m 4096] [--k 7168] [--reps 7] [--anchor NAME=GBS ...]\n"
                         "                   [--conv CONVENTION[,key=value...] ...]  (more quantize rows: group:128 unless\n"
                         "                   overridden; the CLI's override keys)\n");
      return 2;
    }
  }
  const size_t n = static_cast<size_t>(M * K), ng = n / 128;
  const std::vector<int64_t> shape = {M, K};
  const int T = omp_get_max_threads();
  std::fprintf(stderr, "bench_quant: bf16 [%lld, %lld], SIMD target %s, OpenMP threads %d\n", static_cast<long long>(M),
               static_cast<long long>(K), cpu::simd_target(), T);

  uint16_t* x = big_buffer<uint16_t>(n);
  uint16_t* copy = big_buffer<uint16_t>(n);
  uint8_t* q = big_buffer<uint8_t>(n);
  float* s = big_buffer<float>(n / 16 + static_cast<size_t>(M) + 64);  // group:16 / row / block scales fit
  uint16_t* back = big_buffer<uint16_t>(n);
  float* back32 = big_buffer<float>(n);
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < static_cast<long long>(n); ++i) x[i] = bf16_input(static_cast<uint32_t>(i));

  const QuantSpec vllm = spec_of("vllm-group"), dsk = spec_of("deepseek-act-quant");
  std::fprintf(stderr, "  vllm-group: %s\n    path: %s\n  deepseek-act-quant: %s\n    path: %s\n", vllm.describe().c_str(),
               cpu::quant_path(vllm, true).c_str(), dsk.describe().c_str(), cpu::quant_path(dsk, true).c_str());
  QuantSpec deq;  // e4m3fn codes, f32 scales, group:128
  deq.granularity = vllm.granularity;
  // the dequantize rows read codes and scales of their own (vllm-group's), not what the row before them wrote
  uint8_t* qd = big_buffer<uint8_t>(n);
  float* sd = big_buffer<float>(ng);
  cpu::quantize(vllm, Format::bf16, x, shape, qd, sd);

  const double in = 2.0 * n, codes = 1.0 * n, scales = 4.0 * ng;
  std::vector<Row> rows;
  std::vector<int> tcounts = {T};
  if (T > 1) tcounts.push_back(1);
  for (int t : tcounts) {
    rows.push_back({"memcpy of the bf16 input", t, 2 * in, [&] {
#pragma omp parallel
                      {
                        const size_t nt = static_cast<size_t>(omp_get_num_threads()), id = static_cast<size_t>(omp_get_thread_num());
                        const size_t per = (n + nt - 1) / nt, b = std::min(n, id * per), e = std::min(n, b + per);
                        std::memcpy(copy + b, x + b, (e - b) * 2);
                      }
                    }, {}});
    rows.push_back({"copy, non-temporal stores", t, 2 * in, [&] {
#pragma omp parallel
                      {
                        const size_t nt = static_cast<size_t>(omp_get_num_threads()), id = static_cast<size_t>(omp_get_thread_num());
                        const size_t per = (n + nt - 1) / nt, b = std::min(n, id * per), e = std::min(n, b + per);
                        fp8ref::bench::stream_copy(copy + b, x + b, (e - b) * 2);
                      }
                    }, {}});
    rows.push_back({"quantize vllm-group", t, in + codes + scales,
                    [&] { cpu::quantize(vllm, Format::bf16, x, shape, q, s); }, {}});
    rows.push_back({"quantize deepseek-act-quant", t, in + codes + scales,
                    [&] { cpu::quantize(dsk, Format::bf16, x, shape, q, s); }, {}});
    for (const std::string& e : extra) {
      const QuantSpec sp = spec_of(e);
      if (t == T) std::fprintf(stderr, "  %s: %s\n    path: %s\n", e.c_str(), sp.describe().c_str(), cpu::quant_path(sp, true).c_str());
      rows.push_back({"quantize " + e, t, in + codes + scales, [&, sp] { cpu::quantize(sp, Format::bf16, x, shape, q, s); }, {}});
    }
    rows.push_back({"dequantize -> bf16", t, codes + scales + in,
                    [&] { cpu::dequantize(deq, qd, shape, sd, Format::bf16, back); }, {}});
    rows.push_back({"dequantize -> f32", t, codes + scales + 2 * in,
                    [&] { cpu::dequantize(deq, qd, shape, sd, Format::f32, back32); }, {}});
  }
  for (int r = -1; r < reps; ++r)
    for (Row& row : rows) {
      omp_set_num_threads(row.threads);
      const double t0 = seconds();
      row.fn();
      if (r >= 0) row.t.push_back(seconds() - t0);
    }
  omp_set_num_threads(T);

  // Correctness: outputs vs the scalar reference on 64 sampled rows (rows are independent for group:128).
  size_t bad = 0;
  std::vector<uint8_t> qr(static_cast<size_t>(K)), qc(static_cast<size_t>(K));
  std::vector<float> sr(static_cast<size_t>(K / 128 + 1)), sc(sr.size());
  std::string sums;
  for (const QuantSpec* sp : {&vllm, &dsk}) {
    cpu::quantize(*sp, Format::bf16, x, shape, q, s);
    sums += std::string(" ") + sp->convention + " codes " + std::to_string(checksum(q, n)) + " scales " +
            std::to_string(checksum(reinterpret_cast<const uint8_t*>(s), ng * 4)) + ";";
    for (int64_t i = 0; i < 64; ++i) {
      const int64_t r = (i * 2654435761ll) % M;
      ref::quantize(*sp, Format::bf16, x + r * K, {1, K}, qr.data(), sr.data());
      bad += std::memcmp(qr.data(), q + r * K, static_cast<size_t>(K)) != 0;
      bad += std::memcmp(sr.data(), s + r * (K / 128), static_cast<size_t>(K / 128) * 4) != 0;
    }
  }
  // --conv rows whose rows are independent (group, mx, row): their codes on the same sampled rows
  std::vector<float> srx(static_cast<size_t>(K));
  for (const std::string& e : extra) {
    const QuantSpec sp = spec_of(e);
    const GranularityKind gk = sp.granularity.kind;
    if (gk != GranularityKind::group && gk != GranularityKind::mx && gk != GranularityKind::row) continue;
    cpu::quantize(sp, Format::bf16, x, shape, q, s);
    sums += " " + e + " codes " + std::to_string(checksum(q, n)) + ";";
    for (int64_t i = 0; i < 64; ++i) {
      const int64_t r = (i * 2654435761ll) % M;
      ref::quantize(sp, Format::bf16, x + r * K, {1, K}, qr.data(), srx.data());
      bad += std::memcmp(qr.data(), q + r * K, static_cast<size_t>(K)) != 0;
    }
  }
  cpu::quantize(vllm, Format::bf16, x, shape, q, s);
  cpu::dequantize(deq, q, shape, s, Format::bf16, back);
  std::vector<uint16_t> br(static_cast<size_t>(K));
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t r = (i * 2654435761ll) % M;
    ref::dequantize(deq, q + r * K, {1, K}, s + r * (K / 128), Format::bf16, br.data());
    bad += std::memcmp(br.data(), back + r * K, static_cast<size_t>(K) * 2) != 0;
  }
  std::fprintf(stderr, "  check: 64 sampled rows of each output vs ref::quantize / ref::dequantize: %zu mismatching rows\n", bad);
  std::fprintf(stderr, "  checksums:%s dequantized %llu\n", sums.c_str(),
               static_cast<unsigned long long>(checksum(reinterpret_cast<const uint8_t*>(back), n * 2)));

  const Row* mc = nullptr;
  for (const Row& r : rows)
    if (r.threads == T && r.name.rfind("memcpy", 0) == 0) mc = &r;
  std::printf("| bf16 [%lld, %lld], group:128 | threads | moved (R+W) | best of %d (median) | GB/s | / memcpy (%dT) | / numpy+ml_dtypes |\n",
              static_cast<long long>(M), static_cast<long long>(K), reps, T);
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  auto anchor_of = [&](const std::string& name) -> double {
    if (name.find("vllm") != std::string::npos) return anchors.count("vllm-group") ? anchors["vllm-group"] : 0;
    if (name.find("deepseek") != std::string::npos) return anchors.count("deepseek-act-quant") ? anchors["deepseek-act-quant"] : 0;
    if (name.find("dequantize") != std::string::npos) return anchors.count("dequantize") ? anchors["dequantize"] : 0;
    return 0;
  };
  for (const Row& r : rows) {
    const double a = anchor_of(r.name);
    char ratio_a[32] = "—", ratio_m[32] = "—";
    if (a > 0) std::snprintf(ratio_a, sizeof ratio_a, "%.1f×", r.gbs() / a);
    if (mc) std::snprintf(ratio_m, sizeof ratio_m, "%.2f", r.gbs() / mc->gbs());
    std::printf("| %s | %d | %.1f MB | %.2f ms (%.2f) | %.2f | %s | %s |\n", r.name.c_str(), r.threads, r.bytes / 1e6,
                r.best() * 1e3, r.median() * 1e3, r.gbs(), ratio_m, ratio_a);
  }
  for (const auto& [name, g] : anchors)
    std::printf("| numpy + ml_dtypes: %s (bench/anchor_quant.py) | 1 | | | %.2f | %s | 1.0× |\n", name.c_str(), g,
                mc ? (std::to_string(g / mc->gbs()).substr(0, 4)).c_str() : "—");
  const Row* nt = nullptr;
  for (const Row& r : rows)
    if (r.threads == T && r.name.rfind("copy, non-temporal", 0) == 0) nt = &r;
  if (nt) {
    std::printf("\nAgainst the non-temporal copy (%dT, %.2f GB/s):", T, nt->gbs());
    for (const Row& r : rows)
      if (r.threads == T && r.name.rfind("memcpy", 0) != 0 && &r != nt) std::printf(" %s %.2f;", r.name.c_str(), r.gbs() / nt->gbs());
    std::printf("\n");
  }
  std::free(x);
  std::free(copy);
  std::free(q);
  std::free(s);
  std::free(back);
  return bad ? 1 : 0;
}
