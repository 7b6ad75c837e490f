// Tests for src/io: .npy and safetensors readers/writers, atomic writes, SHA-256.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fp8ref/error.h"
#include "fp8ref/io.h"

namespace fs = std::filesystem;
using namespace fp8ref;
using namespace fp8ref::io;

namespace {

// A fresh directory, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("fp8ref_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path)) v.push_back(e.path().filename().string());
    return v;
  }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A tensor filled with a byte pattern that differs per dtype and position.
Tensor pattern(const std::string& name, DType d, std::vector<int64_t> shape) {
  Tensor t = make_tensor(name, d, std::move(shape));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(i * 37 + static_cast<int>(d) * 11 + 1);
  if (d == DType::BOOL)
    for (auto& b : t.data) b &= 1;
  return t;
}

// .npy bytes with a hand-written header (version 1.0 unless major says otherwise).
std::vector<uint8_t> npy_bytes(const std::string& header, const std::vector<uint8_t>& data, int major = 1) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  size_t n = header.size();
  size_t lb = major == 1 ? 2 : 4;
  for (size_t i = 0; i < lb; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// safetensors bytes with a hand-written JSON header and a data buffer of `buffer` bytes.
std::vector<uint8_t> st_bytes(const std::string& json, size_t buffer, uint64_t claimed_len = UINT64_MAX) {
  uint64_t n = claimed_len == UINT64_MAX ? json.size() : claimed_len;
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + buffer, 0xAB);
  return out;
}

// Checks that `fn` throws InputError whose message contains every one of `needles`.
void expect_input_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  bool threw = false;
  try {
    fn();
  } catch (const InputError& e) {
    threw = true;
    std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(msg.find('\n') == std::string::npos);
    for (const auto& n : needles) {
      INFO("expected to contain: " << n);
      CHECK(msg.find(n) != std::string::npos);
    }
  }
  CHECK_MESSAGE(threw, "expected an InputError");
}

DType npy_dtype_of(DType d) {
  if (d == DType::BF16) return DType::U16;
  if (dtype_size(d) == 1 && dtype_format(d)) return DType::U8;  // FP8 codes come back as u1
  return d;
}

bool python_available(const std::string& modules) {
  std::string cmd = "python3 -c \"import " + modules + "\" >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

}  // namespace

TEST_SUITE("io") {

TEST_CASE("sha256: FIPS 180-2 test vectors") {
  auto h = [](const std::string& s) { return sha256_hex(reinterpret_cast<const uint8_t*>(s.data()), s.size()); };
  CHECK(h("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(h("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(h("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(h("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(h(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK(sha256_hex(std::vector<uint8_t>{'a', 'b', 'c'}) == h("abc"));
}

TEST_CASE("dtype table: tags, sizes, formats") {
  auto all = all_dtypes();
  CHECK(all.size() == 18);
  for (DType d : all) {
    auto p = parse_dtype(dtype_name(d));
    REQUIRE(p.has_value());
    CHECK(*p == d);
    if (auto f = dtype_format(d)) {
      CHECK(format_dtype(*f) == d);
      CHECK(std::string(format_info(*f).safetensors_tag) == dtype_name(d));
      CHECK(static_cast<size_t>(format_info(*f).bits) == 8 * dtype_size(d));
    }
  }
  for (const auto& fi : kFormats) CHECK(std::string(dtype_name(format_dtype(fi.format))) == fi.safetensors_tag);
  CHECK(dtype_size(DType::F8_E8M0) == 1);
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(dtype_size(DType::I64) == 8);
  CHECK(*dtype_format(DType::F8_E4M3) == Format::e4m3fn);
  CHECK(!dtype_format(DType::I32).has_value());
  CHECK(!parse_dtype("F8_E4M3FN").has_value());
  CHECK(!parse_dtype("f32").has_value());
  CHECK(make_tensor("s", DType::F32, {}).numel() == 1);
  CHECK(make_tensor("s", DType::F32, {}).nbytes() == 4);
  CHECK(make_tensor("z", DType::F64, {3, 0}).nbytes() == 0);
  CHECK_THROWS_AS(make_tensor("n", DType::F32, {-1}), InputError);
}

TEST_CASE("npy: round trip of every dtype and several shapes") {
  TempDir dir;
  std::vector<std::vector<int64_t>> shapes = {{}, {5}, {2, 3}, {2, 3, 4}, {0, 3}};
  for (DType d : all_dtypes()) {
    for (const auto& shape : shapes) {
      CAPTURE(dtype_name(d));
      CAPTURE(shape.size());
      Tensor t = pattern("x", d, shape);
      std::string path = dir / "t.npy";
      write_npy(path, t);
      auto raw = read_bytes(path);
      size_t data_start = raw.size() - t.nbytes();
      CHECK(data_start % 64 == 0);
      CHECK(raw[data_start - 1] == '\n');
      Tensor r = read_npy(path);
      CHECK(r.dtype == npy_dtype_of(d));
      CHECK(r.shape == t.shape);
      CHECK(r.data == t.data);
      CHECK(r.name.empty());
    }
  }
  CHECK(dir.entries() == std::vector<std::string>{"t.npy"});
}

TEST_CASE("npy: header text matches numpy's") {
  Tensor t = pattern("x", DType::F32, {2, 3});
  auto b = encode_npy(t);
  std::string header(b.begin() + 10, b.begin() + 10 + (b[8] | (b[9] << 8)));
  CHECK(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0) == 0);
  CHECK(b.size() == 128 + 24);
  Tensor v = pattern("v", DType::F8_E5M2, {7});
  auto bv = encode_npy(v);
  std::string hv(bv.begin() + 10, bv.begin() + 70);
  CHECK(hv.rfind("{'descr': '|u1', 'fortran_order': False, 'shape': (7,), }", 0) == 0);
  Tensor s = pattern("s", DType::F64, {});
  auto bs = encode_npy(s);
  CHECK(std::string(bs.begin() + 10, bs.begin() + 70).find("'shape': (), }") != std::string::npos);
}

TEST_CASE("npy: big-endian data is byte-swapped") {
  TempDir dir;
  {
    // >f4: 1.0, -2.5, 3.0
    std::vector<uint8_t> data = {0x3F, 0x80, 0, 0, 0xC0, 0x20, 0, 0, 0x40, 0x40, 0, 0};
    std::string path = dir / "be_f4.npy";
    write_bytes(path, npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }\n", data));
    Tensor r = read_npy(path);
    REQUIRE(r.dtype == DType::F32);
    float v[3];
    std::memcpy(v, r.data.data(), 12);
    CHECK(v[0] == 1.0f);
    CHECK(v[1] == -2.5f);
    CHECK(v[2] == 3.0f);
  }
  {
    std::vector<uint8_t> data = {0x01, 0x02, 0xFF, 0xFE};
    std::string path = dir / "be_i2.npy";
    write_bytes(path, npy_bytes("{'descr': '>i2', 'fortran_order': False, 'shape': (2,), }\n", data));
    Tensor r = read_npy(path);
    REQUIRE(r.dtype == DType::I16);
    int16_t v[2];
    std::memcpy(v, r.data.data(), 4);
    CHECK(v[0] == 0x0102);
    CHECK(v[1] == -2);
  }
  {
    std::vector<uint8_t> data = {0x40, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18};  // pi
    std::string path = dir / "be_f8.npy";
    write_bytes(path, npy_bytes("{'descr': '>f8', 'fortran_order': False, 'shape': (), }\n", data));
    Tensor r = read_npy(path);
    REQUIRE(r.dtype == DType::F64);
    double v;
    std::memcpy(&v, r.data.data(), 8);
    CHECK(v == 3.141592653589793);
    CHECK(r.shape.empty());
  }
  {
    std::vector<uint8_t> data = {0x12, 0x34};  // one-byte types: the order mark means nothing
    std::string path = dir / "be_u1.npy";
    write_bytes(path, npy_bytes("{'descr': '>u1', 'fortran_order': False, 'shape': (2,), }\n", data));
    CHECK(read_npy(path).data == data);
  }
}

TEST_CASE("npy: fortran order is transposed into C order") {
  TempDir dir;
  {
    // [[1,2,3],[4,5,6]] stored column-major: 1 4 2 5 3 6
    std::vector<uint8_t> data = {1, 4, 2, 5, 3, 6};
    std::string path = dir / "f2d.npy";
    write_bytes(path, npy_bytes("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }\n", data));
    Tensor r = read_npy(path);
    CHECK(r.shape == std::vector<int64_t>{2, 3});
    CHECK(r.data == std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
  }
  {
    // (2,3,4) int32, value(i,j,k) = 100i + 10j + k; Fortran offset = i + 2j + 6k; plus big-endian.
    std::vector<uint8_t> data(24 * 4);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) {
          uint32_t v = static_cast<uint32_t>(100 * i + 10 * j + k);
          size_t off = static_cast<size_t>(i + 2 * j + 6 * k) * 4;
          for (int b = 0; b < 4; ++b) data[off + b] = static_cast<uint8_t>(v >> (8 * (3 - b)));
        }
    std::string path = dir / "f3d.npy";
    write_bytes(path, npy_bytes("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 4), }\n", data));
    Tensor r = read_npy(path);
    REQUIRE(r.dtype == DType::I32);
    REQUIRE(r.data.size() == 96);
    bool all_ok = true;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) {
          int32_t v;
          std::memcpy(&v, r.data.data() + ((i * 3 + j) * 4 + k) * 4, 4);
          all_ok &= v == 100 * i + 10 * j + k;
        }
    CHECK(all_ok);
  }
  {
    std::string path = dir / "f1d.npy";
    write_bytes(path, npy_bytes("{'descr': '<u2', 'fortran_order': True, 'shape': (2,), }\n", {1, 0, 2, 0}));
    CHECK(read_npy(path).data == std::vector<uint8_t>{1, 0, 2, 0});
  }
}

TEST_CASE("npy: versions 2.0 and 3.0, header variants") {
  TempDir dir;
  std::vector<uint8_t> data = {1, 0, 0, 0, 2, 0, 0, 0};
  for (int major : {2, 3}) {
    std::string path = dir / "v.npy";
    write_bytes(path, npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n", data, major));
    Tensor r = read_npy(path);
    CHECK(r.dtype == DType::I32);
    CHECK(r.data == data);
  }
  // Key order, double quotes, no trailing comma, Python 2 long, '=' byte order, '|b1'.
  std::string path = dir / "h.npy";
  write_bytes(path, npy_bytes("{\"shape\": (2L, 1), \"fortran_order\": False, \"descr\": \"=u4\"}   \n", data));
  Tensor r = read_npy(path);
  CHECK(r.dtype == DType::U32);
  CHECK(r.shape == std::vector<int64_t>{2, 1});
  write_bytes(path, npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n", {1, 0, 1}));
  CHECK(read_npy(path).dtype == DType::BOOL);
}

TEST_CASE("npy: malformed files throw InputError naming the file") {
  TempDir dir;
  const std::string path = dir / "bad_file.npy";
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::vector<std::string>& needles) {
    write_bytes(path, bytes);
    std::vector<std::string> all = needles;
    all.push_back("bad_file.npy");
    expect_input_error([&] { read_npy(path); }, all);
  };
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (1024,), }\n";

  expect(bytes_of("PK\x03\x04 this is a zip"), {"not a .npy file (bad magic)"});
  expect({}, {"bad magic"});
  expect({0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0x10}, {"truncated header"});
  {
    auto b = npy_bytes(good, {});
    b.resize(30);
    expect(b, {"truncated header"});
  }
  expect(npy_bytes(good, std::vector<uint8_t>(100)), {"truncated: header says 4096 bytes of data, file has 100"});
  expect(npy_bytes(good, std::vector<uint8_t>(4100)), {"4 unexpected bytes after the data"});
  expect(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }\n", std::vector<uint8_t>(8)),
         {"unsupported dtype '<c8'"});
  expect(npy_bytes("{'descr': '<V2', 'fortran_order': False, 'shape': (1,), }\n", std::vector<uint8_t>(2)),
         {"unsupported dtype '<V2'", "ml_dtypes"});
  expect(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }\n", std::vector<uint8_t>(4)),
         {"unsupported dtype", "structured"});
  expect(npy_bytes("{'descr': '<f4', 'shape': (1,), }\n", std::vector<uint8_t>(4)), {"'fortran_order'"});
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}\n", std::vector<uint8_t>(4)),
         {"unexpected key 'extra'"});
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n", {}), {"non-negative"});
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,), }\n", std::vector<uint8_t>(4)),
         {"malformed .npy header"});
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,\n", std::vector<uint8_t>(4)),
         {"malformed .npy header"});
  expect(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }\n", {}),
         {"too large"});
  {
    auto b = npy_bytes(good, std::vector<uint8_t>(4096));
    b[6] = 4;
    expect(b, {"unsupported .npy version 4.0"});
  }
  expect_input_error([&] { read_npy(dir / "missing.npy"); }, {"missing.npy", "cannot open"});
}

TEST_CASE("safetensors: round trip of every dtype, in order, with metadata") {
  TempDir dir;
  std::vector<Tensor> ts;
  int i = 0;
  for (DType d : all_dtypes()) {
    std::vector<int64_t> shape = (i % 3 == 0) ? std::vector<int64_t>{3} : std::vector<int64_t>{2, i % 4 + 1};
    ts.push_back(pattern(std::string("z.") + dtype_name(d) + "." + std::to_string(i), d, shape));
    ++i;
  }
  ts.push_back(pattern("scalar", DType::F32, {}));
  ts.push_back(pattern("empty", DType::BF16, {0, 4}));
  std::map<std::string, std::string> meta = {{"fp8ref.version", "0.1.0"}, {"op", "quantize"}, {"unicode", "µ→∞"}};
  std::string path = dir / "all.safetensors";
  write_safetensors(path, ts, meta);
  CHECK(dir.entries() == std::vector<std::string>{"all.safetensors"});

  auto raw = read_bytes(path);
  uint64_t hlen = 0;
  for (int b = 7; b >= 0; --b) hlen = (hlen << 8) | raw[b];
  CHECK((8 + hlen) % 8 == 0);

  SafetensorsFile f = read_safetensors(path);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == ts.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    CAPTURE(ts[k].name);
    CHECK(f.tensors[k].name == ts[k].name);
    CHECK(f.tensors[k].dtype == ts[k].dtype);
    CHECK(f.tensors[k].shape == ts[k].shape);
    CHECK(f.tensors[k].data == ts[k].data);
  }
  REQUIRE(f.find("scalar") != nullptr);
  CHECK(f.find("scalar")->numel() == 1);
  CHECK(f.find("nope") == nullptr);

  // The memory-mapped reader: the same tensors, as views into the mapping (no copy).
  {
    const MappedSafetensors m(path);
    CHECK(m.metadata() == meta);
    REQUIRE(m.tensors().size() == ts.size());
    for (size_t k = 0; k < ts.size(); ++k) {
      CAPTURE(ts[k].name);
      const TensorView& v = m.tensors()[k];
      CHECK(v.name == ts[k].name);
      CHECK(v.dtype == ts[k].dtype);
      CHECK(v.shape == ts[k].shape);
      REQUIRE(v.nbytes() == ts[k].data.size());
      CHECK(std::equal(v.bytes, v.bytes + v.size, ts[k].data.begin()));
      CHECK((v.size == 0 || (v.bytes >= m.file_data() && v.bytes + v.size <= m.file_data() + m.file_size())));
    }
    CHECK(m.file_size() == raw.size());
    REQUIRE(m.find("scalar") != nullptr);
    CHECK(m.find("scalar")->numel() == 1);
    CHECK(m.find("nope") == nullptr);
    const TensorView tv = view_of(ts[0]);
    CHECK((tv.bytes == ts[0].data.data() && tv.size == ts[0].data.size() && tv.name == ts[0].name));
  }

  // No tensors, no metadata: still a valid file.
  write_safetensors(path, {});
  SafetensorsFile e = read_safetensors(path);
  CHECK(e.tensors.empty());
  CHECK(e.metadata.empty());
  CHECK(read_bytes(path).size() == 16);  // "{}" padded to 8
}

TEST_CASE("safetensors: writer rejects bad tensors, leaving nothing behind") {
  TempDir dir;
  std::string path = dir / "w.safetensors";
  Tensor a = pattern("a", DType::F32, {2});
  Tensor bad = a;
  bad.name = "bad";
  bad.data.pop_back();
  expect_input_error([&] { write_safetensors(path, {a, bad}); }, {"w.safetensors", "tensor 'bad'", "need 8"});
  expect_input_error([&] { write_safetensors(path, {a, a}); }, {"w.safetensors", "tensor 'a'", "twice"});
  Tensor meta = a;
  meta.name = "__metadata__";
  expect_input_error([&] { write_safetensors(path, {meta}); }, {"reserved"});
  Tensor nonutf8 = a;
  nonutf8.name = "\xff\xfe";
  expect_input_error([&] { write_safetensors(path, {nonutf8}); }, {"w.safetensors"});
  CHECK(dir.entries().empty());
}

TEST_CASE("safetensors: malformed files throw InputError naming the file and tensor") {
  TempDir dir;
  const std::string path = dir / "bad_file.safetensors";
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::vector<std::string>& needles) {
    write_bytes(path, bytes);
    std::vector<std::string> all = needles;
    all.push_back("bad_file.safetensors");
    expect_input_error([&] { read_safetensors(path); }, all);
    // the mapped reader validates with the same code: the same message
    std::string copied, mapped;
    try {
      read_safetensors(path);
    } catch (const InputError& e) {
      copied = e.what();
    }
    try {
      MappedSafetensors m(path);
    } catch (const InputError& e) {
      mapped = e.what();
    }
    CHECK(mapped == copied);
  };
  const std::string one = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // Sanity: the hand-written helper makes a valid file.
  write_bytes(path, st_bytes(one, 8));
  CHECK(read_safetensors(path).tensors.size() == 1);

  expect({1, 2, 3}, {"too small"});
  expect(st_bytes(one, 8, 1000000), {"header length 1000000 is past the end"});
  expect(st_bytes(one, 8, ~uint64_t(0) - 5), {"past the end"});
  expect(st_bytes("this is not json at all", 0), {"not a JSON object"});
  expect(st_bytes(R"({"a": {"dtype": "F32", )", 0), {"not valid JSON"});
  expect(st_bytes(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8), {"tensor 'a'", "unknown dtype 'F33'"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
         {"tensor 'a'", "hold 8 bytes, shape and dtype need 12"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), {"tensor 'a'", "past the end"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
         {"tensor 'b'", "overlap tensor 'a'"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
         {"tensor 'b'", "hole"});
  expect(st_bytes(one, 12), {"4 bytes at the end"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), {"tensor 'a'", "non-negative"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), {"tensor 'a'"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), {"tensor 'a'", "backwards"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), {"tensor 'a'", "data_offsets"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", 8), {"tensor 'a'", "needs"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8), {"tensor 'a'", "'x'"});
  expect(st_bytes(R"({"a":[1,2]})", 0), {"tensor 'a'", "not a JSON object"});
  expect(st_bytes(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'"});
  expect(st_bytes(R"([1,2,3])", 0), {"not a JSON object"});
  expect(st_bytes(R"({"a":{"dtype":"F32","shape":[99999999999,99999999999,99999],"data_offsets":[0,8]}})", 8),
         {"tensor 'a'", "too large"});
  expect_input_error([&] { read_safetensors(dir / "missing.safetensors"); }, {"missing.safetensors", "cannot open"});
  expect_input_error([&] { read_safetensors(dir.path.string()); }, {"not a regular file"});
  expect_input_error([&] { MappedSafetensors m(dir / "missing.safetensors"); }, {"missing.safetensors", "cannot open"});
  expect_input_error([&] { MappedSafetensors m(dir.path.string()); }, {"not a regular file"});
}

TEST_CASE("safetensors: header padding with spaces and null metadata are accepted") {
  TempDir dir;
  std::string path = dir / "p.safetensors";
  write_bytes(path, st_bytes(R"({"__metadata__":null,"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}      )", 3));
  SafetensorsFile f = read_safetensors(path);
  REQUIRE(f.tensors.size() == 1);
  CHECK(f.tensors[0].data == std::vector<uint8_t>{0xAB, 0xAB, 0xAB});
  CHECK(f.metadata.empty());
}

TEST_CASE("atomic writes: replace, and leave no temp file on failure") {
  TempDir dir;
  std::string path = dir / "a.bin";
  write_file_atomic(path, std::vector<uint8_t>{1, 2, 3});
  write_file_atomic(path, std::vector<uint8_t>{4, 5});
  CHECK(read_bytes(path) == std::vector<uint8_t>{4, 5});
  CHECK(dir.entries() == std::vector<std::string>{"a.bin"});

  // Into a directory that does not exist.
  expect_input_error([&] { write_file_atomic(dir / "no/such/dir/x.bin", std::vector<uint8_t>{1}); },
                     {"no/such/dir/x.bin"});
  expect_input_error([&] { write_npy(dir / "nodir/x.npy", pattern("x", DType::F32, {2})); }, {"nodir/x.npy"});
  expect_input_error([&] { write_safetensors(dir / "nodir/x.safetensors", {}); }, {"nodir/x.safetensors"});

  // The temp file is created, then the target turns out to be a directory: refused before the rename, and the
  // temp file must go.
  fs::create_directories(dir.path / "occupied" / "child");
  expect_input_error([&] { write_file_atomic(dir / "occupied", std::vector<uint8_t>(1000, 7)); },
                     {"occupied", "is a directory"});
  std::vector<std::string> names = dir.entries();
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"a.bin", "occupied"});

  // A relative path without a directory writes into the current directory.
  fs::path cwd = fs::current_path();
  fs::current_path(dir.path);
  write_file_atomic("rel.bin", std::vector<uint8_t>{9});
  fs::current_path(cwd);
  CHECK(read_bytes(dir / "rel.bin") == std::vector<uint8_t>{9});
  expect_input_error([&] { write_file_atomic(dir.path.string() + "/", std::vector<uint8_t>{1}); }, {"not a file name"});
}

TEST_CASE("OutputFiles: all files or none") {
  TempDir dir;
  write_file_atomic(dir / "a.bin", std::vector<uint8_t>{1});
  {  // staged, then abandoned (an error while computing a later output): nothing changes
    OutputFiles f;
    f.add(dir / "a.bin", std::vector<uint8_t>{2});
    f.add(dir / "b.bin", std::vector<uint8_t>{3});
    CHECK(read_bytes(dir / "a.bin") == std::vector<uint8_t>{1});
  }
  CHECK(dir.entries() == std::vector<std::string>{"a.bin"});
  {  // a later file's directory is missing: the earlier one is not written either
    OutputFiles f;
    f.add(dir / "a.bin", std::vector<uint8_t>{2});
    expect_input_error([&] { f.add(dir / "nodir/b.bin", std::vector<uint8_t>{3}); }, {"nodir/b.bin"});
    expect_input_error([&] { f.add(dir / "a.bin", std::vector<uint8_t>{4}); }, {"a.bin", "twice"});
  }
  CHECK(dir.entries() == std::vector<std::string>{"a.bin"});
  CHECK(read_bytes(dir / "a.bin") == std::vector<uint8_t>{1});
  fs::create_directories(dir.path / "d.bin");
  {  // a directory in a later file's place: refused before the first rename
    OutputFiles f;
    f.add(dir / "a.bin", std::vector<uint8_t>{2});
    f.add(dir / "d.bin", std::vector<uint8_t>{3});
    expect_input_error([&] { f.commit(); }, {"d.bin", "is a directory", "nothing was written"});
  }
  CHECK(read_bytes(dir / "a.bin") == std::vector<uint8_t>{1});
  {  // committed: every file in place, no temporary left
    OutputFiles f;
    f.add(dir / "a.bin", std::vector<uint8_t>{2});
    f.add_npy(dir / "c.npy", pattern("c", DType::F32, {2}));
    f.commit();
  }
  std::vector<std::string> names = dir.entries();
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"a.bin", "c.npy", "d.bin"});
  CHECK(read_bytes(dir / "a.bin") == std::vector<uint8_t>{2});
  CHECK(read_npy(dir / "c.npy").data == pattern("c", DType::F32, {2}).data);
}

// Interop with numpy / safetensors / ml_dtypes: python writes files, C++ reads them; C++ writes
// files, python checks them. Skipped (with a message) when python3 or a module is missing.
TEST_CASE("interop with numpy, safetensors and ml_dtypes (python3)") {
  if (!python_available("numpy, ml_dtypes, safetensors.numpy")) {
    MESSAGE("skipped: python3 with numpy, ml_dtypes and safetensors not found");
    return;
  }
  TempDir dir;
  const std::string script = dir / "gen.py";
  {
    std::ofstream py(script);
    py << R"PY(
import sys, os, hashlib, numpy as np, ml_dtypes
from safetensors.numpy import save_file
d = sys.argv[1]
mode = sys.argv[2]
rng = np.random.default_rng(7)
def arrays():
    out = {}
    out["f32"] = rng.standard_normal((3, 5)).astype(np.float32)
    out["f64"] = rng.standard_normal((4,)).astype(np.float64)
    out["f16"] = rng.standard_normal((2, 2, 3)).astype(np.float16)
    out["i32"] = rng.integers(-1000, 1000, (7,)).astype(np.int32)
    out["u16"] = rng.integers(0, 65535, (2, 3)).astype(np.uint16)
    out["i64"] = rng.integers(-2**40, 2**40, (3,)).astype(np.int64)
    out["u8"] = rng.integers(0, 255, (9,)).astype(np.uint8)
    out["i8"] = rng.integers(-128, 127, (9,)).astype(np.int8)
    out["b"] = rng.integers(0, 2, (5,)).astype(np.bool_)
    out["scalar"] = np.array(1.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 3), dtype=np.float32)
    return out
def fp8():
    out = {}
    for name, t in [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2),
                    ("e8m0", ml_dtypes.float8_e8m0fnu), ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
                    ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz), ("bf16", ml_dtypes.bfloat16)]:
        n = 256 if t != ml_dtypes.bfloat16 else 64
        bits = np.arange(n, dtype=np.uint8 if n == 256 else np.uint16) * (1 if n == 256 else 997)
        out[name] = bits.view(t).reshape(-1, 16) if n == 256 else bits.view(t).reshape(4, 16)
    return out
if mode == "gen":
    for k, a in arrays().items():
        np.save(os.path.join(d, k + ".npy"), a)
        np.ascontiguousarray(a).tofile(os.path.join(d, k + ".bin"))
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    np.save(os.path.join(d, "fortran.npy"), np.asfortranarray(a)); a.tofile(os.path.join(d, "fortran.bin"))
    np.save(os.path.join(d, "bigend.npy"), a.astype(">f8")); a.astype("<f8").tofile(os.path.join(d, "bigend.bin"))
    np.save(os.path.join(d, "bigend_fortran.npy"), np.asfortranarray(a.astype(">i2")))
    a.astype("<i2").tofile(os.path.join(d, "bigend_fortran.bin"))
    ts = dict(arrays()); ts.update(fp8())
    del ts["b"]  # the safetensors numpy binding maps bool only through torch
    save_file(ts, os.path.join(d, "py.safetensors"), metadata={"op": "interop", "seed": "7"})
    for k, a in ts.items():
        np.ascontiguousarray(a).view(np.uint8).tofile(os.path.join(d, "st_" + k + ".bin"))
    with open(os.path.join(d, "sha.txt"), "w") as f:
        for n in range(0, 200):
            f.write("%d %s\n" % (n, hashlib.sha256(bytes((i * 7 + 3) % 256 for i in range(n))).hexdigest()))
elif mode == "check":
    import json, struct
    from safetensors import safe_open
    ref = fp8()
    path = os.path.join(d, "cpp.safetensors")
    # safetensors' numpy binding loads no FP8/bf16 (it lacks ml_dtypes): those are checked from the raw file.
    with safe_open(path, framework="np") as f:
        assert f.metadata() == {"op": "interop", "note": "written by C++"}, f.metadata()
        assert sorted(f.keys()) == sorted(["i64", "f32"] + list(ref.keys())), f.keys()
        assert f.get_tensor("f32").dtype == np.float32 and f.get_tensor("f32").tolist() == [[1.0, -2.0, 0.5]]
        assert f.get_tensor("i64").tolist() == [-1, 2**40]
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    keys = list(header.keys())
    assert keys == ["__metadata__", "i64", "f32", "e8m0", "bf16", "e4m3", "e5m2fnuz", "e4m3fnuz", "e5m2"], keys
    tags = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "e8m0": "F8_E8M0", "e4m3fnuz": "F8_E4M3FNUZ",
            "e5m2fnuz": "F8_E5M2FNUZ", "bf16": "BF16"}
    for k, a in ref.items():
        e = header[k]
        assert e["dtype"] == tags[k] and e["shape"] == list(a.shape), (k, e)
        b, end = e["data_offsets"]
        assert raw[8 + n + b:8 + n + end] == a.tobytes(), k
    x = np.load(os.path.join(d, "cpp.npy"))
    assert x.dtype == np.float32 and x.tolist() == [[1.0, -2.0, 0.5]], x
    y = np.load(os.path.join(d, "cpp_fp8.npy"))
    assert y.dtype == np.uint8 and y.tobytes() == ref["e4m3"].tobytes()
)PY";
  }
  auto run = [&](const std::string& mode) {
    std::string cmd = "python3 \"" + script + "\" \"" + dir.path.string() + "\" " + mode;
    return std::system(cmd.c_str());
  };
  REQUIRE(run("gen") == 0);

  // .npy written by numpy, including Fortran order and big-endian data.
  const char* npy_names[] = {"f32", "f64", "f16", "i32", "u16", "i64", "u8", "i8", "b", "scalar", "empty",
                             "fortran", "bigend", "bigend_fortran"};
  const DType npy_types[] = {DType::F32, DType::F64, DType::F16, DType::I32, DType::U16, DType::I64, DType::U8,
                             DType::I8, DType::BOOL, DType::F32, DType::F32, DType::F32, DType::F64, DType::I16};
  for (size_t k = 0; k < std::size(npy_names); ++k) {
    CAPTURE(npy_names[k]);
    Tensor t = read_npy(dir / (std::string(npy_names[k]) + ".npy"));
    CHECK(t.dtype == npy_types[k]);
    CHECK(t.data == read_bytes(dir / (std::string(npy_names[k]) + ".bin")));
  }
  CHECK(read_npy(dir / "fortran.npy").shape == std::vector<int64_t>{3, 4, 5});
  CHECK(read_npy(dir / "scalar.npy").shape.empty());

  // safetensors written by the safetensors package, FP8 and bf16 via ml_dtypes.
  SafetensorsFile f = read_safetensors(dir / "py.safetensors");
  CHECK(f.metadata == std::map<std::string, std::string>{{"op", "interop"}, {"seed", "7"}});
  CHECK(f.tensors.size() == 16);
  for (const auto& t : f.tensors) {
    CAPTURE(t.name);
    CHECK(t.data == read_bytes(dir / ("st_" + t.name + ".bin")));
  }
  REQUIRE(f.find("e4m3"));
  CHECK(f.find("e4m3")->dtype == DType::F8_E4M3);
  CHECK(f.find("e5m2")->dtype == DType::F8_E5M2);
  CHECK(f.find("e8m0")->dtype == DType::F8_E8M0);
  CHECK(f.find("e4m3fnuz")->dtype == DType::F8_E4M3FNUZ);
  CHECK(f.find("e5m2fnuz")->dtype == DType::F8_E5M2FNUZ);
  CHECK(f.find("bf16")->dtype == DType::BF16);
  CHECK(f.find("e4m3")->shape == std::vector<int64_t>{16, 16});

  // SHA-256 against hashlib at every length around the block boundaries.
  {
    std::ifstream sha(dir / "sha.txt");
    int n;
    std::string hex;
    int count = 0;
    while (sha >> n >> hex) {
      std::vector<uint8_t> msg(n);
      for (int i = 0; i < n; ++i) msg[i] = static_cast<uint8_t>((i * 7 + 3) % 256);
      CAPTURE(n);
      CHECK(sha256_hex(msg) == hex);
      ++count;
    }
    CHECK(count == 200);
  }

  // C++ writes, python reads; the order given (deliberately not alphabetical) is the file's order.
  Tensor f32 = make_tensor("f32", DType::F32, {1, 3});
  float vals[3] = {1.0f, -2.0f, 0.5f};
  std::memcpy(f32.data.data(), vals, 12);
  Tensor i64 = make_tensor("i64", DType::I64, {2});
  int64_t iv[2] = {-1, int64_t(1) << 40};
  std::memcpy(i64.data.data(), iv, 16);
  std::vector<Tensor> out = {i64, f32};
  for (const char* k : {"e8m0", "bf16", "e4m3", "e5m2fnuz", "e4m3fnuz", "e5m2"}) out.push_back(*f.find(k));
  write_safetensors(dir / "cpp.safetensors", out, {{"op", "interop"}, {"note", "written by C++"}});
  write_npy(dir / "cpp.npy", f32);
  write_npy(dir / "cpp_fp8.npy", *f.find("e4m3"));
  CHECK(run("check") == 0);
}

}  // TEST_SUITE("io")
