#!/usr/bin/env python3
"""Run FlashInfer's FA2 batch prefill kernel (BatchPrefillWithPagedKVCacheDispatched, as FlashInfer's
BatchPrefillWithPagedKVCacheWrapper runs it with backend "fa2" -- the backend its "auto" picks on Hopper for a bf16
query over an FP8 KV cache) over a paged e4m3 KV cache on the GPU, causal, for fp8ref's `flashinfer` prefill
convention.

FlashInfer is not part of fp8ref and the device machine has no FlashInfer: give the path of the include/ directory of
a FlashInfer release (flashinfer-python 0.7.4's flashinfer/data/include; the kernel is header-only) as the first
argument. The harness capture_flashinfer_prefill.cu drives the kernel as FlashInfer's csrc does: PrefillPlan
(csrc/batch_prefill.cu, with the arguments the wrapper's plan() passes), then the PagedParams set-up of
csrc/batch_prefill_paged.cuh and DISPATCH_CTA_TILE_Q over BatchPrefillWithPagedKVCacheDispatched; PagedParams is the
struct batch_prefill_customize_config.jinja renders for these settings (sm_scale is a double there), the variant
DefaultAttention<false, window, false, false>, SAME_KV_STRIDES true (the "equal" primary module the wrapper uses when
K and V have identical strides), CTA_TILE_Q chosen by the plan.
Adaptations to the toolkit: FlashInfer 0.7.4's fastdiv.cuh wraps cuda::fast_mod_div, which CUDA 13.0's CCCL lacks;
the copy compiled here divides with plain integer / and % (the same quotients: page, slot and head indices only).
FlashInfer's JIT builds with -use_fast_math -DNDEBUG, its FLASHINFER_ENABLE_* defines and -gencode for sm_90a; the
driver compiles with those flags too (FI_JIT_FLAGS=0: the plain `nvcc -O3 -std=c++17 -arch=sm_90
--expt-relaxed-constexpr` of the decode harness). enable_pdl follows the wrapper's default (compute capability >= 9);
FI_ENABLE_PDL=0/1 overrides it (launch overlap only).
As FlashInfer's Python wrapper does, the K scale is folded into sm_scale (a Python float: 1/math.sqrt(D) * k_scale,
handed to the kernel as that double; the kernel computes sm_scale * log2e in double and rounds it to float) and the
V scale applied after the kernel in the output dtype (`out *= v_scale` on the bf16 CUDA tensor: float product, RNE
to bf16), skipped when v_scale == 1.

The inputs come from paged_inputs.prefill_case (numpy only, from a seed), so the capture keeps only what the GPU gave.
Writes $OUT/flashinfer_prefill.npz: per case c<i>: _case [seed, Hkv, Hq, D, page, window_left (-1: none)] int64,
_seq_lens [B] int32 (KV lengths, the new chunk included), _q_lens [B] int32, _plan [cta_tile_q, split_kv,
kv_chunk_size (tokens), padded_batch_size] int64 (what PrefillPlan chose), _kernel [num_mma_kv, cta_tile_kv, num_sm,
enable_pdl] int64 (the KV tile the launcher picked, by occupancy), _out [qo_indptr[B], Hq, D] uint16 (bf16 bits, after
the V scale), _lse [qo_indptr[B], Hq] float32 (the kernel's lse, log2 base, max + log2(sum exp2), without scales);
and meta_device, meta_nvcc_flags (strings), meta_other_nvcc_flags and meta_other_flags_differences (each case is
also run once from a build with the other flag set -- plain vs JIT flags -- and the differing output and lse values
are counted: 0 expected; -1 with FI_COMPARE_FLAGS=0). Every case runs twice; the two runs must agree bit for bit.
A float64 reference (numpy) checks each output loosely (a mis-driven kernel -- masks, strides, scales -- fails it by
far; then the npz is written as flashinfer_prefill_FAILED.npz and the script exits non-zero).
"""
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from flashinfer_include import prepared_include  # noqa: E402 (this script's directory)

work, src_inc = prepared_include(sys.argv[1] if len(sys.argv) > 1 else "", "prefill.cuh")
out_dir = os.environ.get("OUT", "flashinfer_capture")
os.makedirs(out_dir, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
major, minor = torch.cuda.get_device_capability(0)
num_sm = torch.cuda.get_device_properties(0).multi_processor_count
device = f"{torch.cuda.get_device_name(0)} (sm_{major}{minor}, {num_sm} SMs)"
print("torch", torch.__version__, device, flush=True)
harness = os.path.join(here, "capture_flashinfer_prefill.cu")

arch = f"{major}{minor}" + ("a" if major >= 9 else "")
JIT_FLAGS = ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "--expt-relaxed-constexpr",
             "-use_fast_math", "-DNDEBUG", "-DFLASHINFER_ENABLE_F16", "-DFLASHINFER_ENABLE_BF16",
             "-DFLASHINFER_ENABLE_FP8_E4M3", "-DFLASHINFER_ENABLE_FP8_E5M2", "-DFLASHINFER_ENABLE_FP8_E8M0",
             "-DFLASHINFER_ENABLE_FP4_E2M1"]
PLAIN_FLAGS = ["-O3", "-std=c++17", "-arch=sm_90", "--expt-relaxed-constexpr"]
FLAGS = JIT_FLAGS if os.environ.get("FI_JIT_FLAGS", "1") != "0" else PLAIN_FLAGS
# also build with the other flag set and compare its outputs (FI_COMPARE_FLAGS=0: skip): fast math (FTZ) and the
# defines are not expected to change any output of these inputs
COMPARE = os.environ.get("FI_COMPARE_FLAGS", "1") != "0"
OTHER_FLAGS = PLAIN_FLAGS if FLAGS is JIT_FLAGS else JIT_FLAGS
print("nvcc", " ".join(FLAGS), flush=True)
# FI_MD=f16: q and output in float16 (DTypeQ = DTypeO = half: P rounded to f16, f16 HMMA), six of the cases below,
# q the same values as the bf16 draws (exact in f16) -> flashinfer_prefill_f16.npz
F16 = os.environ.get("FI_MD", "bf16") == "f16"


def build(key):
    d, window, other = key
    exe = os.path.join(work, f"fi_prefill_{d}_{window}{'_other' if other else ''}")
    subprocess.run(["nvcc", *(OTHER_FLAGS if other else FLAGS), f"-DFI_HEAD_DIM={d}", f"-DFI_WINDOW={window}",
                    f"-DFI_F16={int(F16)}", "-I", src_inc, "-o", exe, harness], check=True)
    return key, exe


sys.path.insert(0, here)
from paged_inputs import prefill_case  # noqa: E402

CASES = [  # seed, seq_lens (KV lengths incl. the new chunk), q_lens, Hkv, Hq, D, page size, window_left (-1: none)
    (101, [700, 333], [9, 13], 1, 8, 128, 16, -1),                        # chunked prefill, G 8, CTA 128, split
    (102, [128, 100, 90], [24, 30, 20], 1, 4, 64, 16, -1),                # chunked prefill, KV <= 128: no split
    (103, [300, 77, 1, 1000, 45], [1, 12, 1, 1, 20], 1, 4, 128, 16, -1),  # decode rows + prefill rows, G 4
    (104, [129, 700], [40, 20], 2, 2, 128, 16, -1),                       # G 1, CTA 64
    (105, [45], [13], 4, 4, 128, 16, -1),                                 # one short sequence: CTA 16
    (106, [1500], [120], 1, 2, 64, 64, -1),                               # one long sequence: CTA 128, page 64
    (107, [200, 64], [6, 12], 2, 4, 256, 16, -1),                         # D 256, CTA 64
    (108, [300], [3], 2, 8, 256, 1, -1),                                  # D 256, CTA 16, page 1
    (109, [4096, 3000], [16, 1], 1, 8, 128, 16, -1),                      # few long KV: split into many chunks
    (110, [600, 250], [14, 22], 2, 4, 128, 16, 100),                      # sliding window, split
    (111, [100, 128], [60, 28], 2, 2, 64, 1, 20),                         # sliding window, page 1, no split
    (112, [1000, 500, 64], [8, 1, 24], 1, 8, 64, 64, -1),                 # G 8, page 64, D 64
    (113, [150 + 7 * i for i in range(34)], [1 + (i % 4 == 0) for i in range(34)], 8, 8, 64, 16, -1),  # 34 Q tiles
    (114, [280 + 3 * i for i in range(12)], [1 + i % 2 for i in range(12)], 8, 8, 64, 16, -1),  # budget-sized chunk
]
if F16:
    CASES = [CASES[i] for i in (0, 2, 4, 6, 9, 12)]


def cdiv(a, b):
    return -(-a // b)


def fa2_plan(seq_lens, q_lens, hkv, hq, d, page, window_left, num_sm):
    """FlashInfer 0.7.4's PrefillSplitQOKVIndptr as the wrapper calls it (no CUDA graph, fixed_split_size -1, split
    allowed, head dims <= 256, sm80+): [cta_tile_q, split_kv, kv_chunk_size, padded_batch_size]. A cross-check."""
    B, G = len(seq_lens), hq // hkv
    pages = [max(cdiv(s, page), 1) for s in seq_lens]  # kv_indptr is the page indptr
    packed = [q * G for q in q_lens]
    avg = sum(packed) // B  # FA2DetermineCtaTileQ(avg packed qo len)
    cta = 128 if (avg > 64 and d < 256) else (64 if avg > 16 else 16)
    tiles_q = [cdiv(p, cta) for p in packed]
    eff = [min(cdiv(window_left + cta, page), n) if window_left >= 0 else n for n in pages]
    budget = (2 * num_sm) // hkv  # max_batch_size_if_split: 2 CTAs per SM over the KV heads
    lo, hi = max(128 // page, 1), max([1] + eff)  # PrefillBinarySearchKVChunkSize, in pages
    max_kv = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(t * cdiv(max(e, 1), mid) for t, e in zip(tiles_q, eff)) > budget:
            lo = mid + 1
        else:
            hi = mid
    padded = sum(t * cdiv(max(e, 1), lo) for t, e in zip(tiles_q, eff))
    return [cta, int(lo < max_kv), lo * page, padded]


def expected_num_mma_kv(d, cta, smem_per_sm, smem_optin):
    """The NUM_MMA_KV BatchPrefillWithPagedKVCacheDispatched picks for bf16 q over e4m3 KV, d <= 256, no RoPE, no
    token-head scales (its shared-memory occupancy budget: 2 CTAs per SM when they fit). A cross-check."""
    num_mma_q = 2 if cta > 64 else 1
    warps_q = 4 if cta > 16 else 1
    warps_kv = 4 // warps_q
    repack = d != 64 and cta > 16  # use_kv_repack: one-byte KV dequantized into a 16-bit staging tile
    per_mma_kv = 2 * d * 16 * warps_kv + (d * 16 * warps_kv * 2 if repack else 0)
    fixed = cta * d * 2
    min_valid = warps_q // 2 if warps_q > 2 else 1
    ctas = 2 if smem_per_sm >= 2 * (fixed + min_valid * per_mma_kv) else 1
    n = min((min(smem_per_sm // ctas, smem_optin) - fixed) // per_mma_kv, 8 // num_mma_q)
    return next(k for k in (8, 4, 2, 1) if n >= k)


def e4m3_values(codes):
    c = codes.astype(np.int64)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * np.exp2(e - 7.0))
    return np.where(c & 0x80, -mag, mag)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def md_values(bits):
    return bits.view(np.float16).astype(np.float64) if F16 else bf16_values(bits)


def reference(c, seq_lens, q_lens, hkv, hq, d, page, window):
    """float64 causal (bottom-right) attention with the scales, for a loose check of the capture."""
    q = md_values(c["q"])
    kc, vc = e4m3_values(c["kc"]), e4m3_values(c["vc"])
    scale = (1.0 / math.sqrt(d)) * float(c["ks"][0])
    out = np.zeros(q.shape)
    for b, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        j = np.arange(s)
        pg = c["indices"][c["indptr"][b] + j // page]
        k, v = kc[pg, j % page], vc[pg, j % page]  # [s, hkv, d]
        for i in range(ql):
            pos = s - ql + i
            lo = max(0, pos - window) if window >= 0 else 0
            row = c["qo_indptr"][b] + i
            for h in range(hq):
                kh = h // (hq // hkv)
                logits = k[lo:pos + 1, kh] @ q[row, h] * scale
                p = np.exp(logits - logits.max())
                out[row, h] = (p @ v[lo:pos + 1, kh]) / p.sum() * float(c["vs"][0])
    return out


need = sorted({(d, int(window >= 0), other) for (_, _, _, _, _, d, _, window) in CASES
               for other in ((0, 1) if COMPARE else (0,))})
with ThreadPoolExecutor(max_workers=min(len(need), os.cpu_count() or 4)) as pool:
    binaries = dict(pool.map(build, need))
print("built", sorted(binaries), flush=True)

res = {"meta_device": np.array(device), "meta_nvcc_flags": np.array(" ".join(FLAGS))}
bad, flag_diffs = [], []
for i, (seed, seq_lens, q_lens, hkv, hq, d, page, window) in enumerate(CASES):
    B = len(seq_lens)
    c = prefill_case(seed, seq_lens, q_lens, hkv, hq, d, page)
    if F16:
        c["q"] = bf16_values(c["q"]).astype(np.float16).view(np.uint16)
    case_dir = os.path.join(work, f"c{i}")
    os.makedirs(case_dir)
    for name, key in (("q", "q"), ("qo_indptr", "qo_indptr"), ("k", "kc"), ("v", "vc"), ("indptr", "indptr"),
                      ("indices", "indices"), ("last", "last")):
        c[key].tofile(os.path.join(case_dir, f"{name}.bin"))
    pages = c["kc"].shape[0]
    total_q = int(c["qo_indptr"][-1])
    sm_scale = 1.0 / math.sqrt(d)
    sm_scale *= float(c["ks"][0])  # FlashInfer's run(): sm_scale *= k_scale (Python floats)
    cmd = [binaries[(d, int(window >= 0), 0)], case_dir, str(B), str(hq), str(hkv), str(d), str(page), str(pages),
           repr(sm_scale), str(window)]
    outs = []
    for rep in range(2):
        run = subprocess.run(cmd, capture_output=True, text=True)
        print(run.stdout.strip(), run.stderr.strip()[-2000:], flush=True)
        run.check_returncode()
        outs.append((np.fromfile(os.path.join(case_dir, "o.bin"), np.uint16),
                     np.fromfile(os.path.join(case_dir, "lse.bin"), np.float32), run.stdout.split()))
    (o_bits, lse, plan), (o_bits2, lse2, plan2) = outs
    assert np.array_equal(o_bits, o_bits2) and np.array_equal(lse.view(np.uint32), lse2.view(np.uint32)), \
        f"case {i}: two runs differ"
    assert plan == plan2
    if COMPARE:
        run = subprocess.run([binaries[(d, int(window >= 0), 1)]] + cmd[1:], capture_output=True, text=True)
        if run.returncode != 0:  # the comparison is informative only: keep the capture
            print(f"WARNING case {i}: the other-flags build failed: {run.stderr.strip()[-500:]}", flush=True)
        else:
            o3 = np.fromfile(os.path.join(case_dir, "o.bin"), np.uint16)
            l3 = np.fromfile(os.path.join(case_dir, "lse.bin"), np.float32)
            n_o, n_l = int(np.sum(o3 != o_bits)), int(np.sum(l3.view(np.uint32) != lse.view(np.uint32)))
            flag_diffs.append(n_o + n_l)
            print(f"case {i}: other nvcc flags: {n_o} outputs and {n_l} lse values differ"
                  + ("" if run.stdout.split() == plan else f", plan differs: {run.stdout.strip()}"), flush=True)
    val = {k: int(plan[plan.index(k) + 1]) for k in ("cta_tile_q", "split_kv", "kv_chunk_size", "padded_batch_size",
                                                     "num_mma_kv", "cta_tile_kv", "num_sm", "enable_pdl")}
    o = torch.from_numpy(o_bits.view(np.int16).reshape(total_q, hq, d)).view(torch.float16 if F16 else torch.bfloat16).to("cuda")
    vs = float(c["vs"][0])
    if vs != 1.0:
        o *= vs  # FlashInfer's run(): `out *= v_scale` for a non-FP8 output
    o = o.cpu().view(torch.int16).numpy().view(np.uint16)
    assert not np.any((o & (0x7C00 if F16 else 0x7F80)) == (0x7C00 if F16 else 0x7F80)), f"case {i}: a NaN/Inf output"
    assert np.all(np.isfinite(lse)), f"case {i}: a non-finite lse"
    lse = lse.reshape(total_q, hq)
    plan_v = [val["cta_tile_q"], val["split_kv"], val["kv_chunk_size"], val["padded_batch_size"]]
    expect = fa2_plan(seq_lens, q_lens, hkv, hq, d, page, window, num_sm)
    if plan_v != expect:
        print(f"WARNING case {i}: plan {plan_v} differs from the Python replica {expect}", flush=True)
    exp_kv = expected_num_mma_kv(d, val["cta_tile_q"], int(plan[plan.index("smem_per_sm") + 1]),
                                 int(plan[plan.index("smem_per_block_optin") + 1]))
    if val["num_mma_kv"] < 0:
        print(f"WARNING case {i}: the launched NUM_MMA_KV could not be identified (expected {exp_kv})", flush=True)
    elif val["num_mma_kv"] != exp_kv:
        print(f"WARNING case {i}: NUM_MMA_KV {val['num_mma_kv']} differs from the replica's {exp_kv}", flush=True)
    ref = reference(c, seq_lens, q_lens, hkv, hq, d, page, window)
    err = np.abs(md_values(o) - ref).max() / max(np.abs(ref).max(), 1e-30)
    if not err < 0.1:  # a mis-driven kernel (masks, window, strides, scales) is off by far more
        bad.append(i)
    elif not err < 0.02:  # bf16 rounding of P, of split-KV partials and of the output stays below ~0.5%
        print(f"WARNING case {i}: relative error {err:.2e} vs the float64 reference is larger than expected",
              flush=True)
    res.update({f"c{i}_case": np.array([seed, hkv, hq, d, page, window], np.int64),
                f"c{i}_seq_lens": np.array(seq_lens, np.int32),
                f"c{i}_q_lens": np.array(q_lens, np.int32),
                f"c{i}_plan": np.array(plan_v, np.int64),
                f"c{i}_kernel": np.array([val["num_mma_kv"], val["cta_tile_kv"], val["num_sm"], val["enable_pdl"]],
                                         np.int64),
                f"c{i}_out": o,
                f"c{i}_lse": lse})
    print(f"case {i}: B {B} rows {total_q} Hq {hq} Hkv {hkv} D {d} page {page} window {window}: plan {plan_v} "
          f"kernel tile_kv {val['cta_tile_kv']}; max |out - f64 ref| / max |ref| = {err:.2e}", flush=True)

res["meta_other_flags_differences"] = np.array(sum(flag_diffs) if COMPARE else -1, np.int64)
res["meta_other_nvcc_flags"] = np.array(" ".join(OTHER_FLAGS) if COMPARE else "")
stem = "flashinfer_prefill_f16" if F16 else "flashinfer_prefill"
name = f"{stem}_FAILED.npz" if bad else f"{stem}.npz"
np.savez_compressed(os.path.join(out_dir, name), **res)
print("wrote", name, sum(a.nbytes for a in res.values()), "bytes raw,",
      os.path.getsize(os.path.join(out_dir, name)), "compressed", flush=True)
if bad:
    sys.exit(f"cases {bad} are far from the float64 reference: the capture went to {name} for inspection only")
