// fp8ref fuzz targets — shared checks. A failed check is a bug: it prints what went wrong and aborts, so that
// libFuzzer records the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "fp8ref/io.h"

namespace fp8ref::fuzz {

[[noreturn]] inline void fail(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fp8ref fuzz: BUG: %s%s%s\n", what, *detail ? ": " : "", detail);
  std::fflush(stderr);
  std::abort();
}

#define FP8REF_FUZZ_CHECK(cond) \
  do {                          \
    if (!(cond)) ::fp8ref::fuzz::fail("check failed", #cond); \
  } while (0)

// Invariants of any tensor a reader returns: nbytes == numel * dtype size, no negative dimension.
inline void check_tensor(const io::Tensor& t) {
  for (int64_t d : t.shape) FP8REF_FUZZ_CHECK(d >= 0);
  FP8REF_FUZZ_CHECK(t.data.size() == static_cast<uint64_t>(t.numel()) * io::dtype_size(t.dtype));
}

inline bool same(const io::Tensor& a, const io::Tensor& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

}  // namespace fp8ref::fuzz

// Runs `body`; fp8ref::InputError (bad input) is the expected outcome and ends the run quietly. Any other exception
// escaping is a bug.
#define FP8REF_FUZZ_BODY(body)                                                  \
  try {                                                                         \
    body                                                                        \
  } catch (const ::fp8ref::InputError&) {                                       \
  } catch (const std::exception& e) {                                           \
    ::fp8ref::fuzz::fail("an exception other than fp8ref::InputError", e.what()); \
  } catch (...) {                                                               \
    ::fp8ref::fuzz::fail("a non-std exception");                                \
  }
