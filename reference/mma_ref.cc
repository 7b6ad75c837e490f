// fp8ref — the FP8 MMA instruction oracle (include/fp8ref/mma.h). Scalar, integer, one output element at a time;
// not designed to be fast. Built with -ffp-contract=off; the only floating-point operation is step 6's IEEE
// binary32 add (round-to-nearest-even, the default and only rounding mode here); every other rounding is integer.
//
// mma-sync-sm90: mma.sync.m16n8k32 with e4m3/e5m2 operands on sm_90, D = A·B + C, per output element (i, j) with
// a_k = A[i][k], b_k = B[k][j] (research/h200-mma-fp8-model.md, "The model, step by step"; NUMERICS.md §5):
//   1. Decode every code exactly and widen to f16 (exact for both formats). Nominal exponent of a non-zero input:
//      e(x) = floor(log2|x|), clamped at -14 (f16 subnormals: only e5m2 subnormals; "Not determined" in the note —
//      the capture's e5m2 subnormal probe tiles, where such a product is its block's maximum, agree with -14).
//   2. Products p_k = a_k·b_k exactly, with nominal exponent n_k = e(a_k) + e(b_k) (not the product's leading bit).
//   3. Two k halves: P1 = {k : k & 2 == 0} = {0,1,4,5,…,28,29} (the low two bytes of each fragment register),
//      P2 = the rest. Each half is one HMMA.16816.F32 block:
//   4. blk(P, acc): e = max(max_{k∈P, p_k≠0} n_k, floor(log2|acc|) if acc ≠ 0); grid g = 2^(e−25);
//      every p_k and acc truncated toward zero on the magnitude to a multiple of g; S = the exact sum;
//      result = S rounded to f32 toward zero (24 significant bits). S = 0 gives +0.
//   5. H1 = blk(P1, +0); H2 = blk(P2, H1).
//   6. D = RN32(H2 + C): one IEEE f32 add (FADD), round to nearest even; f32 subnormals kept (no flush).
// Specials (measured: tests/data/h200/mma_sm90, "special"/"zerosign" tiles): a NaN input, Inf·0, or +Inf and −Inf
// among a block's products and accumulator make the block NaN; otherwise an Inf product makes it ±Inf; every
// NaN result of the instruction is the canonical 0x7FFFFFFF (C's NaN payload and sign are not kept).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/mma.h"

namespace fp8ref {

const char* to_string(MmaModel m) {
  switch (m) {
    case MmaModel::sm90_mma_sync: return "mma-sync-sm90";
  }
  return "?";
}

bool parse_mma_model(std::string_view name, MmaModel* out) {
  for (MmaModel m : all_mma_models())
    if (name == to_string(m)) {
      *out = m;
      return true;
    }
  return false;
}

std::vector<MmaModel> all_mma_models() { return {MmaModel::sm90_mma_sync}; }

bool mma_supports(MmaModel, Format fa, Format fb) {
  auto ok = [](Format f) { return f == Format::e4m3fn || f == Format::e5m2; };
  return ok(fa) && ok(fb);
}

namespace ref {
namespace {

constexpr uint32_t kCanonicalNan = 0x7FFFFFFFu;
constexpr int kFractionBits = 25;  // grid 2^(e-25) below the block's alignment exponent (research note, F = 25)
constexpr int kF16MinExp = -14;    // smallest f16 normal exponent: e5m2 subnormals' nominal exponent

float f32_from_bits(uint32_t b) { return fp8ref::f32_from_bits(b); }

// An exact product term: value = (neg ? -1 : 1) · sig · 2^q; nominal exponent n.
struct Term {
  enum Kind { zero, finite, inf, nan } kind = zero;
  bool neg = false;
  uint64_t sig = 0;
  int q = 0;
  int n = 0;
};

struct Input {
  Term::Kind kind;
  bool neg;
  uint64_t sig;  // value = sig · 2^q, sig < 16
  int q;
  int e;  // nominal (f16) exponent
};

Input decode(Format f, uint8_t code) {
  const double v = value_of(f, code);
  Input x{Term::finite, std::signbit(v), 0, 0, 0};
  if (std::isnan(v)) return {Term::nan, false, 0, 0, 0};
  if (std::isinf(v)) return {Term::inf, x.neg, 0, 0, 0};
  if (v == 0) return {Term::zero, x.neg, 0, 0, 0};
  int ex = 0;
  const double fr = std::frexp(std::fabs(v), &ex);  // |v| = fr · 2^ex, fr in [0.5, 1); at most 4 significant bits
  x.sig = static_cast<uint64_t>(std::ldexp(fr, 4));
  x.q = ex - 4;
  x.e = ex - 1 < kF16MinExp ? kF16MinExp : ex - 1;
  return x;
}

Term product(const Input& a, const Input& b) {
  Term t;
  t.neg = a.neg != b.neg;
  if (a.kind == Term::nan || b.kind == Term::nan) t.kind = Term::nan;
  else if (a.kind == Term::inf || b.kind == Term::inf)
    t.kind = (a.kind == Term::zero || b.kind == Term::zero) ? Term::nan : Term::inf;
  else if (a.kind == Term::zero || b.kind == Term::zero) t.kind = Term::zero;
  else {
    t.kind = Term::finite;
    t.sig = a.sig * b.sig;
    t.q = a.q + b.q;
    t.n = a.e + b.e;
  }
  return t;
}

// floor(sig · 2^shift) for sig < 2^32 and any shift (the magnitude truncated toward zero onto the grid).
int64_t truncate_to_grid(uint64_t sig, int shift) {
  if (shift >= 0) return static_cast<int64_t>(sig << shift);  // shift <= 27 here: sig · 2^shift < 2^(e-grid+2)
  if (shift <= -64) return 0;
  return static_cast<int64_t>(sig >> -shift);
}

// S·2^grid rounded toward zero to 24 significant bits (+0 for S = 0), through double (exact) to f32.
float sum_to_f32(int64_t s, int grid) {
  if (s == 0) return 0.0f;
  const bool neg = s < 0;
  uint64_t mag = static_cast<uint64_t>(neg ? -s : s);
  int exp = grid;
  while (mag >= (uint64_t{1} << 24)) {
    mag >>= 1;
    ++exp;
  }
  const double r = std::ldexp(static_cast<double>(mag), exp);
  return static_cast<float>(neg ? -r : r);
}

// Step 4: one HMMA block over the terms of `half` (P1: half = 0, P2: half = 1) with accumulator acc.
float hmma_block(const Term* p, int half, float acc) {
  bool nan = std::isnan(acc), pinf = acc == std::numeric_limits<float>::infinity(),
       ninf = acc == -std::numeric_limits<float>::infinity();
  int e = INT_MIN;
  for (int k = 0; k < 32; ++k) {
    if (((k >> 1) & 1) != half) continue;
    if (p[k].kind == Term::nan) nan = true;
    if (p[k].kind == Term::inf) (p[k].neg ? ninf : pinf) = true;
    if (p[k].kind == Term::finite && p[k].n > e) e = p[k].n;
  }
  if (nan || (pinf && ninf)) return f32_from_bits(kCanonicalNan);
  if (pinf || ninf) return pinf ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  // The accumulator: |acc| = acc_sig · 2^acc_q with a 24-bit significand; it joins the exponent maximum if non-zero.
  uint64_t acc_sig = 0;
  int acc_q = 0;
  if (acc != 0) {
    int ex = 0;
    const double fr = std::frexp(std::fabs(static_cast<double>(acc)), &ex);
    acc_sig = static_cast<uint64_t>(std::ldexp(fr, 24));
    acc_q = ex - 24;
    if (ex - 1 > e) e = ex - 1;
  }
  if (e == INT_MIN) return 0.0f;  // no non-zero term: +0
  const int grid = e - kFractionBits;
  int64_t s = 0;
  for (int k = 0; k < 32; ++k) {
    if (((k >> 1) & 1) != half || p[k].kind != Term::finite) continue;
    const int64_t m = truncate_to_grid(p[k].sig, p[k].q - grid);
    s += p[k].neg ? -m : m;
  }
  if (acc != 0) {
    const int64_t m = truncate_to_grid(acc_sig, acc_q - grid);
    s += std::signbit(acc) ? -m : m;
  }
  return sum_to_f32(s, grid);  // (a normal f32: |S · 2^grid| >= 2^-57)
}

}  // namespace

float hmma16_step(Format f, const float* a, const float* b, int n, float c) {
  // The usual case in integer and double steps (the same arithmetic as hmma16_step_literal below, which takes the
  // rest): every input finite and normal or zero, c too. Products of two 16-bit values are exact in double; a term's
  // truncation onto the grid clears its low bits; the sum of 17 multiples of 2^grid below 2^(e+7) is exact in double;
  // the result keeps its top 24 bits (a normal f32 result; else the literal steps).
  uint32_t ub[16];
  const uint32_t emin = f == Format::f16 ? 127 - 14 : 1;  // f16 subnormals (normal in f32): exponent −14 (literal)
  int e = INT_MIN;
  bool fast = n <= 16;
  for (int k = 0; k < n && fast; ++k) {
    const uint32_t x = bits_of_f32(a[k]), y = bits_of_f32(b[k]);
    ub[k] = x;
    const uint32_t ex = (x >> 23) & 0xFF, ey = (y >> 23) & 0xFF;
    if ((x & 0x7FFFFFFFu) == 0 || (y & 0x7FFFFFFFu) == 0) {
      if (ex == 0xFF || ey == 0xFF) fast = false;  // Inf·0 or NaN·0
      ub[k] = 0;
      continue;
    }
    if (ex == 0 || ey == 0 || ex == 0xFF || ey == 0xFF) fast = false;
    e = std::max(e, static_cast<int>(std::max(ex, emin) + std::max(ey, emin)) - 254);
  }
  const uint32_t cb = bits_of_f32(c), ec = (cb >> 23) & 0xFF;
  if ((cb & 0x7FFFFFFFu) != 0) {
    if (ec == 0 || ec == 0xFF) fast = false;
    e = std::max(e, static_cast<int>(ec) - 127);
  }
  if (fast) {
    if (e == INT_MIN) return 0.0f;
    const int grid = e - kFractionBits;
    auto trunc_to_grid = [grid](double p) {  // |p| toward zero onto multiples of 2^grid (p normal, nonzero)
      uint64_t pb;
      std::memcpy(&pb, &p, 8);
      const int drop = grid - (static_cast<int>((pb >> 52) & 0x7FF) - 1023 - 52);
      if (drop <= 0) return p;
      if (drop > 52) return 0.0;
      pb &= ~((uint64_t{1} << drop) - 1);
      std::memcpy(&p, &pb, 8);
      return p;
    };
    double s = 0;
    for (int k = 0; k < n; ++k)
      if (ub[k] != 0) s += trunc_to_grid(static_cast<double>(a[k]) * static_cast<double>(b[k]));
    if ((cb & 0x7FFFFFFFu) != 0) s += trunc_to_grid(static_cast<double>(c));
    if (s == 0) return 0.0f;
    uint64_t sb;
    std::memcpy(&sb, &s, 8);
    sb &= ~((uint64_t{1} << 29) - 1);  // 24 significant bits, toward zero
    std::memcpy(&s, &sb, 8);
    if (std::fabs(s) >= 0x1p-126 && std::fabs(s) <= 0x1.fffffep127) return static_cast<float>(s);
  }
  return hmma16_step_literal(f, a, b, n, c);
}

float hmma16_step_literal(Format f, const float* a, const float* b, int n, float c) {
  const int emin = f == Format::f16 ? -14 : -126;
  bool nan = std::isnan(c), pinf = c == std::numeric_limits<float>::infinity(),
       ninf = c == -std::numeric_limits<float>::infinity();
  int e = INT_MIN;
  for (int k = 0; k < n; ++k) {
    const float x = a[k], y = b[k];
    if (std::isnan(x) || std::isnan(y) || (std::isinf(x) && y == 0) || (std::isinf(y) && x == 0)) {
      nan = true;
    } else if (std::isinf(x) || std::isinf(y)) {
      (std::signbit(x) != std::signbit(y) ? ninf : pinf) = true;
    } else if (x != 0 && y != 0) {
      const int nx = std::max(std::ilogb(x), emin), ny = std::max(std::ilogb(y), emin);
      e = std::max(e, nx + ny);
    }
  }
  if (nan || (pinf && ninf)) return f32_from_bits(kCanonicalNan);
  if (pinf || ninf) return pinf ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  if (c != 0) e = std::max(e, std::ilogb(c));
  if (e == INT_MIN) return 0.0f;  // no non-zero term: +0
  const int grid = e - kFractionBits;
  // every term: |t|·2^-grid < 2^27 (a product of two 16-bit values is exact in double), truncated exactly
  double s = 0;
  for (int k = 0; k < n; ++k) {
    const double p = static_cast<double>(a[k]) * static_cast<double>(b[k]);
    const double m = std::trunc(std::ldexp(std::fabs(p), -grid));
    s += p < 0 ? -m : m;  // (integers below 2^32: exact)
  }
  if (c != 0) {
    const double m = std::trunc(std::ldexp(std::fabs(static_cast<double>(c)), -grid));
    s += c < 0 ? -m : m;
  }
  return sum_to_f32(static_cast<int64_t>(s), grid);
}

float hmma16_dot(Format f, const float* a, const float* b, int64_t n, float c) {
  for (int64_t k = 0; k < n; k += 16) c = hmma16_step(f, a + k, b + k, static_cast<int>(std::min<int64_t>(16, n - k)), c);
  return c;
}

int hmma16_kw4_step(int64_t n, int s, int64_t* base, int* kidx) {
  if (n <= 16) {
    if (s > 0) return -1;
    *base = 0;
    for (int k = 0; k < n; ++k) kidx[k] = k;
    return static_cast<int>(n);
  }
  *base = int64_t{32} * (s / 2);
  if (*base >= n) return -1;
  int m = 0;
  for (int k = 0; k < 32; ++k)
    if (((k >> 1) & 1) == s % 2 && *base + k < n) kidx[m++] = k;
  return m;
}

float hmma16_dot_kw4(Format f, const float* a, const float* b, int64_t n, float c) {
  int64_t base = 0;
  int kidx[16];
  float x[16], y[16];
  for (int s = 0;; ++s) {
    const int m = hmma16_kw4_step(n, s, &base, kidx);
    if (m < 0) return c;
    for (int i = 0; i < m; ++i) {
      x[i] = a[base + kidx[i]];
      y[i] = b[base + kidx[i]];
    }
    c = hmma16_step(f, x, y, m, c);
  }
}

float mma_sm90_element(Format fa, Format fb, const uint8_t* a, const uint8_t* b, float c) {
  Term p[32];
  for (int k = 0; k < 32; ++k) p[k] = product(decode(fa, a[k]), decode(fb, b[k]));  // steps 1-2
  const float h1 = hmma_block(p, 0, 0.0f);                                            // step 5
  const float h2 = hmma_block(p, 1, h1);
  const float d = h2 + c;                                                              // step 6: FADD, RNE
  return std::isnan(d) ? f32_from_bits(kCanonicalNan) : d;
}

void mma_m16n8k32(MmaModel model, Format fa, Format fb, const uint8_t* a, const uint8_t* bt, const float* c,
                  float* d, size_t tiles) {
  if (!mma_supports(model, fa, fb))
    throw InputError(std::string("model ") + to_string(model) + " takes e4m3fn or e5m2 operands, not " +
                     format_name(fa) + " x " + format_name(fb));
  for (size_t t = 0; t < tiles; ++t)
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j)
        d[t * 128 + i * 8 + j] =
            mma_sm90_element(fa, fb, a + t * 512 + i * 32, bt + t * 256 + j * 32, c[t * 128 + i * 8 + j]);
}

}  // namespace ref
}  // namespace fp8ref
