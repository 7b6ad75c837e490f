// libFuzzer target: the .npy reader (io::decode_npy) on arbitrary bytes.
// A file it accepts must also survive encode -> decode unchanged (after its own normalization: C order, little-endian).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "fuzz_check.h"

using namespace fp8ref;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz::run_one([&] {
    const io::Tensor t = io::decode_npy(data, size, "fuzz.npy");
    fuzz::check_tensor(t);
    std::vector<uint8_t> bytes;
    try {
      bytes = io::encode_npy(t);
    } catch (const InputError& e) {
      fuzz::fail("encode_npy rejects what decode_npy accepted", e.what());
    }
    io::Tensor again;
    try {
      again = io::decode_npy(bytes.data(), bytes.size(), "re-encoded.npy");
    } catch (const InputError& e) {
      fuzz::fail("decode_npy rejects what encode_npy wrote", e.what());
    }
    FP8REF_FUZZ_CHECK(fuzz::same(t, again));
  });
}
