"""Every command that writes several files writes all of them or none (io::OutputFiles), and an output is never
the same file as another path given, however the paths are spelled (tools/cli.h check_paths):

  - a later output that cannot be written (its directory missing, a directory in its place) leaves no earlier
    output on disk, no temporary file, and every existing output untouched — exit 2;
  - "q.npy" and "./q.npy" (or "../dir/q.npy", or a symlink) are one file: refused with exit 2 before anything runs;
  - inputs may repeat (SA = SB; the same file as X and as the residual).
"""
import os

import numpy as np
import pytest


def bf16_bits(x):
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(5)
    np.save(tmp_path / "x.npy", rng.normal(size=(4, 256)).astype(np.float32))
    np.save(tmp_path / "xb.npy", bf16_bits(rng.normal(size=(4, 256))))
    np.save(tmp_path / "w.npy", bf16_bits(np.ones(256)))
    np.save(tmp_path / "a.npy", rng.integers(0, 0x70, size=(8, 64)).astype(np.uint8))
    np.save(tmp_path / "bt.npy", rng.integers(0, 0x70, size=(16, 64)).astype(np.uint8))
    np.save(tmp_path / "s.npy", np.array([0.5], dtype=np.float32))
    np.save(tmp_path / "k.npy", bf16_bits(rng.normal(size=(3, 2, 32))))
    np.save(tmp_path / "slots.npy", np.array([0, 5, 9], dtype=np.int64))
    np.save(tmp_path / "kc.npy", np.zeros((4, 4, 2, 32), dtype=np.uint8))
    return tmp_path


# (command line with {o1} {o2}: two outputs, o1 written first; the rest are the fixture's inputs)
COMMANDS = {
    "quantize": "quantize --from f32 --to e4m3fn --convention vllm-group x.npy {o1} {o2}",
    "quantize-exact": "quantize --from f32 --to e4m3fn --convention vllm-group --exact {o2} x.npy {o1} s2.npy",
    "rmsnorm-quant": "rmsnorm-quant --from bf16 --to e4m3fn --convention vllm-rmsnorm-quant xb.npy w.npy {o1} {o2}",
    "rmsnorm-quant-residual": "rmsnorm-quant --from bf16 --to e4m3fn --convention vllm-rmsnorm-quant "
                              "--residual xb.npy --residual-out {o2} xb.npy w.npy {o1} s2.npy",
    "scaled-mm": "scaled-mm --format e4m3fn --scaling tensor --model exact --out-dtype f32 --exact {o2} "
                 "a.npy bt.npy s.npy s.npy {o1}",
    "kv-cache-write": "kv-cache-write --convention vllm-cuda --model bf16 --k k.npy --v k.npy --slot-mapping slots.npy "
                      "--k-cache kc.npy --v-cache kc.npy --k-scale s.npy --v-scale s.npy "
                      "--out-k-cache {o1} --out-v-cache {o2}",
}


def run(fp8ref, d, line, **paths):
    cwd = os.getcwd()
    os.chdir(d)  # the command lines use names relative to the fixture's directory
    try:
        return fp8ref(*line.format(**paths).split())
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("name", COMMANDS)
def test_all_outputs_or_none(fp8ref, inputs, name):
    line = COMMANDS[name]
    ok = run(fp8ref, inputs, line, o1="o1.npy", o2="o2.npy")  # (inputs repeat in several lines: allowed)
    assert ok.returncode == 0, ok.stderr
    assert (inputs / "o1.npy").exists() and (inputs / "o2.npy").exists()
    (inputs / "o1.npy").unlink()
    before = sorted(os.listdir(inputs))
    # the second output's directory is missing: the first must not be written either
    r = run(fp8ref, inputs, line, o1="o1.npy", o2="nodir/o2.npy")
    assert r.returncode == 2 and "nodir" in r.stderr, r.stderr
    assert sorted(os.listdir(inputs)) == before  # no o1.npy, no temporary left
    # a directory where the second output goes: refused before any rename, the old first output untouched
    (inputs / "o1.npy").write_bytes(b"old")
    (inputs / "d.npy").mkdir()
    r = run(fp8ref, inputs, line, o1="o1.npy", o2="d.npy")
    assert r.returncode == 2 and "is a directory" in r.stderr and "nothing was written" in r.stderr, r.stderr
    assert (inputs / "o1.npy").read_bytes() == b"old"
    assert not [f for f in os.listdir(inputs) if ".tmp-" in f]


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("spelling", ["./o1.npy", "../{dir}/o1.npy", "link.npy"])
def test_one_file_under_two_names_is_refused(fp8ref, inputs, name, spelling):
    (inputs / "o1.npy").write_bytes(b"old")
    os.symlink(inputs / "o1.npy", inputs / "link.npy")
    r = run(fp8ref, inputs, COMMANDS[name], o1="o1.npy", o2=spelling.format(dir=inputs.name))
    assert r.returncode == 2 and "is also given as another output" in r.stderr, r.stderr
    assert (inputs / "o1.npy").read_bytes() == b"old"


def test_output_over_an_input_is_refused(fp8ref, inputs):
    x = (inputs / "x.npy").read_bytes()
    r = run(fp8ref, inputs, "quantize --from f32 --to e4m3fn --convention vllm-group x.npy ./x.npy {o2}", o2="s2.npy")
    assert r.returncode == 2 and "is also given as an input ('x.npy')" in r.stderr, r.stderr
    assert (inputs / "x.npy").read_bytes() == x and not (inputs / "s2.npy").exists()
    r = run(fp8ref, inputs, "convert --from f32 --to e4m3fn --convention ml_dtypes x.npy {o1}", o1="../{}/x.npy".format(inputs.name))
    assert r.returncode == 2 and "also given as an input" in r.stderr, r.stderr
    assert (inputs / "x.npy").read_bytes() == x


def test_golden_suite_is_all_or_nothing_and_names_the_bad_case(fp8ref, tmp_path):
    suite = tmp_path / "late.json"
    suite.write_text('{"name": "late", "cases": ["convert shape=2x4 seed=1", "quantize shape=2x128 seed=2", '
                     '"paged_attention kv-heads=2 q-heads=3 seed=3"]}')
    out = tmp_path / "cases"
    r = fp8ref("golden", "--suite", suite, "--out", out)
    assert r.returncode == 2, r.stderr
    assert f"suite {suite}, case 2 ('paged_attention q-heads=3 seed=3')" in r.stderr, r.stderr
    assert "no case file written" in r.stderr
    assert not out.exists()  # (created by this call, left empty: removed)
    out.mkdir()
    (out / "keep.txt").write_text("x")
    r = fp8ref("golden", "--case", "convert shape=2x2", "--case", "convert shape=2x2 fill=normal:amx=4", "--out", out)
    assert r.returncode == 2 and "--case 'convert shape=2x2 fill=normal:amx=4'" in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    r = fp8ref("golden", "--case", "convert shape=2x2", "--case", "convert shape=2x2", "--out", out)
    assert r.returncode == 0 and "wrote 1 case file" in r.stdout, r.stdout + r.stderr


def test_diff_refuses_a_run_result_as_expected_with_the_golden_as_actual(fp8ref, tmp_path):
    out = tmp_path / "g"
    fp8ref("golden", "--case", "convert shape=4x8", "--out", out, check=True)
    g = next(out.glob("*.safetensors"))
    res = tmp_path / "r.safetensors"
    fp8ref("run", g, "-o", res, check=True)
    assert fp8ref("diff", g, res).returncode == 0
    r = fp8ref("diff", res, g)
    assert r.returncode == 2 and "wrong way round" in r.stderr, r.stderr
