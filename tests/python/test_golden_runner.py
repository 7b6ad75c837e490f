"""docs/golden-format.md is enough to write a device runner: tests/python/golden_runner.py (written from the page)
reads fp8ref's case files and writes result files that `fp8ref diff` accepts; Python's safetensors reads and
writes files fp8ref reads and writes; and a case written by another tool runs through `fp8ref run`."""
import json
import pathlib
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import golden_runner  # noqa: E402


def make_case(fp8ref, tmp_path, descriptor):
    out = tmp_path / "cases"
    fp8ref("golden", "--case", descriptor, "--out", out, "--quiet", check=True)
    (case,) = sorted(out.glob("*.safetensors"))
    return case


@pytest.mark.parametrize("descriptor", [
    "convert from=f32 to=e4m3fn convention=ml_dtypes fill=normal:amax=448+special:rate=0.02 seed=5",
    "convert from=bf16 to=e5m2 convention=ml_dtypes fill=ties:format=e5m2 seed=6",
    "convert from=f16 to=e4m3fnuz convention=ml_dtypes fill=subnormal:format=e4m3fnuz seed=7",
])
def test_runner_from_the_doc_passes_diff(fp8ref, tmp_path, descriptor):
    case = make_case(fp8ref, tmp_path, descriptor)
    result = tmp_path / "result.safetensors"
    golden_runner.run(case, result)
    proc = fp8ref("diff", case, result)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout


def test_runner_with_a_wrong_convention_fails_diff_and_is_classified(fp8ref, tmp_path):
    # golden with cuda-satfinite, "device" rounds like ml_dtypes (overflow -> NaN): the diff must fail and say why
    case = make_case(fp8ref, tmp_path, "convert convention=cuda-satfinite fill=near-max:format=e4m3fn seed=9")
    result = tmp_path / "result.safetensors"
    golden_runner.run(case, result)
    proc = fp8ref("diff", case, result, "--json", tmp_path / "report.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "overflow" in proc.stdout
    assert "repro" in proc.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert "convert" in json.dumps(report)


def test_fp8ref_files_load_in_python_safetensors_and_back(fp8ref, tmp_path):
    from safetensors.numpy import load_file, save_file
    case = make_case(fp8ref, tmp_path, "convert from=f32 to=e4m3fn convention=torch-2.11 seed=3")
    # safetensors' numpy loader refuses F8 tensors; its header parser and the F32 tensors load fine.
    with pytest.raises(Exception):
        load_file(str(case))
    tensors, meta = golden_runner.read(case)
    assert meta["fp8ref.op"] == "convert"
    assert tensors["output.y"].dtype.name == "float8_e4m3fn"
    # a file written by Python's safetensors (with the descriptor in its metadata) runs through fp8ref run
    x = tensors["input.x"].astype(np.float32)
    other = tmp_path / "from_python.safetensors"
    save_file({"input.x": x}, str(other), metadata={"fp8ref.descriptor": meta["fp8ref.descriptor"]})
    out = tmp_path / "out.safetensors"
    fp8ref("run", other, "-o", out, check=True)
    got, meta2 = golden_runner.read(out)
    assert meta2["fp8ref.backend"] == "cpu"
    np.testing.assert_array_equal(got["output.y"].view(np.uint8), tensors["output.y"].view(np.uint8))
    # and fp8ref's result file loads in Python's safetensors header/offset scheme byte for byte
    with open(out, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert header["output.y"]["dtype"] == "F8_E4M3"
    assert (8 + n) % 8 == 0


def test_torch_loads_fp8ref_files_when_available(fp8ref, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    case = make_case(fp8ref, tmp_path, "convert from=f32 to=e5m2 convention=torch-2.11 seed=4")
    t = load_file(str(case))
    assert t["output.y"].dtype == torch.float8_e5m2
    assert torch.equal(t["input.x"].to(torch.float8_e5m2).view(torch.uint8), t["output.y"].view(torch.uint8))
