#!/usr/bin/env python3
"""H200 capture for fp8ref's quant conventions, part 2 (part 1: h200_quant_probe.py). One run writes $OUT/*.npz:

  triton_rcp.npz   Triton's fp32 division on NVIDIA (div.full.f32): the reciprocal table T(m) = Triton `1.0 / y` for
                   all 2^23 mantissas y = m in [1, 2), stored as the difference from RN(1/m) in ulps (int8), plus
                   ~30k (x, y, Triton x / y) triples over every operand class (normal, huge |y| >= 2^126, subnormal,
                   zero, Inf, NaN, results that overflow/underflow) for the test that the table reproduces x / y.
  quant_cuda.npz   the vLLM, sgl-kernel and sglang-JIT CUDA per-token-group quantizers (capture_quant_kernels.cu,
                   built here with nvcc -arch=sm_90) on bf16/f16(/f32) inputs, every scale layout they write.
  quant_triton.npz sglang's Triton _per_token_group_quant_8bit (row-major) and _per_token_group_quant_8bit_colmajor
                   (column-major TMA-aligned, f32 and ue8m0 scales), written from the sources cited in
                   research/quant-conventions.md §3.1–3.2, run under torch's Triton.
Inputs are stored too (small), so the tests do not depend on numpy's random streams.
The log prints, for the division model RN(x * T(m) * 2^-e), the mismatch count per operand class over 2^24 pairs each.
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
HERE = os.path.dirname(os.path.abspath(__file__))
dev = "cuda"
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())


def u32(t):
    return t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32)


# ---- 1. Triton division ---------------------------------------------------------------------------------------

@triton.jit
def rcp_kernel(y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(y_ptr + offs, mask=m, other=1.0)
    tl.store(o_ptr + offs, 1.0 / y, mask=m)


@triton.jit
def div_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=1.0)
    y = tl.load(y_ptr + offs, mask=m, other=1.0)
    tl.store(o_ptr + offs, x / y, mask=m)


def tdiv(x, y):
    o = torch.empty_like(x)
    n = x.numel()
    k = div_kernel[(triton.cdiv(n, 1024),)](x, y, o, n, BLOCK=1024)
    return o, k


n23 = 1 << 23
ym = (torch.arange(n23, device=dev, dtype=torch.int32) + 0x3F800000).view(torch.float32)  # [1, 2)
T = torch.empty_like(ym)
rcp_kernel[(triton.cdiv(n23, 1024),)](ym, T, n23, BLOCK=1024)
ieee = (1.0 / ym.double()).float()  # RN(1/m): 1/m is never an f32 midpoint, so double rounding cannot bite
diff = (T.view(torch.int32) - ieee.view(torch.int32)).cpu().numpy()
print("rcp table: diff from RN(1/m) in ulps:", {int(v): int(c) for v, c in zip(*np.unique(diff, return_counts=True))})
assert np.abs(diff).max() <= 127
T_np = T.cpu().numpy()

# the division model on the device: RN(x * T(m) * 2^(127-e)) computed exactly in f64, rounded once
Tdev = T.double()


def model(x, y):
    yb = y.view(torch.int32)
    e = (yb >> 23) & 0xFF
    mi = (yb & 0x7FFFFF).long()
    sgn = torch.where(yb < 0, -1.0, 1.0).double()
    r = Tdev[mi] * torch.pow(2.0, (127 - e).double()) * sgn
    return (x.double() * r).float()


def bits_to_f(b):
    return torch.from_numpy(b.astype(np.uint32).view(np.int32)).to(dev).view(torch.float32)


rng = np.random.default_rng(20261201)


def rand_f32(n, exp_lo, exp_hi, subnormal=False):
    m = rng.integers(0, 1 << 23, size=n, dtype=np.uint64)
    s = rng.integers(0, 2, size=n, dtype=np.uint64) << 31
    if subnormal:
        m = np.maximum(m, 1)
        return (s | m).astype(np.uint32)
    e = rng.integers(exp_lo, exp_hi + 1, size=n, dtype=np.uint64)
    return (s | (e << 23) | m).astype(np.uint32)


classes = {  # name: (x bits, y bits)
    "normal": (lambda n: (rand_f32(n, 64, 190), rand_f32(n, 64, 190))),
    "y_huge": (lambda n: (rand_f32(n, 100, 254), rand_f32(n, 253, 254))),
    "y_subnormal": (lambda n: (rand_f32(n, 1, 160), rand_f32(n, 0, 0, subnormal=True))),
    "y_tiny_normal": (lambda n: (rand_f32(n, 1, 120), rand_f32(n, 1, 3))),
    "x_subnormal": (lambda n: (rand_f32(n, 0, 0, subnormal=True), rand_f32(n, 100, 160))),
    "overflow": (lambda n: (rand_f32(n, 220, 254), rand_f32(n, 1, 40))),
    "underflow": (lambda n: (rand_f32(n, 1, 40), rand_f32(n, 200, 254))),
    "anything": (lambda n: (rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32),
                            rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32))),
}
keep = {}
kernel = None
for name, gen in classes.items():
    xb, yb = gen(1 << 24)
    x, y = bits_to_f(xb), bits_to_f(yb)
    got, kernel = tdiv(x, y)
    want = model(x, y)
    g, w = u32(got), u32(want)
    nan_both = np.isnan(g.view(np.float32)) & np.isnan(w.view(np.float32))
    bad = (g != w) & ~nan_both
    print(f"x/y model, {name}: {int(bad.sum())} of {len(g)} differ")
    idx = np.concatenate([np.nonzero(bad)[0][:2000], np.arange(2000)])
    keep[name] = (xb[idx], yb[idx], g[idx])
specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F800000, 0xBF800000, 1, 0x807FFFFF,
                     0x7F7FFFFF, 0x00800000, 0x7E800000, 0x7F000000, 0x3F7FFFFF, 0x40000000], dtype=np.uint32)
sx, sy = np.meshgrid(specials, specials)
sx, sy = sx.ravel(), sy.ravel()
got, _ = tdiv(bits_to_f(sx), bits_to_f(sy))
keep["specials"] = (sx, sy, u32(got))
# 1.0 / y itself (sglang-triton's y_s_inv) over the classes of y
r_y = np.concatenate([keep[k][1][:1000] for k in ("normal", "y_huge", "y_subnormal", "y_tiny_normal")] + [specials])
got_r = torch.empty(len(r_y), device=dev)
rcp_kernel[(triton.cdiv(len(r_y), 1024),)](bits_to_f(r_y), got_r, len(r_y), BLOCK=1024)
res = {"rcp_diff": diff.astype(np.int8), "rcp_y": r_y, "rcp_got": u32(got_r)}
for k, (a, b, c) in keep.items():
    res[f"div_{k}_x"], res[f"div_{k}_y"], res[f"div_{k}_q"] = a, b, c
np.savez_compressed(os.path.join(OUT, "triton_rcp.npz"), **res)
try:
    with open(os.path.join(OUT, "div_kernel.ptx"), "w") as f:
        f.write(kernel.asm["ptx"])
    cubin = os.path.join("/tmp", "div_kernel.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    with open(os.path.join(OUT, "div_kernel.sass"), "w") as f:
        f.write(sass)
except Exception as e:  # noqa: BLE001
    print("asm dump failed:", e)
del Tdev, ym, T, ieee
torch.cuda.empty_cache()

# ---- 2. inputs ------------------------------------------------------------------------------------------------
M, K = 254, 512  # M not a multiple of 4: TMA-aligned layouts get 2 pad rows


def adversarial(src):
    lo, hi = (-14, 10) if src == "f16" else (-30, 30)
    x = rng.standard_normal((M, K)) * np.exp2(rng.integers(lo, hi, size=(M, 1)))
    x[0] = 0.0
    x[1] = -0.0
    x[2] *= 2.0 ** -24 if src == "f16" else 1e-12
    x[3] = rng.standard_normal(K) * 1e-6
    x[4, 5] = np.nan
    x[5, 130] = np.inf
    x[6, 7] = -np.inf
    x[6, 200] = np.nan
    x[7, ::2], x[7, 1::2] = 448.0, -448.0
    x[8, 0] = 448.0 * 2.0 ** -5 * (1 + 2.0 ** -7)
    x[9, 0] = 448.0 * 8
    x[9, 1:] = rng.integers(-448, 449, size=K - 1) * 4.0
    x[10] = rng.standard_normal(K) * np.exp2(rng.integers(lo, hi, size=K))
    x[11, :128] = np.nan                                     # a group of NaN only
    x[12, 128:256] = np.inf                                  # a group of +Inf only
    x[13] = rng.standard_normal(K) * 2.0 ** -20             # small groups (f16: amax < 448 * 2^-16)
    x[14] = rng.standard_normal(K) * 2.0 ** 12
    if src == "f16":
        x = np.clip(np.nan_to_num(x, nan=np.nan, posinf=np.inf, neginf=-np.inf), -65504, 65504)
        x[5, 130], x[6, 7], x[12, 128:256] = np.inf, -np.inf, np.inf
    return x


TDT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
inputs = {}
for src in ("bf16", "f16", "f32"):
    inputs[src] = torch.tensor(adversarial(src), dtype=torch.float32).to(TDT[src]).to(dev).contiguous()
cap = {}
for src, t in inputs.items():
    cap[f"x_{src}"] = t.view(torch.int16 if src != "f32" else torch.int32).cpu().numpy().view(
        np.uint16 if src != "f32" else np.uint32)

# ---- 3. CUDA kernels ------------------------------------------------------------------------------------------
nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
so = "/tmp/capture_quant_kernels.so"
src_cu = os.path.join(HERE, "capture_quant_kernels.cu")
base = [nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-o", so, src_cu]
from torch.utils.cpp_extension import include_paths  # noqa: E402

r = subprocess.run(base + ["-DUSE_C10"] + [f"-I{p}" for p in include_paths()], capture_output=True, text=True)
c10 = r.returncode == 0
if not c10:
    print("c10 build failed, using the cvt for vLLM's cast:", r.stderr[-1500:])
    subprocess.run(base, check=True)
print("vLLM cast:", "c10::Float8_e4m3fn(float)" if c10 else "__nv_cvt_float_to_fp8 satfinite (identical after clamp)")
lib = ctypes.CDLL(so)
P = ctypes.c_void_p
DT = {"f32": 0, "f16": 1, "bf16": 2}
G = 128


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def check(rc, what):
    torch.cuda.synchronize()
    assert rc == 0, (what, rc)


def align4(n):
    return (n + 3) // 4 * 4


for src in ("bf16", "f16", "f32"):
    x = inputs[src]
    ng = M * K // G
    for ue in (0, 1):
        q = torch.full((M, K), 0xAA, dtype=torch.uint8, device=dev)
        s = torch.full((M, K // G), float("nan"), device=dev)
        check(lib.vllm_quant(DT[src], ue, ptr(x), ptr(q), ptr(s), ng, G), "vllm")
        cap[f"vllm_{src}_{ue}_q"], cap[f"vllm_{src}_{ue}_s"] = q.cpu().numpy(), u32(s)

SENT = 0x5A5A5A5A
for src in ("bf16", "f16"):
    for k in (512, 384):
        x = inputs[src][:, :k].contiguous()
        ng_row = k // G
        ng = M * ng_row
        # sgl-kernel: row-major f32 (M, G#); column-major TMA-aligned f32: storage (G#, align4(M)) seen as its .T[:M];
        # column-major packed ue8m0 (sglang's create_per_token_group_quant_fp8_output_scale): int32 storage
        # (ceil(G#/4)... aligned_k//4, align4(M)), the (M, aligned_k//4) view has size(1) = aligned_k//4, stride(1)
        # = align4(M). Only multiples of 4 groups index correctly in sgl-kernel (row_idx uses size(1)*4).
        if k == 512:
            for layout in (0, 1, 2):
                q = torch.full((M, k), 0xAA, dtype=torch.uint8, device=dev)
                if layout == 0:
                    store = torch.full((M, ng_row), SENT, dtype=torch.int32, device=dev)
                    rows, stride = ng_row, 1
                elif layout == 1:
                    store = torch.full((ng_row, align4(M)), SENT, dtype=torch.int32, device=dev)
                    view = store.view(torch.float32).T[:M]
                    rows, stride = view.size(1), view.stride(1)
                else:
                    store = torch.full((align4(ng_row) // 4, align4(M)), SENT, dtype=torch.int32, device=dev)
                    view = store.T[:M]
                    rows, stride = view.size(1), view.stride(1)
                check(lib.sglk_quant(DT[src], layout, ptr(x), ptr(q), ptr(store), ng, G, rows, stride), "sglk")
                cap[f"sglk_{src}_{layout}_q"], cap[f"sglk_{src}_{layout}_s"] = q.cpu().numpy(), u32(store)
        # sglang JIT: f32 row-major / f32 column-major TMA-aligned / ue8m0 column-major packed (aligned and not)
        for mode in (0, 1, 2):
            if mode != 2 and k != 512:
                continue
            q = torch.full((M, k), 0xAA, dtype=torch.uint8, device=dev)
            if mode == 0:
                store = torch.full((M, ng_row), SENT, dtype=torch.int32, device=dev)
                ts, gs = ng_row, 1
            elif mode == 1:
                store = torch.full((ng_row, align4(M)), SENT, dtype=torch.int32, device=dev)
                ts, gs = 1, align4(M)
            else:
                store = torch.full(((ng_row + 3) // 4, align4(M)), SENT, dtype=torch.int32, device=dev)
                ts, gs = 4, 4 * align4(M)
            check(lib.jit_quant(DT[src], mode, ptr(x), ptr(q), ptr(store), M, ng_row, G, ts, gs), "jit")
            cap[f"jit_{src}_{mode}_{k}_q"], cap[f"jit_{src}_{mode}_{k}_s"] = q.cpu().numpy(), u32(store)
cap["sentinel"] = np.array([SENT], dtype=np.uint32)
np.savez_compressed(os.path.join(OUT, "quant_cuda.npz"), **cap)


# ---- 4. Triton kernels (sglang fp8_kernel.py, newest stored version @0499419e / @008601fa) ------------------------

@triton.jit
def _per_token_group_quant_8bit(y_ptr, y_q_ptr, y_s_ptr, y_stride, N, eps, bit8_min, bit8_max,
                                BLOCK: tl.constexpr, SCALE_UE8M0: tl.constexpr):
    g_id = tl.program_id(0)
    y_ptr += g_id * y_stride
    y_q_ptr += g_id * y_stride
    y_s_ptr += g_id
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    y = tl.load(y_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    _absmax = tl.maximum(tl.max(tl.abs(y)), eps)
    y_s = _absmax / bit8_max
    if SCALE_UE8M0:
        y_s = tl.exp2(tl.ceil(tl.log2(tl.abs(y_s))))
    y_s_inv = 1.0 / y_s
    y_q = tl.clamp(y * y_s_inv, bit8_min, bit8_max).to(y_q_ptr.dtype.element_ty)
    tl.store(y_q_ptr + cols, y_q, mask=mask)
    tl.store(y_s_ptr, y_s)


@triton.jit
def _per_token_group_quant_8bit_colmajor(y_ptr, y_q_ptr, y_s_ptr, group_size, y_num_columns, y_s_col_stride, eps,
                                         bit8_min, bit8_max, BLOCK: tl.constexpr, SCALE_UE8M0: tl.constexpr):
    g_id = tl.program_id(0)
    y_ptr += g_id.to(tl.int64) * group_size
    y_q_ptr += g_id.to(tl.int64) * group_size
    blocks_per_row = y_num_columns // group_size
    scale_col = g_id % blocks_per_row
    scale_row = g_id // blocks_per_row
    y_s_ptr += scale_col * y_s_col_stride + scale_row
    cols = tl.arange(0, BLOCK)
    mask = cols < group_size
    y = tl.load(y_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    _absmax = tl.maximum(tl.max(tl.abs(y)), eps)
    y_s = _absmax / bit8_max
    if SCALE_UE8M0:
        y_s = tl.exp2(tl.ceil(tl.log2(tl.abs(y_s))))
    y_q = tl.clamp(y / y_s, bit8_min, bit8_max).to(y_q_ptr.dtype.element_ty)
    tl.store(y_q_ptr + cols, y_q, mask=mask)
    tl.store(y_s_ptr, y_s)


tcap = {}
for src in ("bf16", "f16", "f32"):
    x = inputs[src]
    ng = M * K // G
    for ue in (0, 1):
        q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=dev)
        s = torch.full((M, K // G), float("nan"), device=dev)
        _per_token_group_quant_8bit[(ng,)](x, q, s, G, G, 1e-10, bit8_min=-448.0, bit8_max=448.0, BLOCK=G,
                                           num_warps=1, num_stages=1, SCALE_UE8M0=bool(ue))
        tcap[f"row_{src}_{ue}_q"], tcap[f"row_{src}_{ue}_s"] = q.view(torch.uint8).cpu().numpy(), u32(s)
        # column-major, TMA-aligned: create_per_token_group_quant_fp8_output_scale(column_major_scales=True,
        # scale_tma_aligned=True): torch.empty((K/G, align4(M))).transpose(-1, -2)[:M]
        store = torch.full((K // G, align4(M)), SENT, dtype=torch.int32, device=dev)
        xs = store.view(torch.float32).transpose(-1, -2)[:M, :]
        q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=dev)
        _per_token_group_quant_8bit_colmajor[(ng,)](x, q, xs, G, K, xs.stride(1), 1e-10, bit8_min=-448.0,
                                                    bit8_max=448.0, BLOCK=G, num_warps=1, num_stages=1,
                                                    SCALE_UE8M0=bool(ue))
        tcap[f"col_{src}_{ue}_q"], tcap[f"col_{src}_{ue}_s"] = q.view(torch.uint8).cpu().numpy(), u32(store)
torch.cuda.synchronize()
np.savez_compressed(os.path.join(OUT, "quant_triton.npz"), **tcap)
for f in sorted(os.listdir(OUT)):
    print(f, os.path.getsize(os.path.join(OUT, f)))
print("DONE")
