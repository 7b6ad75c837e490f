// fp8ref fuzz targets — shared checks. A failed check is a bug: it prints what went wrong and aborts, so that
// libFuzzer records the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "fp8ref/error.h"
#include "fp8ref/io.h"

namespace fp8ref::fuzz {

[[noreturn]] inline void fail(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fp8ref fuzz: BUG: %s%s%s\n", what, *detail ? ": " : "", detail);
  std::fflush(stderr);
  std::abort();
}

#define FP8REF_FUZZ_CHECK(cond)                                \
  do {                                                         \
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

// Runs `body` on one input. fp8ref::InputError (bad input) is the expected outcome and ends the run quietly; any
// other exception escaping is a bug. Returns 0, for LLVMFuzzerTestOneInput.
template <typename F>
int run_one(F&& body) {
  try {
    body();
  } catch (const InputError&) {
  } catch (const std::exception& e) {
    fail("an exception other than fp8ref::InputError escaped", e.what());
  } catch (...) {
    fail("a non-std exception escaped");
  }
  return 0;
}

}  // namespace fp8ref::fuzz

