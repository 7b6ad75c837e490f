// Differential testing of the cpu backend against the reference: one input (a byte string) picks an op, a named
// convention, overrides, formats, a shape, a SIMD target and the parameters of its data; both backends run it and
// every output must be equal bit for bit (and both must refuse the same inputs). The data come from a generator
// seeded by the input, over many magnitudes (the source format's whole exponent range, subnormals, ±0, Inf, NaN,
// mantissas with few bits so that quotients fall on FP8 ties, rows of zeros, tiny rows under the scale guards).
//
// Drivers: the libFuzzer target tests/fuzz/fuzz_backends.cc (coverage-guided, the sanitizer build, label fuzz),
// tools/device/run_backend_diff.sh (many seeds on the device host's AVX-512/AMX CPU) and tests/test_backend_diff.cc (random byte strings from fixed seeds, the unit label; FP8REF_DIFF_INPUTS=N runs
// more; FP8REF_DIFF_HEX=<bytes> replays one input). Ops: quantize (dynamic and static), dequantize, rmsnorm_quant,
// kv_cache_write, paged_attention (every bit-exact convention; fast against its derived bound of exact), scaled_mm
// and scaled_bmm (exact, f32-kblock, hopper-tc; fast against its bound); the golden path (golden files of random
// descriptors by the reference, run by the cpu backend). FP8REF_DIFF_SAY_REFUSALS=1 prints each InputError met
// (overrides that do not fit a convention, cases that name an invalid combination: expected).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/gemm.h"
#include "fp8ref/golden.h"
#include "fp8ref/io.h"
#include "fp8ref/quant.h"
#include "fp8ref/rmsnorm.h"
#include "support/attention_cases.h"
#include "support/sanitizer.h"

namespace fp8ref::test {

// The input as a stream of choices; past its end every choice is 0 (the first option).
class Choices {
 public:
  Choices(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint32_t byte() { return i_ < n_ ? p_[i_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v = v << 8 | byte();
    return v;
  }
  // One of n options (n <= 65536).
  size_t pick(size_t n) { return n <= 256 ? byte() % n : (byte() << 8 | byte()) % n; }
  template <typename T, size_t N>
  const T& of(const T (&a)[N]) {
    return a[pick(N)];
  }
  bool coin() { return byte() & 1; }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

// The data generator, seeded from the input: the fills' xoshiro256** (golden::Rng).
struct DiffRng {
  golden::Rng r;
  explicit DiffRng(uint64_t seed) : r(seed, 0) {}
  uint64_t next() { return r.next(); }
  uint32_t below(uint32_t n) { return n ? static_cast<uint32_t>(next() % n) : 0; }
  bool percent(uint32_t p) { return below(100) < p; }
};

// How a tensor's elements are drawn: exponents center ± spread (per row: + a row offset in [0, row_var)), a share of
// specials, of mantissas cut to a few leading bits (ties after the division), of rows that are all zero.
struct Fill {
  int center = 0, spread = 4, row_var = 1;
  uint32_t special = 0, few_bits = 20, zero_rows = 0;
};

inline Fill read_fill(Choices& in) {
  static const int kCenters[] = {0, 0, 0, 3, -3, 8, -8, 15, -14, -20, 40, -40, 100, -100, -126, -133, 126, 127};
  static const int kSpreads[] = {0, 1, 2, 4, 8, 16, 40, 140};
  static const int kRowVar[] = {1, 1, 4, 20, 60};
  static const uint32_t kPct[] = {0, 0, 1, 5, 20};
  Fill f;
  f.center = in.of(kCenters);
  f.spread = in.of(kSpreads);
  f.row_var = in.of(kRowVar);
  f.special = in.of(kPct);
  f.few_bits = in.of(kPct) * 4;
  f.zero_rows = in.of(kPct) * 2;
  return f;
}

// Bit patterns of `from` (f32, bf16, f16): rows of K elements.
inline std::vector<uint32_t> fill_bits(Format from, int64_t rows, int64_t K, const Fill& f, DiffRng& r) {
  const int mant = from == Format::f32 ? 23 : from == Format::bf16 ? 7 : 10;
  const int ebits = from == Format::f16 ? 5 : 8, bias = (1 << (ebits - 1)) - 1, emax = (1 << ebits) - 1;
  const uint32_t sign_bit = 1u << (mant + ebits);
  std::vector<uint32_t> out(static_cast<size_t>(rows * K));
  for (int64_t i = 0; i < rows; ++i) {
    const bool zero = r.percent(f.zero_rows);
    const int rc = f.center + static_cast<int>(r.below(static_cast<uint32_t>(f.row_var)));
    for (int64_t k = 0; k < K; ++k) {
      uint32_t b;
      const uint32_t s = r.percent(50) ? sign_bit : 0;
      if (zero) {
        b = r.percent(10) ? s : 0;
      } else if (r.percent(f.special)) {
        switch (r.below(6)) {
          case 0: b = s; break;                                                             // ±0
          case 1: b = s | static_cast<uint32_t>(emax) << mant; break;                       // ±Inf
          case 2: b = s | static_cast<uint32_t>(emax) << mant | (1u + r.below((1u << mant) - 1)); break;  // NaN
          case 3: b = s | ((static_cast<uint32_t>(emax) << mant) - 1); break;               // ±max finite
          case 4: b = s | (1u + r.below(7)); break;                                         // tiny subnormals
          default: b = static_cast<uint32_t>(r.next()) & (sign_bit | (sign_bit - 1)); break;  // any pattern
        }
      } else {
        const int e = rc + static_cast<int>(r.below(static_cast<uint32_t>(2 * f.spread + 1))) - f.spread;
        const int be = std::clamp(e + bias, 0, emax - 1);
        uint32_t m = static_cast<uint32_t>(r.next()) & ((1u << mant) - 1);
        if (r.percent(f.few_bits)) m &= ~((1u << (mant - std::min<int>(mant, static_cast<int>(r.below(5))))) - 1);
        b = s | static_cast<uint32_t>(be) << mant | m;
      }
      out[static_cast<size_t>(i * K + k)] = b;
    }
  }
  return out;
}

// Little-endian bytes of the patterns in `from`'s width.
inline std::vector<uint8_t> to_bytes(Format from, const std::vector<uint32_t>& bits) {
  const size_t es = from == Format::f32 ? 4 : 2;
  std::vector<uint8_t> b(bits.size() * es);
  for (size_t i = 0; i < bits.size(); ++i)
    for (size_t j = 0; j < es; ++j) b[i * es + j] = static_cast<uint8_t>(bits[i] >> (8 * j));
  return b;
}

// The first differing byte of two buffers, as text ("" when equal).
inline std::string first_diff(const char* what, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ";
  size_t n = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i] && n++ == 0) first = i;
  if (n == 0) return "";
  char t[160];
  std::snprintf(t, sizeof t, ": %zu of %zu bytes differ, the first at %zu: cpu 0x%02x, reference 0x%02x", n, a.size(),
                first, a[first], b[first]);
  return what + std::string(t);
}

// Runs fn on the SIMD target with index t % 8 (modulo the count) of the cpu backend's dispatch, with OpenMP's
// default thread count or (t / 8 % 4) 1, 3 or 7 threads: how the backends cut work into chunks and groups must not
// change a bit. (Not under AddressSanitizer: clang's libomp keeps the threads a larger team adds until exit, which
// LeakSanitizer reports as leaks; the Release runs cover the thread counts.)
inline void on_target(size_t t, const std::function<void()>& fn) {
  static const size_t n = cpu::for_each_simd_target([] {}).size();
  static const int kThreads[] = {0, 1, 3, 7};
  size_t i = 0;
  const size_t want = t % 8 % std::max<size_t>(n, 1);
  const int threads = kThreads[t / 8 % 4], before = omp_get_max_threads();
  if (threads && !FP8REF_TEST_ASAN) omp_set_num_threads(threads);
  cpu::for_each_simd_target([&] {
    if (i++ == want) fn();
  });
  if (threads && !FP8REF_TEST_ASAN) omp_set_num_threads(before);
}

// "" when fn returned, else "InputError" (any other exception escapes).
inline std::string outcome(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    if (std::getenv("FP8REF_DIFF_SAY_REFUSALS")) std::fprintf(stderr, "refused: %s\n", e.what());
    return "InputError";
  }
  return "";
}

// Cases both backends ran (or both refused) and were compared, per op: what the drivers report.
struct DiffCounts {
  size_t compared[8] = {};
  size_t refused = 0;  // both refused the input (InputError)
};
inline DiffCounts& diff_counts() {
  static DiffCounts c;
  return c;
}

namespace diff_detail {

inline const uint32_t (&kPctSkip())[4] {
  static const uint32_t p[4] = {0, 10, 50, 100};
  return p;
}
inline const Format kFp8[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz};
inline const Format kSources[] = {Format::f32, Format::bf16, Format::f16};
inline const std::optional<ScaleDtype> kScaleDtypes[] = {std::nullopt, ScaleDtype::f32, ScaleDtype::bf16,
                                                         ScaleDtype::f16, ScaleDtype::ue8m0};

// Overrides of the quant fields: field, values.
struct Field {
  const char* name;
  std::vector<const char*> values;
};
inline const std::vector<Field>& quant_fields() {
  static const std::vector<Field> f = {
      {"granularity",
       {"tensor", "row", "col", "group:16", "group:32", "group:64", "group:128", "group:256", "group:7", "group:40",
        "block:128x128", "block:3x32", "block:4x20", "mx:32"}},
      {"tail", {"partial", "error"}},
      {"amax-nan", {"ignore", "propagate"}},
      {"guard", {"none", "amax-floor:1e-10", "amax-floor:1e-4", "min-scale:1e-8", "min-scale:1e-30",
                 "amax-floor:1e-12,min-scale:1e-20"}},
      {"scale-formula", {"amax/max", "amax*(1/max)", "exact"}},
      {"scale-round", {"rne", "pow2-ceil", "pow2-ceil-clamp", "mx-floor"}},
      {"scale-store", {"native", "f32"}},
      {"fp8-max", {"finfo", "448", "240", "224", "57344", "200", "1"}},
      {"formula", {"x/s", "x*(1/s)", "x*(max/amax)", "x*(max*rcp(amax))", "exact", "x*rcp-bits(s)",
                   "x*rcp-bits(s)@in"}},
      {"clamp", {"none", "nan-to-max", "nan-to-min", "nan-kept"}},
      {"div", {"ieee", "triton-nv"}},
      {"cast", {"torch-2.11", "torch-2.11-cuda", "cuda-satfinite", "cuda-nosat", "ml_dtypes", "ml_dtypes-0.6",
                "ocp-sat", "ocp-nosat", "exact"}},
  };
  return f;
}

// Up to 3 overrides; one that is refused, or that `valid` rejects afterwards, is left out.
template <typename Spec, typename Apply, typename Valid>
void read_overrides(Choices& in, const std::vector<Field>& fields, Spec* spec, Apply&& apply, Valid&& valid) {
  const size_t n = in.pick(4);
  for (size_t i = 0; i < n; ++i) {
    const Field& f = fields[in.pick(fields.size())];
    Spec t = *spec;
    if (apply(f.name, f.values[in.pick(f.values.size())], &t) && valid(t)) *spec = t;
  }
}

// One of the FP8 targets a convention lists ("e4m3fn e4m3fnuz").
inline Format read_target(Choices& in, const char* targets) {
  std::vector<Format> ts;
  for (Format f : kFp8)
    if ((std::string(" ") + targets + " ").find(std::string(" ") + format_name(f) + " ") != std::string::npos)
      ts.push_back(f);
  return ts.empty() ? in.of(kFp8) : ts[in.pick(ts.size())];
}

inline int64_t read_dim(Choices& in, bool k_dim) {
  // (rarely, rows longer than the cpu backend's work chunks and more rows than threads: 7168, 9000; 33, 64)
  static const int64_t kRows[] = {1, 1, 2, 3, 4, 5, 0, 7, 9, 1, 2, 3, 4, 2, 33, 64};
  static const int64_t kCols[] = {128, 256, 16, 32, 7, 1, 40, 129, 300, 127, 64, 0, 3, 161, 512, 1000,
                                  128, 256, 128, 64, 384, 7168, 9000, 2048};
  return k_dim ? in.of(kCols) : in.of(kRows);
}

// The quantize family: dynamic quantize, static quantize with the reference's scales (or scales drawn from the
// input), dequantize of the codes.
inline std::string diff_quantize(Choices& in, DiffRng& rng, size_t target) {
  const auto& convs = quant_conventions();
  const QuantConventionInfo& ci = convs[in.pick(convs.size())];
  const Format to = read_target(in, ci.targets);
  std::optional<ScaleDtype> dt = in.of(kScaleDtypes);
  std::string err;
  auto spec = resolve_quant_convention(ci.name, to, dt, &err);
  if (!spec) spec = resolve_quant_convention(ci.name, to, std::nullopt, &err);
  if (!spec) return "";
  const auto finalized = [](QuantSpec t, bool dynamic) { return outcome([&] { finalize_quant_spec(&t, dynamic); }).empty(); };
  read_overrides(
      in, quant_fields(), &*spec,
      [&](const char* f, const char* v, QuantSpec* t) { return apply_quant_override(f, v, t, &err); },
      [&](const QuantSpec& t) { return finalized(t, true); });
  QuantSpec stat = *spec;
  finalize_quant_spec(&*spec, true);
  const Format from = in.of(kSources);
  std::vector<int64_t> shape;
  const size_t rank = 1 + in.pick(3);
  for (size_t i = 0; i + 1 < rank; ++i) shape.push_back(read_dim(in, false));
  shape.push_back(read_dim(in, true));
  const Fill fill = read_fill(in);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t K = shape.back(), rows = K ? n / K : 0;
  const std::vector<uint8_t> x = to_bytes(from, fill_bits(from, rows, K, fill, rng));
  QuantLayout L;
  try {
    L = quant_layout(*spec, shape);
  } catch (const InputError&) {
    return "";
  }
  const size_t ss = static_cast<size_t>(format_info(scale_storage(*spec)).bits / 8);
  std::vector<uint8_t> qr(static_cast<size_t>(n), 0xA5), qc(qr), sr(static_cast<size_t>(L.n_scales) * ss, 0x5A), sc(sr);
  std::string o_ref = outcome([&] { ref::quantize(*spec, from, x.data(), shape, qr.data(), sr.data()); });
  std::string o_cpu;
  on_target(target, [&] { o_cpu = outcome([&] { cpu::quantize(*spec, from, x.data(), shape, qc.data(), sc.data()); }); });
  const std::string what = std::string("quantize ") + spec->describe() + " from " + format_name(from);
  if (o_ref != o_cpu) return what + ": reference '" + o_ref + "', cpu '" + o_cpu + "'";
  if (!o_ref.empty()) return ++diff_counts().refused, "";
  ++diff_counts().compared[0];
  std::string d = first_diff("codes", qc, qr);
  if (d.empty()) d = first_diff("scales", sc, sr);
  if (!d.empty()) return what + ": " + d;

  // static: the reference's scales, or each scale's bits perturbed / drawn
  const bool stat_ok = finalized(stat, false);
  if (stat_ok) finalize_quant_spec(&stat, false);
  if (stat_ok && scale_storage(stat) == scale_storage(*spec)) {
    std::vector<uint8_t> s = sr;
    const uint32_t mode = in.pick(4);
    for (size_t i = 0; i < s.size(); ++i) {
      if (mode == 1 && rng.percent(30)) s[i] ^= static_cast<uint8_t>(1u << rng.below(8));
      if (mode == 2) s[i] = static_cast<uint8_t>(rng.next());
    }
    // mode 3: the data rebuilt as FP8 values and midpoints (and their source-format neighbours, and values past
    // fp8-max) times each element's scale, so that the quotients sit on the cast's decision points
    std::vector<uint8_t> xs = x;
    if (mode == 3) {
      std::vector<int64_t> sstride(L.scale_shape.size(), 1);
      for (size_t d = L.scale_shape.size(); d-- > 1;) sstride[d - 1] = sstride[d] * L.scale_shape[d];
      std::vector<uint32_t> bits(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        int64_t rem = i, g = 0;
        for (size_t d = shape.size(); d-- > 0;) {
          const int64_t idx = rem % shape[d];
          rem /= shape[d];
          g += idx / L.block[d] * sstride[d];
        }
        const double sv = ref::scale_value(stat, s.data(), static_cast<size_t>(g));
        const uint8_t c = static_cast<uint8_t>(rng.below(256));
        double t = ref::value_of(spec->to, c);
        const double t1 = ref::value_of(spec->to, static_cast<uint8_t>((c & 0x80) | std::min<uint32_t>((c & 0x7F) + 1u, 0x7Fu)));
        if (!std::isfinite(t)) t = spec->fp8_max;
        if (rng.percent(50) && std::isfinite(t1)) t = (t + t1) / 2;  // a midpoint
        if (rng.percent(5)) t = (rng.percent(50) ? 1 : -1) * (spec->fp8_max + rng.below(40));
        uint64_t vb;
        const double v = t * sv;
        std::memcpy(&vb, &v, 8);
        uint32_t b = static_cast<uint32_t>(ref::narrow(Format::f64, vb, from));
        if (rng.percent(30)) b += rng.percent(50) ? 1u : static_cast<uint32_t>(-1);  // a source ulp off
        bits[static_cast<size_t>(i)] = b & (from == Format::f32 ? 0xFFFFFFFFu : 0xFFFFu);
      }
      xs = to_bytes(from, bits);
    }
    std::fill(qr.begin(), qr.end(), 0xA5);
    std::fill(qc.begin(), qc.end(), 0xA5);
    o_ref = outcome([&] { ref::quantize_static(stat, from, xs.data(), shape, s.data(), qr.data()); });
    on_target(target,
              [&] { o_cpu = outcome([&] { cpu::quantize_static(stat, from, xs.data(), shape, s.data(), qc.data()); }); });
    if (o_ref != o_cpu) return what + " (static): reference '" + o_ref + "', cpu '" + o_cpu + "'";
    if (o_ref.empty()) {
      d = first_diff("static codes", qc, qr);
      if (!d.empty()) return what + " (static, mode " + std::to_string(mode) + "): " + d;
    }
  }

  // dequantize the codes (some replaced by any code) with the dynamic scales
  std::vector<uint8_t> q = qr;
  if (in.coin())
    for (auto& c : q)
      if (rng.percent(20)) c = static_cast<uint8_t>(rng.next());
  const Format out = in.of(kSources);
  std::vector<uint8_t> yr(static_cast<size_t>(n) * (format_info(out).bits / 8), 0xA5), yc(yr);
  o_ref = outcome([&] { ref::dequantize(*spec, q.data(), shape, sr.data(), out, yr.data()); });
  on_target(target, [&] { o_cpu = outcome([&] { cpu::dequantize(*spec, q.data(), shape, sr.data(), out, yc.data()); }); });
  if (o_ref != o_cpu) return what + " (dequantize): reference '" + o_ref + "', cpu '" + o_cpu + "'";
  if (o_ref.empty()) {
    d = first_diff(("dequantize to " + std::string(format_name(out))).c_str(), yc, yr);
    if (!d.empty()) return what + ": " + d;
  }
  return "";
}

inline const std::vector<Field>& rmsnorm_fields() {
  static const std::vector<Field> f = [] {
    std::vector<Field> v = {
        {"residual-sum", {"f32", "dtype"}},
        {"variance", {"exact", "f32-seq", "cub:auto", "cub:32", "cub:256", "cub:1", "cub:1024"}},
        {"eps", {"0", "1e-6", "1e-5", "1e-30", "1e-45", "1e+30", "0.5"}},
        {"rsqrt", {"rn", "ieee", "cuda-rsqrtf"}},
        {"weight", {"f32", "dtype-twice", "dtype-once"}},
        {"group", {"128", "64", "32", "16", "256", "7"}},
        {"granularity", {"row", "group:128"}},
    };
    for (const Field& q : quant_fields())
      if (std::string(q.name) != "granularity") v.push_back(q);
    return v;
  }();
  return f;
}

// rmsnorm_quant with and without a residual (written back in place or to its own buffer): codes, scales, the
// updated residual, the normed values and each row's r.
inline std::string diff_rmsnorm(Choices& in, DiffRng& rng, size_t target) {
  const auto& convs = rmsnorm_quant_conventions();
  const RmsNormConventionInfo& ci = convs[in.pick(convs.size())];
  const Format to = read_target(in, ci.targets);
  std::string err;
  auto spec = resolve_rmsnorm_quant_convention(ci.name, to, &err, in.of(kScaleDtypes));
  if (!spec) spec = resolve_rmsnorm_quant_convention(ci.name, to, &err);
  if (!spec) return "";
  const auto finalized = [](RmsNormQuantSpec t) { return outcome([&] { finalize_rmsnorm_quant_spec(&t); }).empty(); };
  read_overrides(
      in, rmsnorm_fields(), &*spec,
      [&](const char* f, const char* v, RmsNormQuantSpec* t) { return apply_rmsnorm_override(f, v, t, &err); },
      finalized);
  finalize_rmsnorm_quant_spec(&*spec);
  const Format from = in.of(kSources);
  const int64_t M = read_dim(in, false), K = read_dim(in, true);
  const Fill fx = read_fill(in), fw = read_fill(in);
  const uint32_t res = in.pick(3);  // 0: none, 1: residual_out its own buffer, 2: in place into the residual
  const std::vector<int64_t> shape = {M, K}, wshape = {K};
  const std::vector<uint8_t> x = to_bytes(from, fill_bits(from, M, K, fx, rng));
  const std::vector<uint8_t> w = to_bytes(from, fill_bits(from, 1, K, fw, rng));
  const std::vector<uint8_t> r0 = to_bytes(from, fill_bits(from, M, K, read_fill(in), rng));
  RmsNormLayout L;
  try {
    L = rmsnorm_layout(*spec, from, shape, wshape, res ? &shape : nullptr);
  } catch (const InputError&) {
    return "";
  }
  const size_t n = static_cast<size_t>(M * K), es = from == Format::f32 ? 4 : 2;
  const size_t ss = static_cast<size_t>(format_info(scale_storage(spec->quant)).bits / 8);
  struct Out {
    std::vector<uint8_t> q, s, r, ro, normed, rms;
  };
  const auto run = [&](bool cpu_backend, Out* o) {
    o->q.assign(n, 0xA5);
    o->s.assign(static_cast<size_t>(L.quant.n_scales) * ss, 0x5A);
    o->r = r0;
    o->ro.assign(res == 1 ? n * es : 0, 0x3C);
    o->normed.assign(n * 4, 0x77);
    o->rms.assign(static_cast<size_t>(M) * 4, 0x11);
    RmsNormQuantArgs a;
    a.from = from;
    a.x = x.data();
    a.weight = w.data();
    a.residual = res ? o->r.data() : nullptr;
    a.residual_out = res == 1 ? static_cast<void*>(o->ro.data()) : res == 2 ? static_cast<void*>(o->r.data()) : nullptr;
    a.shape = shape;
    a.weight_shape = wshape;
    a.q = o->q.data();
    a.scales = o->s.data();
    a.normed = reinterpret_cast<float*>(o->normed.data());
    a.rms = reinterpret_cast<float*>(o->rms.data());
    return outcome([&] { cpu_backend ? cpu::rmsnorm_quant(*spec, a) : ref::rmsnorm_quant(*spec, a); });
  };
  Out R, C;
  const std::string o_ref = run(false, &R);
  std::string o_cpu;
  on_target(target, [&] { o_cpu = run(true, &C); });
  const std::string what = "rmsnorm_quant " + spec->describe() + " from " + format_name(from) + " [" +
                           std::to_string(M) + ", " + std::to_string(K) + "] residual " + std::to_string(res);
  if (o_ref != o_cpu) return what + ": reference '" + o_ref + "', cpu '" + o_cpu + "'";
  if (!o_ref.empty()) return ++diff_counts().refused, "";
  ++diff_counts().compared[1];
  for (const auto& [name, a, b] : {std::make_tuple("codes", &C.q, &R.q), std::make_tuple("scales", &C.s, &R.s),
                                   std::make_tuple("residual", &C.r, &R.r), std::make_tuple("residual_out", &C.ro, &R.ro),
                                   std::make_tuple("normed", &C.normed, &R.normed), std::make_tuple("rms", &C.rms, &R.rms)}) {
    const std::string d = first_diff(name, *a, *b);
    if (!d.empty()) return what + ": " + d;
  }
  return "";
}

// kv_cache_write: tokens into shuffled slots (some skipped), every convention, static or dynamic scales of each
// kind: both caches (filled with the same random bytes first) and the dynamic scales.
inline std::string diff_kv_write(Choices& in, DiffRng& rng, size_t target) {
  static const attn::StoreConvention kConvs[] = {attn::StoreConvention::vllm_cuda, attn::StoreConvention::sglang,
                                                 attn::StoreConvention::spyre, attn::StoreConvention::exact};
  static const int64_t kBs[] = {16, 1, 5, 64}, kH[] = {1, 2, 3}, kD[] = {64, 128, 16, 7, 256, 576};
  static const int64_t kT[] = {1, 5, 17, 40, 0};
  attn::KvWriteSpec spec;
  spec.convention = in.of(kConvs);
  spec.model = in.of(kSources);
  spec.cache.block_size = in.of(kBs);
  spec.cache.num_kv_heads = in.of(kH);
  spec.cache.head_dim = in.of(kD);
  spec.cache.layout = in.coin() ? attn::KvLayout::hnd : attn::KvLayout::nhd;
  spec.cache.format = in.coin() ? Format::e5m2 : Format::e4m3fn;
  spec.scale_kind = static_cast<attn::KvScaleKind>(in.pick(3));
  spec.dynamic = in.coin();
  const int64_t T = in.of(kT), H = spec.cache.num_kv_heads, D = spec.cache.head_dim;
  spec.cache.num_blocks = (T + spec.cache.block_size - 1) / spec.cache.block_size + 1 + static_cast<int64_t>(in.pick(3));
  const Fill fk = read_fill(in), fv = read_fill(in);
  const std::vector<uint8_t> k = to_bytes(spec.model, fill_bits(spec.model, T * H, D, fk, rng));
  const std::vector<uint8_t> v = to_bytes(spec.model, fill_bits(spec.model, T * H, D, fv, rng));
  // distinct slots, a share skipped (−1)
  const int64_t slots = spec.cache.num_blocks * spec.cache.block_size;
  std::vector<int64_t> perm(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) perm[static_cast<size_t>(i)] = i;
  for (int64_t i = slots - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[rng.below(static_cast<uint32_t>(i + 1))]);
  const uint32_t skip = in.of(kPctSkip());
  std::vector<int64_t> slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) slot[static_cast<size_t>(t)] = rng.percent(skip) ? -1 : perm[static_cast<size_t>(t)];
  // sequences: B token ranges over [0, T)
  const int64_t B = spec.scale_kind == attn::KvScaleKind::seq ? 1 + static_cast<int64_t>(in.pick(3)) : 0;
  std::vector<int32_t> qsl(static_cast<size_t>(B + 1), 0);
  for (int64_t b = 1; b < B; ++b) qsl[static_cast<size_t>(b)] = static_cast<int32_t>(rng.below(static_cast<uint32_t>(T + 1)));
  std::sort(qsl.begin(), qsl.end());
  if (B) qsl[static_cast<size_t>(B)] = static_cast<int32_t>(T);
  const int64_t ns = attn::num_scales(spec.scale_kind, H, B);
  std::vector<float> ks0(static_cast<size_t>(ns)), vs0(ks0);
  for (auto* sc : {&ks0, &vs0})
    for (float& x : *sc)
      x = static_cast<float>(std::ldexp(1.0 + rng.below(1000) / 1000.0, static_cast<int>(rng.below(40)) - 30));
  std::vector<uint8_t> cache0(static_cast<size_t>(spec.cache.numel()));
  for (auto& c : cache0) c = static_cast<uint8_t>(rng.next());
  struct Out {
    std::vector<uint8_t> kc, vc;
    std::vector<float> ks, vs;
  };
  const auto run = [&](bool cpu_backend, Out* o) {
    o->kc = cache0;
    o->vc = cache0;
    o->ks = ks0;
    o->vs = vs0;
    attn::KvWriteArgs a = kv_args(T, k, v, slot, B, qsl, o->ks, o->vs, o->kc, o->vc);
    if (!B) a.query_start_loc = nullptr;  // (no sequences: scales per tensor or head)
    return outcome([&] { cpu_backend ? attn::cpu::kv_cache_write(spec, a) : attn::ref::kv_cache_write(spec, a); });
  };
  Out R, C;
  const std::string o_ref = run(false, &R);
  std::string o_cpu;
  on_target(target, [&] { o_cpu = run(true, &C); });
  const std::string what = std::string("kv_cache_write ") + to_string(spec.convention) + " md " +
                           format_name(spec.model) + " " + format_name(spec.cache.format) + " bs " +
                           std::to_string(spec.cache.block_size) + " H " + std::to_string(H) + " D " +
                           std::to_string(D) + " " + to_string(spec.cache.layout) + " scales " +
                           to_string(spec.scale_kind) + (spec.dynamic ? " dynamic" : " static") + " T " + std::to_string(T);
  if (o_ref != o_cpu) return what + ": reference '" + o_ref + "', cpu '" + o_cpu + "'";
  if (!o_ref.empty()) return ++diff_counts().refused, "";
  ++diff_counts().compared[2];
  const auto bytes_of = [](const std::vector<float>& f) {
    std::vector<uint8_t> b(f.size() * 4);
    std::memcpy(b.data(), f.data(), b.size());
    return b;
  };
  std::string d = first_diff("k cache", C.kc, R.kc);
  if (d.empty()) d = first_diff("v cache", C.vc, R.vc);
  if (d.empty()) d = first_diff("k scales", bytes_of(C.ks), bytes_of(R.ks));
  if (d.empty()) d = first_diff("v scales", bytes_of(C.vs), bytes_of(R.vs));
  return d.empty() ? d : what + ": " + d;
}

// paged_attention: a batch of decode and chunked-prefill sequences over shuffled pages (unused slots NaN codes),
// every convention with its launch options; codes drawn from any byte (NaN/Inf included) or near N(0, 3), queries
// over many magnitudes. Bit-exact conventions: cpu == reference bit for bit. fast: within its derived bound of the
// exact convention's f64 result, NaN exactly where the bound makes no claim or exact is NaN.
inline std::string diff_attention(Choices& in, DiffRng& rng, size_t target) {
  using attn::AttnConvention;
  static const AttnConvention kConvs[] = {AttnConvention::exact,           AttnConvention::vllm_paged_v1,
                                          AttnConvention::vllm_triton_unified, AttnConvention::flashinfer,
                                          AttnConvention::torch_sdpa_math, AttnConvention::spyre, AttnConvention::fast};
  static const int64_t kBs[] = {16, 1, 64, 5}, kHkv[] = {1, 2}, kG[] = {1, 8, 2, 4, 3};
  static const int64_t kD[] = {64, 128, 32, 256, 576, 16, 80};
  static const int64_t kSeq[] = {1, 37, 70, 16, 0, 129, 5, 300};
  attn::AttnSpec sp;
  sp.convention = in.of(kConvs);
  sp.q_format = in.of(kSources);
  sp.out_format = in.of(kSources);
  sp.cache.block_size = in.of(kBs);
  sp.cache.num_kv_heads = in.of(kHkv);
  sp.num_q_heads = sp.cache.num_kv_heads * in.of(kG);
  sp.cache.head_dim = in.of(kD);
  if (sp.cache.head_dim == 576 || in.pick(8) == 0) {  // MLA: V = the first Dv dims of K
    sp.v_from_k = true;
    sp.head_dim_v = sp.cache.head_dim == 576 ? 512 : sp.cache.head_dim / 2;
  }
  sp.cache.layout = in.pick(4) == 0 ? attn::KvLayout::hnd : attn::KvLayout::nhd;
  sp.cache.format = in.pick(3) == 0 ? Format::e5m2 : Format::e4m3fn;
  sp.causal = static_cast<attn::Causal>(in.pick(3));
  static const int64_t kWin[] = {-1, -1, 0, 3, 20};
  sp.window_left = in.of(kWin);
  static const double kCap[] = {0, 0, 30, 0.5};
  sp.softcap = in.of(kCap);
  sp.scale_kind = static_cast<attn::KvScaleKind>(in.pick(3));
  sp.torch_lanes = in.coin() ? 16 : 8;
  static const double kSm[] = {0, 0, 0.3, 1e-3, 10};
  sp.sm_scale = in.of(kSm);
  // the launch options of the conventions that have them (others refuse them)
  const uint32_t launch = in.byte();
  static const int64_t kTile[] = {0, 16, 32, 64}, kSeg[] = {-1, 0, 2, 16}, kChunk[] = {-1, 0, 16, 48};
  static const int64_t kCta[] = {0, 16, 64}, kPch[] = {-1, 0, 32};
  const bool triton = sp.convention == AttnConvention::vllm_triton_unified,
             fi = sp.convention == AttnConvention::flashinfer;
  if (!triton && !fi && sp.convention != AttnConvention::exact && sp.convention != AttnConvention::fast) sp.softcap = 0;
  if (fi) sp.softcap = 0;
  if ((triton || fi) && (launch & 1)) sp.tile = kTile[(launch >> 1) % 4];
  if (triton && (launch & 8)) sp.segments = kSeg[(launch >> 4) % 4];
  if (fi) {
    if (launch & 64) sp.kv_chunk = kChunk[(launch >> 1) % 4];
    if (launch & 128) sp.fi_kernel = static_cast<attn::FiKernel>((launch >> 3) % 3);
    if (in.pick(4) == 0) sp.cta_tile_q = in.of(kCta);
    if (in.pick(4) == 0) sp.prefill_kv_chunk = in.of(kPch);
  }
  sp.chunk_unquantized = !fi && sp.convention != AttnConvention::fast && in.pick(6) == 0;
  if (triton && in.pick(6) == 0) {
    sp.out_format = Format::e4m3fn;
    sp.out_scale = 0.01 + rng.below(100) / 10.0;
  }
  const int64_t B = 1 + static_cast<int64_t>(in.pick(4));
  std::vector<int64_t> seq(static_cast<size_t>(B)), ql(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    seq[static_cast<size_t>(b)] = in.of(kSeq);
    const int64_t L = seq[static_cast<size_t>(b)];
    const uint32_t k = in.pick(4);  // decode, a chunk, the whole sequence, none
    ql[static_cast<size_t>(b)] = k == 0 ? std::min<int64_t>(L, 1) : k == 1 ? std::min<int64_t>(L, 1 + rng.below(8)) : k == 2 ? L : 0;
  }
  // bound the work (the reference is scalar; exact sums in f64 per product): ~ q rows × keys × Hq × (Dk + Dv)
  const auto work = [&] {
    int64_t w = 0;
    for (int64_t b = 0; b < B; ++b) w += ql[static_cast<size_t>(b)] * seq[static_cast<size_t>(b)];
    return w * sp.num_q_heads * (sp.cache.head_dim + sp.dv());
  };
  while (work() > 3000000)
    for (auto& q : ql) q = q / 2;
  const bool csr = in.pick(4) == 0;
  PagedProblem p = random_problem(sp, seq, ql, rng.next(), csr);
  // adversarial data: codes of any byte, queries over many magnitudes, scales far from 1
  const uint32_t any_code = in.of(kPctSkip()) / 10;  // 0, 1, 5, 10 %
  for (auto* cs : {&p.kd, &p.vd})
    for (auto& row : *cs)
      for (auto& c : row)
        if (rng.percent(any_code)) c = static_cast<uint8_t>(rng.next());
  if (any_code) {  // the pages again, from the changed codes
    std::mt19937_64 r2(rng.next());
    place_pages(p, r2);
  }
  if (in.coin()) {
    const Fill fq = read_fill(in);
    const auto bits = fill_bits(sp.q_format, p.T * sp.num_q_heads, sp.cache.head_dim, fq, rng);
    p.q = to_bytes(sp.q_format, bits);
  }
  if (in.coin())
    for (auto* sc : {&p.ks, &p.vs})
      for (float& x : *sc) x = static_cast<float>(std::ldexp(x, static_cast<int>(rng.below(60)) - 30));
  std::vector<uint8_t> out_ref = p.out, out_cpu = p.out;
  attn::AttnArgs a = p.args();
  a.out = out_ref.data();
  std::vector<double> exact(static_cast<size_t>(p.T * p.spec.num_q_heads * p.spec.dv()));
  const bool fast = p.spec.convention == AttnConvention::fast;
  attn::AttnSpec rs = p.spec;
  if (fast) rs.convention = AttnConvention::exact;
  const std::string o_ref = outcome([&] { attn::ref::paged_attention(rs, a, fast ? exact.data() : nullptr); });
  std::string o_cpu;
  attn::AttnArgs ac = p.args();
  ac.out = out_cpu.data();
  on_target(target, [&] { o_cpu = outcome([&] { attn::cpu::paged_attention(p.spec, ac); }); });
  std::string what = std::string("paged_attention ") + to_string(p.spec.convention) + " q " + format_name(p.spec.q_format) +
                     " out " + format_name(p.spec.out_format) + " " + format_name(p.spec.cache.format) + " bs " +
                     std::to_string(p.spec.cache.block_size) + " Hkv " + std::to_string(p.spec.cache.num_kv_heads) + " Hq " +
                     std::to_string(p.spec.num_q_heads) + " D " + std::to_string(p.spec.cache.head_dim) + "/" +
                     std::to_string(p.spec.dv()) + " causal " + to_string(p.spec.causal) + " window " +
                     std::to_string(p.spec.window_left) + " cap " + std::to_string(p.spec.softcap) + " scales " +
                     to_string(p.spec.scale_kind) + " tile " + std::to_string(p.spec.tile) + " segments " +
                     std::to_string(p.spec.segments) + " kv_chunk " + std::to_string(p.spec.kv_chunk) + " fi " +
                     to_string(p.spec.fi_kernel) + " unquantized chunk " + std::to_string(p.spec.chunk_unquantized) +
                     " (" + std::to_string(B) + " sequences)";
  if (o_ref != o_cpu) return what + ": reference '" + o_ref + "', cpu '" + o_cpu + "'";
  if (!o_ref.empty()) return ++diff_counts().refused, "";
  ++diff_counts().compared[3];
  if (!fast) {
    const std::string d = first_diff("out", out_cpu, out_ref);
    return d.empty() ? d : what + ": " + d;
  }
  std::vector<double> bound(exact.size());
  attn::cpu::paged_attention_fast_bound(p.spec, p.args(), bound.data());
  const size_t es = p.out_elem();
  for (size_t i = 0; i < exact.size(); ++i) {
    const double got = out_value(p.spec.out_format, &out_cpu[i * es]);
    if (std::isinf(bound[i])) continue;
    const bool ok = std::isnan(exact[i]) ? std::isnan(got) : std::fabs(got - exact[i]) <= bound[i];
    if (!ok) {
      char t[200];
      std::snprintf(t, sizeof t, ": element %zu: fast %.9g, exact %.9g, bound %.3g", i, got, exact[i], bound[i]);
      return what + t;
    }
  }
  return "";
}

// scaled_mm: every scaling, output and bias mode; exact, f32-kblock (both promotions) and hopper-tc (promotion
// every 128 K or never, split-K) bit for bit against the reference; fast within its bound of the exact f64 result;
// scaled_bmm with shared or batched B and scales equal to scaled_mm per batch (cpu against the reference's
// scaled_mm). Codes of any byte (NaN included), scales over many binades.
inline std::string diff_gemm(Choices& in, DiffRng& rng, size_t target) {
  static const GemmModel kModels[] = {GemmModel::exact, GemmModel::f32_kblock, GemmModel::hopper_tc, GemmModel::fast};
  static const GemmScaling kScalings[] = {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise,
                                          GemmScaling::group, GemmScaling::mx};
  static const int64_t kM[] = {1, 3, 16, 33, 0, 7}, kN[] = {1, 8, 130, 16, 64, 0}, kK[] = {128, 256, 32, 64, 300, 16, 1, 0, 512};
  ScaledMmSpec sp;
  sp.fa = in.coin() ? Format::e5m2 : Format::e4m3fn;
  sp.fb = in.pick(3) == 0 ? Format::e5m2 : sp.fa;
  sp.scaling = in.of(kScalings);
  sp.out = in.of(kSources);
  sp.model = in.of(kModels);
  sp.bias = static_cast<BiasMode>(in.pick(3));
  static const int kKblock[] = {0, 0, 32, 64, 128};
  if (sp.model == GemmModel::f32_kblock) {
    sp.kblock = in.of(kKblock);
    sp.promote_arith = in.coin() ? PromoteArith::fma : PromoteArith::mul_mul_add;
  }
  if (sp.model == GemmModel::hopper_tc) {
    sp.promote_never = in.coin();
    sp.split_k = 1 + static_cast<int>(in.pick(5));
  }
  if (sp.scaling == GemmScaling::blockwise) sp.cublas_sb_stride = in.pick(4) == 0;
  const GemmShape g{in.of(kM), in.of(kN), in.of(kK)};
  try {
    check_scaled_mm(sp, g);
  } catch (const InputError&) {
    return "";
  }
  const uint32_t any_code = in.of(kPctSkip()) / 10;
  const auto codes = [&](int64_t n, Format f) {
    std::vector<uint8_t> c(static_cast<size_t>(n));
    ConversionSpec cs;
    cs.to = f;
    cs.overflow = Overflow::satfinite;
    for (auto& x : c)
      x = rng.percent(any_code) ? static_cast<uint8_t>(rng.next())
                                : ref::encode_f64(std::ldexp(static_cast<double>(rng.below(2001)) - 1000.0, -8), cs);
    return c;
  };
  const bool mx = sp.scaling == GemmScaling::mx;
  const auto scales = [&](size_t n) {
    std::vector<float> v(n);
    const int c = static_cast<int>(rng.below(40)) - 20;
    for (float& x : v)
      x = mx ? static_cast<float>(std::ldexp(1.0, c + static_cast<int>(rng.below(9)) - 4))
             : static_cast<float>(std::ldexp(1.0 + rng.below(1024) / 1024.0, c + static_cast<int>(rng.below(9)) - 4));
    return v;
  };
  const int64_t batch = in.coin() ? 1 + static_cast<int64_t>(in.pick(3)) : 1;
  cpu::BmmOperands bo;
  bo.batch = batch;
  bo.b_batched = in.coin();
  bo.sa_batched = in.coin();
  bo.sb_batched = in.coin();
  const std::vector<uint8_t> a = codes(batch * g.M * g.K, sp.fa);
  const std::vector<uint8_t> bt = codes((bo.b_batched ? batch : 1) * g.N * g.K, sp.fb);
  const size_t na = gemm_sa_count(sp, g), nb = gemm_sb_count(sp, g);
  const std::vector<float> sa = scales((bo.sa_batched ? batch : 1) * na), sb = scales((bo.sb_batched ? batch : 1) * nb);
  std::vector<float> bias(static_cast<size_t>(g.N));
  for (float& x : bias) x = static_cast<float>(std::ldexp(static_cast<double>(rng.below(2001)) - 1000.0, static_cast<int>(rng.below(20)) - 12));
  const float* bp = sp.bias == BiasMode::none ? nullptr : bias.data();
  const size_t os = static_cast<size_t>(format_info(sp.out).bits / 8), per = static_cast<size_t>(g.M * g.N) * os;
  std::string what = "scaled_mm " + sp.describe() + " M " + std::to_string(g.M) + " N " + std::to_string(g.N) + " K " +
                     std::to_string(g.K) + " batch " + std::to_string(batch);
  // batch 0 as scaled_mm, then scaled_bmm over all batches; the reference per batch
  std::vector<uint8_t> want(per * static_cast<size_t>(batch), 0xA5), got1(per, 0x5A), gotb(want.size(), 0x5A);
  std::vector<double> exact(static_cast<size_t>(g.M * g.N) * static_cast<size_t>(batch));
  const bool fast = sp.model == GemmModel::fast;
  ScaledMmSpec rs = sp;
  if (fast) rs.model = GemmModel::exact;
  std::string o_ref;
  for (int64_t b = 0; b < batch && o_ref.empty(); ++b) {
    const uint8_t* ab = a.data() + b * g.M * g.K;
    const uint8_t* bb = bt.data() + (bo.b_batched ? b : 0) * g.N * g.K;
    const float* sab = sa.data() + (bo.sa_batched ? b : 0) * static_cast<int64_t>(na);
    const float* sbb = sb.data() + (bo.sb_batched ? b : 0) * static_cast<int64_t>(nb);
    o_ref = outcome([&] {
      ref::scaled_mm(rs, g, ab, bb, sab, sbb, bp, want.data() + static_cast<size_t>(b) * per);
      if (fast) ref::scaled_mm_exact_f64(sp, g, ab, bb, sab, sbb, bp, exact.data() + b * g.M * g.N);
    });
  }
  std::string o_cpu, o_bmm;
  on_target(target, [&] {
    o_cpu = outcome([&] { cpu::scaled_mm(sp, g, a.data(), bt.data(), sa.data(), sb.data(), bp, got1.data()); });
    o_bmm = outcome([&] { cpu::scaled_bmm(sp, g, bo, a.data(), bt.data(), sa.data(), sb.data(), bp, gotb.data()); });
  });
  if (o_ref != o_cpu || o_ref != o_bmm)
    return what + ": reference '" + o_ref + "', cpu '" + o_cpu + "', cpu bmm '" + o_bmm + "'";
  if (!o_ref.empty()) return ++diff_counts().refused, "";
  ++diff_counts().compared[4];
  if (!fast) {
    std::string d = first_diff("scaled_mm out", got1, std::vector<uint8_t>(want.begin(), want.begin() + static_cast<long>(per)));
    if (d.empty()) d = first_diff("scaled_bmm out", gotb, want);
    return d.empty() ? d : what + ": " + d;
  }
  // fast: within the bound of the exact value, batch by batch (bmm) and batch 0 (mm)
  std::vector<double> bound(static_cast<size_t>(g.M * g.N));
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* ab = a.data() + b * g.M * g.K;
    const uint8_t* bb = bt.data() + (bo.b_batched ? b : 0) * g.N * g.K;
    const float* sab = sa.data() + (bo.sa_batched ? b : 0) * static_cast<int64_t>(na);
    const float* sbb = sb.data() + (bo.sb_batched ? b : 0) * static_cast<int64_t>(nb);
    cpu::scaled_mm_fast_bound(sp, g, ab, bb, sab, sbb, bp, bound.data());
    for (size_t i = 0; i < bound.size(); ++i) {
      const double e = exact[static_cast<size_t>(b * g.M * g.N) + i];
      for (int which = 0; which < (b == 0 ? 2 : 1); ++which) {
        const uint8_t* o = which ? &got1[i * os] : &gotb[(static_cast<size_t>(b) * bound.size() + i) * os];
        const double v = out_value(sp.out, o);
        if (std::isinf(bound[i])) continue;
        const bool ok = std::isnan(e) ? std::isnan(v) : std::fabs(v - e) <= bound[i];
        if (!ok) {
          char t[200];
          std::snprintf(t, sizeof t, ": %s batch %ld element %zu: fast %.9g, exact %.9g, bound %.3g",
                        which ? "scaled_mm" : "scaled_bmm", static_cast<long>(b), i, v, e, bound[i]);
          return what + t;
        }
      }
    }
  }
  return "";
}

// The golden path (`fp8ref golden`, then `fp8ref run --backend cpu`): a random descriptor of an op of the registry
// — each key its default or one of a few values (below); shapes small — made into a golden file by the reference,
// run by the cpu backend; every output.* tensor must equal the golden one bit for bit (fast conventions and
// models excepted: their golden output is exact's, checked by bound elsewhere). Covers what the direct calls above
// do not: the ops' glue (scale layouts, static scales, fills, table forms, descriptors).
inline std::string diff_golden(Choices& in) {
  static const std::vector<std::pair<const char*, std::vector<const char*>>> kValues = {
      {"from", {"f32", "bf16", "f16"}},
      {"to", {"e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"}},
      {"granularity", {"tensor", "row", "col", "group:128", "group:32", "block:128x128", "block:4x64", "mx:32"}},
      {"mode", {"dynamic", "static"}},
      {"scale-dtype", {"f32", "bf16", "f16", "ue8m0"}},
      {"scale-round", {"rne", "pow2-ceil", "pow2-ceil-clamp", "mx-floor"}},
      {"scale-store", {"native", "f32"}},
      {"guard", {"none", "amax-floor:1e-10", "min-scale:1e-6"}},
      {"scale-formula", {"amax/max", "amax*(1/max)", "exact"}},
      {"formula", {"x/s", "x*(1/s)", "exact"}},
      {"div", {"ieee", "triton-nv"}},
      {"scale-layout", {"row-major", "col-major", "tma-aligned", "packed-ue8m0"}},
      {"clamp", {"none", "nan-to-max", "nan-to-min"}},
      {"fp8-max", {"finfo", "448", "224"}},
      {"cast", {"torch-2.11", "cuda-satfinite", "exact"}},
      {"amax-nan", {"ignore", "propagate"}},
      {"tail", {"error", "partial"}},
      {"fill", {"normal:amax=448", "normal:amax=10+special:rate=0.02", "ties:format=e4m3fn", "near-max:format=e4m3fn",
                "subnormal:format=e4m3fn", "uniform:amax=1e-3", "ints:max=4"}},
      {"weight-fill", {"normal:amax=3", "uniform:amax=40", "ints:max=2"}},
      {"seed", {"1", "2", "3", "77"}},
      {"residual", {"no", "yes"}},
      {"group", {"128", "64", "32"}},
      {"eps", {"1e-6", "0", "1e-30"}},
      {"residual-sum", {"f32", "dtype"}},
      {"variance", {"exact", "f32-seq", "cub:auto", "cub:64"}},
      {"rsqrt", {"rn", "ieee", "cuda-rsqrtf"}},
      {"weight", {"f32", "dtype-twice", "dtype-once"}},
      {"a", {"e4m3fn", "e5m2"}},
      {"b", {"e4m3fn", "e5m2"}},
      {"scaling", {"tensor", "rowwise", "blockwise", "group", "mx"}},
      {"model", {"exact", "f32-kblock", "hopper-tc"}},
      {"promote", {"128", "never"}},
      {"split-k", {"1", "2", "3"}},
      {"promote-arith", {"mul-mul-add", "fma"}},
      {"sb-stride", {"dense", "cublas"}},
      {"bias", {"none", "f32", "out"}},
      {"out", {"bf16", "f16", "f32"}},
      {"b-batched", {"true", "false"}},
      {"batch-scales", {"ab", "a", "b", "none"}},
      {"cache", {"e4m3fn", "e5m2"}},
      {"layout", {"nhd", "hnd"}},
      {"block-size", {"16", "1", "5"}},
      {"kv-heads", {"2", "1"}},
      {"q-heads", {"8", "2", "4"}},
      {"head-dim", {"64", "32", "128"}},
      {"seq-lens", {"37,1,0,100", "5,17", "1", "64,3"}},
      {"q-lens", {"1,1,0,5", "1,1", "1", "3,3"}},
      {"table", {"dense", "csr"}},
      {"causal", {"bottom-right", "top-left", "none"}},
      {"window-left", {"-1", "4"}},
      {"scale-kind", {"tensor", "head", "seq"}},
      {"torch-lanes", {"16", "8"}},
      {"tile", {"0", "16", "32"}},
      {"segments", {"-1", "0", "4"}},
      {"kv-chunk", {"-1", "0", "16"}},
      {"fi-kernel", {"auto", "decode", "prefill"}},
      {"tokens", {"20", "7", "1"}},
      {"seqs", {"2", "1", "3"}},
      {"num-blocks", {"8", "4"}},
      {"chunk", {"quantized", "unquantized"}},
      {"rounding", {"rne", "rz", "ru", "rd", "rna"}},
      {"overflow", {"satfinite", "saturate", "nonsat"}},
      {"nan", {"canonical", "keep-sign", "payload"}},
  };
  static const std::vector<std::pair<const char*, std::vector<const char*>>> kShapes = {
      {"convert", {"9x70", "3x128", "1x1000"}},     {"quantize", {"9x256", "3x128", "130x256", "2x3x64"}},
      {"dequantize", {"9x256", "4x128", "130x256"}}, {"rmsnorm_quant", {"5x256", "3x128", "1x512"}},
      {"scaled_mm", {"7x16x128", "3x130x256", "16x8x64"}}, {"scaled_bmm", {"2x7x16x128", "3x3x8x256"}},
  };
  const auto& ops = golden::ops();
  const golden::OpInfo& op = ops[in.pick(ops.size())];
  std::string line = op.name;
  for (const golden::Param& prm : op.params) {
    const std::string key = prm.key;
    if (!in.coin()) continue;  // the default
    const std::vector<const char*>* vals = nullptr;
    if (key == "shape") {
      for (const auto& [o, v] : kShapes)
        if (std::string(o) == op.name) vals = &v;
    } else if (key == "convention") {
      static std::vector<const char*> q, r, c, kv = {"vllm-cuda", "sglang", "spyre", "exact"},
                                             at = {"exact", "vllm-paged-v1", "vllm-triton-unified", "flashinfer",
                                                   "torch-sdpa-math", "spyre"};
      if (q.empty()) {
        for (const auto& x : quant_conventions()) q.push_back(x.name);
        for (const auto& x : rmsnorm_quant_conventions()) r.push_back(x.name);
        c = {"torch-2.11", "cuda-satfinite", "ml_dtypes", "ocp-sat", "exact"};
      }
      const std::string o = op.name;
      vals = o == "quantize" ? &q : o == "rmsnorm_quant" ? &r : o == "convert" ? &c : o == "kv_cache_write" ? &kv : &at;
    } else {
      for (const auto& [k, v] : kValues)
        if (key == k) vals = &v;
    }
    if (!vals || vals->empty()) continue;
    line += " " + key + "=" + (*vals)[in.pick(vals->size())];
  }
  golden::Descriptor d;
  io::SafetensorsFile g;
  try {
    d = golden::parse_descriptor(line);
    g = golden::make_golden(d);
  } catch (const InputError& e) {
    if (std::getenv("FP8REF_DIFF_SAY_REFUSALS")) std::fprintf(stderr, "refused: golden %s\n", e.what());
    return ++diff_counts().refused, "";
  }
  for (const char* k : {"convention", "model"})
    if (d.has(k) && d.get(k) == "fast") return "";
  io::SafetensorsFile r;
  std::string o_cpu = outcome([&] { r = golden::run_case(g, "cpu", "golden diff"); });
  if (!o_cpu.empty()) return line + ": the reference wrote the golden file, the cpu backend refused it";
  ++diff_counts().compared[5];
  const golden::Tensors want = golden::tensors_with_prefix(g, "output."), got = golden::tensors_with_prefix(r, "output.");
  if (want.size() != got.size()) return line + ": " + std::to_string(got.size()) + " outputs, golden " + std::to_string(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].name != got[i].name || want[i].shape != got[i].shape) return line + ": output " + want[i].name + " differs in name or shape";
    const std::string df = first_diff(want[i].name.c_str(), got[i].data, want[i].data);
    if (!df.empty()) return line + ": " + df;
  }
  return "";
}

}  // namespace diff_detail

// One input: "" when both backends agree (or the input names no valid case), else what differs.
inline std::string diff_backends(const uint8_t* data, size_t size) {
  Choices in(data, size);
  const uint32_t op = in.byte();
  const size_t target = in.byte();
  DiffRng rng(static_cast<uint64_t>(in.u32()) << 32 | in.u32());
  switch (op % 6) {
    case 5: return diff_detail::diff_golden(in);
    case 4: return diff_detail::diff_gemm(in, rng, target);
    case 3: return diff_detail::diff_attention(in, rng, target);
    case 2: return diff_detail::diff_kv_write(in, rng, target);
    case 1: return diff_detail::diff_rmsnorm(in, rng, target);
    default: return diff_detail::diff_quantize(in, rng, target);
  }
}

}  // namespace fp8ref::test
