// fp8ref — the `fast` paged-attention convention: the CPU fallback (src/cpu/attention_fast.cc). Not bit-exact: any
// summation order, within a derived per-element bound of the exact convention (the contract and the derivation are in
// include/fp8ref/attention.h, convention "fast").
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8ref/attention.h"

namespace fp8ref::attn::cpu {

enum class FastPath : uint8_t { automatic, amx, avx2, portable, avx512bf16 };

// The fast convention over every sequence (spec.convention is not consulted). automatic: AMX-BF16 + AVX-512 VBMI/BF16
// when the CPU has them (and the OS grants the AMX tile state), else AVX-512 VBMI + BF16 without AMX (vdpbf16ps: AMD
// Zen 4/5) when it has those, else AVX2 + FMA + F16C when it has those, else the portable C++ path; amx on a CPU
// without AMX goes on as automatic, avx512bf16 takes the AVX-512 BF16 path where the CPU has it (also on an AMX
// machine), else the AVX2 path (or portable), avx2 forces the AVX2 path where the CPU has it, else portable. Throws
// InputError for what check_paged_attention refuses and for unquantized chunks (not supported by fast).
void paged_attention_fast(const AttnSpec& spec, const AttnArgs& args, FastPath path = FastPath::automatic);

// Whether automatic picks the AMX path on this machine.
bool fast_attention_has_amx();
// Whether the CPU has the AVX2 path's instructions (automatic takes it where there is no AMX).
bool fast_attention_has_avx2();
// Whether the CPU has the AVX-512 BF16 path's instructions (automatic takes it where there is no AMX).
bool fast_attention_has_avx512bf16();

// paged_attention_fast_bound: the public API, include/fp8ref/attention.h.

// The exp2 the given path evaluates for z in [-126, 0] (the AMX path's AVX-512 twin of ref::exp2_sleef, the AVX2
// path's, or that), n values; for the tests of its accuracy (the bound assumes relative error <= 2^-22).
void fast_exp2(const float* z, float* out, size_t n, FastPath path = FastPath::automatic);

// The soft-cap's tanh as the given path evaluates it (automatic / amx: the AVX-512 lanes where the CPU has AMX; avx2,
// avx512bf16 (whose softmax runs in the AVX2 lanes) and automatic without AMX: the AVX2 lanes, bit for bit the scalar
// steps; else the scalar steps), n values; for the tests of its accuracy (the bound assumes |error| <= kFastTanhErr).
constexpr double kFastTanhErr = 0x1p-20;
void fast_tanh(const float* u, float* out, size_t n, FastPath path = FastPath::automatic);

}  // namespace fp8ref::attn::cpu
