"""The fp8ref command line: help and version, list, convert round trips, file forms, and every bad input.

Expected FP8 values come from the formats' definitions (sign, exponent, mantissa, bias), written out here,
not from fp8ref itself.
"""
import json
import re

import numpy as np
import pytest

FP8 = {  # name: (exp bits, man bits, bias, special style)
    "e4m3fn": (4, 3, 7, "fn"),
    "e5m2": (5, 2, 15, "ieee"),
    "e4m3fnuz": (4, 3, 8, "fnuz"),
    "e5m2fnuz": (5, 2, 16, "fnuz"),
    "ue8m0": (8, 0, 127, "e8m0"),
}
CONVENTIONS_FOR = {  # conventions that define each target, used for round trips
    "e4m3fn": ["ml_dtypes", "torch-2.11", "cuda-satfinite", "cuda-nosat", "ocp-sat", "ocp-nosat"],
    "e5m2": ["ml_dtypes", "torch-2.11", "cuda-satfinite", "cuda-nosat", "ocp-sat", "ocp-nosat"],
    "e4m3fnuz": ["ml_dtypes", "torch-2.11"],
    "e5m2fnuz": ["ml_dtypes", "torch-2.11"],
    "ue8m0": ["ml_dtypes", "torch-2.11", "cuda-satfinite", "cuda-nosat", "mx"],
}


def code_value(fmt, code):
    """The exact value of an FP8 code from the format definition (nan for NaN codes, +-inf for Inf codes)."""
    code = int(code)
    e_bits, m_bits, bias, style = FP8[fmt]
    if style == "e8m0":
        return float("nan") if code == 0xFF else 2.0 ** (code - bias)
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    if style == "fnuz" and code == 0x80:
        return float("nan")
    if style == "fn" and (code & 0x7F) == 0x7F:
        return float("nan")
    if style == "ieee" and e == (1 << e_bits) - 1:
        return sign * float("inf") if m == 0 else float("nan")
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + m / 2**m_bits) * 2.0 ** (e - bias)


def finite_codes(fmt):
    return [c for c in range(256) if np.isfinite(code_value(fmt, c))]


def convert(fp8ref, tmp_path, arr, *args, src="f32", name="in.npy", out="out.npy"):
    inp, outp = tmp_path / name, tmp_path / out
    np.save(inp, arr)
    fp8ref("convert", "--from", src, *args, inp, outp, check=True)
    return np.load(outp)


def decode(fp8ref, tmp_path, codes, fmt, convention="ml_dtypes", *extra):
    inp, outp = tmp_path / "codes.npy", tmp_path / "decoded.npy"
    np.save(inp, np.asarray(codes, dtype=np.uint8))
    fp8ref("convert", "--decode", "--from", fmt, "--convention", convention, *extra, inp, outp, check=True)
    return np.load(outp)


# ---- program surface -----------------------------------------------------------------------------------------


def subcommands(fp8ref):
    out = fp8ref("--help", check=True).stdout
    section = out.split("Commands:", 1)[1]
    return [m.group(1) for m in re.finditer(r"^  (\S+)\s", section, re.M)]


def test_version(fp8ref):
    p = fp8ref("--version")
    assert p.returncode == 0 and p.stdout.strip() == "fp8ref 0.6.0"


def test_program_help(fp8ref):
    p = fp8ref("--help")
    assert p.returncode == 0 and "Usage: fp8ref" in p.stdout
    assert {"list", "convert"} <= set(subcommands(fp8ref))
    assert fp8ref("-h").returncode == 0
    assert fp8ref("help").returncode == 0


def test_every_subcommand_help(fp8ref):
    for cmd in subcommands(fp8ref):
        for flag in ("--help", "-h"):
            p = fp8ref(cmd, flag)
            assert p.returncode == 0, (cmd, p.stderr)
            assert p.stdout.startswith(f"Usage: fp8ref {cmd}"), cmd
            assert p.stderr == ""
        assert fp8ref("help", cmd).stdout == fp8ref(cmd, "--help").stdout
    # --help wins over anything else on the line
    assert fp8ref("convert", "--bogus", "--help").returncode == 0


def one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def test_no_arguments_and_unknown_command(fp8ref):
    assert fp8ref().returncode == 2
    one_line_error(fp8ref("frobnicate"), "unknown command 'frobnicate'")
    one_line_error(fp8ref("--frob"), "unknown option '--frob'")
    one_line_error(fp8ref("help", "frobnicate"), "unknown command")
    one_line_error(fp8ref("list", "extra"), "fp8ref list: error:", "extra")
    one_line_error(fp8ref("list", "--jsn"), "unknown option '--jsn'")


def test_list_text(fp8ref):
    p = fp8ref("list", check=True)
    for word in ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "ue8m0", "448", "57344", "240", "F8_E4M3", "ml_dtypes",
                 "torch-2.11", "cuda-satfinite", "stochastic", "satfinite", "keep-sign", "via-f32", "reference",
                 "cpu"]:
        assert word in p.stdout, word


def test_list_json(fp8ref):
    j = json.loads(fp8ref("list", "--json", check=True).stdout)
    assert j["version"] == "0.6.0"
    fm = {f["name"]: f for f in j["formats"]}
    assert fm["e4m3fn"]["max_finite"] == 448 and fm["e4m3fn"]["bias"] == 7 and fm["e4m3fn"]["man_bits"] == 3
    assert fm["e4m3fnuz"]["max_finite"] == 240 and fm["e4m3fnuz"]["safetensors"] == "F8_E4M3FNUZ"
    assert fm["ue8m0"]["max_finite"] == 2.0**127 and fm["f16"]["max_finite"] == 65504
    for name, (e, m, bias, _) in FP8.items():
        assert (fm[name]["exp_bits"], fm[name]["man_bits"], fm[name]["bias"]) == (e, m, bias)
    conv = {c["name"]: c for c in j["conventions"]}
    assert set(conv["ml_dtypes"]["targets"]) == set(FP8)
    assert "e4m3fnuz" not in conv["cuda-satfinite"]["targets"] and "ue8m0" in conv["cuda-satfinite"]["targets"]
    assert conv["mx"]["targets"] == ["ue8m0"]
    assert all(c["stack"] for c in j["conventions"])
    for mode in ("rne", "rz", "ru", "rd", "stochastic"):
        assert mode in j["rounding"]
    assert set(j["overflow"]) >= {"satfinite", "saturate", "nonsat"}
    assert set(j["nan"]) >= {"canonical", "keep-sign"} and set(j["f64_path"]) == {"direct", "via-f32"}
    be = {b["name"]: b for b in j["backends"]}
    assert {"cpu", "reference"} <= set(be) and be["cpu"]["simd_target"]


# ---- convert: round trips and exact values -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FP8)
def test_decode_values_exact(fp8ref, tmp_path, fmt):
    codes = np.arange(256, dtype=np.uint32).astype(np.uint8)
    for container, dt in (("f32", np.float32), ("f64", np.float64)):
        y = decode(fp8ref, tmp_path, codes, fmt, "ml_dtypes", "--to-container", container)
        assert y.dtype == dt and y.shape == (256,)
        want = np.array([code_value(fmt, c) for c in range(256)])
        fin = np.isfinite(want)
        assert np.array_equal(np.isnan(y), np.isnan(want))
        assert np.array_equal(y[~np.isnan(want)].astype(np.float64), want[~np.isnan(want)])
        # signed zeros decode with their sign
        assert np.array_equal(np.signbit(y[fin & (want == 0)]), [bool(c & 0x80) for c in codes[fin & (want == 0)]])


@pytest.mark.parametrize("fmt", FP8)
def test_round_trip_every_finite_code(fp8ref, tmp_path, fmt):
    codes = np.array(finite_codes(fmt), dtype=np.uint8)
    values = np.array([code_value(fmt, c) for c in codes])
    for conv in CONVENTIONS_FOR[fmt]:
        for src, arr in (("f32", values.astype(np.float32)), ("f64", values)):
            got = convert(fp8ref, tmp_path, arr, "--to", fmt, "--convention", conv, src=src)
            assert got.dtype == np.uint8 and got.shape == codes.shape
            assert np.array_equal(got, codes), (conv, src)
        # and back: decode gives the values exactly
        y = decode(fp8ref, tmp_path, codes, fmt, conv)
        assert np.array_equal(y.astype(np.float64), values), conv


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_round_trip_f16_bf16(fp8ref, tmp_path, fmt):
    codes = np.array(finite_codes(fmt), dtype=np.uint8)
    values = np.array([code_value(fmt, c) for c in codes])
    f16 = values.astype(np.float16)
    assert np.array_equal(f16.astype(np.float64), values)
    got = convert(fp8ref, tmp_path, f16, "--to", fmt, "--convention", "torch-2.11", src="f16")
    assert np.array_equal(got, codes)
    bf16 = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # exact: <= 3 mantissa bits
    got = convert(fp8ref, tmp_path, bf16, "--to", fmt, "--convention", "torch-2.11", src="bf16")
    assert np.array_equal(got, codes)


def test_known_codes(fp8ref, tmp_path):
    x = np.array([1.0, -2.0, 448.0, 0.5, 2.0**-9, -0.0, 1.0625, 1.1875, 3.0], np.float32)
    got = convert(fp8ref, tmp_path, x, "--to", "e4m3fn", "--convention", "ocp-sat")
    # 1.0625 ties to even (1.0), 1.1875 ties to even (1.25)
    assert got.tolist() == [0x38, 0xC0, 0x7E, 0x30, 0x01, 0x80, 0x38, 0x3A, 0x44]
    big = np.array([1e6, -1e6, np.inf], np.float32)
    assert convert(fp8ref, tmp_path, big, "--to", "e4m3fn", "--convention", "ocp-sat").tolist() == [0x7E, 0xFE, 0x7E]
    # an override changes the convention's field
    got = convert(fp8ref, tmp_path, big, "--to", "e4m3fn", "--convention", "ocp-nosat", "--overflow", "satfinite")
    assert got.tolist() == [0x7E, 0xFE, 0x7E]
    got = convert(fp8ref, tmp_path, np.array([1.1, -1.1], np.float32), "--to", "e4m3fn", "--convention",
                  "ocp-sat", "--rounding", "ru")
    assert got.tolist() == [0x39, 0xB8]  # toward +inf: 1.1 -> 1.125, -1.1 -> -1.0


def test_shapes_preserved(fp8ref, tmp_path):
    rng = np.random.default_rng(1)
    for shape in [(), (0,), (7,), (2, 3, 4), (3, 0, 2), (1, 1, 1, 5)]:
        x = rng.standard_normal(shape).astype(np.float32)
        got = convert(fp8ref, tmp_path, x, "--to", "e5m2", "--convention", "torch-2.11")
        assert got.shape == shape and got.dtype == np.uint8
        y = decode(fp8ref, tmp_path, got, "e5m2", "torch-2.11")
        assert y.shape == shape and y.dtype == np.float32


def test_backends_agree(fp8ref, tmp_path):
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    normal = rng.standard_normal(200_000).astype(np.float32) * np.float32(100)
    x = np.concatenate([bits.view(np.float32), normal])
    for args in (["--to", "e4m3fn", "--convention", "torch-2.11"],
                 ["--to", "e5m2", "--convention", "ocp-nosat", "--rounding", "stochastic", "--seed", "12345"],
                 ["--to", "ue8m0", "--convention", "cuda-satfinite", "--rounding", "ru"],
                 ["--to", "e4m3fnuz", "--convention", "ml_dtypes"]):
        a = convert(fp8ref, tmp_path, x, *args, "--backend", "cpu", out="a.npy")
        b = convert(fp8ref, tmp_path, x, *args, "--backend", "reference", out="b.npy")
        assert np.array_equal(a, b), args


def test_stochastic_seed_is_deterministic(fp8ref, tmp_path):
    x = np.full(10_000, 1.0625, np.float32)  # halfway between 1.0 and 1.125 in e4m3fn
    args = ["--to", "e4m3fn", "--convention", "ocp-sat", "--rounding", "stochastic", "--seed"]
    a = convert(fp8ref, tmp_path, x, *args, "7", out="a.npy")
    b = convert(fp8ref, tmp_path, x, *args, "7", out="b.npy")
    c = convert(fp8ref, tmp_path, x, *args, "8", out="c.npy")
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert set(a.tolist()) == {0x38, 0x39} and 0.4 < np.mean(a == 0x39) < 0.6


# ---- convert: file forms -------------------------------------------------------------------------------------


def test_big_endian_and_fortran_input(fp8ref, tmp_path):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 7)) * 50).astype(np.float32)
    want = convert(fp8ref, tmp_path, x, "--to", "e4m3fn", "--convention", "torch-2.11")
    for src, arr in (("f32", x.astype(">f4")), ("f16", x.astype(">f2")), ("f64", x.astype(">f8")),
                     ("f32", np.asfortranarray(x))):
        got = convert(fp8ref, tmp_path, arr, "--to", "e4m3fn", "--convention", "torch-2.11", src=src, name="be.npy")
        ref = convert(fp8ref, tmp_path, np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("="))), "--to",
                      "e4m3fn", "--convention", "torch-2.11", src=src, name="le.npy")
        assert np.array_equal(got, ref), (src, arr.dtype)
    assert np.array_equal(convert(fp8ref, tmp_path, x.astype(">f4"), "--to", "e4m3fn", "--convention",
                                  "torch-2.11", name="be.npy"), want)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    a = convert(fp8ref, tmp_path, bf, "--to", "e5m2", "--convention", "torch-2.11", src="bf16", name="le.npy")
    b = convert(fp8ref, tmp_path, bf.astype(">u2"), "--to", "e5m2", "--convention", "torch-2.11", src="bf16",
                name="be.npy")
    assert np.array_equal(a, b)


def test_bin_input_and_output(fp8ref, tmp_path):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 4)) * 10).astype(np.float32)
    want = convert(fp8ref, tmp_path, x, "--to", "e4m3fn", "--convention", "ml_dtypes")
    common = ["--to", "e4m3fn", "--convention", "ml_dtypes"]
    (tmp_path / "x.bin").write_bytes(x.astype("<f4").tobytes())
    # .bin -> .npy (shape from --shape)
    fp8ref("convert", "--from", "f32", *common, "--shape", "3,4", tmp_path / "x.bin", tmp_path / "y.npy", check=True)
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    # .npy -> .bin and .bin -> .bin (raw codes)
    np.save(tmp_path / "x.npy", x)
    fp8ref("convert", "--from", "f32", *common, tmp_path / "x.npy", tmp_path / "y1.bin", check=True)
    fp8ref("convert", "--from", "f32", *common, "--shape=12", tmp_path / "x.bin", tmp_path / "y2.bin", check=True)
    assert (tmp_path / "y1.bin").read_bytes() == want.tobytes() == (tmp_path / "y2.bin").read_bytes()
    # decode from .bin to .bin
    fp8ref("convert", "--decode", "--from", "e4m3fn", "--convention", "ml_dtypes", "--to-container", "f64",
           "--shape", "12", tmp_path / "y1.bin", tmp_path / "z.bin", check=True)
    z = np.frombuffer((tmp_path / "z.bin").read_bytes(), "<f8")
    assert np.array_equal(z, [code_value("e4m3fn", c) for c in want.ravel()])
    # bf16 and f16 .bin
    bf = (x.view(np.uint32) >> 16).astype("<u2")
    (tmp_path / "b.bin").write_bytes(bf.tobytes())
    fp8ref("convert", "--from", "bf16", *common, "--shape", "3,4", tmp_path / "b.bin", tmp_path / "b.npy", check=True)
    assert np.array_equal(np.load(tmp_path / "b.npy"),
                          convert(fp8ref, tmp_path, bf, *common, src="bf16", name="b_in.npy"))


def test_verbose_one_line(fp8ref, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    p = fp8ref("convert", "--from", "f32", "--to", "e4m3fn", "--convention", "torch-2.11", "--verbose",
               tmp_path / "x.npy", tmp_path / "y.npy", check=True)
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and "elements=10" in lines[0] and "backend=cpu" in lines[0] and "rounding=rne" in lines[0]
    p = fp8ref("convert", "--from", "f32", "--to", "e4m3fn", "--convention", "torch-2.11",
               tmp_path / "x.npy", tmp_path / "y.npy", check=True)
    assert p.stdout == "" and p.stderr == ""


def test_existing_output_replaced(fp8ref, tmp_path):
    (tmp_path / "out.npy").write_bytes(b"old")
    got = convert(fp8ref, tmp_path, np.array([1.0], np.float32), "--to", "e4m3fn", "--convention", "ocp-sat")
    assert got.tolist() == [0x38]


# ---- bad input: exit 2, one line naming the problem (and the file), nothing written ----------------------------


@pytest.fixture
def files(tmp_path):
    f = {}
    f["f32"] = tmp_path / "x32.npy"
    np.save(f["f32"], np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6))
    f["f64"] = tmp_path / "x64.npy"
    np.save(f["f64"], np.linspace(-3, 3, 24))
    f["f16"] = tmp_path / "x16.npy"
    np.save(f["f16"], np.ones(8, np.float16))
    f["u8"] = tmp_path / "codes.npy"
    np.save(f["u8"], np.arange(16, dtype=np.uint8))
    data = f["f32"].read_bytes()
    f["truncated"] = tmp_path / "truncated.npy"
    f["truncated"].write_bytes(data[:-5])
    f["truncated_header"] = tmp_path / "short.npy"
    f["truncated_header"].write_bytes(data[:40])
    f["garbage"] = tmp_path / "garbage.npy"
    f["garbage"].write_bytes(b"this is not a numpy file at all" * 4)
    f["bad_header"] = tmp_path / "badheader.npy"
    hdr = b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), 'bogus': 1, }"
    hdr += b" " * (118 - len(hdr)) + b"\n"
    f["bad_header"].write_bytes(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr + data[128:])
    f["empty"] = tmp_path / "empty.npy"
    f["empty"].write_bytes(b"")
    f["bin"] = tmp_path / "raw.bin"
    f["bin"].write_bytes(np.ones(10, np.float32).tobytes())
    f["void2"] = tmp_path / "bf16.npy"  # what np.save writes for an ml_dtypes bfloat16 array: '|V2'
    np.save(f["void2"], np.zeros(8, dtype="V2"))
    return f


ENC = ["--from", "f32", "--to", "e4m3fn", "--convention", "ml_dtypes"]

BAD_CASES = [
    # (id, args (IN given by key of `files` or literal), needles in the error line, name the input file?)
    ("unknown-to-format", ["--from", "f32", "--to", "e3m4", "--convention", "ml_dtypes", "@f32"],
     ["unknown format 'e3m4'"], False),
    ("unknown-from-format", ["--from", "f8", "--to", "e4m3fn", "--convention", "ml_dtypes", "@f32"],
     ["unknown format 'f8'"], False),
    ("from-not-a-container", ["--from", "e4m3fn", "--to", "e5m2", "--convention", "ml_dtypes", "@u8"],
     ["--from e4m3fn", "--decode"], False),
    ("to-not-fp8", ["--from", "f32", "--to", "f16", "--convention", "ml_dtypes", "@f32"], ["--to f16"], False),
    ("unknown-convention", ["--from", "f32", "--to", "e4m3fn", "--convention", "torch-1.0", "@f32"],
     ["unknown convention 'torch-1.0'"], False),
    ("convention-lacks-pair", ["--from", "f32", "--to", "e4m3fnuz", "--convention", "cuda-satfinite", "@f32"],
     ["cuda-satfinite", "e4m3fnuz"], False),
    ("convention-lacks-ue8m0", ["--from", "f32", "--to", "ue8m0", "--convention", "ocp-sat", "@f32"],
     ["ocp-sat", "ue8m0"], False),
    ("wrong-dtype", ENC[:] + ["@f64"], ["float64", "float32"], True),
    ("wrong-dtype-bf16", ["--from", "bf16", "--to", "e4m3fn", "--convention", "ml_dtypes", "@f16"],
     ["float16", "uint16"], True),
    ("wrong-dtype-decode", ["--decode", "--from", "e4m3fn", "--convention", "ml_dtypes", "@f32"],
     ["float32", "uint8"], True),
    ("truncated-npy", ENC[:] + ["@truncated"], ["truncated"], True),
    ("truncated-header", ENC[:] + ["@truncated_header"], ["truncated"], True),
    ("malformed-npy", ENC[:] + ["@garbage"], ["not a .npy file"], True),
    ("malformed-header", ENC[:] + ["@bad_header"], ["malformed", "bogus"], True),
    ("empty-file", ENC[:] + ["@empty"], [".npy"], True),
    ("missing-input-file", ENC[:] + ["@missing"], ["cannot open"], True),
    ("missing-to", ["--from", "f32", "--convention", "ml_dtypes", "@f32"], ["missing --to"], False),
    ("missing-from", ["--to", "e4m3fn", "--convention", "ml_dtypes", "@f32"], ["missing --from"], False),
    ("missing-convention", ["--from", "f32", "--to", "e4m3fn", "@f32"], ["missing --convention"], False),
    ("missing-value", ["--from", "f32", "--to", "--convention", "ml_dtypes", "@f32"], ["--to needs a value"], False),
    ("missing-out", ENC[:] + ["@f32", "NO-OUT"], ["missing OUT"], False),
    ("extra-argument", ENC[:] + ["@f32", "OUT", "extra.npy"], ["unexpected argument 'extra.npy'"], False),
    ("unknown-option", ENC[:] + ["--frobnicate", "@f32"], ["unknown option '--frobnicate'"], False),
    ("flag-with-value", ENC[:] + ["--verbose=yes", "@f32"], ["--verbose takes no value"], False),
    ("duplicate-option", ENC[:] + ["--to", "e5m2", "@f32"], ["--to given twice"], False),
    ("bin-without-shape", ENC[:] + ["@bin"], ["--shape"], True),
    ("bin-shape-mismatch", ENC[:] + ["--shape", "3,4", "@bin"], ["40 bytes", "48"], True),
    ("bad-shape", ENC[:] + ["--shape", "3,x", "@bin"], ["--shape '3,x'"], False),
    ("shape-with-npy", ENC[:] + ["--shape", "24", "@f32"], ["--shape"], True),
    ("bad-rounding", ENC[:] + ["--rounding", "rn", "@f32"], ["'rn'"], False),
    ("bad-overflow", ENC[:] + ["--overflow", "clamp", "@f32"], ["'clamp'"], False),
    ("bad-nan", ENC[:] + ["--nan", "quiet", "@f32"], ["'quiet'"], False),
    ("bad-nan-code", ENC[:] + ["--nan-code", "0x3c", "@f32"], ["0x3c"], False),
    ("bad-seed", ENC[:] + ["--rounding", "stochastic", "--seed", "abc", "@f32"], ["--seed", "abc"], False),
    ("seed-without-stochastic", ENC[:] + ["--seed", "7", "@f32"], ["--seed", "stochastic", "rne"], False),
    ("exp-clamp-not-ue8m0", ENC[:] + ["--exp-clamp", "1:254", "@f32"], ["--exp-clamp", "ue8m0"], False),
    ("bad-f64-path", ENC[:] + ["--f64-path", "twice", "@f32"], ["'twice'"], False),
    ("cuda-ue8m0-rne", ["--from", "f32", "--to", "ue8m0", "--convention", "cuda-satfinite", "--rounding", "rne",
                        "@f32"], ["rne", "rz", "ru"], False),
    ("bad-backend", ENC[:] + ["--backend", "gpu", "@f32"], ["unknown backend 'gpu'"], False),
    ("bad-extension", ENC[:] + ["@f32", "OUT:OUT.txt"], ["must end in .npy or .bin"], False),
    ("override-on-decode", ["--decode", "--from", "e4m3fn", "--convention", "ml_dtypes", "--rounding", "rz", "@u8"],
     ["--rounding", "--decode"], False),
    ("decode-from-container", ["--decode", "--from", "f32", "--convention", "ml_dtypes", "@u8"],
     ["--from f32", "FP8"], False),
    ("decode-bad-container", ["--decode", "--from", "e4m3fn", "--convention", "ml_dtypes", "--to-container",
                              "f16", "@u8"], ["f16", "f32 or f64"], False),
    ("to-container-on-encode", ENC[:] + ["--to-container", "f64", "@f32"], ["--to-container"], False),
    ("decode-unknown-convention", ["--decode", "--from", "e5m2", "--convention", "nope", "@u8"],
     ["unknown convention 'nope'"], False),
    ("output-dir-missing", ENC[:] + ["@f32", "OUT:nodir/out.npy"], ["nodir"], False),
    ("ml-dtypes-bf16-void", ["--from", "bf16", "--to", "e4m3fn", "--convention", "ml_dtypes", "@void2"],
     ["'|V2'", "x.view(np.uint16)"], True),
]


@pytest.mark.parametrize("case_id,args,needles,names_input", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input(fp8ref, tmp_path, files, case_id, args, needles, names_input):
    # "@key": the input file (files[key], or a missing one); "OUT" / "OUT:name": the output path, appended after
    # the input when not given; "NO-OUT": leave it out.
    out = tmp_path / "OUT.npy"
    explicit_out = any(a == "NO-OUT" or a.startswith("OUT") for a in args)
    argv, in_path = [], None
    for a in args:
        if a == "NO-OUT":
            continue
        if a.startswith("OUT"):
            out = tmp_path / a[4:] if a.startswith("OUT:") else out
            argv.append(out)
        elif a.startswith("@"):
            key = a[1:]
            in_path = files[key] if key in files else tmp_path / f"{key}.npy"
            argv.append(in_path)
            if not explicit_out:
                argv.append(out)
        else:
            argv.append(a)
    before = sorted(q.name for q in tmp_path.iterdir())
    p = fp8ref("convert", *argv)
    line = one_line_error(p, "fp8ref convert: error:", *needles)
    if names_input:
        assert str(in_path) in line, line
    assert p.stdout == ""
    assert not out.exists(), f"{out} was written"
    # no temporary files left behind either
    assert sorted(q.name for q in tmp_path.iterdir()) == before


def test_failed_conversion_leaves_existing_output_untouched(fp8ref, tmp_path, files):
    out = tmp_path / "keep.npy"
    out.write_bytes(b"previous contents")
    p = fp8ref("convert", *ENC, files["truncated"], out)
    one_line_error(p, "truncated")
    assert out.read_bytes() == b"previous contents"
