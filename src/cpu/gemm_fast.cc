// fp8ref — the `fast` scaled_mm model (src/cpu/gemm_fast.h has the algorithm and its error bound).
// oneDNN bf16 batched matmuls per output tile (AMX where present) for the K-group partials; the scale epilogue and
// the output rounding in Highway (dynamic dispatch). OpenMP over output tiles; oneDNN runs single-threaded inside.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/gemm_fast.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "fp8ref/format.h"

HWY_BEFORE_NAMESPACE();
namespace fp8ref::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// acc[j] += Σ_q p[q·p_stride + j] · RN32(sa[q] · sbv[q·sb_stride + j]) for j < n, q = 0..kc-1 in order (each
// step one MulAdd: fused where the target has FMA; the bound allows both). acc stays in registers across q.
void FastAccumulateRow(const float* p, size_t p_stride, const float* sbv, size_t sb_stride, const float* sa,
                       size_t kc, float* acc, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  size_t j = 0;
  for (; j + L <= n; j += L) {
    auto v = hn::LoadU(d, acc + j);
    for (size_t q = 0; q < kc; ++q) {
      const auto w = hn::Mul(hn::Set(d, sa[q]), hn::LoadU(d, sbv + q * sb_stride + j));
      v = hn::MulAdd(hn::LoadU(d, p + q * p_stride + j), w, v);
    }
    hn::StoreU(v, d, acc + j);
  }
  for (; j < n; ++j)
    for (size_t q = 0; q < kc; ++q) {
      const float w = sa[q] * sbv[q * sb_stride + j];
      acc[j] = p[q * p_stride + j] * w + acc[j];
    }
}

// FP8 codes -> bf16 bits, exactly (both formats' values are bf16 values): the f32 pattern built arithmetically
// (normal: exponent rebias and fraction shift; subnormal: m · 2^(1-bias-mbits) by one exact f32 multiply; e5m2 Inf
// and NaN; e4m3fn NaN), then its top half. e5m2: is_e5m2 = true.
void FastCodesToBf16(bool is_e5m2, const uint8_t* src, uint16_t* dst, size_t n) {
  const hn::ScalableTag<uint32_t> du;
  const hn::ScalableTag<int32_t> di;
  const hn::ScalableTag<float> df;
  const hn::Rebind<uint8_t, decltype(du)> d8;
  const hn::Rebind<uint16_t, decltype(du)> d16;
  const size_t L = hn::Lanes(du);
  const uint32_t mbits = is_e5m2 ? 2 : 3, bias = is_e5m2 ? 15 : 7;
  const auto mmask = hn::Set(du, (1u << mbits) - 1);
  const auto sub_scale = hn::Set(df, is_e5m2 ? 1.0f / 65536.0f : 1.0f / 512.0f);  // 2^(1-bias-mbits)
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto c = hn::PromoteTo(du, hn::LoadU(d8, src + i));
    const auto x = hn::And(c, hn::Set(du, 0x7Fu));
    const auto sign = hn::ShiftLeft<24>(hn::And(c, hn::Set(du, 0x80u)));
    const auto e = hn::ShiftRightSame(x, static_cast<int>(mbits));
    const auto m = hn::And(x, mmask);
    auto bits = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(du, 127 - bias))), hn::ShiftLeftSame(m, static_cast<int>(23 - mbits)));
    const auto sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, m)), sub_scale));
    bits = hn::IfThenElse(hn::Eq(e, hn::Zero(du)), sub, bits);
    if (is_e5m2) {
      const auto special = hn::Eq(e, hn::Set(du, 31u));
      const auto infnan = hn::IfThenElse(hn::Eq(m, hn::Zero(du)), hn::Set(du, 0x7F800000u), hn::Set(du, 0x7FC00000u));
      bits = hn::IfThenElse(special, infnan, bits);
    } else {
      bits = hn::IfThenElse(hn::Eq(x, hn::Set(du, 0x7Fu)), hn::Set(du, 0x7FC00000u), bits);
    }
    bits = hn::ShiftRight<16>(hn::Or(bits, sign));
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, dst + i);
  }
  for (; i < n; ++i) {  // tail: the same steps, one lane
    const uint32_t c = src[i], x = c & 0x7F, e = x >> mbits, m = x & ((1u << mbits) - 1);
    uint32_t bits = ((e + 127 - bias) << 23) | (m << (23 - mbits));
    if (e == 0) {
      const float v = static_cast<float>(m) * (is_e5m2 ? 1.0f / 65536.0f : 1.0f / 512.0f);
      std::memcpy(&bits, &v, 4);
    }
    if (is_e5m2 && e == 31) bits = m == 0 ? 0x7F800000u : 0x7FC00000u;
    if (!is_e5m2 && x == 0x7F) bits = 0x7FC00000u;
    dst[i] = static_cast<uint16_t>((bits | (c & 0x80) << 24) >> 16);
  }
}

// f32 -> bf16 bits, round to nearest even; NaN -> 0x7FC0 | sign.
HWY_INLINE hn::Vec<hn::ScalableTag<uint32_t>> RneBf16(hn::Vec<hn::ScalableTag<float>> v) {
  const hn::ScalableTag<uint32_t> du;
  const auto b = hn::BitCast(du, v);
  const auto r = hn::ShiftRight<16>(hn::Add(b, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(b), hn::Set(du, 1u)))));
  const auto nan = hn::Or(hn::ShiftRight<16>(b), hn::Set(du, 0x0040u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, r);
}

// One output row: mode 0 = acc; 1 = RN32(acc + bias); 2 = RN_bf16(RN32(RN_bf16(acc) + RN_bf16(bias))).
// out_bf16: write bf16 bits (else f32 values). f16 output is done by the caller (scalar).
void FastStoreRow(const float* acc, const float* bias, int mode, bool out_bf16, void* dst, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::ScalableTag<uint32_t> du;
  const size_t L = hn::Lanes(d);
  size_t j = 0;
  for (; j + L <= n; j += L) {
    auto v = hn::LoadU(d, acc + j);
    if (mode == 1) v = hn::Add(v, hn::LoadU(d, bias + j));
    if (!out_bf16) {
      if (mode == 2) v = hn::Add(v, hn::LoadU(d, bias + j));
      hn::StoreU(v, d, static_cast<float*>(dst) + j);
      continue;
    }
    auto r = RneBf16(v);
    if (mode == 2) {
      const auto rb = RneBf16(hn::LoadU(d, bias + j));
      r = RneBf16(hn::Add(hn::BitCast(d, hn::ShiftLeft<16>(r)), hn::BitCast(d, hn::ShiftLeft<16>(rb))));
    }
    alignas(64) uint32_t tmp[HWY_MAX_BYTES / 4];
    hn::Store(r, du, tmp);
    uint16_t* o = static_cast<uint16_t*>(dst) + j;
    for (size_t i = 0; i < L; ++i) o[i] = static_cast<uint16_t>(tmp[i]);
  }
  for (; j < n; ++j) {  // tail: the same steps, one lane
    float v = acc[j];
    if (mode == 1) v += bias[j];
    if (!out_bf16) {
      if (mode == 2) v += bias[j];
      static_cast<float*>(dst)[j] = v;
      continue;
    }
    auto rne = [](float x) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint32_t>((b >> 16) | 0x40u);
      return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    };
    uint32_t r = rne(v);
    if (mode == 2) {
      const uint32_t x = r << 16, y = rne(bias[j]) << 16;
      float fx, fy;
      std::memcpy(&fx, &x, 4);
      std::memcpy(&fy, &y, 4);
      r = rne(fx + fy);
    }
    static_cast<uint16_t*>(dst)[j] = static_cast<uint16_t>(r);
  }
}

}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "cpu/amx_tile.h"
#include "cpu/attention_fast.h"
#include "cpu/gemm_fast.h"
#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"

namespace fp8ref {
HWY_EXPORT(FastAccumulateRow);
HWY_EXPORT(FastStoreRow);
HWY_EXPORT(FastCodesToBf16);

namespace cpu {
namespace {

constexpr int64_t kTileN = 256;        // output tile columns (B's packing; independent of M)
constexpr int64_t kMaxTileM = 256;     // output tile rows
constexpr int64_t kPartialBytes = 1 << 20;  // f32 partials per thread per matmul call

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return cdiv(a, b) * b; }
int64_t tile_n_for(int64_t N) { return std::min(kTileN, round_up(std::max<int64_t>(N, 1), 16)); }

// The scale group along K: 128 (blockwise, group), 32 (mx), K (tensor, rowwise).
int64_t k_group(const ScaledMmSpec& s, int64_t K) {
  switch (s.scaling) {
    case GemmScaling::blockwise:
    case GemmScaling::group: return 128;
    case GemmScaling::mx: return 32;
    default: return std::max<int64_t>(K, 1);
  }
}

// Rows r0..r0+R-1 of a rows x K code matrix -> [KB][R][G] bf16 at dst, zero-padded (rows past the end, K tail).
void pack_tile(Format f, const uint8_t* codes, int64_t rows, int64_t K, int64_t r0, int64_t R, int64_t G,
               uint16_t* dst) {
  const int64_t KB = K == 0 ? 0 : cdiv(K, G);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t kb = 0; kb < KB; ++kb) {
      uint16_t* d = dst + (kb * R + i) * G;
      const int64_t k0 = kb * G, n = r0 + i < rows ? std::min(G, K - k0) : 0;
      if (n > 0) HWY_DYNAMIC_DISPATCH(FastCodesToBf16)(f == Format::e5m2, codes + (r0 + i) * K + k0, d, static_cast<size_t>(n));
      std::fill(d + n, d + G, uint16_t{0});
    }
}

// rows x K codes -> [ceil(rows/R)][KB][R][G] bf16, zero-padded.
std::vector<uint16_t> pack(Format f, const uint8_t* codes, int64_t rows, int64_t K, int64_t R, int64_t G) {
  const int64_t KB = K == 0 ? 0 : cdiv(K, G), tiles = cdiv(rows, R);
  std::vector<uint16_t> out(static_cast<size_t>(tiles * KB * R * G));
#pragma omp parallel for schedule(dynamic, 1) if (rows * K > (int64_t{1} << 20))
  for (int64_t t = 0; t < tiles; ++t) pack_tile(f, codes, rows, K, t * R, R, G, out.data() + t * KB * R * G);
  return out;
}

// Scale accessors (logical shapes of include/fp8ref/gemm.h).
struct Scales {
  GemmScaling kind;
  const float* sa;
  const float* sb;
  int64_t KB, sb_stride;
  float a(int64_t m, int64_t kb) const {
    switch (kind) {
      case GemmScaling::tensor: return sa[0];
      case GemmScaling::rowwise: return sa[m];
      default: return sa[m * KB + kb];
    }
  }
  // sb(n, kb) for kb = 0, 1, ... at row[kb · step] (step 0: one scale for every kb)
  const float* b_row(int64_t n, int64_t* step) const {
    *step = kind == GemmScaling::tensor || kind == GemmScaling::rowwise ? 0 : 1;
    switch (kind) {
      case GemmScaling::tensor: return sb;
      case GemmScaling::rowwise: return sb + n;
      case GemmScaling::blockwise: return sb + (n / 128) * sb_stride;
      default: return sb + n * KB;
    }
  }
  float b(int64_t n, int64_t kb) const {
    switch (kind) {
      case GemmScaling::tensor: return sb[0];
      case GemmScaling::rowwise: return sb[n];
      case GemmScaling::blockwise: return sb[(n / 128) * sb_stride + kb];
      default: return sb[n * KB + kb];
    }
  }
};

// ---- small M (decode): B read as FP8 codes, AVX-512 BF16 + VBMI ---------------------------------------------------
// A decode step multiplies a few rows by a whole weight: the oneDNN path above converts B to bf16 (twice the bytes of
// the codes) and runs a tiny matmul per K group. Here each B row (a column of the output) is read once as codes,
// decoded in registers — two 128-entry vpermi2b tables (the bf16 words' low and high bytes of the non-negative
// codes, each code's sign ORed into bit 7 of the high byte) and two in-lane byte unpacks —, and multiplied with A's
// rows (decoded the same way once per call, so both operands share the unpacks' element order) by vdpbf16ps into one
// f32 partial per lane. Per K group: acc = fma(P, RN32(sa·sb), acc) in the 16 lanes (the groups in increasing
// order), the lanes summed at the end. Within src/cpu/gemm_fast.h's bound: a lane takes at most 4·⌈L/64⌉ of a
// group's L products (two per vdpbf16ps, two vdpbf16ps per chunk of 64), so a term passes at most 4·⌈L/64⌉ − 1
// inexact additions inside its group (however the lane's chains are split and summed; the bound allows L − 1), then
// RN32(sa·sb), its fma, KB − 1 later fma's and at most 4 in the lane sum: 4·⌈L/64⌉ + 4 + KB <= L + 1 + KB, the
// bound's L − 1 + 2 + KB, for L >= 8. Below 8 a lane holds at most two products (codes 2j, 2j + 1) and at most four
// lanes are nonzero (the lane sum: <= 2 inexact additions): KB + 4 <= L + 1 + KB for L >= 3; L = 2: KB + 2, L = 1:
// KB + 1. bf16 inputs are never subnormal and the partials are multiples of 2^-32 (vdpbf16ps's DAZ/FTZ change
// nothing).
#define FP8REF_GEMV_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16")))

constexpr int64_t kGemvMaxM = 16;  // M up to this on the small-M path (bench/RESULTS.md, session 22)
constexpr int kGemvCols = 4;      // output columns in flight (independent vdpbf16ps chains)
constexpr int kGemvRows = 4;      // A rows per pass over a column's codes
constexpr int kGemvAhead = 1024;  // bytes of a column's codes prefetched ahead

struct GemvTables {
  alignas(64) uint8_t lo[128], hi[128];
  explicit GemvTables(Format f) {
    uint8_t codes[128];
    uint16_t w[128];
    for (int i = 0; i < 128; ++i) codes[i] = static_cast<uint8_t>(i);
    HWY_DYNAMIC_DISPATCH(FastCodesToBf16)(f == Format::e5m2, codes, w, 128);
    for (int i = 0; i < 128; ++i) {
      lo[i] = static_cast<uint8_t>(w[i]);
      hi[i] = static_cast<uint8_t>(w[i] >> 8);
    }
  }
};

struct GemvDecoder {
  __m512i lo0, lo1, hi0, hi1, s80;
  FP8REF_GEMV_TARGET explicit GemvDecoder(const GemvTables& t)
      : lo0(_mm512_load_si512(t.lo)), lo1(_mm512_load_si512(t.lo + 64)), hi0(_mm512_load_si512(t.hi)),
        hi1(_mm512_load_si512(t.hi + 64)), s80(_mm512_set1_epi8(static_cast<char>(0x80))) {}
  // 64 codes -> bf16 words: w0 = the codes 16L + 0..7 of each 128-bit lane L, w1 = 16L + 8..15 (zero codes: +0)
  FP8REF_GEMV_TARGET void decode(__m512i c, __m512i* w0, __m512i* w1) const {
    const __m512i lo = _mm512_permutex2var_epi8(lo0, c, lo1);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, c, hi1), c, s80, 0xF8);  // hi | (c & 0x80)
    *w0 = _mm512_unpacklo_epi8(lo, hi);
    *w1 = _mm512_unpackhi_epi8(lo, hi);
  }
};

FP8REF_GEMV_TARGET inline __mmask64 gemv_mask(int64_t n) { return n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << n) - 1); }

// The K chunks (<= 64 codes, never across a K group): chunk i covers [k0, k0 + n) of group g.
struct GemvChunks {
  std::vector<int64_t> k0, n;
  std::vector<int64_t> first;  // first chunk of each group, and one past the last
  GemvChunks(int64_t K, int64_t G) {
    for (int64_t g0 = 0; g0 < K; g0 += G) {
      first.push_back(static_cast<int64_t>(k0.size()));
      for (int64_t k = g0; k < std::min(K, g0 + G); k += 64) {
        k0.push_back(k);
        n.push_back(std::min<int64_t>(64, std::min(K, g0 + G) - k));
      }
    }
    first.push_back(static_cast<int64_t>(k0.size()));
  }
};

// A's rows as bf16 words in the decoder's order: row m, chunk i at ap[(m · chunks + i) · 64].
FP8REF_GEMV_TARGET void gemv_decode_a(const GemvDecoder& d, const GemvChunks& ch, const uint8_t* a, int64_t M,
                                      int64_t K, uint16_t* ap) {
  const int64_t nc = static_cast<int64_t>(ch.k0.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < nc; ++i) {
      __m512i w0, w1;
      d.decode(_mm512_maskz_loadu_epi8(gemv_mask(ch.n[i]), a + m * K + ch.k0[i]), &w0, &w1);
      _mm512_storeu_si512(ap + (m * nc + i) * 64, w0);
      _mm512_storeu_si512(ap + (m * nc + i) * 64 + 32, w1);
    }
}

// acc rows m0..m0+MB-1 (f32, row stride N) for the columns n[0..C) (repeats past N are computed, not stored). C·MB
// partial chains and as many accumulators in registers (C·MB <= 8: no spills). S: the scale products RN32(sa·sb),
// S[(c·MB + r)·KB + kb] for column n[c], row m0 + r (gemv_scales).
template <int MB, int C>
FP8REF_GEMV_TARGET void gemv_cols(const GemvDecoder& d, const GemvChunks& ch, const float* S, const uint16_t* ap,
                                  const uint8_t* bt, int64_t K, int64_t N, int64_t m0, const int64_t* n, int ncols,
                                  float* acc_out) {
  const int64_t nc = static_cast<int64_t>(ch.k0.size()), KB = static_cast<int64_t>(ch.first.size()) - 1;
  __m512 acc[C][MB];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < MB; ++r) acc[c][r] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < KB; ++kb) {
    // (one row and four columns: the chunk halves in two chains each, eight in flight — a group's four vdpbf16ps
    // of one chain would wait on each other)
    constexpr bool kSplit = C * MB <= 4;
    __m512 p[C][MB], p1[C][MB];
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < MB; ++r) p[c][r] = p1[c][r] = _mm512_setzero_ps();
    for (int64_t i = ch.first[kb]; i < ch.first[kb + 1]; ++i) {
      const __mmask64 mk = gemv_mask(ch.n[i]);
      const bool full = ch.n[i] == 64;
      for (int c = 0; c < C; ++c) {
        const uint8_t* src = bt + n[c] * K + ch.k0[i];
        _mm_prefetch(reinterpret_cast<const char*>(src) + kGemvAhead, _MM_HINT_T0);
        __m512i w0, w1;
        d.decode(full ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(mk, src), &w0, &w1);
        for (int r = 0; r < MB; ++r) {
          const uint16_t* a = ap + ((m0 + r) * nc + i) * 64;
          p[c][r] = _mm512_dpbf16_ps(p[c][r], (__m512bh)w0, (__m512bh)_mm512_loadu_si512(a));
          if (kSplit) p1[c][r] = _mm512_dpbf16_ps(p1[c][r], (__m512bh)w1, (__m512bh)_mm512_loadu_si512(a + 32));
          else p[c][r] = _mm512_dpbf16_ps(p[c][r], (__m512bh)w1, (__m512bh)_mm512_loadu_si512(a + 32));
        }
      }
    }
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < MB; ++r) {
        const __m512 pr = kSplit ? _mm512_add_ps(p[c][r], p1[c][r]) : p[c][r];
        acc[c][r] = _mm512_fmadd_ps(pr, _mm512_set1_ps(S[(c * MB + r) * KB + kb]), acc[c][r]);
      }
  }
  for (int c = 0; c < ncols; ++c)
    for (int r = 0; r < MB; ++r) acc_out[(m0 + r) * N + n[c]] = _mm512_reduce_add_ps(acc[c][r]);
}

// Whether the small-M kernels run: M up to max_m (kGemvMaxM for B's codes row by row, gemm16_max_m() for a packed B).
bool gemv_usable(const ScaledMmSpec& spec, const GemmShape& g, int64_t max_m = kGemvMaxM) {
  return g.M <= max_m && g.K > 0 && avx512bf16_kernels() && simd_target_is_avx512() &&
         (spec.fa == Format::e4m3fn || spec.fa == Format::e5m2) && (spec.fb == Format::e4m3fn || spec.fb == Format::e5m2);
}

// A's scales per row and K group, sa(m, kb) at [m · KB + kb] (the small-M kernels' scale products start from them).
std::vector<float> a_scale_rows(const Scales& sc, int64_t M, int64_t KB) {
  std::vector<float> sat(static_cast<size_t>(M * KB));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kb = 0; kb < KB; ++kb) sat[static_cast<size_t>(m * KB + kb)] = sc.a(m, kb);
  return sat;
}

// The scale products of rows m0..m0+mb-1 and columns n[0..nc): S[(c·mb + r)·KB + kb] = RN32(sa(m0 + r, kb) ·
// sb(n[c], kb)), from A's scales per row (sat: [M][KB]) and B's row of scales over kb.
void gemv_scales(const Scales& sc, const float* sat, int64_t KB, int64_t m0, int mb, const int64_t* n, int nc, float* S) {
  for (int c = 0; c < nc; ++c) {
    int64_t step;
    const float* br = sc.b_row(n[c], &step);
    for (int r = 0; r < mb; ++r) {
      const float* ar = sat + (m0 + r) * KB;
      float* o = S + (c * mb + r) * KB;
      if (step == 0)
        for (int64_t kb = 0; kb < KB; ++kb) o[kb] = ar[kb] * br[0];
      else
        for (int64_t kb = 0; kb < KB; ++kb) o[kb] = ar[kb] * br[kb];
    }
  }
}

// acc = the f32 accumulators [M][N] (before the epilogue) on the small-M path.
void gemv_fast(const ScaledMmSpec& spec, const GemmShape& g, int64_t G, const Scales& sc, const uint8_t* a,
               const uint8_t* bt, float* acc) {
  const int64_t M = g.M, N = g.N, K = g.K;
  const GemvChunks ch(K, G);
  const int64_t KB = static_cast<int64_t>(ch.first.size()) - 1;
  const GemvTables ta(spec.fa), tb(spec.fb);
  std::vector<uint16_t> ap(static_cast<size_t>(M) * ch.k0.size() * 64);
  gemv_decode_a(GemvDecoder(ta), ch, a, M, K, ap.data());
  const std::vector<float> sat = a_scale_rows(sc, M, KB);
  const int64_t quads = (N + kGemvCols - 1) / kGemvCols;
#pragma omp parallel if (N * K * M > (int64_t{1} << 18))
  {
    std::vector<float> S(static_cast<size_t>(kGemvCols * kGemvRows * KB));
    const GemvDecoder d(tb);
#pragma omp for schedule(dynamic, 16)
    for (int64_t q = 0; q < quads; ++q) {
      int64_t n[kGemvCols];
      const int64_t c0 = q * kGemvCols;
      for (int c = 0; c < kGemvCols; ++c) n[c] = std::min(c0 + c, N - 1);
      const int wide = static_cast<int>(std::min<int64_t>(kGemvCols, N - c0));
      for (int64_t m0 = 0; m0 < M;) {  // rows in blocks of up to four: 1–2 rows four columns at a time, 3–4 rows two
        const int mb = static_cast<int>(std::min<int64_t>(M - m0, kGemvRows));
        if (mb <= 2) {
          gemv_scales(sc, sat.data(), KB, m0, mb, n, kGemvCols, S.data());
          if (mb == 1) gemv_cols<1, 4>(d, ch, S.data(), ap.data(), bt, K, N, m0, n, wide, acc);
          else gemv_cols<2, 4>(d, ch, S.data(), ap.data(), bt, K, N, m0, n, wide, acc);
        } else {
          for (int h = 0; h < wide; h += 2) {
            const int half = std::min(2, wide - h);
            gemv_scales(sc, sat.data(), KB, m0, mb, n + h, 2, S.data());
            if (mb == 3) gemv_cols<3, 2>(d, ch, S.data(), ap.data(), bt, K, N, m0, n + h, half, acc);
            else gemv_cols<4, 2>(d, ch, S.data(), ap.data(), bt, K, N, m0, n + h, half, acc);
          }
        }
        m0 += mb;
      }
    }
  }
}

// ---- small M with a packed B (FastGemmB): B's codes in column blocks of 16 --------------------------------------
// A weight packed once is laid out for a register-blocked kernel: per block of 16 columns and 4 K (64 bytes), byte
// 16L + 8h + 2i + b = B[16·nb + 4L + i][4·kq + 2h + b] (zero past N and K), so the decoder's two unpacks give, in
// dword 4L + i of w0 (w1), column 4L + i's pair k = 4kq, +1 (4kq + 2, +3) — the VNNI layout. Each vdpbf16ps then
// multiplies 16 columns by one row's bf16 pair broadcast from A: MB rows × C column blocks of partials P (one column per
// lane: two sequential chains over the group's K pairs, then their sum — at most L/2 + 1 <= L − 1 inexact additions
// for L >= 4, and exact ones below: the bound's L − 1), acc = fma(P, S, acc)
// per group with S the 16 columns' RN32(sa·sb), no lane sum. The decode is shared by the MB rows (the row kernel
// above decodes per four rows and sums lanes).
constexpr int64_t kB16 = 16;  // columns per block

// bt [N][K] -> [ceil(N/16)][ceil(K/4)][64] as above
std::vector<uint8_t> pack_b16(const uint8_t* bt, int64_t N, int64_t K) {
  const int64_t NB = cdiv(N, kB16), KQ = cdiv(K, 4);
  std::vector<uint8_t> out(static_cast<size_t>(NB * KQ * 64), uint8_t{0});
  if (out.empty()) return out;  // (K = 0 or N = 0: no blocks)
#pragma omp parallel for schedule(static) if (N * K > (int64_t{1} << 20))
  for (int64_t nb = 0; nb < NB; ++nb)
    for (int j = 0; j < kB16 && nb * kB16 + j < N; ++j) {
      const uint8_t* row = bt + (nb * kB16 + j) * K;
      const int L = j / 4, i = j % 4;
      uint8_t* blk = out.data() + nb * KQ * 64 + 16 * L + 2 * i;
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {  // a row's 4 codes: k, k+1 to byte 16L + 2i, k+2, k+3 to 8 bytes on
        std::memcpy(blk + (k / 4) * 64, row + k, 2);
        std::memcpy(blk + (k / 4) * 64 + 8, row + k + 2, 2);
      }
      for (; k < K; ++k) blk[(k / 4) * 64 + 8 * ((k / 2) % 2) + k % 2] = row[k];
    }
  return out;
}

// acc rows m0..m0+MB-1, columns of blocks nb0..nb0+C-1 (f32, row stride N; columns past N not stored). a16: A as bf16
// [M][KQ·4] (zero past K). S[((r·C + c)·KB + kb)·16 + j]: column 16(nb0 + c) + j's scale product with row m0 + r.
template <int MB, int C>
FP8REF_GEMV_TARGET void gemm16_cols(const GemvDecoder& d, const uint8_t* b16, int64_t KQ, int64_t GQ, int64_t KB,
                                    const uint16_t* a16, const float* S, int64_t m0, int64_t nb0, int64_t N,
                                    float* acc_out) {
  // the accumulators in memory (touched once per group), the partials in two chains each (w0's and w1's pairs): 2·MB·C
  // independent vdpbf16ps chains of one instruction per 4 K — one chain of two per 4 K ran at ~18 of the 32 MAC per
  // cycle (session 22)
  alignas(64) float acc[MB * C * kB16];
  for (int i = 0; i < MB * C; ++i) _mm512_store_ps(acc + i * kB16, _mm512_setzero_ps());
  for (int64_t kb = 0; kb < KB; ++kb) {
    __m512 p[MB][C], p1[MB][C];
    for (int r = 0; r < MB; ++r)
      for (int c = 0; c < C; ++c) p[r][c] = p1[r][c] = _mm512_setzero_ps();
    const int64_t q1 = std::min(KQ, (kb + 1) * GQ);
    for (int64_t kq = kb * GQ; kq < q1; ++kq) {
      __m512i w0[C], w1[C];
      for (int c = 0; c < C; ++c) {
        const uint8_t* src = b16 + ((nb0 + c) * KQ + kq) * 64;
        _mm_prefetch(reinterpret_cast<const char*>(src) + kGemvAhead, _MM_HINT_T0);
        d.decode(_mm512_loadu_si512(src), &w0[c], &w1[c]);
      }
      for (int r = 0; r < MB; ++r) {
        const uint16_t* ar = a16 + (m0 + r) * KQ * 4 + kq * 4;
        int32_t x01, x23;
        std::memcpy(&x01, ar, 4);
        std::memcpy(&x23, ar + 2, 4);
        const __m512bh a01 = (__m512bh)_mm512_set1_epi32(x01), a23 = (__m512bh)_mm512_set1_epi32(x23);
        for (int c = 0; c < C; ++c) {
          p[r][c] = _mm512_dpbf16_ps(p[r][c], (__m512bh)w0[c], a01);
          p1[r][c] = _mm512_dpbf16_ps(p1[r][c], (__m512bh)w1[c], a23);
        }
      }
    }
    for (int r = 0; r < MB; ++r)
      for (int c = 0; c < C; ++c) {
        float* ac = acc + (r * C + c) * kB16;
        _mm512_store_ps(ac, _mm512_fmadd_ps(_mm512_add_ps(p[r][c], p1[r][c]),
                                            _mm512_loadu_ps(S + ((r * C + c) * KB + kb) * kB16), _mm512_load_ps(ac)));
      }
  }
  for (int r = 0; r < MB; ++r)
    for (int c = 0; c < C; ++c) {
      const int64_t n0 = (nb0 + c) * kB16;
      if (n0 >= N) continue;
      const __mmask16 mk = N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
      _mm512_mask_storeu_ps(acc_out + (m0 + r) * N + n0, mk, _mm512_load_ps(acc + (r * C + c) * kB16));
    }
}

// out[j] = RN32(sa · sb[j]) for the 16 columns of a block
FP8REF_GEMV_TARGET inline void gemm16_scale_row(float sa, const float* sb, float* out) {
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_loadu_ps(sb)));
}

// acc = the f32 accumulators [M][N] on the small-M path with a packed B (b16 from pack_b16).
void gemm16_fast(const ScaledMmSpec& spec, const GemmShape& g, int64_t G, const Scales& sc, const uint8_t* a,
                 const uint8_t* b16, float* acc) {
  const int64_t M = g.M, N = g.N, K = g.K, NB = cdiv(N, kB16), KQ = cdiv(K, 4), KB = cdiv(K, G), GQ = cdiv(G, 4);
  std::vector<uint16_t> a16(static_cast<size_t>(M * KQ * 4), uint16_t{0});
  for (int64_t m = 0; m < M; ++m) HWY_DYNAMIC_DISPATCH(FastCodesToBf16)(spec.fa == Format::e5m2, a + m * K, a16.data() + m * KQ * 4, static_cast<size_t>(K));
  const std::vector<float> sat = a_scale_rows(sc, M, KB);
  const GemvTables tb(spec.fb);
  // rows in blocks of up to 8; per row block MB·C <= 8 column-block accumulators: C = 4 for 1–2 rows, 2 for 3–4, 1
  // for 5–8 (the decode of a block shared by the MB rows; 2·MB·C vdpbf16ps chains)
  using Kern = void (*)(const GemvDecoder&, const uint8_t*, int64_t, int64_t, int64_t, const uint16_t*, const float*,
                        int64_t, int64_t, int64_t, float*);
  auto pick = [](int mb, int c) -> Kern {
    if (c == 4) return mb == 1 ? gemm16_cols<1, 4> : gemm16_cols<2, 4>;
    if (c == 2) return mb == 1 ? gemm16_cols<1, 2> : mb == 2 ? gemm16_cols<2, 2> : mb == 3 ? gemm16_cols<3, 2> : gemm16_cols<4, 2>;
    switch (mb) {
      case 1: return gemm16_cols<1, 1>;
      case 2: return gemm16_cols<2, 1>;
      case 3: return gemm16_cols<3, 1>;
      case 4: return gemm16_cols<4, 1>;
      case 5: return gemm16_cols<5, 1>;
      case 6: return gemm16_cols<6, 1>;
      case 7: return gemm16_cols<7, 1>;
      default: return gemm16_cols<8, 1>;
    }
  };
  constexpr int kBlocks = 4;  // column blocks per work item
  const int64_t work = cdiv(NB, kBlocks);
#pragma omp parallel if (N * K * M > (int64_t{1} << 18))
  {
    std::vector<float> S(static_cast<size_t>(8 * KB * kB16)), SB(static_cast<size_t>(kBlocks * KB * kB16));
    const GemvDecoder d(tb);
    // SB[(c·KB + kb)·16 + j] = sb(column 16(nb0 + c) + j, kb) for the work item's blocks, then S per row block as
    // sa(m, kb) times that vector (the scale products in lanes: a per-element scalar loop here cost a third of the
    // kernel's time at M = 8, session 22)
    auto col_scales = [&](int64_t nb0, int nc) {
      for (int c = 0; c < nc; ++c)
        for (int j = 0; j < kB16; ++j) {
          int64_t step;
          const float* br = sc.b_row(std::min((nb0 + c) * kB16 + j, N - 1), &step);
          for (int64_t kb = 0; kb < KB; ++kb) SB[static_cast<size_t>((c * KB + kb) * kB16 + j)] = br[kb * step];
        }
    };
    auto scales = [&](int64_t m0, int mb, int c0, int nc) {  // S for rows m0.., SB's blocks c0..c0+nc-1
      for (int r = 0; r < mb; ++r)
        for (int c = 0; c < nc; ++c)
          for (int64_t kb = 0; kb < KB; ++kb)
            gemm16_scale_row(sat[static_cast<size_t>((m0 + r) * KB + kb)], SB.data() + ((c0 + c) * KB + kb) * kB16,
                             S.data() + ((r * nc + c) * KB + kb) * kB16);
    };
#pragma omp for schedule(dynamic, 2)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t nb0 = kBlocks * w;
      const int nc = static_cast<int>(std::min<int64_t>(kBlocks, NB - nb0));
      col_scales(nb0, nc);
      for (int64_t m0 = 0; m0 < M;) {
        const int mb = static_cast<int>(std::min<int64_t>(M - m0, 8));
        const int cmax = mb <= 2 ? 4 : mb <= 4 ? 2 : 1;
        for (int c0 = 0; c0 < nc;) {
          const int cc = std::min(cmax, nc - c0) >= 4 ? 4 : std::min(cmax, nc - c0) >= 2 ? 2 : 1;
          scales(m0, mb, c0, cc);
          pick(mb, cc)(d, b16, KQ, GQ, KB, a16.data(), S.data(), m0, nb0 + c0, N, acc);
          c0 += cc;
        }
        m0 += mb;
      }
    }
  }
}

// ---- small M on AMX (a packed B, or B's codes) ---------------------------------------------------------------------
// On CPUs with AMX-BF16 the vdpbf16ps kernels above are slow (a Sapphire Rapids-class core issues one vdpbf16ps zmm
// per ~2 cycles: bench/pipe_pairs.py, session 23) and the oneDNN tile path converts per K group. Here the codes feed
// the tile unit: a 64-byte block of pack_b16's layout decodes (GemvDecoder) into two rows of a VNNI B tile — dword j
// of w0 (w1) is column j's K pair (4kq, 4kq + 1) ((4kq + 2, 4kq + 3)) —, so 8 blocks make one B tile (16 columns × 32
// K); a FastGemmB stores those blocks (PackedB), B's rows are transposed into them in registers (RowsB). Per column
// block of 16, the K groups in chunks of up to 4 such tiles (128 K): the next chunk decoded into the other of two
// buffers while the tile unit runs this one (tdpbf16ps C_t += A_t · B for up to 4 row tiles A_t of 16 rows × 32 K,
// A packed once per call as contiguous tiles, zero-padded to 16-row and 32-K multiples); at a group's end C_t is
// stored and acc = fma(P, RN32(sa·sb), acc) per row in 16 lanes, as gemm16_fast. Within src/cpu/gemm_fast.h's bound:
// P is an f32 sum of the group's L products in the tile unit's order (the bound's L − 1 additions with u', as the
// oneDNN tile path on AMX); products of fp8 values are never subnormal, their partial sums multiples of 2^-32 (the
// tile unit's DAZ/FTZ change nothing); a NaN or Inf code propagates as in IEEE arithmetic (0·Inf = NaN).
#define FP8REF_GEMM_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16,amx-tile,amx-bf16")))

// M from kAmxMinM (a packed B) or kAmxRowsMinM (B's codes) to kAmxMaxM (4 row tiles) on the tiles: below, the
// vdpbf16ps kernels read B faster. A Sapphire Rapids-class Xeon, 2 threads, [M, 7168] x [7168, 7168] blockwise
// (bench/RESULTS.md, session 23): packed, vdpbf16ps -> tiles: M = 1 1.9 -> 3.2 ms, 3 2.8 -> 3.1, 4 3.3 -> 3.2, 8 6.0 ->
// 3.3, 16 11.3 -> 4.0, 32 21.5 -> 5.1 (the oneDNN tile path 8.4–12 ms), 64 -> 8.5 (tile path 13.9–15.0); B's codes,
// gemv_fast -> tiles: M = 1 2.6 -> 3.4, 2 3.1 -> 3.3, 3 4.3 -> 3.4, 16 15.9 -> 4.4, then tile path -> tiles: 32 19.5 ->
// 6.3, 64 22.8 -> 9.2.
constexpr int64_t kAmxMinM = 4, kAmxRowsMinM = 3, kAmxMaxM = 64;
constexpr int kAmxChunkSteps = 4;  // B tiles (32 K each) decoded per chunk
constexpr int64_t kAmxRun = 16;    // column blocks per work item where the K groups go outside (amx_range)
// Up to kAmxGroupsMaxM where every chunk is a whole K group (G <= 128: blockwise, group, mx): slices of 64 rows then
// share each chunk's decoded tiles (the same Xeon: B's codes / packed, tile path -> tiles: M = 128 27.6 -> 20.4 /
// 20.6 -> 19.1 ms, but 256 41.9 -> 43.7 / 34.5 -> 40.2, session 23). A packed B, since its decode and acc update go
// between the tile steps (session 24), up to kAmxPackedMaxM: tile path -> tiles M = 192 26.7 -> 21.3 ms, 256 36.3 ->
// 27.0, 384 64.1 -> 34.9, 512 68.9 -> 52.6, 1024 134 -> 106, 2048 262 -> 251, but 4096 592 -> 613 (B's codes at 192
// and 256: 34.8 / 44.0 -> 34.5 / 45.2, no gain).
constexpr int64_t kAmxGroupsMaxM = 128, kAmxPackedMaxM = 1024;
int64_t amx_max_m(int64_t G) { return G <= 4 * 8 * kAmxChunkSteps ? kAmxGroupsMaxM : kAmxMaxM; }
int64_t amx_packed_max_m(int64_t G) { return G <= 4 * 8 * kAmxChunkSteps ? kAmxPackedMaxM : kAmxMaxM; }

std::atomic<bool> g_gemm_amx_off{false};  // (set_gemm16_amx_for_test)
bool gemm16_amx_usable() { return attn::cpu::fast_attention_has_amx() && !g_gemm_amx_off.load(std::memory_order_relaxed); }
// The largest M the small-M kernels take for B given as codes (K group G).
int64_t rows_max_m(int64_t G) { return gemm16_amx_usable() ? amx_max_m(G) : kGemvMaxM; }

// One chunk of a group: kq in [q0, q1) (a K group's range, clipped), decoded as ceil((q1 − q0) / 8) B tiles.
struct AmxChunk {
  int64_t kb, q0, q1;
  bool first, last;  // the first / last chunk of its group
  int steps() const { return static_cast<int>((q1 - q0 + 7) / 8); }
};

std::vector<AmxChunk> amx_chunks(int64_t KQ, int64_t GQ, int64_t KB) {
  std::vector<AmxChunk> out;
  for (int64_t kb = 0; kb < KB; ++kb) {
    const int64_t g0 = kb * GQ, g1 = std::min(KQ, g0 + GQ);
    for (int64_t q = g0; q < g1; q += 8 * kAmxChunkSteps)
      out.push_back({kb, q, std::min(g1, q + 8 * kAmxChunkSteps), q == g0, q + 8 * kAmxChunkSteps >= g1});
  }
  return out;
}

// Where a column block's B tiles come from. A chunk's tiles go to buf: tile s at buf + 512·s (16 rows of 32 bf16
// words), its rows 2i, 2i + 1 the decoded block kq = q0 + 8s + i of pack_b16's layout (zero past q1); lane j of a
// tile row (and of the block's accumulators) is column 16nb + col(j).
// A FastGemmB's column blocks: the blocks as stored.
struct PackedB {
  const uint8_t* b16;
  int64_t KQ;
  const uint8_t* blk = nullptr;
  static constexpr bool kSwapped = false;  // col(j) = j
  // the K groups outside the column blocks (amx_range): a group's blocks of one column block are one contiguous run
  // (the same Xeon, packed, 2 threads: M = 4 3.6–3.8 -> 2.9–3.1 ms, 16 4.1–4.2 -> 3.4–3.5, 64 8.8–8.9 -> 7.9–8.2)
  static constexpr bool kGroupsOutside = true;
  void column_block(int64_t nb) { blk = b16 + nb * KQ * 64; }
  FP8REF_GEMV_TARGET void chunk(const GemvDecoder& dr, const AmxChunk& ch, uint16_t* buf, int s0, int s1) const {
    const GemvDecoder d = dr;  // (in registers: the stores below may alias any memory)
    const uint8_t* const bk = blk;
    const int64_t q0 = ch.q0, q1 = ch.q1;
    for (int s = s0; s < s1; ++s)
      for (int i = 0; i < 8; ++i) {
        const int64_t kq = q0 + 8 * s + i;
        __m512i w0 = _mm512_setzero_si512(), w1 = w0;
        if (kq < q1) {
          _mm_prefetch(reinterpret_cast<const char*>(bk + kq * 64) + kGemvAhead, _MM_HINT_T0);
          d.decode(_mm512_loadu_si512(bk + kq * 64), &w0, &w1);
        }
        _mm512_store_si512(buf + 512 * s + 64 * i, w0);
        _mm512_store_si512(buf + 512 * s + 64 * i + 32, w1);
      }
  }
};

// B's codes as given ([N][K], row n = column n of the product): per 32 K the 16 rows' 32 codes (16 words each) are
// transposed into the 8 blocks by two in-lane unpack stages and one 128-bit lane shuffle — zmm v_j = rows j and j + 8;
// unpack{lo,hi}_epi16 of (v_2i, v_2i+1), then unpack{lo,hi}_epi32 of those pairs put words w(2kq), w(2kq + 1) of four
// rows in one 128-bit lane (pack_b16's byte order within the lane); shuffle_i32x4 gathers a block's four lanes, in
// the row order 0–3, 8–11, 4–7, 12–15 (col(j) swaps lanes 1 and 2: 3 shuffles per 64 codes instead of 4).
struct RowsB {
  const uint8_t* bt;
  int64_t N, K;
  const uint8_t* row[16] = {};
  static constexpr bool kSwapped = true;  // col(j): lanes 1 and 2 of the 16 columns swapped
  // (column blocks outside: with the K groups outside, 256 rows read 128 bytes at a time defeat the prefetchers — M =
  // 16 4.6 -> 8.3 ms)
  static constexpr bool kGroupsOutside = false;
  void column_block(int64_t nb) {
    for (int j = 0; j < 16; ++j) row[j] = nb * 16 + j < N ? bt + (nb * 16 + j) * K : nullptr;
  }
  FP8REF_GEMV_TARGET static __m512i load2(const uint8_t* a, const uint8_t* b, int64_t k0, int n) {
    // rows a and b's codes k0 .. k0 + n − 1 (n <= 32; null rows and the rest zero) as the two halves of a zmm
    if (n == 32 && a && b)
      return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k0))),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k0)), 1);
    const __mmask32 m = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
    const __m256i x = a ? _mm256_maskz_loadu_epi8(m, a + k0) : _mm256_setzero_si256();
    const __m256i y = b ? _mm256_maskz_loadu_epi8(m, b + k0) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
  }
  FP8REF_GEMV_TARGET void chunk(const GemvDecoder& d, const AmxChunk& ch, uint16_t* buf, int s0, int s1) const {
    const int64_t kend = std::min(K, 4 * ch.q1);
    for (int s = s0; s < s1; ++s) {
      const int64_t k0 = 4 * (ch.q0 + 8 * s);
      const int n = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(32, kend - k0)));
      if (k0 % 64 == 0)
        for (int j = 0; j < 16; ++j)
          if (row[j]) _mm_prefetch(reinterpret_cast<const char*>(row[j] + k0) + kGemvAhead, _MM_HINT_T0);
      __m512i v[8], t[8], u[8];
      for (int j = 0; j < 8; ++j) v[j] = load2(row[j], row[j + 8], k0, n);
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm512_unpacklo_epi16(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi16(v[2 * i], v[2 * i + 1]);
      }
      // u[4h + 2e + b]: rows 4h..4h+3 (and + 8), words 4e + 2b, + 1 (lanes 0, 2) and 8 more (lanes 1, 3)
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) {
          u[4 * h + 2 * e] = _mm512_unpacklo_epi32(t[4 * h + e], t[4 * h + 2 + e]);
          u[4 * h + 2 * e + 1] = _mm512_unpackhi_epi32(t[4 * h + e], t[4 * h + 2 + e]);
        }
      for (int x = 0; x < 4; ++x) {  // blocks x (lanes 0, 2 of u[x], u[4 + x]) and x + 4 (lanes 1, 3)
        const __m512i blk[2] = {_mm512_shuffle_i32x4(u[x], u[4 + x], 0x88), _mm512_shuffle_i32x4(u[x], u[4 + x], 0xDD)};
        for (int hh = 0; hh < 2; ++hh) {
          const int i = x + 4 * hh;
          __m512i w0 = _mm512_setzero_si512(), w1 = w0;
          if (ch.q0 + 8 * s + i < ch.q1) d.decode(blk[hh], &w0, &w1);
          _mm512_store_si512(buf + 512 * s + 64 * i, w0);
          _mm512_store_si512(buf + 512 * s + 64 * i + 32, w1);
        }
      }
    }
  }
};

// C_t += A_t · B over a chunk's tiles (C tiles 0..MT-1, A in tiles 4/5, B in 6/7 by parity): a16 the chunk's first
// A tile (row stride lda bytes), the next row tile rows16 words on, the next K step sstep words on.
template <int MT, class F>
FP8REF_GEMM_AMX_TARGET void amx_chunk_tiles(const uint16_t* buf, int ns, const uint16_t* a16, int64_t lda, int64_t rows16,
                                            int64_t sstep, F& between) {
#define FP8REF_AMX_ROWS(B)                                                        \
  _tile_loadd(4, a, lda);                                                         \
  _tile_dpbf16ps(0, 4, B);                                                        \
  if constexpr (MT > 1) {                                                         \
    _tile_loadd(5, a + rows16, lda);                                              \
    _tile_dpbf16ps(1, 5, B);                                                      \
  }                                                                               \
  if constexpr (MT > 2) {                                                         \
    _tile_loadd(4, a + 2 * rows16, lda);                                          \
    _tile_dpbf16ps(2, 4, B);                                                      \
  }                                                                               \
  if constexpr (MT > 3) {                                                         \
    _tile_loadd(5, a + 3 * rows16, lda);                                          \
    _tile_dpbf16ps(3, 5, B);                                                      \
  }
  for (int s = 0; s < ns; ++s) {
    const uint16_t* a = a16 + sstep * s;
    if (s % 2 == 0) {
      _tile_loadd(6, buf + 512 * s, 64);
      FP8REF_AMX_ROWS(6)
    } else {
      _tile_loadd(7, buf + 512 * s, 64);
      FP8REF_AMX_ROWS(7)
    }
    between(s);
  }
#undef FP8REF_AMX_ROWS
}

template <int MT>
FP8REF_GEMM_AMX_TARGET void amx_zero_c() {
  _tile_zero(0);
  if constexpr (MT > 1) _tile_zero(1);
  if constexpr (MT > 2) _tile_zero(2);
  if constexpr (MT > 3) _tile_zero(3);
}

template <int MT>
FP8REF_GEMM_AMX_TARGET void amx_store_c(float* P) {
  _tile_stored(0, P, 64);
  if constexpr (MT > 1) _tile_stored(1, P + 256, 64);
  if constexpr (MT > 2) _tile_stored(2, P + 512, 64);
  if constexpr (MT > 3) _tile_stored(3, P + 768, 64);
}

// One slice of mt <= 4 row tiles over a chunk: C zeroed first when zero, then the chunk's tiles (amx_chunk_tiles),
// between(s) after K step s's.
template <class F>
FP8REF_GEMM_AMX_TARGET void amx_slice_tiles(int mt, bool zero, const uint16_t* buf, int ns, const uint16_t* a16,
                                            int64_t sstep, F& between) {
  switch (mt) {
    case 1:
      if (zero) amx_zero_c<1>();
      return amx_chunk_tiles<1>(buf, ns, a16, 64, 512, sstep, between);
    case 2:
      if (zero) amx_zero_c<2>();
      return amx_chunk_tiles<2>(buf, ns, a16, 64, 512, sstep, between);
    case 3:
      if (zero) amx_zero_c<3>();
      return amx_chunk_tiles<3>(buf, ns, a16, 64, 512, sstep, between);
    default:
      if (zero) amx_zero_c<4>();
      return amx_chunk_tiles<4>(buf, ns, a16, 64, 512, sstep, between);
  }
}
FP8REF_GEMM_AMX_TARGET void amx_slice_store(int mt, float* P) {
  switch (mt) {
    case 1: return amx_store_c<1>(P);
    case 2: return amx_store_c<2>(P);
    case 3: return amx_store_c<3>(P);
    default: return amx_store_c<4>(P);
  }
}

// Column blocks nb0 .. nb0 + nc − 1 of acc_out [M][N], B's tiles from src. Items in the order (chunk, column block):
// with nc > 1 (only where every chunk is a whole K group) each group's A tiles stay in L1 while every block of the run
// takes its turn (per block they came from L2 again: bench/RESULTS.md, session 23); with nc = 1 a group may span
// several chunks, C accumulating across them. The rows go in slices of up to 4 row tiles (64 rows; more than one
// slice only where every chunk is a whole K group: the slices share each item's decoded tiles, C stored per slice).
// a16: A's tiles (amx_product; MT = ceil(M / 16) per K step); SB: [nc][KB][16], sb(column 16(nb0 + c) + col(j), kb);
// sat [M][KB]; buf: two chunk buffers of 4 tiles; P: 64 rows of 16 f32; acc: the accumulators, [nc][M][16].
template <class Src>
FP8REF_GEMM_AMX_TARGET void amx_range(Src& src, const GemvDecoder& d, const std::vector<AmxChunk>& chunks,
                                      const uint16_t* a16, const float* SB, const float* sat, int64_t M, int64_t KB,
                                      uint16_t* buf, float* P, float* acc, int64_t nb0, int64_t nc, int64_t N,
                                      float* acc_out) {
  const int64_t MT = cdiv(M, 16), slices = cdiv(MT, 4), items = static_cast<int64_t>(chunks.size()) * nc;
  for (int64_t i = 0; i < nc * M; ++i) _mm512_store_ps(acc + 16 * i, _mm512_setzero_ps());
  // The vector work goes between the tile unit's K steps: after step s, step s of the next item's chunk is decoded
  // (slice 0 only) and the next share of the previous slice's rows take their group product, acc = fma(P, RN32(sa·sb),
  // acc) — all of them by the last step, before this slice's C goes to P. Issued after the whole chunk's tiles (as
  // before 2026-12-05), the vector work waited for the tile unit to take them: bench/RESULTS.md, session 24.
  struct Pending {  // (its product in P)
    float* ac = nullptr;
    const float* sa = nullptr;  // sat + m0 · KB + kb
    int64_t rows = 0, done = 0;
    __m512 sb;
  } pend;
  auto add_rows = [&](int64_t upto) FP8REF_GEMM_AMX_TARGET {
    for (int64_t m = pend.done; m < std::min(upto, pend.rows); ++m) {
      const __m512 sv = _mm512_mul_ps(_mm512_set1_ps(pend.sa[m * KB]), pend.sb);
      _mm512_store_ps(pend.ac + 16 * m, _mm512_fmadd_ps(_mm512_load_ps(P + 16 * m), sv, _mm512_load_ps(pend.ac + 16 * m)));
    }
    pend.done = std::max(pend.done, std::min(upto, pend.rows));
  };
  src.column_block(nb0);
  src.chunk(d, chunks[0], buf, 0, chunks[0].steps());
  for (int64_t it = 0; it < items; ++it) {
    const AmxChunk& ch = chunks[static_cast<size_t>(it / nc)];
    const int64_t c = it % nc;
    float* ac = acc + c * M * 16;
    const __m512 sbv = _mm512_loadu_ps(SB + (c * KB + ch.kb) * 16);
    const int ns = ch.steps();
    // the next item's: the next block, or the next group's first
    const AmxChunk* nx = it + 1 < items ? &chunks[static_cast<size_t>((it + 1) / nc)] : nullptr;
    const int nns = nx ? nx->steps() : 0;
    uint16_t* nbuf = buf + 2048 * ((it + 1) % 2);
    if (nx) src.column_block(nb0 + (it + 1) % nc);
    for (int64_t r = 0; r < slices; ++r) {
      const int mt = static_cast<int>(std::min<int64_t>(4, MT - 4 * r));
      const int64_t per = cdiv(pend.rows, ns);
      auto between = [&](int s) FP8REF_GEMM_AMX_TARGET {  // (the last step decodes whatever steps the next has left)
        if (r == 0 && nx) src.chunk(d, *nx, nbuf, std::min(s, nns), s + 1 == ns ? nns : std::min(s + 1, nns));
        add_rows(per * (s + 1));
      };
      amx_slice_tiles(mt, ch.first, buf + 2048 * (it % 2), ns, a16 + ((ch.q0 / 8) * MT + 4 * r) * 512, MT * 512, between);
      if (!ch.last) continue;
      amx_slice_store(mt, P);
      pend = {ac + 16 * 64 * r, sat + 64 * r * KB + ch.kb, std::min<int64_t>(64, M - 64 * r), 0, sbv};
    }
  }
  add_rows(pend.rows);
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t n0 = (nb0 + c) * 16;
    const __mmask16 mk = N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
    for (int64_t m = 0; m < M; ++m) {
      __m512 v = _mm512_load_ps(acc + (c * M + m) * 16);
      if constexpr (Src::kSwapped) v = _mm512_shuffle_f32x4(v, v, 0xD8);  // lanes 0, 2, 1, 3: back in column order
      _mm512_mask_storeu_ps(acc_out + m * N + n0, mk, v);
    }
  }
}

FP8REF_GEMM_AMX_TARGET void amx_config() {
  TileCfg cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  // (GCC 12 does not see ldtilecfg read its operand and drops the stores above: the barrier keeps them)
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
FP8REF_GEMM_AMX_TARGET void amx_release() { _tile_release(); }

// acc = the f32 accumulators [M][N] (M <= amx_packed_max_m / amx_max_m) on AMX, B's tiles from src (PackedB or RowsB).
template <class Src>
void amx_product(const ScaledMmSpec& spec, const GemmShape& g, int64_t G, const Scales& sc, const uint8_t* a, Src src,
                 float* acc) {
  const int64_t M = g.M, N = g.N, K = g.K, NB = cdiv(N, kB16), KQ = cdiv(K, 4), KB = cdiv(K, G), GQ = cdiv(G, 4);
  const int64_t K32 = round_up(KQ * 4, 32), MT = cdiv(M, 16);
  // A as its tiles, each 16 rows × 32 K contiguous (1 KiB, read with a 64-byte stride): tile (s, t) — K step s, rows
  // 16t.. — at a16 + (s · MT + t) · 512 (rows past M and K zero)
  std::vector<uint16_t> a16(static_cast<size_t>(16 * MT * K32), uint16_t{0});
  {
    std::vector<uint16_t> row(static_cast<size_t>(K32), uint16_t{0});
    for (int64_t m = 0; m < M; ++m) {
      HWY_DYNAMIC_DISPATCH(FastCodesToBf16)(spec.fa == Format::e5m2, a + m * K, row.data(), static_cast<size_t>(K));
      for (int64_t s = 0; s < K32 / 32; ++s)
        std::memcpy(a16.data() + (s * MT * 16 + m) * 32, row.data() + 32 * s, 64);
    }
  }
  const std::vector<float> sat = a_scale_rows(sc, M, KB);
  const std::vector<AmxChunk> chunks = amx_chunks(KQ, GQ, KB);
  const GemvTables tb(spec.fb);
  // a packed B whose chunks are whole K groups (G <= 128): column blocks in runs of kAmxRun with the K groups outside
  // (amx_range)
  const bool groups_outside = Src::kGroupsOutside &&
                              std::all_of(chunks.begin(), chunks.end(), [](const AmxChunk& c) { return c.first && c.last; });
  const int64_t run = groups_outside ? kAmxRun : 1;
  // per thread: two chunk buffers (8 KiB), P (4 KiB), the accumulators (run · M · 64 bytes), 64-byte aligned
  const size_t per = static_cast<size_t>(8192 + 4096 + 64 * M * run);
  const int nt = omp_get_max_threads();
  const std::unique_ptr<uint8_t, void (*)(void*)> scratch(static_cast<uint8_t*>(std::aligned_alloc(64, per * nt)), &std::free);
  if (!scratch) throw std::bad_alloc();
#pragma omp parallel num_threads(nt) firstprivate(src) if (N * K * M > (int64_t{1} << 18))
  {
    amx_config();
    const GemvDecoder d(tb);
    std::vector<float> SB(static_cast<size_t>(run * KB * kB16));
    uint8_t* mine = scratch.get() + per * static_cast<size_t>(omp_get_thread_num());
    uint16_t* buf = reinterpret_cast<uint16_t*>(mine);
    float* P = reinterpret_cast<float*>(mine + 8192);
    float* ac = P + 4 * 256;  // (P: one slice's 64 rows)
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < cdiv(NB, run); ++w) {
      const int64_t nb0 = w * run, nc = std::min(run, NB - nb0);
      for (int64_t c = 0; c < nc; ++c)  // SB[(c·KB + kb)·16 + j] = sb(column 16(nb0 + c) + col(j), kb)
        for (int j = 0; j < kB16; ++j) {
          const int col = Src::kSwapped ? (j / 4 == 1 ? j + 4 : j / 4 == 2 ? j - 4 : j) : j;  // col(j)
          int64_t step;
          const float* br = sc.b_row(std::min((nb0 + c) * kB16 + col, N - 1), &step);
          for (int64_t kb = 0; kb < KB; ++kb) SB[static_cast<size_t>((c * KB + kb) * kB16 + j)] = br[kb * step];
        }
      amx_range(src, d, chunks, a16.data(), SB.data(), sat.data(), M, KB, buf, P, ac, nb0, nc, N, acc);
    }
    amx_release();
  }
}

uint16_t f16_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return static_cast<uint16_t>(ref::narrow(Format::f32, b, Format::f16));
}

}  // namespace

// M up to this on a packed B's vdpbf16ps kernel (where the tiles take a product, run_fast allows amx_packed_max_m):
// 64 for gemm16_fast (Zen 4, 2 threads, [M, 7168] x [7168, 7168] blockwise, packed: M = 16 13.3 -> 5.4 ms, 32 17.1 ->
// 10.1, 64 24.4 -> 18.4, 128 40.6 -> 35.5 but [128, 2048] 11.9 -> 13.2, 256 even: bench/RESULTS.md, session 22) —
// but 12 on an AMX CPU (the tiles switched off; a Sapphire Rapids-class Xeon, the same shapes, oneDNN's tile path
// -> gemm16_fast: M = 1 9.9 -> 2.0 ms, 8 10.0 -> 6.0, 12 9.7 -> 8.9, but 14 9.8 -> 10.1, 16 10.5 -> 11.3, 32 12.0 ->
// 21.5: bench/RESULTS.md, session 23).
namespace {
std::atomic<int64_t> g_gemm16_max_m{-1};  // (set_gemm16_max_m_for_test; -1: the CPU's default)
}  // namespace
int64_t gemm16_max_m() {
  const int64_t m = g_gemm16_max_m.load(std::memory_order_relaxed);
  return m >= 0 ? m : attn::cpu::fast_attention_has_amx() ? 12 : 64;
}
void set_gemm16_max_m_for_test(int64_t m) { g_gemm16_max_m.store(m < 0 ? -1 : m, std::memory_order_relaxed); }
void set_gemm16_amx_for_test(bool on) { g_gemm_amx_off.store(!on, std::memory_order_relaxed); }

void fp8_to_bf16(Format f, const uint8_t* codes, uint16_t* out, size_t n) {
  if (f != Format::e4m3fn && f != Format::e5m2)
    throw InputError(std::string("fp8_to_bf16: e4m3fn or e5m2, not ") + format_name(f));
  HWY_DYNAMIC_DISPATCH(FastCodesToBf16)(f == Format::e5m2, codes, out, n);
}

FastGemmB::FastGemmB(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* bt)
    : N_(g.N), K_(g.K), G_(k_group(spec, g.K)), Nt_(tile_n_for(g.N)) {
  check_scaled_mm(spec, g);
  data_ = pack(spec.fb, bt, N_, K_, Nt_, G_);
  // (only where the packed small-M kernel can run: elsewhere a FastGemmB holds the bf16 packing alone)
  if (cpu_has_avx512bf16()) codes16_ = pack_b16(bt, N_, K_);
}

namespace {

// The epilogue of one output row's columns n0..n0+cols-1 from their f32 accumulators ar (src/cpu/gemm_fast.h step 4).
void store_row(const ScaledMmSpec& spec, const float* ar, const float* bias, int64_t m, int64_t n0, int64_t cols,
               int64_t N, void* out) {
  const int mode = spec.bias == BiasMode::f32 ? 1 : spec.bias == BiasMode::out ? 2 : 0;
  const float* br = bias ? bias + n0 : nullptr;
  const size_t off = static_cast<size_t>(m * N + n0);
  if (spec.out == Format::f16) {
    uint16_t* o = static_cast<uint16_t*>(out) + off;
    for (int64_t j = 0; j < cols; ++j) {
      if (mode == 1) o[j] = f16_bits(ar[j] + br[j]);
      else if (mode == 2) {
        const uint16_t h1 = f16_bits(ar[j]), h2 = f16_bits(br[j]);
        const uint32_t fx = static_cast<uint32_t>(ref::narrow(Format::f16, h1, Format::f32)),
                       fy = static_cast<uint32_t>(ref::narrow(Format::f16, h2, Format::f32));
        float vx, vy;
        std::memcpy(&vx, &fx, 4);
        std::memcpy(&vy, &fy, 4);
        o[j] = f16_bits(vx + vy);
      } else o[j] = f16_bits(ar[j]);
    }
  } else {
    void* dst = spec.out == Format::bf16 ? static_cast<void*>(static_cast<uint16_t*>(out) + off)
                                         : static_cast<void*>(static_cast<float*>(out) + off);
    HWY_DYNAMIC_DISPATCH(FastStoreRow)(ar, br, mode, spec.out == Format::bf16, dst, static_cast<size_t>(cols));
  }
}

// The tile loop. B comes packed (b_packed: [tiles_n][KB][Nt][G]) or as codes (bt), then each thread converts one
// n-tile of B at a time into its own buffer and runs every m-tile against it (no full bf16 copy of B).
void run_fast(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint16_t* b_packed,
              const uint8_t* bt, const float* sa, const float* sb, const float* bias, void* out,
              const uint8_t* b16 = nullptr) {
  if ((spec.bias != BiasMode::none) != (bias != nullptr))
    throw InputError("fast scaled_mm: a bias is given iff the spec has a bias mode");
  const int64_t M = g.M, N = g.N, K = g.K, G = k_group(spec, g.K), Nt = tile_n_for(N);
  if (M == 0 || N == 0) return;
  const int64_t KB = K == 0 ? 0 : cdiv(K, G);
  const Scales sc{spec.scaling, sa, sb, KB, spec.cublas_sb_stride ? round_up(KB, 4) : KB};
  // small M: B as codes — a packed B on gemm16_fast or the tiles, B's rows on gemv_fast or the tiles (RowsB)
  const int64_t packed_max_m = gemm16_amx_usable() ? std::max(gemm16_max_m(), amx_packed_max_m(G)) : gemm16_max_m();
  if ((b16 && gemv_usable(spec, g, packed_max_m)) || (bt && gemv_usable(spec, g, rows_max_m(G)))) {
    std::vector<float> acc(static_cast<size_t>(M * N));
    const bool amx = gemm16_amx_usable() && M >= (b16 ? kAmxMinM : kAmxRowsMinM) &&
                     M <= (b16 ? amx_packed_max_m(G) : amx_max_m(G));
    if (b16 && amx) amx_product(spec, g, G, sc, a, PackedB{b16, cdiv(K, 4)}, acc.data());
    else if (b16) gemm16_fast(spec, g, G, sc, a, b16, acc.data());
    else if (amx) amx_product(spec, g, G, sc, a, RowsB{bt, N, K}, acc.data());
    else gemv_fast(spec, g, G, sc, a, bt, acc.data());
    for (int64_t m = 0; m < M; ++m) store_row(spec, acc.data() + m * N, bias, m, 0, N, N, out);
    return;
  }
  const int64_t Mt = std::min(kMaxTileM, round_up(M, 16));
  const int64_t tiles_m = cdiv(M, Mt), tiles_n = cdiv(N, Nt);
  const std::vector<uint16_t> ap = pack(spec.fa, a, M, K, Mt, G);

  using dnnl::memory;
  const int64_t KC = std::max<int64_t>(1, std::min<int64_t>(KB, kPartialBytes / (Mt * Nt * 4)));
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  // Operands in bf16; on CPUs where oneDNN has no bf16 matmul (oneDNN 2.x without AVX-512, e.g. AMD Zen 3) in f32:
  // each chunk's bf16 operands widened (exact) right before its call. The same arithmetic either way: the products
  // of bf16 values are exact in f32, the sums f32 (the bound in src/cpu/gemm_fast.h holds for both).
  bool widen = false;
  auto descs = [&](int64_t kc) {
    const memory::data_type t = widen ? memory::data_type::f32 : memory::data_type::bf16;
    return std::array<memory::desc, 3>{memory::desc({kc, Mt, G}, t, memory::format_tag::abc),
                                       memory::desc({kc, G, Nt}, t, memory::format_tag::acb),  // [kc][Nt][G] in memory
                                       memory::desc({kc, Mt, Nt}, memory::data_type::f32, memory::format_tag::abc)};
  };
  auto make = [&](int64_t kc) {
    const auto d = descs(kc);
    // User scratchpads: oneDNN's own (global) scratchpad is not safe for concurrent executes from our threads.
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(d[0], d[1], d[2]), attr, eng);
  };
  dnnl::matmul::primitive_desc pd_full, pd_tail;
  dnnl::matmul mm_full, mm_tail;
  size_t scratch_bytes = 0;
  if (KB > 0) {
    try {
      pd_full = make(KC);
    } catch (const dnnl::error&) {
      widen = true;
      pd_full = make(KC);
    }
    mm_full = dnnl::matmul(pd_full);
    scratch_bytes = pd_full.scratchpad_desc().get_size();
  }
  if (KB % KC) {
    pd_tail = make(KB % KC);
    mm_tail = dnnl::matmul(pd_tail);
    scratch_bytes = std::max(scratch_bytes, pd_tail.scratchpad_desc().get_size());
  }

  const size_t tile_elems = static_cast<size_t>(Mt * Nt);
  std::exception_ptr error;
  // Threads only where there is enough work (small problems lose more to the fork than they gain).
#pragma omp parallel if (tiles_m * tiles_n > 1 && M * N * std::max<int64_t>(K, 1) > (int64_t{1} << 24))
  {
    // oneDNN runs single-threaded inside each call (nthreads-var is this implicit task's own), so every output's
    // summation order depends on M, N, K and the spec only: results do not change with the thread count.
    omp_set_num_threads(1);
    dnnl::stream st(eng);
    std::vector<float> part(static_cast<size_t>(KC) * tile_elems), acc(tile_elems);
    std::vector<float> sbv(static_cast<size_t>(KC * Nt)), sav(static_cast<size_t>(KC));
    std::vector<uint8_t> scratch(scratch_bytes + 64);
    std::vector<uint16_t> btile(b_packed ? 0 : static_cast<size_t>(KB * Nt * G));
    std::vector<float> a32(widen ? static_cast<size_t>(KC * Mt * G) : 0), b32(widen ? static_cast<size_t>(KC * Nt * G) : 0);
    auto operand = [&](const uint16_t* p, std::vector<float>& w, size_t n) -> void* {
      if (!widen) return const_cast<uint16_t*>(p);
      for (size_t i = 0; i < n; ++i) w[i] = f32_from_bits(static_cast<uint32_t>(p[i]) << 16);
      return w.data();
    };
    auto compute_tile = [&](int64_t tm, int64_t tn, const uint16_t* bp) {
      const int64_t m0 = tm * Mt, n0 = tn * Nt, rows = std::min(Mt, M - m0), cols = std::min(Nt, N - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c0 = 0; c0 < KB; c0 += KC) {
        const int64_t kc = std::min(KC, KB - c0);
        const auto d = descs(kc);
        memory ms(d[0], eng, operand(ap.data() + (tm * KB + c0) * Mt * G, a32, static_cast<size_t>(kc * Mt * G)));
        memory mw(d[1], eng, operand(bp + c0 * Nt * G, b32, static_cast<size_t>(kc * Nt * G)));
        memory md(d[2], eng, part.data());
        const dnnl::matmul::primitive_desc& pd = kc == KC ? pd_full : pd_tail;
        memory mscr(pd.scratchpad_desc(), eng, scratch.data());
        (kc == KC ? mm_full : mm_tail)
            .execute(st, {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mscr}});
        st.wait();
        for (int64_t q = 0; q < kc; ++q)
          for (int64_t j = 0; j < cols; ++j) sbv[static_cast<size_t>(q * Nt + j)] = sc.b(n0 + j, c0 + q);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t q = 0; q < kc; ++q) sav[static_cast<size_t>(q)] = sc.a(m0 + i, c0 + q);
          HWY_DYNAMIC_DISPATCH(FastAccumulateRow)(part.data() + i * Nt, tile_elems, sbv.data(), static_cast<size_t>(Nt),
                                                  sav.data(), static_cast<size_t>(kc), acc.data() + i * Nt,
                                                  static_cast<size_t>(cols));
        }
      }
      for (int64_t i = 0; i < rows; ++i) store_row(spec, acc.data() + i * Nt, bias, m0 + i, n0, cols, N, out);
    };
    // Work items: one output tile (B packed), or one n-tile of B converted here and every m-tile against it.
    const int64_t work = b_packed ? tiles_m * tiles_n : tiles_n;
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t tn = b_packed ? w / tiles_m : w;
      const int64_t tm_begin = b_packed ? w % tiles_m : 0, tm_end = b_packed ? tm_begin + 1 : tiles_m;
      const uint16_t* bp = b_packed ? b_packed + tn * KB * Nt * G : btile.data();
      try {  // nothing may leave an OpenMP region by an exception: keep the first, rethrow after it
        if (!b_packed) pack_tile(spec.fb, bt, N, K, tn * Nt, Nt, G, btile.data());
        for (int64_t tm = tm_begin; tm < tm_end; ++tm) compute_tile(tm, tn, bp);
      } catch (...) {
#pragma omp critical(fp8ref_gemm_fast_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void scaled_mm_fast(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                    const float* sa, const float* sb, const float* bias, void* out) {
  check_scaled_mm_operands(spec, g, a, bt, sa, sb, bias, out);
  // B converted tile by tile inside the loop when there are enough n-tiles to keep every thread busy (or read as codes
  // on the small-M path); else packed once up front (parallel over all output tiles).
  if (cdiv(g.N, tile_n_for(g.N)) >= omp_get_max_threads() || gemv_usable(spec, g, rows_max_m(k_group(spec, g.K)))) {
    run_fast(spec, g, a, nullptr, bt, sa, sb, bias, out);
  } else {
    const FastGemmB b(spec, g, bt);
    run_fast(spec, g, a, b.data(), nullptr, sa, sb, bias, out);
  }
}

void scaled_mm_fast(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const FastGemmB& b,
                    const float* sa, const float* sb, const float* bias, void* out) {
  check_scaled_mm_operands(spec, g, a, reinterpret_cast<const uint8_t*>(&b), sa, sb, bias, out);
  if (b.N() != g.N || b.K() != g.K || b.group() != k_group(spec, g.K) || b.tile_n() != tile_n_for(g.N))
    throw InputError("fast scaled_mm: the packed B was made for another N, K or scaling");
  run_fast(spec, g, a, b.data(), nullptr, sa, sb, bias, out, b.codes16());
}

double fast_accumulation_constant(const ScaledMmSpec& spec, int64_t K) {
  const double u = std::ldexp(1.0, -24), up = std::ldexp(1.0, -23);
  const int64_t G = k_group(spec, K), L = std::min(G, std::max<int64_t>(K, 1)), KB = K == 0 ? 1 : cdiv(K, G);
  auto gamma = [](double n, double uu) { return n * uu / (1 - n * uu); };
  return (1 + u) * (1 + u) * (1 + gamma(static_cast<double>(L - 1), up)) * (1 + gamma(static_cast<double>(KB), u)) - 1;
}

void scaled_mm_fast_bound(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                          const float* sa, const float* sb, const float* bias, double* bound) {
  check_scaled_mm(spec, g);
  const int64_t M = g.M, N = g.N, K = g.K;
  if (M == 0 || N == 0) return;
  // T̂ = fast(|A|, |B|, |sa|, |sb|), f32, no bias.
  std::vector<uint8_t> aa(a, a + M * K), ba(bt, bt + N * K);
  for (uint8_t& c : aa) c &= 0x7F;
  for (uint8_t& c : ba) c &= 0x7F;
  const size_t nsa = gemm_sa_count(spec, g), nsb = gemm_sb_count(spec, g);
  std::vector<float> saa(sa, sa + nsa), sba(sb, sb + nsb);
  float min_sa = std::numeric_limits<float>::infinity(), min_sb = min_sa;
  for (float& s : saa) {
    s = std::fabs(s);
    if (s > 0) min_sa = std::min(min_sa, s);
  }
  for (float& s : sba) {
    s = std::fabs(s);
    if (s > 0) min_sb = std::min(min_sb, s);
  }
  ScaledMmSpec s2 = spec;
  s2.out = Format::f32;
  s2.bias = BiasMode::none;
  std::vector<float> t(static_cast<size_t>(M * N));
  scaled_mm_fast(s2, g, aa.data(), ba.data(), saa.data(), sba.data(), nullptr, t.data());
  const double c = fast_accumulation_constant(spec, K);
  // Scale products below the f32 normal range lose relative accuracy: then also add 2^-148·(Σ|a·b| + KB) (absolute).
  std::vector<float> s0;
  const int64_t KB = K == 0 ? 0 : cdiv(K, k_group(spec, K));
  if (static_cast<double>(min_sa) * static_cast<double>(min_sb) < std::ldexp(1.0, -125)) {
    ScaledMmSpec s3 = s2;
    s3.scaling = GemmScaling::tensor;
    s3.cublas_sb_stride = false;
    const float one = 1.0f;
    s0.resize(t.size());
    scaled_mm_fast(s3, g, aa.data(), ba.data(), &one, &one, nullptr, s0.data());
  }
  const double u = std::ldexp(1.0, -24);
  const double u_out = spec.out == Format::bf16 ? std::ldexp(1.0, -8) : spec.out == Format::f16 ? std::ldexp(1.0, -11) : u;
  const double eta = spec.out == Format::bf16 ? std::ldexp(1.0, -134) : spec.out == Format::f16 ? std::ldexp(1.0, -25)
                                                                                                : std::ldexp(1.0, -150);
  const double out_max = format_info(spec.out).max_value;
  const double inf = std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static) if (M * N > (int64_t{1} << 16))
  for (int64_t i = 0; i < M * N; ++i) {
    const double that = t[static_cast<size_t>(i)];
    if (!std::isfinite(that)) {
      bound[i] = inf;
      continue;
    }
    // Roundings below f32's normal range are absolute, not relative: each of the KB scaled partials P̂·ŵ (and its
    // accumulation) may be off by up to 2^-150 more, and T̂ (fast itself on the magnitudes) may fall short of T by
    // as much.
    const double under = std::ldexp(1.0, -149) * static_cast<double>(KB);
    const double T = (that + under) / (1 - c);
    double E = c * T + under;
    if (!s0.empty()) E += std::ldexp(1.0, -148) * (static_cast<double>(s0[static_cast<size_t>(i)]) / (1 - c) + KB);
    const double A = T + E, bb = bias ? std::fabs(static_cast<double>(bias[i % N])) : 0.0;
    double B;
    switch (spec.bias) {
      case BiasMode::f32: B = E + u * (A + bb) + u_out * (A + bb) * (1 + u) + eta; break;
      case BiasMode::out:
        B = E + u_out * (A + bb) + 2 * eta + (u_out + u) * ((A + bb) * (1 + u_out) + 2 * eta) + eta;
        break;
      default: B = E + u_out * A + eta; break;
    }
    // No claim where any rounding step could reach the output format's overflow (or f32's).
    if ((A + bb) * (1 + u_out) * (1 + u) >= std::min(out_max, static_cast<double>(std::numeric_limits<float>::max())))
      B = inf;
    bound[i] = B * (1 + std::ldexp(1.0, -40));
  }
}

}  // namespace cpu
}  // namespace fp8ref
#endif  // HWY_ONCE
