#!/usr/bin/env python3
"""H200 capture of CUDA `rsqrtf` (the rsqrt of vLLM's RMSNorm kernels, layernorm_utils.cuh compute_rms), for
fp8ref's `rsqrt=cuda-rsqrtf` (include/fp8ref/rmsnorm.h). One run writes $OUT/rsqrtf_sm90.npz:

  table   int8 [2^24]: rsqrtf(u) − base(u) in f32 ulps (bit patterns) for u = (1 + m·2^-23)·2^p, p in {0, 1},
          index p·2^23 + m — every input in [1, 4); base(u) = f32(1 / sqrt(f64(u))) (IEEE f64 sqrt and division,
          then RNE to f32: computed identically by numpy and C++).
  pairs   uint32 [n, 2]: (u bits, rsqrtf(u) bits) for random u over every class: all exponents, subnormals, ±0,
          ±Inf, NaN, negatives — for the test that the model reproduces rsqrtf (tests/test_rmsnorm_quant.cc).
  torch_same, triton_same: whether torch.rsqrt (CUDA) and Triton tl.math.rsqrt equal rsqrtf on the pairs.
The log prints the model check (table + scaling by 4^k, subnormals prescaled by 2^24) over 2^24 random inputs.
The CUDA code is compiled here with nvcc -O2 -arch=sm_90, no fast-math (as vLLM builds its kernels).
"""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import triton
import triton.language as tl

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())

CU = r"""
#include <cstdint>
__global__ void k_rsqrtf(const float* u, float* o, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) o[i] = rsqrtf(u[i]);
}
extern "C" void run_rsqrtf(const float* u, float* o, long n) {
  k_rsqrtf<<<(unsigned)((n + 255) / 256), 256>>>(u, o, n);
  cudaDeviceSynchronize();
}
"""
work = "/tmp/rsqrtf_build"
os.makedirs(work, exist_ok=True)
with open(f"{work}/k.cu", "w") as f:
    f.write(CU)
nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
subprocess.run([nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", f"{work}/k.so",
                f"{work}/k.cu"], check=True)
lib = ctypes.CDLL(f"{work}/k.so")
lib.run_rsqrtf.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
sass = subprocess.run(["cuobjdump", "-sass", f"{work}/k.so"], capture_output=True, text=True).stdout
print("SASS of rsqrtf:", " | ".join(l.strip() for l in sass.splitlines() if "MUFU" in l or "FSETP" in l or "FMUL" in l))


def rsqrtf(bits):
    u = torch.from_numpy(bits.astype(np.uint32).view(np.int32)).cuda().view(torch.float32)
    o = torch.empty_like(u)
    lib.run_rsqrtf(u.data_ptr(), o.data_ptr(), u.numel())
    return o.view(torch.int32).cpu().numpy().view(np.uint32), u


@triton.jit
def tl_rsqrt_kernel(u_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.math.rsqrt(tl.load(u_ptr + offs, mask=m, other=1.0)), mask=m)


def base_bits(bits):
    u = bits.view(np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        return (1.0 / np.sqrt(u)).astype(np.float32).view(np.uint32)


# 1. the table over [1, 4)
i = np.arange(1 << 24, dtype=np.uint32)
ubits = ((127 + (i >> 23)) << 23) | (i & 0x7FFFFF)
dev, _ = rsqrtf(ubits)
diff = dev.astype(np.int64) - base_bits(ubits).astype(np.int64)
print("table: diff histogram", {int(k): int(v) for k, v in zip(*np.unique(diff, return_counts=True))})
assert np.abs(diff).max() < 127
table = diff.astype(np.int8)


# 2. the model, as the C++ will compute it
def model(bits):
    bits = bits.astype(np.uint32)
    out = np.zeros_like(bits)
    f = bits.view(np.float32)
    e = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    sign = bits >> 31
    nan = np.isnan(f) | ((sign == 1) & (bits != 0x80000000))
    out[nan] = 0x7FFFFFFF
    out[bits == 0] = 0x7F800000
    out[bits == 0x80000000] = 0xFF800000
    out[bits == 0x7F800000] = 0
    fin = ~nan & ((bits & 0x7FFFFFFF) != 0) & (bits != 0x7F800000)
    # subnormal: u·2^24 is normal; rsqrt(u) = rsqrt(u·2^24)·2^12
    sub = fin & (e == 0)
    nb = bits.copy()
    nb[sub] = (f[sub].astype(np.float64) * 2.0 ** 24).astype(np.float32).view(np.uint32)
    e2 = ((nb >> 23) & 0xFF).astype(np.int64)
    m2 = nb & 0x7FFFFF
    p = (e2 - 127) & 1
    k = (e2 - 127 - p) // 2
    idx = (p << 23) | m2
    u0 = ((127 + p) << 23) | m2
    r0 = (base_bits(u0.astype(np.uint32)).astype(np.int64) + table[idx]).astype(np.uint32)
    # r = r0 · 2^-k (and · 2^12 for subnormals): exponent field shift
    shift = -k + np.where(sub, 12, 0)
    res = (r0.astype(np.int64) + (shift << 23)).astype(np.uint32)
    out[fin] = res[fin]
    return out


rng = np.random.default_rng(2026)
n = 1 << 24
rnd = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
rnd[: 1 << 20] &= 0x807FFFFF  # subnormals and zeros of both signs
rnd[1 << 20: 1 << 21] = (rnd[1 << 20: 1 << 21] & 0x007FFFFF) | 0x3F800000  # [1, 2)
specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 1, 0x7F7FFFFF, 0x00800000,
                     0x3F800000, 0x40800000, 0x3E800000], dtype=np.uint32)
rnd[-len(specials):] = specials
dev_r, u_t = rsqrtf(rnd)
mod = model(rnd)
devn = dev_r.view(np.float32)
same = (dev_r == mod) | (np.isnan(devn) & np.isnan(mod.view(np.float32)))
print(f"model check: {int((~same).sum())} mismatches of {n} random inputs "
      f"(positive normal {int((~same & (rnd >> 31 == 0) & ((rnd >> 23) & 0xFF > 0)).sum())})")
bad = np.nonzero(~same)[0][:10]
for b in bad:
    print(f"  u {rnd[b]:#010x} dev {dev_r[b]:#010x} model {mod[b]:#010x}")
nan_bits = np.unique(dev_r[np.isnan(devn)])
print("NaN results:", [hex(x) for x in nan_bits[:5]])

# 3. torch.rsqrt (CUDA) and Triton tl.math.rsqrt on the same inputs
t_torch = torch.rsqrt(u_t).view(torch.int32).cpu().numpy().view(np.uint32)
o = torch.empty_like(u_t)
tl_rsqrt_kernel[(triton.cdiv(n, 1024),)](u_t, o, n, BLOCK=1024)
t_tr = o.view(torch.int32).cpu().numpy().view(np.uint32)
pos = (rnd >> 31 == 0) & ((rnd & 0x7FFFFFFF) < 0x7F800000)
torch_same = float(((t_torch == dev_r) | ~pos).mean())
triton_same = float(((t_tr == dev_r) | ~pos).mean())
print(f"torch.rsqrt == rsqrtf on {torch_same:.6f} of finite non-negative inputs; Triton tl.math.rsqrt: {triton_same:.6f}")
rn_same = float(((base_bits(rnd) == dev_r) | ~pos).mean())
print(f"rsqrtf == f32(1/sqrt(f64)) (≈ correctly rounded) on {rn_same:.6f}")

keep = np.concatenate([np.arange(0, 1 << 20, 64), np.arange(1 << 20, 1 << 21, 64), np.arange(1 << 21, n, 1024),
                       np.arange(n - len(specials), n)])
pairs = np.stack([rnd[keep], dev_r[keep]], axis=1)
np.savez_compressed(f"{OUT}/rsqrtf_sm90.npz", table=table, pairs=pairs, torch_same=torch_same,
                    triton_same=triton_same, rn_same=rn_same, mismatches=int((~same).sum()))
print("wrote", f"{OUT}/rsqrtf_sm90.npz", os.path.getsize(f"{OUT}/rsqrtf_sm90.npz"), "bytes;", len(pairs), "pairs")
