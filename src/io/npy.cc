// fp8ref io — NumPy .npy files (format versions 1.0, 2.0, 3.0).
//
// Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.x, u32 LE for 2.x/3.x), then a
// Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
// spaces and a newline, then the raw array data.
#include <cstring>
#include <memory>

#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "io/internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fp8ref io assumes a little-endian host"
#endif

namespace fp8ref::io {
namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

// ---- a tiny parser for the header's Python literal ---------------------------------------------

struct PyValue {
  enum Kind { kString, kBool, kInt, kNone, kTuple, kList, kDict } kind = kNone;
  std::string str;
  bool boolean = false;
  int64_t integer = 0;
  std::vector<PyValue> items;                          // tuple, list
  std::vector<std::pair<std::string, PyValue>> dict;   // dict (string keys only)
};

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

  PyValue parse_top() {
    PyValue v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the header dict");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) {
    throw InputError(what_ + ": malformed .npy header: " + problem + " (at offset " + std::to_string(pos_) + ")");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool word(const char* w) {
    size_t n = std::strlen(w);
    if (s_.compare(pos_, n, w) == 0) {
      pos_ += n;
      return true;
    }
    return false;
  }

  PyValue value(int depth) {
    if (depth > 16) fail("nested too deeply");
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    char c = s_[pos_];
    PyValue v;
    if (c == '\'' || c == '"') {
      v.kind = PyValue::kString;
      v.str = string_literal();
    } else if (c == '{') {
      ++pos_;
      v.kind = PyValue::kDict;
      while (!eat('}')) {
        skip_ws();
        if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) fail("expected a string key");
        std::string key = string_literal();
        if (!eat(':')) fail("expected ':'");
        v.dict.emplace_back(key, value(depth + 1));
        if (!eat(',')) {
          if (!eat('}')) fail("expected ',' or '}'");
          break;
        }
      }
    } else if (c == '(' || c == '[') {
      char close = c == '(' ? ')' : ']';
      ++pos_;
      v.kind = c == '(' ? PyValue::kTuple : PyValue::kList;
      while (!eat(close)) {
        v.items.push_back(value(depth + 1));
        if (!eat(',')) {
          if (!eat(close)) fail(std::string("expected ',' or '") + close + "'");
          break;
        }
      }
    } else if (word("True")) {
      v.kind = PyValue::kBool;
      v.boolean = true;
    } else if (word("False")) {
      v.kind = PyValue::kBool;
      v.boolean = false;
    } else if (word("None")) {
      v.kind = PyValue::kNone;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::kInt;
      bool neg = c == '-';
      if (neg) ++pos_;
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("expected a digit");
      uint64_t x = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (x > (uint64_t(INT64_MAX) - 9) / 10) fail("integer too large");
        x = x * 10 + uint64_t(s_[pos_++] - '0');
      }
      if (pos_ < s_.size() && (s_[pos_] == 'L' || s_[pos_] == 'l')) ++pos_;  // Python 2 long
      v.integer = neg ? -int64_t(x) : int64_t(x);
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  std::string string_literal() {
    char q = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') {
        ++pos_;
        if (pos_ >= s_.size()) break;
      }
      out += s_[pos_++];
    }
    if (pos_ >= s_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }

  const std::string& s_;
  const std::string& what_;
  size_t pos_ = 0;
};

// ---- dtype descriptors -------------------------------------------------------------------------

// Parses '<f4', '>i2', '|u1', '=f8', ... into a DType and whether the data is big-endian.
bool parse_descr(const std::string& descr, DType* dtype, bool* big_endian) {
  std::string d = descr;
  char order = '=';
  if (!d.empty() && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=')) {
    order = d[0];
    d = d.substr(1);
  }
  struct Entry {
    const char* code;
    DType dtype;
  };
  static const Entry kTable[] = {
      {"b1", DType::BOOL}, {"u1", DType::U8},  {"i1", DType::I8},  {"u2", DType::U16},
      {"i2", DType::I16},  {"u4", DType::U32}, {"i4", DType::I32}, {"u8", DType::U64},
      {"i8", DType::I64},  {"f2", DType::F16}, {"f4", DType::F32}, {"f8", DType::F64},
  };
  for (const auto& e : kTable) {
    if (d == e.code) {
      *dtype = e.dtype;
      *big_endian = order == '>' && dtype_size(e.dtype) > 1;
      return true;
    }
  }
  return false;
}

const char* descr_for(DType d) {
  switch (d) {
    case DType::BOOL: return "|b1";
    case DType::U8: return "|u1";
    case DType::I8: return "|i1";
    case DType::U16: return "<u2";
    case DType::I16: return "<i2";
    case DType::U32: return "<u4";
    case DType::I32: return "<i4";
    case DType::U64: return "<u8";
    case DType::I64: return "<i8";
    case DType::F16: return "<f2";
    case DType::BF16: return "<u2";  // npy has no bfloat16: the raw codes
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::F8_E8M0:
    case DType::F8_E4M3FNUZ:
    case DType::F8_E5M2FNUZ: return "|u1";  // npy has no FP8: the raw codes
  }
  return "|u1";
}

void byteswap_elements(uint8_t* p, size_t nbytes, size_t esize) {
  for (size_t off = 0; off + esize <= nbytes; off += esize)
    for (size_t i = 0; i < esize / 2; ++i) std::swap(p[off + i], p[off + esize - 1 - i]);
}

// Column-major (Fortran) data of `shape` -> row-major (C) order.
std::vector<uint8_t> fortran_to_c(const uint8_t* src, const std::vector<int64_t>& shape, size_t esize,
                                  size_t nbytes) {
  std::vector<uint8_t> out(nbytes);
  size_t nd = shape.size();
  size_t numel = esize ? nbytes / esize : 0;
  if (numel == 0) return out;
  std::vector<size_t> fstride(nd);  // element strides of the Fortran layout
  size_t s = 1;
  for (size_t k = 0; k < nd; ++k) {
    fstride[k] = s;
    s *= static_cast<size_t>(shape[k]);
  }
  std::vector<int64_t> idx(nd, 0);
  size_t foff = 0;
  for (size_t c = 0; c < numel; ++c) {
    std::memcpy(out.data() + c * esize, src + foff * esize, esize);
    for (size_t k = nd; k-- > 0;) {  // advance the C-order index, last dimension fastest
      if (++idx[k] < shape[k]) {
        foff += fstride[k];
        break;
      }
      foff -= fstride[k] * static_cast<size_t>(shape[k] - 1);
      idx[k] = 0;
    }
  }
  return out;
}

uint32_t read_le(const uint8_t* p, int n) {
  uint32_t x = 0;
  for (int i = n - 1; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

}  // namespace

Tensor decode_npy(const uint8_t* bytes, size_t size, const std::string& what) {
  if (size < 8 || std::memcmp(bytes, kMagic, 6) != 0) throw InputError(what + ": not a .npy file (bad magic)");
  int major = bytes[6], minor = bytes[7];
  if ((major < 1 || major > 3) || minor != 0)
    throw InputError(what + ": unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor));
  size_t len_bytes = major == 1 ? 2 : 4;
  if (size < 8 + len_bytes)
    throw InputError(what + ": truncated header: file has " + std::to_string(size) + " bytes");
  uint64_t hlen = read_le(bytes + 8, static_cast<int>(len_bytes));
  uint64_t data_start = 8 + len_bytes + hlen;
  if (data_start > size)
    throw InputError(what + ": truncated header: header length says " + std::to_string(hlen) + " bytes, file has " +
                     std::to_string(size - 8 - len_bytes) + " after the preamble");

  std::string header(reinterpret_cast<const char*>(bytes + 8 + len_bytes), hlen);
  PyValue dict = HeaderParser(header, what).parse_top();
  if (dict.kind != PyValue::kDict) throw InputError(what + ": malformed .npy header: not a dict");

  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [k, v] : dict.dict) {
    if (k == "descr") descr = &v;
    else if (k == "fortran_order") fortran = &v;
    else if (k == "shape") shape = &v;
    else throw InputError(what + ": malformed .npy header: unexpected key '" + k + "'");
  }
  if (!descr || !fortran || !shape)
    throw InputError(what + ": malformed .npy header: needs the keys 'descr', 'fortran_order' and 'shape'");
  if (descr->kind != PyValue::kString)
    throw InputError(what + ": unsupported dtype (structured arrays are not supported)");
  if (fortran->kind != PyValue::kBool)
    throw InputError(what + ": malformed .npy header: 'fortran_order' is not True or False");
  if (shape->kind != PyValue::kTuple) throw InputError(what + ": malformed .npy header: 'shape' is not a tuple");

  Tensor t;
  bool big_endian = false;
  if (!parse_descr(descr->str, &t.dtype, &big_endian)) {
    std::string hint;
    const size_t v = descr->str.find('V');
    if (v != std::string::npos) {  // ml_dtypes arrays (float8_*, bfloat16) are saved as raw void bytes
      const std::string width = descr->str.substr(v + 1);
      hint = width == "2"   ? " (raw void bytes: an ml_dtypes bfloat16 array? save x.view(np.uint16), its bit patterns)"
             : width == "1" ? " (raw void bytes: an ml_dtypes float8 array? save x.view(np.uint8), its codes)"
                            : " (raw void bytes: ml_dtypes arrays lose their type in .npy; save their bits as an "
                              "unsigned integer array: x.view(np.uint8) for FP8, x.view(np.uint16) for bf16)";
    }
    throw InputError(what + ": unsupported dtype '" + descr->str + "'" + hint);
  }
  uint64_t nbytes = dtype_size(t.dtype);
  for (const auto& d : shape->items) {
    if (d.kind != PyValue::kInt || d.integer < 0)
      throw InputError(what + ": malformed .npy header: shape entries must be non-negative integers");
    t.shape.push_back(d.integer);
  }
  if (!detail::shape_nbytes(t.shape, nbytes, &nbytes))
    throw InputError(what + ": malformed .npy header: shape too large");
  uint64_t have = size - data_start;
  if (have < nbytes)
    throw InputError(what + ": truncated: header says " + std::to_string(nbytes) + " bytes of data, file has " +
                     std::to_string(have));
  if (have > nbytes)
    throw InputError(what + ": " + std::to_string(have - nbytes) + " unexpected bytes after the data (header says " +
                     std::to_string(nbytes) + ")");

  const uint8_t* src = bytes + data_start;
  size_t esize = dtype_size(t.dtype);
  if (fortran->boolean && t.shape.size() > 1) {
    t.data = fortran_to_c(src, t.shape, esize, nbytes);
  } else {
    t.data.assign(src, src + nbytes);
  }
  if (big_endian) byteswap_elements(t.data.data(), t.data.size(), esize);
  return t;
}

std::vector<uint8_t> encode_npy(const Tensor& t) {
  const std::string who = "tensor '" + t.name + "'";
  uint64_t nbytes = dtype_size(t.dtype);
  for (int64_t d : t.shape)
    if (d < 0 || detail::mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes))
      throw InputError(who + ": invalid shape");
  if (nbytes != t.data.size())
    throw InputError(who + ": has " + std::to_string(t.data.size()) + " bytes, its shape and dtype need " +
                     std::to_string(nbytes));

  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(t.shape[i]);
  }
  if (t.shape.size() == 1) shape += ",";
  shape += ")";
  std::string header =
      std::string("{'descr': '") + descr_for(t.dtype) + "', 'fortran_order': False, 'shape': " + shape + ", }";

  // Pad with spaces and a final newline so that the data starts 64-byte aligned (as numpy does).
  size_t len_bytes = 2;
  int major = 1;
  auto padded = [&](size_t lb) { return (8 + lb + header.size() + 1 + 63) / 64 * 64 - (8 + lb); };
  size_t hlen = padded(2);
  if (hlen > 0xFFFF) {
    len_bytes = 4;
    major = 2;
    hlen = padded(4);
  }
  header.append(hlen - header.size() - 1, ' ');
  header += '\n';

  // Sized once and filled by offset (a reserve + insert sequence here trips GCC 12's -Wstringop-overflow).
  std::vector<uint8_t> out(8 + len_bytes + hlen + nbytes);
  std::memcpy(out.data(), kMagic, 6);
  out[6] = static_cast<uint8_t>(major);
  out[7] = 0;
  for (size_t i = 0; i < len_bytes; ++i) out[8 + i] = static_cast<uint8_t>(hlen >> (8 * i));
  std::memcpy(out.data() + 8 + len_bytes, header.data(), header.size());
  if (nbytes) std::memcpy(out.data() + 8 + len_bytes + hlen, t.data.data(), nbytes);
  return out;
}

Tensor read_npy(const std::string& path) {
  detail::MappedFile f(path);
  return decode_npy(f.data(), f.size(), path);
}

void write_npy(const std::string& path, const Tensor& t) {
  OutputFiles f;
  f.add_npy(path, t);
  f.commit();
}

}  // namespace fp8ref::io
