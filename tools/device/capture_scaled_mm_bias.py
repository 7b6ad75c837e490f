#!/usr/bin/env python3
"""Capture torch._scaled_mm (torch 2.11, cuBLAS 13.0, H200) with f16 output and with a bias, for `hopper-tc`.

Writes $OUT/scaled_mm_bias_h200.npz (compressed): per case c<i> the operands c<i>_a [M,K] u8, c<i>_b [N,K] u8,
c<i>_meta; per output c<i>_<scaling>_<out>_fast<0|1>_<bias|nobias>_{out,sa,sb} and, with a bias, _bias (the bias
values as f32, exactly the bf16/f16 values passed). out: u16 bit patterns (bf16 or f16).
  c0 (64,128,256)   uniformly random finite e4m3fn codes
  c1 (32,128,2048)  normal values with a few outliers
"""
import os
import sys

import numpy as np
import torch

out_dir = os.environ.get("OUT", sys.argv[1] if len(sys.argv) > 1 else "scaled_mm_bias_capture")
os.makedirs(out_dir, exist_ok=True)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), flush=True)
E4 = torch.float8_e4m3fn


def finite_codes(rng, shape):
    c = rng.integers(0, 256, size=shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] ^= 0x01
    return c


def normal_codes(rng, shape, scale):
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * scale)
    big = torch.from_numpy(rng.random(shape) < 0.01)
    return torch.where(big, x * 30, x).clamp(-440, 440).to(E4).view(torch.uint8).numpy()


arrays = {}
n_out = 0
for ci, (M, N, K, kind) in enumerate([(64, 128, 256, "uniform"), (32, 128, 2048, "normal")]):
    rng = np.random.default_rng(2000 + ci)
    a = finite_codes(rng, (M, K)) if kind == "uniform" else normal_codes(rng, (M, K), 2.0)
    b = finite_codes(rng, (N, K)) if kind == "uniform" else normal_codes(rng, (N, K), 0.5)
    arrays[f"c{ci}_a"], arrays[f"c{ci}_b"] = a, b
    arrays[f"c{ci}_meta"] = np.array(f"M={M} N={N} K={K} fa=e4m3fn fb=e4m3fn kind={kind}")
    ta, tb = torch.from_numpy(a).view(E4).cuda(), torch.from_numpy(b).view(E4).cuda()
    KB, NB = (K + 127) // 128, (N + 127) // 128
    for scaling in ("tensor", "rowwise", "blockwise"):
        if scaling == "tensor":
            sa = (2.0 ** rng.uniform(-3, 3, (1,))).astype(np.float32)
            sb = (2.0 ** rng.uniform(-3, 3, (1,))).astype(np.float32)
            dsa, dsb = torch.tensor(sa[0]).cuda(), torch.tensor(sb[0]).cuda()
        elif scaling == "rowwise":
            sa = (2.0 ** rng.uniform(-3, 3, (M,))).astype(np.float32)
            sb = (2.0 ** rng.uniform(-3, 3, (N,))).astype(np.float32)
            dsa, dsb = torch.from_numpy(sa).cuda().view(M, 1), torch.from_numpy(sb).cuda().view(1, N)
        else:
            sa = (2.0 ** rng.uniform(-3, 3, (M, KB))).astype(np.float32)
            sb = (2.0 ** rng.uniform(-3, 3, (NB, KB))).astype(np.float32)
            dsa = torch.from_numpy(sa).cuda().t().contiguous().t()
            dsb = torch.from_numpy(sb).cuda().t()
        for out_name, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32) * 30).to(dt)
            for fast in (0, 1):
                for with_bias in (0, 1):
                    o = f"{scaling}_{out_name}_fast{fast}_{'bias' if with_bias else 'nobias'}"
                    try:
                        r = torch._scaled_mm(ta, tb.t(), scale_a=dsa, scale_b=dsb, out_dtype=dt,
                                             bias=bias.cuda() if with_bias else None, use_fast_accum=bool(fast))
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        print(f"c{ci} {o}: SKIP {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
                        continue
                    arrays[f"c{ci}_{o}_out"] = r.cpu().view(torch.int16).numpy().view(np.uint16)
                    arrays[f"c{ci}_{o}_sa"], arrays[f"c{ci}_{o}_sb"] = sa, sb
                    if with_bias:
                        arrays[f"c{ci}_{o}_bias"] = bias.float().numpy()
                    n_out += 1
                    print(f"c{ci} {o}: captured", flush=True)
np.savez_compressed(os.path.join(out_dir, "scaled_mm_bias_h200.npz"), **arrays)
print("outputs captured:", n_out)
