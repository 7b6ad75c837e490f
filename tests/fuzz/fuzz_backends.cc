// libFuzzer target: the cpu backend against the reference on the case an input names (tests/support/backend_diff.h):
// every output bit for bit, and the same inputs refused. A difference aborts with what differs.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "support/backend_diff.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fp8ref::fuzz::run_one([&] {
    const std::string d = fp8ref::test::diff_backends(data, size);
    if (!d.empty()) fp8ref::fuzz::fail("cpu != reference", d.c_str());
  });
}
