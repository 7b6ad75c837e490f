// fp8ref io — safetensors files.
//
// Layout: u64 LE header length N, N bytes of JSON (an object: tensor name -> {"dtype", "shape",
// "data_offsets": [begin, end]} relative to the data buffer, plus an optional "__metadata__"
// string->string map), then the data buffer. The format requires the buffer to be covered
// exactly: no overlaps, no holes, nothing after the last tensor.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "io/internal.h"

namespace fp8ref::io {
namespace {

constexpr const char* kMetadataKey = "__metadata__";

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

bool as_u64(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = static_cast<uint64_t>(x);
    return true;
  }
  return false;
}

// The JSON library's message without its "[json.exception.parse_error.101] " prefix.
std::string json_message(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[') {
    size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  return m;
}

Entry parse_entry(const std::string& what, const std::string& name, const nlohmann::json& v, uint64_t buffer_size) {
  const std::string who = what + ": tensor '" + name + "'";
  if (!v.is_object()) throw InputError(who + ": header entry is not a JSON object");
  for (const auto& item : v.items()) {
    const std::string& k = item.key();
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      throw InputError(who + ": unexpected header field '" + k + "'");
  }
  if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    throw InputError(who + ": header entry needs 'dtype', 'shape' and 'data_offsets'");

  Entry e;
  e.name = name;
  const auto& dt = v["dtype"];
  if (!dt.is_string()) throw InputError(who + ": 'dtype' is not a string");
  auto parsed = parse_dtype(dt.get<std::string>());
  if (!parsed) throw InputError(who + ": unknown dtype '" + dt.get<std::string>() + "'");
  e.dtype = *parsed;

  const auto& sh = v["shape"];
  if (!sh.is_array()) throw InputError(who + ": 'shape' is not an array");
  uint64_t nbytes = dtype_size(e.dtype);
  for (const auto& d : sh) {
    uint64_t x;
    if (!as_u64(d, &x) || x > uint64_t(INT64_MAX))
      throw InputError(who + ": 'shape' entries must be non-negative integers");
    e.shape.push_back(static_cast<int64_t>(x));
  }
  if (!detail::shape_nbytes(e.shape, nbytes, &nbytes)) throw InputError(who + ": shape too large");

  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !as_u64(off[0], &e.begin) || !as_u64(off[1], &e.end))
    throw InputError(who + ": 'data_offsets' must be two non-negative integers");
  std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) throw InputError(who + ": data_offsets " + range + " run backwards");
  if (e.end > buffer_size)
    throw InputError(who + ": data_offsets " + range + " go past the end of the data buffer (" +
                     std::to_string(buffer_size) + " bytes)");
  if (e.end - e.begin != nbytes)
    throw InputError(who + ": data_offsets " + range + " hold " + std::to_string(e.end - e.begin) +
                     " bytes, shape and dtype need " + std::to_string(nbytes));
  return e;
}

}  // namespace

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// Parses and validates a whole safetensors image; the tensors are views into `bytes`.
struct Parsed {
  std::vector<TensorView> tensors;  // in file order
  std::map<std::string, std::string> metadata;
};

Parsed parse_safetensors(const uint8_t* bytes, size_t size, const std::string& what) {
  if (size < 8)
    throw InputError(what + ": not a safetensors file (" + std::to_string(size) + " bytes, too small for a header)");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[i];
  if (hlen > size - 8)
    throw InputError(what + ": not a safetensors file or truncated: header length " + std::to_string(hlen) +
                     " is past the end of the file (" + std::to_string(size) + " bytes)");
  if (hlen < 2) throw InputError(what + ": header is empty");
  const char* hbeg = reinterpret_cast<const char*>(bytes + 8);
  if (hbeg[0] != '{') throw InputError(what + ": header is not a JSON object (does not start with '{')");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hbeg, hbeg + hlen);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(what + ": header is not valid JSON: " + json_message(e));
  }
  if (!header.is_object()) throw InputError(what + ": header is not a JSON object");

  const uint64_t buffer_size = size - 8 - hlen;
  const uint8_t* buffer = bytes + 8 + hlen;
  Parsed out;
  std::vector<Entry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey) {
      const auto& m = item.value();
      if (m.is_null()) continue;
      if (!m.is_object()) throw InputError(what + ": __metadata__ is not a JSON object");
      for (const auto& kv : m.items()) {
        if (!kv.value().is_string())
          throw InputError(what + ": __metadata__ value '" + kv.key() + "' is not a string");
        out.metadata[kv.key()] = kv.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(what, item.key(), item.value(), buffer_size));
  }

  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const auto& e : entries) {
    if (e.begin < pos)
      throw InputError(what + ": tensor '" + e.name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                       std::to_string(e.end) + "] overlap tensor '" + prev->name + "' [" +
                       std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    if (e.begin > pos)
      throw InputError(what + ": tensor '" + e.name + "': hole in the data buffer before it (bytes " +
                       std::to_string(pos) + " to " + std::to_string(e.begin) + " belong to no tensor)");
    pos = e.end;
    prev = &e;
  }
  if (pos != buffer_size)
    throw InputError(what + ": " + std::to_string(buffer_size - pos) +
                     " bytes at the end of the data buffer belong to no tensor");

  out.tensors.reserve(entries.size());
  for (auto& e : entries) {
    TensorView t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.bytes = buffer + e.begin;
    t.size = static_cast<size_t>(e.end - e.begin);
    out.tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace

SafetensorsFile decode_safetensors(const uint8_t* bytes, size_t size, const std::string& what) {
  Parsed p = parse_safetensors(bytes, size, what);
  SafetensorsFile out;
  out.metadata = std::move(p.metadata);
  out.tensors.reserve(p.tensors.size());
  for (TensorView& v : p.tensors) {
    Tensor t;
    t.name = std::move(v.name);
    t.dtype = v.dtype;
    t.shape = std::move(v.shape);
    t.data.assign(v.bytes, v.bytes + v.size);
    out.tensors.push_back(std::move(t));
  }
  return out;
}

std::vector<uint8_t> encode_safetensors(const std::vector<Tensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string who = "tensor '" + t.name + "'";
    if (t.name == kMetadataKey) throw InputError(who + ": the name is reserved");
    if (!names.insert(t.name).second) throw InputError(who + ": the name is used twice");
    uint64_t nbytes = dtype_size(t.dtype);
    for (int64_t d : t.shape)
      if (d < 0 || detail::mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes))
        throw InputError(who + ": invalid shape");
    if (nbytes != t.data.size())
      throw InputError(who + ": has " + std::to_string(t.data.size()) + " bytes, its shape and dtype need " +
                       std::to_string(nbytes));
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + nbytes};
    header[t.name] = std::move(e);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw InputError("safetensors header: " + json_message(e));  // e.g. a name that is not UTF-8
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  uint64_t hlen = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(hlen >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

SafetensorsFile read_safetensors(const std::string& path) {
  detail::MappedFile f(path);
  return decode_safetensors(f.data(), f.size(), path);
}

MappedSafetensors::MappedSafetensors(const std::string& path) : map_(std::make_unique<detail::MappedFile>(path)) {
  Parsed p = parse_safetensors(map_->data(), map_->size(), path);
  tensors_ = std::move(p.tensors);
  metadata_ = std::move(p.metadata);
}
MappedSafetensors::~MappedSafetensors() = default;
MappedSafetensors::MappedSafetensors(MappedSafetensors&&) noexcept = default;
MappedSafetensors& MappedSafetensors::operator=(MappedSafetensors&&) noexcept = default;

const TensorView* MappedSafetensors::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}
const uint8_t* MappedSafetensors::file_data() const { return map_ ? map_->data() : nullptr; }
size_t MappedSafetensors::file_size() const { return map_ ? map_->size() : 0; }

void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> bytes;
  try {
    bytes = encode_safetensors(tensors, metadata);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  write_file_atomic(path, bytes);
}

}  // namespace fp8ref::io
