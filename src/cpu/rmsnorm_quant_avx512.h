// fp8ref CPU backend — rmsnorm_quant's bf16 rows on CPUs with AVX-512 BF16 and VBMI (AMD Zen 4, Intel Sapphire
// Rapids and later): steps 5–9 as two passes over the row with y held as packed bf16 (src/cpu/rmsnorm_quant_avx512.cc)
// for weight modes that round y to bf16 (dtype-twice: vLLM; dtype-once: DeepSeek); for weight=f32 (aiter) with
// x*(1/s), two passes that compute y from x each time (no residual). The e4m3fn cast in lanes only; every other row
// goes the Highway way (src/cpu/rmsnorm_quant_cpu.cc), and so does any row these passes decline.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fp8ref::cpu {

// The CPU and OS provide AVX-512 F/BW/DQ/VL/VBMI and AVX512_BF16 (CPUID, XCR0). Shared with the attention kernels.
bool cpu_has_avx512bf16();

// cpu_has_avx512bf16() and not switched off: whether the kernels below (and quant_cpu.cc's use of them) run.
bool avx512bf16_kernels();
// Whether the SIMD target Highway dispatches to is an x86 AVX-512 one (src/cpu/convert_cpu.cc): the kernels below run
// only there, so a caller (or a test) that restricts Highway to AVX2 gets no AVX-512 code at all.
bool simd_target_is_avx512();
// For cpu::for_each_simd_target only (tests: the Highway kernels these replace stay covered on such CPUs).
void set_avx512bf16_kernels_for_test(bool on);

namespace rq512 {

// How the row's z arrives: bf16 x (z = x widened), bf16 x + bf16 residual summed in f32, or an f32 row.
enum class ZKind : uint8_t { bf16, sum_f32, f32 };

// The byte indices that gather 64 codes into a given output order (pass B's Coder; a function of the order alone,
// so built once per plan rather than per row: make_code_order).
struct CodeOrder {
  alignas(64) uint8_t ia[64] = {}, ib[64] = {}, is[64] = {};
  uint64_t kab = 0;  // output bytes taken from the second pair of code vectors
};
// Per-thread state for one call: the weights in the lane order of the passes, and the byte order that puts the codes
// back in element order. mode: 1 = y = bf16(bf16(z·r)·w) (dtype-twice), 2 = y = bf16(z·r·w) (dtype-once), 0 = y =
// RN(RN(z·r)·w) (weight=f32: amax_pass and wquant_pass, bf16 z only).
struct Plan {
  int mode = 0;
  ZKind zkind = ZKind::bf16;
  // mode 0: K floats |w|, per 32-element chunk those of lane vector 0, then those of vector 1
  const float* wperm = nullptr;
  // modes 1, 2: the weights as bf16 pairs, per 32-element chunk dword i = (lane i of vector 0, lane i of vector 1):
  // widened in registers as z is, half the L1 footprint of f32 weights (the norm pass's x, w and y of a 7168-value
  // row then fit a 48 KiB L1d: bench_rmsnorm_passes 0.463 -> 0.430 cycles per value, session 25). In wperm's memory.
  const uint16_t* wperm16 = nullptr;
  float wmin = 0;                // the smallest nonzero |w| (+Inf: none)
  uint32_t wmax_bits = 0;        // the largest |w|'s f32 bits (NaN: above +Inf's)
  // The caller's, after make_plan: every y the flush could change (|y| <= 2^-125·max(1, |w|)) gives code ±0 with
  // the sign kept — the quant spec's guard keeps every scale far above such y (flush_subnormal_harmless) — so norm_pass
  // needs no row guard (no smallest |z|): a flushed bf16(z·r) or product is ±0 where the exact one is tiny.
  bool flush_ok = false;
  const uint8_t* wsign = nullptr;  // mode 0: K bytes in element order, 0x80 where w's sign bit is set (null: none is)
  alignas(64) uint8_t idxb[64] = {};
  CodeOrder order;  // make_code_order(idxb)
};
// Fills plan (wperm: K floats to write, from the f32-widened weights wf; modes 1, 2: bf16-valued) for K % 32 == 0.
// Mode 0 stores |w| in wperm, and the signs in wsign (K bytes to write) when a weight has its sign bit set; modes 1
// and 2 the bf16 pairs of wperm16 in wperm's first 2K bytes.
void make_plan(int mode, ZKind zkind, const float* wf, size_t K, float* wperm, Plan* plan, uint8_t* wsign = nullptr);
// Whether, under a guard whose scales are never below s_min (> 0: min-scale M, or amax-floor E / fp8 max), a y the
// flush changes cannot reach a nonzero code: |y| <= 2^-125·max(1, max |w|) and every q = y/s (or y·RN(1/s)) is then
// below 2^-11, half the smallest FP8 subnormal and less — ±0 with y's sign, which vcvtne2ps2bf16 keeps; the group
// maxima such y enter stay under the guard's amax (the scales do not change). Conservative: s_min >= 2^-60, |w| <= 2^50.
bool flush_subnormal_harmless(const Plan& plan, double s_min);

// Pass A: y (K bf16 values, packed in the plan's lane order) and max |y| per group of G into gmax (G % 32 == 0,
// K % G == 0). z from x (and res) or zf per the plan's kind. Returns false when the row must go the Highway way: a
// nonzero z·r or product below the f32 normal range (vcvtne2ps2bf16 flushes subnormals; not checked with
// plan.flush_ok) or a group with a NaN/Inf y.
// zmin1 (bf16 z only; below 0x10000): min((|x| − 1) mod 2^16) over x's words, computed by the caller already (the
// cub partials pass, where it costs less) — the pass then leaves it out. pf_x / pf_r (null: none): a later row's
// bf16 inputs (K words each); the pass prefetches the second half of each into L2, one 64-byte line of each per 64
// values (quant_pass takes the first half).
bool norm_pass(const Plan& plan, const uint16_t* x, const uint16_t* res, const float* zf, size_t K, size_t G, float r,
               uint16_t* y, float* gmax, uint32_t zmin1 = 0x10000, const uint16_t* pf_x = nullptr,
               const uint16_t* pf_r = nullptr);

// Pass B: the codes of y per group g: q = RN(y / gsv[g]) by Markstein's correction with grb[g] = RN(1/gsv[g]) (div)
// or RN(y · gsv[g]) (!div), clamped to ±mx (<= 448), cast RNE to e4m3fn. G % 64 == 0, every group fast (finite y, and
// for div gsv[g] in [2^-60, 2^60] with amax <= gsv[g]·2^60: fp8_lanes-inl.h MarksteinDiv1's conditions).
// stream: q by non-temporal stores (whole cache lines; the partial lines at the ends by masked stores), for outputs
// far larger than the caches; the caller fences (_mm_sfence) before the codes are read. pf_x / pf_r (null: none): a
// later row's bf16 inputs (K words each); the pass prefetches the first half of each into L2, one 64-byte line of
// each per 64 values (norm_pass takes the second half): the row's reads spread over both passes.
void quant_pass(const Plan& plan, const uint16_t* y, size_t K, size_t G, const float* gsv, const float* grb, bool div,
                float mx, uint8_t* q, bool stream, const uint16_t* pf_x = nullptr, const uint16_t* pf_r = nullptr);
// The group quant's fast bf16 chunks (src/cpu/quant_cpu.cc ElemFastT, every group "fast": FastGroups) with the pass
// B arithmetic on x itself: the codes of x[0, n) into q, groups of G (G % 64 == 0, n % G == 0), group g's constants
// a[g], b[g]; op 0: RN(x / a) (b = RN(1/a), Markstein's one correction), 1: RN(x · a), 2: RN(RN(x · b) · a); the
// clamp to ±bound (<= 448). ahead: x + ahead prefetched into L2. nx (null: none): the next chunk at the same
// offsets, its group maxima (f32 bits of max |x|) into namax; returns whether they are all finite (else the caller
// scans it).
bool quant_bf16(const uint16_t* x, size_t n, size_t G, const float* a, const float* b, int op, float bound, uint8_t* q,
                const uint16_t* nx, uint32_t* namax, size_t ahead);
// Mode 0 (weight=f32), bf16 z = x, G % 64 == 0, K % G == 0. Pass A: max |y| per group into gmax,
// y = RN(RN(z·r)·w) (r > 0); false when a group's max is Inf or NaN (the row goes the Highway way). Pass B: y again,
// the codes of q = RN(y · ga[g]) (x*(1/s): ga[g] = RN(1/s), finite) clamped to ±mx (<= 448), cast RNE to e4m3fn, in
// element order; stream as quant_pass's. pf_x (null: none): a later row's bf16 x (K words), prefetched into L2 one
// line per 64 values, its first half by pass A and its second by pass B.
bool amax_pass(const Plan& plan, const uint16_t* x, size_t K, size_t G, float r, float* gmax,
               const uint16_t* pf_x = nullptr);
void wquant_pass(const Plan& plan, const uint16_t* x, size_t K, size_t G, float r, const float* ga, float mx,
                 uint8_t* q, bool stream, const uint16_t* pf_x = nullptr);
// _mm_sfence: the non-temporal stores of this thread ordered before its later stores (and the end of a parallel region).
void fence();

}  // namespace rq512
}  // namespace fp8ref::cpu
