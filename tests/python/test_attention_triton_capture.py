"""fp8ref's `vllm-triton-unified` paged attention against a GPU run of the same steps (Triton on an H100,
tools/device/capture_triton_attention.py; tests/data/h200/triton_unified_attention.npz).

Not a bitwise oracle, but close: fp8ref 0.4.0 models the GPU's tl.dot (mma.sync steps), tl.exp, division and sum
orders (docs/attention.md). What this pins down is how far apart they are, so that a user diffing a port of vLLM's
kernel knows what to expect: measured, 99.986 % of the bf16 outputs bit-equal with the tiles matched (`--tile 16`
against the GPU's 16-key run, the default 32 against its 32-key run, vLLM's 2D kernel's tile; 0.3.0: 99.976 %),
every other output within one bf16 ulp of its row's largest output; the 3D outputs 9,721 of 9,728 (the 7 others in
one row); with the tiles mismatched 84 %, and `exact` 52 %. The assertions hold those facts with a margin: >= 99.9 %
and <= 1 ulp matched, < 95 % mismatched, `exact` below the matched convention.
"""
import numpy as np
import pytest

CAPTURE = "h200/triton_unified_attention.npz"


def values(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def row_ulps(a, b):
    """|a − b| in bf16 ulps of the row's largest |b| (a row: one query head's Dv outputs); ulps of the element
    itself would call a sign flip of a near-zero output thousands of ulps."""
    big = np.max(np.abs(b), axis=-1, keepdims=True)
    ulp = np.exp2(np.floor(np.log2(np.maximum(big, 2.0 ** -126))) - 7)
    return np.abs(a - b) / ulp


def cases(test_data):
    path = test_data / CAPTURE
    if not path.exists():
        pytest.skip(f"missing capture {path}")
    d = np.load(path)
    return d, sorted({k.split("_")[0] for k in d.files})


def run(fp8ref, tmp_path, d, c, conv, *extra):
    names = {"q": "q", "qsl": "qsl", "kc": "kc", "vc": "vc", "ks": "ks", "vs": "vs", "bt": "bt", "sl": "sl"}
    for key in names:
        np.save(tmp_path / f"{key}.npy", d[f"{c}_{key}"])
    fp8ref("paged-attention", "--convention", conv, "--md", "bf16", "--q", tmp_path / "q.npy", "--query-start-loc",
           tmp_path / "qsl.npy", "--k-cache", tmp_path / "kc.npy", "--v-cache", tmp_path / "vc.npy", "--k-scale",
           tmp_path / "ks.npy", "--v-scale", tmp_path / "vs.npy", "--block-table", tmp_path / "bt.npy", "--seq-lens",
           tmp_path / "sl.npy", "-o", tmp_path / "out.npy", *extra, check=True)
    return np.load(tmp_path / "out.npy")


def tally(stats, key, ours, gpu):
    st = stats.setdefault(key, [0, 0, 0.0])
    st[0] += int(np.sum(ours == gpu))
    st[1] += ours.size
    st[2] = max(st[2], float(np.max(row_ulps(values(ours), values(gpu)))))


def test_vllm_triton_unified_against_the_gpu_run(fp8ref, test_data, tmp_path):
    d, names = cases(test_data)
    stats = {}
    for c in names:
        decode = f"{c}_out3d" in d.files  # decode-only batches: vLLM would run its 3D kernel (16 segments, tile 16)
        default = run(fp8ref, tmp_path, d, c, "vllm-triton-unified")  # as vLLM picks: 2D tile 32, or 3D
        tally(stats, ("default (as vLLM picks)", "GPU as vLLM picks"), default, d[f"{c}_out3d" if decode else f"{c}_out32"])
        if decode:
            tally(stats, ("default (as vLLM picks)", "GPU 3D"), default, d[f"{c}_out3d"])
        for tile in ("16", "32"):
            ours = run(fp8ref, tmp_path, d, c, "vllm-triton-unified", "--segments", "0", "--tile", tile)
            tally(stats, (f"--segments 0 --tile {tile}", f"GPU 2D tile {tile}"), ours, d[f"{c}_out{tile}"])
            if tile == "16":  # mismatched tiles
                tally(stats, ("--segments 0 --tile 16", "GPU 2D tile 32"), ours, d[f"{c}_out32"])
            if decode and tile == "32":  # the 2D model against the GPU's 3D run
                tally(stats, ("--segments 0 --tile 32", "GPU 3D"), ours, d[f"{c}_out3d"])
        exact = run(fp8ref, tmp_path, d, c, "exact")
        tally(stats, ("exact", "GPU as vLLM picks"), exact, d[f"{c}_out3d" if decode else f"{c}_out32"])
    for (ours, gpu), (eq, n, mx) in sorted(stats.items()):
        print(f"{ours} vs {gpu}: bit-equal {eq / n:.5f} of {n}, max {mx:.3f} bf16 ulps of the row's max |out|")
    for key in (("default (as vLLM picks)", "GPU as vLLM picks"), ("default (as vLLM picks)", "GPU 3D"),
                ("--segments 0 --tile 16", "GPU 2D tile 16"),
                ("--segments 0 --tile 32", "GPU 2D tile 32")):
        eq, n, mx = stats[key]
        assert eq / n >= 0.999 and mx <= 1.0, (key, stats)
    assert stats[("exact", "GPU as vLLM picks")][0] < stats[("default (as vLLM picks)", "GPU as vLLM picks")][0]
    for key in (("--segments 0 --tile 16", "GPU 2D tile 32"), ("--segments 0 --tile 32", "GPU 3D")):
        assert stats[key][0] / stats[key][1] < 0.95, (key, stats)
