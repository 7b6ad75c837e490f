// fp8ref — instruction-level simulators of FP8 tensor-core instructions (one MMA, bit for bit).
//
// Model `mma-sync-sm90`: `mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32` as ptxas 13.0 builds it
// for sm_90 (the H200): not a native FP8 op, but F2FP fp8 -> f16 conversions, two chained HMMA.16816.F32 (k = 16
// each) and an FADD of C (seen in the SASS). Bit-exact model: research/h200-mma-fp8-model.md; the steps are
// listed at the top of reference/mma_ref.cc. Reproduces every captured H200 tile (tests/data/h200/mma_sm90/,
// tools/device/capture_mma.py): random, cancellation, exponent spread, subnormal, NaN/Inf, C special and ±0 tiles.
//
// Shapes (one tile = one instruction, D = A·B + C):
//   a  [16][32] FP8 codes (row-major, A[m][k]),  bt [8][32] FP8 codes (BT[n][k] = B[k][n], "col" B),
//   c  [16][8]  f32,                             d  [16][8]  f32 (written).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fp8ref/format.h"

namespace fp8ref {

enum class MmaModel : uint8_t {
  sm90_mma_sync,  // "mma-sync-sm90"
};

const char* to_string(MmaModel m);
bool parse_mma_model(std::string_view name, MmaModel* out);
std::vector<MmaModel> all_mma_models();
// True if the model defines inputs of formats (fa, fb): e4m3fn and e5m2, mixed too, for mma-sync-sm90.
bool mma_supports(MmaModel m, Format fa, Format fb);

namespace ref {
// One output element: d = model(Σ_k a[k]·b[k] + c) over k = 0..31 (a: A's row, b: B's column = BT's row).
float mma_sm90_element(Format fa, Format fb, const uint8_t* a, const uint8_t* b, float c);

// HMMA.16816.F32 with bf16 or f16 operands on sm_90: `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{...}.f32`,
// the instruction Triton builds tl.dot from for a block of 16 rows (MMAv2; vLLM's unified attention). One output
// element over one step of up to 16 k: d = blk(a_k·b_k for k < n, c) with blk as step 4 of mma_sm90_element — the
// exponent e = max(nominal product exponents floor(log2|a|) + floor(log2|b|), floor(log2|c|)), every product and c
// truncated toward zero onto the grid 2^(e−25), summed exactly, the sum truncated to 24 significant bits; no
// separate add of c. `f` (bf16 or f16) clamps the nominal exponent of a subnormal input at the format's smallest
// normal exponent (−126 / −14; not measured). a and b hold values of that format (exact in f32); n <= 16.
// Measured: tests/data/h200/triton_dot.npz (tools/device/capture_triton_dot.py, Triton's tl.dot on an H100): every
// output of random, accumulator, exponent-spread, cancelling and attention-like tiles, bf16 and f16.
float hmma16_step(Format f, const float* a, const float* b, int n, float c);
// The same step as the model states it (exponents by ilogb, each term scaled and truncated, the sum an integer):
// slow; hmma16_step takes it for specials, subnormals and results outside f32's normal range, and the tests check
// that the two agree.
float hmma16_step_literal(Format f, const float* a, const float* b, int n, float c);
// Triton's tl.dot(a, b, acc) along k for one element: steps of 16 k from k = 0 in order (the last one short),
// chained through the accumulator from c — the order of operands Triton loads as 16-bit values (the capture above).
// n = 0 returns c.
float hmma16_dot(Format f, const float* a, const float* b, int64_t n, float c);
// The same dot in the k order Triton 3.6 gives operands in its "kWidth = 4" register layout, which a dot gets when an
// operand was converted from an 8-bit type in registers (vLLM's K and V from an fp8 cache; measured with Triton's
// tl.dot of fp8-converted tiles, tests/data/h200/triton_dot_fp8/): n <= 16 is one step; else k in blocks of 32 from
// k = 0 (k >= n counts as zero), each block two steps, first the k with k mod 4 in {0, 1}, then k mod 4 in {2, 3}.
float hmma16_dot_kw4(Format f, const float* a, const float* b, int64_t n, float c);
// Step s (0, 1, ...) of that order for a dot of n k: sets *base (the block's first k) and kidx[0, m) (offsets from
// base, ascending) and returns m (0 <= m <= 16), or −1 after the last step.
int hmma16_kw4_step(int64_t n, int s, int64_t* base, int* kidx);

// T consecutive tiles (a: T·512 codes, bt: T·256 codes, c and d: T·128 f32). Throws InputError if the model does
// not support (fa, fb).
void mma_m16n8k32(MmaModel model, Format fa, Format fb, const uint8_t* a, const uint8_t* bt, const float* c,
                  float* d, size_t tiles);
}  // namespace ref

}  // namespace fp8ref
