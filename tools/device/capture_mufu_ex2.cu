// PTX ex2.approx.ftz.f32 (MUFU.EX2 on sm_90) over x in [-1, 0]: the table on the 2^-23 grid, and the facts that would
// let that table give every x <= 0: which rounding of x to the grid reproduces ex2 of every f32 in [-1, 0), and
// whether every f32 y in [-150, -1] gives 2^-n·T(f) for y = -(n + f), n an integer, f in [0, 1) (ftz). For capture_mufu_ex2.py.
// Usage: capture_mufu_ex2 OUT.bin  (writes the 2^23 + 1 table values, f32, k = 0 .. 2^23 for x = -k·2^-23; prints the
// counts); capture_mufu_ex2 --apply IN.bin OUT.bin (ex2 of each f32 of IN)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "capture_util.cuh"

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr uint32_t kN = (1u << 23) + 1;

__global__ void table(float* t) {
  const uint32_t k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < kN) t[k] = ex2(-static_cast<float>(k) * 0x1p-23f);
}

// every f32 x in [-1, 0) (bits 0x80000001 .. 0xBF800000): ex2(x) against the table at three roundings of -x·2^23 to
// an integer k: nearest-even, toward zero, away from zero; counts[0..2] the misses; and the first misses of nearest
__global__ void roundings(const float* t, unsigned long long* counts, uint32_t* first) {
  for (uint64_t b = 0x80000001ull + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; b <= 0xBF800000ull;
       b += uint64_t(gridDim.x) * blockDim.x) {
    const float x = __uint_as_float(static_cast<uint32_t>(b));
    const float y = ex2(x);
    const double s = -static_cast<double>(x) * 8388608.0;  // exact
    const uint32_t kn = static_cast<uint32_t>(rint(s)), kz = static_cast<uint32_t>(floor(s)),
                   ka = static_cast<uint32_t>(ceil(s));
    if (t[kn] != y) {
      const unsigned long long i = atomicAdd(&counts[0], 1ull);
      if (i < 8) first[i] = static_cast<uint32_t>(b);
    }
    if (t[kz] != y) atomicAdd(&counts[1], 1ull);
    if (t[ka] != y) atomicAdd(&counts[2], 1ull);
  }
}

// every f32 y in [-150, -1] (bits 0xBF800000 .. 0xC3160000): with n = floor(-y) and f = -y - n in [0, 1) (exact),
// ex2(y) against 2^-n·T[trunc(f·2^23)], flushed to 0 below 2^-126: counts[3] the misses, first[8..] the first ones
__global__ void scaling(const float* t, unsigned long long* counts, uint32_t* first) {
  for (uint64_t b = 0xBF800000ull + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; b <= 0xC3160000ull;
       b += uint64_t(gridDim.x) * blockDim.x) {
    const float y = __uint_as_float(static_cast<uint32_t>(b));
    const double m = -static_cast<double>(y), n = floor(m), f = m - n;
    float w = ldexpf(t[static_cast<uint32_t>(floor(f * 8388608.0))], -static_cast<int>(n));
    if (w < 0x1p-126f) w = 0.0f;
    if (ex2(y) != w) {
      const unsigned long long i = atomicAdd(&counts[3], 1ull);
      if (i < 8) first[8 + i] = static_cast<uint32_t>(b);
    }
  }
}

__device__ __forceinline__ float lg2(float x) {
  float y;
  asm volatile("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// lg2.approx.ftz over [1, 2): L[m] = lg2(1 + m·2^-23)
__global__ void lg2_table(float* t) {
  const uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m < (1u << 23)) t[m] = lg2(__uint_as_float(0x3F800000u | m));
}

// every f32 x in [2^-20, 2^40) (e = its exponent, m its mantissa): lg2(x) against RN32(e + L[m]): counts[0] the misses
__global__ void lg2_scaling(const float* t, unsigned long long* counts, uint32_t* first) {
  for (uint64_t b = 0x35800000ull + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; b < 0x53800000ull;
       b += uint64_t(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(b >> 23) - 127;
    const float w = static_cast<float>(e) + t[b & 0x7FFFFFu];
    if (lg2(__uint_as_float(static_cast<uint32_t>(b))) != w) {
      const unsigned long long i = atomicAdd(&counts[0], 1ull);
      if (i < 8) first[i] = static_cast<uint32_t>(b);
    }
  }
}

// the positive side: P[k] = ex2(k·2^-23), k = 0 .. 2^23
__global__ void pos_table(float* t) {
  const uint32_t k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < kN) t[k] = ex2(static_cast<float>(k) * 0x1p-23f);
}

// every f32 y in (0, 128) (bits 0x00000001 .. 0x42FFFFFF): with n = floor(y), f = y - n, ex2(y) against
// 2^n·P[trunc(f·2^23)]: counts[0] the misses
__global__ void pos_scaling(const float* t, unsigned long long* counts, uint32_t* first) {
  for (uint64_t b = 1ull + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; b < 0x43000000ull;
       b += uint64_t(gridDim.x) * blockDim.x) {
    const float y = __uint_as_float(static_cast<uint32_t>(b));
    const double m = static_cast<double>(y), n = floor(m), f = m - n;
    const float w = ldexpf(t[static_cast<uint32_t>(floor(f * 8388608.0))], static_cast<int>(n));
    if (ex2(y) != w) {
      const unsigned long long i = atomicAdd(&counts[0], 1ull);
      if (i < 8) first[i] = static_cast<uint32_t>(b);
    }
  }
}

// ex2 of n given inputs (the test pairs)
__global__ void apply(const float* x, float* y, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = ex2(x[i]);
}

// One table of n entries (fill<<<>>>) and one check over it (check<<<>>>: counts[0] misses, first[0..7] the first
// ones), printed after `what`; the table written to `out`.
int table_and_check(uint32_t n, void (*fill)(float*), void (*check)(const float*, unsigned long long*, uint32_t*),
                    const char* what, const char* out) {
  float* t = nullptr;
  unsigned long long* counts = nullptr;
  uint32_t* first = nullptr;
  CK(cudaMalloc(&t, n * sizeof(float)));
  CK(cudaMalloc(&counts, sizeof(unsigned long long)));
  CK(cudaMalloc(&first, 8 * sizeof(uint32_t)));
  CK(cudaMemset(counts, 0, sizeof(unsigned long long)));
  CK(cudaMemset(first, 0, 8 * sizeof(uint32_t)));
  fill<<<(n + 255) / 256, 256>>>(t);
  check<<<4096, 256>>>(t, counts, first);
  CK(cudaDeviceSynchronize());
  std::vector<float> h(n);
  unsigned long long c = 0;
  uint32_t f[8];
  CK(cudaMemcpy(h.data(), t, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&c, counts, sizeof c, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(f, first, sizeof f, cudaMemcpyDeviceToHost));
  std::printf("%s: %llu; first:", what, c);
  for (int i = 0; i < 8; ++i) std::printf(" %08x", f[i]);
  std::printf("\n");
  FILE* o = std::fopen(out, "wb");
  if (!o || std::fwrite(h.data(), 4, n, o) != n) return 1;
  std::fclose(o);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4) {  // capture_mufu_ex2 --apply IN.bin OUT.bin: f32 inputs -> their ex2
    FILE* in = std::fopen(argv[2], "rb");
    if (!in) return 1;
    std::vector<float> hx;
    float v;
    while (std::fread(&v, 4, 1, in) == 1) hx.push_back(v);
    std::fclose(in);
    const uint32_t n = static_cast<uint32_t>(hx.size());
    float *dx = nullptr, *dy = nullptr;
    CK(cudaMalloc(&dx, n * 4 + 4));
    CK(cudaMalloc(&dy, n * 4 + 4));
    CK(cudaMemcpy(dx, hx.data(), n * 4, cudaMemcpyHostToDevice));
    apply<<<(n + 255) / 256, 256>>>(dx, dy, n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hx.data(), dy, n * 4, cudaMemcpyDeviceToHost));
    FILE* o = std::fopen(argv[3], "wb");
    if (!o || std::fwrite(hx.data(), 4, n, o) != n) return 1;
    std::fclose(o);
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--pos")  // capture_mufu_ex2 --pos OUT.bin: P and its scaling check
    return table_and_check(kN, pos_table, pos_scaling, "positive misses of 2^n·P[trunc(f·2^23)] over (0, 128)", argv[2]);
  if (argc == 3 && std::string(argv[1]) == "--lg2")  // capture_mufu_ex2 --lg2 OUT.bin: L and the scaling check
    return table_and_check(1u << 23, lg2_table, lg2_scaling, "lg2 misses of RN32(e + L[m]) over [2^-20, 2^40)", argv[2]);
  if (argc != 2) return 2;
  float* t = nullptr;
  unsigned long long* counts = nullptr;
  uint32_t* first = nullptr;
  CK(cudaMalloc(&t, kN * sizeof(float)));
  CK(cudaMalloc(&counts, 4 * sizeof(unsigned long long)));
  CK(cudaMalloc(&first, 16 * sizeof(uint32_t)));
  CK(cudaMemset(counts, 0, 4 * sizeof(unsigned long long)));
  CK(cudaMemset(first, 0, 16 * sizeof(uint32_t)));
  table<<<(kN + 255) / 256, 256>>>(t);
  roundings<<<4096, 256>>>(t, counts, first);
  scaling<<<4096, 256>>>(t, counts, first);
  CK(cudaDeviceSynchronize());
  std::vector<float> h(kN);
  unsigned long long c[4];
  uint32_t f[16];
  CK(cudaMemcpy(h.data(), t, kN * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(c, counts, sizeof c, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(f, first, sizeof f, cudaMemcpyDeviceToHost));
  std::printf("misses over [-1, 0): nearest %llu, toward zero %llu, away %llu; scaling misses %llu\n", c[0], c[1], c[2],
              c[3]);
  std::printf("first nearest misses:");
  for (int i = 0; i < 8; ++i) std::printf(" %08x", f[i]);
  std::printf("\nfirst scaling misses:");
  for (int i = 8; i < 16; ++i) std::printf(" %08x", f[i]);
  std::printf("\n");
  FILE* o = std::fopen(argv[1], "wb");
  if (!o || std::fwrite(h.data(), sizeof(float), kN, o) != kN) return 1;
  std::fclose(o);
  return 0;
}
