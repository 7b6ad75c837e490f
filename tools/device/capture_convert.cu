// capture_convert.cu -- exhaustive capture of CUDA FP8 / E8M0 conversion intrinsics on device.
//
// Built and driven by tools/device/capture_convert.py (see tools/device/README.md):
//   nvcc -O2 -std=c++17 -arch=sm_90 -o capture_convert capture_convert.cu
//
// Modes (all binary files are little-endian, no header):
//   capture_convert list
//       prints "<id> <name> <srcbits>" for every op.
//   capture_convert rle <outdir> <op>...
//       for each op, evaluates all 2^srcbits input bit patterns on the GPU, finds every run start
//       (input 0, and every i with f(i) != f(i-1)) and writes <outdir>/<name>.bin as
//       sorted uint32 pairs (start, code).
//   capture_convert eval32 <in.bin> <out.bin> <op>...
//       in: uint32 bit patterns (16-bit sources use the low 16 bits); out: uint8, op-major
//       (all inputs for the first op, then the second op, ...).
//   capture_convert eval64 <in.bin> <out.bin> <op>...
//       in: uint64 f64 bit patterns; out as eval32 (ops must be f64_* ops).
//   capture_convert decode <out.bin>
//       out: uint32 f32 bits, 256 for E4M3 then 256 for E5M2;
//       __half2float(__nv_cvt_fp8_to_halfraw(code, kind)) evaluated on the device.
//
// Every conversion is a single intrinsic call inside a __global__ kernel built for sm_90,
// so what is captured is what device code on Hopper gets (PTX cvt for SATFINITE from f32/f16,
// the header's software path otherwise).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "capture_util.cuh"

enum Op : int {
    F32_E4M3_SAT = 0,
    F32_E4M3_NOSAT,
    F32_E5M2_SAT,
    F32_E5M2_NOSAT,
    F16_E4M3_SAT,
    F16_E4M3_NOSAT,
    F16_E5M2_SAT,
    F16_E5M2_NOSAT,
    BF16_E4M3_SAT,
    BF16_E4M3_NOSAT,
    BF16_E5M2_SAT,
    BF16_E5M2_NOSAT,
    F32_E8M0_RZ_SAT,
    F32_E8M0_RZ_NOSAT,
    F32_E8M0_RU_SAT,
    F32_E8M0_RU_NOSAT,
    BF16_E8M0_RZ_SAT,
    BF16_E8M0_RZ_NOSAT,
    BF16_E8M0_RU_SAT,
    BF16_E8M0_RU_NOSAT,
    F64_E4M3_SAT,
    F64_E4M3_NOSAT,
    F64_E5M2_SAT,
    F64_E5M2_NOSAT,
    F64_E8M0_RZ_SAT,
    F64_E8M0_RZ_NOSAT,
    F64_E8M0_RU_SAT,
    F64_E8M0_RU_NOSAT,
    NUM_OPS
};

static const char* kOpNames[NUM_OPS] = {
    "f32_e4m3_sat",       "f32_e4m3_nosat",     "f32_e5m2_sat",       "f32_e5m2_nosat",
    "f16_e4m3_sat",       "f16_e4m3_nosat",     "f16_e5m2_sat",       "f16_e5m2_nosat",
    "bf16_e4m3_sat",      "bf16_e4m3_nosat",    "bf16_e5m2_sat",      "bf16_e5m2_nosat",
    "f32_e8m0_rz_sat",    "f32_e8m0_rz_nosat",  "f32_e8m0_ru_sat",    "f32_e8m0_ru_nosat",
    "bf16_e8m0_rz_sat",   "bf16_e8m0_rz_nosat", "bf16_e8m0_ru_sat",   "bf16_e8m0_ru_nosat",
    "f64_e4m3_sat",       "f64_e4m3_nosat",     "f64_e5m2_sat",       "f64_e5m2_nosat",
    "f64_e8m0_rz_sat",    "f64_e8m0_rz_nosat",  "f64_e8m0_ru_sat",    "f64_e8m0_ru_nosat"};

static int op_src_bits(int op) {
    if (op >= F64_E4M3_SAT) return 64;
    if (op >= F16_E4M3_SAT && op <= BF16_E5M2_NOSAT) return 16;
    if (op >= BF16_E8M0_RZ_SAT && op <= BF16_E8M0_RU_NOSAT) return 16;
    return 32;
}

// One conversion of a 32-bit (or 16-bit, in the low half) input pattern.
__device__ __forceinline__ unsigned conv32(int op, uint32_t b) {
    const float f = __uint_as_float(b);
    __half_raw h;
    h.x = (unsigned short)(b & 0xFFFFu);
    __nv_bfloat16_raw bf;
    bf.x = (unsigned short)(b & 0xFFFFu);
    switch (op) {
        case F32_E4M3_SAT: return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
        case F32_E4M3_NOSAT: return __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E4M3);
        case F32_E5M2_SAT: return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
        case F32_E5M2_NOSAT: return __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E5M2);
        case F16_E4M3_SAT: return __nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, __NV_E4M3);
        case F16_E4M3_NOSAT: return __nv_cvt_halfraw_to_fp8(h, __NV_NOSAT, __NV_E4M3);
        case F16_E5M2_SAT: return __nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, __NV_E5M2);
        case F16_E5M2_NOSAT: return __nv_cvt_halfraw_to_fp8(h, __NV_NOSAT, __NV_E5M2);
        case BF16_E4M3_SAT: return __nv_cvt_bfloat16raw_to_fp8(bf, __NV_SATFINITE, __NV_E4M3);
        case BF16_E4M3_NOSAT: return __nv_cvt_bfloat16raw_to_fp8(bf, __NV_NOSAT, __NV_E4M3);
        case BF16_E5M2_SAT: return __nv_cvt_bfloat16raw_to_fp8(bf, __NV_SATFINITE, __NV_E5M2);
        case BF16_E5M2_NOSAT: return __nv_cvt_bfloat16raw_to_fp8(bf, __NV_NOSAT, __NV_E5M2);
        case F32_E8M0_RZ_SAT: return __nv_cvt_float_to_e8m0(f, __NV_SATFINITE, cudaRoundZero);
        case F32_E8M0_RZ_NOSAT: return __nv_cvt_float_to_e8m0(f, __NV_NOSAT, cudaRoundZero);
        case F32_E8M0_RU_SAT: return __nv_cvt_float_to_e8m0(f, __NV_SATFINITE, cudaRoundPosInf);
        case F32_E8M0_RU_NOSAT: return __nv_cvt_float_to_e8m0(f, __NV_NOSAT, cudaRoundPosInf);
        case BF16_E8M0_RZ_SAT: return __nv_cvt_bfloat16raw_to_e8m0(bf, __NV_SATFINITE, cudaRoundZero);
        case BF16_E8M0_RZ_NOSAT: return __nv_cvt_bfloat16raw_to_e8m0(bf, __NV_NOSAT, cudaRoundZero);
        case BF16_E8M0_RU_SAT: return __nv_cvt_bfloat16raw_to_e8m0(bf, __NV_SATFINITE, cudaRoundPosInf);
        case BF16_E8M0_RU_NOSAT: return __nv_cvt_bfloat16raw_to_e8m0(bf, __NV_NOSAT, cudaRoundPosInf);
        default: return 0x1000u;  // invalid: marks an error
    }
}

__device__ __forceinline__ unsigned conv64(int op, uint64_t b) {
    const double d = __longlong_as_double((long long)b);
    switch (op) {
        case F64_E4M3_SAT: return __nv_cvt_double_to_fp8(d, __NV_SATFINITE, __NV_E4M3);
        case F64_E4M3_NOSAT: return __nv_cvt_double_to_fp8(d, __NV_NOSAT, __NV_E4M3);
        case F64_E5M2_SAT: return __nv_cvt_double_to_fp8(d, __NV_SATFINITE, __NV_E5M2);
        case F64_E5M2_NOSAT: return __nv_cvt_double_to_fp8(d, __NV_NOSAT, __NV_E5M2);
        case F64_E8M0_RZ_SAT: return __nv_cvt_double_to_e8m0(d, __NV_SATFINITE, cudaRoundZero);
        case F64_E8M0_RZ_NOSAT: return __nv_cvt_double_to_e8m0(d, __NV_NOSAT, cudaRoundZero);
        case F64_E8M0_RU_SAT: return __nv_cvt_double_to_e8m0(d, __NV_SATFINITE, cudaRoundPosInf);
        case F64_E8M0_RU_NOSAT: return __nv_cvt_double_to_e8m0(d, __NV_NOSAT, cudaRoundPosInf);
        default: return 0x1000u;
    }
}

// Run starts over [0, n): record i == 0 and every i with f(i) != f(i-1).
__global__ void rle_kernel(int op, uint64_t n, uint2* rec, unsigned long long* count,
                           unsigned long long cap, unsigned* bad) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned c = conv32(op, (uint32_t)i);
        if (c > 0xFFu) atomicOr(bad, 1u);
        bool start = (i == 0);
        if (!start) start = (conv32(op, (uint32_t)(i - 1)) != c);
        if (start) {
            const unsigned long long k = atomicAdd(count, 1ull);
            if (k < cap) rec[k] = make_uint2((uint32_t)i, c);
        }
    }
}

__global__ void eval32_kernel(int op, const uint32_t* in, uint8_t* out, size_t n, unsigned* bad) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const unsigned c = conv32(op, in[i]);
        if (c > 0xFFu) atomicOr(bad, 1u);
        out[i] = (uint8_t)c;
    }
}

__global__ void eval64_kernel(int op, const uint64_t* in, uint8_t* out, size_t n, unsigned* bad) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const unsigned c = conv64(op, in[i]);
        if (c > 0xFFu) atomicOr(bad, 1u);
        out[i] = (uint8_t)c;
    }
}

__global__ void decode_kernel(uint32_t* out) {
    const unsigned i = threadIdx.x;
    if (i < 256) {
        const __half_raw h4 = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)i, __NV_E4M3);
        const __half_raw h5 = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)i, __NV_E5M2);
        out[i] = __float_as_uint(__half2float(__half(h4)));
        out[256 + i] = __float_as_uint(__half2float(__half(h5)));
    }
}

static int find_op(const char* name) {
    for (int k = 0; k < NUM_OPS; ++k)
        if (std::strcmp(kOpNames[k], name) == 0) return k;
    std::fprintf(stderr, "unknown op %s\n", name);
    std::exit(1);
}

static std::vector<unsigned char> read_file(const char* path) {
    FILE* fp = std::fopen(path, "rb");
    if (!fp) {
        std::fprintf(stderr, "cannot open %s\n", path);
        std::exit(1);
    }
    std::vector<unsigned char> buf;
    unsigned char tmp[1 << 16];
    size_t r;
    while ((r = std::fread(tmp, 1, sizeof tmp, fp)) > 0) buf.insert(buf.end(), tmp, tmp + r);
    std::fclose(fp);
    return buf;
}

static void write_file(const std::string& path, const void* p, size_t n) {
    FILE* fp = std::fopen(path.c_str(), "wb");
    if (!fp || std::fwrite(p, 1, n, fp) != n) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        std::exit(1);
    }
    std::fclose(fp);
}

static int do_rle(const std::string& outdir, int nops, char** ops) {
    const unsigned long long cap = 1ull << 22;
    uint2* d_rec;
    unsigned long long* d_count;
    unsigned* d_bad;
    CK(cudaMalloc(&d_rec, cap * sizeof(uint2)));
    CK(cudaMalloc(&d_count, sizeof(unsigned long long)));
    CK(cudaMalloc(&d_bad, sizeof(unsigned)));
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    for (int k = 0; k < nops; ++k) {
        const int op = find_op(ops[k]);
        const int bits = op_src_bits(op);
        if (bits == 64) {
            std::fprintf(stderr, "rle: op %s has a 64-bit source\n", ops[k]);
            return 1;
        }
        const uint64_t n = 1ull << bits;
        CK(cudaMemset(d_count, 0, sizeof(unsigned long long)));
        CK(cudaMemset(d_bad, 0, sizeof(unsigned)));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0));
        rle_kernel<<<nsm * 16, 256>>>(op, n, d_rec, d_count, cap, d_bad);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1));
        CK(cudaDeviceSynchronize());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        unsigned long long count = 0;
        unsigned bad = 0;
        CK(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
        if (count > cap || bad) {
            std::fprintf(stderr, "rle %s: overflow or bad op (count=%llu bad=%u)\n", ops[k], count,
                         bad);
            return 1;
        }
        std::vector<uint2> rec(count);
        CK(cudaMemcpy(rec.data(), d_rec, count * sizeof(uint2), cudaMemcpyDeviceToHost));
        std::sort(rec.begin(), rec.end(),
                  [](const uint2& a, const uint2& b) { return a.x < b.x; });
        write_file(outdir + "/" + kOpNames[op] + ".bin", rec.data(), rec.size() * sizeof(uint2));
        std::printf("rle %s: %llu runs, %.1f ms\n", kOpNames[op], count, ms);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }
    CK(cudaFree(d_rec));
    CK(cudaFree(d_count));
    CK(cudaFree(d_bad));
    return 0;
}

template <typename T>
static int do_eval(bool is64, const char* inpath, const char* outpath, int nops, char** ops) {
    const std::vector<unsigned char> raw = read_file(inpath);
    const size_t n = raw.size() / sizeof(T);
    T* d_in;
    uint8_t* d_out;
    unsigned* d_bad;
    CK(cudaMalloc(&d_in, std::max<size_t>(n, 1) * sizeof(T)));
    CK(cudaMalloc(&d_out, std::max<size_t>(n, 1)));
    CK(cudaMalloc(&d_bad, sizeof(unsigned)));
    CK(cudaMemcpy(d_in, raw.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    std::vector<uint8_t> out(n * (size_t)nops);
    for (int k = 0; k < nops; ++k) {
        const int op = find_op(ops[k]);
        if ((op_src_bits(op) == 64) != is64) {
            std::fprintf(stderr, "eval: op %s does not match the input width\n", ops[k]);
            return 1;
        }
        CK(cudaMemset(d_bad, 0, sizeof(unsigned)));
        const unsigned blocks = (unsigned)((n + 255) / 256);
        if (n) {
            if (is64)
                eval64_kernel<<<blocks, 256>>>(op, (const uint64_t*)d_in, d_out, n, d_bad);
            else
                eval32_kernel<<<blocks, 256>>>(op, (const uint32_t*)d_in, d_out, n, d_bad);
            CK(cudaGetLastError());
        }
        CK(cudaDeviceSynchronize());
        unsigned bad = 0;
        CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
        if (bad) {
            std::fprintf(stderr, "eval %s: bad op\n", ops[k]);
            return 1;
        }
        CK(cudaMemcpy(out.data() + (size_t)k * n, d_out, n, cudaMemcpyDeviceToHost));
    }
    write_file(outpath, out.data(), out.size());
    CK(cudaFree(d_in));
    CK(cudaFree(d_out));
    CK(cudaFree(d_bad));
    return 0;
}

static int do_decode(const char* outpath) {
    uint32_t* d_out;
    CK(cudaMalloc(&d_out, 512 * sizeof(uint32_t)));
    decode_kernel<<<1, 256>>>(d_out);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    uint32_t out[512];
    CK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    write_file(outpath, out, sizeof out);
    CK(cudaFree(d_out));
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 2 && std::strcmp(argv[1], "list") == 0) {
        for (int k = 0; k < NUM_OPS; ++k) std::printf("%d %s %d\n", k, kOpNames[k], op_src_bits(k));
        return 0;
    }
    if (argc >= 3 && std::strcmp(argv[1], "rle") == 0) return do_rle(argv[2], argc - 3, argv + 3);
    if (argc >= 4 && std::strcmp(argv[1], "eval32") == 0)
        return do_eval<uint32_t>(false, argv[2], argv[3], argc - 4, argv + 4);
    if (argc >= 4 && std::strcmp(argv[1], "eval64") == 0)
        return do_eval<uint64_t>(true, argv[2], argv[3], argc - 4, argv + 4);
    if (argc == 3 && std::strcmp(argv[1], "decode") == 0) return do_decode(argv[2]);
    std::fprintf(stderr,
                 "usage: %s list | rle <outdir> <op>... | eval32 <in> <out> <op>... |"
                 " eval64 <in> <out> <op>... | decode <out>\n",
                 argv[0]);
    return 1;
}
