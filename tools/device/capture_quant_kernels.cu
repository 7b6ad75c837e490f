// CUDA per-token-group FP8 quantizers for the H200 capture (tools/device/capture_quant_kernels.py): the per-element
// and per-group formulas of three real kernels, written from their sources (research/quant-conventions.md §3.3–3.5):
//
//   vllm_*      vllm csrc/quantization/w8a8/fp8/per_token_group_quant.cu @0f5257e2 ComputeGroupScale +
//               QuantizeGroup (smem kernel): local_absmax = eps; fmaxf(local_absmax, fabsf(f32(x)));
//               y_s = local_absmax / max_8bit; ue8m0: y_s = exp2f(ceilf(log2f(fmaxf(fabsf(y_s), 1e-10f))));
//               q = fminf(fmaxf(f32(x) / y_s, min_8bit), max_8bit); DST_DTYPE(q) (c10::Float8_e4m3fn).
//   sglk_*      sglang sgl-kernel/csrc/gemm/per_token_group_quant_8bit.cu @00568d90 per_token_group_quant_8bit_kernel
//               with calculate_fp8_scales / fast_log2_ceil / fast_pow2 / extract_required_scale_format and the
//               kernel's scale addressing (row-major f32, column-major f32, column-major packed ue8m0).
//   jit_*       sglang python/sglang/jit_kernel/csrc/gemm/per_token_group_quant.cuh @97923ff3 QuantTrait::run with
//               deepseek_v4/fp8_utils.cuh cast_to_ue8m0 / inv_scale_ue8m0 and ScaleStoreArgs::store.
//
// One thread per group: every reduction in these kernels is a max (fmaxf / __hmax2), which gives the same value in
// any order, so the thread layout of the originals (8 or 16 lanes per group, shuffles) does not change any bit.
// Built with nvcc -O2 -arch=sm_90 and no fast-math flag, like the originals (IEEE `/`, libm exp2f/log2f).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#ifdef USE_C10
#include <c10/util/Float8_e4m3fn.h>
#endif

namespace {

__device__ __forceinline__ float tof(float v) { return v; }
__device__ __forceinline__ float tof(__half v) { return __half2float(v); }
__device__ __forceinline__ float tof(__nv_bfloat16 v) { return __bfloat162float(v); }

// vLLM's DST_DTYPE(q) for fp8: c10::Float8_e4m3fn(float). Without the c10 header, the RNE cvt: identical for the
// clamped values vLLM passes (|q| <= 448, never NaN).
__device__ __forceinline__ uint8_t vllm_cast(float q) {
#ifdef USE_C10
  c10::Float8_e4m3fn v(q);
  return v.x;
#else
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
#endif
}

template <typename T, bool UE8M0>
__global__ void vllm_group(const T* __restrict__ in, uint8_t* __restrict__ q, float* __restrict__ s, int ngroups, int G,
                           float eps, float min_8bit, float max_8bit) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= ngroups) return;
  const T* x = in + static_cast<int64_t>(g) * G;
  float local_absmax = eps;
  for (int i = 0; i < G; ++i) local_absmax = fmaxf(local_absmax, fabsf(tof(x[i])));
  float y_s = local_absmax / max_8bit;
  if (UE8M0) y_s = exp2f(ceilf(log2f(fmaxf(fabsf(y_s), 1e-10f))));
  s[g] = y_s;  // row-major (M, K/G)
  for (int i = 0; i < G; ++i) {
    const float v = fminf(fmaxf(tof(x[i]) / y_s, min_8bit), max_8bit);
    q[static_cast<int64_t>(g) * G + i] = vllm_cast(v);
  }
}

// ---- sgl-kernel -----------------------------------------------------------------------------------------------

__device__ __forceinline__ float fast_pow2(int x) {
  uint32_t bits_x = (x + 127) << 23;
  return *reinterpret_cast<float*>(&bits_x);
}

__device__ __forceinline__ int fast_log2_ceil(float x) {
  auto bits_x = *reinterpret_cast<uint32_t*>(&x);
  auto exp_x = (bits_x >> 23) & 0xff;
  auto man_bits = bits_x & ((1 << 23) - 1);
  return exp_x - 127 + (man_bits != 0);
}

// LAYOUT 0: row-major f32; 1: column-major f32; 2: column-major packed ue8m0 (uint32 words of 4 codes).
template <typename T, int LAYOUT>
__global__ void sglk_group(const T* __restrict__ in, uint8_t* __restrict__ q, void* __restrict__ output_s, int ngroups,
                           int G, int scale_num_rows, int scale_stride) {
  constexpr bool SCALE_UE8M0 = LAYOUT == 2;
  const int global_group_id = blockIdx.x * blockDim.x + threadIdx.x;
  if (global_group_id >= ngroups) return;
  const T* x = in + static_cast<int64_t>(global_group_id) * G;

  float local_absmax = 1e-10f;  // LOCAL_ABSMAX_ABS
  for (int i = 0; i < G; ++i) local_absmax = fmaxf(local_absmax, fabsf(static_cast<float>(tof(x[i]))));

  constexpr float MAX_8BIT_INV = 1.0f / 448.0f;
  float y_scale, y_scale_inv;
  if (SCALE_UE8M0) {
    auto exp_scale_inv = fast_log2_ceil(local_absmax * MAX_8BIT_INV);
    y_scale = fast_pow2(-exp_scale_inv);
    y_scale_inv = fast_pow2(exp_scale_inv);
  } else {
    y_scale_inv = local_absmax * MAX_8BIT_INV;
    y_scale = 448.0f / local_absmax;
  }

  if (LAYOUT == 0) {
    static_cast<float*>(output_s)[global_group_id] = y_scale_inv;
  } else {
    const int num_elems_per_pack = SCALE_UE8M0 ? 4 : 1;
    const int scale_num_rows_element = scale_num_rows * num_elems_per_pack;
    const int row_idx = global_group_id / scale_num_rows_element;
    const int col_idx_raw = global_group_id % scale_num_rows_element;
    const int col_idx = col_idx_raw / num_elems_per_pack;
    const int pack_idx = col_idx_raw % num_elems_per_pack;
    const int64_t off = static_cast<int64_t>(col_idx) * scale_stride * num_elems_per_pack +
                        row_idx * num_elems_per_pack + pack_idx;
    if (SCALE_UE8M0)
      static_cast<uint8_t*>(output_s)[off] = static_cast<uint8_t>((*reinterpret_cast<uint32_t*>(&y_scale_inv)) >> 23);
    else
      static_cast<float*>(output_s)[off] = y_scale_inv;
  }

  for (int j = 0; j < G; j += 2) {
    float2 inputx2 = {static_cast<float>(tof(x[j])), static_cast<float>(tof(x[j + 1]))};
    float2 outputx2 = {__fmul_rn(inputx2.x, y_scale), __fmul_rn(inputx2.y, y_scale)};  // __fmul2_rn
    const __nv_fp8x2_storage_t p = __nv_cvt_float2_to_fp8x2(outputx2, __NV_SATFINITE, __NV_E4M3);
    q[static_cast<int64_t>(global_group_id) * G + j] = static_cast<uint8_t>(p & 0xFF);
    q[static_cast<int64_t>(global_group_id) * G + j + 1] = static_cast<uint8_t>(p >> 8);
  }
}

// ---- sglang JIT -----------------------------------------------------------------------------------------------

__device__ __forceinline__ float2 tof2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 tof2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ void from_f2(float2 f, __nv_bfloat162* out) { *out = __float22bfloat162_rn(f); }
__device__ __forceinline__ void from_f2(float2 f, __half2* out) { *out = __float22half2_rn(f); }

__device__ __forceinline__ int32_t cast_to_ue8m0(float x) {
  uint32_t u = __float_as_uint(x);
  int32_t exp = int32_t((u >> 23) & 0xFF);
  uint32_t mant = u & 0x7FFFFF;
  return exp + (mant != 0);
}

__device__ __forceinline__ float inv_scale_ue8m0(int32_t exp) { return __uint_as_float((127 + 127 - exp) << 23); }

// MODE 0: f32 row-major; 1: f32 column-major (group_stride = the scale column stride, TMA-aligned M);
// 2: ue8m0 column-major packed (group_stride in bytes = 4 * aligned M). num_groups: groups per row.
template <typename T2, int MODE>
__global__ void jit_group(const T2* __restrict__ in, uint8_t* __restrict__ q, void* __restrict__ base, int num_tokens,
                          int num_groups, int G, uint32_t token_stride, uint32_t group_stride) {
  const int work = blockIdx.x * blockDim.x + threadIdx.x;
  if (work >= num_tokens * num_groups) return;
  const uint32_t token_idx = work / num_groups, group_idx = work % num_groups;
  const T2* x2 = in + (static_cast<int64_t>(token_idx) * num_groups * G + static_cast<int64_t>(group_idx) * G) / 2;

  T2 local_amax2 = __habs2(x2[0]);
  for (int i = 1; i < G / 2; ++i) local_amax2 = __hmax2(local_amax2, __habs2(x2[i]));
  const float2 amax2 = tof2(local_amax2);
  const float amax = fmaxf(fmaxf(amax2.x, amax2.y), 1e-10f);
  constexpr float kMaxValue = 448.0f;
  constexpr float kMaxValueInv = 1.f / kMaxValue;
  const float raw_scale = amax * kMaxValueInv;

  uint8_t* out = q + static_cast<int64_t>(token_idx) * num_groups * G + static_cast<int64_t>(group_idx) * G;
  if (MODE == 2) {
    const auto exp = cast_to_ue8m0(raw_scale);
    const uint8_t scale_inv = static_cast<uint8_t>(exp);
    const float quant_scale = inv_scale_ue8m0(exp);
    T2 scale2;
    from_f2(float2{quant_scale, quant_scale}, &scale2);
    for (int i = 0; i < G / 2; ++i) {
      const __nv_fp8x2_e4m3 v(__hmul2(x2[i], scale2));  // 16-bit multiply, then the SATFINITE x2 conversion
      out[2 * i] = static_cast<uint8_t>(v.__x & 0xFF);
      out[2 * i + 1] = static_cast<uint8_t>(v.__x >> 8);
    }
    // ScaleStoreArgs::store<ue8m0, col-major>: byte packed_group * group_stride + token * 4 + g % 4
    const uint64_t offset = static_cast<uint64_t>(group_idx / 4) * group_stride + token_idx * 4 + group_idx % 4;
    static_cast<uint8_t*>(base)[offset] = scale_inv;
    if (num_groups % 4 != 0 && group_idx == static_cast<uint32_t>(num_groups) - 1) {  // fill_unaligned
      const uint32_t rem = num_groups % 4;
      const uint64_t int32_base = offset - (rem - 1);
      for (uint32_t b = rem; b < 4; ++b) static_cast<uint8_t*>(base)[int32_base + b] = 0;
    }
  } else {
    const float quant_scale = kMaxValue * __frcp_rn(amax);
    for (int i = 0; i < G / 2; ++i) {
      const float2 f = tof2(x2[i]);
      const __nv_fp8x2_e4m3 v(float2{f.x * quant_scale, f.y * quant_scale});  // SATFINITE, no clip
      out[2 * i] = static_cast<uint8_t>(v.__x & 0xFF);
      out[2 * i + 1] = static_cast<uint8_t>(v.__x >> 8);
    }
    const uint64_t offset = MODE == 0 ? static_cast<uint64_t>(token_idx) * token_stride + group_idx
                                      : token_idx + static_cast<uint64_t>(group_idx) * group_stride;
    static_cast<float*>(base)[offset] = raw_scale;
  }
}

int blocks(int n) { return (n + 127) / 128; }

}  // namespace

// in: dtype 0 = f32, 1 = f16, 2 = bf16. Returns cudaGetLastError() after the launch.
template <typename T>
void vllm_launch(int ue8m0, const void* in, uint8_t* q, float* s, int ngroups, int G) {
  const float eps = 1e-10f, mn = -448.0f, mx = 448.0f;
  if (ue8m0) vllm_group<T, true><<<blocks(ngroups), 128>>>(static_cast<const T*>(in), q, s, ngroups, G, eps, mn, mx);
  else vllm_group<T, false><<<blocks(ngroups), 128>>>(static_cast<const T*>(in), q, s, ngroups, G, eps, mn, mx);
}

extern "C" int vllm_quant(int dtype, int ue8m0, const void* in, uint8_t* q, float* s, int ngroups, int G) {
  if (dtype == 0) vllm_launch<float>(ue8m0, in, q, s, ngroups, G);
  else if (dtype == 1) vllm_launch<__half>(ue8m0, in, q, s, ngroups, G);
  else vllm_launch<__nv_bfloat16>(ue8m0, in, q, s, ngroups, G);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
void sglk_launch(int layout, const void* in, uint8_t* q, void* s, int ngroups, int G, int rows, int stride) {
  const T* x = static_cast<const T*>(in);
  if (layout == 0) sglk_group<T, 0><<<blocks(ngroups), 128>>>(x, q, s, ngroups, G, rows, stride);
  else if (layout == 1) sglk_group<T, 1><<<blocks(ngroups), 128>>>(x, q, s, ngroups, G, rows, stride);
  else sglk_group<T, 2><<<blocks(ngroups), 128>>>(x, q, s, ngroups, G, rows, stride);
}

extern "C" int sglk_quant(int dtype, int layout, const void* in, uint8_t* q, void* s, int ngroups, int G,
                          int scale_num_rows, int scale_stride) {
  if (dtype == 1) sglk_launch<__half>(layout, in, q, s, ngroups, G, scale_num_rows, scale_stride);
  else sglk_launch<__nv_bfloat16>(layout, in, q, s, ngroups, G, scale_num_rows, scale_stride);
  return static_cast<int>(cudaGetLastError());
}

template <typename T2>
void jit_launch(int mode, const void* in, uint8_t* q, void* s, int nt, int ng, int G, unsigned ts, unsigned gs) {
  const T2* x = static_cast<const T2*>(in);
  const int n = nt * ng;
  if (mode == 0) jit_group<T2, 0><<<blocks(n), 128>>>(x, q, s, nt, ng, G, ts, gs);
  else if (mode == 1) jit_group<T2, 1><<<blocks(n), 128>>>(x, q, s, nt, ng, G, ts, gs);
  else jit_group<T2, 2><<<blocks(n), 128>>>(x, q, s, nt, ng, G, ts, gs);
}

extern "C" int jit_quant(int dtype, int mode, const void* in, uint8_t* q, void* s, int num_tokens, int num_groups, int G,
                         unsigned token_stride, unsigned group_stride) {
  if (dtype == 1) jit_launch<__half2>(mode, in, q, s, num_tokens, num_groups, G, token_stride, group_stride);
  else jit_launch<__nv_bfloat162>(mode, in, q, s, num_tokens, num_groups, G, token_stride, group_stride);
  return static_cast<int>(cudaGetLastError());
}
