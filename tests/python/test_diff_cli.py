"""`fp8ref diff` from the command line: exit codes, the text report, --json, --quiet, bad input.

Result files are written here by hand (safetensors = u64 header length + JSON header + data), the way a device
runner written from docs/golden-format.md would.
"""
import json
import struct

import pytest

CASE = "convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 fill=normal:amax=448 seed=1"


def read_st(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def write_st(path, tensors, metadata=None):
    """tensors: {name: (dtype tag, shape, bytes)} written in order, 8-byte aligned."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def outputs(path):
    header, data = read_st(path)
    out = {}
    for name, t in header.items():
        if name.startswith("output."):
            b, e = t["data_offsets"]
            out[name] = (t["dtype"], t["shape"], bytearray(data[b:e]))
    return out


@pytest.fixture()
def case(fp8ref, tmp_path):
    d = tmp_path / "golden"
    fp8ref("golden", "--case", CASE, "--out", d, check=True)
    files = list(d.glob("*.safetensors"))
    assert len(files) == 1
    return files[0]


def test_identical_passes(fp8ref, case, tmp_path):
    res = tmp_path / "res.safetensors"
    write_st(res, {k: (d, s, bytes(b)) for k, (d, s, b) in outputs(case).items()}, {"fp8ref.backend": "python"})
    p = fp8ref("diff", case, res)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verdict: PASS" in p.stdout
    assert "1. presence" in p.stdout and "8. trust" in p.stdout


def test_flipped_element_fails_with_repro_and_json(fp8ref, case, tmp_path):
    outs = outputs(case)
    dtype, shape, data = outs["output.y"]
    data[5 * 128 + 17] ^= 0x08
    res = tmp_path / "res.safetensors"
    write_st(res, {"output.y": (dtype, shape, bytes(data))})
    js = tmp_path / "report.json"
    p = fp8ref("diff", case, res, "--json", js, "--top", "3")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "verdict: FAIL" in p.stdout
    assert "repro: fp8ref golden --case 'convert" in p.stdout
    # sections in order
    pos = [p.stdout.index(f"{i}. ") for i in range(1, 9)]
    assert pos == sorted(pos)
    rep = json.loads(js.read_text())
    assert rep["verdict"] == "FAIL" and rep["exit_code"] == 1
    t = rep["tensors"][0]
    assert t["classes"]["counts"]["wrong"] == 1
    assert t["metrics"]["worst"][0]["index"] == [5, 17]
    assert t["tolerance"]["min"].startswith("ulp:8,frac:")
    # the same file under a tolerance it meets
    q = fp8ref("diff", case, res, "--tol", "ulp:8", "--quiet")
    assert q.returncode == 0, q.stdout + q.stderr
    assert q.stdout.count("\n") <= 3
    # --json - puts the JSON on stdout
    j = fp8ref("diff", case, res, "--json", "-")
    assert j.returncode == 1 and json.loads(j.stdout)["verdict"] == "FAIL"


def test_missing_tensor_and_transposed(fp8ref, case, tmp_path):
    dtype, shape, data = outputs(case)["output.y"]
    res = tmp_path / "res.safetensors"
    write_st(res, {"output.other": ("F32", [1], bytes(4))})
    p = fp8ref("diff", case, res)
    assert p.returncode == 1
    assert "missing in" in p.stdout and "extra in" in p.stdout
    rows, cols = shape
    t = bytearray(len(data))
    for r in range(rows):
        for c in range(cols):
            t[c * rows + r] = data[r * cols + c]
    write_st(res, {"output.y": (dtype, [cols, rows], bytes(t))})
    p = fp8ref("diff", case, res)
    assert p.returncode == 1
    assert "transposed" in p.stdout and "bit for bit" in p.stdout


def test_mistrusted_exits_zero(fp8ref, tmp_path):
    d = tmp_path / "golden"
    fp8ref("golden", "--case", CASE.replace("amax=448", "amax=0.0004"), "--out", d, check=True)
    case = next(d.glob("*.safetensors"))
    p = fp8ref("diff", case, case)
    assert p.returncode == 0
    assert "MISTRUSTED" in p.stdout and "verdict: MISTRUSTED" in p.stdout


@pytest.mark.parametrize("kind", ["missing", "truncated", "bad_tol", "bad_outputs_json"])
def test_bad_input_exit_2_no_output(fp8ref, case, tmp_path, kind):
    res = tmp_path / "res.safetensors"
    write_st(res, {k: (d, s, bytes(b)) for k, (d, s, b) in outputs(case).items()})
    js = tmp_path / "report.json"
    args = [case, res]
    if kind == "missing":
        args = [case, tmp_path / "nope.safetensors"]
    elif kind == "truncated":
        res.write_bytes(res.read_bytes()[:-10])
    elif kind == "bad_tol":
        args += ["--tol", "ulp:x"]
    elif kind == "bad_outputs_json":
        header, data = read_st(case)
        header["__metadata__"]["fp8ref.outputs"] = "{oops"
        bad = tmp_path / "bad.safetensors"
        h = json.dumps(header).encode()
        h += b" " * (-(8 + len(h)) % 8)
        bad.write_bytes(struct.pack("<Q", len(h)) + h + data)
        args = [bad, res]
    p = fp8ref("diff", *args, "--json", js)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "fp8ref diff: error:" in p.stderr
    assert not js.exists()


def test_models_wait_for_the_right_shape_and_a_truncating_device_is_named(fp8ref, case, tmp_path):
    out = outputs(case)
    (dt, shape, data) = out["output.y"]
    # a device output of the wrong shape: FAIL, and no model is run against it
    bad = tmp_path / "bad.safetensors"
    write_st(bad, {"output.y": (dt, [shape[1], shape[0] // 2], bytes(data[: len(data) // 2]))})
    p = fp8ref("diff", "--models", "always", case, bad)
    assert p.returncode == 1 and "models: not run: ACTUAL's outputs differ" in p.stdout, p.stdout
    # a device that truncates: the models table names the convention under rounding=rz
    trunc = tmp_path / "trunc"
    fp8ref("golden", "--case", CASE + " rounding=rz", "--out", trunc, check=True)
    rz = tmp_path / "rz.safetensors"
    write_st(rz, {k: (d, s, bytes(b)) for k, (d, s, b) in outputs(next(trunc.glob("*.safetensors"))).items()})
    p = fp8ref("diff", case, rz)
    assert p.returncode == 1
    assert "=> bit-exact under torch-2.11 rounding=rz" in p.stdout, p.stdout
