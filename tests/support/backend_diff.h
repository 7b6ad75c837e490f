// Differential testing of the cpu backend against the reference: one input (a byte string) picks an op, a named
// convention, overrides, formats, a shape, a SIMD target and the parameters of its data; both backends run it and
// every output must be equal bit for bit (and both must refuse the same inputs). The data come from a generator
// seeded by the input, over many magnitudes (the source format's whole exponent range, subnormals, ±0, Inf, NaN,
// mantissas with few bits so that quotients fall on FP8 ties, rows of zeros, tiny rows under the scale guards).
//
// Two drivers: the libFuzzer target tests/fuzz/fuzz_backends.cc (coverage-guided, the sanitizer build, label fuzz)
// and tests/test_backend_diff.cc (random byte strings from fixed seeds, the unit label; FP8REF_DIFF_INPUTS=N runs
// more). Ops: quantize (dynamic and static), dequantize, rmsnorm_quant, kv_cache_write, paged_attention (every
// bit-exact convention; fast against its derived bound of exact).
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

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/quant.h"
#include "fp8ref/rmsnorm.h"

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

// splitmix64: the data generator, seeded from the input.
struct DiffRng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
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

// Runs fn on the SIMD target with index t (modulo the count) of the cpu backend's dispatch.
inline void on_target(size_t t, const std::function<void()>& fn) {
  static const size_t n = cpu::for_each_simd_target([] {}).size();
  size_t i = 0;
  const size_t want = t % std::max<size_t>(n, 1);
  cpu::for_each_simd_target([&] {
    if (i++ == want) fn();
  });
}

// "" when fn returned, else "InputError" (any other exception escapes).
inline std::string outcome(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError&) {
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
  static const int64_t kRows[] = {1, 1, 2, 3, 4, 5, 0, 7, 9};
  static const int64_t kCols[] = {128, 256, 16, 32, 7, 1, 40, 129, 300, 127, 64, 0, 3, 161, 512, 1000};
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
  const auto finalized = [](QuantSpec t, bool dynamic) {
    try {
      finalize_quant_spec(&t, dynamic);
    } catch (const InputError&) {
      return false;
    }
    return true;
  };
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
    const uint32_t mode = in.pick(3);
    for (size_t i = 0; i < s.size(); ++i) {
      if (mode == 1 && rng.percent(30)) s[i] ^= static_cast<uint8_t>(1u << rng.below(8));
      if (mode == 2) s[i] = static_cast<uint8_t>(rng.next());
    }
    std::fill(qr.begin(), qr.end(), 0xA5);
    std::fill(qc.begin(), qc.end(), 0xA5);
    o_ref = outcome([&] { ref::quantize_static(stat, from, x.data(), shape, s.data(), qr.data()); });
    on_target(target,
              [&] { o_cpu = outcome([&] { cpu::quantize_static(stat, from, x.data(), shape, s.data(), qc.data()); }); });
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
  const auto finalized = [](RmsNormQuantSpec t) {
    try {
      finalize_rmsnorm_quant_spec(&t);
    } catch (const InputError&) {
      return false;
    }
    return true;
  };
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

}  // namespace diff_detail

// One input: "" when both backends agree (or the input names no valid case), else what differs.
inline std::string diff_backends(const uint8_t* data, size_t size) {
  Choices in(data, size);
  const uint32_t op = in.byte();
  const size_t target = in.byte();
  DiffRng rng{static_cast<uint64_t>(in.u32()) << 32 | in.u32()};
  switch (op % 2) {
    case 1: return diff_detail::diff_rmsnorm(in, rng, target);
    default: return diff_detail::diff_quantize(in, rng, target);
  }
}

}  // namespace fp8ref::test
