// fp8ref — how a scale tensor is laid out in memory: QuantSpec's `scale-layout` (include/fp8ref/quant.h).
//
// Quantization computes the scales in their *logical* shape, row-major: [..., R, C] (R = the scale rows, e.g. the
// M tokens; C = the scale columns, e.g. ceil(K/G) groups; the leading dimensions are batches, each laid out on its
// own, one after the other). A layout is a transform of that tensor and its exact inverse on the non-pad elements:
//
//   row-major     [..., R, C] as is (default).
//   col-major     [..., C, R]: stored[..., c, r] = S[..., r, c] (sglang column_major_scales without TMA alignment:
//                 torch.empty((K/G, M)).permute; vLLM/aiter transposed scales).
//   tma-aligned   [..., C, Ra], Ra = R rounded up to a multiple of 16 / element bytes (4 for f32, 8 for bf16/f16,
//                 16 for E8M0 bytes): column-major with the rows padded so each column starts 16-byte aligned
//                 (DeepGEMM get_mn_major_tma_aligned_tensor / get_tma_aligned_size; sglang scale_tma_aligned:
//                 torch.empty((K/G, align4(M))).transpose(-1, -2)[:M]). The kernels leave the pad rows unwritten
//                 (torch.empty); fp8ref writes them as all-zero bits and ignores them on input.
//   packed-ue8m0  int32 [..., ceil(C/4), Ra], Ra = R rounded up to a multiple of 4: four E8M0 codes per 32-bit word,
//                 MN-major and TMA-aligned. Word [..., p, r] holds the codes of S[..., r, 4p + j] in its byte j
//                 (bits 8j..8j+7, little-endian) — DeepGEMM transpose_and_pack_fp32_into_ue8m0 (smxx_layout.cuh:
//                 `values[0] >> 23 | values[1] >> 15 | values[2] >> 7 | values[3] << 1`), sgl-kernel and the sglang JIT
//                 kernel (byte `packed_group * group_stride + token * 4 + g % 4`), vLLM's packed kernel. Bytes past C
//                 in the last word and the pad rows are zero (the sglang JIT kernel zeroes the tail bytes, vLLM
//                 zero-fills the pad rows); on input they are ignored. Needs ue8m0 scales: native codes are packed as
//                 they are; ue8m0 held as f32 (scale-store f32) contributes its exponent field (bits >> 23: 0.0 -> 0,
//                 2^(c-127) -> c, +Inf/NaN -> 0xFF), and unpacks to bits c << 23, 0xFF to NaN 0x7FFFFFFF.
//
// Layouts other than row-major need a logical rank >= 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace fp8ref {

enum class ScaleLayout : uint8_t { row_major, col_major, tma_aligned, packed_ue8m0 };
const char* to_string(ScaleLayout v);  // "row-major", "col-major", "tma-aligned", "packed-ue8m0"
bool parse_scale_layout(std::string_view s, ScaleLayout* out);
const char* scale_layout_names();  // "row-major, col-major, tma-aligned, packed-ue8m0"

// Logical scale elements are `elem_bytes` each (4: f32 or ue8m0 held as f32; 2: bf16/f16; 1: E8M0 codes).
struct StoredScaleShape {
  std::vector<int64_t> shape;  // the stored tensor's shape
  size_t elem_bytes = 4;       // bytes per stored element (4 for packed-ue8m0: int32 words)
  bool packed = false;         // int32 words of 4 codes
  int64_t numel() const;
};
// The stored shape. Throws InputError for a layout other than row-major on rank < 2, packed-ue8m0 with elements that
// are not ue8m0 (is_ue8m0 false), or an element size other than 1, 2, 4. align_elem_bytes: the element size that sets
// the tma-aligned padding (0: elem_bytes) — a file may hold the scales widened (bf16 scales as f32 values) while the
// layout is the one of the real storage.
StoredScaleShape stored_scale_shape(ScaleLayout layout, const std::vector<int64_t>& logical, size_t elem_bytes,
                                    bool is_ue8m0, size_t align_elem_bytes = 0);
// Logical row-major bytes -> stored bytes (pads zero).
std::vector<uint8_t> to_scale_layout(ScaleLayout layout, const std::vector<int64_t>& logical, size_t elem_bytes,
                                     bool is_ue8m0, const void* logical_bytes, size_t align_elem_bytes = 0);
// Stored bytes (stored_scale_shape(...).numel() elements) -> logical row-major bytes; pads are ignored.
std::vector<uint8_t> from_scale_layout(ScaleLayout layout, const std::vector<int64_t>& logical, size_t elem_bytes,
                                       bool is_ue8m0, const void* stored_bytes, size_t align_elem_bytes = 0);

}  // namespace fp8ref
