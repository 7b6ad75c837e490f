// Runs FlashInfer's FA2 batch prefill kernel over a paged FP8 (e4m3) KV cache as FlashInfer's own host code drives
// it (csrc/batch_prefill.cu BatchPrefillWithKVCachePlan: PrefillPlan; csrc/batch_prefill_paged.cuh
// BatchPrefillWithPagedKVCacheRun: PagedParams set-up, DISPATCH_CTA_TILE_Q, BatchPrefillWithPagedKVCacheDispatched;
// bf16 q and output, int32 indices, NHD, MaskMode::kCausal, PosEncodingMode::kNone, no fp16 QK reduction,
// DefaultAttention without soft-cap or ALiBi, sliding window by FI_WINDOW), for capture_flashinfer_prefill.py.
// FlashInfer is not part of fp8ref: build with -I pointing at the include/ directory of a FlashInfer release (the
// flashinfer-python wheel's flashinfer/data/include; header-only for this kernel).
//
// The JIT module that FlashInfer's BatchPrefillWithPagedKVCacheWrapper builds for these settings (backend "fa2",
// jit/attention/modules.py _gen_batch_prefill_primary_module: paged_kv_stride_mode "equal") renders
// batch_prefill_customize_config.jinja into the PagedParams struct below (verbatim, with the FA2 additional params
// in their declared order and types: sm_scale etc. are double) and batch_prefill_paged_kernel_inst.jinja into
// explicit instantiations of BatchPrefillWithPagedKVCacheDispatched<SAME_KV_STRIDES=true, CTA_TILE_Q in {16, 64,
// 128}, D, D, kNone, false, kCausal, USE_TOKEN_HEAD_SF=false, DefaultAttention<false, WINDOW, false, false>,
// PagedParams>; here the same templates are instantiated implicitly from one translation unit.
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -DFI_HEAD_DIM=128 -DFI_WINDOW=0 -I...
//   (the driver adds FlashInfer's JIT flags: -use_fast_math, -DNDEBUG, the FLASHINFER_ENABLE_* defines, sm_90a)
// Usage: capture_flashinfer_prefill DIR B HQ HKV D PAGE NUM_PAGES SM_SCALE WINDOW_LEFT
//   DIR holds q.bin (bf16 [total_q, HQ, D]), qo_indptr.bin [B+1], k.bin / v.bin (e4m3 [NUM_PAGES, PAGE, HKV, D], NHD),
//   indptr.bin [B+1], indices.bin [indptr[B]], last.bin [B] (int32); SM_SCALE is parsed as a double (FlashInfer
//   passes sm_scale to the kernel's params as a double). Writes DIR/o.bin (bf16 [total_q, HQ, D]) and DIR/lse.bin
//   (float [total_q, HQ], log2 base, the kernel's own lse output) and prints the plan:
//   "plan cta_tile_q C split_kv S padded_batch_size P kv_chunk_size K num_mma_kv N cta_tile_kv T num_sm M
//    smem_per_sm A smem_per_block_optin O enable_pdl E".
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

// as csrc/batch_prefill.cu and the generated kernel-instantiation sources include them
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/pos_enc.cuh>

#ifndef FI_HEAD_DIM
#define FI_HEAD_DIM 128
#endif
#ifndef FI_WINDOW
#define FI_WINDOW 0
#endif

// ---- batch_prefill_config.inc as batch_prefill_customize_config.jinja renders it for dtype_q bf16, dtype_kv e4m3,
// dtype_o bf16, idtype int32, head_dim_qk = head_dim_vo = FI_HEAD_DIM, pos_encoding_mode kNone, use_sliding_window
// FI_WINDOW, use_logits_soft_cap false, use_fp16_qk_reduction false, use_token_head_sf false, paged_kv_stride_mode
// "equal" (the tvm-ffi ADDITIONAL_FUNC_PARAMS / ADDITIONAL_PARAMS_SETTER macros and RaggedParams are left out: the
// setter is expanded by hand in run() below, RaggedParams serves the ragged kernel only).
#include <flashinfer/page.cuh>
#include <flashinfer/math.cuh>
#include <flashinfer/layout.cuh>
#include <flashinfer/utils.cuh>
#include <flashinfer/fastdiv.cuh>
#include <flashinfer/attention/variant_helper.cuh>
#include <type_traits>

#include "capture_util.cuh"

using namespace flashinfer;

#if defined(FI_F16) && FI_F16  // f16 q and output (the wrapper's q dtype float16), else bf16
using DTypeQ = half;
using DTypeO = half;
#else
using DTypeQ = nv_bfloat16;
using DTypeO = nv_bfloat16;
#endif
using DTypeKV = __nv_fp8_e4m3;
using IdType = int32_t;

constexpr int HEAD_DIM_QK = FI_HEAD_DIM;
constexpr int HEAD_DIM_VO = FI_HEAD_DIM;
constexpr bool USE_FP16_QK_REDUCTION = false;
constexpr bool USE_TOKEN_HEAD_SF = false;
constexpr auto USE_LOGITS_SOFT_CAP = false;
constexpr auto POS_ENCODING_MODE = PosEncodingMode::kNone;
constexpr auto USE_SLIDING_WINDOW = bool(FI_WINDOW);

struct PagedParams {
  using DTypeQ = ::DTypeQ;
  using DTypeKV = ::DTypeKV;
  using DTypeO = ::DTypeO;
  using IdType = ::IdType;

  DTypeQ* q;
  paged_kv_t<DTypeKV, IdType> paged_kv;
  IdType* q_indptr;
  DTypeO* o;
  float* lse;
  uint_fastdiv group_size;

  uint8_t* maybe_custom_mask;
  int32_t* maybe_mask_indptr;
  float* maybe_alibi_slopes;
  uint32_t* maybe_prefix_len_ptr;
  uint16_t* maybe_token_pos_in_items_ptr;
  uint16_t* maybe_max_item_len_ptr;
  uint8_t* maybe_k_cache_sf;
  uint8_t* maybe_v_cache_sf;
  double logits_soft_cap;
  double sm_scale;
  double rope_rcp_scale;
  double rope_rcp_theta;
  int64_t token_pos_in_items_len;

  uint32_t num_qo_heads;
  IdType q_stride_n;
  IdType q_stride_h;
  uint32_t k_sf_stride_page;
  uint32_t k_sf_stride_n;
  uint32_t k_sf_stride_h;
  uint32_t v_sf_stride_page;
  uint32_t v_sf_stride_n;
  uint32_t v_sf_stride_h;
  int32_t window_left;

  IdType* request_indices;
  IdType* qo_tile_indices;
  IdType* kv_tile_indices;
  IdType* merge_indptr;
  IdType* o_indptr;
  bool* block_valid_mask;
  IdType* kv_chunk_size_ptr;
  uint32_t max_total_num_rows;
  uint32_t* total_num_rows;
  uint32_t padded_batch_size;
  bool partition_kv;

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t batch_idx) const {
    return q_indptr[batch_idx + 1] - q_indptr[batch_idx];
  }

  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t batch_idx) const {
    return paged_kv.get_length(batch_idx);
  }
};

#include <flashinfer/attention/variants.cuh>
// ---- end of the rendered config

// DISPATCH_context for mask_mode kCausal: use_custom_mask = (kCausal == kCustom) = false.
constexpr MaskMode MASK_MODE = MaskMode::kCausal;
constexpr bool use_custom_mask = MASK_MODE == MaskMode::kCustom;
using AttentionVariant = DefaultAttention<use_custom_mask, USE_SLIDING_WINDOW, USE_LOGITS_SOFT_CAP,
                                          /*use_alibi=*/POS_ENCODING_MODE == PosEncodingMode::kALiBi>;
// the PAGED_KV_STRIDE_MODE_EQUAL branch of batch_prefill_paged.cuh (K and V caches with identical strides)
constexpr bool SAME_KV_STRIDES = true;

// Which NUM_MMA_KV (so CTA_TILE_KV = NUM_MMA_KV * NUM_WARPS_KV * 16) BatchPrefillWithPagedKVCacheDispatched chose:
// it sets cudaFuncAttributeMaxDynamicSharedMemorySize = sizeof(SharedStoragePaged) on the kernel it launches only.
// The attribute of every valid candidate is read before and after the launch: the launched one reports its own
// shared-storage size afterwards and, unless that size happens to equal the default (48 KiB), changed. The traits are
// built as in BatchPrefillWithPagedKVCacheDispatched (no VO split below head dim 512 with 1-byte KV).
struct MmaKvProbe {
  int before[4] = {-1, -1, -1, -1}, after[4] = {-1, -1, -1, -1};
  size_t size[4] = {0, 0, 0, 0};
};

template <uint32_t CTA_TILE_Q, uint32_t NUM_MMA_KV>
void probe_num_mma_kv(MmaKvProbe& p, int slot, bool after) {
  constexpr uint32_t NUM_MMA_Q = get_num_mma_q(CTA_TILE_Q);
  constexpr uint32_t NUM_WARPS_Q = get_num_warps_q(CTA_TILE_Q);
  constexpr uint32_t NUM_WARPS_KV = get_num_warps_kv(CTA_TILE_Q);
  using KTraits = KernelTraits<MASK_MODE, CTA_TILE_Q, NUM_MMA_Q, NUM_MMA_KV, HEAD_DIM_QK / 16, HEAD_DIM_VO / 16,
                               NUM_WARPS_Q, NUM_WARPS_KV, POS_ENCODING_MODE, DTypeQ, DTypeKV, DTypeO, float, IdType,
                               AttentionVariant, kPrefillLauncherRepacksFp4, USE_TOKEN_HEAD_SF>;
  if constexpr (!KTraits::IsInvalid()) {
    cudaFuncAttributes attr;
    CK(cudaFuncGetAttributes(&attr, BatchPrefillWithPagedKVCacheKernel<SAME_KV_STRIDES, KTraits, PagedParams>));
    (after ? p.after : p.before)[slot] = attr.maxDynamicSharedSizeBytes;
    p.size[slot] = sizeof(typename KTraits::SharedStoragePaged);
  }
}

template <uint32_t CTA_TILE_Q>
void probe_all(MmaKvProbe& p, bool after) {
  probe_num_mma_kv<CTA_TILE_Q, 1>(p, 0, after);
  probe_num_mma_kv<CTA_TILE_Q, 2>(p, 1, after);
  probe_num_mma_kv<CTA_TILE_Q, 4>(p, 2, after);
  probe_num_mma_kv<CTA_TILE_Q, 8>(p, 3, after);
}

// -1 if the launched NUM_MMA_KV cannot be told apart
inline int launched_num_mma_kv(const MmaKvProbe& p) {
  int match = -1, n_match = 0, changed = -1, n_changed = 0;
  for (int i = 0; i < 4; ++i) {
    if (p.size[i] == 0 || size_t(p.after[i]) != p.size[i]) continue;
    match = 1 << i, ++n_match;
    if (p.before[i] != p.after[i]) changed = 1 << i, ++n_changed;
  }
  return n_changed == 1 ? changed : (n_match == 1 ? match : -1);
}

template <uint32_t CTA_TILE_Q>
constexpr uint32_t num_warps_kv_of() {
  return get_num_warps_kv(CTA_TILE_Q);
}

int run(const std::string& dir, uint32_t B, uint32_t HQ, uint32_t HKV, uint32_t page, uint32_t num_pages,
        double sm_scale, int32_t window_left) {
  std::vector<uint16_t> q = read_file<uint16_t>(dir + "/q.bin");
  std::vector<uint8_t> k = read_file<uint8_t>(dir + "/k.bin"), v = read_file<uint8_t>(dir + "/v.bin");
  std::vector<IdType> qo_indptr = read_file<IdType>(dir + "/qo_indptr.bin"),
                      indptr = read_file<IdType>(dir + "/indptr.bin"),
                      indices = read_file<IdType>(dir + "/indices.bin"), last = read_file<IdType>(dir + "/last.bin");
  if (qo_indptr.size() != B + 1 || indptr.size() != B + 1 || last.size() != B ||
      indices.size() != size_t(indptr[B]) || k.size() != size_t(num_pages) * page * HKV * HEAD_DIM_QK ||
      v.size() != k.size() || HQ % HKV != 0) {
    std::fprintf(stderr, "input sizes do not match the arguments\n");
    return 1;
  }
  const uint32_t total_q = uint32_t(qo_indptr[B]);
  if (q.size() != size_t(total_q) * HQ * HEAD_DIM_QK) {
    std::fprintf(stderr, "q.bin holds %zu values, qo_indptr[B] * HQ * D = %zu\n", q.size(),
                 size_t(total_q) * HQ * HEAD_DIM_QK);
    return 1;
  }
  auto* dq = to_device(q);
  auto* dk = to_device(k);
  auto* dv = to_device(v);
  auto* dqo_indptr = to_device(qo_indptr);
  auto* dindptr = to_device(indptr);
  auto* dindices = to_device(indices);
  auto* dlast = to_device(last);
  const size_t o_elems = size_t(total_q) * HQ * HEAD_DIM_VO;
  DTypeO* dout = nullptr;
  float* dlse = nullptr;
  CK(cudaMalloc(&dout, o_elems * sizeof(DTypeO) + 16));
  CK(cudaMemset(dout, 0xFF, o_elems * sizeof(DTypeO)));  // unwritten outputs read as NaN
  CK(cudaMalloc(&dlse, size_t(total_q) * HQ * sizeof(float) + 16));
  CK(cudaMemset(dlse, 0xFF, size_t(total_q) * HQ * sizeof(float)));
  // FlashInfer's Python passes _get_cache_alibi_slopes_buf(num_qo_heads) as maybe_alibi_slopes; DefaultAttention
  // with use_alibi = false never reads it.
  std::vector<float> alibi_zero(HQ, 0.f);
  float* dalibi = to_device(alibi_zero);

  // workspaces as FlashInfer's Python wrapper holds them: the user's float workspace (128 MiB, the documented
  // size), int workspace torch.empty(8 * 1024 * 1024, uint8) and its pinned host twin
  const size_t fbytes = size_t(128) << 20, ibytes = size_t(8) << 20;
  void *fbuf = nullptr, *ibuf = nullptr, *ihost = nullptr;
  CK(cudaMalloc(&fbuf, fbytes));
  CK(cudaMalloc(&ibuf, ibytes));
  CK(cudaMallocHost(&ihost, ibytes));
  cudaStream_t stream = nullptr;

  // ---- BatchPrefillWithKVCachePlan (csrc/batch_prefill.cu), with the arguments the wrapper's plan() gives it:
  // qo_indptr_host, paged_kv_indptr_host (page counts), total_num_rows = qo_indptr[-1], enable_cuda_graph False,
  // head_dim_qk = head_dim_vo, fixed_split_size -1, disable_split_kv False, num_colocated_ctas 0, uniform_q_len 0
  // (_resolve_uniform_q_len without CUDA graphs), fixed_uniform_q_len False, sizeof_dtype_o 2,
  // kv_dtype_bytes sizeof(DTypeKV).
  PrefillPlanInfo plan_info;
  {
    PrefillPlanInfo plan;
    CK(PrefillPlan<IdType>(fbuf, fbytes, ibuf, ihost, ibytes, plan, qo_indptr.data(), indptr.data(),
                           /*total_num_rows=*/total_q, /*batch_size=*/B, HQ, HKV, HEAD_DIM_QK, HEAD_DIM_VO, page,
                           /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, window_left, /*fixed_split_size=*/-1,
                           /*disable_split_kv=*/false, /*num_colocated_ctas=*/0, /*uniform_q_len=*/0,
                           /*fixed_uniform_q_len=*/false, stream, /*kv_dtype_bytes=*/sizeof(DTypeKV)));
    // the plan travels to run() as a vector of int64 (Array<int64_t>), as in FlashInfer
    plan_info.FromVector(plan.ToVector());
  }
  CK(cudaStreamSynchronize(stream));

  // enable_pdl: the wrapper's run() passes device_support_pdl(q.device) (compute capability major >= 9)
  int dev_id = 0, cc_major = 0, num_sm = 0, smem_sm = 0, smem_optin = 0;
  CK(cudaGetDevice(&dev_id));
  CK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev_id));
  CK(cudaDeviceGetAttribute(&num_sm, cudaDevAttrMultiProcessorCount, dev_id));
  CK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev_id));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev_id));
  bool enable_pdl = cc_major >= 9;
  if (const char* e = std::getenv("FI_ENABLE_PDL")) enable_pdl = std::atoi(e) != 0;

  // ---- BatchPrefillWithPagedKVCacheRun (csrc/batch_prefill_paged.cuh)
  void* float_buffer_ptr = fbuf;
  void* int_buffer_ptr = ibuf;
  const QKVLayout kv_layout = QKVLayout::kNHD;
  const int64_t kv_strides[4] = {int64_t(page) * HKV * HEAD_DIM_QK, int64_t(HKV) * HEAD_DIM_QK, HEAD_DIM_QK, 1};
  PagedParams params;
  params.q = reinterpret_cast<DTypeQ*>(dq);
  paged_kv_t<DTypeKV, IdType> paged_kv(HKV, page, HEAD_DIM_VO, B, kv_layout, reinterpret_cast<DTypeKV*>(dk),
                                       reinterpret_cast<DTypeKV*>(dv), kv_strides, kv_strides, dindices, dindptr,
                                       dlast);
  params.paged_kv = paged_kv;
  params.q_indptr = dqo_indptr;
  params.o = dout;
  params.lse = dlse;
  params.num_qo_heads = HQ;
  params.group_size = uint_fastdiv(HQ / paged_kv.num_heads);
  params.q_stride_n = HQ * HEAD_DIM_QK;  // q.stride(0) of a contiguous [total_q, HQ, D] tensor
  params.q_stride_h = HEAD_DIM_QK;       // q.stride(1)
  params.window_left = window_left;

  params.request_indices = params.qo_tile_indices = params.kv_tile_indices = nullptr;  // (the plan's, set below)
  params.merge_indptr = params.o_indptr = params.kv_chunk_size_ptr = nullptr;
  params.block_valid_mask = nullptr;
  params.total_num_rows = nullptr;
  params.max_total_num_rows = params.padded_batch_size = 0;
  params.partition_kv = false;
  params.k_sf_stride_page = params.k_sf_stride_n = params.k_sf_stride_h = 0;
  params.v_sf_stride_page = params.v_sf_stride_n = params.v_sf_stride_h = 0;

  // ADDITIONAL_PARAMS_SETTER with the wrapper's run() arguments: no custom mask / mask indptr, the alibi slopes
  // buffer, no multi-item-scoring pointers, no KV scale-factor tensors (so the sf strides stay 0), logits_soft_cap
  // 0, sm_scale (1/sqrt(D) * k_scale, a Python float), rope_rcp_scale 1 / 1.0, rope_rcp_theta 1 / 1e4,
  // token_pos_in_items_len 0.
  params.maybe_custom_mask = nullptr;
  params.maybe_mask_indptr = nullptr;
  params.maybe_alibi_slopes = dalibi;
  params.maybe_prefix_len_ptr = nullptr;
  params.maybe_token_pos_in_items_ptr = nullptr;
  params.maybe_max_item_len_ptr = nullptr;
  params.maybe_k_cache_sf = nullptr;
  params.maybe_v_cache_sf = nullptr;
  params.logits_soft_cap = 0.0;
  params.sm_scale = sm_scale;
  params.rope_rcp_scale = 1.0 / 1.0;
  params.rope_rcp_theta = 1.0 / 1e4;
  params.token_pos_in_items_len = 0;

  DTypeO* tmp_v = nullptr;
  float* tmp_s = nullptr;

  params.request_indices = GetPtrFromBaseOffset<IdType>(int_buffer_ptr, plan_info.request_indices_offset);
  params.qo_tile_indices = GetPtrFromBaseOffset<IdType>(int_buffer_ptr, plan_info.qo_tile_indices_offset);
  params.kv_tile_indices = GetPtrFromBaseOffset<IdType>(int_buffer_ptr, plan_info.kv_tile_indices_offset);
  params.o_indptr = GetPtrFromBaseOffset<IdType>(int_buffer_ptr, plan_info.o_indptr_offset);
  params.kv_chunk_size_ptr = GetPtrFromBaseOffset<IdType>(int_buffer_ptr, plan_info.kv_chunk_size_ptr_offset);
  if (plan_info.split_kv) {
    params.merge_indptr = GetPtrFromBaseOffset<IdType>(int_buffer_ptr, plan_info.merge_indptr_offset);
    tmp_v = GetPtrFromBaseOffset<DTypeO>(float_buffer_ptr, plan_info.v_offset);
    tmp_s = GetPtrFromBaseOffset<float>(float_buffer_ptr, plan_info.s_offset);
  }
  params.padded_batch_size = plan_info.padded_batch_size;
  params.max_total_num_rows = plan_info.total_num_rows;
  if (plan_info.enable_cuda_graph) {
    params.block_valid_mask = GetPtrFromBaseOffset<bool>(int_buffer_ptr, plan_info.block_valid_mask_offset);
    params.total_num_rows = GetPtrFromBaseOffset<uint32_t>(int_buffer_ptr, plan_info.total_num_rows_offset);
  }

  cudaError_t status = cudaSuccess;
  int num_mma_kv = -1, num_warps_kv = 0;
  DISPATCH_CTA_TILE_Q(plan_info.cta_tile_q, CTA_TILE_Q, {
    MmaKvProbe probe;
    probe_all<CTA_TILE_Q>(probe, /*after=*/false);
    status = BatchPrefillWithPagedKVCacheDispatched<SAME_KV_STRIDES, CTA_TILE_Q, HEAD_DIM_QK, HEAD_DIM_VO,
                                                    POS_ENCODING_MODE, USE_FP16_QK_REDUCTION, MASK_MODE,
                                                    USE_TOKEN_HEAD_SF, AttentionVariant, PagedParams>(
        params, tmp_v, tmp_s, enable_pdl, stream);
    if (status == cudaSuccess) {
      probe_all<CTA_TILE_Q>(probe, /*after=*/true);
      num_mma_kv = launched_num_mma_kv(probe);
      num_warps_kv = int(num_warps_kv_of<CTA_TILE_Q>());
    }
  });
  CK(status);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(stream));

  IdType chunk = 0;
  CK(cudaMemcpy(&chunk, params.kv_chunk_size_ptr, sizeof(IdType), cudaMemcpyDeviceToHost));
  std::vector<uint16_t> out(o_elems);
  CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> lse(size_t(total_q) * HQ);
  CK(cudaMemcpy(lse.data(), dlse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::ofstream(dir + "/o.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * 2));
  std::ofstream(dir + "/lse.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(lse.data()), static_cast<std::streamsize>(lse.size() * sizeof(float)));
  std::printf(
      "plan cta_tile_q %lld split_kv %d padded_batch_size %lld kv_chunk_size %d num_mma_kv %d cta_tile_kv %d "
      "num_sm %d smem_per_sm %d smem_per_block_optin %d enable_pdl %d\n",
      static_cast<long long>(plan_info.cta_tile_q), int(plan_info.split_kv),
      static_cast<long long>(plan_info.padded_batch_size), int(chunk), num_mma_kv,
      num_mma_kv > 0 ? num_mma_kv * num_warps_kv * 16 : -1, num_sm, smem_sm, smem_optin, int(enable_pdl));
  return 0;
}

// FI_HEAD_DIM, FI_WINDOW (0/1): set at compile time (-D), one binary per combination (the driver).
int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s DIR B HQ HKV D PAGE NUM_PAGES SM_SCALE WINDOW_LEFT\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const uint32_t B = std::atoi(argv[2]), HQ = std::atoi(argv[3]), HKV = std::atoi(argv[4]), D = std::atoi(argv[5]);
  const uint32_t page = std::atoi(argv[6]), num_pages = std::atoi(argv[7]);
  const double sm_scale = std::strtod(argv[8], nullptr);
  const int32_t window = std::atoi(argv[9]);
  if (D != FI_HEAD_DIM || (window >= 0) != bool(FI_WINDOW)) {
    std::fprintf(stderr, "this binary is for D %d, window %d\n", FI_HEAD_DIM, FI_WINDOW);
    return 2;
  }
  try {
    return run(dir, B, HQ, HKV, page, num_pages, sm_scale, window);
  } catch (const std::exception& e) {  // FLASHINFER_ERROR / FLASHINFER_CHECK throw
    std::fprintf(stderr, "FlashInfer error: %s\n", e.what());
    return 1;
  }
}
