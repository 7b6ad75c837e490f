"""fp8ref's `vllm-triton-unified` against vLLM's own Triton kernels run on an H100, with sliding windows
(tools/device/capture_vllm_unified_attention.py, vLLM's triton_unified_attention.py at 001ceb3, launched by its own
`unified_attention`; tests/data/h200/vllm_unified_attention.npz, and vllm_unified_attention_f16.npz).

Eight bf16 batches: prefill chunks with G = 1 and G = 4 (the 2D kernel's q blocks of 16 and 4 rows), decode-only
batches on the 3D kernel (16 segments, most of them before the window) and one large enough for the 2D kernel, a
soft-capped mixed batch and the same batch without a window, a decode-only batch without a window (3D, contexts up to
4096), and G = 3 with and without a window (a q block's last row repeats the next block's first). Four f16 batches
(CAPTURE_SET=f16): e4m3fn and e5m2 caches, head dims 96 (padded to 128), 128 and 256, 2D and 3D kernels. Three bf16
batches with vLLM's fused output quantization (CAPTURE_SET=fp8out: output_scale, e4m3fn codes out; 2D and 3D): every
one of the 149,504 codes must match, and Triton's tl.clamp + e4m3fn store on NaN, ±Inf, ±500, −0 as captured. Three
bf16 decode-only batches on the 3D kernel with head dims 32 and 64 and two more at 32 with G = 8 and 16 and a soft-cap
(CAPTURE_SET=d32: reduce_segments with one and two segments a thread). Each ran
twice: on random inputs ("pos") and with every logit made <= 0 ("neg": K codes positive, q negative), where vLLM's
where(m_j > -inf, m_j, 0) guard sets M = 0 for a row whose first walked tile holds none of its keys.

fp8ref models the GPU's steps inside the kernels (docs/attention.md): tl.dot as mma.sync m16n8k16 steps in the k
order Triton gives operands converted from fp8 (ref::hmma16_dot_kw4), tl.exp, Triton's division, the FMA in L's
update, tl.sum's orders and, in reduce_segments, the products segm_output·w and L·w contracted into the first adds
(fp fusion). Every output of every run must be bit-equal: bf16 335,872, f16 172,032, fp8out 149,504 codes, d32
47,104. Before:
fp8ref 0.4.0 (reduce_segments' products rounded before the adds) 1 bf16 and 4 f16 outputs differed (3D decode); 0.3.0
(f32 FMA dots, Sleef's exp, IEEE division, sums in order) matched 99.936 % (215 differ) and 99.297 % (1,210 differ);
with the dots' steps in plain k order (16-bit loads' order) 99.992 % and 99.80 %; 0.2.0, without the guard, 98.0 %
of the neg variants of the windowed batches (80.3 % on the 3D decode batch).
"""
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest


CAPTURES = {  # file: (the capture's seed, query dtype and its ml_dtypes type)
    "h200/vllm_unified_attention.npz": (20261206, "bf16", ml_dtypes.bfloat16),
    "h200/vllm_unified_attention_f16.npz": (20261207, "f16", np.float16),
    "h200/vllm_unified_attention_fp8out.npz": (20261208, "bf16", ml_dtypes.bfloat16),  # output_scale: e4m3fn codes
    "h200/vllm_unified_attention_d32.npz": (20261209, "bf16", ml_dtypes.bfloat16),  # 3D decode, head dims 32 and 64
}


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_vllm_triton_unified_against_vllms_kernels(fp8ref, test_data, tmp_path, capture):
    path = test_data / capture
    if not path.exists():
        pytest.skip(f"missing capture {path}")
    seed, md, mdtype = CAPTURES[capture]
    d = np.load(path)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools" / "device"))
    from paged_inputs import dense_case
    rng = np.random.default_rng(seed)  # the capture's, over its cases in order
    stats = {}
    fp8out = "clamp" in d.files
    if fp8out:  # Triton's tl.clamp(x, -448, 448) stored as e4m3fn: NaN -> +448, ±Inf -> ±448, -0 kept
        assert d["clamp"][1].tolist() == [0x7E, 0xFE, 0x7E, 0x7E, 0xFE, 0x7E, 0x80, 0x00]
    for c in sorted({k.split("_")[0] for k in d.files if k[1:2].isdigit()}, key=lambda x: int(x[1:])):
        hkv, hq, dim, bs = (int(x) for x in d[f"{c}_case"])
        e5m2 = f"{c}_fmt" in d.files and int(d[f"{c}_fmt"][0]) == 1
        cache = ml_dtypes.float8_e5m2 if e5m2 else ml_dtypes.float8_e4m3fn
        inp = dense_case(rng, list(d[f"{c}_sl"]), list(d[f"{c}_ql"]), hkv, hq, dim, bs,
                         lambda x: x.astype(np.float32).astype(cache).view(np.uint8),
                         lambda x: x.astype(np.float32).astype(mdtype).view(np.uint16))
        for r, (window, cap_milli) in enumerate(d[f"{c}_runs"]):
            for variant in ("pos", "neg"):
                inputs = {key: inp[key] for key in ("qsl", "vc", "ks", "vs", "bt")}
                inputs["sl"] = d[f"{c}_sl"]
                q = inp["q"] | (0x8000 if variant == "neg" else 0)
                inputs["q"] = q.view(np.float16) if md == "f16" else q
                inputs["kc"] = inp["kc"] & (0x7F if variant == "neg" else 0xFF)
                for key, a in inputs.items():
                    np.save(tmp_path / f"{key}.npy", a)
                extra = ["--cache-format", "e5m2" if e5m2 else "e4m3fn"]
                if fp8out:
                    extra += ["--out-scale", repr(float(d[f"{c}_oscale"][0]))]
                if window >= 0:
                    extra += ["--window-left", str(window)]
                if cap_milli > 0:
                    extra += ["--softcap", str(cap_milli / 1000)]
                fp8ref("paged-attention", "--convention", "vllm-triton-unified", "--md", md, "--q",
                       tmp_path / "q.npy", "--query-start-loc", tmp_path / "qsl.npy", "--k-cache", tmp_path / "kc.npy",
                       "--v-cache", tmp_path / "vc.npy", "--k-scale", tmp_path / "ks.npy", "--v-scale",
                       tmp_path / "vs.npy", "--block-table", tmp_path / "bt.npy", "--seq-lens", tmp_path / "sl.npy",
                       "-o", tmp_path / "out.npy", *extra, check=True)
                ours, gpu = np.load(tmp_path / "out.npy"), d[f"{c}_out{r}_{variant}"]
                if not fp8out:
                    ours = ours.view(np.uint16)
                key = (variant, "window" if window >= 0 else "none")
                st = stats.setdefault(key, [0, 0])
                st[0] += int(np.sum(ours == gpu))
                st[1] += ours.size
                print(f"{c} run {r} {variant} window {window} cap {cap_milli / 1000}: bit-equal "
                      f"{np.mean(ours == gpu):.5f} of {ours.size}")
                assert np.array_equal(ours, gpu), (c, r, variant, int(np.sum(ours != gpu)))
    assert {k[0] for k in stats} == {"pos", "neg"}
    total = [sum(st[i] for st in stats.values()) for i in (0, 1)]
    print(f"all: bit-equal {total[0]} of {total[1]}")
