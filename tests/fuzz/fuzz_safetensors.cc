// libFuzzer target: the safetensors reader (io::decode_safetensors) on arbitrary bytes.
// A file it accepts must also survive encode -> decode unchanged (tensors in file order, metadata).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "fuzz_check.h"

using namespace fp8ref;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz::run_one([&] {
    const io::SafetensorsFile f = io::decode_safetensors(data, size, "fuzz.safetensors");
    for (const io::Tensor& t : f.tensors) {
      fuzz::check_tensor(t);
      FP8REF_FUZZ_CHECK(f.find(t.name) == &t);  // names are unique
    }
    std::vector<uint8_t> bytes;
    try {
      bytes = io::encode_safetensors(f.tensors, f.metadata);
    } catch (const InputError& e) {
      fuzz::fail("encode_safetensors rejects what decode_safetensors accepted", e.what());
    }
    io::SafetensorsFile again;
    try {
      again = io::decode_safetensors(bytes.data(), bytes.size(), "re-encoded.safetensors");
    } catch (const InputError& e) {
      fuzz::fail("decode_safetensors rejects what encode_safetensors wrote", e.what());
    }
    FP8REF_FUZZ_CHECK(again.metadata == f.metadata);
    FP8REF_FUZZ_CHECK(again.tensors.size() == f.tensors.size());
    for (size_t i = 0; i < f.tensors.size(); ++i) FP8REF_FUZZ_CHECK(fuzz::same(f.tensors[i], again.tensors[i]));
  });
}
