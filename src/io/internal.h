// fp8ref io — private helpers shared by the .npy and safetensors code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace fp8ref::io::detail
