// fp8ref — scaled_mm on the CPU (include/fp8ref/gemm.h): exact, f32-kblock and hopper-tc bit-identical to
// reference/gemm_ref.cc, OpenMP over output tiles, streaming over K (state per output tile only; no M×N×K
// intermediate). Hot loops are plain loops vectorised by the compiler for AVX-512 / AVX2 (GCC target_clones: x86-64-v4 / v3 / baseline, chosen by ISA at run time).
//
// exact, f32-kblock — the block partials P = Σ a·b over one K block:
//   e4m3fn × e4m3fn (run_e4m3_f64): a blocked f64 GEMM on per-thread converted tiles (AVX-512 8×16 micro-kernel).
//   Exact in any order: every product is a multiple of 2^-18 below 2^17.62, so every partial sum of at most 2^17
//   products is an integer multiple of 2^-18 below 2^53 · 2^-18 (the proof is at run_e4m3_f64). exact then sums
//   P·sa·sb error-free (TwoProduct/TwoSum, falling back to exact::WideAcc when the rounding is not decided);
//   f32-kblock rounds P to f32 (the f64 → f32 conversion is one RNE rounding of the exact value) and promotes.
//   other pairs (and e4m3 × e4m3 exact tensor/rowwise with K > 2^17): integers in units of 2^(qmin_a + qmin_b),
//   int64 (e4m3 × e5m2) or int128 (e5m2 × e5m2) sums; exact adds P · sa · sb into exact::WideAcc per element.
// hopper-tc — per lane (output column) integer state T = tm·2^tx; per 32-k step the max nominal exponent, the
//   truncated products trunc(a·b · 2^(13 − e)) (exact f32 values of the codes, f32 products and power-of-two scale
//   without rounding, truncating f32 → int32 conversion) and the 14-bit re-truncation, vectorised over 64 output
//   columns, 8 rows at a time (the B chunk of a step stays in L1).
// Outputs in rows of A / rows of BT that hold a NaN or Inf code are recomputed with ref::scaled_mm (the defined
// special-value semantics); mma-sync-sm90 chains ref::mma_sm90_element over K (one mma per 32 k).
// GCC 12 flags its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/exact_sum.h"
#include "fp8ref/gemm.h"
#include "fp8ref/mma.h"
#include "cpu/gemm_fast.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define FP8REF_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FP8REF_CLONES
#endif

namespace fp8ref::cpu {

namespace {

using exact::i128;
using exact::u128;

struct Code {
  double v = 0;      // exact value (NaN/Inf for specials)
  int32_t E = -4096; // nominal exponent; -4096 for zero
  int64_t iv = 0;    // value in units of 2^qmin (exact integer)
  bool special = false;
};

int qmin_of(Format f) { return f == Format::e4m3fn ? -9 : -16; }
int pm_of(Format f) { return f == Format::e4m3fn ? 3 : 2; }

void decode_table(Format f, Code* t) {
  for (int c = 0; c < 256; ++c) {
    Code& d = t[c];
    d = Code{};
    const double v = ref::value_of(f, static_cast<uint8_t>(c));
    d.v = v;
    if (!std::isfinite(v)) {
      d.special = true;
      continue;
    }
    if (v == 0) continue;
    const int mag = c & 0x7F, pm = pm_of(f);
    const int ef = mag >> pm;
    const int bias = f == Format::e4m3fn ? 7 : 15;
    d.E = ef ? ef - bias : 1 - bias;
    d.iv = static_cast<int64_t>(std::ldexp(v, -qmin_of(f)));
  }
}

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

// RNE of a non-NaN f32 to bf16 (bf16 is the top half of an f32: same exponent range, subnormals and overflow to
// ±Inf included).
inline uint64_t bf16_rne(uint32_t b) { return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16; }
uint64_t narrow_out(float v, Format out) {
  if (std::isnan(v)) return exact::canonical_nan(out);
  if (out == Format::f32) return bits_of(v);
  if (out == Format::bf16) return bf16_rne(bits_of(v));
  return ref::narrow(Format::f32, bits_of(v), out);
}
// RN_out of a finite f64: f32 by the hardware conversion (one RNE rounding); bf16 through f32 rounded to odd (24 >=
// 8 + 2 bits: the second rounding is then correct); f16 by ref::narrow.
uint64_t narrow_f64(double v, Format out) {
  if (out == Format::f16) {
    uint64_t vb;
    std::memcpy(&vb, &v, 8);
    return ref::narrow(Format::f64, vb, out);
  }
  if (out == Format::f32) return bits_of(static_cast<float>(v));
  return bf16_rne(bits_of(f32_round_to_odd(v)));
}
float widen(uint64_t bits, Format out) {
  if (out == Format::f32) return f32_of(static_cast<uint32_t>(bits));
  if (out == Format::bf16) return f32_of(static_cast<uint32_t>(bits) << 16);  // bf16 = the top half of an f32
  return f32_of(static_cast<uint32_t>(ref::narrow(out, bits, Format::f32)));
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
// The output epilogue of the f32 models: bias, rounding, bias after rounding.
uint64_t finish_f32(float v, const ScaledMmSpec& s, const float* bias, int64_t n) {
  if (s.bias == BiasMode::f32) v = v + bias[n];
  uint64_t bits = narrow_out(v, s.out);
  if (s.bias == BiasMode::out) bits = narrow_out(widen(bits, s.out) + widen(narrow_out(bias[n], s.out), s.out), s.out);
  return bits;
}

using ScaleIdx = GemmScales;

// B transposed to k-major in column tiles of 64: element (k, n) at tiled(n, k, K) = (n/64)·K·64 + k·64 + n%64, so
// that the 64 columns of a tile are contiguous for each k and consecutive k follow each other. Columns past N (to
// the next multiple of 64) hold f(0) (a zero code). dst: tiled_size(N, K) elements.
constexpr int64_t kBt = 64;
inline int64_t tiled(int64_t n, int64_t k, int64_t K) { return (n / kBt) * K * kBt + k * kBt + n % kBt; }
inline size_t tiled_size(int64_t N, int64_t K) { return static_cast<size_t>((N + kBt - 1) / kBt * kBt * K); }
template <class T, class F>
void transpose_b(const uint8_t* bt, int64_t N, int64_t K, T* dst, F f) {
  const int64_t nb = (N + kBt - 1) / kBt;
#pragma omp parallel for schedule(static)
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int64_t n0 = bi * kBt, n1 = std::min(N, n0 + kBt);
    T* tile = dst + bi * K * kBt;
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
      const int64_t k1 = std::min(K, k0 + 64);
      for (int64_t k = k0; k < k1; ++k) {
        for (int64_t n = n0; n < n1; ++n) tile[k * kBt + (n - n0)] = f(bt[n * K + k]);
        for (int64_t n = n1; n < n0 + kBt; ++n) tile[k * kBt + (n - n0)] = f(uint8_t{0});
      }
    }
  }
}

// ---- block partials (exact) -----------------------------------------------------------------------------------
constexpr int kMt = 32, kNt = 64;

// Integer partials for the other format pairs: units 2^(qmin_a + qmin_b).
void partial_int(const int64_t* A, const int64_t* Bk, int64_t K, int64_t /*N*/, int64_t m0, int mt, int64_t n0, int nt,
                 int64_t k0, int64_t k1, bool wide, i128* P) {
  for (int r = 0; r < mt; ++r)
    for (int j = 0; j < nt; ++j) {
      const int64_t* a = A + (m0 + r) * K;
      if (!wide) {
        int64_t s = 0;  // |a·b| < 2^49.6, 128-k blocks below 2^57
        for (int64_t k = k0; k < k1; ++k) s += a[k] * Bk[tiled(n0 + j, k, K)];
        P[r * kNt + j] = s;
      } else {
        i128 s = 0;
        for (int64_t k = k0; k < k1; ++k) s += static_cast<i128>(a[k]) * Bk[tiled(n0 + j, k, K)];
        P[r * kNt + j] = s;
      }
    }
}

struct Operands {
  std::vector<int64_t> Ai, Bi;     // integers in units of 2^qmin: A [M][K], B k-major (tiled)
  bool wide = false;
  int unit = 0;                    // exponent of the integer unit of a partial
};

Operands prepare_exact(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt, int64_t blk) {
  Code ta[256], tb[256];
  decode_table(s.fa, ta);
  decode_table(s.fb, tb);
  Operands o;
  o.wide = (s.fa == Format::e5m2 && s.fb == Format::e5m2) || blk > 4096;  // int64 sums: |a·b| < 2^49.6 otherwise
  o.unit = qmin_of(s.fa) + qmin_of(s.fb);
  const size_t MK = static_cast<size_t>(g.M * g.K);
  o.Ai.resize(MK);
  o.Bi.resize(tiled_size(g.N, g.K));
  for (size_t i = 0; i < MK; ++i) o.Ai[i] = ta[a[i]].iv;
  transpose_b(bt, g.N, g.K, o.Bi.data(), [&](uint8_t c) { return tb[c].iv; });
  return o;
}

// The partial tile in units of 2^unit (exact).
struct PartialTile {
  i128 q[kMt * kNt];
};

void block_partial(const Operands& o, const GemmShape& g, int64_t m0, int mt, int64_t n0, int nt, int64_t k0,
                   int64_t k1, PartialTile& t) {
  partial_int(o.Ai.data(), o.Bi.data(), g.K, g.N, m0, mt, n0, nt, k0, k1, o.wide, t.q);
}

float partial_f32(const Operands& o, const PartialTile& t, int idx) {
  const i128 p = t.q[idx];
  const bool neg = p < 0;
  return f32_of(static_cast<uint32_t>(exact::round_exact(neg, static_cast<u128>(neg ? -p : p), o.unit, false,
                                                         Format::f32)));
}

// Adds P · sa · sb (P in units 2^unit) to acc; sa, sb finite (Inf scales go to the reference).
void add_scaled(exact::WideAcc& acc, i128 P, int unit, float sa, float sb) {
  if (P == 0 || sa == 0 || sb == 0) return;
  const uint32_t ba = bits_of(sa), bb = bits_of(sb);
  const uint32_t ea = (ba >> 23) & 0xFF, eb = (bb >> 23) & 0xFF;
  const uint64_t ma = ea ? ((ba & 0x7FFFFF) | 0x800000u) : (ba & 0x7FFFFF);
  const uint64_t mb = eb ? ((bb & 0x7FFFFF) | 0x800000u) : (bb & 0x7FFFFF);
  const int xa = ea ? static_cast<int>(ea) - 150 : -149, xb = eb ? static_cast<int>(eb) - 150 : -149;
  const bool neg = (P < 0) ^ (ba >> 31) ^ (bb >> 31);
  acc.add_product(neg, static_cast<u128>(P < 0 ? -P : P), ma * mb, unit + xa + xb);
}

// exact, e4m3fn × e4m3fn: a fast path with an exact fallback. Per element the terms t = P·S (P the exact f64 group
// partial, S = sa·sb exact in f64: 48 bits) are summed error-free: TwoProduct (hi + lo = P·S exactly, by fma) and
// TwoSum into (s, e), with c = Σ(e + lo) in plain f64. The exact sum is s + c + δ with
// |δ| <= B = 2·(n + 1)·(n + 2)·2^-106 · Σ|hi| (the rounding errors of the 2n additions into c, each term of c being
// at most u·Σ|hi|; cf. Ogita–Rump–Oishi's Dot2 analysis). v = RN64(s + c); r = RN_out(v). r is the correctly rounded result when both
// rounding boundaries of r (the midpoints to its neighbours, exact in f64) lie farther than B + 2^-52·|v| from v;
// otherwise (a tie or near-tie, a zero, an overflow or ±max result) the element is recomputed with the exact wide
// accumulator. The test suite checks the result against ref::scaled_mm bit for bit.
struct DdAcc {
  double s = 0, c = 0, mag = 0;
  int n = 0;
  void add(double P, double S) {
    const double hi = P * S;
    const double lo = std::fma(P, S, -hi);
    const double t = s + hi;
    const double bp = t - s;
    const double e = (s - (t - bp)) + (hi - bp);
    s = t;
    c = c + (e + lo);
    mag = mag + std::fabs(hi);
    ++n;
  }
};

double out_midpoint(uint64_t rbits, Format out, bool up) {
  // the midpoint between r and its neighbour away from (up) or toward zero, as an exact f64
  const uint64_t nb = up ? rbits + 1 : rbits - 1;
  const double r = static_cast<double>(widen(rbits, out)), q = static_cast<double>(widen(nb, out));
  return r + (q - r) * 0.5;  // r, q have at most 24 bits and adjacent exponents: exact in f64
}

// Returns false when the rounding cannot be decided from (s, c) within the bound.
bool dd_round(const DdAcc& d, Format out, uint64_t* bits) {
  if (d.mag == 0) {
    *bits = 0;  // every term zero: +0
    return true;
  }
  const double v = d.s + d.c;
  if (!(v != 0) || !std::isfinite(v)) return false;
  // c = Σ(e_i + lo_i) in 2n f64 additions: |error| <= γ_2n · Σ(|e_i| + |lo_i|) <= 2n·u · (n + 1)·u·Σ|hi| (|e_i| <=
  // u·|s_i| <= u·Σ|hi|, |lo_i| <= u·|hi_i|, u = 2^-53), taken generously; plus the rounding of v = RN64(s + c).
  const double n = static_cast<double>(d.n);
  const double B = 2.0 * (n + 1) * (n + 2) * std::ldexp(d.mag, -106) * (1 + std::ldexp(1.0, -30)) +
                   std::ldexp(std::fabs(v), -52);
  const uint64_t r = narrow_f64(v, out);
  const uint64_t mag_bits = out == Format::f32 ? (r & 0x7FFFFFFFu) : (r & 0x7FFFu);
  const uint64_t max_bits = out == Format::f32 ? 0x7F7FFFFFu : (out == Format::bf16 ? 0x7F7Fu : 0x7BFFu);
  if (mag_bits == 0 || mag_bits >= max_bits) return false;  // zero, ±max, Inf: decided by the exact path
  const double lo_mid = out_midpoint(r, out, false), hi_mid = out_midpoint(r, out, true);
  const double dlo = std::fabs(v - lo_mid), dhi = std::fabs(hi_mid - v);
  if (!(dlo > B && dhi > B)) return false;
  *bits = r;
  return true;
}

// ---- exact and f32-kblock, e4m3fn × e4m3fn: blocked f64 GEMM on per-thread converted tiles ---------------------
// Why f64 is exact here (the bound this path relies on): an e4m3fn value is ±m·2^(e−3) with m < 16, so every
// finite value is an integer multiple of 2^-9 with |v| <= 448 < 2^8.81. A product a·b is then a multiple of 2^-18
// with |a·b| <= 448² < 2^17.62. Any partial sum of n <= 2^17 such products (any order, with or without fma) is a
// multiple of 2^-18 of magnitude below 2^17 · 2^17.62 = 2^34.62 < 2^53 · 2^-18 = 2^35, hence an f64 number: every
// product and every addition in the kernel below is exact, and the block sum P equals Σ a·b exactly.
// This holds for every K block (<= 128 products) and, for K <= 2^17, for the whole K (tensor/rowwise scaling).
// It does NOT hold for e5m2 (multiples of 2^-16, |v| <= 57344: products are multiples of 2^-32 up to 2^31.6, so a
// 128-block sum needs up to 2^38.6 / 2^-32 = 2^70.6 > 2^53 units): e4m3×e5m2, e5m2×e4m3 and e5m2×e5m2 keep the
// integer path (Operands / partial_int) below.
// Structure: work units of kMC rows × kNC columns (OpenMP, dynamic); per K block the unit's A (kMC × kb) and B
// (kb × kNC) codes are converted to f64 (bit arithmetic, vectorised, no table): A row-major, B from a byte copy of
// BT regrouped once per call into 16-column k-major panels (regroup_b) to [k][16] panels (256 KiB of tiles, plus
// 128 KiB for P and up to 384 KiB of accumulator state per thread); an 8×16 register-tile micro-kernel (AVX-512 fma when the CPU
// has it, else a portable std::fma loop — both exact, see above) writes P; then the per-(output, block) epilogue
// of the model: f32-kblock rounds P to f32 (double → float: one RNE rounding of the exact value) and promotes;
// exact with blocked scales adds P·sa·sb error-free (DdAcc, SoA); exact with tensor/rowwise scales sums P over K
// (exact) and scales the total once. No operand copy beyond these tiles; state per unit only.
// NaN codes (0x7F/0xFF) are converted to 0: fix_specials recomputes every output their row/column touches.
constexpr int kMC = 128, kNC = 128, kMR = 8, kNR = 16, kKC = 128;

// e4m3fn code → f64: the code's exponent and mantissa bits placed in the f64 fields give 2^(ef−1023)·(1 + fr/8)
// (normal) or fr·2^-1025 (ef = 0: an f64 subnormal), i.e. the e4m3 value times 2^-1016; the multiplication by
// 2^1016 is exact. NaN codes give 0.
inline double e4m3_f64(uint8_t c) {
  const uint64_t bits = (static_cast<uint64_t>(c & 0x80) << 56) | (static_cast<uint64_t>(c & 0x7F) << 49);
  double d;
  std::memcpy(&d, &bits, 8);
  return (c & 0x7F) == 0x7F ? 0.0 : d * 0x1p1016;
}

// A rows [m0, m0+mt) × k [k0, k0+kl) to f64, row-major: Ap[r][k] (row stride kl); rows up to the next multiple of
// kMR are 0.
FP8REF_CLONES
void pack_a(const uint8_t* a, int64_t K, int64_t m0, int mt, int64_t k0, int kl, double* __restrict Ap) {
  const int rows = (mt + kMR - 1) / kMR * kMR;
  for (int r = 0; r < rows; ++r) {
    double* dst = Ap + static_cast<size_t>(r) * kl;
    if (r >= mt) {
      for (int k = 0; k < kl; ++k) dst[k] = 0.0;
      continue;
    }
    const uint8_t* src = a + (m0 + r) * K + k0;
    // the next block of this row (128 rows at stride K are too many streams for the hardware prefetcher)
    if (k0 + 2 * kl <= K)
      for (int o = 0; o < kl; o += 64) __builtin_prefetch(src + kl + o);
#pragma omp simd
    for (int k = 0; k < kl; ++k) dst[k] = e4m3_f64(src[k]);
  }
}
#if defined(__x86_64__)
// dst[k·16 + j] = rows[j][k] for j, k < 16: a 16×16 byte transpose in four SSE2 unpack stages (8, 16, 32, 64 bits).
// seen (optional): per row, the bytewise max of (code | 0x80) — a byte 0xFF marks an e4m3fn NaN code in that row.
// out[k] = the 16 codes rows[0..15][k0 + k] (k < 16), in registers.
inline void transpose16x16_regs(const uint8_t* const* rows, int64_t k0, __m128i* out, __m128i* seen) {
  __m128i x[16], L1[8][2], L2[4][4], L3[2][8];
  for (int i = 0; i < 16; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + k0));
  if (seen)
    for (int i = 0; i < 16; ++i) seen[i] = _mm_max_epu8(seen[i], _mm_or_si128(x[i], _mm_set1_epi8(static_cast<char>(0x80))));
  for (int p = 0; p < 8; ++p)  // rows 2p, 2p+1; [h]: k 8h..8h+7
    L1[p][0] = _mm_unpacklo_epi8(x[2 * p], x[2 * p + 1]), L1[p][1] = _mm_unpackhi_epi8(x[2 * p], x[2 * p + 1]);
  for (int q = 0; q < 4; ++q)  // rows 4q..4q+3; [h]: k 4h..4h+3
    for (int h = 0; h < 2; ++h) {
      L2[q][2 * h] = _mm_unpacklo_epi16(L1[2 * q][h], L1[2 * q + 1][h]);
      L2[q][2 * h + 1] = _mm_unpackhi_epi16(L1[2 * q][h], L1[2 * q + 1][h]);
    }
  for (int o = 0; o < 2; ++o)  // rows 8o..8o+7; [h]: k 2h, 2h+1
    for (int h = 0; h < 4; ++h) {
      L3[o][2 * h] = _mm_unpacklo_epi32(L2[2 * o][h], L2[2 * o + 1][h]);
      L3[o][2 * h + 1] = _mm_unpackhi_epi32(L2[2 * o][h], L2[2 * o + 1][h]);
    }
  for (int h = 0; h < 8; ++h) {  // all 16 rows; k 2h and 2h+1
    out[2 * h] = _mm_unpacklo_epi64(L3[0][h], L3[1][h]);
    out[2 * h + 1] = _mm_unpackhi_epi64(L3[0][h], L3[1][h]);
  }
}
inline void transpose16x16(const uint8_t* const* rows, int64_t k0, uint8_t* dst, __m128i* seen = nullptr) {
  __m128i out[16];
  transpose16x16_regs(rows, k0, out, seen);
  for (int k = 0; k < 16; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k * 16), out[k]);
}
#endif

// Columns [n0, n0 + kNR) of BT, k in [k0, k0 + kl), into one k-major panel: dst[k·kNR + j] = bt[(n0 + j)·K + k0 + k]
// (code 0 past N). nan_rows (optional, e4m3fn): nan_rows[n0 + j] |= 1 when the row's piece holds a NaN code.
void regroup_panel(const uint8_t* bt, int64_t N, int64_t K, int64_t n0, int64_t k0, int64_t kl, const uint8_t* zeros,
                   uint8_t* dst, uint8_t* nan_rows = nullptr) {
  static_assert(kNR == 16, "regroup_panel transposes 16 columns at a time");
  const uint8_t* rows[kNR];
  for (int j = 0; j < kNR; ++j) rows[j] = n0 + j < N ? bt + (n0 + j) * K + k0 : zeros;
  if (k0 + 2 * kl <= K)  // the next block of these 16 rows (16 streams at stride K: too many for the prefetcher)
    for (int j = 0; j < kNR; ++j)
      for (int64_t o = 0; o < kl; o += 64) __builtin_prefetch(rows[j] + kl + o);
  uint8_t nan[kNR] = {};
  int64_t k = 0;
#if defined(__x86_64__)
  __m128i seen[kNR];
  for (__m128i& v : seen) v = _mm_setzero_si128();
  for (; k + 16 <= kl; k += 16) transpose16x16(rows, k, dst + k * kNR, nan_rows ? seen : nullptr);
  if (nan_rows)
    for (int j = 0; j < kNR; ++j) nan[j] = _mm_movemask_epi8(_mm_cmpeq_epi8(seen[j], _mm_set1_epi8(-1))) != 0;
#endif
  for (; k < kl; ++k)
    for (int j = 0; j < kNR; ++j) {
      dst[k * kNR + j] = rows[j][k];
      nan[j] |= (rows[j][k] & 0x7F) == 0x7F;
    }
  if (nan_rows)
    for (int j = 0; j < kNR && n0 + j < N; ++j) nan_rows[n0 + j] |= nan[j];
}
#if defined(__x86_64__) && defined(__GNUC__)
// 8 e4m3fn codes (the low 8 bytes) -> 8 f64 at out: e4m3_f64, vectorised.
__attribute__((target("avx512f"))) inline void e4m3_f64x8(__m128i bytes8, double* out) {
  const __m512i m7f = _mm512_set1_epi64(0x7F);
  const __m512i c = _mm512_cvtepu8_epi64(bytes8);
  const __m512i mag = _mm512_and_si512(c, m7f);
  const __m512i bits = _mm512_or_si512(_mm512_slli_epi64(mag, 49),
                                       _mm512_slli_epi64(_mm512_and_si512(c, _mm512_set1_epi64(0x80)), 56));
  const __mmask8 ok = _mm512_cmpneq_epi64_mask(mag, m7f);
  _mm512_storeu_pd(out, _mm512_maskz_mul_pd(ok, _mm512_castsi512_pd(bits), _mm512_set1_pd(0x1p1016)));
}
// regroup_panel and pack_b in one step (AVX-512, kl % 16 == 0): the transposed codes go from registers straight to
// f64 (e4m3_f64's arithmetic: the code's bits placed in the f64 fields, times 2^1016; NaN codes 0), dst[k·16 + j].
__attribute__((target("avx512f"))) void regroup_convert_panel(const uint8_t* bt, int64_t N, int64_t K, int64_t n0,
                                                              int64_t k0, int64_t kl, const uint8_t* zeros,
                                                              double* __restrict dst, uint8_t* nan_rows) {
  const uint8_t* rows[kNR];
  for (int j = 0; j < kNR; ++j) rows[j] = n0 + j < N ? bt + (n0 + j) * K + k0 : zeros;
  if (k0 + 2 * kl <= K)  // the next block of these 16 rows
    for (int j = 0; j < kNR; ++j)
      for (int64_t o = 0; o < kl; o += 64) __builtin_prefetch(rows[j] + kl + o);
  __m128i seen[kNR], t[16];
  for (__m128i& v : seen) v = _mm_setzero_si128();
  for (int64_t k = 0; k < kl; k += 16) {
    transpose16x16_regs(rows, k, t, nan_rows ? seen : nullptr);
    for (int r = 0; r < 16; ++r) {
      double* o = dst + (k + r) * kNR;
      e4m3_f64x8(t[r], o);
      e4m3_f64x8(_mm_srli_si128(t[r], 8), o + 8);
    }
  }
  if (nan_rows)
    for (int j = 0; j < kNR && n0 + j < N; ++j)
      nan_rows[n0 + j] |= _mm_movemask_epi8(_mm_cmpeq_epi8(seen[j], _mm_set1_epi8(-1))) != 0;
}
#define FP8REF_HAVE_FUSED_PANEL 1
#endif

// BT's codes regrouped once per call into column panels of kNR, k-major: b8[(q·K + k)·kNR + j] = bt[(q·kNR + j)·K + k]
// (code 0 past N) — a byte copy of B, so that the per-block f64 conversion below reads contiguous bytes. Used when
// B is converted more than once (more than one chunk of kMC rows); with one chunk each tile is regrouped on the fly.
void regroup_b(const uint8_t* bt, int64_t N, int64_t K, uint8_t* b8) {
  const int64_t panels = (N + kNR - 1) / kNR;
  std::vector<uint8_t> zeros(static_cast<size_t>(K), 0);
#pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < panels; ++q) regroup_panel(bt, N, K, q * kNR, 0, K, zeros.data(), b8 + q * K * kNR);
}
// Panels [n0/kNR, n0/kNR + ceil(nt/kNR)) × k [k0, k0+kl) of b8 to f64: Bp[q][k][j] (columns past N are code 0).
FP8REF_CLONES
void pack_b(const uint8_t* b8, int64_t K, int64_t n0, int nt, int64_t k0, int kl, double* __restrict Bp) {
  const int panels = (nt + kNR - 1) / kNR;
  for (int q = 0; q < panels; ++q) {
    double* dst = Bp + static_cast<size_t>(q) * kl * kNR;
    const uint8_t* src = b8 + ((n0 / kNR + q) * K + k0) * kNR;
    const int len = kl * kNR;
    if (k0 + 2 * kl <= K)
      for (int o = 0; o < len; o += 64) __builtin_prefetch(src + len + o);
#pragma omp simd
    for (int i = 0; i < len; ++i) dst[i] = e4m3_f64(src[i]);
  }
}

// P[r][j] (row stride ldp) = Σ_k Ap[r][k] · Bp[k][j] for one 8×16 tile (Ap row stride lda); exact (see above).
void micro_generic(const double* Ap, int64_t lda, const double* Bp, int kl, double* P, int ldp) {
  double c[kMR][kNR] = {};
  for (int k = 0; k < kl; ++k)
    for (int r = 0; r < kMR; ++r)
      for (int j = 0; j < kNR; ++j) c[r][j] = std::fma(Ap[r * lda + k], Bp[k * kNR + j], c[r][j]);
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) P[r * ldp + j] = c[r][j];
}
#if defined(__x86_64__) && defined(__GNUC__)
#define FP8REF_HAVE_AVX512_MICRO 1
__attribute__((target("avx512f"))) void micro_avx512(const double* Ap, int64_t lda, const double* Bp, int kl, double* P,
                                                     int ldp) {
  __m512d c0[kMR], c1[kMR];
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r) c0[r] = _mm512_setzero_pd(), c1[r] = _mm512_setzero_pd();
  for (int k = 0; k < kl; ++k) {
    const __m512d b0 = _mm512_loadu_pd(Bp + k * kNR), b1 = _mm512_loadu_pd(Bp + k * kNR + 8);
#pragma GCC unroll 8
    for (int r = 0; r < kMR; ++r) {
      const __m512d av = _mm512_set1_pd(Ap[r * lda + k]);
      c0[r] = _mm512_fmadd_pd(av, b0, c0[r]);
      c1[r] = _mm512_fmadd_pd(av, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r) {
    _mm512_storeu_pd(P + r * ldp, c0[r]);
    _mm512_storeu_pd(P + r * ldp + 8, c1[r]);
  }
}
#endif

// exact, blocked scales: (s, c, mag) += the error-free term P·S, S = sa·sb exact in f64 (DdAcc::add, per lane).
FP8REF_CLONES
void dd_block(double* __restrict s, double* __restrict c, double* __restrict mag, const double* __restrict P,
              double va, const double* __restrict vb, int nt) {
#pragma omp simd
  for (int j = 0; j < nt; ++j) {
    const double S = va * vb[j];
    const double hi = P[j] * S;
    const double lo = std::fma(P[j], S, -hi);
    const double t = s[j] + hi;
    const double bp = t - s[j];
    const double e = (s[j] - (t - bp)) + (hi - bp);
    s[j] = t;
    c[j] = c[j] + (e + lo);
    mag[j] = mag[j] + std::fabs(hi);
  }
}
// f32-kblock promotion of one block for one row: acc = RN(RN(RN(P)·sa)·sb) + acc, or fma(RN(sa·sb), RN(P), acc).
FP8REF_CLONES
void f32_block(float* __restrict acc, const double* __restrict P, float va, const float* __restrict vb, int nt,
               bool fma_mode) {
  if (!fma_mode) {
#pragma omp simd
    for (int j = 0; j < nt; ++j) {
      float x = static_cast<float>(P[j]) * va;
      x = x * vb[j];
      acc[j] = x + acc[j];
    }
  } else {
#pragma omp simd
    for (int j = 0; j < nt; ++j) acc[j] = std::fma(va * vb[j], static_cast<float>(P[j]), acc[j]);
  }
}
FP8REF_CLONES
void add_block(double* __restrict s, const double* __restrict P, int nt) {
#pragma omp simd
  for (int j = 0; j < nt; ++j) s[j] = s[j] + P[j];  // exact (see above)
}

// b_nan (size N, zeroed): filled with the rows of BT that hold a NaN code when the kernel regroups B on the fly
// (then it sees every code of B once); returns whether it did.
bool run_e4m3_f64(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const ScaleIdx& sc,
                  const float* bias, void* out, uint8_t* b_nan) {
  const bool exact_model = s.model == GemmModel::exact;
  const bool whole = exact_model && (s.scaling == GemmScaling::tensor || s.scaling == GemmScaling::rowwise);
  const int64_t group = s.scaling == GemmScaling::mx ? 32 : 128;
  const int64_t blk = exact_model ? (whole ? kKC : group) : gemm_kblock(s);
  const int64_t mchunks = (g.M + kMC - 1) / kMC;
  // One chunk of rows: every B tile is converted once, so it is regrouped on the fly (no copy of B).
  const bool direct = mchunks == 1;
  // Few rows (A as f64 over all of K within 1 MiB, L2-resident): A is converted once per call and the tiles are one
  // 16-column panel wide, so a tile streams 16 rows of BT over K (few streams for the prefetchers) and no A block is
  // converted twice.
  const int64_t mpad = (g.M + kMR - 1) / kMR * kMR;
  const bool small = direct && mpad * g.K * 8 <= (int64_t{1} << 20);
  const int64_t tw = small ? kNR : kNC, nchunks = (g.N + tw - 1) / tw;
  std::vector<double> Afull(small ? static_cast<size_t>(mpad * g.K) : 0);
  if (small && g.K > 0) pack_a(a, g.K, 0, static_cast<int>(g.M), 0, static_cast<int>(g.K), Afull.data());
  std::vector<uint8_t> b8;
  if (!direct) {
    b8.resize(static_cast<size_t>((g.N + kNR - 1) / kNR * kNR * g.K));
    regroup_b(bt, g.N, g.K, b8.data());
  }
  const std::vector<uint8_t> zeros(static_cast<size_t>(std::max<int64_t>(blk, kKC)), 0);
#if FP8REF_HAVE_AVX512_MICRO
  const bool avx512 = __builtin_cpu_supports("avx512f");
#else
  const bool avx512 = false;
#endif
#pragma omp parallel
  {
    const size_t T = static_cast<size_t>(kMC) * kNC;
    std::vector<double> Ap(static_cast<size_t>(kMC) * kKC), Bp(static_cast<size_t>(kNC) * kKC), P(T);
    std::vector<double> st_s, st_c, st_m;
    std::vector<float> facc;
    std::vector<double> vbd(kNC);
    std::vector<float> vbf(kNC);
    std::vector<uint8_t> tile(direct ? static_cast<size_t>(kNC) * kKC : 0);  // one regrouped B tile
    if (exact_model) st_s.resize(T), st_c.resize(T), st_m.resize(T);
    else facc.resize(T);
#pragma omp for schedule(dynamic) collapse(2)
    for (int64_t mi = 0; mi < mchunks; ++mi)
      for (int64_t ni = 0; ni < nchunks; ++ni) {
        const int64_t m0 = mi * kMC, n0 = ni * tw;
        const int mt = static_cast<int>(std::min<int64_t>(kMC, g.M - m0));
        const int nt = static_cast<int>(std::min<int64_t>(tw, g.N - n0));
        const size_t used = static_cast<size_t>(mt) * kNC;  // state rows [0, mt)
        if (exact_model) {
          std::fill(st_s.begin(), st_s.begin() + used, 0.0);
          std::fill(st_c.begin(), st_c.begin() + used, 0.0);
          std::fill(st_m.begin(), st_m.begin() + used, 0.0);
        } else {
          std::fill(facc.begin(), facc.begin() + used, 0.0f);
        }
        int nterms = 0;
        for (int64_t k0 = 0; k0 < g.K; k0 += blk) {
          const int kl = static_cast<int>(std::min<int64_t>(blk, g.K - k0));
          if (!small) pack_a(a, g.K, m0, mt, k0, kl, Ap.data());
#if FP8REF_HAVE_FUSED_PANEL
          if (direct && avx512 && kl % 16 == 0) {
            for (int q = 0; q * kNR < nt; ++q)
              regroup_convert_panel(bt, g.N, g.K, n0 + q * kNR, k0, kl, zeros.data(),
                                    Bp.data() + static_cast<size_t>(q) * kl * kNR, b_nan);
          } else
#endif
          if (direct) {
            for (int q = 0; q * kNR < nt; ++q)
              regroup_panel(bt, g.N, g.K, n0 + q * kNR, k0, kl, zeros.data(), tile.data() + static_cast<size_t>(q) * kl * kNR,
                            b_nan);
            pack_b(tile.data(), kl, 0, nt, 0, kl, Bp.data());
          } else {
            pack_b(b8.data(), g.K, n0, nt, k0, kl, Bp.data());
          }
          for (int q = 0; q * kNR < nt; ++q)
            for (int p = 0; p * kMR < mt; ++p) {
              const int64_t lda = small ? g.K : kl;
              const double* ap = small ? Afull.data() + static_cast<size_t>(p) * kMR * g.K + k0
                                       : Ap.data() + static_cast<size_t>(p) * kMR * kl;
              const double* bp = Bp.data() + static_cast<size_t>(q) * kl * kNR;
              double* pp = P.data() + static_cast<size_t>(p) * kMR * kNC + q * kNR;
#if FP8REF_HAVE_AVX512_MICRO
              if (avx512) {
                micro_avx512(ap, lda, bp, kl, pp, kNC);
                continue;
              }
#endif
              micro_generic(ap, lda, bp, kl, pp, kNC);
            }
          if (whole) {
            for (int r = 0; r < mt; ++r) add_block(st_s.data() + r * kNC, P.data() + r * kNC, nt);
            continue;
          }
          ++nterms;
          if (exact_model) {
            for (int j = 0; j < nt; ++j) vbd[j] = static_cast<double>(sc.b(n0 + j, k0));
            for (int r = 0; r < mt; ++r)
              dd_block(st_s.data() + r * kNC, st_c.data() + r * kNC, st_m.data() + r * kNC, P.data() + r * kNC,
                       static_cast<double>(sc.a(m0 + r, k0)), vbd.data(), nt);
          } else {
            for (int j = 0; j < nt; ++j) vbf[j] = sc.b(n0 + j, k0);
            for (int r = 0; r < mt; ++r)
              f32_block(facc.data() + r * kNC, P.data() + r * kNC, sc.a(m0 + r, k0), vbf.data(), nt,
                        s.promote_arith == PromoteArith::fma);
          }
        }
        for (int r = 0; r < mt; ++r)
          for (int j = 0; j < nt; ++j) {
            const int idx = r * kNC + j;
            const int64_t m = m0 + r, n = n0 + j;
            if (!exact_model) {
              store(out, m * g.N + n, s.out, finish_f32(facc[idx], s, bias, n));
              continue;
            }
            DdAcc d;
            if (whole) {
              d.add(st_s[idx], static_cast<double>(sc.a(m, 0)) * static_cast<double>(sc.b(n, 0)));
            } else {
              d.s = st_s[idx], d.c = st_c[idx], d.mag = st_m[idx], d.n = nterms;
            }
            if (s.bias == BiasMode::f32) d.add(static_cast<double>(bias[n]), 1.0);
            uint64_t bits;
            if (!dd_round(d, s.out, &bits)) {
              // Undecided (tie or near-tie, zero, ±max, overflow): the exact wide accumulator, block by block.
              exact::WideAcc w;
              const int64_t step = whole ? std::max<int64_t>(g.K, 1) : blk;
              for (int64_t k0 = 0; k0 < g.K; k0 += step) {
                const int64_t k1 = std::min(g.K, k0 + step);
                double p = 0;
                for (int64_t k = k0; k < k1; ++k) p = std::fma(e4m3_f64(a[m * g.K + k]), e4m3_f64(bt[n * g.K + k]), p);
                add_scaled(w, static_cast<i128>(static_cast<int64_t>(std::ldexp(p, 18))), -18, sc.a(m, k0),
                           sc.b(n, k0));
              }
              if (s.bias == BiasMode::f32) w.add_f32(bias[n]);
              bits = w.round(s.out);
            }
            if (s.bias == BiasMode::out)
              bits = narrow_out(widen(bits, s.out) + widen(narrow_out(bias[n], s.out), s.out), s.out);
            store(out, m * g.N + n, s.out, bits);
          }
      }
  }
  return direct;
}

// Returns whether b_nan (size N, zeroed) was filled with the rows of BT holding a NaN code (run_e4m3_f64).
bool run_exact_kblock(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                      const float* sa, const float* sb, const float* bias, void* out, uint8_t* b_nan) {
  const bool whole_exact = s.model == GemmModel::exact && (s.scaling == GemmScaling::tensor || s.scaling == GemmScaling::rowwise);
  if (s.fa == Format::e4m3fn && s.fb == Format::e4m3fn && (!whole_exact || g.K <= (int64_t{1} << 17)))
    return run_e4m3_f64(s, g, a, bt, ScaleIdx(s, g, sa, sb), bias, out, b_nan);
  const ScaleIdx sc(s, g, sa, sb);
  const bool exact_model = s.model == GemmModel::exact;
  const bool whole = s.scaling == GemmScaling::tensor || s.scaling == GemmScaling::rowwise;
  const int64_t group = s.scaling == GemmScaling::mx ? 32 : 128;
  const int64_t blk = exact_model ? group : gemm_kblock(s);
  const Operands o = prepare_exact(s, g, a, bt, blk);
  const int64_t mtiles = (g.M + kMt - 1) / kMt, ntiles = (g.N + kNt - 1) / kNt;
#pragma omp parallel
  {
    PartialTile t;
    std::vector<exact::WideAcc> wacc;
    std::vector<i128> isum;
    std::vector<float> facc;
#pragma omp for schedule(dynamic) collapse(2)
    for (int64_t mi = 0; mi < mtiles; ++mi)
      for (int64_t ni = 0; ni < ntiles; ++ni) {
        const int64_t m0 = mi * kMt, n0 = ni * kNt;
        const int mt = static_cast<int>(std::min<int64_t>(kMt, g.M - m0));
        const int nt = static_cast<int>(std::min<int64_t>(kNt, g.N - n0));
        if (exact_model) {
          wacc.assign(static_cast<size_t>(kMt * kNt), exact::WideAcc());
          isum.assign(static_cast<size_t>(kMt * kNt), 0);
        } else {
          facc.assign(static_cast<size_t>(kMt * kNt), 0.0f);
        }
        for (int64_t k0 = 0; k0 < g.K; k0 += blk) {
          const int64_t k1 = std::min(g.K, k0 + blk);
          block_partial(o, g, m0, mt, n0, nt, k0, k1, t);
          for (int r = 0; r < mt; ++r)
            for (int j = 0; j < nt; ++j) {
              const int idx = r * kNt + j;
              const int64_t m = m0 + r, n = n0 + j;
              if (exact_model) {
                if (whole) isum[idx] += t.q[idx];
                else add_scaled(wacc[idx], t.q[idx], o.unit, sc.a(m, k0), sc.b(n, k0));
                continue;
              }
              const float P = partial_f32(o, t, idx);
              const float va = sc.a(m, k0), vb = sc.b(n, k0);
              float& acc = facc[idx];
              if (s.promote_arith == PromoteArith::mul_mul_add) {
                float x = P * va;
                x = x * vb;
                acc = x + acc;
              } else {
                acc = std::fma(va * vb, P, acc);
              }
            }
        }
        for (int r = 0; r < mt; ++r)
          for (int j = 0; j < nt; ++j) {
            const int idx = r * kNt + j;
            const int64_t m = m0 + r, n = n0 + j;
            uint64_t bits;
            if (exact_model) {
              if (whole) add_scaled(wacc[idx], isum[idx], o.unit, sc.a(m, 0), sc.b(n, 0));
              if (s.bias == BiasMode::f32) wacc[idx].add_f32(bias[n]);
              bits = wacc[idx].round(s.out);
              if (s.bias == BiasMode::out)
                bits = narrow_out(widen(bits, s.out) + widen(narrow_out(bias[n], s.out), s.out), s.out);
            } else {
              bits = finish_f32(facc[idx], s, bias, n);
            }
            store(out, m * g.N + n, s.out, bits);
          }
      }
  }
  return false;
}

// ---- hopper-tc ---------------------------------------------------------------------------------------------------
// cuBLAS's epilogue for tensorwise and rowwise scales on the f32 accumulator (blocked scales are applied per block):
// tensor v·RN(sa·sb); rowwise RN(RN(v·sb)·sa).
float scale_epilogue(const ScaledMmSpec& s, const ScaleIdx& sc, int64_t m, int64_t n, float v) {
  if (s.scaling == GemmScaling::tensor) return v * (sc.a(m, 0) * sc.b(n, 0));
  if (s.scaling == GemmScaling::rowwise) {
    v = v * sc.b(n, 0);
    return v * sc.a(m, 0);
  }
  return v;
}
constexpr int kHn = 64;
static_assert(kHn == kBt && kNt % kBt == 0, "tiles must match the tiled B layout");

struct TcLanes {
  int32_t tm[kHn], tx[kHn], e[kHn], S[kHn];
};

// One wgmma step for one row of A over kHn lanes: k in [k0, k1). FA, FB: the exact values of the codes as f32 (0
// for zero and NaN/Inf codes; rows holding NaN/Inf are recomputed by fix_specials). The truncated term of a product
// on the grid 2^(e-13) is trunc(a·b · 2^(13-e)) computed in f32 without rounding: a·b has at most 8 significant bits
// (exact), the power-of-two scale is exact (a result below 2^-126 is below 1 and truncates to 0 either way), and
// the f32 → int32 conversion truncates toward zero on the magnitude. Every term is below 2^15 (|a·b| <
// 2^(Ea+Eb+2) <= 2^(e+2)), so S (at most 32 terms plus T) stays below 2^21.
FP8REF_CLONES
void tc_step_lanes(TcLanes& Ls, const int32_t* __restrict EA, const float* __restrict FA,
                   const int32_t* __restrict EB, const float* __restrict FB, int64_t k0, int64_t k1) {
  TcLanes L = Ls;  // a local copy: no aliasing with the B arrays
#pragma omp simd
  for (int l = 0; l < kHn; ++l) {
    const int32_t t = L.tm[l] < 0 ? -L.tm[l] : L.tm[l];
    L.e[l] = t ? L.tx[l] + 31 - __builtin_clz(static_cast<uint32_t>(t) | 1u) : -100000;
  }
  for (int64_t k = k0; k < k1; ++k) {  // a zero a has E = -4096: it never sets the maximum
    const int32_t ea = EA[k];
    const int32_t* eb = EB + k * kHn;  // EB, FB: this column tile (tiled layout; padding columns hold zero codes)
#pragma omp simd
    for (int l = 0; l < kHn; ++l) L.e[l] = std::max(L.e[l], ea + eb[l]);
  }
  uint32_t sbits[kHn];
#pragma omp simd
  for (int l = 0; l < kHn; ++l) {
    const int32_t grid = L.e[l] - 13;
    const int32_t sh = L.tx[l] - grid;
    const int32_t mag = L.tm[l] < 0 ? -L.tm[l] : L.tm[l];
    int32_t v = sh >= 0 ? (mag << std::min(sh, 16)) : (mag >> std::min(-sh, 31));
    L.S[l] = L.tm[l] < 0 ? -v : v;
    // 2^(13-e) as f32 bits; e in [-114, 139] for every lane with a non-zero term (e4m3/e5m2 products and sums),
    // the clamp only touches lanes whose terms are all zero
    sbits[l] = static_cast<uint32_t>(std::min(std::max(127 + 13 - L.e[l], 1), 254)) << 23;
  }
  float scale[kHn];
  std::memcpy(scale, sbits, sizeof scale);
  for (int64_t k = k0; k < k1; ++k) {
    const float fa = FA[k];  // 0 for a zero a: every term is 0
    const float* fb = FB + k * kHn;
#pragma omp simd
    for (int l = 0; l < kHn; ++l) L.S[l] += static_cast<int32_t>((fa * fb[l]) * scale[l]);
  }
#pragma omp simd
  for (int l = 0; l < kHn; ++l) {
    const int32_t Sv = L.S[l];
    const int32_t mag = Sv < 0 ? -Sv : Sv;
    const int32_t len = mag ? 32 - __builtin_clz(static_cast<uint32_t>(mag)) : 0;
    const int32_t sh = std::max(len - 14, 0);
    const int32_t tm = mag >> sh;
    L.tm[l] = Sv < 0 ? -tm : tm;
    L.tx[l] = L.e[l] - 13 + sh;
  }
  Ls = L;
}

// tm · 2^tx exactly (|tm| < 2^14; tx in the normal range of f32 for every finite e4m3/e5m2 sum seen by a step).
float tc_value(const TcLanes& L, int l) {
  const int tx = L.tx[l];
  if (L.tm[l] == 0) return 0.0f;
  if (tx < -126 || tx > 127) return std::ldexp(static_cast<float>(L.tm[l]), tx);
  return static_cast<float>(L.tm[l]) * f32_of(static_cast<uint32_t>(tx + 127) << 23);
}

// The exponent E and exact f32 value F of each code of one 16-column panel ([k][16] bytes, kl rows) into the 64-lane
// tile at lane offset q·16: decode_table's E (-4096 for zero and NaN/Inf codes) and value (0 for NaN/Inf: rows
// holding them are recomputed by fix_specials). AVX-512: the code's magnitude bits placed at the top of an f32
// mantissa give 2^(ef−127)·(1 + fr/2^pm) (ef > 0) or the f32 subnormal fr·2^(−126−pm) (ef = 0); one exact multiply by
// 2^(127−bias) makes either the code's value. Elsewhere: the table.
void tc_decode_panel_table(const Code* tb, const uint8_t* __restrict p, int kl, int q, int32_t* __restrict EB,
                           float* __restrict FB) {
  for (int k = 0; k < kl; ++k)
    for (int j = 0; j < 16; ++j) {
      const Code& d = tb[p[k * 16 + j]];
      EB[k * kHn + q * 16 + j] = d.E;
      FB[k * kHn + q * 16 + j] = d.special ? 0.0f : static_cast<float>(d.v);
    }
}
#if FP8REF_HAVE_AVX512_MICRO
__attribute__((target("avx512f,avx512bw"))) void tc_decode_panel_avx512(const uint8_t* __restrict p, int kl, int q,
                                                                       bool e4m3, int32_t* __restrict EB,
                                                                       float* __restrict FB) {
  const int pm = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const __m512i m7f = _mm512_set1_epi32(0x7F), m80 = _mm512_set1_epi32(0x80);
  const __m512i emax = _mm512_set1_epi32(e4m3 ? 0x7F : 0x7C);  // e4m3fn: mag == 0x7F; e5m2: mag >= 0x7C
  const __m512 scale = _mm512_set1_ps(e4m3 ? 0x1p120f : 0x1p112f);
  const __m512i vbias = _mm512_set1_epi32(bias), one = _mm512_set1_epi32(1), none = _mm512_set1_epi32(-4096);
  const __m128i sh_m = _mm_cvtsi32_si128(23 - pm), sh_e = _mm_cvtsi32_si128(pm);
  for (int k = 0; k < kl; ++k) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * 16)));
    const __m512i mag = _mm512_and_si512(c, m7f);
    const __mmask16 special = _mm512_cmpge_epi32_mask(mag, emax), zero = _mm512_cmpeq_epi32_mask(mag, _mm512_setzero_si512());
    const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_sll_epi32(mag, sh_m)), scale);
    const __m512 f = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), _mm512_slli_epi32(_mm512_and_si512(c, m80), 24)));
    const __m512i ef = _mm512_srl_epi32(mag, sh_e);
    const __m512i e = _mm512_sub_epi32(_mm512_max_epi32(ef, one), vbias);
    _mm512_storeu_ps(FB + k * kHn + q * 16, _mm512_mask_mov_ps(f, special, _mm512_setzero_ps()));
    _mm512_storeu_si512(EB + k * kHn + q * 16, _mm512_mask_mov_epi32(e, static_cast<__mmask16>(special | zero), none));
  }
}
#endif

// Work: OpenMP over 64-column tiles of B; per tile, chunks of kHc rows; per 128-K tile of the chunk's split-K part, the
// B tile is decoded once (regroup_panel + tc_decode_panel, 64 KiB of per-thread state) and every row of the chunk runs
// its wgmma steps on it. No copy of B beyond the tile; A is decoded once per call (M·K).
constexpr int kHc = 64;
void run_hopper(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
                const float* sb, const float* bias, void* out) {
  Code ta[256], tb[256];
  decode_table(s.fa, ta);
  decode_table(s.fb, tb);
  const bool b_e4m3 = s.fb == Format::e4m3fn;
#if FP8REF_HAVE_AVX512_MICRO
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
  const size_t MK = static_cast<size_t>(g.M * g.K);
  std::vector<int32_t> EA(MK);
  std::vector<float> FA(MK);
  auto fval = [](const Code& d) { return d.special ? 0.0f : static_cast<float>(d.v); };  // exact: <= 4 bits
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(MK); ++i) EA[i] = ta[a[i]].E, FA[i] = fval(ta[a[i]]);
  const ScaleIdx sc(s, g, sa, sb);
  const bool blocked = s.scaling == GemmScaling::blockwise || s.scaling == GemmScaling::group;
  const int64_t tiles = (g.K + 127) / 128;
  const int64_t per = (tiles + s.split_k - 1) / s.split_k;
  const int64_t ntiles = (g.N + kHn - 1) / kHn;
  const std::vector<uint8_t> zeros(128, 0);
#pragma omp parallel
  {
    std::vector<TcLanes> lanes(kHc);
    std::vector<float> A(static_cast<size_t>(kHc) * kHn), acc(static_cast<size_t>(kHc) * kHn);
    std::vector<uint8_t> bytes(static_cast<size_t>(128) * kHn);
    std::vector<int32_t> EB(static_cast<size_t>(128) * kHn);
    std::vector<float> FB(static_cast<size_t>(128) * kHn);
#pragma omp for schedule(dynamic)
    for (int64_t ni = 0; ni < ntiles; ++ni) {
      const int64_t n0 = ni * kHn;
      const int nt = static_cast<int>(std::min<int64_t>(kHn, g.N - n0));
      for (int64_t m0 = 0; m0 < g.M; m0 += kHc) {
        const int mt = static_cast<int>(std::min<int64_t>(kHc, g.M - m0));
        for (int part = 0; part < s.split_k; ++part) {
          const int64_t t0 = part * per, t1 = std::min(tiles, (part + 1) * per);
          for (int r = 0; r < mt; ++r) {
            std::memset(&lanes[r], 0, sizeof(TcLanes));
            for (int l = 0; l < kHn; ++l) A[r * kHn + l] = 0.0f;
          }
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t kt0 = t * 128, kt1 = std::min(g.K, kt0 + 128);
            const int kl = static_cast<int>(kt1 - kt0);
            for (int q = 0; q < kHn / 16; ++q) {
              uint8_t* pq = bytes.data() + static_cast<size_t>(q) * 128 * 16;
              regroup_panel(bt, g.N, g.K, n0 + q * 16, kt0, kl, zeros.data(), pq);
#if FP8REF_HAVE_AVX512_MICRO
              if (avx512) {
                tc_decode_panel_avx512(pq, kl, q, b_e4m3, EB.data(), FB.data());
                continue;
              }
#endif
              tc_decode_panel_table(tb, pq, kl, q, EB.data(), FB.data());
            }
            for (int r = 0; r < mt; ++r) {
              TcLanes& L = lanes[r];
              const int64_t m = m0 + r;
              if (blocked) std::memset(&L, 0, sizeof(TcLanes));
              for (int64_t c0 = kt0; c0 < kt1; c0 += 32)
                tc_step_lanes(L, EA.data() + m * g.K + kt0, FA.data() + m * g.K + kt0, EB.data(), FB.data(), c0 - kt0,
                              std::min(kt1, c0 + 32) - kt0);
              float* Ar = A.data() + static_cast<size_t>(r) * kHn;
              if (blocked) {
                for (int l = 0; l < nt; ++l) {
                  const float sab = sc.a(m, kt0) * sc.b(n0 + l, kt0);
                  Ar[l] = std::fma(sab, tc_value(L, l), Ar[l]);
                }
              } else if (!s.promote_never) {
                for (int l = 0; l < nt; ++l) Ar[l] = Ar[l] + tc_value(L, l);
                std::memset(&L, 0, sizeof(TcLanes));
              }
            }
          }
          for (int r = 0; r < mt; ++r)
            for (int l = 0; l < nt; ++l) {
              const float pr = (!blocked && s.promote_never) ? tc_value(lanes[r], l) : A[r * kHn + l];
              float& c = acc[static_cast<size_t>(r) * kHn + l];
              c = part == 0 ? pr : c + pr;
            }
        }
        for (int r = 0; r < mt; ++r)
          for (int l = 0; l < nt; ++l) {
            const int64_t m = m0 + r, n = n0 + l;
            const float v = scale_epilogue(s, sc, m, n, acc[static_cast<size_t>(r) * kHn + l]);
            store(out, m * g.N + n, s.out, finish_f32(v, s, bias, n));
          }
      }
    }
  }
}

void run_mma(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
             const float* sb, const float* bias, void* out) {
  const ScaleIdx sc(s, g, sa, sb);
  const bool whole = s.scaling == GemmScaling::tensor || s.scaling == GemmScaling::rowwise;
  const int64_t group = s.scaling == GemmScaling::mx ? 32 : 128;
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = 0; n < g.N; ++n) {
      uint8_t ca[32], cb[32];
      float acc = 0.0f, P = 0.0f;
      for (int64_t k0 = 0; k0 < g.K; k0 += 32) {
        const int64_t len = std::min<int64_t>(32, g.K - k0);
        std::memset(ca, 0, 32);
        std::memset(cb, 0, 32);
        std::memcpy(ca, a + m * g.K + k0, static_cast<size_t>(len));
        std::memcpy(cb, bt + n * g.K + k0, static_cast<size_t>(len));
        if (whole) {
          acc = ref::mma_sm90_element(s.fa, s.fb, ca, cb, acc);
          continue;
        }
        if (k0 % group == 0) P = 0.0f;
        P = ref::mma_sm90_element(s.fa, s.fb, ca, cb, P);
        if (k0 + 32 >= g.K || (k0 + 32) % group == 0) acc = std::fma(sc.a(m, k0) * sc.b(n, k0), P, acc);
      }
      store(out, m * g.N + n, s.out, finish_f32(scale_epilogue(s, sc, m, n, acc), s, bias, n));
    }
}

// ---- special rows / columns -----------------------------------------------------------------------------------
bool any_special_scale(const ScaledMmSpec& s, const float* v, size_t n) {
  (void)s;
  for (size_t i = 0; i < n; ++i)
    if (std::isinf(v[i])) return true;
  return false;
}

// Whether any of the n codes is special (sp: the 256-entry table of ref::value_of's non-finite codes). The NaN/Inf
// codes of e4m3fn (0x7F, 0xFF) and e5m2 (0x7C..0x7F, 0xFC..0xFF) are (c & mask) == mask; the table decides which
// mask applies, and the scan is a branch-free OR that the compiler vectorises.
FP8REF_CLONES
uint8_t has_special(const bool* sp, const uint8_t* p, int64_t n) {
  uint8_t mask = 0;
  if (sp[0x7F] && sp[0xFF] && !sp[0x7E]) mask = 0x7F;                 // e4m3fn
  if (sp[0x7C] && sp[0x7D] && sp[0xFC] && !sp[0x7B]) mask = 0x7C;     // e5m2
  if (mask == 0) {
    uint8_t r = 0;
    for (int64_t i = 0; i < n; ++i) r |= sp[p[i]];
    return r;
  }
  uint8_t r = 0;
#pragma omp simd reduction(| : r)
  for (int64_t i = 0; i < n; ++i) r |= static_cast<uint8_t>((p[i] & mask) == mask);
  return r;
}

// Recomputes, with the reference, the outputs whose A row or BT row holds a NaN/Inf code (or all outputs when a
// scale is infinite): the special-value semantics live in one place.
// b_nan: the rows of BT holding a NaN code when the kernel already found them (e4m3fn B; else nullptr: scanned here).
void fix_specials(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
                  const float* sb, const float* bias, void* out, const uint8_t* b_nan = nullptr) {
  const size_t es = s.out == Format::f32 ? 4 : 2;
  bool spa[256], spb[256];
  for (int c = 0; c < 256; ++c) {
    spa[c] = !std::isfinite(ref::value_of(s.fa, static_cast<uint8_t>(c)));
    spb[c] = !std::isfinite(ref::value_of(s.fb, static_cast<uint8_t>(c)));
  }
  std::vector<uint8_t> row_a(static_cast<size_t>(g.M), 0), row_b(static_cast<size_t>(g.N), 0);
  bool any = false;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < g.M; ++m) row_a[m] = has_special(spa, a + m * g.K, g.K);
  if (b_nan) {
    std::memcpy(row_b.data(), b_nan, static_cast<size_t>(g.N));
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < g.N; ++n) row_b[n] = has_special(spb, bt + n * g.K, g.K);
  }
  for (uint8_t v : row_a) any |= v != 0;
  for (uint8_t v : row_b) any |= v != 0;
  const bool inf_scale = any_special_scale(s, sa, gemm_sa_count(s, g)) ||
                         any_special_scale(s, sb, gemm_sb_count(s, g));
  if (inf_scale) {
    ref::scaled_mm(s, g, a, bt, sa, sb, bias, out);
    return;
  }
  if (!any) return;
  const int64_t KB = (g.K + 127) / 128, K32 = (g.K + 31) / 32;
  const int64_t sa_row = s.scaling == GemmScaling::mx ? K32 : (s.scaling == GemmScaling::tensor ? 0 : KB);
  std::vector<uint8_t> tmp(static_cast<size_t>(std::max(g.M, g.N)) * es);
  for (int64_t m = 0; m < g.M; ++m) {
    if (!row_a[m]) continue;
    const GemmShape g1{1, g.N, g.K};
    const float* sam = s.scaling == GemmScaling::tensor ? sa : s.scaling == GemmScaling::rowwise ? sa + m : sa + m * sa_row;
    ref::scaled_mm(s, g1, a + m * g.K, bt, sam, sb, bias, tmp.data());
    std::memcpy(static_cast<uint8_t*>(out) + static_cast<size_t>(m * g.N) * es, tmp.data(), static_cast<size_t>(g.N) * es);
  }
  for (int64_t n = 0; n < g.N; ++n) {
    if (!row_b[n]) continue;
    ScaledMmSpec s1 = s;
    const float* sbn = sb;
    switch (s.scaling) {
      case GemmScaling::tensor: break;
      case GemmScaling::rowwise: sbn = sb + n; break;
      case GemmScaling::blockwise: sbn = sb + (n / 128) * (s.cublas_sb_stride ? (KB + 3) / 4 * 4 : KB); break;
      case GemmScaling::group: sbn = sb + n * KB; break;
      case GemmScaling::mx: sbn = sb + n * K32; break;
    }
    s1.cublas_sb_stride = false;  // one n-block: the row is contiguous either way
    const GemmShape g1{g.M, 1, g.K};
    const float* bn = bias ? bias + n : nullptr;
    ref::scaled_mm(s1, g1, a, bt + n * g.K, sa, sbn, bn, tmp.data());
    for (int64_t m = 0; m < g.M; ++m)
      std::memcpy(static_cast<uint8_t*>(out) + static_cast<size_t>(m * g.N + n) * es, tmp.data() + m * es, es);
  }
}

}  // namespace

void scaled_mm(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
               const float* sb, const float* bias, void* out) {
  check_scaled_mm_operands(spec, g, a, bt, sa, sb, bias, out);
  if (g.M == 0 || g.N == 0) return;
  switch (spec.model) {
    case GemmModel::exact:
    case GemmModel::f32_kblock: {
      std::vector<uint8_t> b_nan(static_cast<size_t>(g.N), 0);
      const bool found = run_exact_kblock(spec, g, a, bt, sa, sb, bias, out, b_nan.data());
      fix_specials(spec, g, a, bt, sa, sb, bias, out, found ? b_nan.data() : nullptr);
      return;
    }
    case GemmModel::hopper_tc: run_hopper(spec, g, a, bt, sa, sb, bias, out); break;
    case GemmModel::mma_sync_sm90: run_mma(spec, g, a, bt, sa, sb, bias, out); return;
    case GemmModel::fast: scaled_mm_fast(spec, g, a, bt, sa, sb, bias, out); return;  // src/cpu/gemm_fast.cc
  }
  fix_specials(spec, g, a, bt, sa, sb, bias, out);
}

void scaled_bmm(const ScaledMmSpec& spec, const GemmShape& g, const BmmOperands& bo, const uint8_t* a,
                const uint8_t* bt, const float* sa, const float* sb, const float* bias, void* out) {
  const size_t es = spec.out == Format::f32 ? 4 : 2;
  const int64_t sa_n = static_cast<int64_t>(gemm_sa_count(spec, g));
  const int64_t sb_n = static_cast<int64_t>(gemm_sb_count(spec, g));
  for (int64_t b = 0; b < bo.batch; ++b)
    scaled_mm(spec, g, a + b * g.M * g.K, bt + (bo.b_batched ? b * g.N * g.K : 0), sa + (bo.sa_batched ? b * sa_n : 0),
              sb + (bo.sb_batched ? b * sb_n : 0), bias,
              static_cast<uint8_t*>(out) + static_cast<size_t>(b * g.M * g.N) * es);
}

}  // namespace fp8ref::cpu
