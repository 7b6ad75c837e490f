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

// T consecutive tiles (a: T·512 codes, bt: T·256 codes, c and d: T·128 f32). Throws InputError if the model does
// not support (fa, fb).
void mma_m16n8k32(MmaModel model, Format fa, Format fb, const uint8_t* a, const uint8_t* bt, const float* c,
                  float* d, size_t tiles);
}  // namespace ref

}  // namespace fp8ref
