// Helpers shared by fp8ref's CUDA capture harnesses (tools/device/*.cu): CK (a CUDA runtime call, or exit 2 naming
// it), whole binary files read into vectors, and host vectors copied to the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#define CK(x)                                                                                             \
  do {                                                                                                    \
    cudaError_t e_ = (x);                                                                                 \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "CUDA error %s at %s:%d (%s): %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                   #x, cudaGetErrorString(e_));                                                           \
      std::exit(2);                                                                                       \
    }                                                                                                     \
  } while (0)

// The whole file as elements of T (its size rounded down to whole elements); exit 1 if it cannot be read.
template <typename T>
std::vector<T> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  const size_t n = static_cast<size_t>(f.tellg());
  std::vector<T> v(n / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
  return v;
}

// A device copy of v (16 bytes of slack past its end).
template <typename T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  CK(cudaMalloc(&p, v.size() * sizeof(T) + 16));
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
