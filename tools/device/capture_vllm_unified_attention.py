#!/usr/bin/env python3
"""Run vLLM's own Triton unified attention (vllm/attention/ops/triton_unified_attention.py) on the GPU, on batches
with sliding windows, for fp8ref's `vllm-triton-unified` convention (tests/python/test_attention_vllm_capture.py).

vLLM is not installed on the device machine and its code is not part of fp8ref: give the path of that one file (read
at vLLM commit 001ceb3) as the first argument or in $VLLM_TUA. The file imports vllm.logger, vllm.platforms and
vllm.triton_utils; small stand-ins are put in sys.modules (a logger, fp8_dtype() = float8_e4m3fn, Triton itself).
vLLM's own `unified_attention` launches the kernels, so its choice of kernel (2D for any prefill or more than 128
query blocks x KV heads, else 3D with 16 segments and reduce_segments) is vLLM's. One mend at the launch: at 001ceb3
the 2D kernel's parameters are named USE_MM_PREFIX / mm_prefix_ranges while unified_attention passes USE_PREFIX_LM /
prefix_lens_ptr to it; the kernel object is wrapped to rename them (False / 0: no prefix-LM here).

Every case runs twice: on its random inputs ("pos": logits of both signs), and with every K code made positive and q
negative ("neg": every logit <= 0), where vLLM's where(m_j > -inf, m_j, 0) guard, which a row meets when the first
tile its program walks holds none of its keys, shows in the bits.

Writes $OUT/vllm_unified_attention.npz, outputs only: the inputs come from paged_inputs.dense_case with one
np.random.default_rng(20261206) over the cases in order (the test replays it, casting with ml_dtypes: the same RNE as
torch's). Per case c<i>: _case [Hkv, Hq, D, block size], _sl [B] seq_lens, _ql [B] query lengths int32, _runs [R, 2]
int32 (per run: window_left, softcap·1000), _out<r>_pos / _out<r>_neg [T, Hq, D] uint16 (bf16 bits of run r). The
neg inputs are derived: kc & 0x7F, vc unchanged, q | 0x8000 (the caches: NHD e4m3fn codes, unused slots 0x7F; a
dense block table, -1 past a sequence's pages).
"""
import importlib.util
import logging
import os
import sys
import types

import numpy as np
import torch
import triton
import triton.language as tl

path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("VLLM_TUA", "")
if not os.path.isfile(path):
    sys.exit("give the path of vLLM's triton_unified_attention.py (argument or $VLLM_TUA)")
out_dir = os.environ.get("OUT", "vllm_attn_capture")
os.makedirs(out_dir, exist_ok=True)
dev = torch.device("cuda")
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), flush=True)

# stand-ins for the three vllm modules the file imports
for name in ("vllm", "vllm.logger", "vllm.platforms", "vllm.triton_utils"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["vllm.logger"].init_logger = logging.getLogger
sys.modules["vllm.platforms"].current_platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)
sys.modules["vllm.triton_utils"].tl = tl
sys.modules["vllm.triton_utils"].triton = triton
spec = importlib.util.spec_from_file_location("vllm_tua", path)
tua = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tua)

kernel_2d = tua.kernel_unified_attention_2d
if "USE_MM_PREFIX" in kernel_2d.arg_names:  # the 001ceb3 name mismatch (see above)
    class Renamed2D:
        def __getitem__(self, grid):
            def launch(**kw):
                kw["USE_MM_PREFIX"] = kw.pop("USE_PREFIX_LM")
                prefix = kw.pop("prefix_lens_ptr")
                kw["mm_prefix_ranges"] = 0 if prefix is None else prefix
                return kernel_2d[grid](**kw)
            return launch
    tua.kernel_unified_attention_2d = Renamed2D()
used = []  # which kernel each case ran
for kname in ("kernel_unified_attention_2d", "kernel_unified_attention_3d"):
    inner = getattr(tua, kname)

    class Spy:
        def __init__(self, inner, kname):
            self.inner, self.kname = inner, kname

        def __getitem__(self, grid):
            used.append(self.kname[-2:])
            return self.inner[grid]
    setattr(tua, kname, Spy(inner, kname))

# CAPTURE_SET=f16: a second set (vllm_unified_attention_f16.npz): f16 queries (the f16 tensor-core datapath), caches
# in e4m3fn and e5m2, head dims 96 (padded to 128), 128 and 256 (reduce_segments' layout with two warps along the
# dims), with its own seed 20261207; per case also c<i>_fmt (0: e4m3fn, 1: e5m2).
F16 = os.environ.get("CAPTURE_SET", "") == "f16"
# CAPTURE_SET=fp8out: a third set (vllm_unified_attention_fp8out.npz): bf16 queries and vLLM's fused output
# quantization (unified_attention's output_scale: an e4m3fn out tensor; per case c<i>_oscale [1] f32, outputs uint8
# codes), seed 20261208; and `clamp` [2, 8] f32: Triton's tl.clamp(x, -448, 448) cast to e4m3fn (codes as f32) for
# x = NaN, -Inf, +Inf, 500, -500, 447.9, -0.0, 1e-10.
FP8OUT = os.environ.get("CAPTURE_SET", "") == "fp8out"
# CAPTURE_SET=d32: a fourth set (vllm_unified_attention_d32.npz): bf16, decode-only batches on the 3D kernel with head
# dims 32 (reduce_segments' layout: one segment per thread, the products segm_output·w go straight into the shuffles)
# and 64 (two per thread), seed 20261209.
D32 = os.environ.get("CAPTURE_SET", "") == "d32"
CASES = [  # seq_lens, q_lens, Hkv, Hq, D, block size, runs: (window_left (-1: none), softcap)
    ([200, 90, 33], [40, 1, 33], 2, 2, 64, 16, [(37, 0.0)]),               # G = 1: q blocks of 16 rows
    ([150, 260], [9, 1], 2, 8, 64, 64, [(20, 0.0)]),                       # G = 4: 4 rows a block
    ([700, 300, 5, 1500], [1, 1, 1, 1], 2, 16, 64, 16, [(100, 0.0)]),      # decode: 3D, segments before the window
    ([900, 64], [1, 1], 1, 16, 128, 64, [(63, 0.0)]),                      # decode, G = 16
    (list(range(60, 300, 20)), [1] * 12, 8, 64, 32, 16, [(50, 0.0)]),     # decode, 144 blocks x KV heads: 2D
    ([300, 77, 1, 140], [1, 3, 1, 20], 2, 16, 128, 16, [(45, 30.0), (-1, 0.0)]),  # mixed: soft-cap; no window
    ([1000, 257, 31, 4096], [1, 1, 1, 1], 2, 16, 128, 16, [(-1, 0.0)]),   # decode, no window: 3D, 16 segments
    ([300, 150], [12, 1], 2, 6, 64, 16, [(20, 0.0), (-1, 0.0)]),          # G = 3: a q block's last row repeats
]
CASES_F16 = [  # the same fields, then the cache format
    ([120, 300], [17, 1], 2, 8, 128, 16, [(-1, 0.0)], "e4m3fn"),           # 2D, G = 4
    ([500, 2000, 64], [1, 1, 1], 2, 16, 256, 16, [(-1, 0.0)], "e5m2"),     # decode: 3D, D = 256
    ([400, 90], [33, 1], 4, 16, 96, 16, [(30, 0.0)], "e5m2"),              # D = 96 (padded), window
    ([800, 33, 260], [1, 1, 1], 1, 8, 128, 64, [(-1, 0.0)], "e4m3fn"),    # decode: 3D, G = 8
]
CASES_FP8OUT = [  # the same fields, then the output scale
    ([120, 300], [17, 1], 2, 8, 128, 16, [(-1, 0.0)], "e4m3fn", 0.0123),          # 2D
    ([700, 300, 5, 1500], [1, 1, 1, 1], 2, 16, 64, 16, [(-1, 0.0)], "e4m3fn", 0.002),  # 3D (some outputs saturate)
    ([400, 90], [33, 1], 4, 16, 96, 16, [(30, 0.0)], "e4m3fn", 0.05),               # 2D, window
]
CASES_D32 = [  # the fields of CASES
    ([700, 300, 5, 1500], [1, 1, 1, 1], 2, 16, 32, 16, [(-1, 0.0), (100, 0.0)]),  # 3D, D = 32
    ([1000, 257, 31, 4096], [1, 1, 1, 1], 2, 16, 32, 16, [(-1, 0.0)]),            # 3D, D = 32, 16 segments
    ([900, 2000, 64], [1, 1, 1], 2, 16, 64, 16, [(-1, 0.0)]),                      # 3D, D = 64, no window
    ([3000, 2500, 1800, 4000, 700, 1200], [1] * 6, 4, 32, 32, 16, [(-1, 0.0)]),    # 3D, D = 32, G = 8
    ([4096, 3333, 2222, 1111], [1] * 4, 2, 32, 32, 64, [(-1, 0.0), (-1, 20.0)]),    # 3D, D = 32, G = 16, soft-cap
]
if F16:
    CASES = CASES_F16
if D32:
    CASES = CASES_D32
if FP8OUT:
    CASES = CASES_FP8OUT
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paged_inputs import dense_case  # noqa: E402

rng = np.random.default_rng(20261207 if F16 else 20261208 if FP8OUT else 20261209 if D32 else 20261206)
res = {}
qdt = torch.float16 if F16 else torch.bfloat16
for i, case in enumerate(CASES):
    seq_lens, q_lens, hkv, hq, d, bs, runs = case[:7]
    cdt = torch.float8_e5m2 if len(case) > 7 and case[7] == "e5m2" else torch.float8_e4m3fn
    inp = dense_case(rng, seq_lens, q_lens, hkv, hq, d, bs,
                     lambda x: torch.tensor(x, dtype=torch.float32).to(cdt).view(torch.uint8).numpy(),
                     lambda x: torch.tensor(x, dtype=torch.float32).to(qdt).view(torch.int16).numpy().view(
                         np.uint16))
    q16, kc, vc, bt, qsl, ks, vs = (inp[k] for k in ("q", "kc", "vc", "bt", "qsl", "ks", "vs"))
    T = int(qsl[-1])
    res.update({f"c{i}_case": np.array([hkv, hq, d, bs], np.int32), f"c{i}_sl": np.array(seq_lens, np.int32),
                f"c{i}_ql": np.array(q_lens, np.int32),
                f"c{i}_runs": np.array([[w, int(round(c * 1000))] for w, c in runs], np.int32)})
    if F16:
        res[f"c{i}_fmt"] = np.array([1 if cdt == torch.float8_e5m2 else 0], np.int32)
    oscale = torch.tensor([case[8]], dtype=torch.float32, device=dev) if FP8OUT else None
    if FP8OUT:
        res[f"c{i}_oscale"] = oscale.cpu().numpy()
    for (r, (window, cap)), variant in ((rc, v) for rc in enumerate(runs) for v in ("pos", "neg")):
        kv = kc if variant == "pos" else kc & 0x7F
        qv = q16 if variant == "pos" else q16 | 0x8000
        q = torch.from_numpy(qv.view(np.int16)).view(qdt).to(dev)
        k = torch.from_numpy(kv).to(dev).view(cdt)
        v = torch.from_numpy(vc).to(dev).view(cdt)
        out = torch.empty((T, hq, d), dtype=torch.float8_e4m3fn if FP8OUT else qdt, device=dev)
        used.clear()
        tua.unified_attention(
            q=q, k=k, v=v, out=out, cu_seqlens_q=torch.from_numpy(qsl).to(dev), max_seqlen_q=max(q_lens),
            seqused_k=torch.tensor(seq_lens, dtype=torch.int32, device=dev), max_seqlen_k=max(seq_lens),
            softmax_scale=float(1.0 / np.sqrt(d)), causal=True, window_size=(window, 0) if window >= 0 else (-1, -1),
            block_table=torch.from_numpy(bt).to(dev), softcap=cap, q_descale=None,
            k_descale=torch.from_numpy(ks).to(dev), v_descale=torch.from_numpy(vs).to(dev),
            **({"output_scale": oscale} if FP8OUT else {}))
        torch.cuda.synchronize()
        if FP8OUT:
            o = out.cpu().view(torch.uint8).numpy()
            assert not np.any((o & 0x7F) == 0x7F), "a NaN output: a read outside the valid keys?"
        else:
            o = out.cpu().view(torch.int16).numpy().view(np.uint16)
            special = 0x7C00 if F16 else 0x7F80
            assert not np.any((o & special) == special), "a NaN/Inf output: a read outside the valid keys?"
        res[f"c{i}_out{r}_{variant}"] = o
        print(f"case {i} run {r} {variant}: kernels {used}, T {T}, Hq {hq}, D {d}, window {window}, cap {cap}",
              flush=True)

if FP8OUT:  # tl.clamp and the e4m3fn store on specials
    @triton.jit
    def clamp_kernel(x_ptr, o_ptr):
        i = tl.arange(0, 8)
        tl.store(o_ptr + i, tl.clamp(tl.load(x_ptr + i), -448.0, 448.0).to(tl.float8e4nv))

    xs = torch.tensor([float("nan"), -float("inf"), float("inf"), 500, -500, 447.9, -0.0, 1e-10], device=dev)
    o8 = torch.empty(8, dtype=torch.float8_e4m3fn, device=dev)
    clamp_kernel[(1,)](xs, o8)
    res["clamp"] = np.stack([xs.cpu().numpy(), o8.view(torch.uint8).cpu().numpy().astype(np.float32)])
    print("clamp:", res["clamp"])
name = "vllm_unified_attention_f16.npz" if F16 else "vllm_unified_attention_fp8out.npz" if FP8OUT else \
    "vllm_unified_attention_d32.npz" if D32 else "vllm_unified_attention.npz"
np.savez_compressed(os.path.join(out_dir, name), **res)
print("wrote", sorted(res)[:6], "...", sum(a.nbytes for a in res.values()), "bytes raw", flush=True)
