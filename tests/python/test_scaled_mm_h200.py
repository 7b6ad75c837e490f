"""`fp8ref scaled-mm --model hopper-tc` reproduces torch._scaled_mm on the H200 bit for bit.

Captures: tests/data/h200/scaled_mm_h200.npz (tools/device/capture_scaled_mm.py; torch 2.11.0+cu130, cuBLAS 13.0):
4 shapes, tensorwise / rowwise / blockwise scales with generic (non power-of-two) f32 values, use_fast_accum on and
off (blockwise: off only — torch refuses fast accumulation there), f32 and bf16 outputs, e4m3fn x e4m3fn and
e4m3fn x e5m2 — 40 outputs, 286,720 elements (the log is beside the npz). Every output matches 100 %. The split-K factor is what cuBLAS chose for the shape (research/h200-cublas-fp8-model.md): 2 for
32x256x7168 tensorwise and blockwise, else 1; any other factor fails the f32 outputs of that case.
And tests/data/h200/blockwise_K640.npz (the cuBLAS scale_b stride bug): --sb-stride cublas reproduces it.
"""
import numpy as np
import pytest

DATA = "h200/scaled_mm_h200.npz"
SPLIT = {("c1", "tensor"): 2, ("c1", "blockwise"): 2}


def outputs(test_data):
    path = test_data / DATA
    if not path.exists():
        return []
    d = np.load(path)
    return sorted(k[:-4] for k in d.files if k.endswith("_out"))


def load(test_data):
    path = test_data / DATA
    if not path.exists():
        pytest.skip(f"missing capture {path}")
    return np.load(path)


def run_case(fp8ref, tmp_path, d, name, model="hopper-tc", backend="cpu", split=None):
    case, scaling, out, fast = name.split("_")
    meta = dict(kv.split("=") for kv in str(d[f"{case}_meta"]).split())
    np.save(tmp_path / "a.npy", d[f"{case}_a"])
    np.save(tmp_path / "bt.npy", d[f"{case}_b"])
    np.save(tmp_path / "sa.npy", d[f"{name}_sa"])
    np.save(tmp_path / "sb.npy", d[f"{name}_sb"])
    fmt = meta["fa"] if meta["fa"] == meta["fb"] else f"{meta['fa']},{meta['fb']}"
    args = ["scaled-mm", "--format", fmt, "--scaling", scaling, "--model", model, "--out-dtype", out,
            "--backend", backend]
    if model == "hopper-tc":
        args += ["--split-k", str(split if split else SPLIT.get((case, scaling), 1))]
        if fast == "fast1":
            args += ["--promote", "never"]
    fp8ref(*args, tmp_path / "a.npy", tmp_path / "bt.npy", tmp_path / "sa.npy", tmp_path / "sb.npy",
           tmp_path / "out.npy", check=True)
    got = np.load(tmp_path / "out.npy")
    return got.view(np.uint32) if got.dtype == np.float32 else got


@pytest.mark.parametrize("name", outputs(__import__("pathlib").Path(__file__).parents[1] / "data"))
def test_hopper_tc_reproduces_torch_scaled_mm_on_h200(fp8ref, test_data, tmp_path, name):
    d = load(test_data)
    want = d[f"{name}_out"]
    got = run_case(fp8ref, tmp_path, d, name)
    rate = float((got == want).mean())
    exact_rate = float((run_case(fp8ref, tmp_path, d, name, model="exact") == want).mean())
    print(f"{name}: hopper-tc bit-exact {rate:.6f}, exact model (one rounding) {exact_rate:.4f}, n={want.size}")
    assert rate == 1.0


def test_reference_backend_agrees_on_a_capture(fp8ref, test_data, tmp_path):
    d = load(test_data)
    for name in ("c0_tensor_f32_fast1", "c3_blockwise_f32_fast0", "c2_rowwise_bf16_fast0"):
        assert np.array_equal(run_case(fp8ref, tmp_path, d, name, backend="reference"), d[f"{name}_out"]), name


def test_split_k_matters(fp8ref, test_data, tmp_path):
    """The model is not vacuous: without cuBLAS's split-K the fast-accum f32 output of 32x256x7168 disagrees."""
    d = load(test_data)
    got = run_case(fp8ref, tmp_path, d, "c1_tensor_f32_fast1", split=1)
    assert (got == d["c1_tensor_f32_fast1_out"]).mean() < 0.1


def test_sb_stride_cublas_reproduces_the_blockwise_scale_bug(fp8ref, test_data, tmp_path):
    path = test_data / "h200" / "blockwise_K640.npz"
    if not path.exists():
        pytest.skip(f"missing capture {path}")
    d = np.load(path)
    K, N = d["a"].shape[1], d["b"].shape[0]
    kb, nb = K // 128, N // 128
    stride = (kb + 3) // 4 * 4
    np.save(tmp_path / "a.npy", d["a"])
    np.save(tmp_path / "bt.npy", d["b"])
    np.save(tmp_path / "sa.npy", d["sa"])
    np.save(tmp_path / "sb.npy", d["sb"])
    np.save(tmp_path / "sbuf.npy", d["sb_buffer"][: (nb - 1) * stride + kb])
    common = ["scaled-mm", "--format", "e4m3fn", "--scaling", "blockwise", "--model", "hopper-tc", "--out-dtype",
              "bf16", tmp_path / "a.npy", tmp_path / "bt.npy", tmp_path / "sa.npy"]
    fp8ref(*common, tmp_path / "sbuf.npy", tmp_path / "misread.npy", "--sb-stride", "cublas", check=True)
    fp8ref(*common, tmp_path / "sb.npy", tmp_path / "dense.npy", check=True)
    assert np.array_equal(np.load(tmp_path / "misread.npy"), d["out"])
    dense = np.load(tmp_path / "dense.npy")
    per_block = [(dense[:, j * 128:(j + 1) * 128] == d["out"][:, j * 128:(j + 1) * 128]).mean() for j in range(nb)]
    assert per_block[0] == 1.0 and max(per_block[1:]) < 0.1, per_block


def test_identify_names_the_model_of_a_device_output(fp8ref, test_data, tmp_path):
    """`--identify` ranks the models against a device output: the fast-accum capture is hopper-tc, promote never."""
    d = load(test_data)
    np.save(tmp_path / "a.npy", d["c0_a"])
    np.save(tmp_path / "bt.npy", d["c0_b"])
    np.save(tmp_path / "sa.npy", d["c0_tensor_f32_fast1_sa"])
    np.save(tmp_path / "sb.npy", d["c0_tensor_f32_fast1_sb"])
    np.save(tmp_path / "dev.npy", d["c0_tensor_f32_fast1_out"].view(np.float32))
    proc = fp8ref("scaled-mm", "--identify", "--format", "e4m3fn", "--scaling", "tensor", "--out-dtype", "f32",
                  tmp_path / "a.npy", tmp_path / "bt.npy", tmp_path / "sa.npy", tmp_path / "sb.npy",
                  tmp_path / "dev.npy", check=True)
    assert "=> bit-exact: hopper-tc --promote never --split-k 1" in proc.stdout, proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("exact ")]
    assert lines and not lines[0].split()[1].startswith("100"), proc.stdout


BIAS_DATA = "h200/scaled_mm_bias_h200.npz"


def bias_outputs():
    path = __import__("pathlib").Path(__file__).parents[1] / "data" / BIAS_DATA
    return sorted(k[:-4] for k in np.load(path).files if k.endswith("_out")) if path.exists() else []


@pytest.mark.parametrize("name", bias_outputs())
def test_hopper_tc_bias_and_f16_output_on_h200(fp8ref, test_data, tmp_path, name):
    """tools/device/capture_scaled_mm_bias.py: f16 outputs and a bf16/f16 bias (torch._scaled_mm bias=). cuBLAS adds
    the bias in f32 after the scale epilogue and rounds once to the output type: --bias-mode f32. --bias-mode out
    (rounding first, then adding in the output type) must not match."""
    path = test_data / BIAS_DATA
    if not path.exists():
        pytest.skip(f"missing capture {path}")
    d = np.load(path)
    case, scaling, out, fast, bias = name.split("_")
    np.save(tmp_path / "a.npy", d[f"{case}_a"])
    np.save(tmp_path / "bt.npy", d[f"{case}_b"])
    np.save(tmp_path / "sa.npy", d[f"{name}_sa"])
    np.save(tmp_path / "sb.npy", d[f"{name}_sb"])
    args = ["scaled-mm", "--format", "e4m3fn", "--scaling", scaling, "--model", "hopper-tc", "--out-dtype", out]
    if fast == "fast1":
        args += ["--promote", "never"]
    modes = [None] if bias == "nobias" else ["f32", "out"]
    for mode in modes:
        extra = []
        if mode:
            np.save(tmp_path / "bias.npy", d[f"{name}_bias"])
            extra = ["--bias", tmp_path / "bias.npy", "--bias-mode", mode]
        fp8ref(*args, *extra, tmp_path / "a.npy", tmp_path / "bt.npy", tmp_path / "sa.npy", tmp_path / "sb.npy",
               tmp_path / "out.npy", check=True)
        got = np.load(tmp_path / "out.npy")
        assert got.dtype == (np.float16 if out == "f16" else np.uint16 if out == "bf16" else np.float32), got.dtype
        rate = float((got.view(d[f"{name}_out"].dtype) == d[f"{name}_out"]).mean())
        print(f"{name} bias-mode {mode}: {rate:.6f}")
        assert (rate == 1.0) == (mode in (None, "f32")), (mode, rate)


def test_diff_names_the_model_of_a_device_output(fp8ref, test_data, tmp_path):
    """`fp8ref diff` on a failing device output lists its distance to each model: the H200's fast-accum output
    (torch._scaled_mm, use_fast_accum=True) fails against the exact golden and is hopper-tc, promote never."""
    from test_diff_cli import read_st, write_st

    d = load(test_data)
    name = "c0_tensor_f32_fast1"
    M, K = d["c0_a"].shape
    N = d["c0_b"].shape[0]
    desc = f"scaled_mm shape={M}x{N}x{K} a=e4m3fn b=e4m3fn scaling=tensor model=exact out=f32"
    case = tmp_path / "case.safetensors"
    write_st(case, {"input.a": ("F8_E4M3", [M, K], d["c0_a"].tobytes()),
                    "input.bt": ("F8_E4M3", [N, K], d["c0_b"].tobytes()),
                    "input.sa": ("F32", [1], d[f"{name}_sa"].tobytes()),
                    "input.sb": ("F32", [1], d[f"{name}_sb"].tobytes())}, {"fp8ref.descriptor": desc})
    expected = tmp_path / "expected.safetensors"
    fp8ref("run", "--backend", "reference", case, "-o", expected, check=True)
    header, data = read_st(expected)
    assert header["output.out"]["dtype"] == "F32"
    b, e = header["output.out"]["data_offsets"]
    device = tmp_path / "device.safetensors"
    write_st(device, {"output.out": ("F32", [M, N], d[f"{name}_out"].tobytes())}, {"fp8ref.backend": "h200"})
    alone = fp8ref("diff", expected, device, "--models", "always", "--quiet")  # a result file has no inputs
    assert "EXPECTED carries no input.* tensors" in alone.stdout, alone.stdout
    # the golden file of the captured case: its inputs and the reference's output
    write_st(expected, {"input.a": ("F8_E4M3", [M, K], d["c0_a"].tobytes()),
                        "input.bt": ("F8_E4M3", [N, K], d["c0_b"].tobytes()),
                        "input.sa": ("F32", [1], d[f"{name}_sa"].tobytes()),
                        "input.sb": ("F32", [1], d[f"{name}_sb"].tobytes()),
                        "output.out": ("F32", [M, N], data[b:e])}, header["__metadata__"])
    p = fp8ref("diff", expected, device, "--quiet")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "=> bit-exact under hopper-tc --promote never --split-k 1" in p.stdout, p.stdout
    lines = p.stdout.splitlines()
    exact = [ln for ln in lines if ln.strip().startswith("exact (EXPECTED's)")]
    assert exact and not exact[0].split()[2].startswith("100"), p.stdout
    never = fp8ref("diff", expected, device, "--quiet", "--models", "never")
    assert never.returncode == 1 and "distance of" not in never.stdout
    bad = fp8ref("diff", expected, device, "--models", "sometimes")
    assert bad.returncode == 2 and "--models" in bad.stderr
