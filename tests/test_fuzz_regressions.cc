// Regression tests for bugs the libFuzzer targets (tests/fuzz) found. Each input is also in the seed corpus
// (tests/fuzz/corpus/<target>/regress-*), so the fuzzers start from it too.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fp8ref/error.h"
#include "fp8ref/io.h"

using namespace fp8ref;
using namespace fp8ref::io;

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::vector<uint8_t> npy_v1(std::string header) {
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  return bytes_of(out + header);
}

std::vector<uint8_t> safetensors_of(const std::string& json) {
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(uint64_t(json.size()) >> (8 * i)));
  out.insert(out.end(), json.begin(), json.end());
  return out;
}

template <typename F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// fuzz_npy (UBSan: signed integer overflow in Tensor::numel): a shape with a zero dimension made the byte count 0,
// so the readers accepted it although the product of the other dimensions overflows int64. The readers now check
// the shape as numpy does: the product of the non-zero dimensions times the element size must fit in int64.
TEST_CASE("fuzz regression: empty tensors whose other dimensions overflow int64 are rejected") {
  const auto npy = npy_v1(
      "{'descr': '|b1', 'fortran_order': False, 'shape': (000001,400,40832831, 0000000640832831, 00000,04000,"
      "4083283), }");
  std::string msg = input_error_of([&] { decode_npy(npy.data(), npy.size(), "crash.npy"); });
  CHECK(msg.find("crash.npy") != std::string::npos);
  CHECK(msg.find("too large") != std::string::npos);
  // Also with fortran_order and with the zero first.
  for (const char* h : {"{'descr': '<f4', 'fortran_order': True, 'shape': (1099511627776, 8388608, 0), }",
                        "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }"}) {
    CAPTURE(h);
    const auto b = npy_v1(h);
    CHECK(input_error_of([&] { decode_npy(b.data(), b.size(), "x.npy"); }).find("too large") != std::string::npos);
  }

  const auto st = safetensors_of(R"({"a":{"dtype":"U8","shape":[1099511627776,8388608,0],"data_offsets":[0,0]}})");
  msg = input_error_of([&] { decode_safetensors(st.data(), st.size(), "crash.safetensors"); });
  CHECK(msg.find("tensor 'a'") != std::string::npos);
  CHECK(msg.find("too large") != std::string::npos);
}

TEST_CASE("fuzz regression: empty tensors with large but representable dimensions are still read") {
  const auto npy = npy_v1("{'descr': '<f8', 'fortran_order': True, 'shape': (3, 0, 1099511627776), }");
  const Tensor t = decode_npy(npy.data(), npy.size(), "empty.npy");
  CHECK(t.shape == std::vector<int64_t>{3, 0, 1099511627776});
  CHECK(t.numel() == 0);
  CHECK(t.data.empty());

  const auto st = safetensors_of(
      R"({"a":{"dtype":"F32","shape":[0,1099511627776],"data_offsets":[0,0]},)"
      R"("b":{"dtype":"U8","shape":[2,0],"data_offsets":[0,0]}})");
  const SafetensorsFile f = decode_safetensors(st.data(), st.size(), "empty.safetensors");
  REQUIRE(f.tensors.size() == 2);
  for (const Tensor& x : f.tensors) {
    CHECK(x.numel() == 0);
    CHECK(x.data.empty());
  }
}
