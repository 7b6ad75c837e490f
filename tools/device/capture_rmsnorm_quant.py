#!/usr/bin/env python3
"""H200 capture for fp8ref's `vllm-rmsnorm-quant`: a port of vLLM's rms_norm_per_block_quant (bf16 in, e4m3fn out,
f32 group scales, optional residual), written from vllm csrc/quantization/fused_kernels/
fused_layernorm_dynamic_per_token_quant.cu + layernorm_utils.cuh (@83e16d27; research §7.2), compiled here with
nvcc -O2 -arch=sm_90 (no fast-math, default FMA contraction — as vLLM builds it) with the real cub::BlockReduce:

  compute_rms (vectorized): thread t sums x·x over its vec4s i = t, t + blockDim, ... (`ss += x.val[j] * x.val[j]`),
    cub::BlockReduce<float, 1024>(tmp).Reduce(ss, plus, blockDim.x); rms = rsqrtf(ss / hidden + eps)
  launch: grid = tokens, block = min(hidden, tokens <= 256 ? 512 : 256) (rms_norm_per_block_quant_dispatch)
  per element: y = float(bf16(x * rms) * w)  (c10 BFloat16 operator*: f32 product rounded to bf16)
  per group: scale = fmaxf(amax / 448, 1 / (448 * 512)); q = fp8(fmaxf(-448, fminf(y / scale, 448)))
  residual: x = f32(in) + f32(res) (f32); res = bf16(x) written back.
The group amax and the per-element steps are order-independent; the port follows vLLM's arithmetic, not its thread
mapping for those. Writes $OUT/rmsnorm_vllm_h200.npz: per case the inputs, q, scales, residual out and the row's rms.
"""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import torch

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())

CU = r"""
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda/std/functional>

template <bool RES>
__global__ void rms_block_quant(unsigned char* out, float* scales, float* rms_out, const __nv_bfloat16* in,
                                const __nv_bfloat16* w, __nv_bfloat16* residual, float eps, int hidden, int group) {
  const long off = blockIdx.x * (long)hidden;
  float ss = 0.0f;
  const int nvec = hidden >> 2;
  for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
    float x[4];
    for (int j = 0; j < 4; ++j) x[j] = __bfloat162float(in[off + 4 * i + j]);
    if (RES)
      for (int j = 0; j < 4; ++j) x[j] += __bfloat162float(residual[off + 4 * i + j]);
    for (int j = 0; j < 4; ++j) ss += x[j] * x[j];
  }
  using BlockReduce = cub::BlockReduce<float, 1024>;
  __shared__ typename BlockReduce::TempStorage tmp;
  ss = BlockReduce(tmp).Reduce(ss, cuda::std::plus<>{}, blockDim.x);
  __shared__ float s_rms;
  if (threadIdx.x == 0) {
    s_rms = rsqrtf(ss / hidden + eps);
    rms_out[blockIdx.x] = s_rms;
  }
  __syncthreads();
  const float rms = s_rms;
  const int ngroups = hidden / group;
  for (int g = threadIdx.x; g < ngroups; g += blockDim.x) {
    float amax = 0.0f;
    for (int k = g * group; k < (g + 1) * group; ++k) {
      float x = __bfloat162float(in[off + k]);
      if (RES) x += __bfloat162float(residual[off + k]);
      const __nv_bfloat16 xn = __float2bfloat16(x * rms);
      const float y = __bfloat162float(__float2bfloat16(__bfloat162float(xn) * __bfloat162float(w[k])));
      amax = fmaxf(amax, fabsf(y));
    }
    scales[blockIdx.x * (long)ngroups + g] = fmaxf(amax / 448.0f, 1.0f / (448.0f * 512.0f));
  }
  __syncthreads();
  for (int k = threadIdx.x; k < hidden; k += blockDim.x) {
    float x = __bfloat162float(in[off + k]);
    if (RES) x += __bfloat162float(residual[off + k]);
    const __nv_bfloat16 xn = __float2bfloat16(x * rms);
    const float y = __bfloat162float(__float2bfloat16(__bfloat162float(xn) * __bfloat162float(w[k])));
    const float s = scales[blockIdx.x * (long)ngroups + k / group];
    const float r = fmaxf(-448.0f, fminf(y / s, 448.0f));
    out[off + k] = __nv_fp8_e4m3(r).__x;
  }
  __syncthreads();
  if (RES)
    for (int k = threadIdx.x; k < hidden; k += blockDim.x)
      residual[off + k] = __float2bfloat16(__bfloat162float(in[off + k]) + __bfloat162float(residual[off + k]));
}

extern "C" void run(unsigned char* out, float* scales, float* rms, const void* in, const void* w, void* res,
                    float eps, int tokens, int hidden, int group) {
  const int max_block = tokens <= 256 ? 512 : 256;
  const int block = hidden < max_block ? hidden : max_block;
  if (res)
    rms_block_quant<true><<<tokens, block>>>(out, scales, rms, (const __nv_bfloat16*)in, (const __nv_bfloat16*)w,
                                             (__nv_bfloat16*)res, eps, hidden, group);
  else
    rms_block_quant<false><<<tokens, block>>>(out, scales, rms, (const __nv_bfloat16*)in, (const __nv_bfloat16*)w,
                                              nullptr, eps, hidden, group);
  cudaDeviceSynchronize();
}
"""
work = "/tmp/rmsq_build"
os.makedirs(work, exist_ok=True)
with open(f"{work}/k.cu", "w") as f:
    f.write(CU)
nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
subprocess.run([nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", f"{work}/k.so",
                f"{work}/k.cu"], check=True)
sass = subprocess.run(["cuobjdump", "-sass", f"{work}/k.so"], capture_output=True, text=True).stdout
print("FFMA in the kernels:", sass.count("FFMA"), " MUFU.RSQ:", sass.count("MUFU.RSQ"))
lib = ctypes.CDLL(f"{work}/k.so")
lib.run.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int]


def rows(rng, M, K):
    x = rng.standard_normal((M, K)) * np.exp2(rng.integers(-40, 40, size=(M, 1)))
    x[0] = 0.0
    x[1, ::3] = 3.3e38                                     # squares overflow: ss = Inf, rms = 0
    x[2] = rng.standard_normal(K) * 2.0 ** -120            # squares below f32
    x[3, 5] = np.nan
    x[4, 17] = -np.inf
    x[5] = rng.standard_normal(K) * np.exp2(rng.integers(-20, 20, size=K))
    x[6, 0] = 1.0
    x[6, 1:] = 2.0 ** -13                                  # order-sensitive sum
    return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)


cases = {}
rng = np.random.default_rng(4)
for name, M, K, res in [("m64_k1024", 64, 1024, False), ("m64_k1024_res", 64, 1024, True),
                        ("m300_k2048_res", 300, 2048, True), ("m8_k7168", 8, 7168, False)]:
    x = rows(rng, M, K)
    w = torch.from_numpy((1 + 0.5 * rng.standard_normal(K)).astype(np.float32)).to(torch.bfloat16)
    r = rows(rng, M, K).flip(0).contiguous() if res else None
    xd, wd = x.cuda(), w.cuda()
    rd = r.cuda() if res else None
    q = torch.empty((M, K), dtype=torch.uint8, device="cuda")
    s = torch.empty((M, K // 128), dtype=torch.float32, device="cuda")
    rms = torch.empty(M, dtype=torch.float32, device="cuda")
    lib.run(q.data_ptr(), s.data_ptr(), rms.data_ptr(), xd.data_ptr(), wd.data_ptr(), rd.data_ptr() if res else None,
            1e-6, M, K, 128)
    u16 = lambda t: t.cpu().view(torch.int16).numpy().view(np.uint16)
    cases[f"{name}.x"] = u16(x)
    cases[f"{name}.w"] = u16(w)
    if res:
        cases[f"{name}.residual"] = u16(r)
        cases[f"{name}.residual_out"] = u16(rd)
    cases[f"{name}.q"] = q.cpu().numpy()
    cases[f"{name}.scale"] = s.cpu().numpy()
    cases[f"{name}.rms"] = rms.cpu().numpy()
    print(name, "block", min(K, 512 if M <= 256 else 256), "codes 0x7e/0xfe:", int((q == 0x7E).sum() + (q == 0xFE).sum()))
np.savez_compressed(f"{OUT}/rmsnorm_vllm_h200.npz", **cases)
print("wrote", f"{OUT}/rmsnorm_vllm_h200.npz", os.path.getsize(f"{OUT}/rmsnorm_vllm_h200.npz"), "bytes")
