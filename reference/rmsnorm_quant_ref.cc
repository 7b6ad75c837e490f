// fp8ref — the `rmsnorm_quant` oracle: scalar, one row at a time, the steps of include/fp8ref/rmsnorm.h in order.
// Not designed to be fast. Built with -ffp-contract=off: every f32 operation below is one IEEE binary32 operation
// (std::fma where the contract says fma); roundings to bf16/f16 go through ref::narrow (integer code).
//
// The rounding steps, per named convention (presets with their sources: src/core/rmsnorm_conventions.cc):
//
// exact (the contract: every quantity rounded once)
//   1. z = RN32(x + r) (or f32(x));  residual_out = RN_dt(z)
//   2. v = RN32(Σ z² / K), Σ exact (superaccumulator below)
//   3. u = RN32(v + eps);  r = RN32(1/sqrt(u)) correctly rounded (checked with exact integer arithmetic)
//   4. y = RN32(RN32(z · r) · w)
//   5. quant convention `exact` on y: s = amax/max rounded once, q = y/s rounded once (reference/quant_ref.cc)
// aiter-rmsnorm-quant (research §7.1)
//   1. z = RN32(x + r); residual_out = RN_dt(z)
//   2.–3. as exact (stand-ins: the device's Triton-on-ROCm tree sum and rsq are not modelled)
//   4. y = RN32(RN32(z · r) · w)  (no rounding before quant)
//   5. amax = fmaxf(max|y|, 1e-10); s = RN32(amax / max); v = RN32(y · RN32(1/s)) (ROCm fdiv: IEEE); clamp ±max
//      (NaN -> -max);
//      q = RNE(v); max = finfo (448 e4m3fn, 240 e4m3fnuz)
// vllm-rmsnorm-quant (research §7.2)
//   1. z = RN32(x + r); residual_out = RN_dt(z)
//   2. v = RN32(cub_sum / K), cub_sum = vLLM's order: per-thread fma chains over vec4s, warp shuffle tree,
//      sequential over warps (rmsnorm.h, variance=cub)
//   3. u = RN32(v + eps); r = rsqrtf(u) (MUFU.RSQ, the captured table: reference/cuda_rsqrtf_ref.cc)
//   4. y = RN_dt(RN32(RN_dt(RN32(z · r)) · w))
//   5. s = fmaxf(RN32(amax / qmax), RN32(1 / RN32(qmax · 512))); v = RN32(y / s); fmaxf(-qmax, fminf(v, qmax))
//      (NaN -> +qmax); q = RNE satfinite(v)
// deepseek-rmsnorm (research §7.3, §3.6)
//   1. z = RN_dt(RN32(x + r)); residual_out = z
//   2.–3. v as exact (stand-in for the torch mean); r = rsqrtf(u) (torch.rsqrt on CUDA, captured)
//   4. y = RN_dt(RN32(RN32(z · r) · w))
//   5. amax = fmaxf(max|y|, 1e-4); s = amax ÷ 448; v = y ÷ s; q = RNE satfinite(v) (no clamp); ÷ = Triton's
//      div.full.f32 (quant.h div=triton-nv)
//
// NaN model: every f32 arithmetic result that is NaN is the canonical +NaN 0x7FFFFFFF (NVIDIA GPUs).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/rmsnorm.h"

namespace fp8ref::ref {

namespace {

constexpr uint32_t kCanonicalNan = 0x7FFFFFFFu;

float f32_from_bits(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }
float gpu(float r) { return std::isnan(r) ? f32_from_bits(kCanonicalNan) : r; }

float load(Format from, const void* p, size_t i) { return load_f32(from, p, static_cast<int64_t>(i)); }

void store(Format from, void* p, size_t i, float v) {
  uint8_t* b = static_cast<uint8_t*>(p);
  if (from == Format::f32) {
    std::memcpy(b + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = static_cast<uint16_t>(narrow(Format::f32, bits_of(v), from));
  std::memcpy(b + 2 * i, &h, 2);
}

// RN_dt: RNE of an f32 to the input dtype, as an f32 value (identity for f32).
float round_dt(Format from, float v) {
  if (from == Format::f32) return v;
  return f32_from_bits(static_cast<uint32_t>(narrow(from, narrow(Format::f32, bits_of(v), from), Format::f32)));
}

// ---- exact mean of squares --------------------------------------------------------------------------------------
// Σ z² as an unsigned fixed-point integer with LSB 2^-298: z = mz · 2^ez (mz < 2^24, ez >= -149) so z² = mz² · 2^(2ez)
// with mz² < 2^48 and 2ez + 298 >= 0. The largest term is below 2^256 (2^554 in LSB units) and K < 2^31 terms add at
// most 31 bits: 585 bits fit in 10 limbs of 64.
struct SuperAccumulator {
  static constexpr int kLimbs = 10;
  uint64_t limb[kLimbs] = {};

  void add_at(int idx, uint64_t v) {
    for (int i = idx; i < kLimbs && v; ++i) {
      const uint64_t before = limb[i];
      limb[i] += v;
      v = limb[i] < before ? 1 : 0;
    }
  }
  void add_square(float z) {
    const uint32_t b = bits_of(z) & 0x7FFFFFFFu;
    const uint32_t e = b >> 23, f = b & 0x7FFFFFu;
    const uint64_t mz = e == 0 ? f : (f | 0x800000u);
    const int ez = e == 0 ? -149 : static_cast<int>(e) - 150;
    const uint64_t sq = mz * mz;
    const int shift = 2 * ez + 298;
    const int idx = shift / 64, off = shift % 64;
    add_at(idx, sq << off);
    if (off != 0) add_at(idx + 1, sq >> (64 - off));
  }
  // The bit at position p (0 = LSB).
  bool bit(int p) const { return (limb[p / 64] >> (p % 64)) & 1u; }
  int top_bit() const {
    for (int i = kLimbs - 1; i >= 0; --i)
      if (limb[i]) return i * 64 + 63 - __builtin_clzll(limb[i]);
    return -1;
  }
  // 64 bits starting at position lo (lo may be negative: zeros shifted in below).
  uint64_t bits64(int lo) const {
    uint64_t out = 0;
    for (int k = 0; k < 64; ++k) {
      const int p = lo + k;
      if (p >= 0 && p < kLimbs * 64 && bit(p)) out |= uint64_t{1} << k;
    }
    return out;
  }
  bool any_below(int p) const {
    for (int q = 0; q < p && q < kLimbs * 64; ++q)
      if (bit(q)) return true;
    return false;
  }
};

// RN32(S · 2^-298 / n) for the accumulated S, n >= 1.
float divide_round(const SuperAccumulator& acc, uint64_t n) {
  const int p = acc.top_bit();
  if (p < 0) return 0.0f;
  // hi: the 64 bits ending at bit p (top bit set), t its weight; S = hi · 2^t + L with 0 <= L < 2^t.
  const int t = p - 63;
  const uint64_t hi = acc.bits64(t);
  const bool low_sticky = t > 0 && acc.any_below(t);
  // S / n = (hi div n) · 2^t + frac, 0 <= frac < 2^t; hi >= 2^63 and n < 2^32 so q has >= 32 significant bits, and
  // a sticky bit jammed into bit 0 sits >= 7 bits below f32's rounding bit.
  uint64_t q = hi / n;
  const bool sticky = (hi % n) != 0 || low_sticky;
  if (sticky) q |= 1;
  // Down to 53 bits for an exact f64, jamming what is shifted out.
  int shift = 0;
  while ((q >> 53) != 0) {
    q = (q >> 1) | (q & 1);
    ++shift;
  }
  const double d = std::ldexp(static_cast<double>(q), t + shift - 298);  // exact
  uint64_t db;
  std::memcpy(&db, &d, 8);
  return f32_from_bits(static_cast<uint32_t>(narrow(Format::f64, db, Format::f32)));
}

// ---- correctly rounded rsqrt --------------------------------------------------------------------------------------
// An odd integer and exponent: v = m · 2^e (v > 0 finite double with <= 53 significant bits).
void odd_decompose(double v, uint64_t* m, int* e) {
  int ex;
  const double fr = std::frexp(v, &ex);  // v = fr · 2^ex, fr in [0.5, 1)
  uint64_t mm = static_cast<uint64_t>(std::ldexp(fr, 53));
  int ee = ex - 53;
  while ((mm & 1) == 0) {
    mm >>= 1;
    ++ee;
  }
  *m = mm;
  *e = ee;
}

// sign(mid² · u − 1) for a midpoint mid between two adjacent f32 (<= 25 significant bits) and an f32 u > 0.
int compare_square_times(double mid, float u) {
  uint64_t M, U;
  int a, b;
  odd_decompose(mid, &M, &a);
  odd_decompose(static_cast<double>(u), &U, &b);
  const unsigned __int128 P = static_cast<unsigned __int128>(M) * M * U;  // <= 2^50 · 2^24
  const int e = 2 * a + b;                                                   // mid² · u = P · 2^e
  // P · 2^e vs 1. P is odd, so P · 2^e == 1 only for P == 1, e == 0.
  if (e >= 0) return (P == 1 && e == 0) ? 0 : 1;
  if (-e >= 127) return -1;  // P < 2^75 <= 2^-e
  const unsigned __int128 one = static_cast<unsigned __int128>(1) << (-e);
  return P < one ? -1 : (P == one ? 0 : 1);
}

}  // namespace

float rsqrt_rn(float u) {
  if (std::isnan(u) || u < 0) return f32_from_bits(kCanonicalNan);
  if (u == 0) return std::numeric_limits<float>::infinity();
  if (std::isinf(u)) return 0.0f;
  // 1/sqrt(u) lies in (2^-64, 2^75): f32 normal. The f64 estimate is within 2 f64 ulps, so the answer is the
  // estimate rounded to f32 or one of its neighbours; the one whose rounding interval holds 1/sqrt(u) is picked by
  // exact comparisons (1/sqrt(u) is never a midpoint: it would make u = 1/mid², not dyadic for mid with > 1 bit).
  const float r0 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(u)));
  const float cand[3] = {r0, std::nextafter(r0, 0.0f), std::nextafter(r0, HUGE_VALF)};
  for (float c : cand) {
    const double lo = (static_cast<double>(std::nextafter(c, 0.0f)) + c) / 2;     // exact
    const double hi = (static_cast<double>(std::nextafter(c, HUGE_VALF)) + c) / 2;  // exact
    // 1/sqrt(u) in (lo, hi)  <=>  lo² · u < 1 < hi² · u
    if (compare_square_times(lo, u) < 0 && compare_square_times(hi, u) > 0) return c;
  }
  throw InputError("internal: rsqrt_rn found no candidate");
}

float mean_square_exact(const float* z, int64_t n) {
  if (n <= 0) return f32_from_bits(kCanonicalNan);
  bool inf = false;
  SuperAccumulator acc;
  for (int64_t k = 0; k < n; ++k) {
    if (std::isnan(z[k])) return f32_from_bits(kCanonicalNan);
    if (std::isinf(z[k])) {
      inf = true;
      continue;
    }
    acc.add_square(z[k]);
  }
  if (inf) return std::numeric_limits<float>::infinity();
  return divide_round(acc, static_cast<uint64_t>(n));
}

namespace {

// Step 2, variance=f32-seq.
float mean_square_seq(const float* z, int64_t n) {
  float a = 0.0f;
  for (int64_t k = 0; k < n; ++k) a = gpu(std::fma(z[k], z[k], a));
  return gpu(a / static_cast<float>(n));
}

// Step 2, variance=cub:T (vLLM vectorized::compute_rms + cub::BlockReduce, see rmsnorm.h).
float mean_square_cub(const float* z, int64_t n, int threads) {
  const int64_t nvec = n / 4;
  std::vector<float> part(static_cast<size_t>(threads), 0.0f);
  for (int t = 0; t < threads; ++t) {
    float a = 0.0f;
    for (int64_t i = t; i < nvec; i += threads)
      for (int j = 0; j < 4; ++j) a = gpu(std::fma(z[4 * i + j], z[4 * i + j], a));
    part[static_cast<size_t>(t)] = a;
  }
  float block = 0.0f;
  for (int w = 0; w * 32 < threads; ++w) {
    const int valid = threads - w * 32 < 32 ? threads - w * 32 : 32;
    float lane[32];
    for (int l = 0; l < valid; ++l) lane[l] = part[static_cast<size_t>(w * 32 + l)];
    for (int o = 1; o < 32; o *= 2)
      for (int l = 0; l + o < valid; ++l)  // ascending l: lane l reads lane l+o before l+o is updated this step
        lane[l] = gpu(lane[l] + lane[l + o]);
    block = w == 0 ? lane[0] : gpu(block + lane[0]);
  }
  return gpu(block / static_cast<float>(n));
}

}  // namespace

void rmsnorm_quant(const RmsNormQuantSpec& spec, const RmsNormQuantArgs& a) {
  require_finalized(spec.quant, "rmsnorm_quant");
  const RmsNormLayout L = rmsnorm_layout(spec, a.from, a.shape, a.weight_shape,
                                         a.residual ? &a.shape : nullptr);
  const int64_t M = L.M, K = L.K;
  std::vector<float> y(static_cast<size_t>(M * K));
  std::vector<float> z(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    // 1. the residual sum
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(m * K + k);
      float v = load(a.from, a.x, i);
      if (a.residual) {
        v = gpu(v + load(a.from, a.residual, i));
        if (spec.residual_sum == ResidualSum::dtype) v = round_dt(a.from, v);
        if (a.residual_out) store(a.from, a.residual_out, i, v);
      }
      z[static_cast<size_t>(k)] = v;
    }
    if (K == 0) continue;
    // 2. mean of squares
    float v = 0;
    switch (spec.variance) {
      case Variance::exact: v = mean_square_exact(z.data(), K); break;
      case Variance::f32_seq: v = mean_square_seq(z.data(), K); break;
      case Variance::cub: v = mean_square_cub(z.data(), K, L.cub_threads); break;
    }
    // 3.–4. rsqrt(v + eps)
    const float u = gpu(v + spec.eps);
    const float r = spec.rsqrt == Rsqrt::rn ? rsqrt_rn(u) : spec.rsqrt == Rsqrt::cuda ? rsqrt_cuda(u)
                                                                                    : gpu(1.0f / gpu(std::sqrt(u)));
    if (a.rms) a.rms[m] = r;
    // 5.–6. normalize, weight
    for (int64_t k = 0; k < K; ++k) {
      const float w = load(a.from, a.weight, static_cast<size_t>(k));
      const float an = gpu(z[static_cast<size_t>(k)] * r);
      float out = 0;
      switch (spec.weight) {
        case NormWeight::f32: out = gpu(an * w); break;
        case NormWeight::dtype_twice: out = round_dt(a.from, gpu(round_dt(a.from, an) * w)); break;
        case NormWeight::dtype_once: out = round_dt(a.from, gpu(an * w)); break;
      }
      y[static_cast<size_t>(m * K + k)] = out;
    }
  }
  if (a.normed) std::memcpy(a.normed, y.data(), y.size() * 4);
  // 7. the group quant of the normed rows.
  quantize(spec.quant, Format::f32, y.data(), a.shape, a.q, a.scales, a.exact_q);
}

}  // namespace fp8ref::ref
