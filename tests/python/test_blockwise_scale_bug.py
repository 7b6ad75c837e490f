"""The torch 2.11 + cuBLAS 13.0 blockwise-scale bug, captured on an H200 (tools/device/capture_blockwise_scale_bug.py,
data tests/data/h200/blockwise_K*.npz), must be caught by `fp8ref diff` and localized to the 128x128 blocks whose
weight scales cuBLAS misreads: n-block 0 exact, every n-block after it wrong (K/128 = 5, not a multiple of 4).
The control capture (K/128 = 4) must pass bit for bit.

The expected output is computed here independently (exact-sum data: integer e4m3 values, power-of-two scales,
so the blockwise GEMM is exact in f64 and the bf16 output is one RNE rounding of it).
"""
import json
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import golden_runner  # noqa: E402

OUTPUTS = json.dumps({"output.out": {"role": "data", "format": "bf16", "contract": "exact", "dims": ["row", "col"]}})


def blockwise_exact(a_codes, b_codes, sa, sb_of):
    """out[m, n] = sum_kb (sum_k a[m,k] b[n,k]) * sa[m,kb] * sb_of(n//128, kb), in f64 (exact for this data)."""
    a = a_codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    b = b_codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    M, K = a.shape
    N = b.shape[0]
    out = np.zeros((M, N))
    for kb in range(K // 128):
        p = a[:, kb * 128:(kb + 1) * 128] @ b[:, kb * 128:(kb + 1) * 128].T
        sbn = np.array([sb_of(n // 128, kb) for n in range(N)])
        out += p * sa[:, kb:kb + 1] * sbn[None, :]
    return out


def write_case(path, out_bits, backend):
    golden_runner.write(path, {"output.out": out_bits.view(ml_dtypes.bfloat16)},
                        {"fp8ref.outputs": OUTPUTS, "fp8ref.backend": backend})


def load(test_data, K):
    path = test_data / "h200" / f"blockwise_K{K}.npz"
    if not path.exists():
        pytest.skip(f"missing capture {path}")
    return np.load(path)


@pytest.mark.parametrize("K", [640, 512])
def test_capture_is_what_cublas_computes_with_its_scale_stride(test_data, K):
    d = load(test_data, K)
    kb_count = K // 128
    stride4 = (kb_count + 3) // 4 * 4
    # cuBLAS's reading: weight scale (nb, kb) at flat offset nb * roundup(K/128, 4) + kb of the scale buffer
    misread = blockwise_exact(d["a"], d["b"], d["sa"], lambda nb, kb: d["sb_buffer"][nb * stride4 + kb])
    assert np.array_equal(misread.astype(ml_dtypes.bfloat16).view(np.uint16), d["out"])
    correct = blockwise_exact(d["a"], d["b"], d["sa"], lambda nb, kb: d["sb"][nb, kb])
    same = np.array_equal(correct.astype(ml_dtypes.bfloat16).view(np.uint16), d["out"])
    assert same == (K == 512)  # the control has no bug; K/128 = 5 has


def test_diff_localizes_the_misread_weight_scales(fp8ref, test_data, tmp_path):
    d = load(test_data, 640)
    correct = blockwise_exact(d["a"], d["b"], d["sa"], lambda nb, kb: d["sb"][nb, kb])
    expected, actual = tmp_path / "expected.safetensors", tmp_path / "h200.safetensors"
    write_case(expected, correct.astype(ml_dtypes.bfloat16).view(np.uint16), "exact")
    write_case(actual, d["out"], "torch-2.11+cublas-13.0 on H200")
    proc = fp8ref("diff", expected, actual, "--json", tmp_path / "report.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    (t,) = report["tensors"]
    assert t["verdict"] == "FAIL"
    blocks = {b["name"]: b for b in t["structure"]["breakdowns"]}
    blk = blocks["block 128x128"]
    # 2 x 3 blocks of 128x128: the 2 blocks of n-block 0 are clean, the 4 others all wrong
    assert blk["units"] == 6 and blk["units_with_mismatch"] == 4
    mism = {e["unit"]: e["mismatches"] for e in blk["top"]}
    bad_cols = {u % 3 for u in mism}
    assert bad_cols == {1, 2}, blk
    assert all(n > 0.99 * 128 * 128 for n in mism.values()), blk
    # and the text report says where
    assert "block 128x128" in proc.stdout


def test_diff_passes_the_control(fp8ref, test_data, tmp_path):
    d = load(test_data, 512)
    correct = blockwise_exact(d["a"], d["b"], d["sa"], lambda nb, kb: d["sb"][nb, kb])
    expected, actual = tmp_path / "expected.safetensors", tmp_path / "h200.safetensors"
    write_case(expected, correct.astype(ml_dtypes.bfloat16).view(np.uint16), "exact")
    write_case(actual, d["out"], "torch-2.11+cublas-13.0 on H200")
    proc = fp8ref("diff", expected, actual)
    assert proc.returncode == 0, proc.stdout + proc.stderr
