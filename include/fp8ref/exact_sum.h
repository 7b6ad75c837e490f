// fp8ref — exact sums and the rounding of exact values (integer code; used by the scaled_mm reference and the CPU
// exact model). Header-only.
//   round_exact(neg, mag, exp, sticky, out): RNE of ±(mag·2^exp + δ) to f32 / bf16 / f16 / f64 bits, with
//     subnormals and overflow to ±Inf; δ (0 < δ < 2^exp) is present iff sticky (then mag must have >= p + 2 bits).
//     An exact zero gives +0.
//   WideAcc: Σ ±mag·2^exp exactly, for terms with 2^-448 <= 2^exp and values below 2^440 (32-bit carry-save limbs),
//     then round(out) — the exact sum rounded once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "fp8ref/error.h"
#include "fp8ref/format.h"

namespace fp8ref::exact {

using u128 = unsigned __int128;
using i128 = __int128;

inline int bitlen(u128 x) {
  int n = 0;
  while (x >> 64) x >>= 64, n += 64;
  uint64_t y = static_cast<uint64_t>(x);
  return n + (y ? 64 - __builtin_clzll(y) : 0);
}

struct OutInfo {
  int p, emin, emax, bias, total;
};
inline OutInfo out_info(Format f) {
  switch (f) {
    case Format::f32: return {24, -126, 127, 127, 32};
    case Format::bf16: return {8, -126, 127, 127, 16};
    case Format::f16: return {11, -14, 15, 15, 16};
    case Format::f64: return {53, -1022, 1023, 1023, 64};
    default: throw InputError("internal: bad output format");
  }
}

inline uint64_t canonical_nan(Format f) {
  switch (f) {
    case Format::f32: return 0x7FFFFFFFu;
    case Format::f64: return 0x7FF8000000000000ull;
    default: return 0x7FFFu;
  }
}
inline uint64_t inf_bits(Format f, bool neg) {
  const OutInfo o = out_info(f);
  const int mb = o.p - 1;
  const uint64_t e = (uint64_t{1} << (o.total - 1 - mb)) - 1;
  return (uint64_t{neg} << (o.total - 1)) | (e << mb);
}

// RNE of (-1)^neg · (mag · 2^exp + δ), 0 <= δ < 2^exp, δ > 0 iff sticky (then mag has at least p + 2 bits).
inline uint64_t round_exact(bool neg, u128 mag, int exp, bool sticky, Format out) {
  const OutInfo o = out_info(out);
  const uint64_t sign = uint64_t{neg} << (o.total - 1);
  if (mag == 0) return 0;  // exact zero: +0
  const int L = bitlen(mag);
  const int P = exp + L - 1;
  const int qe = std::max(P - o.p + 1, o.emin - o.p + 1);
  const int shift = qe - exp;
  uint64_t r;
  int q = qe;
  if (shift <= 0) {
    r = static_cast<uint64_t>(mag << -shift);
  } else {
    u128 rem, half;
    if (shift >= 129) {
      r = 0, rem = 0, half = 1;  // below half of the quantum: rounds to 0
    } else if (shift == 128) {
      r = 0, rem = mag, half = u128{1} << 127;
    } else {
      r = static_cast<uint64_t>(mag >> shift);
      rem = mag & ((u128{1} << shift) - 1);
      half = u128{1} << (shift - 1);
    }
    if (rem > half || (rem == half && (sticky || (r & 1)))) ++r;
  }
  if (r == (uint64_t{1} << o.p)) r >>= 1, ++q;
  if (r == 0) return sign;
  const int mb = o.p - 1;
  if (r < (uint64_t{1} << mb)) return sign | r;  // subnormal (q == emin - p + 1)
  const int e = q + mb;
  if (e > o.emax) return sign | inf_bits(out, false);
  return sign | (static_cast<uint64_t>(e + o.bias) << mb) | (r - (uint64_t{1} << mb));
}

// Wide fixed-point accumulator: Σ ±mag·2^exp exactly, for 2^-448 <= unit, value < 2^440.
class WideAcc {
 public:
  static constexpr int kLow = -448;
  static constexpr int kLimbs = 28;  // 32-bit limbs in int64 (carry-save)

  void add(bool neg, u128 mag, int exp) {
    if (mag == 0) return;
    const int off = exp - kLow;
    if (off < 0 || off / 32 + 5 > kLimbs) throw InputError("internal: exact accumulator range exceeded");
    const int i = off >> 5, s = off & 31;
    const u128 x = mag << s;
    const uint64_t top = s ? static_cast<uint64_t>(mag >> (128 - s)) : 0;
    const uint64_t piece[5] = {static_cast<uint64_t>(x) & 0xFFFFFFFFu, static_cast<uint64_t>(x >> 32) & 0xFFFFFFFFu,
                               static_cast<uint64_t>(x >> 64) & 0xFFFFFFFFu,
                               static_cast<uint64_t>(x >> 96) & 0xFFFFFFFFu, top};
    for (int j = 0; j < 5; ++j)
      limb_[i + j] += neg ? -static_cast<int64_t>(piece[j]) : static_cast<int64_t>(piece[j]);
    if (++adds_ >= (1 << 28)) normalize();
  }
  // Adds ±P · ma · mb · 2^exp with |P| < 2^127, ma, mb < 2^24.
  void add_product(bool neg, u128 P, uint64_t mm, int exp) {
    const uint64_t lo = static_cast<uint64_t>(P), hi = static_cast<uint64_t>(P >> 64);
    add(neg, static_cast<u128>(lo) * mm, exp);
    if (hi) add(neg, static_cast<u128>(hi) * mm, exp + 64);
  }
  void add_f32(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    const uint32_t ef = (b >> 23) & 0xFF, fr = b & 0x7FFFFF;
    const bool neg = b >> 31;
    if (ef == 0) add(neg, fr, -149);
    else add(neg, fr | 0x800000u, static_cast<int>(ef) - 150);
  }
  uint64_t round(Format out) {
    normalize();
    bool neg = limb_[kLimbs - 1] < 0;
    if (neg) {
      for (int64_t& l : limb_) l = -l;
      normalize();
    }
    int h = kLimbs - 1;
    while (h >= 0 && limb_[h] == 0) --h;
    if (h < 0) return 0;
    const int lo = std::max(0, h - 3);
    u128 mag = 0;
    for (int j = h; j >= lo; --j) mag = (mag << 32) | static_cast<uint64_t>(limb_[j]);
    bool sticky = false;
    for (int j = 0; j < lo; ++j) sticky |= limb_[j] != 0;
    return round_exact(neg, mag, kLow + 32 * lo, sticky, out);
  }

 private:
  void normalize() {
    for (int j = 0; j + 1 < kLimbs; ++j) {
      const int64_t c = limb_[j] >> 32;  // floor
      limb_[j] -= c * (int64_t{1} << 32);
      limb_[j + 1] += c;
    }
    adds_ = 0;
  }
  int64_t limb_[kLimbs] = {};
  int adds_ = 0;
};


}  // namespace fp8ref::exact
