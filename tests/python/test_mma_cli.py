"""`fp8ref mma --model mma-sync-sm90` against FP8 mma.sync.m16n8k32 tiles captured on an H200
(tools/device/capture_mma.py -> tests/data/h200/mma_sm90/<fa>_<fb>/{A,BT,C,D,kind}.npy): bit for bit, every tile.

The hardware output is the oracle. As a check that the data can tell models apart, the correctly rounded result
(RNE of the exact sum, computed here in f64/numpy) must *not* explain the wide tiles.
"""
import ml_dtypes
import numpy as np
import pytest

PAIRS = [("e4m3fn", "e4m3fn"), ("e5m2", "e5m2"), ("e4m3fn", "e5m2"), ("e5m2", "e4m3fn")]
KINDS = ["narrow", "wide", "cancel", "spread", "subnorm", "special", "cspecial", "zerosign"]
DT = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def capture_dir(test_data, fa, fb):
    d = test_data / "h200" / "mma_sm90" / f"{fa}_{fb}"
    if not d.exists():
        pytest.skip(f"missing capture {d}")
    return d


@pytest.mark.parametrize("fa,fb", PAIRS)
def test_mma_sync_sm90_matches_h200_bitwise(fp8ref, test_data, tmp_path, fa, fb):
    d = capture_dir(test_data, fa, fb)
    out = tmp_path / "D.npy"
    fp8ref("mma", "--model", "mma-sync-sm90", "--format", fa, "--format-b", fb,
           d / "A.npy", d / "BT.npy", d / "C.npy", out, check=True)
    got = np.load(out).view(np.uint32)
    hw = np.load(d / "D.npy").view(np.uint32)
    kind = np.load(d / "kind.npy")
    assert got.shape == hw.shape
    bad = (got != hw).reshape(len(kind), -1).sum(axis=1)
    per_kind = {KINDS[k]: int(bad[kind == k].sum()) for k in np.unique(kind)}
    assert bad.sum() == 0, f"mismatching outputs per tile kind: {per_kind}"


@pytest.mark.parametrize("fa,fb", PAIRS[:2])
def test_capture_is_not_correctly_rounded(test_data, fa, fb):
    """Wide tiles: RNE(exact) explains only part of the hardware outputs (the model explains all)."""
    d = capture_dir(test_data, fa, fb)
    kind = np.load(d / "kind.npy")
    w = kind == KINDS.index("wide")
    a = np.load(d / "A.npy")[w].view(DT[fa]).astype(np.float64)
    b = np.load(d / "BT.npy")[w].view(DT[fb]).astype(np.float64)
    c = np.load(d / "C.npy")[w].astype(np.float64)
    exact = np.einsum("tmk,tnk->tmn", a, b)  # exact: 32 products on a 2^-32 grid, |sum| < 2^37
    rne = (exact + c).astype(np.float32)  # f64 add then f32: a statistic only (double rounding possible)
    rate = (rne.view(np.uint32) == np.load(d / "D.npy")[w].view(np.uint32)).mean()
    assert 0.2 < rate < 0.8, rate


def test_mma_single_tile_and_bad_input(fp8ref, test_data, tmp_path):
    d = capture_dir(test_data, "e4m3fn", "e4m3fn")
    A, BT, C, D = (np.load(d / f"{n}.npy") for n in ("A", "BT", "C", "D"))
    t = int(np.argmax(np.load(d / "kind.npy") == KINDS.index("wide")))
    for name, arr in (("a", A[t]), ("bt", BT[t]), ("c", C[t])):
        np.save(tmp_path / f"{name}.npy", arr)
    out = tmp_path / "d.npy"
    fp8ref("mma", "--model", "mma-sync-sm90", "--format", "e4m3fn", tmp_path / "a.npy", tmp_path / "bt.npy",
           tmp_path / "c.npy", out, check=True)
    assert np.array_equal(np.load(out).view(np.uint32), D[t].view(np.uint32))

    bad = tmp_path / "bad.npy"
    np.save(tmp_path / "a_f32.npy", A[t].astype(np.float32))
    np.save(tmp_path / "bt_short.npy", BT[t][:, :16])
    cases = [
        (["--model", "mma-sync-sm89", "--format", "e4m3fn"], "a.npy", "bt.npy", "unknown --model"),
        (["--model", "mma-sync-sm90", "--format", "e4m3fnuz"], "a.npy", "bt.npy", "e4m3fn or e5m2"),
        (["--model", "mma-sync-sm90", "--format", "e4m3fn"], "a_f32.npy", "bt.npy", "dtype"),
        (["--model", "mma-sync-sm90", "--format", "e4m3fn"], "a.npy", "bt_short.npy", "shape"),
    ]
    for flags, a_name, bt_name, msg in cases:
        proc = fp8ref("mma", *flags, tmp_path / a_name, tmp_path / bt_name, tmp_path / "c.npy", bad)
        assert proc.returncode == 2, proc.stderr
        assert msg in proc.stderr, proc.stderr
        assert not bad.exists()
