// fp8ref reference — internal helpers shared by the reference sources: f32 bit casts and the embedded
// zlib-compressed device tables (inflated once, on first use).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp8ref::ref::detail {

// `entries` int8 values inflated from an embedded zlib stream into *table, once (thread-safe). A stream that does
// not inflate to exactly `entries` bytes is a build defect: std::runtime_error naming `what`.
inline const std::vector<int8_t>& inflate_once(std::once_flag& once, std::vector<int8_t>& table, const unsigned char* z,
                                               size_t z_size, size_t entries, const char* what) {
  std::call_once(once, [&] {
    std::vector<int8_t> t(entries);
    uLongf len = static_cast<uLongf>(entries);
    const int rc = uncompress(reinterpret_cast<Bytef*>(t.data()), &len, z, static_cast<uLong>(z_size));
    if (rc != Z_OK || len != entries) throw std::runtime_error(std::string("fp8ref: the embedded ") + what + " is corrupt");
    table.swap(t);
  });
  return table;
}

}  // namespace fp8ref::ref::detail
