// fp8ref io — private helpers shared by the .npy and safetensors code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fp8ref::io::detail {

// A read-only memory map of a whole file (an empty file maps to {nullptr, 0}).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws InputError "<path>: cannot open: ..."
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// a*b with overflow detection; false on overflow.
inline bool mul_overflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// The byte size of a tensor of `shape` (dimensions already checked non-negative) with `esize`-byte elements, checked
// as numpy checks it: the product of the non-zero dimensions times esize must fit in int64_t, so that numel() and
// any product of dimensions stay in range even when a zero dimension makes the tensor empty. False if too large.
inline bool shape_nbytes(const std::vector<int64_t>& shape, uint64_t esize, uint64_t* out) {
  uint64_t n = esize;
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (mul_overflow(n, static_cast<uint64_t>(d), &n) || n > static_cast<uint64_t>(INT64_MAX)) return false;
  }
  *out = empty ? 0 : n;
  return true;
}

}  // namespace fp8ref::io::detail
