// fp8ref — quantization to FP8 with per-tensor / per-row / per-column / per-group / per-block / MX scales, and
// dequantization, under explicit, named conventions (../shared/NUMERICS.md §3–4, research/quant-conventions.md).
//
// A QuantSpec states every decision a quantization makes; a *quant convention* is a named preset of those fields
// that reproduces one real implementation rounding by rounding (the list is quant_conventions(); each preset cites
// the source it follows in src/core/quant_conventions.cc). Individual fields can be overridden by name
// (apply_quant_override: the descriptor keys and CLI flags of the same names).
//
// ---- The data and the scales ------------------------------------------------------------------------------------
// x has rank r >= 1 and is viewed as [B, M, K]: K = the last dimension, M = the one before it (1 for rank 1), B = the
// product of the others. Every scale covers one *group* of elements; the scales form a row-major tensor of rank r,
// their *logical shape* (below). How they are stored is the field scale-layout: row-major (the logical tensor),
// col-major, tma-aligned or packed-ue8m0 (include/fp8ref/scale_layout.h: the transforms, their sources, the pads);
// every computation uses the logical scales, the layout applies to the scales written and read:
//   granularity   one scale per                                  scale shape (data [..., M, K])
//   tensor        the whole tensor                               [1, ..., 1]
//   row           (b, m): one token / row                        [..., M, 1]
//   col           k: one channel, over all leading dims          [1, ..., 1, K]
//   group:G       (b, m, k / G): 1×G along the last dim          [..., M, ceil(K/G)]          (G >= 1; kernels: 16..256)
//   block:BmxBk   (b, m / Bm, k / Bk)                            [..., ceil(M/Bm), ceil(K/Bk)] (rank >= 2)
//   mx:32         group:32 with the OCP MX v1.0 scale rule (scale-round=mx-floor)
// "col" is per output channel of a weight stored [K, N] (torch._scaled_mm's mat2); for a weight stored [N, K]
// per-channel scales are `row`.
//
// Tails (K % G != 0, or M % Bm / K % Bk for blocks): with tail=error (the default of most conventions — the
// kernels assert divisibility) quantize throws InputError naming the dimension. With tail=partial the last group
// along that dimension holds only the elements present; its amax is over them. Because |x| >= 0, this equals
// padding with zeros — what DeepGEMM's per_token_cast_to_fp8 (pads K to 128) and masked Triton loads do — for
// every guard and NaN policy below. q always has exactly x's shape.
// Empty tensors: q is empty; the scale tensor has the logical shape above (possibly with zero extent). A group
// that exists but holds no element (tensor/row/col granularity over an empty extent) has amax = +0, like an
// all-zero group.
//
// ---- Dynamic quantization of one group (the contract; each step a field of QuantSpec) ----------------------------
// Arithmetic is IEEE binary32 with round-to-nearest-even (the CUDA C++ non-fast-math and torch model) and the GPU
// NaN model: every arithmetic result that is NaN is the canonical +NaN 0x7FFFFFFF (NVIDIA's f32 ops drop
// payloads and sign). Every `/` below is the division of the field div: `ieee` RN(a/b) (CUDA C++, torch), or
// `triton-nv` Triton's div.full.f32 on NVIDIA, RN(a · MUFU.RCP(b)) with range scaling (include/fp8ref/triton_div.h:
// bit-exact from a reciprocal table captured on the H200).
//   1. y = f32(x) (exact widening of bf16/f16/f32).
//   2. amax = max |y| over the group, from +0. amax-nan=ignore: NaN elements are skipped (CUDA fmaxf; Triton
//      tl.max = maxnum, seen on the H200); propagate: any NaN makes amax NaN (torch .amax()).
//   3. guard amax-floor:E: amax = max(amax, E) (E rounded to f32; with amax-nan=ignore fmaxf semantics, with
//      propagate a NaN amax stays NaN — torch.clamp).
//   4. scale s (f32), scale-formula: `amax/max` = RN(amax / max); `amax*(1/max)` = RN(amax · RN(1/max));
//      `exact` = the exact quotient amax/max, rounded once to the scale dtype (step 6).
//   5. guard min-scale:M: s = max(s, M) (same NaN rule as 3).
//   6. scale dtype / scale-round: f32 (rne: s as is); bf16, f16 (rne: RN of s to that type — IEEE overflow to Inf,
//      underflow to subnormal/0); ue8m0 with
//        pow2-ceil        code = exp_field(s) + (mantissa(s) != 0), sign ignored; past 254 -> 0xFF (NaN)
//                         (sglang, vLLM; = exp2(ceil(log2 s)) except for f32-subnormal s)
//        pow2-ceil-clamp  the same code clamped to [1, 254], NaN and Inf included (DeepGEMM ceil_to_ue8m0)
//        mx-floor         code = floor(log2 amax) - emax_elem + 127 from amax (not s), clipped below to 0x00
//                         (2^-127); amax = 0 -> 0x00; NaN/Inf amax -> 0xFF (OCP MX v1.0 §6.3; emax_elem = log2 of
//                         the largest power of two of the element format: 8 e4m3fn, 15 e5m2)
//      and with scale-store=f32 the ue8m0 scale is held and written as an f32 power of two, as vLLM, the Triton
//      kernels and DeepGEMM's torch reference do: code 0 -> +0.0, 1..254 -> 2^(code-127), 0xFF -> +Inf when s
//      was ±Inf, else NaN. With scale-store=native it is an E8M0 code: 0 -> 2^-127, 0xFF -> NaN.
//      The scale *value* sv used below is the stored one.
//   7. per element, formula: `x/s` v = RN(y / sv); `x*(1/s)` v = RN(y · RN(1/sv)); `x*(max/amax)`
//      v = RN(y · RN(max / amax)); `x*(max*rcp(amax))` v = RN(y · RN(max · RN(1/amax))) (the last two use the
//      guarded amax and need f32 scales); `exact`: v = y/sv exactly (no f32 rounding), except that y = ±0 with
//      sv = 0 (an all-zero group without guard) gives ±0. With ue8m0 scales of code c (the E8M0 code, or the
//      exponent field of an f32-held one): `x*rcp-bits(s)` v = RN(y · R), R = the f32 with bits (254 − c) << 23
//      (2^(127−c) for c <= 253; c = 254 -> +0; c = 255 -> −Inf: sgl-kernel fast_pow2(-e), sglang JIT
//      inv_scale_ue8m0); `x*rcp-bits(s)@in` the same multiply done in the 16-bit source type: v = RN_in(y ·
//      RN_in(R)) (sglang JIT __hmul2; for f16 sources R overflows to Inf when c < 112, i.e. s < 2^-15).
//   8. clamp to ±max: none | nan-to-max (fmaxf(-max, fminf(v, max)): NaN -> +max) | nan-to-min
//      (fminf(fmaxf(v, -max), max): NaN -> -max; also Triton's tl.clamp with runtime bounds, measured on the H200)
//      | nan-kept (torch.clamp: NaN stays NaN).
//   9. q = the final cast of v: a convert convention (fp8ref list), e.g. torch-2.11 (overflow -> NaN) or
//      cuda-satfinite; with formula=exact the exact value is rounded once (f64-path direct), never via f32.
// `max` is fp8-max (default: the target's largest finite value; vLLM/sglang use 224 for e4m3fnuz).
// exact.q — the golden file's exact tensor — is y / sv rounded to f64 (the quotient by the stored scale), for
// every formula; `x*(1/s)`-style formulas can differ from it by their own f32 roundings before the cast.
//
// ---- Static quantization ------------------------------------------------------------------------------------
// The scales are given (storage dtype of scale-dtype / scale-store; in files, in scale-layout — the functions below
// take the logical row-major bytes, unlayout_scales converts); steps 7–9 run with sv = the given value. The
// amax-based formulas need amax and are refused.
//
// ---- Dequantization -------------------------------------------------------------------------------------------
// x[i] = RN_out( RN_f32( value(q[i]) · value(s[group(i)]) ) ): the product of the code's value and the scale's
// stored value rounded once to f32 (one f32 multiply — what a GPU kernel's `float(q) * s` does), then, for bf16 or
// f16 output, rounded again to that type (RNE; the kernels' store conversion). A NaN code, NaN scale or Inf·0 gives
// the canonical +NaN; e5m2 ±Inf codes give ±Inf (times a positive finite scale).
//
// ---- The exact contract (convention `exact`) ------------------------------------------------------------------
// amax-nan=ignore, no guard, scale-formula=exact, formula=exact, no clamp, cast `exact` (e4m3fn/e5m2: RNE,
// overflow -> NaN/Inf) or `torch-2.11` (fnuz: RNE, overflow -> NaN 0x80): the scale is amax/max rounded once to
// the scale dtype (ue8m0: the smallest power of two >= amax/max), and every q is x/s rounded once to the target.
// With the default fp8-max and a scale in the normal range of its dtype, no finite x overflows:
// |x/s| <= max·(1 + 2^-8), below the overflow threshold of every target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/format.h"
#include "fp8ref/scale_layout.h"

namespace fp8ref {

enum class GranularityKind : uint8_t { tensor, row, col, group, block, mx };
struct Granularity {
  GranularityKind kind = GranularityKind::group;
  int64_t bm = 1;    // block: rows per block
  int64_t bk = 128;  // group / mx: the group size G; block: columns per block
  bool operator==(const Granularity& o) const { return kind == o.kind && bm == o.bm && bk == o.bk; }
  bool operator!=(const Granularity& o) const { return !(*this == o); }
};
std::string to_string(const Granularity& g);  // "tensor", "row", "col", "group:128", "block:128x128", "mx:32"
// Parses the forms above. Returns false and fills *error for anything else (G, Bm, Bk in [1, 2^24]; mx only 32).
bool parse_granularity(std::string_view s, Granularity* out, std::string* error);

enum class TailPolicy : uint8_t { error, partial };
enum class AmaxNan : uint8_t { ignore, propagate };
enum class ScaleFormula : uint8_t { div, mul_rcp, exact };  // "amax/max", "amax*(1/max)", "exact"
enum class ScaleDtype : uint8_t { f32, bf16, f16, ue8m0 };
enum class ScaleRound : uint8_t { rne, pow2_ceil, pow2_ceil_clamp, mx_floor };
enum class ScaleStore : uint8_t { native, f32 };
// "x/s", "x*(1/s)", "x*(max/amax)", "x*(max*rcp(amax))", "exact"
// "x*rcp-bits(s)", "x*rcp-bits(s)@in" (ue8m0 scales only)
enum class QuantFormula : uint8_t { div, mul_rcp, max_div_amax, max_mul_rcp_amax, exact, mul_rcp_bits, mul_rcp_bits_in };
enum class Clamp : uint8_t { none, nan_to_max, nan_to_min, nan_kept };
enum class Division : uint8_t { ieee, triton_nv };  // "ieee", "triton-nv" (include/fp8ref/triton_div.h)

const char* to_string(TailPolicy v);
const char* to_string(AmaxNan v);
const char* to_string(ScaleFormula v);
const char* to_string(ScaleDtype v);
const char* to_string(ScaleRound v);
const char* to_string(ScaleStore v);
const char* to_string(QuantFormula v);
const char* to_string(Clamp v);
const char* to_string(Division v);
bool parse_scale_dtype(std::string_view s, ScaleDtype* out);

struct QuantSpec {
  std::string convention = "exact";  // the preset it started from (informational)
  Format to = Format::e4m3fn;
  Granularity granularity;
  TailPolicy tail = TailPolicy::error;
  AmaxNan amax_nan = AmaxNan::ignore;
  std::optional<float> amax_floor;  // guard amax-floor:E
  std::optional<float> min_scale;   // guard min-scale:M
  ScaleFormula scale_formula = ScaleFormula::exact;
  ScaleDtype scale_dtype = ScaleDtype::f32;
  ScaleRound scale_round = ScaleRound::rne;
  ScaleStore scale_store = ScaleStore::native;
  float fp8_max = 448.0f;
  QuantFormula formula = QuantFormula::exact;
  Clamp clamp = Clamp::none;
  Division div = Division::ieee;                       // every `/` of steps 4 and 7
  ScaleLayout scale_layout = ScaleLayout::row_major;   // how the scales are written and read (not computed)
  std::string cast_convention = "exact";  // a convert convention (convert.h); resolved into `cast` by finalize
  ConversionSpec cast;
  // Set by finalize_quant_spec, cleared by apply_quant_override: the ops refuse a spec that is not finalized
  // (InputError), since `cast` would not match the fields. (Change fields through apply_quant_override, or call
  // finalize_quant_spec again after editing them directly.)
  bool finalized = false;

  // One line naming every field, e.g. "to=e4m3fn granularity=group:128 tail=error amax-nan=ignore
  // guard=amax-floor:1e-10 scale-formula=amax/max scale-dtype=f32 ... cast=torch-2.11".
  std::string describe() const;
};

struct QuantConventionInfo {
  const char* name;
  const char* reproduces;           // the implementation, e.g. "vLLM per_token_group_quant_8bit (CUDA)"
  const char* research;             // where its steps are listed, e.g. "quant-conventions.md §3.5"
  const char* default_granularity;  // used when none is given
  const char* targets;              // the FP8 targets it defines, e.g. "e4m3fn e4m3fnuz"
};
const std::vector<QuantConventionInfo>& quant_conventions();

// The preset `name` for target `to`; `scale_dtype` picks the convention's variant for that scale dtype (e.g.
// vllm-group with ue8m0 adds vLLM's 1e-10 scale floor and pow2-ceil; default: the convention's own dtype).
// Returns nullopt and fills *error if the name is unknown or the convention does not define the target/dtype.
std::optional<QuantSpec> resolve_quant_convention(std::string_view name, Format to,
                                                  std::optional<ScaleDtype> scale_dtype, std::string* error);
// Overrides one field by its descriptor key / CLI flag name: granularity, tail, amax-nan, guard (none |
// amax-floor:E | min-scale:M | both, comma-separated), scale-formula, scale-round, scale-store, fp8-max (a
// positive f32-exact number, or `finfo`), formula, clamp, cast, div (ieee | triton-nv), scale-layout (row-major |
// col-major | tma-aligned | packed-ue8m0). Returns false and fills *error for an unknown field or a bad value.
bool apply_quant_override(std::string_view field, std::string_view value, QuantSpec* spec, std::string* error);
// Resolves the cast and checks that the fields fit together (dynamic: scales computed; else static). Throws
// InputError with the reason: scale-round not matching the dtype, mx:32 without mx-floor, amax formulas with
// non-f32 scales or static scales, a cast convention that does not define the target, a non-positive fp8-max.
void finalize_quant_spec(QuantSpec* spec, bool dynamic);
// What every quantize op checks first: InputError naming `op` unless the spec is finalized and its cast is for
// spec.to.
void require_finalized(const QuantSpec& spec, const char* op);

// ---- Shapes ---------------------------------------------------------------------------------------------------
struct QuantLayout {
  std::vector<int64_t> data_shape;
  std::vector<int64_t> scale_shape;  // logical, row-major
  std::vector<int64_t> block;        // elements of data covered by one scale, per data dimension (>= 1 each)
  int64_t B = 1, M = 1, K = 1;       // the [B, M, K] view
  int64_t n_scales = 0, n_elems = 0;
};
// Throws InputError for rank 0, block granularity on rank 1, or a tail under tail=error.
QuantLayout quant_layout(const QuantSpec& spec, const std::vector<int64_t>& shape);
// The storage format of the scales: f32 (f32, or ue8m0 with scale-store=f32), bf16, f16 or ue8m0 (codes).
Format scale_storage(const QuantSpec& spec);
// The scales as stored in spec.scale_layout: the stored shape, and the transforms from / to the logical row-major
// bytes (elements of scale_storage(spec)). Throw InputError where the layout does not apply (scale_layout.h).
StoredScaleShape stored_scales(const QuantSpec& spec, const QuantLayout& L);
std::vector<uint8_t> layout_scales(const QuantSpec& spec, const QuantLayout& L, const void* logical);
std::vector<uint8_t> unlayout_scales(const QuantSpec& spec, const QuantLayout& L, const void* stored);

namespace ref {
// The reference (reference/quant_ref.cc): scalar, one group at a time, the steps above in order.
// x: the source elements (f32 / bf16 / f16 bit patterns, little-endian, C order), `from` their format.
// q: n_elems codes. scales: n_scales elements of scale_storage(spec) (bytes, little-endian), logical row-major
// (spec.scale_layout is applied by the callers: layout_scales / unlayout_scales). exact_q: optional,
// n_elems doubles (y / sv). The spec must be finalized (finalize_quant_spec).
void quantize(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape, uint8_t* q,
              void* scales, double* exact_q = nullptr);
void quantize_static(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape,
                     const void* scales, uint8_t* q, double* exact_q = nullptr);
// out: n_elems elements of `out_format` (f32, bf16 or f16). Uses spec.to (the codes' format), granularity, tail,
// scale dtype and store. exact_x: optional, the exact products value(q)·value(s) as f64.
void dequantize(const QuantSpec& spec, const uint8_t* q, const std::vector<int64_t>& shape, const void* scales,
                Format out_format, void* out, double* exact_x = nullptr);
// The value of scale element i as stored (f32; NaN/Inf where the storage says so).
float scale_value(const QuantSpec& spec, const void* scales, size_t i);
}  // namespace ref

namespace cpu {
// The CPU backend (src/cpu/quant_cpu.cc: Highway + OpenMP), bit-identical to ref:: with the same signatures.
// Specs it does not vectorise run the reference, called explicitly; quant_path says which: "vector (TARGET)..." or
// "reference: <why>" (dynamic: quantize vs quantize_static; exact_out: exact_q / exact_x requested).
void quantize(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape, uint8_t* q,
              void* scales, double* exact_q = nullptr);
void quantize_static(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape,
                     const void* scales, uint8_t* q, double* exact_q = nullptr);
void dequantize(const QuantSpec& spec, const uint8_t* q, const std::vector<int64_t>& shape, const void* scales,
                Format out_format, void* out, double* exact_x = nullptr);
std::string quant_path(const QuantSpec& spec, bool dynamic, bool exact_out = false);
// For the tests: the premise of the one-correction division of bf16/f16 sources (src/cpu/fp8_lanes-inl.h,
// MarksteinDiv1). Counts the (y, a) with y = 1 + i·2^(1-bits), every i < 2^(bits-1), and a = 1 + j·2^-23, j in
// [j0, j1), where the vector kernel's quotient after `corrections` FMA corrections (0: RN(y·RN(1/a)); 1, 2)
// differs from the IEEE quotient RN(y/a); -1 when the target has no FMA (the kernels then divide).
int64_t division_failures(int significand_bits, int corrections, uint32_t j0, uint32_t j1);
// For the tests: the e4m3fn cast in lanes of clamped magnitudes (src/cpu/fp8_lanes-inl.h, CastE4m3Mag) on every f32
// bit pattern in [b0, b1) (b1 <= 0x43E00001: +0 to 448) against an oracle that walks the codes up the sorted
// values by the RNE midpoints (ref::value_of; a tie goes to the even code; ties_odd: to the odd one, which the lanes
// must then miss at every midpoint). Returns the patterns whose code differs.
int64_t cast_e4m3_failures(uint32_t b0, uint32_t b1, bool ties_odd = false);
}  // namespace cpu

}  // namespace fp8ref
