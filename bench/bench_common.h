// Helpers shared by the benchmarks (header-only; bench/ is not part of the library).
#pragma once

#include <cstddef>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fp8ref::bench {

// Copies `bytes` with non-temporal (streaming) stores where the target has them (x86: 16-byte movntdq, then an
// sfence), else memcpy. The anchor for "the machine's streaming bandwidth": for a few tens of MB per thread glibc's
// memcpy stores through the cache (a read for ownership of every destination line), so it moves a third more than
// it counts; this copy does not.
inline void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  size_t head = (16 - reinterpret_cast<size_t>(d) % 16) % 16;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  _mm_sfence();
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace fp8ref::bench
