// fp8ref — conversions to and from FP8 / UE8M0 under explicit, named conventions.
//
// A ConversionSpec states every decision a conversion makes; a *convention* is a named, tested preset of
// those fields that reproduces one real stack bit for bit (see docs/conventions.md and NUMERICS.md §2–3).
//
// Encoding contract (source value x, given as the bit pattern of a bf16/f16/f32/f64):
//   1. f64 sources with f64_path = via_f32 are first rounded to f32 (RNE) — the double rounding torch and
//      numpy do; with direct they are rounded once.
//   2. NaN  -> the NaN code chosen by `nan` (below).
//   3. |x| is rounded to the target's precision (exponent range included, subnormals with their fixed
//      quantum) with `rounding`; the sign is applied after. A zero result keeps the sign (fnuz: +0 always).
//   4. Overflow — a rounded magnitude above the largest finite code, or an infinite input:
//        satfinite: ±max (Inf too);
//        saturate : finite overflow -> ±max; ±Inf -> ±Inf (e5m2) / NaN (formats without Inf);
//        nonsat   : ±Inf (e5m2) / NaN — except that, as in IEEE 754, a finite input rounded *toward zero*
//                   (rz; ru for negatives; rd for positives) saturates to ±max.
//   5. NaN codes: canonical = the format's positive NaN (nan_code), sign dropped; keep_sign = nan_code with the
//      input's sign; payload = keep_sign, and for e5m2 the code is 0x7E | (the fraction bit just below the
//      quiet bit) — what CUDA's __nv_cvt_double_to_fp8 and ml_dtypes' f16->e5m2 path do.
//
// UE8M0 targets (power-of-two scales) use `rounding` in {rz, ru, rd, rna} on |x| (or on x, see ue8m0_sign),
// `overflow` (satfinite: > 2^127 and +Inf -> 0xFE; nonsat -> 0xFF), clip below 2^-127 to 0x00, NaN -> 0xFF,
// and convention knobs: `ue8m0_method` (the bit tricks of DeepGEMM/sglang and of torch, below), `ue8m0_sign`,
// and the exponent clamp [exp_lo, exp_hi].
//
// Stochastic rounding: the random bits for element i are fp8ref::stochastic_bits(seed, i) (a counter-based
// hash, see below), so every backend and thread split gives the same result. With s discarded bits forming the
// fraction d = discarded / 2^s, let f = floor(d · 2^32) (the top 32 bits of the discarded fraction); the
// magnitude rounds up iff f + random >= 2^32, i.e. with probability ~d.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8ref/format.h"

namespace fp8ref {

enum class Rounding : uint8_t { rne, rz, ru, rd, rna, stochastic };
enum class Overflow : uint8_t { satfinite, saturate, nonsat };
enum class NanOut : uint8_t { canonical, keep_sign, payload };
enum class F64Path : uint8_t { direct, via_f32 };
// How UE8M0 treats x <= 0 (and -0): by magnitude (CUDA, torch), or as NaN 0xFF (ml_dtypes).
enum class Ue8m0Sign : uint8_t { magnitude, nonpositive_to_nan };
// How UE8M0 rounds: the value |x| with `rounding` (CUDA, MX, ml_dtypes), or a bit trick on the f32 pattern:
//   bit_ceil : exp_field + (mantissa != 0)                                  (DeepGEMM, sglang, vLLM ceil_to_ue8m0)
//   bit_round: exp_field + (mantissa > 0x400000 || (mantissa == 0x400000 && exp_field != 0))   (torch 2.11 c10)
// Both differ from value rounding only on f32 subnormals; NaN -> 0xFF, exp_field + 1 = 255 -> overflow.
enum class Ue8m0Method : uint8_t { value, bit_ceil, bit_round };

const char* to_string(Rounding r);
const char* to_string(Overflow o);
const char* to_string(NanOut n);
const char* to_string(F64Path p);
const char* to_string(Ue8m0Sign s);
const char* to_string(Ue8m0Method m);
bool parse_rounding(std::string_view s, Rounding* out);
bool parse_overflow(std::string_view s, Overflow* out);
bool parse_nan_out(std::string_view s, NanOut* out);
bool parse_f64_path(std::string_view s, F64Path* out);

struct ConversionSpec {
  Format to = Format::e4m3fn;
  Rounding rounding = Rounding::rne;
  Overflow overflow = Overflow::nonsat;
  NanOut nan = NanOut::keep_sign;
  uint8_t nan_code = 0x7F;  // the positive NaN code written (fnuz: 0x80; ue8m0: 0xFF)
  F64Path f64_path = F64Path::direct;
  uint64_t seed = 0;        // stochastic rounding only
  // UE8M0 only:
  Ue8m0Sign ue8m0_sign = Ue8m0Sign::magnitude;
  Ue8m0Method ue8m0_method = Ue8m0Method::value;
  bool ue8m0_clamp = false;      // clamp the final code to [exp_lo, exp_hi], NaN and overflow codes included
  int exp_lo = 1, exp_hi = 254;  // (DeepGEMM's torch.clamp of the integer exponent to [1, 254])

  bool operator==(const ConversionSpec& o) const;
  bool operator!=(const ConversionSpec& o) const { return !(*this == o); }
  // "rounding=rne overflow=nonsat nan=keep-sign(0x7f) f64=direct" — every field that applies to `to`.
  std::string describe() const;
};

// Decoding contract: finite codes and ±Inf decode exactly. NaN codes decode to nan_f32 (positive pattern) —
// or, with nan_payload, to 0x7FC00000 | (the code's fraction bits at the top of the f32 fraction), as torch's
// CPU e5m2 -> f16 -> f32 path does — with the code's sign bit OR-ed in when nan_keep_sign (signed formats only;
// fnuz 0x80 and ue8m0 0xFF have no sign). f64 outputs widen the f32 result exactly (NaN payload shifted up).
struct DecodeSpec {
  uint32_t nan_f32 = 0x7FC00000u;
  bool nan_keep_sign = true;
  bool nan_payload = false;
};

// ---- Conventions ---------------------------------------------------------------------------------------------

struct ConventionInfo {
  const char* name;
  const char* stack;  // what it reproduces, e.g. "torch 2.11 x.to(torch.float8_*) (CPU and CUDA)"
  bool for_fp8;       // defined for the four FP8 element formats
  bool for_ue8m0;     // defined for ue8m0
};
const std::vector<ConventionInfo>& conventions();

// Resolves a convention for a (source, target) pair — some stacks take different paths per source type.
// Returns std::nullopt and fills *error if the name is unknown or the convention does not define the pair.
std::optional<ConversionSpec> resolve_convention(std::string_view name, Format from, Format to,
                                                 std::string* error);
std::optional<DecodeSpec> resolve_decode(std::string_view name, Format from, std::string* error);

// Applies one override `field=value` on top of a resolved convention (CLI flags --rounding, --overflow, --nan,
// --nan-code, --f64-path, --seed, --exp-clamp LO:HI). Returns false and fills *error for an unknown field, a bad
// value, or a value the convention's stack cannot do (CUDA's e8m0 conversion allows only rz and ru).
bool apply_override(std::string_view convention, std::string_view field, std::string_view value,
                    ConversionSpec* spec, std::string* error);

// ---- Scalar encode/decode (the reference: reference/convert_ref.cc, integer code written from the spec) ------

namespace ref {
// bits: the source bit pattern (bf16/f16 in the low 16 bits, f32 in the low 32). index feeds stochastic rounding.
uint8_t encode(Format from, uint64_t bits, const ConversionSpec& spec, uint64_t index = 0);
uint8_t encode_f32(float x, const ConversionSpec& spec, uint64_t index = 0);
uint8_t encode_f64(double x, const ConversionSpec& spec, uint64_t index = 0);
uint32_t decode_f32_bits(Format from, uint8_t code, const DecodeSpec& d);
uint64_t decode_f64_bits(Format from, uint8_t code, const DecodeSpec& d);
float decode_f32(Format from, uint8_t code, const DecodeSpec& d = {});
double decode_f64(Format from, uint8_t code, const DecodeSpec& d = {});
// Exact value of a finite code (NaN for NaN codes, ±Inf for Inf codes).
double value_of(Format f, uint8_t code);
// IEEE round-to-nearest-even narrowing between the containers (f64/f32 -> f32/bf16/f16; widening is exact).
// NaN keeps its sign and the top of its payload, quieted. Returns the target's bit pattern.
uint64_t narrow(Format from, uint64_t bits, Format to);
// Element i of a little-endian f32, bf16 or f16 array, widened exactly to f32.
float load_f32(Format from, const void* p, int64_t i);
// x rounded (RNE) to f (f32: x itself; bf16, f16) and widened back to f32, NaN as narrow quiets it; bf16 inline
// (integer RNE on the bits: b + 0x7FFF + lsb, the same bits as narrow).
inline float round_through(Format f, float x) {
  if (f == Format::f32) return x;
  uint32_t b = bits_of_f32(x);
  if (f == Format::bf16) {
    b = (b & 0x7FFFFFFFu) > 0x7F800000u ? (b | 0x00400000u) : b + 0x7FFFu + ((b >> 16) & 1u);
    return f32_from_bits(b & 0xFFFF0000u);
  }
  return f32_from_bits(static_cast<uint32_t>(narrow(f, narrow(Format::f32, b, f), Format::f32)));
}
}  // namespace ref

// The documented random-bit source of stochastic rounding: lowbias32 (C. Wellons) of a seed-keyed counter.
//   key = lowbias32(uint32(seed) ^ lowbias32(uint32(seed >> 32) ^ 0x9E3779B9))
//   bits(i) = lowbias32(uint32(i) ^ key ^ lowbias32(uint32(i >> 32) + 0x85EBCA6B))
// (the i >> 32 term is constant over each 2^32-element block; it only decorrelates very long tensors).
constexpr uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}
constexpr uint32_t stochastic_key(uint64_t seed) {
  return lowbias32(static_cast<uint32_t>(seed) ^ lowbias32(static_cast<uint32_t>(seed >> 32) ^ 0x9E3779B9u));
}
constexpr uint32_t stochastic_bits(uint64_t seed, uint64_t i) {
  return lowbias32(static_cast<uint32_t>(i) ^ stochastic_key(seed) ^
                   lowbias32(static_cast<uint32_t>(i >> 32) + 0x85EBCA6Bu));
}

// ---- Bulk conversion (the CPU backend: src/cpu/convert_cpu.cc, Highway dynamic dispatch + OpenMP) ------------
// Bit-identical to ref:: for every input. `first_index` is the stochastic-rounding index of src[0].
namespace cpu {
void encode_f32(const float* src, uint8_t* dst, size_t n, const ConversionSpec& spec, uint64_t first_index = 0);
void encode_bits16(Format from, const uint16_t* src, uint8_t* dst, size_t n, const ConversionSpec& spec,
                   uint64_t first_index = 0);
void encode_f64(const double* src, uint8_t* dst, size_t n, const ConversionSpec& spec, uint64_t first_index = 0);
void decode_f32(Format from, const uint8_t* src, float* dst, size_t n, const DecodeSpec& d);
void decode_f64(Format from, const uint8_t* src, double* dst, size_t n, const DecodeSpec& d);
// Exhaustive-sweep helper: encodes every f32 bit pattern in [begin, end) generated in registers and returns a
// 64-bit checksum of the codes (sum of code · (pattern | 1) mod 2^64, order-independent) and, when `out` is
// non-null, writes the codes.
uint64_t encode_f32_range(uint64_t begin, uint64_t end, const ConversionSpec& spec, uint8_t* out);
// The SIMD target chosen at run time (e.g. "AVX3_SPR").
const char* simd_target();
// Runs fn once per SIMD target compiled in and supported by this CPU, with every backend's dispatch pinned to it
// (Highway's SetSupportedTargetsForTest), then restores the normal choice. Returns the target names. For the tests:
// a CPU without AVX-512 runs code this machine otherwise never would.
std::vector<std::string> for_each_simd_target(const std::function<void()>& fn);
}  // namespace cpu

}  // namespace fp8ref
