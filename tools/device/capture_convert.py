#!/usr/bin/env python3
"""Capture FP8 / E8M0 conversion tables on an NVIDIA GPU (written for the H200, sm_90).

Produces, in --out (default: $OUT/h200 or ./h200_capture):
  rle_<producer>_<src>_<dst>.txt  run-length tables over ALL bit patterns of the source type
  f64_vectors.txt                  targeted f64 inputs -> torch (via f32) and CUDA (direct) codes
  decode.txt                       all 256 codes decoded to f32 by torch (CUDA, CPU) and CUDA
and, with --tar FILE, packs them into one .tar.gz (the device tool brings back at most 8 files).

Producers:
  torch_cuda / torch_cpu           x.to(torch.float8_*) on device 'cuda' / 'cpu'
  cuda_sat / cuda_nosat            __nv_cvt_{float,halfraw,bfloat16raw}_to_fp8(x, __NV_SATFINITE/__NV_NOSAT, kind)
  cuda_{rz,ru}_{sat,nosat}         __nv_cvt_{float,bfloat16raw}_to_e8m0(x, sat, cudaRoundZero/cudaRoundPosInf)
The CUDA producers are evaluated in __global__ kernels of capture_convert.cu, built here with
nvcc -arch=sm_90.

RLE format: '#' header lines, then '<start> <code>' per run: start = first input bit pattern of the
run in lowercase hex (8 digits for f32 sources, 4 for f16/bf16), code = output byte (2 hex digits).
Starts ascend from 0; a run extends to the next line's start, the last one to 2^bits - 1.

Every table is re-read from its text file and checked against direct evaluations on the device
(1000 random inputs, every run start and the input just before it, and special values).
Only numpy is needed to import this file; torch is imported when a capture needs it.
"""
import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC_BITS = {"f32": 32, "f16": 16, "bf16": 16}
DSTS = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "ue8m0"]
TORCH_DT = {
    "e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2fnuz": "float8_e5m2fnuz",
    "ue8m0": "float8_e8m0fnu",
}
TORCH_SRC = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}

# CUDA producer tables: (producer, src, dst) -> (op name in capture_convert.cu, expression)
CUDA_FN = {"f32": "__nv_cvt_float_to_fp8", "f16": "__nv_cvt_halfraw_to_fp8",
           "bf16": "__nv_cvt_bfloat16raw_to_fp8"}
CUDA_E8M0_FN = {"f32": "__nv_cvt_float_to_e8m0", "bf16": "__nv_cvt_bfloat16raw_to_e8m0"}
CUDA_TABLES = {}
for _src in ("f32", "f16", "bf16"):
    for _dst, _kind, _k in (("e4m3fn", "__NV_E4M3", "e4m3"), ("e5m2", "__NV_E5M2", "e5m2")):
        for _sat, _satc in (("sat", "__NV_SATFINITE"), ("nosat", "__NV_NOSAT")):
            CUDA_TABLES[("cuda_" + _sat, _src, _dst)] = (
                "%s_%s_%s" % (_src, _k, _sat), "%s(x, %s, %s)" % (CUDA_FN[_src], _satc, _kind))
for _src in ("f32", "bf16"):
    for _rnd, _rndc in (("rz", "cudaRoundZero"), ("ru", "cudaRoundPosInf")):
        for _sat, _satc in (("sat", "__NV_SATFINITE"), ("nosat", "__NV_NOSAT")):
            CUDA_TABLES[("cuda_%s_%s" % (_rnd, _sat), _src, "ue8m0")] = (
                "%s_e8m0_%s_%s" % (_src, _rnd, _sat),
                "%s(x, %s, %s)" % (CUDA_E8M0_FN[_src], _satc, _rndc))

F64_COLUMNS = [
    ("torch_cuda_e4m3fn", "torch", "e4m3fn"),
    ("torch_cuda_e5m2", "torch", "e5m2"),
    ("cuda_sat_e4m3fn", "cuda", "f64_e4m3_sat"),
    ("cuda_sat_e5m2", "cuda", "f64_e5m2_sat"),
    ("cuda_nosat_e4m3fn", "cuda", "f64_e4m3_nosat"),
    ("cuda_nosat_e5m2", "cuda", "f64_e5m2_nosat"),
    ("cuda_rz_sat_ue8m0", "cuda", "f64_e8m0_rz_sat"),
    ("cuda_ru_sat_ue8m0", "cuda", "f64_e8m0_ru_sat"),
]
DECODE_COLUMNS = ["torch_cuda_" + d for d in DSTS] + ["torch_cpu_" + d for d in DSTS] + [
    "cuda_e4m3fn", "cuda_e5m2"]

T0 = time.time()


def log(msg):
    print("[%7.1fs] %s" % (time.time() - T0, msg), flush=True)


# ----------------------------------------------------------------------------------------------
# Generic run-length machinery (numpy only; tested locally without a GPU)

def rle_capture(conv, bits, chunk, changes):
    """conv(lo, m) -> array of m output codes for inputs lo..lo+m-1 (any backend);
    changes(y) -> (idx, codes, first, last): numpy positions i >= 1 where y[i] != y[i-1],
    the codes there, and y[0], y[-1] as ints. Returns (starts uint64, codes uint8)."""
    n = 1 << bits
    starts, codes = [], []
    prev = None
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        y = conv(lo, m)
        idx, c, first, last = changes(y)
        if prev is None or first != prev:
            starts.append(np.array([lo], dtype=np.uint64))
            codes.append(np.array([first], dtype=np.uint8))
        starts.append(np.asarray(idx, dtype=np.uint64) + np.uint64(lo))
        codes.append(np.asarray(c, dtype=np.uint8))
        prev = last
    return np.concatenate(starts), np.concatenate(codes)


def numpy_changes(y):
    y = np.asarray(y)
    idx = np.flatnonzero(y[1:] != y[:-1]) + 1
    return idx, y[idx], int(y[0]), int(y[-1])


def validate_rle(starts, codes, bits):
    starts = np.asarray(starts, dtype=np.uint64)
    codes = np.asarray(codes)
    assert len(starts) == len(codes) and len(starts) > 0, "empty table"
    assert int(starts[0]) == 0, "first run does not start at 0"
    assert np.all(starts[1:] > starts[:-1]), "starts not strictly ascending"
    assert int(starts[-1]) < (1 << bits), "start beyond the source range"
    assert np.all((codes >= 0) & (codes <= 255)), "code out of range"
    assert np.all(codes[1:] != codes[:-1]), "adjacent runs with equal codes"


def rle_lookup(starts, codes, q):
    q = np.asarray(q, dtype=np.uint64)
    return np.asarray(codes)[np.searchsorted(starts, q, side="right") - 1]


def write_rle(path, header, starts, codes, bits):
    width = bits // 4
    with open(path, "w") as f:
        for h in header:
            f.write("# %s\n" % h)
        f.write("# runs: %d; format: <first input bits, %d hex digits> <output code, 2 hex digits>;"
                " each run extends to the next line's start, the last to 0x%x\n"
                % (len(starts), width, (1 << bits) - 1))
        fmt = "%%0%dx %%02x\n" % width
        f.write("".join(fmt % (int(s), int(c)) for s, c in zip(starts, codes)))


def parse_rle(path):
    starts, codes = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            a, b = line.split()
            assert a == a.lower() and b == b.lower() and len(b) == 2
            starts.append(int(a, 16))
            codes.append(int(b, 16))
    return np.array(starts, dtype=np.uint64), np.array(codes, dtype=np.uint8)


def check_inputs(starts, bits, rng, nrand=1000):
    """1000 random patterns, every run start and the pattern before it, and specials."""
    n = 1 << bits
    r = rng.integers(0, n, size=nrand, dtype=np.uint64)
    s = np.asarray(starts, dtype=np.uint64)
    before = s[s > 0] - np.uint64(1)
    if bits == 32:
        sp = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
              0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x3F800000, 0xBF800000, 0x00000001, 0x80000001,
              0x007FFFFF, 0x00800000, 0x43E80000, 0x43E80001, 0x43F00000, 0x47700000,
              0x476FFFFF, 0x3A800000, 0x3A800001, 0x37000000, 0x37000001]
    else:
        sp = [0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0,
              0x7F81, 0x7FFF, 0xFFFF, 0x0001, 0x8001, 0x3C00, 0x3F80]
    return np.unique(np.concatenate([r, s, before, np.array(sp, dtype=np.uint64)]))


# ----------------------------------------------------------------------------------------------
# f64 test vectors (numpy only)

def fp8_values(fmt):
    """Positive finite values of e4m3fn / e5m2, ascending (as f64)."""
    eb, mb, bias, maxcode = {"e4m3fn": (4, 3, 7, 0x7E), "e5m2": (5, 2, 15, 0x7B)}[fmt]
    out = []
    for code in range(1, maxcode + 1):
        e, m = code >> mb, code & ((1 << mb) - 1)
        if e == 0:
            out.append(m * 2.0 ** (1 - bias - mb))
        else:
            out.append((1.0 + m / 2.0 ** mb) * 2.0 ** (e - bias))
    return out


def f64_inputs():
    pts = set()
    for fmt, nextv in (("e4m3fn", 480.0), ("e5m2", 65536.0)):
        v = [0.0] + fp8_values(fmt) + [nextv]
        pts.update(v[1:])
        pts.update((a + b) / 2 for a, b in zip(v[:-1], v[1:]))
    pts.update([480.0, 464.0, 61440.0, 65536.0, 2.0 ** -10, 2.0 ** -17, 2.0 ** -11, 2.0 ** -18,
                248.0, 240.0, 256.0, 57344.0, 1.0625])
    pows = []
    for e in range(-140, 131):
        pows += [2.0 ** e, 1.5 * 2.0 ** e]
    pts.update(pows)
    pts = np.array(sorted(pts), dtype=np.float64)
    vals = [pts]
    up, dn = np.full_like(pts, np.inf), np.full_like(pts, -np.inf)
    a1, b1 = np.nextafter(pts, up), np.nextafter(pts, dn)
    vals += [a1, b1, np.nextafter(a1, up), np.nextafter(b1, dn)]
    vals += [pts * (1 + 2.0 ** -40), pts * (1 - 2.0 ** -40)]
    with np.errstate(over="ignore"):
        p32 = pts.astype(np.float32)
    ok = np.isfinite(p32) & (p32.astype(np.float64) == pts)
    p32 = p32[ok]
    vals += [np.nextafter(p32, np.float32(np.inf)).astype(np.float64),
             np.nextafter(p32, np.float32(-np.inf)).astype(np.float64)]
    vals.append(np.array([1.0625 + 2.0 ** -40, 1.0625 - 2.0 ** -40]))
    x = np.concatenate(vals)
    x = x[np.isfinite(x) & (x > 0)]
    x = np.concatenate([x, -x, [0.0, -0.0, np.inf, -np.inf]])
    bits = x.view(np.uint64)
    nans = [0x7FF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF, 0x7FF4000000000000]
    nans += [n | 0x8000000000000000 for n in nans]
    return np.unique(np.concatenate([bits, np.array(nans, dtype=np.uint64)]))


# ----------------------------------------------------------------------------------------------
# Device side

class CudaTool:
    def __init__(self, workdir):
        self.workdir = workdir
        self.exe = os.path.join(workdir, "capture_convert")
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        cmd = [nvcc, "-O2", "-std=c++17", "-arch=sm_90", "-o", self.exe,
               os.path.join(HERE, "capture_convert.cu")]
        log("build: " + " ".join(cmd))
        subprocess.run(cmd, check=True)
        self.nvcc_version = subprocess.run([nvcc, "--version"], capture_output=True,
                                           text=True).stdout.strip().splitlines()[-1]

    def run(self, *args):
        r = subprocess.run([self.exe] + [str(a) for a in args], capture_output=True, text=True)
        if r.stdout.strip():
            for line in r.stdout.strip().splitlines():
                log("  cu: " + line)
        if r.returncode != 0:
            raise RuntimeError("capture_convert %s failed: %s" % (args[0], r.stderr))

    def rle(self, ops):
        d = tempfile.mkdtemp(dir=self.workdir)
        self.run("rle", d, *ops)
        out = {}
        for op in ops:
            a = np.fromfile(os.path.join(d, op + ".bin"), dtype=np.uint32).reshape(-1, 2)
            out[op] = (a[:, 0].astype(np.uint64), a[:, 1].astype(np.uint8))
        return out

    def eval(self, q, ops, is64=False):
        fin = os.path.join(self.workdir, "in.bin")
        fout = os.path.join(self.workdir, "out.bin")
        np.asarray(q, dtype=np.uint64 if is64 else np.uint32).tofile(fin)
        self.run("eval64" if is64 else "eval32", fin, fout, *ops)
        return np.fromfile(fout, dtype=np.uint8).reshape(len(ops), len(q))

    def decode(self):
        fout = os.path.join(self.workdir, "dec.bin")
        self.run("decode", fout)
        return np.fromfile(fout, dtype=np.uint32).reshape(2, 256)


def torch_src_tensor(torch, q, src, dev):
    """Tensor of source type `src` on `dev` holding the bit patterns q."""
    if src == "f32":
        t = torch.from_numpy(np.asarray(q, dtype=np.uint64).astype(np.uint32).view(np.int32).copy())
        return t.to(dev).view(torch.float32)
    t = torch.from_numpy(np.asarray(q, dtype=np.uint64).astype(np.uint16).view(np.int16).copy())
    return t.to(dev).view(getattr(torch, TORCH_SRC[src]))


def torch_rle(torch, src, dst, dev, chunk):
    dt = getattr(torch, TORCH_DT[dst])
    bits = SRC_BITS[src]

    def changes(y):
        d = torch.nonzero(y[1:] != y[:-1]).flatten() + 1
        return d.cpu().numpy(), y[d].cpu().numpy(), int(y[0]), int(y[-1])

    if bits == 16:
        x = torch_src_tensor(torch, np.arange(1 << 16), src, dev)
        return rle_capture(lambda lo, m: x.to(dt).view(torch.uint8), 16, 1 << 16, changes)
    base = torch.arange(chunk, dtype=torch.int32, device=dev)

    def conv(lo, m):
        s = lo - (1 << 32) if lo >= (1 << 31) else lo  # chunks never straddle 2^31: no overflow
        x = (base[:m] + s).view(torch.float32)
        return x.to(dt).view(torch.uint8)

    return rle_capture(conv, 32, chunk, changes)


def torch_direct(torch, q, src, dst, dev):
    x = torch_src_tensor(torch, q, src, dev)
    return x.to(getattr(torch, TORCH_DT[dst])).view(torch.uint8).cpu().numpy()


class Capture:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self.rng = np.random.default_rng(20261201)
        self.errors = []
        self.checked = []  # (file, n_inputs, n_mismatch)
        self.workdir = tempfile.mkdtemp(prefix="capconv_")
        import torch
        self.torch = torch
        torch.set_num_threads(os.cpu_count() or 1)
        self.cu = CudaTool(self.workdir)
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                  "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip()
        except OSError:
            smi = "nvidia-smi not found"
        cpu = platform.processor() or ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        cpu = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        cap = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")()
        self.env = [
            "captured by tools/device/capture_convert.py on %s UTC"
            % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "GPU: %s (nvidia-smi: %s); CPU: %s, %d threads, torch cpu capability %s"
            % (torch.cuda.get_device_name(0), smi, cpu, torch.get_num_threads(), cap),
            "torch %s (torch.version.cuda %s); nvcc: %s; numpy %s; python %s"
            % (torch.__version__, torch.version.cuda, self.cu.nvcc_version, np.__version__,
               platform.python_version()),
        ]
        for line in self.env:
            log(line)

    def section(self, name, fn, *a):
        t = time.time()
        try:
            fn(*a)
        except Exception:
            self.errors.append(name)
            log("ERROR in %s:\n%s" % (name, traceback.format_exc()))
        log("%s done in %.1fs" % (name, time.time() - t))
        self.pack()

    def pack(self):
        """Pack --out into --tar after every part, so a run stopped at its limit keeps its data."""
        if not self.args.tar:
            return
        tmp = self.args.tar + ".tmp"
        with tarfile.open(tmp, "w:gz") as tf:
            for fn in sorted(os.listdir(self.out)):
                tf.add(os.path.join(self.out, fn), arcname=fn)
        os.replace(tmp, self.args.tar)

    def emit(self, producer, src, dst, expr, starts, codes, direct):
        bits = SRC_BITS[src]
        validate_rle(starts, codes, bits)
        name = "rle_%s_%s_%s.txt" % (producer, src, dst)
        path = os.path.join(self.out, name)
        header = ["fp8ref H200 capture: producer %s, source %s (all 2^%d bit patterns), target %s"
                  % (producer, src, bits, dst), "expression: " + expr] + self.env
        write_rle(path, header, starts, codes, bits)
        s2, c2 = parse_rle(path)
        validate_rle(s2, c2, bits)
        assert np.array_equal(s2, starts) and np.array_equal(c2, codes), "re-read differs"
        q = check_inputs(s2, bits, self.rng)
        got = np.asarray(direct(q), dtype=np.uint8)
        exp = rle_lookup(s2, c2, q)
        bad = int(np.count_nonzero(got != exp))
        self.checked.append((name, len(q), bad))
        log("%s: %d runs; direct check %d inputs, %d mismatches%s" % (
            name, len(starts), len(q), bad,
            "" if not bad else " e.g. " + ", ".join("%x->%02x(rle %02x)" % (a, b, c) for a, b, c in
                                                     list(zip(q[got != exp], got[got != exp],
                                                              exp[got != exp]))[:5])))
        if bad:
            self.errors.append(name + " check")

    def torch_tables(self, dev, combos):
        torch = self.torch
        producer = "torch_" + dev
        for src, dst in combos:
            def one(src=src, dst=dst):
                t = time.time()
                s, c = torch_rle(torch, src, dst, dev, self.args.chunk)
                if dev == "cuda":
                    torch.cuda.synchronize()
                log("%s %s->%s captured in %.1fs" % (producer, src, dst, time.time() - t))
                expr = "x.to(torch.%s)  (x: torch.%s tensor on device '%s', all bit patterns)" % (
                    TORCH_DT[dst], TORCH_SRC[src], dev)
                self.emit(producer, src, dst, expr, s, c,
                          lambda q: torch_direct(torch, q, src, dst, dev))
            self.section("%s %s->%s" % (producer, src, dst), one)

    def torch_cpu_f32(self):
        """f32 on the CPU only if the projected time fits; decide from the first chunk."""
        torch = self.torch
        t = time.time()
        base = torch.arange(self.args.chunk, dtype=torch.int32)
        x = (base + 0x30000000).view(torch.float32)  # a chunk of ordinary finite values
        y = x.to(torch.float8_e4m3fn).view(torch.uint8)
        torch.nonzero(y[1:] != y[:-1])
        per_chunk = time.time() - t
        dsts = [d for d in self.args.cpu_f32_dsts.split(",") if d]
        proj = per_chunk * ((1 << 32) // self.args.chunk) * len(dsts) * 1.3
        log("torch_cpu f32: %.2fs per chunk of %d -> projected %.0fs for %s (limit %ds)"
            % (per_chunk, self.args.chunk, proj, dsts, self.args.cpu_budget))
        if proj > self.args.cpu_budget:
            log("torch_cpu f32 SKIPPED (too slow)")
            return
        self.torch_tables("cpu", [("f32", d) for d in dsts])

    def cuda_tables(self, keys):
        tabs = self.cu.rle([CUDA_TABLES[k][0] for k in keys])
        for k in keys:
            op, expr = CUDA_TABLES[k]
            producer, src, dst = k

            def one(k=k, op=op, expr=expr, producer=producer, src=src, dst=dst):
                s, c = tabs[op]
                self.emit(producer, src, dst,
                          expr + "  in a __global__ kernel, nvcc -arch=sm_90 (" +
                          self.cu.nvcc_version + "); x: " + {"f32": "float", "f16": "__half_raw",
                                                             "bf16": "__nv_bfloat16_raw"}[src],
                          s, c, lambda q: self.cu.eval(q, [op])[0])
            self.section("%s %s->%s" % k, one)

    def f64_vectors(self):
        torch = self.torch
        bits = f64_inputs()
        cu_ops = [c[2] for c in F64_COLUMNS if c[1] == "cuda"]
        cu = self.cu.eval(bits, cu_ops, is64=True)
        x = torch.from_numpy(bits.view(np.float64).copy()).to("cuda")
        cols = []
        for name, kind, what in F64_COLUMNS:
            if kind == "torch":
                cols.append(x.to(getattr(torch, TORCH_DT[what])).view(torch.uint8).cpu().numpy())
            else:
                cols.append(cu[cu_ops.index(what)])
        # re-evaluate torch on CPU too (information only: logged, not written)
        xc = torch.from_numpy(bits.view(np.float64).copy())
        for i, (name, kind, what) in enumerate(F64_COLUMNS):
            if kind == "torch":
                cpu = xc.to(getattr(torch, TORCH_DT[what])).view(torch.uint8).numpy()
                log("f64 %s: torch cpu differs from cuda on %d of %d inputs"
                    % (what, int(np.count_nonzero(cpu != cols[i])), len(bits)))
        path = os.path.join(self.out, "f64_vectors.txt")
        with open(path, "w") as f:
            f.write("# fp8ref H200 capture: f64 inputs -> fp8 / ue8m0 codes\n")
            f.write("# torch: torch.tensor(x, dtype=torch.float64, device='cuda').to(torch.float8_*)"
                    " (rounds via f32)\n")
            f.write("# cuda: __nv_cvt_double_to_fp8(x, __NV_SATFINITE|__NV_NOSAT, __NV_E4M3|__NV_E5M2),"
                    " __nv_cvt_double_to_e8m0(x, __NV_SATFINITE, cudaRoundZero|cudaRoundPosInf),"
                    " in a __global__ kernel, nvcc -arch=sm_90\n")
            for line in self.env:
                f.write("# %s\n" % line)
            f.write("# %d inputs\n" % len(bits))
            f.write("# f64_bits " + " ".join(c[0] for c in F64_COLUMNS) + "\n")
            for i, b in enumerate(bits):
                f.write("%016x %s\n" % (int(b), " ".join("%02x" % int(c[i]) for c in cols)))
        log("f64_vectors.txt: %d inputs" % len(bits))

    def decode(self):
        torch = self.torch
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        cols = []
        for dev in ("cuda", "cpu"):
            for d in DSTS:
                t = codes.to(dev).view(getattr(torch, TORCH_DT[d])).to(torch.float32)
                cols.append(t.view(torch.int32).cpu().numpy().view(np.uint32))
        cu = self.cu.decode()
        cols += [cu[0], cu[1]]
        path = os.path.join(self.out, "decode.txt")
        with open(path, "w") as f:
            f.write("# fp8ref H200 capture: fp8 / e8m0 code -> f32 bits\n")
            f.write("# torch: t.view(torch.float8_*).to(torch.float32) on 'cuda' and 'cpu';"
                    " cuda: __half2float(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3|__NV_E5M2))"
                    " in a __global__ kernel, nvcc -arch=sm_90\n")
            for line in self.env:
                f.write("# %s\n" % line)
            f.write("# code " + " ".join(DECODE_COLUMNS) + "\n")
            for i in range(256):
                f.write("%02x %s\n" % (i, " ".join("%08x" % int(c[i]) for c in cols)))
        log("decode.txt written")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "h200"))
    ap.add_argument("--tar", default="", help="also pack --out into this .tar.gz")
    ap.add_argument("--chunk", type=int, default=1 << 28)
    ap.add_argument("--cpu-f32-dsts", default="e4m3fn,e5m2,ue8m0")
    ap.add_argument("--cpu-budget", type=int, default=180, help="seconds allowed for torch_cpu f32")
    ap.add_argument("--only", default="torch_cuda,cuda,torch_cpu16,torch_cpu32,f64,decode")
    args = ap.parse_args()
    only = set(args.only.split(","))
    cap = Capture(args)
    if "decode" in only:
        cap.section("decode", cap.decode)
    if "f64" in only:
        cap.section("f64 vectors", cap.f64_vectors)
    if "cuda" in only:
        cap.section("cuda tables", cap.cuda_tables, sorted(CUDA_TABLES))
    if "torch_cuda" in only:
        cap.torch_tables("cuda", [(s, d) for s in ("f16", "bf16", "f32") for d in DSTS])
    if "torch_cpu16" in only:
        cap.torch_tables("cpu", [(s, d) for s in ("f16", "bf16") for d in DSTS])
    if "torch_cpu32" in only:
        cap.section("torch_cpu f32", cap.torch_cpu_f32)
    total = sum(n for _, n, _ in cap.checked)
    bad = sum(b for _, _, b in cap.checked)
    log("SUMMARY: %d tables checked, %d direct evaluations, %d mismatches; errors: %s"
        % (len(cap.checked), total, bad, cap.errors or "none"))
    if args.tar:
        cap.pack()
        log("packed %s (%d bytes)" % (args.tar, os.path.getsize(args.tar)))
    return 1 if cap.errors else 0


if __name__ == "__main__":
    sys.exit(main())
