#!/usr/bin/env python3
"""Capture torch._scaled_mm (cuBLASLt 13.0, torch 2.11) on an H200 for the `hopper-tc` model's bitwise test.

One call writes $OUT/scaled_mm_h200.npz (compressed) and prints a log. Per case c (shape M,N,K; formats), the npz
holds the operands once:  c<i>_a [M,K] u8 codes, c<i>_b [N,K] u8 codes (B transposed, K-major), c<i>_meta (text),
and per output o:  c<i>_<o>_out  (f32 as u32 bits, bf16 as u16 bits), c<i>_<o>_sa, c<i>_<o>_sb (f32, logical
shapes: tensor [1]; rowwise [M] and [N]; blockwise [M, KB] and [NB, KB], row-major values), where <o> is
<scaling>_<out>_fast<0|1>. Outputs torch refuses are listed in the log as SKIP with the reason.

Cases (research/h200-cublas-fp8-model.md has the model and the split-K table):
  c0 (64,128,256)    e4m3 x e4m3, uniformly random finite codes (wide dynamic range)
  c1 (32,256,7168)   e4m3 x e4m3, normal values with a few large outliers (split-K 2 for tensorwise/blockwise)
  c2 (32,128,1040)   e4m3 x e4m3, uniform codes, K % 128 = 16: a partial last tile and a half-empty last step
  c3 (64,128,512)    e4m3 x e5m2 (mixed; not measured before), uniform codes
"""
import os
import sys

import numpy as np
import torch

out_dir = os.environ.get("OUT", sys.argv[1] if len(sys.argv) > 1 else "scaled_mm_capture")
os.makedirs(out_dir, exist_ok=True)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), flush=True)

E4 = torch.float8_e4m3fn
E5 = torch.float8_e5m2


def finite_codes(rng, shape, fmt):
    # uniformly random finite, non-NaN codes
    if fmt == "e4m3fn":
        c = rng.integers(0, 256, size=shape, dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] ^= 0x01  # NaN -> 0x7E / 0xFE
    else:
        c = rng.integers(0, 256, size=shape, dtype=np.uint8)
        bad = (c & 0x7C) == 0x7C  # Inf/NaN -> largest finite
        c[bad] = (c[bad] & 0x80) | 0x7B
    return c


def normal_codes(rng, shape, fmt, scale):
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * scale)
    big = torch.from_numpy(rng.random(shape) < 0.01)
    x = torch.where(big, x * 30, x).clamp(-440, 440)
    return x.to(E4 if fmt == "e4m3fn" else E5).view(torch.uint8).numpy()


def f32_scales(rng, shape):
    # generic f32 scales in [2^-3, 2^3): not powers of two, so the order of the scale multiplications matters
    return (2.0 ** rng.uniform(-3, 3, size=shape)).astype(np.float32)


CASES = [
    dict(M=64, N=128, K=256, fa="e4m3fn", fb="e4m3fn", kind="uniform"),
    dict(M=32, N=256, K=7168, fa="e4m3fn", fb="e4m3fn", kind="normal"),
    dict(M=32, N=128, K=1040, fa="e4m3fn", fb="e4m3fn", kind="uniform"),
    dict(M=64, N=128, K=512, fa="e4m3fn", fb="e5m2", kind="uniform"),
]

arrays = {}
stats = []
for ci, c in enumerate(CASES):
    M, N, K = c["M"], c["N"], c["K"]
    rng = np.random.default_rng(1000 + ci)
    if c["kind"] == "uniform":
        a = finite_codes(rng, (M, K), c["fa"])
        b = finite_codes(rng, (N, K), c["fb"])
    else:
        a = normal_codes(rng, (M, K), c["fa"], 2.0)
        b = normal_codes(rng, (N, K), c["fb"], 0.5)
    arrays[f"c{ci}_a"], arrays[f"c{ci}_b"] = a, b
    arrays[f"c{ci}_meta"] = np.array(f"M={M} N={N} K={K} fa={c['fa']} fb={c['fb']} kind={c['kind']}")
    ta = torch.from_numpy(a).view(E4 if c["fa"] == "e4m3fn" else E5).cuda()
    tb = torch.from_numpy(b).view(E4 if c["fb"] == "e4m3fn" else E5).cuda()
    KB, NB = (K + 127) // 128, (N + 127) // 128
    for scaling in ("tensor", "rowwise", "blockwise"):
        if scaling == "tensor":
            sa, sb = f32_scales(rng, (1,)), f32_scales(rng, (1,))
            dsa, dsb = torch.tensor(sa[0]).cuda(), torch.tensor(sb[0]).cuda()
        elif scaling == "rowwise":
            sa, sb = f32_scales(rng, (M,)), f32_scales(rng, (N,))
            dsa = torch.from_numpy(sa).cuda().view(M, 1)
            dsb = torch.from_numpy(sb).cuda().view(1, N)
        else:
            sa, sb = f32_scales(rng, (M, KB)), f32_scales(rng, (NB, KB))
            dsa = torch.from_numpy(sa).cuda().t().contiguous().t()  # (M, KB), M-major
            dsb = torch.from_numpy(sb).cuda().t()  # (KB, NB) view of the dense (NB, KB)
        for out_name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            for fast in (0, 1):
                o = f"{scaling}_{out_name}_fast{fast}"
                try:
                    r = torch._scaled_mm(ta, tb.t(), scale_a=dsa, scale_b=dsb, out_dtype=dt,
                                         use_fast_accum=bool(fast))
                    torch.cuda.synchronize()
                    r2 = torch._scaled_mm(ta, tb.t(), scale_a=dsa, scale_b=dsb, out_dtype=dt,
                                          use_fast_accum=bool(fast))
                    det = bool(torch.equal(r.view(torch.uint8), r2.view(torch.uint8)))
                except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/ValueError/NotImplementedError
                    print(f"c{ci} {o}: SKIP {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
                    continue
                if dt == torch.float32:
                    bits = r.cpu().view(torch.int32).numpy().view(np.uint32)
                else:
                    bits = r.cpu().view(torch.int16).numpy().view(np.uint16)
                arrays[f"c{ci}_{o}_out"] = bits
                arrays[f"c{ci}_{o}_sa"], arrays[f"c{ci}_{o}_sb"] = sa, sb
                # a quick look: the share equal to RNE of the f64 dequantized product (only a hint)
                af = ta.float().double().cpu().numpy()
                bf = tb.float().double().cpu().numpy()
                if scaling == "tensor":
                    ex = (af @ bf.T) * float(sa[0]) * float(sb[0])
                elif scaling == "rowwise":
                    ex = (af @ bf.T) * sa.astype(np.float64)[:, None] * sb.astype(np.float64)[None, :]
                else:
                    ex = np.zeros((M, N))
                    for kb in range(KB):
                        p = af[:, kb * 128:(kb + 1) * 128] @ bf[:, kb * 128:(kb + 1) * 128].T
                        ex += p * sa[:, kb:kb + 1] * np.repeat(sb[:, kb], 128)[None, :N]
                near = torch.from_numpy(ex).to(dt).cpu()
                same = (near.view(torch.uint8) == r.cpu().view(torch.uint8)).float().mean().item()
                print(f"c{ci} {o}: captured {M}x{N}, deterministic={det}, bytes equal to RN(f64 exact)={same:.3f}",
                      flush=True)
                stats.append(o)

np.savez_compressed(os.path.join(out_dir, "scaled_mm_h200.npz"), **arrays)
print("outputs captured:", len(stats))
print("done")
