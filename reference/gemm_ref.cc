// fp8ref — the scaled_mm oracle (include/fp8ref/gemm.h): scalar, one output element at a time. Built with
// -ffp-contract=off: every f32 operation below is one IEEE binary32 operation with round-to-nearest-even, and
// std::fma is the only fused operation. Exact sums are integers; every rounding of an exact value goes through
// round_exact() (integer code, RNE, subnormals, overflow to Inf).
//
// The rounding steps, per model (research notes cited):
//
// exact (NUMERICS.md §5; issue 5)
//   1. per scale group g along K: P_g = Σ a·b exactly (an integer times 2^(qmin_a + qmin_b))
//   2. S = Σ_g P_g · sa_g · sb_g (+ bias, bias=f32) exactly (a 896-bit fixed-point accumulator)
//   3. out = RN_out(S), once                                            [bias=out: RN_out(RN32(out + RN_out(bias)))]
// f32-kblock:KB (quant-conventions.md §5.2–5.4)
//   1. per K block j of KB (blocks in increasing k, from acc = +0): P_j = RN32(Σ a·b over the block)
//   2. mul-mul-add: acc = RN32(RN32(RN32(P_j · sa) · sb) + acc)       (Triton / DeepSeek-V3 `acc += dot*a_s*b_s`)
//      fma:         acc = fma(RN32(sa · sb), P_j, acc)                  (DeepGEMM sm90)
//   3. bias=f32: acc = RN32(acc + bias); out = RN_out(acc)
// hopper-tc (h200-cublas-fp8-model.md "The model, step by step"; NUMERICS.md §5)
//   1. per wgmma step of 32 k (c0 = 0, 32, ... from the start of each 128-K tile; a short last step at the end of K):
//      e = max(max over non-zero products of E(a)+E(b), floor(log2|T|) if T != 0); E = floor(log2|x|), emin for
//      subnormals (e4m3 −6, e5m2 −14); every product and T truncated toward zero to a multiple of 2^(e−13); S = the
//      exact sum; T = S truncated toward zero to 14 significant bits
//   2. promote=128: after each 128-K tile, A = RN32(A + T), T = +0; the part's result is A (from +0).
//      promote=never: T chains over the whole part; the part's result is T (exact in f32: 14 bits).
//   3. split-K s: tiles = ceil(K/128), c = ceil(tiles/s); part i takes tiles [i·c, (i+1)·c); acc = part 0, then
//      acc = RN32(acc + part i) in order
//   4. epilogue: tensor RN32(acc · RN32(sa·sb)); rowwise RN32(RN32(acc · sb[n]) · sa[m]); blockwise / group: per part,
//      per tile kb, P_kb = the T of the tile's steps from +0 and acc_p = fma(RN32(sa[m,kb]·sb[.,kb]), P_kb, acc_p)
//      (from +0), the parts then summed as in 3
//   5. bias=f32: RN32(acc + bias); out = RN_out(acc) (bf16: RNE of the f32 result — two roundings)
//
// Non-finite inputs (not measured on hardware; our definition): a NaN code, Inf·0, or +Inf + −Inf among the
// products of a block/step makes that block's value NaN; otherwise an Inf product makes it ±Inf; the model's f32
// arithmetic then carries the special value by IEEE rules (exact: the group's term is the IEEE product of the special
// and the scales; a finite P times an infinite scale is ±Inf, or NaN when P = 0). Every NaN output is the canonical
// +NaN (f32 0x7FFFFFFF, bf16/f16 0x7FFF), the GPU NaN model of quant.h. An exact zero result is +0.
#include <cmath>
#include <cstring>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/exact_sum.h"
#include "fp8ref/gemm.h"

namespace fp8ref::ref {

namespace {

using exact::bitlen;
using exact::canonical_nan;
using exact::i128;
using exact::inf_bits;
using exact::round_exact;
using exact::u128;
using exact::WideAcc;

// ---- decoded FP8 values: (-1)^neg · m · 2^q, nominal exponent E ----------------------------------------------
struct Val {
  uint8_t neg = 0, zero = 0, nan = 0, inf = 0;
  uint32_t m = 0;  // integer significand (implicit bit included)
  int q = 0;       // exponent of the significand's unit
  int E = 0;       // floor(log2|x|) for normals, emin for subnormals
};

int qmin_of(Format f) { return f == Format::e4m3fn ? -9 : -16; }

Val decode(Format f, uint8_t c) {
  Val v;
  v.neg = c >> 7;
  const uint8_t mag = c & 0x7F;
  if (f == Format::e4m3fn) {
    if (mag == 0x7F) {
      v.nan = 1;
      return v;
    }
    const int ef = mag >> 3, fr = mag & 7;
    if (ef == 0) {
      v.m = static_cast<uint32_t>(fr), v.q = -9, v.E = -6;
    } else {
      v.m = static_cast<uint32_t>(8 + fr), v.q = ef - 10, v.E = ef - 7;
    }
  } else {  // e5m2
    const int ef = mag >> 2, fr = mag & 3;
    if (ef == 31) {
      (fr == 0 ? v.inf : v.nan) = 1;
      return v;
    }
    if (ef == 0) {
      v.m = static_cast<uint32_t>(fr), v.q = -16, v.E = -14;
    } else {
      v.m = static_cast<uint32_t>(4 + fr), v.q = ef - 17, v.E = ef - 15;
    }
  }
  v.zero = v.m == 0;
  return v;
}

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

// The special state of a sum (IEEE): none, NaN, +Inf, -Inf.
struct Special {
  bool nan = false, pinf = false, ninf = false;
  bool any() const { return nan || pinf || ninf; }
  void add_product(const Val& a, const Val& b) {
    if (a.nan || b.nan) nan = true;
    else if (a.inf || b.inf) {
      if ((a.inf && b.zero) || (b.inf && a.zero)) nan = true;
      else ((a.neg ^ b.neg) ? ninf : pinf) = true;
    }
  }
  float value() const {
    if (nan || (pinf && ninf)) return f32_of(0x7FC00000u);
    return pinf ? INFINITY : -INFINITY;
  }
};

// An exact block partial: integer in units of 2^unit, plus the special state.
struct Partial {
  i128 P = 0;
  Special sp;
};

Partial exact_partial(const Val* a, const Val* b, int64_t k0, int64_t k1, int qa0, int qb0) {
  Partial r;
  for (int64_t k = k0; k < k1; ++k) {
    const Val &x = a[k], &y = b[k];
    if (x.nan | x.inf | y.nan | y.inf) {
      r.sp.add_product(x, y);
      continue;
    }
    if (x.zero | y.zero) continue;
    const i128 mag = static_cast<i128>(static_cast<uint64_t>(x.m) * y.m) << ((x.q - qa0) + (y.q - qb0));
    r.P += (x.neg ^ y.neg) ? -mag : mag;
  }
  return r;
}

float partial_to_f32(const Partial& p, int unit) {
  if (p.sp.any()) return p.sp.value();
  const bool neg = p.P < 0;
  const u128 mag = static_cast<u128>(neg ? -p.P : p.P);
  return f32_of(static_cast<uint32_t>(round_exact(neg, mag, unit, false, Format::f32)));
}

// ---- scales ----------------------------------------------------------------------------------------------------
// GemmScales (gemm.h) plus the shape: the scale group along K (whole K for tensor / rowwise).
struct Scales : GemmScales {
  const ScaledMmSpec& s;
  const GemmShape& g;
  Scales(const ScaledMmSpec& spec, const GemmShape& shape, const float* a, const float* b)
      : GemmScales(spec, shape, a, b), s(spec), g(shape) {}
  int group() const { return s.scaling == GemmScaling::mx ? 32 : 128; }
  bool whole_k() const { return s.scaling == GemmScaling::tensor || s.scaling == GemmScaling::rowwise; }
};

// ---- output -------------------------------------------------------------------------------------------------
uint64_t narrow_f32(float v, Format out) {
  if (std::isnan(v)) return canonical_nan(out);
  if (out == Format::f32) return bits_of(v);
  return narrow(Format::f32, bits_of(v), out);
}

float widen(uint64_t bits, Format out) {
  if (out == Format::f32) return f32_of(static_cast<uint32_t>(bits));
  return f32_of(static_cast<uint32_t>(narrow(out, bits, Format::f32)));  // widening: exact
}

// bias=out: RN_out(RN32(x + RN_out(bias))) on the rounded output bits.
uint64_t add_bias_out(uint64_t bits, float bias, Format out) {
  const float x = widen(bits, out);
  const float bb = widen(narrow_f32(bias, out), out);
  return narrow_f32(x + bb, out);
}

void store(void* out, int64_t i, Format f, uint64_t bits) {
  if (f == Format::f32) {
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(static_cast<uint8_t*>(out) + 4 * i, &b, 4);
  } else {
    const uint16_t b = static_cast<uint16_t>(bits);
    std::memcpy(static_cast<uint8_t*>(out) + 2 * i, &b, 2);
  }
}

// ---- the models, one element ---------------------------------------------------------------------------------

// exact: returns the bits of RN_fmt(S) where S includes bias if with_bias.
uint64_t element_exact(const Scales& sc, const Val* a, const Val* b, int64_t m, int64_t n, int qa0, int qb0,
                       const float* bias, bool with_bias, Format fmt) {
  const int64_t K = sc.g.K;
  const int64_t gs = sc.whole_k() ? std::max<int64_t>(K, 1) : sc.group();
  WideAcc acc;
  Special sp;
  for (int64_t k0 = 0; k0 < K; k0 += gs) {
    const int64_t k1 = std::min(K, k0 + gs);
    const Partial p = exact_partial(a, b, k0, k1, qa0, qb0);
    const float va = sc.a(m, k0), vb = sc.b(n, k0);
    if (p.sp.any() || std::isinf(va) || std::isinf(vb)) {
      // the IEEE product of the group's value and its scales
      const float pv = p.sp.any() ? p.sp.value() : (p.P == 0 ? 0.0f : (p.P < 0 ? -1.0f : 1.0f));
      const float t = (pv * va) * vb;  // only the special / sign / zero-ness matters here
      if (std::isnan(t)) sp.nan = true;
      else if (std::isinf(t)) (t < 0 ? sp.ninf : sp.pinf) = true;
      continue;
    }
    if (p.P == 0 || va == 0 || vb == 0) continue;
    const uint32_t ba = bits_of(va), bb = bits_of(vb);
    const uint32_t ea = (ba >> 23) & 0xFF, eb = (bb >> 23) & 0xFF;
    const uint64_t ma = ea ? ((ba & 0x7FFFFF) | 0x800000u) : (ba & 0x7FFFFF);
    const uint64_t mb = eb ? ((bb & 0x7FFFFF) | 0x800000u) : (bb & 0x7FFFFF);
    const int xa = ea ? static_cast<int>(ea) - 150 : -149, xb = eb ? static_cast<int>(eb) - 150 : -149;
    const bool neg = (p.P < 0) ^ (ba >> 31) ^ (bb >> 31);
    acc.add_product(neg, static_cast<u128>(p.P < 0 ? -p.P : p.P), ma * mb, qa0 + qb0 + xa + xb);
  }
  if (with_bias) {
    const float bv = bias[n];
    if (std::isnan(bv)) sp.nan = true;
    else if (std::isinf(bv)) (bv < 0 ? sp.ninf : sp.pinf) = true;
    else acc.add_f32(bv);
  }
  if (sp.nan || (sp.pinf && sp.ninf)) return canonical_nan(fmt);
  if (sp.pinf || sp.ninf) return inf_bits(fmt, sp.ninf);
  return acc.round(fmt);
}

float element_kblock(const ScaledMmSpec& s, const Scales& sc, const Val* a, const Val* b, int64_t m, int64_t n,
                     int qa0, int qb0) {
  const int64_t K = sc.g.K, kb = gemm_kblock(s);
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kb) {
    const Partial p = exact_partial(a, b, k0, std::min(K, k0 + kb), qa0, qb0);
    const float P = partial_to_f32(p, qa0 + qb0);
    const float va = sc.a(m, k0), vb = sc.b(n, k0);
    if (s.promote_arith == PromoteArith::mul_mul_add) {
      float t = P * va;
      t = t * vb;
      acc = t + acc;
    } else {
      const float sab = va * vb;
      acc = std::fma(sab, P, acc);
    }
  }
  return acc;
}

// The tensor-core accumulator T = tm · 2^texp (|tm| < 2^14), or a special value.
struct TcAcc {
  int64_t tm = 0;
  int texp = 0;
  Special sp;
  float value() const {
    if (sp.any()) return sp.value();
    return std::ldexp(static_cast<float>(tm), texp);  // exact: 14 bits
  }
};

int64_t shift_trunc(int64_t mag, int sh) {  // mag · 2^sh truncated toward zero (mag >= 0)
  if (sh >= 0) return mag << sh;
  return -sh >= 63 ? 0 : mag >> -sh;
}

// One wgmma step over k in [k0, k1).
void tc_step(TcAcc& T, const Val* a, const Val* b, int64_t k0, int64_t k1) {
  bool have = false;
  int e = 0;
  for (int64_t k = k0; k < k1; ++k) {
    const Val &x = a[k], &y = b[k];
    if (x.nan | x.inf | y.nan | y.inf) {
      T.sp.add_product(x, y);
      continue;
    }
    if (x.zero | y.zero) continue;
    const int pe = x.E + y.E;
    e = have ? std::max(e, pe) : pe;
    have = true;
  }
  if (T.sp.any()) return;  // Inf / NaN stays (Inf + finite = Inf)
  if (T.tm != 0) {
    const int te = T.texp + bitlen(static_cast<u128>(T.tm < 0 ? -T.tm : T.tm)) - 1;
    e = have ? std::max(e, te) : te;
    have = true;
  }
  if (!have) return;
  const int grid = e - 13;
  int64_t S = 0;
  for (int64_t k = k0; k < k1; ++k) {
    const Val &x = a[k], &y = b[k];
    if (x.zero | y.zero) continue;
    const int64_t mag = shift_trunc(static_cast<int64_t>(x.m) * y.m, x.q + y.q - grid);
    S += (x.neg ^ y.neg) ? -mag : mag;
  }
  if (T.tm != 0) {
    const int64_t mag = shift_trunc(T.tm < 0 ? -T.tm : T.tm, T.texp - grid);
    S += T.tm < 0 ? -mag : mag;
  }
  const bool neg = S < 0;
  int64_t mag = neg ? -S : S;
  const int L = bitlen(static_cast<u128>(mag));
  int ex = grid;
  if (L > 14) mag >>= (L - 14), ex += L - 14;
  T.tm = neg ? -mag : mag;
  T.texp = ex;
}

float element_hopper(const ScaledMmSpec& s, const Scales& sc, const Val* a, const Val* b, int64_t m, int64_t n) {
  const int64_t K = sc.g.K;
  const int64_t tiles = (K + 127) / 128;
  const int64_t per = (tiles + s.split_k - 1) / s.split_k;
  const bool blocked = s.scaling == GemmScaling::blockwise || s.scaling == GemmScaling::group;
  float acc = 0.0f;
  for (int part = 0; part < s.split_k; ++part) {
    const int64_t t0 = part * per, t1 = std::min(tiles, (part + 1) * per);
    float A = 0.0f;
    TcAcc T;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t kt0 = t * 128, kt1 = std::min(K, kt0 + 128);
      if (blocked) T = TcAcc{};
      for (int64_t c0 = kt0; c0 < kt1; c0 += 32) tc_step(T, a, b, c0, std::min(kt1, c0 + 32));
      if (blocked) {
        const float sab = sc.a(m, kt0) * sc.b(n, kt0);
        A = std::fma(sab, T.value(), A);
      } else if (!s.promote_never) {
        A = A + T.value();
        T = TcAcc{};
      }
    }
    const float part_result = (!blocked && s.promote_never) ? T.value() : A;
    acc = part == 0 ? part_result : acc + part_result;
  }
  switch (s.scaling) {
    case GemmScaling::tensor: return acc * (sc.a(m, 0) * sc.b(n, 0));
    case GemmScaling::rowwise: {
      const float t = acc * sc.b(n, 0);
      return t * sc.a(m, 0);
    }
    default: return acc;
  }
}

std::vector<Val> decode_all(Format f, const uint8_t* codes, size_t n) {
  Val table[256];
  for (int c = 0; c < 256; ++c) table[c] = decode(f, static_cast<uint8_t>(c));
  std::vector<Val> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = table[codes[i]];
  return v;
}

}  // namespace

void scaled_mm(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
               const float* sb, const float* bias, void* out) {
  check_scaled_mm_operands(spec, g, a, bt, sa, sb, bias, out);
  if (spec.model == GemmModel::fast || spec.model == GemmModel::mma_sync_sm90)
    throw InputError(std::string("the reference has no ") + to_string(spec.model) +
                     " model (exact, f32-kblock, hopper-tc); use the cpu backend");
  const std::vector<Val> A = decode_all(spec.fa, a, static_cast<size_t>(g.M * g.K));
  const std::vector<Val> B = decode_all(spec.fb, bt, static_cast<size_t>(g.N * g.K));
  const Scales sc(spec, g, sa, sb);
  const int qa0 = qmin_of(spec.fa), qb0 = qmin_of(spec.fb);
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = 0; n < g.N; ++n) {
      const Val* ra = A.data() + m * g.K;
      const Val* rb = B.data() + n * g.K;
      uint64_t bits;
      if (spec.model == GemmModel::exact) {
        bits = element_exact(sc, ra, rb, m, n, qa0, qb0, bias, spec.bias == BiasMode::f32, spec.out);
      } else {
        float v = spec.model == GemmModel::f32_kblock ? element_kblock(spec, sc, ra, rb, m, n, qa0, qb0)
                                                      : element_hopper(spec, sc, ra, rb, m, n);
        if (spec.bias == BiasMode::f32) v = v + bias[n];
        bits = narrow_f32(v, spec.out);
      }
      if (spec.bias == BiasMode::out) bits = add_bias_out(bits, bias[n], spec.out);
      store(out, m * g.N + n, spec.out, bits);
    }
}

void scaled_mm_exact_f64(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                         const float* sa, const float* sb, const float* bias, double* out) {
  check_scaled_mm_operands(spec, g, a, bt, sa, sb, bias, out);
  const std::vector<Val> A = decode_all(spec.fa, a, static_cast<size_t>(g.M * g.K));
  const std::vector<Val> B = decode_all(spec.fb, bt, static_cast<size_t>(g.N * g.K));
  const Scales sc(spec, g, sa, sb);
  const int qa0 = qmin_of(spec.fa), qb0 = qmin_of(spec.fb);
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = 0; n < g.N; ++n) {
      const uint64_t bits = element_exact(sc, A.data() + m * g.K, B.data() + n * g.K, m, n, qa0, qb0, bias,
                                          spec.bias != BiasMode::none, Format::f64);
      std::memcpy(out + m * g.N + n, &bits, 8);
    }
}

}  // namespace fp8ref::ref
