// Runs FlashInfer's batch decode kernel over a paged FP8 (e4m3) KV cache as FlashInfer's own host code drives it
// (csrc/batch_decode.cu: DecodePlan with BatchDecodeWithPagedKVCacheWorkEstimationDispatched, then
// BatchDecodeWithPagedKVCacheDispatched; DefaultAttention, no RoPE), for tools/device/capture_flashinfer_decode.py.
// FlashInfer is not part of fp8ref: build with -I pointing at the include/ directory of a FlashInfer release (the
// flashinfer-python wheel's flashinfer/data/include; header-only for this kernel).
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -DFI_HEAD_DIM=128 -DFI_WINDOW=0 -DFI_CAP=0 -I...
// Usage: capture_flashinfer_decode --occupancy  (prints FlashInfer's max_grid_size per group size)
//        capture_flashinfer_decode DIR B HQ HKV D PAGE NUM_PAGES SM_SCALE WINDOW_LEFT SOFTCAP
//   DIR holds q.bin (bf16 [B, HQ, D]), k.bin / v.bin (e4m3 [NUM_PAGES, PAGE, HKV, D], NHD), indptr.bin [B+1],
//   indices.bin [indptr[B]], last.bin [B] (int32); writes DIR/o.bin (bf16 [B, HQ, D]) and prints the plan
//   (split_kv, padded batch size, kv chunk size).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include "capture_util.cuh"

using namespace flashinfer;

using DTypeQ = __nv_bfloat16;
using DTypeKV = __nv_fp8_e4m3;
using DTypeO = __nv_bfloat16;
using IdType = int32_t;
using Params = BatchDecodeParams<DTypeQ, DTypeKV, DTypeO, IdType>;

template <uint32_t HEAD_DIM, bool kWindow, bool kCap>
int run(const std::string& dir, uint32_t B, uint32_t HQ, uint32_t HKV, uint32_t page, uint32_t num_pages,
        float sm_scale, int32_t window_left, float softcap) {
  using Variant = DefaultAttention</*custom_mask=*/false, kWindow, kCap, /*alibi=*/false>;
  std::vector<uint16_t> q = read_file<uint16_t>(dir + "/q.bin");
  std::vector<uint8_t> k = read_file<uint8_t>(dir + "/k.bin"), v = read_file<uint8_t>(dir + "/v.bin");
  std::vector<IdType> indptr = read_file<IdType>(dir + "/indptr.bin"), indices = read_file<IdType>(dir + "/indices.bin"),
                      last = read_file<IdType>(dir + "/last.bin");
  if (q.size() != size_t(B) * HQ * HEAD_DIM || k.size() != size_t(num_pages) * page * HKV * HEAD_DIM ||
      indptr.size() != B + 1 || last.size() != B) {
    std::fprintf(stderr, "input sizes do not match the arguments\n");
    return 1;
  }
  auto* dq = to_device(q);
  auto* dk = to_device(k);
  auto* dv = to_device(v);
  auto* dindptr = to_device(indptr);
  auto* dindices = to_device(indices);
  auto* dlast = to_device(last);
  DTypeO* dout = nullptr;
  CK(cudaMalloc(&dout, size_t(B) * HQ * HEAD_DIM * sizeof(DTypeO)));
  CK(cudaMemset(dout, 0xFF, size_t(B) * HQ * HEAD_DIM * sizeof(DTypeO)));

  // workspaces as FlashInfer's Python wrapper allocates them (128 MiB float, 8 MiB int + its pinned twin)
  const size_t fbytes = size_t(128) << 20, ibytes = size_t(8) << 20;
  void *fbuf = nullptr, *ibuf = nullptr, *ihost = nullptr;
  CK(cudaMalloc(&fbuf, fbytes));
  CK(cudaMalloc(&ibuf, ibytes));
  CK(cudaMallocHost(&ihost, ibytes));
  DecodePlanInfo plan;
  cudaStream_t stream = nullptr;
  DISPATCH_GQA_GROUP_SIZE(HQ / HKV, GROUP_SIZE, {
    auto work = BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, HEAD_DIM, PosEncodingMode::kNone,
                                                                     Variant, Params>;
    CK((DecodePlan<HEAD_DIM, PosEncodingMode::kNone, Variant, Params>(
        fbuf, fbytes, ibuf, ihost, ibytes, plan, indptr.data(), B, HQ, page, /*enable_cuda_graph=*/false, stream,
        work)));
  });
  CK(cudaStreamSynchronize(stream));

  paged_kv_t<DTypeKV, IdType> paged_kv(HKV, page, HEAD_DIM, B, QKVLayout::kNHD, reinterpret_cast<DTypeKV*>(dk),
                                        reinterpret_cast<DTypeKV*>(dv), dindices, dindptr, dlast);
  Params params(reinterpret_cast<DTypeQ*>(dq), /*q_rope_offset=*/nullptr, paged_kv, dout, /*lse=*/nullptr,
                /*alibi=*/nullptr, HQ, /*q_stride_n=*/HQ * HEAD_DIM, /*q_stride_h=*/HEAD_DIM, window_left, softcap,
                sm_scale, /*rope_scale=*/1.f, /*rope_theta=*/1e4f);
  DTypeO* tmp_v = nullptr;
  float* tmp_s = nullptr;
  params.request_indices = GetPtrFromBaseOffset<IdType>(ibuf, plan.request_indices_offset);
  params.kv_tile_indices = GetPtrFromBaseOffset<IdType>(ibuf, plan.kv_tile_indices_offset);
  params.o_indptr = GetPtrFromBaseOffset<IdType>(ibuf, plan.o_indptr_offset);
  params.kv_chunk_size_ptr = GetPtrFromBaseOffset<IdType>(ibuf, plan.kv_chunk_size_ptr_offset);
  if (plan.split_kv) {
    tmp_v = GetPtrFromBaseOffset<DTypeO>(fbuf, plan.v_offset);
    tmp_s = GetPtrFromBaseOffset<float>(fbuf, plan.s_offset);
  }
  params.padded_batch_size = plan.padded_batch_size;
  CK((BatchDecodeWithPagedKVCacheDispatched<HEAD_DIM, PosEncodingMode::kNone, Variant>(params, tmp_v, tmp_s,
                                                                                      /*enable_pdl=*/false, stream)));
  CK(cudaStreamSynchronize(stream));
  IdType chunk = 0;
  CK(cudaMemcpy(&chunk, params.kv_chunk_size_ptr, sizeof(IdType), cudaMemcpyDeviceToHost));
  std::vector<uint16_t> out(size_t(B) * HQ * HEAD_DIM);
  CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
  std::ofstream(dir + "/o.bin", std::ios::binary).write(reinterpret_cast<const char*>(out.data()),
                                                         static_cast<std::streamsize>(out.size() * 2));
  std::printf("plan split_kv %d padded_batch_size %lld kv_chunk_size %d\n", int(plan.split_kv),
              static_cast<long long>(plan.padded_batch_size), int(chunk));
  return 0;
}

// The max_grid_size FlashInfer's work estimation computes (blocks per SM x SMs, by occupancy) for each group size.
int occupancy() {
  using Variant = DefaultAttention<false, bool(FI_WINDOW), bool(FI_CAP), false>;
  int num_sm = 0;
  CK(cudaDeviceGetAttribute(&num_sm, cudaDevAttrMultiProcessorCount, 0));
  for (uint32_t g : {1u, 2u, 3u, 4u, 6u, 8u, 16u}) {
    IdType indptr[2] = {0, 1};
    bool split = false;
    uint32_t max_grid = 0, pages = 0, new_bs = 0, gdy = 0;
    DISPATCH_GQA_GROUP_SIZE(g, GROUP_SIZE, {
      CK((BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, FI_HEAD_DIM, PosEncodingMode::kNone,
                                                               Variant, Params>(
          split, max_grid, pages, new_bs, gdy, 1, indptr, GROUP_SIZE, 16, false, nullptr)));
    });
    std::printf("occupancy D %d window %d G %u sms %d max_grid_size %u\n", FI_HEAD_DIM, FI_WINDOW, g, num_sm,
                max_grid);
  }
  return 0;
}

// FI_HEAD_DIM, FI_WINDOW (0/1), FI_CAP (0/1): set at compile time (-D), one binary per combination (the driver).
int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--occupancy") return occupancy();
  if (argc != 11) {
    std::fprintf(stderr, "usage: %s DIR B HQ HKV D PAGE NUM_PAGES SM_SCALE WINDOW_LEFT SOFTCAP\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const uint32_t B = std::atoi(argv[2]), HQ = std::atoi(argv[3]), HKV = std::atoi(argv[4]), D = std::atoi(argv[5]);
  const uint32_t page = std::atoi(argv[6]), num_pages = std::atoi(argv[7]);
  const float sm_scale = std::strtof(argv[8], nullptr), softcap = std::strtof(argv[10], nullptr);
  const int32_t window = std::atoi(argv[9]);
  if (D != FI_HEAD_DIM || (window >= 0) != bool(FI_WINDOW) || (softcap > 0) != bool(FI_CAP)) {
    std::fprintf(stderr, "this binary is for D %d, window %d, soft-cap %d\n", FI_HEAD_DIM, FI_WINDOW, FI_CAP);
    return 2;
  }
  return run<FI_HEAD_DIM, bool(FI_WINDOW), bool(FI_CAP)>(dir, B, HQ, HKV, page, num_pages, sm_scale, window, softcap);
}
