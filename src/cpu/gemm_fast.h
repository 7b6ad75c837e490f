// fp8ref — the `fast` scaled_mm model: the CPU fallback (src/cpu/gemm_fast.cc). Not bit-exact: any summation
// order, within a derived bound of `exact` (include/fp8ref/gemm.h has the op, the scale shapes and the bias modes).
//
// How it computes (oneDNN bf16 matmul, AMX on CPUs that have it; f32 on the widened operands where oneDNN has no bf16
// matmul; ONEDNN_VERBOSE=1 names the kernel):
//   1. fp8 -> bf16 (Highway, arithmetic): exact (e4m3fn and e5m2 values, subnormals included, are bf16 values).
//      A and B are repacked into K-group-major tiles, A [M/Mt][KB][Mt][G] and B [N/Nt][KB][Nt][G], zero-padded
//      (G = the scale group along K: 128 blockwise/group, 32 mx, K tensor/rowwise; KB = ceil(K/G)); FastGemmB
//      holds a packed B, so a weight is converted once.
//   2. Per output tile Mt×Nt (OpenMP over tiles): batched oneDNN matmuls over chunks of K groups give the f32 group
//      partials P_kb = Σ_{k in group kb} a·b (products exact in f32; f32 accumulation, any order);
//   3. acc += P_kb · RN32(sa(m,kb) · sb(n,kb)) in f32 (fma or mul+add), groups in increasing order, from +0;
//   4. epilogue: bias=f32: RN_out(RN32(acc + bias)); bias=out: RN_out(RN32(RN_out(acc) + RN_out(bias))); else RN_out(acc)
//      (RN_out = round to nearest even; f32/bf16/f16).
// Small M (the decode step's rows; CPUs with AVX-512 BF16 + VBMI: AMD Zen 4, Intel Sapphire Rapids): no oneDNN and
// no bf16 copy of B. B given as codes (M <= 16): each B row is read once per block of four A rows, decoded to bf16 in
// registers and multiplied by vdpbf16ps; per K group acc = fma(P, RN32(sa·sb), acc) in 16 lanes, the lanes summed at
// the end (src/cpu/gemm_fast.cc gemv_fast: within the same bound). A FastGemmB (on such CPUs) also keeps B's codes in
// column blocks of 16 (4 K per 64 bytes, the VNNI pair layout once decoded): its kernel (gemm16_fast; M <= 64)
// multiplies 16 columns per vdpbf16ps by a broadcast A pair, up to 8 rows sharing each block's decode, one column per
// lane (each P two sequential chains over its group and their sum: within the bound's L − 1 additions; no lane sum).
// On CPUs with AMX-BF16, for 4 <= M <= 64 (128 where the K groups are at most 128) the same codes are decoded into B
// tiles (8 blocks per tile) and multiplied on the tile unit by A's row tiles (amx_product: P is the tile unit's f32
// sum of the group, as on the tile path); B given as codes goes the same way from M = 3, 16 of its rows transposed in
// registers into those blocks per 32 K.
// Memory beyond inputs and output: A's bf16 copy; B's (FastGemmB), or — when there are at least as many n-tiles as
// threads — only one bf16 n-tile of B per thread, converted inside the tile loop; plus per thread one f32 tile and
// its partials (≤ 1 MiB). Tiny scale products (min|sa|·min|sb| < 2^-125) add 2^-148·(Σ|a·b| + KB) to E_acc.
//
// Error bound (per output element; derivation in docs/gemm-fast.md). u = 2^-24 (f32), u' = 2^-23 (f32 accumulation
// inside the matmul, allowing a non-RNE adder), γ_n = n·u/(1-n·u), γ'_n likewise with u'. L = G (or K), KB groups:
//   T     = Σ_kb |sa(m,kb)·sb(n,kb)| · Σ_{k in kb} |a_k·b_k|               (the magnitude of the exact sum)
//   c     = (1+u)^2 · (1+γ'_{L-1}) · (1+γ_{KB}) − 1
//   E_acc = c · T                                                           (|acc − Σ_kb sa·sb·P_kb| ≤ E_acc)
// then the epilogue's roundings (u_out = 2^-8 bf16, 2^-11 f16, 2^-24 f32; η_out = half the least subnormal):
//   none: E_acc + u_out·A + η            f32: E_acc + u·(A+|bias|) + u_out·(A+|bias|)(1+u) + η
//   out:  E_acc + u_out·(A+|bias|) + 2η + (u_out+u)·((A+|bias|)(1+u_out) + 2η) + η    with A = T + E_acc
//         (the u: the f32 add of the two rounded terms before the last RN_out),
// (f32 output: u_out = u, η = 2^-150, the RN_out steps being exact where they are no-ops). A bound that reaches the
// output format's overflow threshold, an infinite scale or a NaN/Inf input gives +Inf (no claim).
// scaled_mm_fast_bound computes T itself with the fast path (|A|·|B|ᵀ with |scales|: non-negative terms, so its
// relative error is ≤ c too: T ≤ T̂/(1−c)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fp8ref/gemm.h"

namespace fp8ref::cpu {

// FastGemmB, scaled_mm_fast and scaled_mm_fast_bound: the public API, include/fp8ref/gemm.h.

// FP8 codes (e4m3fn or e5m2) -> bf16 bit patterns, exactly (NaN -> 0x7FC0 with the code's sign). The conversion
// `fast` packs its operands with.
void fp8_to_bf16(Format f, const uint8_t* codes, uint16_t* out, size_t n);

// The constant c of the bound for this spec and K (exposed for the docs and tests).
double fast_accumulation_constant(const ScaledMmSpec& spec, int64_t K);

// The largest M a packed B's vdpbf16ps kernel (gemm16_fast) takes; bench_gemm_fast and the tests set another limit
// (m >= 0; -1 restores the CPU's default) to measure or check that kernel beside the tile path at any M. (On AMX
// CPUs the tiles take a packed B's products from M = 4 whatever this limit.)
int64_t gemm16_max_m();
void set_gemm16_max_m_for_test(int64_t m);
// Whether a small-M product may run on the AMX tiles (CPUs with AMX-BF16; B packed or as codes) rather than on
// vdpbf16ps (gemm16_fast, gemv_fast; B's codes then only up to M = 16) or the tile path; false keeps AMX out on every
// CPU (tests, bench_gemm_fast), true restores the default.
void set_gemm16_amx_for_test(bool on);

}  // namespace fp8ref::cpu
