// libFuzzer target: the case-descriptor parser (golden::parse_descriptor) on arbitrary text.
// A line it accepts must round-trip: parse(to_string(d)) == d, and to_string is canonical (a fixed point).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "fuzz_check.h"

using namespace fp8ref;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  return fuzz::run_one([&] {
    const golden::Descriptor d = golden::parse_descriptor(line);
    const std::string s = golden::to_string(d);
    golden::Descriptor again;
    try {
      again = golden::parse_descriptor(s);
    } catch (const InputError& e) {
      fuzz::fail("parse_descriptor rejects to_string of what it accepted", e.what());
    }
    if (!(again == d)) fuzz::fail("parse(to_string(d)) != d", s.c_str());
    if (golden::to_string(again) != s) fuzz::fail("to_string is not canonical", s.c_str());
    (void)golden::repro_command(d);
    // The shape is the value most readers of a descriptor parse next; it throws InputError when malformed.
    if (d.has("shape")) {
      const auto shape = golden::parse_shape(d.get("shape"));
      for (int64_t x : shape) FP8REF_FUZZ_CHECK(x >= 0);
    }
  });
}
