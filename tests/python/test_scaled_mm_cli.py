"""`fp8ref scaled-mm` / `scaled-bmm` from the shell: bad input exits 2 and writes nothing; scaled-bmm with
per-batch (per-sequence) scales, shared scales and a shared B equals scaled-mm per batch; the `fast` model stays
within its bound of `exact` (checked here against an f64 computation that is exact for this data)."""
import ml_dtypes
import numpy as np
import pytest


def save(tmp_path, **arrays):
    for k, v in arrays.items():
        np.save(tmp_path / f"{k}.npy", v)
    return {k: tmp_path / f"{k}.npy" for k in arrays}


def codes(rng, shape, fmt=ml_dtypes.float8_e4m3fn, amax=4.0):
    return (rng.standard_normal(shape) * amax / 3).astype(fmt).view(np.uint8)


def mm(fp8ref, p, *flags, out="out", scaling="tensor", model="exact", od="f32", cmd="scaled-mm", a="a", bt="bt",
       sa="sa", sb="sb"):
    return fp8ref(cmd, "--format", "e4m3fn", "--scaling", scaling, "--model", model, "--out-dtype", od, *flags,
                  p[a], p[bt], p[sa], p[sb], p[a].parent / f"{out}.npy")


@pytest.fixture
def case(tmp_path):
    rng = np.random.default_rng(3)
    return save(tmp_path, a=codes(rng, (8, 256)), bt=codes(rng, (16, 256)), sa=np.array([0.5], np.float32),
                sb=np.array([1.25], np.float32), sa_row=np.ones((8, 1), np.float32),
                sb_bad=np.ones((2, 2), np.float32), sa_nan=np.array([np.nan], np.float32),
                bt_k=codes(rng, (16, 192)), a_f32=np.zeros((8, 256), np.float32))


@pytest.mark.parametrize("what,kwargs,flags,message", [
    ("mismatched K", {"bt": "bt_k"}, [], "mismatched K"),
    ("scale shape", {"scaling": "blockwise", "sb": "sb_bad"}, [], "blockwise scaling needs"),
    ("rowwise scale as tensor", {"sa": "sa_row"}, [], "SA has shape"),
    ("NaN scale", {"sa": "sa_nan"}, [], "NaN"),
    ("A not codes", {"a": "a_f32"}, [], "uint8"),
    ("hopper-tc mx", {"scaling": "mx", "model": "hopper-tc"}, [], "mx"),
    ("fast accum blockwise", {"scaling": "blockwise", "model": "hopper-tc"}, ["--promote", "never"], "fast accumulation"),
    ("split-k on exact", {}, ["--split-k", "2"], "split-k"),
])
def test_bad_input_exits_2_and_writes_nothing(fp8ref, case, what, kwargs, flags, message):
    proc = mm(fp8ref, case, *flags, **kwargs)
    assert proc.returncode == 2, (what, proc.stdout, proc.stderr)
    assert message in proc.stderr, (what, proc.stderr)
    assert not (case["a"].parent / "out.npy").exists()


def test_unsupported_format_pair_exits_2(fp8ref, case):
    proc = fp8ref("scaled-mm", "--format", "e4m3fnuz", "--scaling", "tensor", "--model", "exact", "--out-dtype", "f32",
                  case["a"], case["bt"], case["sa"], case["sb"], case["a"].parent / "out.npy")
    assert proc.returncode == 2 and "e4m3fnuz" in proc.stderr
    proc = fp8ref("scaled-mm", "--format", "e4m3fn", "--scaling", "tensor", "--model", "nope", "--out-dtype", "f32",
                  case["a"], case["bt"], case["sa"], case["sb"], case["a"].parent / "out.npy")
    assert proc.returncode == 2 and "unknown --model" in proc.stderr


def test_scaled_bmm_per_batch_scales_and_shared_b(fp8ref, tmp_path):
    rng = np.random.default_rng(9)
    B, M, N, K = 3, 5, 130, 300
    a = codes(rng, (B, M, K))
    bt = codes(rng, (N, K))  # one B for every batch
    KB = -(-K // 128)
    sa = (2.0 ** rng.uniform(-3, 3, (B, M, KB))).astype(np.float32)  # per batch
    sb = (2.0 ** rng.uniform(-3, 3, (2, KB))).astype(np.float32)  # shared
    ks = (2.0 ** rng.uniform(-3, 3, (B,))).astype(np.float32)  # per-sequence tensor scales [B]
    p = save(tmp_path, a=a, bt=bt, sa=sa, sb=sb, ks=ks, one=np.array([1.0], np.float32))
    for model in ("exact", "hopper-tc"):
        proc = mm(fp8ref, p, cmd="scaled-bmm", scaling="blockwise", model=model, od="bf16", out="bmm")
        assert proc.returncode == 0, proc.stderr
        got = np.load(tmp_path / "bmm.npy")
        assert got.shape == (B, M, N)
        for b in range(B):
            pb = save(tmp_path, ab=a[b], sab=sa[b])
            proc = mm(fp8ref, {**p, **pb}, a="ab", sa="sab", scaling="blockwise", model=model, od="bf16", out="mm")
            assert proc.returncode == 0, proc.stderr
            assert np.array_equal(np.load(tmp_path / "mm.npy"), got[b]), (model, b)
    # tensor scaling with one scale per sequence: out[b] = exact(a[b] @ bt.T) * ks[b] (powers-of-two-free check
    # against f64: the products are exact and the sum of 300 e4m3 products is exact in f64)
    proc = mm(fp8ref, p, cmd="scaled-bmm", sa="ks", sb="one", out="seq")
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "seq.npy")
    af = a.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    bf = bt.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for b in range(B):
        dot = af[b] @ bf.T  # exact
        want = (dot * np.float64(ks[b])).astype(np.float32)  # dot·ks exact in f64 (≤ 53 bits), one rounding
        assert np.array_equal(got[b], want), b
    # the same per-sequence scales as [B, 1] (scaled-mm's [1] with the batch dimension in front)
    proc = mm(fp8ref, {**p, **save(tmp_path, ks1=ks.reshape(B, 1))}, cmd="scaled-bmm", sa="ks1", sb="one", out="seq1")
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "seq1.npy"), got)


def test_exact_matches_f64_when_f64_is_exact(fp8ref, tmp_path):
    """Integer-valued codes and power-of-two scales: the exact result is exact in f64, so exact = RN(f64)."""
    rng = np.random.default_rng(11)
    M, N, K = 7, 33, 1000
    a = rng.integers(-8, 9, (M, K)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    bt = rng.integers(-8, 9, (N, K)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    KB = -(-K // 128)
    sa = np.ldexp(1.0, rng.integers(-5, 5, (M, KB))).astype(np.float32)
    sb = np.ldexp(1.0, rng.integers(-5, 5, (N, KB))).astype(np.float32)
    p = save(tmp_path, a=a, bt=bt, sa=sa, sb=sb)
    af = a.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    bf = bt.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    want = np.zeros((M, N))
    for kb in range(KB):
        sl = slice(kb * 128, (kb + 1) * 128)
        want += (af[:, sl] @ bf[:, sl].T) * sa[:, kb:kb + 1] * sb[:, kb][None, :]
    for od, dt in (("f32", np.float32), ("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        for backend in ("cpu", "reference"):
            proc = mm(fp8ref, p, "--backend", backend, scaling="group", od=od, out="x")
            assert proc.returncode == 0, proc.stderr
            got = np.load(tmp_path / "x.npy")
            with np.errstate(over="ignore"):  # f16: overflow to Inf, as the model rounds
                    assert np.array_equal(got.view(np.uint16 if od != "f32" else np.uint32),
                                      want.astype(dt).view(np.uint16 if od != "f32" else np.uint32)), (od, backend)


def test_f16_output_is_float16_and_identify_reads_either_form(fp8ref, case):
    """OUT for --out-dtype f16 is '<f2' (as paged-attention and convert write f16); --identify reads a device output
    as '<f2' or as uint16 bit patterns."""
    d = case["a"].parent
    proc = mm(fp8ref, case, od="f16", model="hopper-tc")
    assert proc.returncode == 0, proc.stderr
    got = np.load(d / "out.npy")
    assert got.dtype == np.float16 and got.shape == (8, 16)
    for name, arr in (("dev_f2", got), ("dev_u2", got.view(np.uint16))):
        np.save(d / f"{name}.npy", arr)
        proc = mm(fp8ref, case, "--identify", od="f16", out=name)
        assert proc.returncode == 0, proc.stderr
        assert "=> bit-exact: hopper-tc" in proc.stdout, proc.stdout
    np.save(d / "dev_f4.npy", got.astype(np.float32))
    proc = mm(fp8ref, case, "--identify", od="f16", out="dev_f4")
    assert proc.returncode == 2 and "dev_f4.npy: the device output must be F16" in proc.stderr, proc.stderr


def test_same_scale_file_twice_and_output_collisions(fp8ref, case):
    d = case["a"].parent
    ok = fp8ref("scaled-mm", "--format", "e4m3fn", "--scaling", "tensor", "--model", "hopper-tc", "--out-dtype", "bf16",
                case["a"], case["bt"], case["sa"], case["sa"], d / "o.npy")
    assert ok.returncode == 0, ok.stderr
    bad = fp8ref("scaled-mm", "--format", "e4m3fn", "--scaling", "tensor", "--model", "exact", "--out-dtype", "bf16",
                 case["a"], case["bt"], case["sa"], case["sb"], case["a"])
    assert bad.returncode == 2 and "output" in bad.stderr
    k0 = save(d, a0=np.zeros((3, 0), np.uint8), b0=np.zeros((4, 0), np.uint8))
    for model in ("exact", "f32-kblock", "hopper-tc"):  # K = 0: the empty sum, +0
        proc = fp8ref("scaled-mm", "--format", "e4m3fn", "--scaling", "tensor", "--model", model, "--out-dtype", "f32",
                      k0["a0"], k0["b0"], case["sa"], case["sb"], d / "z.npy")
        assert proc.returncode == 0, proc.stderr
        z = np.load(d / "z.npy")
        assert z.shape == (3, 4) and not z.view(np.uint32).any()
