#!/usr/bin/env python3
"""pipe_pairs — which 512-bit instructions share execution pipes on this x86 core (bench/RESULTS.md, session 20);
with --ymm, which 256-bit AVX2 ones (session 35, AMD Zen 2).

For each pair (A, B) it times a loop of 12 independent A's interleaved with 12 independent B's (no dependency
between iterations' results that matters: every destination is rewritten each iteration), in cycles per pair at the
clock measured by a chain of dependent imul (3 cycles each). A + B ~ max(A alone, B alone): different pipes;
~ A + B: the same. Compares, never asserts. Needs g++ and an AVX-512 (BF16, VBMI) CPU.

  python3 bench/pipe_pairs.py [BASES [OTHERS]]     e.g. python3 bench/pipe_pairs.py none,vfmadd231ps,dp vpermt2b,store
  python3 bench/pipe_pairs.py --ymm [BASES [OTHERS]]   AVX2 (16 registers: A's destinations ymm0..5 and B's ymm6..11,
                                                        each written twice per iteration; the FMA starts from a moved
                                                        copy so that it is no chain; operands 1.0f)
"""
import os
import subprocess
import sys
import tempfile

REGS = [12, 13, 14, 15, 16, 17, 18, 19, 26, 27, 28, 29]  # B's destinations (A's are zmm0..11)
# (vpermi2b / vpermt2b overwrite their index / first table: each register is its own chain across iterations; the
# "mov+" forms start from a fresh copy — vmovdqa64 zmm, zmm is eliminated at rename — and show the unchained cost.)
OPS = {
 "none":None,
 "vpunpcklbw":"vpunpcklbw %%zmm24,%%zmm25,%%zmm{d}",
 "vpmaxub":"vpmaxub %%zmm24,%%zmm25,%%zmm{d}",
 "vmovdqa64":"vmovdqa64 %%zmm24,%%zmm{d}",
 "dp":"vdpbf16ps %%zmm20,%%zmm21,%%zmm{d}",
 "mov+vpermt2b":"vmovdqa64 %%zmm24,%%zmm{d}\\nvpermt2b %%zmm23,%%zmm25,%%zmm{d}",
 "mov+vpermi2b":"vmovdqa64 %%zmm24,%%zmm{d}\\nvpermi2b %%zmm23,%%zmm25,%%zmm{d}",
 "vpunpcklwd":"vpunpcklwd %%zmm24,%%zmm25,%%zmm{d}",
 "vpminud":"vpminud %%zmm24,%%zmm25,%%zmm{d}",
 "vpmovzxwd":"vpmovzxwd %%ymm24,%%zmm{d}",
 "vpsllw":"vpsllw $8,%%zmm24,%%zmm{d}",
 "vpshldd":"vpshldd $9,%%zmm24,%%zmm25,%%zmm{d}",
 "vprold":"vprold $9,%%zmm24,%%zmm{d}",
 "vpermps_mem":"vpermd {m}(%0),%%zmm25,%%zmm{d}",
 "vpbroadcastd":"vpbroadcastd %%xmm24,%%zmm{d}",
 "vfmadd231ps":"vfmadd231ps %%zmm24,%%zmm25,%%zmm{d}",
 "vmulps":"vmulps %%zmm24,%%zmm25,%%zmm{d}",
 "vaddps":"vaddps %%zmm24,%%zmm25,%%zmm{d}",
 "vminps":"vminps %%zmm24,%%zmm25,%%zmm{d}",
 "vmaxps":"vmaxps %%zmm24,%%zmm25,%%zmm{d}",
 "vpunpckhwd":"vpunpckhwd %%zmm24,%%zmm25,%%zmm{d}",
 "vrangeps":"vrangeps $0x0A,%%zmm24,%%zmm25,%%zmm{d}",
 "vpermi2b":"vpermi2b %%zmm24,%%zmm25,%%zmm{d}",
 "vpermt2b":"vpermt2b %%zmm24,%%zmm25,%%zmm{d}",
 "vpermb":"vpermb %%zmm24,%%zmm25,%%zmm{d}",
 "gf2p8affineqb":"vgf2p8affineqb $0x40,%%zmm24,%%zmm25,%%zmm{d}",
 "vptestnmb_k":"vptestnmb %%zmm24,%%zmm25,%%k2",
 "vpermb_mask":"vpermb %%zmm24,%%zmm25,%%zmm{d}%{{%%k3%}}",
 "vpermd":"vpermd %%zmm24,%%zmm25,%%zmm{d}",
 "vpmaxud":"vpmaxud %%zmm24,%%zmm25,%%zmm{d}",
 "vpmaxuw":"vpmaxuw %%zmm24,%%zmm25,%%zmm{d}",
 "vpsrld":"vpsrld $23,%%zmm24,%%zmm{d}",
 "vpslld":"vpslld $16,%%zmm24,%%zmm{d}",
 "vpandd":"vpandd %%zmm24,%%zmm25,%%zmm{d}",
 "vpaddd":"vpaddd %%zmm24,%%zmm25,%%zmm{d}",
 "vpternlogd":"vpternlogd $0xF8,%%zmm24,%%zmm25,%%zmm{d}",
 "vpblendmb":"vpblendmb %%zmm24,%%zmm25,%%zmm{d}%{{%%k1%}}",
 "store":"vmovdqu64 %%zmm24, {m}(%0)",
 "ymmstore":"vmovdqu64 %%ymm24, {m}(%0)",
 "vcvtne2ps2bf16":"vcvtne2ps2bf16 %%zmm24,%%zmm25,%%zmm{d}",
 "vpmultishiftqb":"vpmultishiftqb %%zmm24,%%zmm25,%%zmm{d}",
 "vpsubw":"vpsubw %%zmm24,%%zmm25,%%zmm{d}",
 "vpminuw":"vpminuw %%zmm24,%%zmm25,%%zmm{d}",
 "vpshufb":"vpshufb %%zmm24,%%zmm25,%%zmm{d}",
 "vpsraw":"vpsraw $4,%%zmm24,%%zmm{d}",
 "vpermw":"vpermw %%zmm24,%%zmm25,%%zmm{d}",
 "vpaddw":"vpaddw %%zmm24,%%zmm25,%%zmm{d}",
 "vpmovzxbw":"vpmovzxbw %%ymm24,%%zmm{d}",
 "vpunpckhbw":"vpunpckhbw %%zmm24,%%zmm25,%%zmm{d}",
 "vpcmpw_k":"vpcmpuw $1,%%zmm24,%%zmm25,%%k2",
 "vfpclassps":"vfpclassps $0x22,%%zmm24,%%k2",
 "vcvtps2ph":"vcvtps2ph $0,%%zmm24,%%ymm{d}",
 "vscalefps":"vscalefps %%zmm24,%%zmm25,%%zmm{d}",
 "vgetexpps":"vgetexpps %%zmm24,%%zmm{d}",
 "vpsrlvd":"vpsrlvd %%zmm24,%%zmm25,%%zmm{d}",
 "vpmovdb":"vpmovdb %%zmm24,%%xmm{d}",
 "vpermt2w":"vpermt2w %%zmm24,%%zmm25,%%zmm{d}",
 "vpackusdw":"vpackusdw %%zmm24,%%zmm25,%%zmm{d}",
 "vpackuswb":"vpackuswb %%zmm24,%%zmm25,%%zmm{d}",
 "vpsrlw":"vpsrlw $8,%%zmm24,%%zmm{d}",
 "vpmovwb":"vpmovwb %%zmm24,%%ymm{d}",
}

# AVX2 (--ymm): 256-bit forms; {d} is the destination (A: ymm0..5, B: ymm6..11), ymm14 and ymm15 the operands.
OPS_YMM = {
 "none":None,
 "vfmadd231ps":"vmovaps %%ymm14,%%ymm{d}\\nvfmadd231ps %%ymm14,%%ymm15,%%ymm{d}",
 "vmulps":"vmulps %%ymm14,%%ymm15,%%ymm{d}",
 "vaddps":"vaddps %%ymm14,%%ymm15,%%ymm{d}",
 "vmaxps":"vmaxps %%ymm14,%%ymm15,%%ymm{d}",
 "vdivps":"vdivps %%ymm14,%%ymm15,%%ymm{d}",
 "vcvtph2ps":"vcvtph2ps %%xmm15,%%ymm{d}",
 "vpaddd":"vpaddd %%ymm14,%%ymm15,%%ymm{d}",
 "vpsubd":"vpsubd %%ymm14,%%ymm15,%%ymm{d}",
 "vpcmpeqd":"vpcmpeqd %%ymm14,%%ymm15,%%ymm{d}",
 "vpmaxud":"vpmaxud %%ymm14,%%ymm15,%%ymm{d}",
 "vpminud":"vpminud %%ymm14,%%ymm15,%%ymm{d}",
 "vpand":"vpand %%ymm14,%%ymm15,%%ymm{d}",
 "vpsrld":"vpsrld $20,%%ymm14,%%ymm{d}",
 "vpsrlvd":"vpsrlvd %%ymm14,%%ymm15,%%ymm{d}",
 "vpunpcklwd":"vpunpcklwd %%ymm14,%%ymm15,%%ymm{d}",
 "vpackusdw":"vpackusdw %%ymm14,%%ymm15,%%ymm{d}",
 "vpshufb":"vpshufb %%ymm14,%%ymm15,%%ymm{d}",
 "vpmovzxbw":"vpmovzxbw %%xmm14,%%ymm{d}",
 "vpermd":"vpermd %%ymm14,%%ymm15,%%ymm{d}",
 "vpermq":"vpermq $0xD8,%%ymm14,%%ymm{d}",
 "vpblendvb":"vpblendvb %%ymm13,%%ymm14,%%ymm15,%%ymm{d}",
 "store":"vmovdqu %%ymm14, {m}(%0)",
}


def source(cases, ymm=False):
    ops = OPS_YMM if ymm else OPS
    # AVX-512: A's destinations zmm0..11, B's REGS; AVX2: A's ymm0..5, B's ymm6..11 (each written twice)
    dst_a = (lambda k: k % 6) if ymm else (lambda k: k)
    dst_b = (lambda k: 6 + k % 6) if ymm else (lambda k: REGS[k])
    clobber = "".join(f', "xmm{r}"' for r in range(12)) if ymm else ""
    init = ('const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1}; asm volatile("vmovups %0,%%ymm14\\n vmovups %0,%%ymm15\\n '
            'vpxor %%ymm13,%%ymm13,%%ymm13" :: "m"(one) : "xmm13", "xmm14", "xmm15");' if ymm else
            'asm volatile("vpxord %%zmm24,%%zmm24,%%zmm24\\n vpxord %%zmm25,%%zmm25,%%zmm25\\n '
            'kxnorq %%k1,%%k1,%%k1" ::: "memory");')
    out = ["#include <chrono>", "#include <cstdio>", "#include <cstdint>",
           "alignas(64) static uint32_t mem[8192];",
           "static double now() { return std::chrono::duration<double>("
           "std::chrono::steady_clock::now().time_since_epoch()).count(); }"]
    for ci, (a, b) in enumerate(cases):
        lines = []
        for k in range(12):
            if ops[a]: lines.append(ops[a].format(d=dst_a(k), m=k * 64 + 4096))
            if ops[b]: lines.append(ops[b].format(d=dst_b(k), m=k * 64))
        body = "\\n".join(lines)
        out.append(f'__attribute__((noinline)) double run{ci}(long n) {{ double t0 = now(); for (long i = 0; i < n; ++i) '
                   f'asm volatile("{body}" :: "r"(mem) : "memory"{clobber}); return now() - t0; }}')
    out.append('int main() { double hz; { long n = 20000000, x = 1; double t0 = now(); for (long i = 0; i < n; i += 8) '
               'asm volatile("imul %0,%0\\n imul %0,%0\\n imul %0,%0\\n imul %0,%0\\n imul %0,%0\\n imul %0,%0\\n '
               'imul %0,%0\\n imul %0,%0" : "+r"(x)); hz = 3.0 * n / (now() - t0); }')
    out.append(init + ' long n = 1000000; double b;')
    for ci, (a, b) in enumerate(cases):
        out.append(f'b = 1e9; for (int r = 0; r < 5; ++r) {{ double t = run{ci}(n); if (t < b) b = t; }} '
                   f'printf("%-14s + %-16s %.3f cycles per pair\\n", "{a}", "{b}", b * hz / n / 12);')
    out.append('printf("clock %.2f GHz\\n", hz / 1e9); }')
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    ymm = bool(args) and args[0] == "--ymm"
    if ymm:
        args = args[1:]
    ops = OPS_YMM if ymm else OPS
    default_bases = "none,vfmadd231ps,vaddps,vpaddd,vpsrld" if ymm else "none,vfmadd231ps,dp,vaddps,vpermd,vpandd"
    bases = (args[0] if args else default_bases).split(",")
    others = (args[1] if len(args) > 1 else ",".join(k for k in ops if k != "none")).split(",")
    for name in bases + others:
        if name not in ops:
            sys.exit(f"pipe_pairs: unknown instruction {name!r}; known: {', '.join(ops)}")
    with tempfile.TemporaryDirectory() as d:
        cc, exe = os.path.join(d, "p.cc"), os.path.join(d, "p")
        with open(cc, "w") as f:
            f.write(source([(a, b) for a in bases for b in others], ymm))
        subprocess.run(["g++", "-O2", cc, "-o", exe], check=True)
        subprocess.run([exe], check=True)


if __name__ == "__main__":
    main()
