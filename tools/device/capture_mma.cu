// capture_mma.cu -- runs FP8 mma.sync.aligned.m16n8k32.row.col.f32.<fa>.<fb>.f32 on the device, tile by tile.
//
// Built and driven by tools/device/capture_mma.py (see tools/device/README.md):
//   nvcc -O2 -std=c++17 -arch=sm_90 -o capture_mma capture_mma.cu
//
//   capture_mma <fa> <fb> <T> <A.bin> <BT.bin> <C.bin> <D.bin>
//     fa, fb: e4m3 | e5m2.  All files little-endian, no header:
//     A  [T][16][32] uint8 codes (row-major: A[t][m][k]),  BT [T][8][32] uint8 codes (BT[t][n][k] = B[k][n]),
//     C  [T][16][8]  uint32 f32 bit patterns,            D  [T][16][8] uint32 f32 bit patterns (written).
//
// One warp computes one tile per step with a single inline-PTX mma.sync, fragments laid out as the PTX ISA
// specifies for m16n8k32 with 8-bit operands (groupID g = lane>>2, t = lane&3):
//   A: a0..a3 = A[g][4t..4t+3], a4..a7 = A[g+8][4t..4t+3], a8..a11 = A[g][16+4t..], a12..a15 = A[g+8][16+4t..]
//   B: b0..b3 = B[4t..4t+3][g], b4..b7 = B[16+4t..19+4t][g]       (element 0 in the lowest byte of a register)
//   C/D: c0,c1 = [g][2t], [g][2t+1]; c2,c3 = [g+8][2t], [g+8][2t+1]
// C and D travel as raw bits (NaN payloads, -0 and f32 subnormals untouched); nothing is built with fast math.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "capture_util.cuh"

#define MMA_KERNEL(NAME, FA, FB)                                                                          \
  __global__ void NAME(const uint8_t* __restrict__ A, const uint8_t* __restrict__ BT,                     \
                       const uint32_t* __restrict__ C, uint32_t* __restrict__ D, int T) {                 \
    const int lane = threadIdx.x & 31;                                                                    \
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;                                        \
    const int nwarps = (gridDim.x * blockDim.x) >> 5;                                                     \
    const int g = lane >> 2, t = lane & 3;                                                                \
    for (int tile = warp; tile < T; tile += nwarps) {                                                     \
      const uint8_t* a = A + static_cast<size_t>(tile) * 512;                                             \
      const uint8_t* b = BT + static_cast<size_t>(tile) * 256;                                            \
      const uint32_t* c = C + static_cast<size_t>(tile) * 128;                                            \
      uint32_t* d = D + static_cast<size_t>(tile) * 128;                                                  \
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(a + g * 32 + 4 * t);                         \
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(a + (g + 8) * 32 + 4 * t);                   \
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(a + g * 32 + 16 + 4 * t);                    \
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(a + (g + 8) * 32 + 16 + 4 * t);              \
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(b + g * 32 + 4 * t);                         \
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(b + g * 32 + 16 + 4 * t);                    \
      float c0 = __uint_as_float(c[g * 8 + 2 * t]), c1 = __uint_as_float(c[g * 8 + 2 * t + 1]);           \
      float c2 = __uint_as_float(c[(g + 8) * 8 + 2 * t]), c3 = __uint_as_float(c[(g + 8) * 8 + 2 * t + 1]); \
      float d0, d1, d2, d3;                                                                               \
      asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." FA "." FB ".f32 "                           \
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"                          \
                   : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                                               \
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2),      \
                     "f"(c3));                                                                            \
      d[g * 8 + 2 * t] = __float_as_uint(d0);                                                             \
      d[g * 8 + 2 * t + 1] = __float_as_uint(d1);                                                         \
      d[(g + 8) * 8 + 2 * t] = __float_as_uint(d2);                                                       \
      d[(g + 8) * 8 + 2 * t + 1] = __float_as_uint(d3);                                                   \
    }                                                                                                     \
  }

MMA_KERNEL(mma_e4m3_e4m3, "e4m3", "e4m3")
MMA_KERNEL(mma_e4m3_e5m2, "e4m3", "e5m2")
MMA_KERNEL(mma_e5m2_e4m3, "e5m2", "e4m3")
MMA_KERNEL(mma_e5m2_e5m2, "e5m2", "e5m2")

static std::vector<uint8_t> read_file(const char* path, size_t want) {
  std::vector<uint8_t> v(want);
  FILE* f = std::fopen(path, "rb");
  if (!f || std::fread(v.data(), 1, want, f) != want) {
    std::fprintf(stderr, "cannot read %zu bytes from %s\n", want, path);
    std::exit(2);
  }
  std::fclose(f);
  return v;
}

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: capture_mma fa fb T A.bin BT.bin C.bin D.bin\n");
    return 2;
  }
  const std::string fa = argv[1], fb = argv[2];
  const int T = std::atoi(argv[3]);
  auto* kernel = fa == "e4m3" ? (fb == "e4m3" ? mma_e4m3_e4m3 : mma_e4m3_e5m2)
                              : (fb == "e4m3" ? mma_e5m2_e4m3 : mma_e5m2_e5m2);
  if ((fa != "e4m3" && fa != "e5m2") || (fb != "e4m3" && fb != "e5m2") || T <= 0) {
    std::fprintf(stderr, "bad formats or T\n");
    return 2;
  }
  const std::vector<uint8_t> a = read_file(argv[4], size_t(T) * 512), b = read_file(argv[5], size_t(T) * 256),
                             c = read_file(argv[6], size_t(T) * 512);
  uint8_t *da, *db;
  uint32_t *dc, *dd;
  CK(cudaMalloc(&da, a.size()));
  CK(cudaMalloc(&db, b.size()));
  CK(cudaMalloc(&dc, c.size()));
  CK(cudaMalloc(&dd, c.size()));
  CK(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dc, c.data(), c.size(), cudaMemcpyHostToDevice));
  CK(cudaMemset(dd, 0xA5, c.size()));  // poison: every output must be written
  kernel<<<(T + 7) / 8, 256>>>(da, db, dc, dd, T);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> d(c.size());
  CK(cudaMemcpy(d.data(), dd, d.size(), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(argv[7], "wb");
  if (!f || std::fwrite(d.data(), 1, d.size(), f) != d.size()) {
    std::fprintf(stderr, "cannot write %s\n", argv[7]);
    return 2;
  }
  std::fclose(f);
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
  CK(cudaFree(dd));
  return 0;
}
