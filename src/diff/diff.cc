// fp8ref — the numerical diff: analysis (see include/fp8ref/diff.h for what each section means).
//
// One streaming pass per output tensor over fixed chunks (OpenMP, dynamic schedule). Every statistic is either a
// count, a max with the lowest index breaking ties, a bounded worst-K set under a total order, or a sum taken per
// chunk and added in chunk order, so the report does not depend on the number of threads. Structure counters
// (per row, 128x128 block, attached scale block) are shared arrays updated atomically (or per thread and summed),
// on mismatches only; the 1x128 groups, one per 128 elements, get no array: each chunk summarises its own groups
// (the breakdown's count, top 8 and runs, merged in chunk order) and lists those the second pass must look at. The
// second pass, over blocks with unexplained mismatches only, looks for blocks off by one common factor.
//
// Speed (issue 3; bench/bench_diff.cc, bench/RESULTS.md): one-byte codes are scanned by a SIMD kernel (scan.cc)
// that returns the positions that differ; with classes that depend on the two codes alone (no exact, bound or
// scale tensor) mismatch8() handles them a block at a time, counting what depends on the codes alone per code-class
// key and per ULP distance (fold8() derives the rest) and keeping running sums and maxima in registers, so that
// only the position-dependent work is done per element, in element order. tests/test_diff_pinned.cc pins whole
// reports of many-mismatch cases to what the straightforward per-element code (mismatch()) produced.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cerrno>
#include <map>
#include <optional>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "diff/internal.h"
#include "diff/scale_layouts.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"

namespace fp8ref::diff {

// ---- names --------------------------------------------------------------------------------------------------

const char* to_string(ValueClass c) {
  static const char* const n[] = {"NaN", "+Inf", "-Inf", "+0", "-0", "+max", "-max", "finite"};
  return n[static_cast<int>(c)];
}
const char* to_string(Mismatch m) {
  static const char* const n[] = {"nan_policy", "overflow",        "scale",           "signed_zero", "tie",
                                  "double_rounding", "subnormal_flush", "accumulation", "wrong"};
  return n[static_cast<int>(m)];
}
const char* to_string(Verdict v) {
  static const char* const n[] = {"PASS", "MISTRUSTED", "FAIL"};
  return n[static_cast<int>(v)];
}

// ---- tolerances ---------------------------------------------------------------------------------------------

std::string Tolerance::to_string() const {
  switch (kind) {
    case Kind::exact: return "exact";
    case Kind::bound: return "bound";
    case Kind::ulp: return "ulp:" + std::to_string(ulp) + (frac < 1.0 ? ",frac:" + detail::num(frac) : "");
    case Kind::absrel: return "abs:" + detail::num(abs) + ",rel:" + detail::num(rel);
  }
  return "?";
}

Tolerance parse_tolerance(std::string_view text) {
  const std::string t(text);
  auto bad = [&](const std::string& why) {
    return InputError("--tol '" + t + "': " + why + " (expected exact, ulp:K[,frac:F], abs:A,rel:R or bound)");
  };
  Tolerance tol;
  if (t == "exact") return tol;
  if (t == "bound") {
    tol.kind = Tolerance::Kind::bound;
    return tol;
  }
  // key:value pairs separated by commas
  std::map<std::string, std::string> kv;
  size_t pos = 0;
  while (pos <= t.size()) {
    const size_t comma = t.find(',', pos);
    const std::string item = t.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == item.size()) throw bad("'" + item + "' is not key:value");
    const std::string k = item.substr(0, colon), v = item.substr(colon + 1);
    if (k != "ulp" && k != "frac" && k != "abs" && k != "rel") throw bad("unknown key '" + k + "'");
    if (kv.count(k)) throw bad("'" + k + "' given twice");
    kv[k] = v;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  auto number = [&](const std::string& k) {
    const std::string& v = kv[k];
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || errno != 0 || !std::isfinite(d) || d < 0)
      throw bad("'" + k + ":" + v + "' needs a finite number >= 0");
    return d;
  };
  if (kv.count("ulp")) {
    if (kv.count("abs") || kv.count("rel")) throw bad("ulp and abs/rel do not combine");
    tol.kind = Tolerance::Kind::ulp;
    const std::string& v = kv["ulp"];
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19)
      throw bad("'ulp:" + v + "' needs a whole number of ULPs");
    tol.ulp = std::stoull(v);
    if (kv.count("frac")) {
      tol.frac = number("frac");
      if (tol.frac > 1) throw bad("frac is a fraction of the elements, in [0, 1]");
    }
    return tol;
  }
  if (kv.count("frac")) throw bad("frac goes with ulp:K");
  tol.kind = Tolerance::Kind::absrel;
  if (kv.count("abs")) tol.abs = number("abs");
  if (kv.count("rel")) tol.rel = number("rel");
  return tol;
}

namespace detail {

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec : {6, 9, 17}) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string round_up_2(double v) {
  if (!(v > 0) || !std::isfinite(v)) return num(v);
  {
    const std::string exact = num(v);  // short and exact (544, 0.125): as it is
    if (exact.size() <= 7 && exact.find('e') == std::string::npos) return exact;
  }
  char buf[40];
  for (int prec = 2; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    double r = std::strtod(buf, nullptr);
    if (r >= v) return buf;
    // bump the last significant digit up
    const double e = std::floor(std::log10(v)) - (prec - 1);
    r = (std::floor(v / std::pow(10.0, e)) + 1) * std::pow(10.0, e);
    std::snprintf(buf, sizeof buf, "%.*g", prec, r);
    if (std::strtod(buf, nullptr) >= v) return buf;
  }
  return num(v);
}

std::string factor_string(double f, bool ue8m0) {
  if (std::isnan(f)) return "×? (undefined)";
  if (std::isinf(f)) return f > 0 ? "×inf" : "×-inf";
  int e = 0;
  const double m = std::frexp(f, &e);
  if (m == 0.5 && e - 1 != 0) {
    const int k = e - 1;
    const std::string by = k == 1 || k == -1 ? std::string("one") : std::to_string(std::abs(k));
    return "×" + num(f) + (ue8m0 ? " (ue8m0 off by " + by + ")" : " (2^" + std::to_string(k) + ": exponent off by " + by + ")");
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "×%.6g", f);
  return buf;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}
std::string index_string(const std::vector<int64_t>& index) { return shape_string(index); }

std::string hex_bits(uint64_t bits, size_t bytes) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", static_cast<int>(bytes * 2), static_cast<unsigned long long>(bits));
  return buf;
}

}  // namespace detail

namespace {

using detail::num;

// ---- element formats ----------------------------------------------------------------------------------------

struct Fmt {
  io::DType dtype = io::DType::U8;
  size_t size = 1;
  enum class Kind : uint8_t { fp, sint, uint } kind = Kind::uint;
  Format format = Format::e4m3fn;
  SpecialStyle style = SpecialStyle::ieee;
  uint64_t sign_mask = 0, exp_mask = 0, man_mask = 0, max_mag = 0;
  int man_bits = 0;
  double max_value = 0;
  double lut[256] = {};      // 1-byte formats: the value of each code
  uint8_t cls_lut[256] = {};  // 1-byte formats: the ValueClass of each code

  explicit Fmt(io::DType d) : dtype(d), size(io::dtype_size(d)) {
    if (auto f = io::dtype_format(d)) {
      kind = Kind::fp;
      format = *f;
      const FormatInfo& fi = format_info(format);
      style = fi.special;
      man_bits = fi.man_bits;
      man_mask = (uint64_t{1} << fi.man_bits) - 1;
      exp_mask = ((uint64_t{1} << fi.exp_bits) - 1) << fi.man_bits;
      sign_mask = fi.is_signed ? uint64_t{1} << (fi.bits - 1) : 0;
      max_mag = format == Format::f64 ? 0x7FEFFFFFFFFFFFFFull : fi.max_code;
      max_value = fi.max_value;
    } else {
      kind = (d == io::DType::I8 || d == io::DType::I16 || d == io::DType::I32 || d == io::DType::I64) ? Kind::sint
                                                                                                        : Kind::uint;
    }
    if (size == 1)
      for (int c = 0; c < 256; ++c) {
        lut[c] = value_slow(c);
        cls_lut[c] = static_cast<uint8_t>(classify_slow(c));
      }
  }

  bool is_fp8() const { return kind == Kind::fp && size == 1; }

  double value_slow(uint64_t b) const {
    if (kind == Kind::uint) return static_cast<double>(b);
    if (kind == Kind::sint) {
      const int sh = 64 - static_cast<int>(size) * 8;
      return static_cast<double>(static_cast<int64_t>(b << sh) >> sh);
    }
    switch (format) {
      case Format::f64: {
        double v;
        std::memcpy(&v, &b, 8);
        return v;
      }
      case Format::f32: {
        const uint32_t u = static_cast<uint32_t>(b);
        float v;
        std::memcpy(&v, &u, 4);
        return v;
      }
      case Format::bf16: {
        const uint32_t u = static_cast<uint32_t>(b) << 16;
        float v;
        std::memcpy(&v, &u, 4);
        return v;
      }
      case Format::f16: {
        const int e = static_cast<int>((b >> 10) & 0x1F), m = static_cast<int>(b & 0x3FF);
        const double s = (b & 0x8000) ? -1.0 : 1.0;
        if (e == 31) return m ? std::nan("") : s * HUGE_VAL;
        if (e == 0) return s * std::ldexp(m, -24);
        return s * std::ldexp(1024 + m, e - 25);
      }
      default: return ref::value_of(format, static_cast<uint8_t>(b));
    }
  }
  double value(uint64_t b) const { return size == 1 ? lut[b & 0xFF] : value_slow(b); }

  ValueClass classify_slow(uint64_t b) const {
    if (kind != Kind::fp) return value_slow(b) == 0 ? ValueClass::pos_zero : ValueClass::finite;
    const bool neg = (b & sign_mask) != 0;
    const uint64_t mag = b & ~sign_mask;
    switch (style) {
      case SpecialStyle::e8m0:
        return b == 0xFF ? ValueClass::nan : b == max_mag ? ValueClass::pos_max : ValueClass::finite;
      case SpecialStyle::fnuz:
        if (b == 0x80) return ValueClass::nan;
        break;
      case SpecialStyle::fn:
        if (mag == (exp_mask | man_mask)) return ValueClass::nan;
        break;
      case SpecialStyle::ieee:
        if ((mag & exp_mask) == exp_mask)
          return (mag & man_mask) ? ValueClass::nan : neg ? ValueClass::neg_inf : ValueClass::pos_inf;
        break;
    }
    if (mag == 0) return neg ? ValueClass::neg_zero : ValueClass::pos_zero;
    if (mag == max_mag) return neg ? ValueClass::neg_max : ValueClass::pos_max;
    return ValueClass::finite;
  }
  ValueClass classify(uint64_t b) const {
    return size == 1 ? static_cast<ValueClass>(cls_lut[b & 0xFF]) : classify_slow(b);
  }

  // Position on the ordered finite encodings (-0 and +0 the same point).
  int64_t ordinal(uint64_t b) const {
    if (kind == Kind::uint) return static_cast<int64_t>(b);
    if (kind == Kind::sint) {
      const int sh = 64 - static_cast<int>(size) * 8;
      return static_cast<int64_t>(b << sh) >> sh;
    }
    const uint64_t mag = b & ~sign_mask;
    return (b & sign_mask) ? -static_cast<int64_t>(mag) : static_cast<int64_t>(mag);
  }
  static uint64_t distance(int64_t x, int64_t y) {
    return x >= y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y) : static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
  }
  bool is_subnormal(uint64_t b) const {
    if (kind != Kind::fp || style == SpecialStyle::e8m0) return false;
    const uint64_t mag = b & ~sign_mask;
    return mag != 0 && (mag & exp_mask) == 0;
  }
  // The spacing of the encodings at b (the larger neighbour gap, for a finite b).
  double spacing(uint64_t b) const {
    if (kind != Kind::fp) return 1.0;
    const uint64_t mag = b & ~sign_mask;
    const uint64_t other = mag < max_mag ? mag + 1 : mag - 1;
    return std::fabs(value(other) - value(mag));
  }
};

// Round an exact value to the tensor's format with RNE (and nonsat overflow), directly or through F first.
struct Rounder {
  bool ok = false;
  bool fp8 = false;
  Format target = Format::e4m3fn;
  ConversionSpec spec;
  std::vector<Format> via;

  explicit Rounder(const Fmt& f) {
    if (f.kind != Fmt::Kind::fp) return;
    target = f.format;
    if (f.is_fp8() && f.format != Format::ue8m0) {
      ok = fp8 = true;
      spec.to = target;
      spec.rounding = Rounding::rne;
      spec.overflow = Overflow::nonsat;
      spec.nan = NanOut::keep_sign;
      spec.nan_code = format_info(target).special == SpecialStyle::fnuz ? 0x80 : 0x7F;
      spec.f64_path = F64Path::direct;
      via = {Format::f32, Format::f16, Format::bf16};
    } else if (target == Format::bf16 || target == Format::f16) {
      ok = true;
      via = {Format::f32};
    }
  }
  // exact.* an input value of format `source` (OpInfo::exact_source: a conversion): only intermediates a device
  // would round a value of that format to before the target — none from a 16-bit source (its f16 <-> bf16 roundings
  // only match by chance, e.g. next to the smallest subnormal), f16 and bf16 from an f32 one.
  void restrict_to_source(Format source) {
    if (source == Format::f16 || source == Format::bf16) via.clear();
    if (source == Format::f32) via.erase(std::remove(via.begin(), via.end(), Format::f32), via.end());
  }
  uint64_t direct(uint64_t xbits) const {
    return fp8 ? ref::encode(Format::f64, xbits, spec) : ref::narrow(Format::f64, xbits, target);
  }
  uint64_t through(uint64_t xbits, Format F) const {
    const uint64_t i = ref::narrow(Format::f64, xbits, F);
    return fp8 ? ref::encode(F, i, spec) : ref::narrow(F, i, target);
  }
};

// ---- fp8ref.outputs -----------------------------------------------------------------------------------------

struct OutputInfo {
  std::string role = "data", format, contract = "exact", of;
  std::vector<std::string> dims;
  std::vector<int64_t> block;
  bool declared = false;
};

std::map<std::string, OutputInfo> parse_outputs(const std::map<std::string, std::string>& metadata, const std::string& what) {
  std::map<std::string, OutputInfo> out;
  auto it = metadata.find("fp8ref.outputs");
  if (it == metadata.end()) return out;
  auto bad = [&](const std::string& why) { return InputError(what + ": metadata 'fp8ref.outputs': " + why); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const std::exception& e) {
    throw bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad("not a JSON object");
  for (auto& item : j.items()) {
    // Named copies, not structured bindings: C++17 lambdas (str below) cannot capture those (clang rejects it).
    const std::string name = item.key();
    nlohmann::json& v = item.value();
    if (!v.is_object()) throw bad("entry '" + name + "' is not an object");
    OutputInfo o;
    o.declared = true;
    auto str = [&](const char* k, std::string* dst) {
      if (!v.contains(k)) return;
      if (!v[k].is_string()) throw bad("tensor '" + name + "': '" + k + "' is not a string");
      *dst = v[k].get<std::string>();
    };
    str("role", &o.role);
    str("format", &o.format);
    str("contract", &o.contract);
    str("of", &o.of);
    if (o.role != "data" && o.role != "scale") throw bad("tensor '" + name + "': role '" + o.role + "' is not data or scale");
    if (o.contract != "exact" && o.contract != "bound")
      throw bad("tensor '" + name + "': contract '" + o.contract + "' is not exact or bound");
    if (v.contains("dims")) {
      if (!v["dims"].is_array()) throw bad("tensor '" + name + "': 'dims' is not a list");
      for (auto& d : v["dims"]) {
        if (!d.is_string()) throw bad("tensor '" + name + "': 'dims' holds a non-string");
        o.dims.push_back(d.get<std::string>());
      }
    }
    if (v.contains("block")) {
      if (!v["block"].is_array()) throw bad("tensor '" + name + "': 'block' is not a list");
      for (auto& d : v["block"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 1) throw bad("tensor '" + name + "': 'block' entries must be integers >= 1");
        o.block.push_back(d.get<int64_t>());
      }
    }
    if (o.role == "scale" && (o.of.empty() || o.block.empty()))
      throw bad("scale tensor '" + name + "' needs 'of' (its data tensor) and 'block'");
    out[name] = o;
  }
  return out;
}

void unravel_into(uint64_t flat, const std::vector<int64_t>& shape, std::vector<int64_t>& idx) {
  idx.resize(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t s = static_cast<uint64_t>(shape[d]);
    idx[d] = s ? static_cast<int64_t>(flat % s) : 0;
    flat = s ? flat / s : 0;
  }
}
std::vector<int64_t> unravel(uint64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx;
  unravel_into(flat, shape, idx);
  return idx;
}

// ---- worst-K ------------------------------------------------------------------------------------------------

struct Cand {
  uint8_t tier;  // 1: no ULP distance (NaN/Inf involved), 0: finite pair
  uint64_t ulp;
  double abs;
  uint64_t flat;
};
// a is worse than b (a strict total order: the lower index wins ties)
bool worse(const Cand& a, const Cand& b) {
  if (a.tier != b.tier) return a.tier > b.tier;
  if (a.ulp != b.ulp) return a.ulp > b.ulp;
  if (a.abs != b.abs) return a.abs > b.abs;
  return a.flat < b.flat;
}
struct WorseCmp {
  bool operator()(const Cand& a, const Cand& b) const { return worse(a, b); }  // top() = the least bad
};

// ---- per-tensor analysis ------------------------------------------------------------------------------------

int ulp_bucket(uint64_t u) {  // 0, 1, 2, 3-4, 5-8, 9-16, ..., (2^63, 2^64) -> 65
  if (u <= 2) return static_cast<int>(u);
  return 65 - __builtin_clzll(u - 1);  // the smallest b with u <= 2^(b-1)
}
std::string bucket_name(int b) {
  if (b <= 2) return std::to_string(b);
  const uint64_t hi = b >= 66 ? UINT64_MAX : (uint64_t{1} << (b - 1));
  const uint64_t lo = (hi >> 1) + 1;
  return std::to_string(lo) + "-" + std::to_string(hi);
}
constexpr int kBuckets = 67;

bool finite_class(ValueClass c) {
  return c == ValueClass::finite || c == ValueClass::pos_zero || c == ValueClass::neg_zero ||
         c == ValueClass::pos_max || c == ValueClass::neg_max;
}
bool zero_class(ValueClass c) { return c == ValueClass::pos_zero || c == ValueClass::neg_zero; }
bool max_class(ValueClass c) { return c == ValueClass::pos_max || c == ValueClass::neg_max; }
bool inf_class(ValueClass c) { return c == ValueClass::pos_inf || c == ValueClass::neg_inf; }

// Counters that start at zero: large arrays are fresh anonymous mappings (zero pages), so only the pages that get a
// count are ever touched — two identical 1 GiB tensors never fault in their 32 MiB of 1x128-group counts.
class ZeroCounts {
 public:
  ZeroCounts() = default;
  ZeroCounts(const ZeroCounts&) = delete;
  ZeroCounts& operator=(const ZeroCounts&) = delete;
  ~ZeroCounts() { release(); }
  void assign(size_t n, uint32_t zero) {
    if (zero != 0) throw std::logic_error("ZeroCounts: zero only");
    release();
    n_ = n;
    const size_t bytes = n * sizeof(uint32_t);
    if (bytes >= kMapBytes) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      p_ = static_cast<uint32_t*>(p);
      mapped_ = true;
    } else {
      small_.assign(n, 0);
      p_ = small_.data();
    }
  }
  size_t size() const { return n_; }
  uint32_t* data() { return p_; }
  const uint32_t* data() const { return p_; }
  uint32_t& operator[](size_t i) { return p_[i]; }
  uint32_t operator[](size_t i) const { return p_[i]; }

 private:
  static constexpr size_t kMapBytes = size_t{1} << 20;
  void release() {
    if (mapped_) ::munmap(p_, n_ * sizeof(uint32_t));
    mapped_ = false;
    p_ = nullptr;
    n_ = 0;
    small_.clear();
  }
  uint32_t* p_ = nullptr;
  size_t n_ = 0;
  bool mapped_ = false;
  std::vector<uint32_t> small_;
};

// The grid of blocks over a data shape: ceil(shape[d] / block[d]) per dimension.
std::vector<int64_t> block_grid(const std::vector<int64_t>& shape, const std::vector<int64_t>& block) {
  std::vector<int64_t> g(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) g[d] = (shape[d] + block[d] - 1) / block[d];
  return g;
}

struct AttachedScale {
  const io::TensorView* e = nullptr;
  const io::TensorView* a = nullptr;
  std::optional<Fmt> fmt;
  std::vector<int64_t> block, sshape, sstride;
  std::vector<uint8_t> differs;  // per scale element
  uint64_t n_differ = 0;
};

uint64_t load(const io::TensorView& t, uint64_t i, size_t size) {
  const uint8_t* p = t.bytes + i * size;
  switch (size) {  // constant-size copies: inlined
    case 1: return *p;
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}
double load_f64(const io::TensorView& t, uint64_t i) {
  double v;
  std::memcpy(&v, t.bytes + i * 8, 8);
  return v;
}

struct Analyzer {
  const io::TensorView& E;
  const io::TensorView& A;
  const io::TensorView* X;      // exact.*
  const io::TensorView* B;      // bound.*
  const DiffOptions& opt;
  Tolerance tol;
  bool tol_bound_exact = false;  // tol bound without a bound tensor: judged exact
  bool is_scale_tensor;
  AttachedScale* sc;
  Fmt fmt;
  Rounder rounder;
  std::vector<int64_t> shape;
  int rank;
  int64_t rows = 1, cols = 1, gcols = 1, bcols = 1, brows = 1;
  uint64_t numel = 0;
  std::vector<int64_t> dim_off;
  int64_t dim_total = 0;

  Analyzer(const io::TensorView& e, const io::TensorView& a, const io::TensorView* x, const io::TensorView* b, const DiffOptions& o,
           Tolerance t, bool scale_tensor, AttachedScale* s)
      : E(e), A(a), X(x), B(b), opt(o), tol(t), is_scale_tensor(scale_tensor), sc(s), fmt(e.dtype), rounder(fmt),
        shape(e.shape), rank(static_cast<int>(e.shape.size())) {
    if (tol.kind == Tolerance::Kind::bound && !B) tol_bound_exact = true;
    if (fmt.size == 1) setup_classes8();
    numel = static_cast<uint64_t>(E.numel());
    if (rank >= 1) {
      cols = shape.back();
      rows = 1;
      for (int d = 0; d + 1 < rank; ++d) rows *= shape[d];
    }
    gcols = (cols + 127) / 128;
    bcols = gcols;
    brows = (rows + 127) / 128;
    dim_off.assign(rank, 0);
    for (int d = 0; d < rank; ++d) {
      dim_off[d] = dim_total;
      dim_total += shape[d];
    }
  }

  // optional: dimension 0 cut into segments [b_q, b_q+1) (a breakdown per segment, named segment_name)
  const std::vector<int64_t>* segments = nullptr;
  std::string segment_name;

  bool has_exact() const { return X != nullptr; }

  int64_t scale_block_of(const std::vector<int64_t>& idx) const {
    if (!sc) return -1;
    int64_t sb = 0;
    for (int d = 0; d < rank; ++d) sb += (idx[d] / sc->block[d]) * sc->sstride[d];
    return sb;
  }

  // The mismatch class of a differing element (pure: the post-pass and worst-K call it again).
  Mismatch classify(uint64_t flat, uint64_t eb, uint64_t ab, ValueClass ce, ValueClass ca, int64_t sb) const {
    const bool ex = has_exact();
    const double x = ex ? load_f64(*X, flat) : 0.0;
    // NaN policy: NaN codes, or anything done to a NaN input
    if (ce == ValueClass::nan && ca == ValueClass::nan) return Mismatch::nan_policy;
    if (ex && std::isnan(x)) return Mismatch::nan_policy;
    // overflow / saturation policy: +-max, +-Inf, NaN against one another (signs agreeing), beyond max
    auto special = [](ValueClass c) { return max_class(c) || inf_class(c) || c == ValueClass::nan; };
    auto negative = [](ValueClass c) { return c == ValueClass::neg_max || c == ValueClass::neg_inf; };
    if (special(ce) && special(ca)) {
      const bool signs_agree = ce == ValueClass::nan || ca == ValueClass::nan || negative(ce) == negative(ca);
      const bool exact_ok = !ex || std::isinf(x) || std::fabs(x) > fmt.max_value;
      if (signs_agree && exact_ok) return Mismatch::overflow;
    }
    if (ex && std::isinf(x)) return Mismatch::nan_policy;  // an Inf input, handled otherwise (flushed, ...)
    if (is_scale_tensor) return Mismatch::scale;
    const bool fe = finite_class(ce), fa = finite_class(ca);
    const double ve = fmt.value(eb), va = fmt.value(ab);
    // the block's scale differs and the dequantized values agree within the rounding of both sides, or ACTUAL
    // saturated / overflowed where EXPECTED's value under ACTUAL's scale lies beyond max
    if (sc && sb >= 0 && sc->differs[sb] && fe) {
      const double se = sc->fmt->value(load(*sc->e, sb, sc->fmt->size));
      const double sa = sc->fmt->value(load(*sc->a, sb, sc->fmt->size));
      if (std::isfinite(se) && std::isfinite(sa) && se != 0 && sa != 0) {
        const double he = fmt.spacing(eb) / 2, ha = fmt.spacing(ab) / 2;
        if (fa) {
          const bool mul = std::fabs(va * sa - ve * se) <= ha * std::fabs(sa) + he * std::fabs(se);
          const bool div = std::fabs(va / sa - ve / se) <= ha / std::fabs(sa) + he / std::fabs(se);
          if (mul || div) return Mismatch::scale;
        }
        if (special(ca)) {  // EXPECTED's value re-expressed under ACTUAL's scale (x = q·s, or x = q/s)
          const double tm = ve * se / sa, td = ve / se * sa;
          auto beyond = [&](double t) {
            return std::fabs(t) > fmt.max_value && (ca == ValueClass::nan || negative(ca) == (t < 0));
          };
          if (beyond(tm) || beyond(td)) return Mismatch::scale;
        }
      }
    }
    if (zero_class(ce) && zero_class(ca)) return Mismatch::signed_zero;
    if (ex && fe && fa && std::isfinite(x)) {
      // rounding tie: neighbours, the exact value their midpoint
      if (fmt.kind == Fmt::Kind::fp && fmt.format != Format::f64 &&
          Fmt::distance(fmt.ordinal(eb), fmt.ordinal(ab)) == 1 && x == (ve + va) / 2)
        return Mismatch::tie;
      // double rounding: {expected, actual} = {RNE(x), RNE(RNE_F(x))}
      if (rounder.ok) {
        uint64_t xb;
        std::memcpy(&xb, &x, 8);
        const uint64_t d = rounder.direct(xb);
        for (Format F : rounder.via) {
          const uint64_t v = rounder.through(xb, F);
          if (v != d && ((eb == d && ab == v) || (eb == v && ab == d))) return Mismatch::double_rounding;
        }
      }
    }
    if (fmt.is_subnormal(eb) && zero_class(ca)) return Mismatch::subnormal_flush;
    if (B && fe && fa) {
      const double b = load_f64(*B, flat);
      if (std::fabs(va - ve) <= b) return Mismatch::accumulation;
    }
    return Mismatch::wrong;
  }

  // ---- breakdown scans ----
  // A breakdown of units (rows, 1x128 groups, ...) keeps the units with mismatches, the top 8 (most mismatches first,
  // lower unit first on ties) and the first 16 runs of consecutive affected units. A UnitScan is that summary for a
  // slice of the units; slices merge in order (merge_scans) into the breakdown of all of them, whatever the slicing.
  using UnitCount = std::pair<uint64_t, uint64_t>;  // (count, unit)
  static bool better(const UnitCount& x, const UnitCount& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; }
  struct UnitScan {
    uint64_t nonzero = 0;
    std::vector<UnitCount> top;                       // best first, at most 8
    std::vector<std::pair<int64_t, int64_t>> runs;    // inclusive; a run reaching the slice's end is closed there
    bool more_runs = false;                           // more than kMaxRuns runs in the slice
  };
  static constexpr size_t kMaxRuns = 18;  // > 16 even if the first one joins the previous slice's last
  // Builds a UnitScan from the units with a nonzero count, given in increasing unit order.
  struct UnitScanner {
    UnitScan* s = nullptr;
    std::vector<UnitCount> heap;  // std heap under better(): front() = the worst of the 8 kept
    int64_t run_start = -1, run_end = -1;
    void start(UnitScan* scan) {
      s = scan;
      heap.clear();
      run_start = run_end = -1;
    }
    void add(uint64_t unit, uint64_t c) {
      s->nonzero++;
      const UnitCount uc{c, unit};
      if (heap.size() < 8) {
        heap.push_back(uc);
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(uc, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = uc;
        std::push_heap(heap.begin(), heap.end(), better);
      }
      const int64_t u = static_cast<int64_t>(unit);
      if (run_start >= 0 && u == run_end + 1) {
        run_end = u;
        return;
      }
      close_run();
      run_start = run_end = u;
    }
    void close_run() {
      if (run_start < 0) return;
      if (s->runs.size() < kMaxRuns) s->runs.push_back({run_start, run_end});
      else s->more_runs = true;
      run_start = -1;
    }
    void finish() {
      close_run();
      std::sort_heap(heap.begin(), heap.end(), better);  // best first
      s->top.assign(heap.begin(), heap.end());
    }
  };

  // ---- per-thread accumulator ----
  struct Acc {
    uint64_t equal_cls[kNumValueClasses] = {};
    uint64_t all_cls[kNumValueClasses + 1] = {};  // 1-byte formats: classes of every expected code (+ dummy)
    uint64_t ce[kNumValueClasses] = {}, ca[kNumValueClasses] = {};
    uint64_t conf[kNumValueClasses][kNumValueClasses] = {};
    uint64_t hist[kBuckets] = {};
    uint64_t mismatches = 0, no_distance = 0, incompatible = 0, max_ulp = 0;
    uint64_t finite_pairs = 0, rel_pairs = 0, rel_undefined = 0;
    double max_abs = -1, max_rel = -1;
    uint64_t max_abs_flat = 0, max_rel_flat = 0;
    uint64_t cls[kNumMismatchClasses] = {};
    uint64_t violations = 0, scale_explained = 0;
    std::priority_queue<Cand, std::vector<Cand>, WorseCmp> heap;
    std::vector<uint64_t> heat;
    std::vector<uint64_t> dims;
    // the current item's structure counts (flushed with atomics once per item, not once per element)
    int64_t item_c0 = 0;
    size_t item_heat_base = 0;
    uint64_t item_mism = 0;
    size_t heat_cur = 0;     // mismatch8(): the heatmap cell of the last mismatch, and the column where the next begins
    int64_t heat_next = -1;
    // the item's 1x128 groups with mismatches, (group in the row, mismatches), in increasing order (the mismatches
    // of an item come in increasing column order)
    // (separate arrays with room for an item's groups: no reallocation, no 16-byte pair copied through the stack)
    std::vector<int64_t> grp_g;
    std::vector<uint32_t> grp_n;
    size_t ngrp = 0;
    void push_group(int64_t g, uint32_t n) {
      grp_g[ngrp] = g;
      grp_n[ngrp] = n;
      ngrp++;
    }
    std::vector<uint32_t> sb_local;
    std::vector<uint32_t> blk, sblk;  // per-thread block counts (when small)
    // mismatch8() (pure one-byte codes): counts per key (see key_e) and per ULP distance, turned into the fields
    // above by fold8(); key_rep: the first code pair (expected << 8 | actual) seen with each key.
    uint64_t key_cnt[128] = {};
    uint16_t key_rep[128] = {};
    uint64_t ulp_cnt[256] = {};
    // mismatch8(): the columns of the mismatches, counted into dims in batches (flush_cols): random increments
    // into the per-column counts miss the caches while the inputs stream through them, and hit them in a batch
    std::vector<uint32_t> colbuf;
    size_t ncol = 0;
    // the current chunk's 1x128 groups: their breakdown scan, and the post-pass candidates among them
    UnitScanner* groups = nullptr;
    std::vector<uint32_t>* cands = nullptr;
    uint64_t cand_base = 0;
  };
  // classify() depends on the two codes alone: no exact or bound tensor, no scales (one-byte formats only). It is then
  // a function of (class of E, class of A, E subnormal) — see classify() — which mismatch8() counts per key:
  // key_e[E] | key_a[A] = class(E) * 16 + class(A) * 2 + subnormal(E).
  bool pure_classes() const { return fmt.size == 1 && !X && !B && !sc && !is_scale_tensor; }
  uint8_t key_e[256] = {}, key_a[256] = {};
  int16_t ord8[256] = {};
  bool key_finite[128] = {};  // both classes finite: a ULP distance
  bool finite_nonzero8[256] = {};
  // The post-pass (blocks off by one common factor) looks at 1x128 groups: collected during the pass.
  bool want_group_cands() const {
    return !sc && !is_scale_tensor && fmt.kind == Fmt::Kind::fp && fmt.format != Format::ue8m0 && rank > 0;
  }
  void setup_pure8() {  // the tables above, from fmt's
    for (int c = 0; c < 256; ++c) {
      const ValueClass k = fmt.classify(static_cast<uint64_t>(c));
      key_e[c] = static_cast<uint8_t>(static_cast<int>(k) * 16 + (fmt.is_subnormal(static_cast<uint64_t>(c)) ? 1 : 0));
      key_a[c] = static_cast<uint8_t>(static_cast<int>(k) * 2);
      ord8[c] = static_cast<int16_t>(fmt.ordinal(static_cast<uint64_t>(c)));
      finite_nonzero8[c] = finite_class(k) && !zero_class(k);
    }
    for (int k = 0; k < 128; ++k)
      key_finite[k] = finite_class(static_cast<ValueClass>(k >> 4)) && finite_class(static_cast<ValueClass>((k >> 1) & 7));
  }
  static constexpr size_t kLocalMax = size_t{1} << 18;

  static void count_group(Acc& acc, int64_t c) {
    const int64_t g = c / 128;
    if (acc.ngrp == 0 || acc.grp_g[acc.ngrp - 1] != g) acc.push_group(g, 1);
    else acc.grp_n[acc.ngrp - 1]++;
  }

  void begin_item(Acc& acc, int64_t r, int64_t c0, int64_t c1) const {
    acc.item_c0 = c0;
    acc.item_heat_base = static_cast<size_t>(r * H / rows) * static_cast<size_t>(W);
    acc.item_mism = 0;
    acc.heat_next = -1;
    acc.ngrp = 0;
    const size_t groups = static_cast<size_t>((c1 - 1) / 128 - c0 / 128 + 1);
    if (acc.grp_g.size() < groups) {
      acc.grp_g.resize(groups);
      acc.grp_n.resize(groups);
    }
    if (sc) {
      const int64_t bl = sc->block[rank - 1];
      acc.sb_local.assign(static_cast<size_t>((c1 - 1) / bl - c0 / bl + 1), 0);
    }
  }
  // A group of ACTUAL (1x128, in row r from column g * 128) with >= 2 mismatches, and no element bitwise equal to a
  // finite nonzero EXPECTED: a block the post-pass must look at. (An equal finite nonzero element is one the post-pass
  // stops at: "a nonzero element the factor left alone".) The group was just scanned: this reads the caches.
  template <typename T>
  bool group_candidate(int64_t r, int64_t g, uint32_t n) const {
    const int64_t c0 = g * 128, c1 = std::min(cols, c0 + 128);
    if (n == static_cast<uint32_t>(c1 - c0)) return true;
    const T* e = reinterpret_cast<const T*>(E.bytes) + static_cast<uint64_t>(r) * cols;
    const T* a = reinterpret_cast<const T*>(A.bytes) + static_cast<uint64_t>(r) * cols;
    for (int64_t c = c0; c < c1; ++c) {
      if (e[c] != a[c]) continue;
      if (sizeof(T) == 1) {
        if (finite_nonzero8[static_cast<uint8_t>(e[c])]) return false;
      } else {
        const ValueClass k = fmt.classify(static_cast<uint64_t>(e[c]));
        if (finite_class(k) && !zero_class(k)) return false;
      }
    }
    return true;
  }

  template <typename T>
  void flush_item(Acc& acc, int64_t r, int64_t sb_base, const std::vector<int64_t>& lead) {
    if (!acc.item_mism) return;
    {
      const uint32_t n = static_cast<uint32_t>(acc.item_mism);
#pragma omp atomic
      row_cnt[r] += n;
    }
    // the leading dimensions are the item's: counted once per item
    for (int d = 0; d + 1 < rank; ++d) acc.dims[dim_off[d] + lead[d]] += acc.item_mism;
    const bool cands = acc.cands != nullptr;
    for (size_t k = 0; k < acc.ngrp; ++k) {
      const int64_t g = acc.grp_g[k];
      const uint32_t n = acc.grp_n[k];
      // a 1x128 group lies in one item (kSeg is a multiple of 128) and the items of a chunk come in order: the chunk's
      // groups reach its scanner in increasing order
      const uint64_t unit = static_cast<uint64_t>(r * gcols + g);
      acc.groups->add(unit, n);
      if (cands && n >= 2 && group_candidate<T>(r, g, n)) acc.cands->push_back(static_cast<uint32_t>(unit - acc.cand_base));
      const size_t bi = static_cast<size_t>((r / 128) * bcols + g);
      if (block_cnt.size() <= kLocalMax) {  // small: per thread (threads share 128-row bands), summed in merge()
        if (acc.blk.empty()) acc.blk.assign(block_cnt.size(), 0);
        acc.blk[bi] += n;
      } else {
#pragma omp atomic
        block_cnt[bi] += n;
      }
    }
    if (sc) {
      const int64_t bl = sc->block[rank - 1], b0 = acc.item_c0 / bl;
      for (size_t k = 0; k < acc.sb_local.size(); ++k) {
        const uint32_t n = acc.sb_local[k];
        if (!n) continue;
        const int64_t sb = sb_base + (b0 + static_cast<int64_t>(k)) * sc->sstride[rank - 1];
        if (sblock_cnt.size() <= kLocalMax) {
          if (acc.sblk.empty()) acc.sblk.assign(sblock_cnt.size(), 0);
          acc.sblk[static_cast<size_t>(sb)] += n;
        } else {
#pragma omp atomic
          sblock_cnt[sb] += n;
        }
      }
    }
  }

  // One-byte codes: the ValueClass of every expected code is counted by the SIMD kernel (detail::scan8). The (up
  // to) four frequent non-finite codes (+-0, +-max; ue8m0: max and NaN) are counted with byte compares; the rare
  // ones (NaN/Inf magnitudes above max) come back as positions and are looked up. Slots past the format's codes
  // count into a dummy bucket (index kNumValueClasses).
  detail::Scan8Params scan_prm;
  int freq_cls[4] = {kNumValueClasses, kNumValueClasses, kNumValueClasses, kNumValueClasses};

  void setup_classes8() {
    std::vector<std::pair<uint8_t, int>> f;
    if (fmt.kind == Fmt::Kind::fp && fmt.style != SpecialStyle::e8m0) {
      for (uint8_t c : {uint8_t{0x00}, uint8_t{0x80}, static_cast<uint8_t>(fmt.max_mag), static_cast<uint8_t>(0x80 | fmt.max_mag)})
        f.push_back({c, fmt.cls_lut[c]});
      scan_prm.rare_by_mag = true;
      scan_prm.max_mag = static_cast<uint8_t>(fmt.max_mag);
    } else {
      for (int c = 0; c < 256; ++c)
        if (fmt.cls_lut[c] != static_cast<uint8_t>(ValueClass::finite)) f.push_back({static_cast<uint8_t>(c), fmt.cls_lut[c]});
    }
    if (f.size() > 4) throw std::logic_error("diff: more than 4 special one-byte codes");
    for (size_t k = 0; k < f.size(); ++k) {
      scan_prm.freq[k] = f[k].first;
      freq_cls[k] = f[k].second;
    }
  }

  // Counts the classes of p[0..n) into cls (which has kNumValueClasses + 1 entries) and calls batch(pos, k, off)
  // for the i where p[i] != q[i], in increasing i, a block at a time: i = off + pos[0..k). Before that, ahead(i) for
  // the first kAhead of them (to prefetch what handling them will touch).
  // rare_pos: scratch of kScan8Block entries, diff_pos: of 2 * kScan8Block.
  //
  // Software-pipelined: the mismatches of a block are handled after the next block is scanned, so that what
  // ahead() fetches for them (per-column counters, scattered, that the streaming inputs keep evicting from the
  // caches) arrives while that scan runs, not while the handling waits for it.
  static constexpr size_t kAhead = 16;
  template <typename F, typename P>
  void scan8(const uint8_t* p, const uint8_t* q, size_t n, uint64_t* cls, uint16_t* rare_pos, uint16_t* diff_pos,
             F&& batch, P&& ahead) const {
    const uint16_t* pend = nullptr;  // the previous block's mismatches: positions, their count, the block's offset
    size_t pend_n = 0, pend_b = 0;
    auto handle = [&]() {
      if (pend_n) batch(pend, pend_n, pend_b);
    };
    int buf = 0;
    for (size_t b = 0; b < n; b += detail::kScan8Block) {
      const size_t m = std::min(detail::kScan8Block, n - b);
      detail::Scan8Result res;
      uint16_t* dp = diff_pos + buf * detail::kScan8Block;
      detail::scan8(scan_prm, p + b, q + b, m, rare_pos, dp, &res);
      // frequent codes by compare, rare (NaN/Inf) by lookup, the rest finite
      uint64_t special = 0;
      for (int k = 0; k < 4; ++k) {
        cls[freq_cls[k]] += res.freq[k];
        if (freq_cls[k] != kNumValueClasses) special += res.freq[k];
      }
      for (size_t k = 0; k < res.n_rare; ++k) {
        const int c = fmt.cls_lut[p[b + rare_pos[k]]];
        cls[c]++;
        if (c != kNumValueClasses) special++;
      }
      cls[static_cast<int>(ValueClass::finite)] += m - special;
      for (size_t k = 0; k < std::min(kAhead, res.n_diff); ++k) ahead(b + dp[k]);
      handle();
      pend = dp;
      pend_n = res.n_diff;
      pend_b = b;
      buf ^= 1;
    }
    handle();
  }

  // shared structure counters
  ZeroCounts row_cnt, block_cnt, sblock_cnt;
  // per chunk of the pass: the breakdown scan of its 1x128 groups, and its post-pass candidate groups (offsets from
  // the chunk's first group; empty when want_group_cands() is false)
  std::vector<UnitScan> group_scans;
  std::vector<std::vector<uint32_t>> group_cands;
  std::vector<uint64_t> group_cand_base;
  std::vector<double> chunk_abs, chunk_rel;
  Acc total;
  int H = 0, W = 0;
  std::vector<uint16_t> heat_col;  // heatmap column of each column

  void mismatch(Acc& acc, uint64_t flat, int64_t r, int64_t c, const std::vector<int64_t>& lead, int64_t sb_base,
                uint64_t eb, uint64_t ab, double& sum_abs, double& sum_rel) {
    const ValueClass ce = fmt.classify(eb), ca = fmt.classify(ab);
    acc.ce[static_cast<int>(ce)]++;
    acc.ca[static_cast<int>(ca)]++;
    acc.conf[static_cast<int>(ce)][static_cast<int>(ca)]++;
    acc.mismatches++;
    const bool fe = finite_class(ce), fa = finite_class(ca);
    Cand cand{0, 0, 0.0, flat};
    bool compatible = true;
    double abs_err = 0, ve = 0;
    if (fe && fa) {
      const uint64_t u = Fmt::distance(fmt.ordinal(eb), fmt.ordinal(ab));
      acc.hist[ulp_bucket(u)]++;
      acc.max_ulp = std::max(acc.max_ulp, u);
      ve = fmt.value(eb);
      const double va = fmt.value(ab);
      abs_err = std::fabs(va - ve);
      acc.finite_pairs++;
      sum_abs += abs_err;
      if (abs_err > acc.max_abs || (abs_err == acc.max_abs && flat < acc.max_abs_flat)) {
        acc.max_abs = abs_err;
        acc.max_abs_flat = flat;
      }
      if (ve != 0) {
        const double rel = abs_err / std::fabs(ve);
        acc.rel_pairs++;
        sum_rel += rel;
        if (rel > acc.max_rel || (rel == acc.max_rel && flat < acc.max_rel_flat)) {
          acc.max_rel = rel;
          acc.max_rel_flat = flat;
        }
      } else if (va != 0) {
        acc.rel_undefined++;
      }
      cand = Cand{0, u, abs_err, flat};
    } else {
      acc.no_distance++;
      if (!(ce == ValueClass::nan && ca == ValueClass::nan)) {
        acc.incompatible++;
        compatible = false;
      }
      cand = Cand{1, 0, 0.0, flat};
    }
    // tolerance
    bool viol = false;
    switch (tol.kind) {
      case Tolerance::Kind::exact: viol = true; break;
      case Tolerance::Kind::ulp: viol = !compatible || cand.ulp > tol.ulp; break;
      case Tolerance::Kind::absrel: viol = !compatible || (fe && fa && abs_err > tol.abs + tol.rel * std::fabs(ve)); break;
      case Tolerance::Kind::bound:
        viol = tol_bound_exact || !compatible || (fe && fa && abs_err > load_f64(*B, flat));
        break;
    }
    if (viol) acc.violations++;
    // class
    const int64_t sb = sc ? sb_base + (c / sc->block[rank - 1]) * sc->sstride[rank - 1] : -1;
    const Mismatch m = classify(flat, eb, ab, ce, ca, sb);
    acc.cls[static_cast<int>(m)]++;
    if (m == Mismatch::scale && sc && !is_scale_tensor) acc.scale_explained++;
    // structure: counted per item here, flushed to the shared arrays by flush_item()
    acc.item_mism++;
    count_group(acc, c);
    if (sc) acc.sb_local[c / sc->block[rank - 1] - acc.item_c0 / sc->block[rank - 1]]++;
    (void)r;
    if (acc.heat.empty()) acc.heat.assign(static_cast<size_t>(H) * W, 0);
    acc.heat[acc.item_heat_base + heat_col[static_cast<size_t>(c)]]++;
    if (rank > 0) {  // the leading dimensions: per item, in flush_item()
      if (acc.dims.empty()) acc.dims.assign(static_cast<size_t>(dim_total), 0);
      acc.dims[dim_off[rank - 1] + c]++;
    }
    (void)lead;
    offer(acc, cand);
  }

  // worst-K
  void offer(Acc& acc, const Cand& cand) const {
    if (opt.top_k == 0) return;
    if (acc.heap.size() < opt.top_k) {
      acc.heap.push(cand);
    } else if (worse(cand, acc.heap.top())) {
      acc.heap.pop();
      acc.heap.push(cand);
    }
  }

  // mismatch() for pure one-byte codes (pure_classes()): everything that depends on the two codes alone is counted
  // per key and per ULP distance (fold8() derives the class counts, the confusion table, the histogram and the
  // violations from them); per element only what depends on the position: the sums, maxima and worst-K (in element
  // order, as mismatch() does them) and the structure counts.
  // The mismatches at pe[pos[k]] != pa[pos[k]] (k < n, pos ascending), columns c0 + pos[k] of the row starting at
  // element row_flat. The running sums, maxima, the heatmap cell, the current group and the worst-K threshold are
  // kept in locals (registers) over the batch, written back at its end.
  void mismatch8(Acc& acc, const uint8_t* pe, const uint8_t* pa, int64_t c0, uint64_t row_flat, const uint16_t* pos,
                 size_t n, double& sum_abs, double& sum_rel) {
    double s_abs = sum_abs, s_rel = sum_rel;
    double mx_abs = acc.max_abs, mx_rel = acc.max_rel;
    uint64_t mx_abs_flat = acc.max_abs_flat, mx_rel_flat = acc.max_rel_flat, viol = 0;
    size_t heat_cur = acc.heat_cur;
    int64_t heat_next = acc.heat_next;
    uint64_t* const heat = acc.heat.data();
    uint64_t* const key_cnt = acc.key_cnt;
    uint64_t* const ulp_cnt = acc.ulp_cnt;
    int64_t gcur = -1;
    uint32_t gn = 0;
    if (acc.ngrp) {
      acc.ngrp--;
      gcur = acc.grp_g[acc.ngrp];
      gn = acc.grp_n[acc.ngrp];
    }
    const bool absrel = tol.kind == Tolerance::Kind::absrel;
    const bool cols_known = rank > 0;
    const size_t top_k = opt.top_k;
    bool full = top_k > 0 && acc.heap.size() >= top_k;
    Cand thr = full ? acc.heap.top() : Cand{0, 0, 0.0, 0};
    for (size_t k = 0; k < n; ++k) {
      const int64_t c = c0 + pos[k];
      const uint64_t flat = row_flat + static_cast<uint64_t>(c);
      const uint8_t eb = pe[pos[k]], ab = pa[pos[k]];
      const int key = key_e[eb] | key_a[ab];
      if (key_cnt[key]++ == 0) acc.key_rep[key] = static_cast<uint16_t>((eb << 8) | ab);
      Cand cand{1, 0, 0.0, flat};
      if (key_finite[key]) {
        const int d = ord8[eb] - ord8[ab];
        const uint64_t u = static_cast<uint64_t>(d < 0 ? -d : d);
        ulp_cnt[u]++;
        const double ve = fmt.lut[eb], va = fmt.lut[ab];
        const double abs_err = std::fabs(va - ve);
        s_abs += abs_err;
        if (abs_err > mx_abs || (abs_err == mx_abs && flat < mx_abs_flat)) {
          mx_abs = abs_err;
          mx_abs_flat = flat;
        }
        if (ve != 0) {
          const double rel = abs_err / std::fabs(ve);
          s_rel += rel;
          if (rel > mx_rel || (rel == mx_rel && flat < mx_rel_flat)) {
            mx_rel = rel;
            mx_rel_flat = flat;
          }
        }
        if (absrel && abs_err > tol.abs + tol.rel * std::fabs(ve)) viol++;
        cand = Cand{0, u, abs_err, flat};
      }
      if (top_k > 0 && (!full || worse(cand, thr))) {  // worst-K: offer() when the candidate can enter
        offer(acc, cand);
        full = acc.heap.size() >= top_k;
        if (full) thr = acc.heap.top();
      }
      // the 1x128 group (the columns come in increasing order)
      const int64_t g = c / 128;
      if (g != gcur) {
        if (gn) acc.push_group(gcur, gn);
        gcur = g;
        gn = 0;
      }
      gn++;
      // the heatmap cell: recomputed when c passes the current cell's last column, as c * W / cols, exact in doubles
      // (fast8(): c * W < 2^48, cols < 2^32), without heat_col's cache misses
      if (c >= heat_next) {
        const int64_t w = static_cast<int64_t>(static_cast<double>(c * W) / cols_d);
        heat_cur = acc.item_heat_base + static_cast<size_t>(w);
        heat_next = heat_bound[static_cast<size_t>(w) + 1];
      }
      heat[heat_cur]++;
      if (cols_known) {
        acc.colbuf[acc.ncol++] = static_cast<uint32_t>(c);
        if (acc.ncol == acc.colbuf.size()) flush_cols(acc);
      }
    }
    if (gn) acc.push_group(gcur, gn);
    acc.item_mism += n;
    acc.heat_cur = heat_cur;
    acc.heat_next = heat_next;
    acc.max_abs = mx_abs;
    acc.max_abs_flat = mx_abs_flat;
    acc.max_rel = mx_rel;
    acc.max_rel_flat = mx_rel_flat;
    acc.violations += viol;
    sum_abs = s_abs;
    sum_rel = s_rel;
  }
  void flush_cols(Acc& acc) const {
    uint64_t* d = acc.dims.data() + dim_off[rank - 1];
    for (size_t i = 0; i < acc.ncol; ++i) d[acc.colbuf[i]]++;
    acc.ncol = 0;
  }
  // mismatch8() applies: pure one-byte codes, columns and heatmap columns in range of its shortcuts
  bool fast8() const { return pure_classes() && cols <= int64_t{UINT32_MAX} && W <= 65535; }
  double cols_d = 1;
  std::vector<int64_t> heat_bound;  // heat_bound[w]: the first column of heatmap column w (w = 0..W)

  // The per-key and per-distance counts of mismatch8() into the fields mismatch() fills.
  void fold8(Acc& acc) const {
    for (int key = 0; key < 128; ++key) {
      const uint64_t n = acc.key_cnt[key];
      if (!n) continue;
      const int ce = key >> 4, ca = (key >> 1) & 7;
      const ValueClass vce = static_cast<ValueClass>(ce), vca = static_cast<ValueClass>(ca);
      acc.ce[ce] += n;
      acc.ca[ca] += n;
      acc.conf[ce][ca] += n;
      acc.mismatches += n;
      bool compatible = true;
      if (key_finite[key]) {
        acc.finite_pairs += n;
        if (!zero_class(vce)) acc.rel_pairs += n;       // value != 0
        else if (!zero_class(vca)) acc.rel_undefined += n;
      } else {
        acc.no_distance += n;
        if (!(vce == ValueClass::nan && vca == ValueClass::nan)) {
          acc.incompatible += n;
          compatible = false;
        }
      }
      const uint64_t eb = acc.key_rep[key] >> 8, ab = acc.key_rep[key] & 0xFF;
      acc.cls[static_cast<int>(classify(0, eb, ab, vce, vca, -1))] += n;
      switch (tol.kind) {
        case Tolerance::Kind::exact:
        case Tolerance::Kind::bound: acc.violations += n; break;  // bound: no bound tensor here, judged exact
        case Tolerance::Kind::ulp:
        case Tolerance::Kind::absrel: acc.violations += compatible ? 0 : n; break;  // finite pairs: below
      }
    }
    for (uint64_t u = 0; u < 256; ++u) {
      const uint64_t n = acc.ulp_cnt[u];
      if (!n) continue;
      acc.hist[ulp_bucket(u)] += n;
      acc.max_ulp = std::max(acc.max_ulp, u);
      if (tol.kind == Tolerance::Kind::ulp && u > tol.ulp) acc.violations += n;
    }
  }

  template <typename T>
  void run_pass() {
    const int64_t kSeg = 65536;
    const int64_t seg_len = std::min<int64_t>(cols, kSeg);
    const int64_t nseg = (cols + kSeg - 1) / kSeg;
    const int64_t items = rows * nseg;
    const int64_t per_chunk = std::max<int64_t>(1, kSeg / std::max<int64_t>(1, seg_len));
    const int64_t nchunks = (items + per_chunk - 1) / per_chunk;
    chunk_abs.assign(nchunks, 0.0);
    chunk_rel.assign(nchunks, 0.0);
    const T* e = reinterpret_cast<const T*>(E.bytes);
    const T* a = reinterpret_cast<const T*>(A.bytes);
    const int nt = opt.threads > 0 ? opt.threads : omp_get_max_threads();
    const std::vector<int64_t> lead_shape(shape.begin(), shape.end() - (rank > 0 ? 1 : 0));
    const bool fast = sizeof(T) == 1 && fast8();
    if (sizeof(T) == 1) setup_pure8();  // (group_candidate() uses its finite_nonzero8 on every one-byte path)
    cols_d = static_cast<double>(cols);
    if (fast) {
      heat_bound.resize(static_cast<size_t>(W) + 1);
      for (int64_t w = 0; w <= W; ++w) heat_bound[static_cast<size_t>(w)] = (w * cols + W - 1) / W;  // ceil(w * cols / W)
    }
    group_scans.assign(static_cast<size_t>(nchunks), UnitScan{});
    if (want_group_cands()) {
      group_cands.assign(static_cast<size_t>(nchunks), {});
      group_cand_base.assign(static_cast<size_t>(nchunks), 0);
    } else {
      group_cands.clear();
    }
#pragma omp parallel num_threads(nt)
    {
      Acc acc;
      UnitScanner groups;
      acc.groups = &groups;
      std::vector<int64_t> lead;
      std::vector<uint16_t> rare_pos(sizeof(T) == 1 ? detail::kScan8Block : 0), diff_pos(2 * rare_pos.size());
      if (fast && rank > 0) acc.colbuf.resize(size_t{1} << 14);
#pragma omp for schedule(dynamic, 1)
      for (int64_t ch = 0; ch < nchunks; ++ch) {
        double sum_abs = 0, sum_rel = 0;
        const int64_t i1 = std::min(items, (ch + 1) * per_chunk);
        groups.start(&group_scans[static_cast<size_t>(ch)]);
        if (!group_cands.empty()) {
          acc.cands = &group_cands[static_cast<size_t>(ch)];
          const int64_t it0 = ch * per_chunk;
          acc.cand_base = group_cand_base[static_cast<size_t>(ch)] =
              static_cast<uint64_t>((it0 / nseg) * gcols + ((it0 % nseg) * kSeg) / 128);
        }
        for (int64_t it = ch * per_chunk; it < i1; ++it) {
          const int64_t r = it / nseg, c0 = (it % nseg) * kSeg, c1 = std::min(cols, c0 + kSeg);
          bool have_lead = false;
          int64_t sb_base = 0;
          const uint64_t base = static_cast<uint64_t>(r) * cols;
          begin_item(acc, r, c0, c1);
          auto get_lead = [&]() {
            unravel_into(static_cast<uint64_t>(r), lead_shape, lead);  // no allocation per row
            if (sc) {
              sb_base = 0;
              for (int d = 0; d + 1 < rank; ++d) sb_base += (lead[d] / sc->block[d]) * sc->sstride[d];
            }
            have_lead = true;
            if (fast) {
              if (acc.heat.empty()) acc.heat.assign(static_cast<size_t>(H) * W, 0);
              if (acc.dims.empty()) acc.dims.assign(static_cast<size_t>(dim_total), 0);
            }
          };
          auto one = [&](int64_t c) {
            const uint64_t eb = e[base + c], ab = a[base + c];
            if (eb == ab) {
              if (sizeof(T) != 1) acc.equal_cls[static_cast<int>(fmt.classify(eb))]++;
              return;
            }
            if (!have_lead) get_lead();
            mismatch(acc, base + c, r, c, lead, sb_base, eb, ab, sum_abs, sum_rel);
          };
          if (sizeof(T) == 1) {
            // one-byte codes: classes of every expected code counted in vectors; equal bytes skipped in 16s
            const uint8_t* pe = reinterpret_cast<const uint8_t*>(e + base + c0);
            const uint8_t* pa = reinterpret_cast<const uint8_t*>(a + base + c0);
            auto ahead = [&](size_t k) {
              if (fast) return;  // mismatch8() touches nothing scattered
              const size_t c = static_cast<size_t>(c0) + k;
              __builtin_prefetch(&heat_col[c]);
              if (!acc.dims.empty()) __builtin_prefetch(&acc.dims[static_cast<size_t>(dim_off[rank - 1]) + c], 1);
            };
            auto batch = [&](const uint16_t* pos, size_t k, size_t off) {
              if (fast) {
                if (!have_lead) get_lead();
                mismatch8(acc, pe + off, pa + off, c0 + static_cast<int64_t>(off), base, pos, k, sum_abs, sum_rel);
                return;
              }
              for (size_t j = 0; j < k; ++j) {
                if (j + kAhead < k) ahead(off + pos[j + kAhead]);
                one(c0 + static_cast<int64_t>(off + pos[j]));
              }
            };
            scan8(pe, pa, static_cast<size_t>(c1 - c0), acc.all_cls, rare_pos.data(), diff_pos.data(), batch, ahead);
          } else {
            for (int64_t c = c0; c < c1; ++c) one(c);
          }
          flush_item<T>(acc, r, sb_base, lead);
        }
        groups.finish();
        chunk_abs[ch] = sum_abs;
        chunk_rel[ch] = sum_rel;
      }
      if (fast) {
        if (acc.ncol) flush_cols(acc);
        fold8(acc);
      }
#pragma omp critical(fp8ref_diff_merge)
      merge(acc);
    }
  }

  void merge(Acc& acc) {
    Acc& t = total;
    for (int i = 0; i < kNumValueClasses; ++i) {
      // 1-byte formats count every expected code; the equal ones are those minus the mismatching ones
      t.equal_cls[i] += fmt.size == 1 ? acc.all_cls[i] - acc.ce[i] : acc.equal_cls[i];
      t.ce[i] += acc.ce[i];
      t.ca[i] += acc.ca[i];
      for (int j = 0; j < kNumValueClasses; ++j) t.conf[i][j] += acc.conf[i][j];
    }
    for (int i = 0; i < kBuckets; ++i) t.hist[i] += acc.hist[i];
    t.mismatches += acc.mismatches;
    t.no_distance += acc.no_distance;
    t.incompatible += acc.incompatible;
    t.max_ulp = std::max(t.max_ulp, acc.max_ulp);
    t.finite_pairs += acc.finite_pairs;
    t.rel_pairs += acc.rel_pairs;
    t.rel_undefined += acc.rel_undefined;
    if (acc.max_abs > t.max_abs || (acc.max_abs == t.max_abs && acc.max_abs_flat < t.max_abs_flat)) {
      t.max_abs = acc.max_abs;
      t.max_abs_flat = acc.max_abs_flat;
    }
    if (acc.max_rel > t.max_rel || (acc.max_rel == t.max_rel && acc.max_rel_flat < t.max_rel_flat)) {
      t.max_rel = acc.max_rel;
      t.max_rel_flat = acc.max_rel_flat;
    }
    for (int i = 0; i < kNumMismatchClasses; ++i) t.cls[i] += acc.cls[i];
    t.violations += acc.violations;
    t.scale_explained += acc.scale_explained;
    while (!acc.heap.empty()) {
      const Cand c = acc.heap.top();
      acc.heap.pop();
      if (t.heap.size() < opt.top_k) {
        t.heap.push(c);
      } else if (worse(c, t.heap.top())) {
        t.heap.pop();
        t.heap.push(c);
      }
    }
    for (size_t i = 0; i < acc.blk.size(); ++i) block_cnt[i] += acc.blk[i];
    for (size_t i = 0; i < acc.sblk.size(); ++i) sblock_cnt[i] += acc.sblk[i];
    if (!acc.heat.empty()) {
      if (t.heat.empty()) t.heat.assign(acc.heat.size(), 0);
      for (size_t i = 0; i < acc.heat.size(); ++i) t.heat[i] += acc.heat[i];
    }
    if (!acc.dims.empty()) {
      if (t.dims.empty()) t.dims.assign(acc.dims.size(), 0);
      for (size_t i = 0; i < acc.dims.size(); ++i) t.dims[i] += acc.dims[i];
    }
  }

  // ---- post-pass: blocks off by one common factor ----
  struct BlockFactor {
    uint64_t block;
    double factor;
  };
  std::vector<BlockFactor> factor_blocks;  // sorted by block
  std::string factor_unit;                 // "scale block" or "group 1x128"
  std::vector<int64_t> factor_block_shape;

  // Iterates the flats of the box lo..hi (inclusive-exclusive per dim) while fn returns true.
  template <typename F>
  void for_box(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, std::vector<int64_t>& idx, F&& fn) const {
    if (rank == 0) {
      fn(0);
      return;
    }
    for (int d = 0; d < rank; ++d)
      if (lo[d] >= hi[d]) return;
    idx = lo;
    while (true) {
      uint64_t flat = 0;
      for (int d = 0; d < rank; ++d) flat = flat * shape[d] + idx[d];
      for (int64_t c = lo[rank - 1]; c < hi[rank - 1]; ++c)
        if (!fn(flat + (c - lo[rank - 1]))) return;
      int d = rank - 2;
      for (; d >= 0; --d) {
        if (++idx[d] < hi[d]) break;
        idx[d] = lo[d];
      }
      if (d < 0) return;
    }
  }

  void post_pass() {
    if (total.cls[static_cast<int>(Mismatch::wrong)] == 0 || is_scale_tensor || fmt.kind != Fmt::Kind::fp ||
        fmt.format == Format::ue8m0 || rank == 0)
      return;
    // the blocks: the attached scale's, else the 1x128 groups
    const bool use_scale = sc != nullptr;
    std::vector<int64_t> bshape(rank, 1);
    if (use_scale) bshape = sc->block;
    else bshape[rank - 1] = 128;
    factor_unit = use_scale ? "scale block" : "group 1x128";
    factor_block_shape = bshape;
    std::vector<int64_t> nb(rank);
    for (int d = 0; d < rank; ++d) nb[d] = (shape[d] + bshape[d] - 1) / bshape[d];
    const double u = std::ldexp(1.0, -(fmt.man_bits + 1));
    const double band = ((1 + u) / (1 - u)) * ((1 + u) / (1 - u));
    uint64_t moved = 0;
    std::vector<BlockFactor> found;
#pragma omp parallel num_threads(opt.threads > 0 ? opt.threads : omp_get_max_threads())
    {
      std::vector<BlockFactor> local;
      uint64_t local_moved = 0;
      std::vector<int64_t> bi(rank), lo(rank), hi(rank), idx(rank);  // reused: no allocation per block
      // The candidates of each job first (scale blocks: a run of kChunk blocks with >= 2 mismatches; 1x128 groups:
      // those the pass collected in one of its chunks, see group_candidate()), then the blocks, each one's first
      // element fetched a few candidates ahead (they are scattered over the inputs).
      constexpr size_t kChunk = 4096, kAhead = 4;
      const size_t nchunks = use_scale ? (sblock_cnt.size() + kChunk - 1) / kChunk : group_cands.size();
      std::vector<size_t> cand;
      auto prefetch_block = [&](size_t k) {
        uint64_t f = k, flat = 0, stride = 1;
        for (int d = rank - 1; d >= 0; --d) {
          flat += (f % static_cast<uint64_t>(nb[d])) * static_cast<uint64_t>(bshape[d]) * stride;
          f /= static_cast<uint64_t>(nb[d]);
          stride *= static_cast<uint64_t>(shape[d]);
        }
        __builtin_prefetch(E.bytes + flat * fmt.size);
        __builtin_prefetch(A.bytes + flat * fmt.size);
      };
#pragma omp for schedule(dynamic, 1)
      for (size_t j = 0; j < nchunks; ++j) {
        cand.clear();
        if (use_scale) {
          for (size_t k = j * kChunk; k < std::min(sblock_cnt.size(), (j + 1) * kChunk); ++k)
            if (sblock_cnt[k] >= 2) cand.push_back(k);  // a common factor needs >= 2 changed elements; changed <= mismatches
        } else {
          for (uint32_t off : group_cands[j]) cand.push_back(static_cast<size_t>(group_cand_base[j] + off));
        }
        for (size_t ci = 0; ci < std::min(kAhead, cand.size()); ++ci) prefetch_block(cand[ci]);
        for (size_t ci = 0; ci < cand.size(); ++ci) {
        if (ci + kAhead < cand.size()) prefetch_block(cand[ci + kAhead]);
        const size_t k = cand[ci];
        const uint64_t b = static_cast<uint64_t>(k);
        {
          uint64_t f = b;
          for (int d = rank - 1; d >= 0; --d) {
            bi[d] = static_cast<int64_t>(f % static_cast<uint64_t>(nb[d]));
            f /= static_cast<uint64_t>(nb[d]);
          }
        }
        for (int d = 0; d < rank; ++d) {
          lo[d] = bi[d] * bshape[d];
          hi[d] = std::min(shape[d], lo[d] + bshape[d]);
        }
        bool broken = false;
        uint64_t changed = 0, wrong = 0, nratio = 0;
        double rmin = HUGE_VAL, rmax = 0;
        for_box(lo, hi, idx, [&](uint64_t flat) {
          const uint64_t eb = load(E, flat, fmt.size), ab = load(A, flat, fmt.size);
          const ValueClass ce = fmt.classify(eb), ca = fmt.classify(ab);
          if (!finite_class(ce) || !finite_class(ca)) return true;  // specials are classified on their own
          const bool ze = zero_class(ce), za = zero_class(ca);
          if (ze && za) return true;
          if (eb == ab) return !(broken = true);  // a nonzero element the factor left alone
          ++changed;
          if (ze || za) {
            if (!(fmt.is_subnormal(ze ? ab : eb))) broken = true;  // only underflow may cross zero
          } else if (!fmt.is_subnormal(eb) && !fmt.is_subnormal(ab)) {
            const double r = fmt.value(ab) / fmt.value(eb);
            if (!(r > 0)) return !(broken = true);
            rmin = std::min(rmin, r);
            rmax = std::max(rmax, r);
            ++nratio;
            if (rmax / rmin > band || (rmin <= 1 && rmax >= 1)) broken = true;
          }
          return !broken;
        });
        if (broken || changed < 2 || nratio == 0) continue;
        // a common factor: the block's unexplained ("wrong") mismatches become scale errors
        for_box(lo, hi, idx, [&](uint64_t flat) {
          const uint64_t eb = load(E, flat, fmt.size), ab = load(A, flat, fmt.size);
          if (eb == ab) return true;
          const int64_t sb = use_scale ? static_cast<int64_t>(b) : (sc ? scale_block_of(unravel(flat, shape)) : -1);
          if (classify(flat, eb, ab, fmt.classify(eb), fmt.classify(ab), sb) == Mismatch::wrong) ++wrong;
          return true;
        });
        if (wrong == 0) continue;
        double f = std::sqrt(rmin * rmax);
        // a power of two inside the band is the factor
        const double p = std::exp2(std::round(std::log2(f)));
        if (p >= rmin / (1 + u) / (1 + u) && p <= rmax * (1 + u) * (1 + u) && rmax / rmin <= (1 + u) * (1 + u)) f = p;
        if (rmin == rmax) f = rmin;
        local.push_back({b, f});
        local_moved += wrong;
        }
      }
#pragma omp critical(fp8ref_diff_post)
      {
        found.insert(found.end(), local.begin(), local.end());
        moved += local_moved;
      }
    }
    std::sort(found.begin(), found.end(), [](const BlockFactor& x, const BlockFactor& y) { return x.block < y.block; });
    factor_blocks = std::move(found);
    total.cls[static_cast<int>(Mismatch::wrong)] -= moved;
    total.cls[static_cast<int>(Mismatch::scale)] += moved;
  }

  bool in_factor_block(uint64_t flat) const {
    if (factor_blocks.empty()) return false;
    const std::vector<int64_t> idx = unravel(flat, shape);
    uint64_t b = 0;
    for (int d = 0; d < rank; ++d) {
      const int64_t nb = (shape[d] + factor_block_shape[d] - 1) / factor_block_shape[d];
      b = b * nb + idx[d] / factor_block_shape[d];
    }
    return std::binary_search(factor_blocks.begin(), factor_blocks.end(), BlockFactor{b, 0},
                              [](const BlockFactor& x, const BlockFactor& y) { return x.block < y.block; });
  }

  void run(TensorReport& rep) {
    H = static_cast<int>(std::min<int64_t>(std::max(1, opt.heatmap_rows), rows));
    W = static_cast<int>(std::min<int64_t>(std::max(1, opt.heatmap_cols), cols));
    if (numel > 0) {
      heat_col.resize(static_cast<size_t>(cols));
      for (int64_t c = 0; c < cols; ++c) heat_col[c] = static_cast<uint16_t>(c * W / cols);
      row_cnt.assign(rows, 0);
      block_cnt.assign(static_cast<size_t>(brows * bcols), 0);
      if (sc) sblock_cnt.assign(sc->differs.size(), 0);
      switch (fmt.size) {
        case 1: run_pass<uint8_t>(); break;
        case 2: run_pass<uint16_t>(); break;
        case 4: run_pass<uint32_t>(); break;
        default: run_pass<uint64_t>(); break;
      }
      post_pass();
    }
    fill(rep);
  }

  // ---- the report ----
  // A breakdown scans one counter per unit: the units with mismatches, the top 8 (most mismatches first, lower unit
  // first on ties) and the first 16 runs of consecutive affected units. Large arrays (millions of 1x128 groups) are
  // scanned in slices in parallel and merged; the result is the same.
  static constexpr size_t kParallelUnits = size_t{1} << 20;

  static void scan_units(const uint32_t* cnt, size_t lo, size_t hi, UnitScan& s) {
    UnitScanner u;
    u.start(&s);
    for (size_t i = lo; i < hi; ++i)
      if (cnt[i]) u.add(i, cnt[i]);
    u.finish();
  }

  Breakdown breakdown(const std::string& name, const uint32_t* cnt, size_t units, uint64_t unit_elements) const {
    const int nt = opt.threads > 0 ? opt.threads : omp_get_max_threads();
    const size_t nslices = units >= kParallelUnits && nt > 1 ? static_cast<size_t>(nt) * 4 : 1;
    std::vector<UnitScan> sl(nslices);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nslices > 1)
    for (size_t k = 0; k < nslices; ++k) scan_units(cnt, units * k / nslices, units * (k + 1) / nslices, sl[k]);
    return merge_scans(name, units, unit_elements, sl);
  }

  static Breakdown merge_scans(const std::string& name, size_t units, uint64_t unit_elements, const std::vector<UnitScan>& sl) {
    Breakdown b;
    b.name = name;
    b.units = units;
    b.unit_elements = unit_elements;
    std::vector<UnitCount> top;
    std::vector<std::pair<int64_t, int64_t>> runs;
    bool overflow = false;
    for (const UnitScan& s : sl) {
      b.units_with_mismatch += s.nonzero;
      top.insert(top.end(), s.top.begin(), s.top.end());
      for (const auto& r : s.runs) {
        if (!runs.empty() && runs.back().second + 1 == r.first) runs.back().second = r.second;  // across slices
        else if (runs.size() < 17) runs.push_back(r);  // 17 runs: truncated, and later ones join the 17th at most
        else overflow = true;
      }
      overflow = overflow || s.more_runs;
    }
    const size_t ntop = std::min<size_t>(top.size(), 8);
    std::partial_sort(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(ntop), top.end(), better);
    for (size_t i = 0; i < ntop; ++i) b.top.push_back({top[i].second, top[i].first});
    b.ranges.assign(runs.begin(), runs.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(runs.size(), 16)));
    b.ranges_truncated = runs.size() > 16 || overflow;
    return b;
  }

  std::string group_name(uint64_t g) const {
    const int64_t r = static_cast<int64_t>(g) / gcols, c0 = (static_cast<int64_t>(g) % gcols) * 128;
    return "row " + std::to_string(r) + ", cols " + std::to_string(c0) + "-" + std::to_string(std::min(cols, c0 + 128) - 1);
  }

  void fill(TensorReport& rep) {
    const Acc& t = total;
    rep.compared = true;
    // 3. specials
    SpecialsSection& sp = rep.specials;
    for (int i = 0; i < kNumValueClasses; ++i) {
      sp.expected[i] = t.ce[i] + t.equal_cls[i];
      sp.actual[i] = t.ca[i] + t.equal_cls[i];
      for (int j = 0; j < kNumValueClasses; ++j) {
        sp.confusion[i][j] = t.conf[i][j] + (i == j ? t.equal_cls[i] : 0);
        if (i != j && t.conf[i][j]) sp.differ = true;
      }
    }
    // 4. metrics
    MetricsSection& m = rep.metrics;
    m.numel = numel;
    m.bitwise_equal = numel - t.mismatches;
    m.no_distance = t.no_distance;
    m.incompatible = t.incompatible;
    m.max_ulp = t.max_ulp;
    uint64_t equal_finite = 0, equal_nonzero = 0;
    for (int i = 0; i < kNumValueClasses; ++i) {
      const ValueClass c = static_cast<ValueClass>(i);
      if (finite_class(c)) equal_finite += t.equal_cls[i];
      if (finite_class(c) && !zero_class(c)) equal_nonzero += t.equal_cls[i];
    }
    uint64_t hist0 = t.hist[0] + m.bitwise_equal;
    for (int b = 0; b < kBuckets; ++b) {
      const uint64_t v = b == 0 ? hist0 : t.hist[b];
      if (v) m.ulp_histogram.push_back({bucket_name(b), v});
    }
    if (t.no_distance) m.ulp_histogram.push_back({"n/a", t.no_distance});
    m.finite_pairs = t.finite_pairs + equal_finite;
    m.rel_pairs = t.rel_pairs + equal_nonzero;
    m.rel_undefined = t.rel_undefined;
    double sa = 0, sr = 0;
    for (size_t i = 0; i < chunk_abs.size(); ++i) {
      sa += chunk_abs[i];
      sr += chunk_rel[i];
    }
    m.max_abs = std::max(0.0, t.max_abs);
    m.max_abs_flat = t.max_abs_flat;
    m.mean_abs = m.finite_pairs ? sa / static_cast<double>(m.finite_pairs) : 0;
    m.max_rel = std::max(0.0, t.max_rel);
    m.max_rel_flat = t.max_rel_flat;
    m.mean_rel = m.rel_pairs ? sr / static_cast<double>(m.rel_pairs) : 0;
    {
      std::vector<Cand> w;
      auto heap = t.heap;
      while (!heap.empty()) {
        w.push_back(heap.top());
        heap.pop();
      }
      std::sort(w.begin(), w.end(), worse);
      for (const Cand& c : w) {
        WorstElement we;
        we.flat = c.flat;
        we.index = unravel(c.flat, shape);
        we.expected_bits = load(E, c.flat, fmt.size);
        we.actual_bits = load(A, c.flat, fmt.size);
        we.expected = fmt.value(we.expected_bits);
        we.actual = fmt.value(we.actual_bits);
        if (X) we.exact = load_f64(*X, c.flat);
        const ValueClass ce = fmt.classify(we.expected_bits), ca = fmt.classify(we.actual_bits);
        if (finite_class(ce) && finite_class(ca)) {
          we.ulp = c.ulp;
          we.abs_err = std::fabs(we.actual - we.expected);
          we.rel_err = we.expected != 0 ? we.abs_err / std::fabs(we.expected) : (we.abs_err == 0 ? 0 : HUGE_VAL);
        } else {
          we.abs_err = we.rel_err = std::nan("");
        }
        we.cls = classify(c.flat, we.expected_bits, we.actual_bits, ce, ca, sc ? scale_block_of(we.index) : -1);
        if (we.cls == Mismatch::wrong && in_factor_block(c.flat)) we.cls = Mismatch::scale;
        m.worst.push_back(std::move(we));
      }
    }
    // 5. structure
    StructureSection& s = rep.structure;
    s.rows = rows;
    s.cols = cols;
    if (t.mismatches) {
      s.breakdowns.push_back(breakdown("row", row_cnt.data(), row_cnt.size(), static_cast<uint64_t>(cols)));
      if (!is_scale_tensor) {  // a scale tensor's own 1x128 groups mean nothing
        s.breakdowns.push_back(merge_scans("group 1x128", static_cast<size_t>(rows * gcols), 0, group_scans));
        s.breakdowns.push_back(breakdown("block 128x128", block_cnt.data(), block_cnt.size(), 0));
      }
      std::vector<uint32_t> tmp;
      for (int d = 0; d < rank; ++d) {
        const std::string name = d < static_cast<int>(rep.dims.size()) ? rep.dims[d] : "d" + std::to_string(d);
        tmp.assign(static_cast<size_t>(shape[d]), 0);
        for (int64_t i = 0; i < shape[d]; ++i)
          tmp[i] = static_cast<uint32_t>(std::min<uint64_t>(UINT32_MAX, t.dims.empty() ? 0 : t.dims[dim_off[d] + i]));
        Breakdown b = breakdown("dim " + name, tmp.data(), tmp.size(), numel / std::max<int64_t>(1, shape[d]));
        s.breakdowns.push_back(std::move(b));
        if (d == 0 && segments && !segments->empty() && segments->back() == shape[0]) {
          // dimension 0 in segments (a paged attention output's tokens by sequence: query_start_loc)
          std::vector<uint32_t> seg(segments->size() - 1, 0);
          for (size_t q = 0; q + 1 < segments->size(); ++q)
            for (int64_t i = (*segments)[q]; i < (*segments)[q + 1]; ++i)
              seg[q] = static_cast<uint32_t>(std::min<uint64_t>(UINT32_MAX, uint64_t{seg[q]} + tmp[static_cast<size_t>(i)]));
          s.breakdowns.push_back(breakdown(segment_name, seg.data(), seg.size(), 0));
        }
      }
      // heatmap
      s.heat_rows = H;
      s.heat_cols = W;
      std::vector<uint64_t> rc(H, 0), cc(W, 0);
      for (int64_t r = 0; r < rows; ++r) rc[r * H / rows]++;
      for (int64_t c = 0; c < cols; ++c) cc[c * W / cols]++;
      for (int h = 0; h < H; ++h) {
        std::string line;
        for (int w = 0; w < W; ++w) {
          const uint64_t n = t.heat.empty() ? 0 : t.heat[static_cast<size_t>(h) * W + w];
          const uint64_t tot = rc[h] * cc[w];
          char ch = '.';
          if (n && n >= tot) ch = '#';
          else if (n) ch = static_cast<char>('0' + std::clamp<int>(static_cast<int>(std::ceil(10.0 * n / tot)), 1, 9));
          line += ch;
        }
        s.heatmap.push_back(line);
      }
      char buf[96];
      std::snprintf(buf, sizeof buf, "each cell %s%lld rows x %s%lld cols", rows % H ? "~" : "",
                    static_cast<long long>((rows + H - 1) / H), cols % W ? "~" : "",
                    static_cast<long long>((cols + W - 1) / W));
      s.cell = buf;
      // transposed values (square 2-D outputs)
      if (rank == 2 && rows == cols && rows > 1) {
        bool eq = true;
        for (int64_t i = 0; i < rows && eq; ++i)
          for (int64_t j = 0; j < cols && eq; ++j)
            eq = std::memcmp(E.bytes + (i * cols + j) * fmt.size, A.bytes + (j * cols + i) * fmt.size,
                             fmt.size) == 0;
        if (eq) s.notes.push_back("ACTUAL equals EXPECTED transposed (a transposed output)");
      }
    }
    // 6. classes
    ClassSection& cl = rep.classes;
    for (int i = 0; i < kNumMismatchClasses; ++i) cl.counts[i] = t.cls[i];
    cl.exact_available = X != nullptr;
    cl.bound_available = B != nullptr;
    cl.scale_blocks = factor_blocks.size();
    for (size_t i = 0; i < factor_blocks.size() && i < 8; ++i) {
      const BlockFactor& bf = factor_blocks[i];
      std::string where;
      if (factor_unit == "group 1x128") {
        where = "group " + std::to_string(bf.block) + " (" + group_name(bf.block) + ")";
      } else {
        std::vector<int64_t> nb(rank);
        for (int d = 0; d < rank; ++d) nb[d] = (shape[d] + factor_block_shape[d] - 1) / factor_block_shape[d];
        const std::vector<int64_t> bi = unravel(bf.block, nb);
        where = "scale block " + detail::index_string(bi) + " (" + rep.name + "[";
        for (int d = 0; d < rank; ++d)
          where += (d ? ", " : "") + std::to_string(bi[d] * factor_block_shape[d]) + ":" +
                   std::to_string(std::min(shape[d], (bi[d] + 1) * factor_block_shape[d]));
        where += "])";
      }
      cl.scale_block_examples.push_back(where + ": " + detail::factor_string(bf.factor, false));
    }
    if (!factor_blocks.empty())
      s.notes.push_back(std::to_string(factor_blocks.size()) + " " + factor_unit +
                        (factor_blocks.size() == 1 ? "" : "s") + " off by one common factor (scale error)");
    if (sc) rep.scale.data_explained = t.scale_explained;
    // 7. tolerance
    rep.tol = tol;
    if (tol_bound_exact) rep.tol_note = "no derived bound for this output (no bound tensor in EXPECTED): judged exact";
    rep.tol_violations = t.violations;
    const uint64_t mism = t.mismatches;
    switch (tol.kind) {
      case Tolerance::Kind::exact: rep.tol_pass = mism == 0; break;
      case Tolerance::Kind::ulp:
        rep.tol_pass = t.incompatible == 0 && t.max_ulp <= tol.ulp &&
                       static_cast<double>(mism) <= tol.frac * static_cast<double>(numel);
        break;
      default: rep.tol_pass = t.violations == 0; break;
    }
    if (mism == 0) {
      rep.min_tolerance = "exact";
    } else if (t.incompatible) {
      rep.min_tolerance = "none (" + std::to_string(t.incompatible) + " element" + (t.incompatible == 1 ? "" : "s") +
                          " change special-value class)";
    } else {
      const double frac = static_cast<double>(mism) / static_cast<double>(numel);
      rep.min_tolerance = "ulp:" + std::to_string(t.max_ulp) + (frac < 1 ? ",frac:" + detail::round_up_2(frac) : "");
      if (m.max_abs > 0) rep.min_tolerance_alternatives.push_back("abs:" + detail::round_up_2(m.max_abs) + ",rel:0");
      if (t.rel_undefined == 0 && m.max_rel > 0) rep.min_tolerance_alternatives.push_back("abs:0,rel:" + detail::round_up_2(m.max_rel));
    }
    // 8. trust
    const double n = static_cast<double>(std::max<uint64_t>(1, numel));
    const double zeros = (sp.expected[static_cast<int>(ValueClass::pos_zero)] + sp.expected[static_cast<int>(ValueClass::neg_zero)]) / n;
    const double sat = (sp.expected[static_cast<int>(ValueClass::pos_max)] + sp.expected[static_cast<int>(ValueClass::neg_max)]) / n;
    const double nan = sp.expected[static_cast<int>(ValueClass::nan)] / n;
    auto pct = [](double f) {
      char b[32];
      std::snprintf(b, sizeof b, "%.1f%%", 100 * f);
      return std::string(b);
    };
    std::vector<std::string> why;
    if (zeros > 0.9) why.push_back("zeros " + pct(zeros) + " > 90%");
    if (sat > 0.5) why.push_back("saturated (±max) " + pct(sat) + " > 50%");
    if (nan > 0.5) why.push_back("NaN " + pct(nan) + " > 50%");
    rep.mistrusted = !why.empty() && numel > 0;
    if (rep.mistrusted) {
      rep.trust_note = "EXPECTED is ";
      for (size_t i = 0; i < why.size(); ++i) rep.trust_note += (i ? "; " : "") + why[i];
      rep.trust_note += ": the data cannot show much";
    } else {
      rep.trust_note = "zeros " + pct(zeros) + ", saturated " + pct(sat) + ", NaN " + pct(nan);
    }
  }
};

// ---- scale tensors ------------------------------------------------------------------------------------------

void fill_scale_section(TensorReport& rep, const io::TensorView& se, const io::TensorView& sa, const std::vector<int64_t>& block,
                        const std::string& of, const std::vector<int64_t>* data_shape) {
  ScaleSection& s = rep.scale;
  s.present = true;
  s.is_scale = true;
  s.tensor = of;
  s.block = block;
  const Fmt f(se.dtype);
  const uint64_t n = static_cast<uint64_t>(se.numel());
  s.blocks = n;
  // a block's index in the grid of blocks over the data (a flat scale tensor's elements are the grid's, in order)
  const std::vector<int64_t> grid = data_shape ? block_grid(*data_shape, block) : se.shape;
  std::unordered_map<uint64_t, uint64_t> first_of;  // expected bits -> first block carrying them
  first_of.reserve(static_cast<size_t>(std::min<uint64_t>(n, 1 << 20)));
  for (uint64_t i = 0; i < n; ++i) first_of.emplace(load(se, i, f.size), i);
  std::map<double, uint64_t> factors;
  uint64_t nan_factors = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t eb = load(se, i, f.size), ab = load(sa, i, f.size);
    if (eb == ab) continue;
    s.blocks_differing++;
    const double ve = f.value(eb), va = f.value(ab);
    const double factor = va / ve;
    if (std::isnan(factor)) nan_factors++;
    else factors[factor]++;
    std::optional<uint64_t> other;
    auto it = first_of.find(ab);  // (a NaN or Inf is no block's scale in particular)
    if (it != first_of.end() && it->second != i && std::isfinite(va)) other = it->second;
    if (other) s.from_other_block++;
    if (s.listed.size() < 16) {
      ScaleBlockDiff d;
      d.flat = i;
      d.index = unravel(i, grid);
      if (data_shape && data_shape->size() == block.size())
        for (size_t k = 0; k < block.size(); ++k)
          d.covers.push_back({d.index[k] * block[k], std::min((*data_shape)[k], (d.index[k] + 1) * block[k])});
      d.expected_bits = eb;
      d.actual_bits = ab;
      d.expected = ve;
      d.actual = va;
      d.factor = factor;
      d.other_block = other;
      if (other) d.other_index = unravel(*other, grid);
      s.listed.push_back(std::move(d));
    }
  }
  std::vector<std::pair<double, uint64_t>> fv(factors.begin(), factors.end());
  if (nan_factors) fv.push_back({std::nan(""), nan_factors});
  std::stable_sort(fv.begin(), fv.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  if (fv.size() > 8) fv.resize(8);
  s.factors = fv;
}

std::string dtype_shape(const io::TensorView& t) { return std::string(io::dtype_name(t.dtype)) + " " + detail::shape_string(t.shape); }

void summarize(TensorReport& r, const DiffOptions& o) {
  char buf[512];
  std::string s = r.name + "  " + to_string(r.verdict) + "  ";
  switch (r.presence) {
    case TensorReport::Presence::missing: r.summary = s + "missing in " + o.actual_name; return;
    case TensorReport::Presence::extra: r.summary = s + "extra in " + o.actual_name + " (not in " + o.expected_name + ")"; return;
    case TensorReport::Presence::dtype_mismatch:
    case TensorReport::Presence::shape_mismatch:
    case TensorReport::Presence::transposed: r.summary = s + r.presence_note; return;
    case TensorReport::Presence::ok: break;
  }
  const MetricsSection& m = r.metrics;
  const uint64_t diff = m.numel - m.bitwise_equal;
  // the bit-equal share to 4 significant digits, or as many more as it takes not to read 100% while any differs
  char pct[32] = "100";
  if (m.numel) {
    const double p = 100.0 * static_cast<double>(m.bitwise_equal) / static_cast<double>(m.numel);
    for (int digits = 4; digits <= 17; ++digits) {
      std::snprintf(pct, sizeof pct, "%.*g", digits, p);
      if (diff == 0 || std::strtod(pct, nullptr) < 100.0) break;
    }
  }
  std::snprintf(buf, sizeof buf, "%s %s  bitwise %s%% (%llu of %llu differ)", r.format.c_str(),
                detail::shape_string(r.expected_shape).c_str(), pct, static_cast<unsigned long long>(diff),
                static_cast<unsigned long long>(m.numel));
  s += buf;
  if (diff) {
    s += m.max_ulp ? "  max " + std::to_string(m.max_ulp) + " ULP" : std::string("  no ULP distance (NaN codes, ±0, class changes)");
    std::string cls;
    for (int i = 0; i < kNumMismatchClasses; ++i)
      if (r.classes.counts[i]) cls += (cls.empty() ? "" : ", ") + std::string(to_string(static_cast<Mismatch>(i))) + " " + std::to_string(r.classes.counts[i]);
    s += "  classes: " + cls;
  }
  if (r.scale.is_scale && r.scale.blocks_differing) s += "  scale blocks differing: " + std::to_string(r.scale.blocks_differing);
  s += "  tol " + r.tol.to_string();
  if (r.mistrusted) s += "  (" + r.trust_note + ")";
  r.summary = s;
}

}  // namespace

// ---- the whole file -----------------------------------------------------------------------------------------

namespace {

// A file as the diff sees it: views of its tensors (into a mapping, or into a SafetensorsFile's vectors) and its
// metadata. Nothing is copied.
struct FileView {
  const std::vector<io::TensorView>& tensors;
  const std::map<std::string, std::string>& metadata;
  const io::TensorView* find(std::string_view name) const {
    for (const io::TensorView& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

DiffReport diff_views(const FileView& expected, const FileView& actual, const DiffOptions& opt) {
  DiffReport rep;
  rep.expected_name = opt.expected_name;
  rep.actual_name = opt.actual_name;
  auto md = [](const FileView& f, const char* k) {
    auto it = f.metadata.find(k);
    return it == f.metadata.end() ? std::string() : it->second;
  };
  rep.descriptor = md(expected, "fp8ref.descriptor");
  // a result file as EXPECTED and a golden file as ACTUAL: the two given the wrong way round
  auto has_inputs = [](const FileView& f) {
    for (const io::TensorView& t : f.tensors)
      if (t.name.rfind("input.", 0) == 0 || t.name.rfind("exact.", 0) == 0) return true;
    return false;
  };
  if (!has_inputs(expected) && !md(actual, "fp8ref.descriptor").empty() && has_inputs(actual))
    throw InputError(opt.actual_name + " is a golden file (a descriptor and input.* / exact.* tensors) and " +
                     opt.expected_name + " a result file: the two are given the wrong way round (fp8ref diff EXPECTED ACTUAL)");
  rep.expected_backend = md(expected, "fp8ref.backend");
  rep.actual_backend = md(actual, "fp8ref.backend");
  // the case's repro line, and the format of its exact values where they are an input as it is (the double
  // roundings a device could do depend on it: OpInfo::exact_source)
  std::optional<Format> exact_source;
  if (!rep.descriptor.empty()) {
    try {
      const golden::Descriptor d = golden::parse_descriptor(rep.descriptor);
      rep.repro = golden::repro_command(d);
      const golden::OpInfo& op = golden::op_info(d.op);
      if (op.exact_source) exact_source = op.exact_source(d);
    } catch (const InputError&) {
      rep.repro = "fp8ref golden --case '" + rep.descriptor + "' --out DIR";
    }
  }
  // a paged attention case's sequences (input.query_start_loc): its token rows broken down by sequence
  std::vector<int64_t> sequences;
  for (const io::TensorView& t : expected.tensors)
    if (t.name == "input.query_start_loc" && t.dtype == io::DType::I32 && t.shape.size() == 1 && t.numel() >= 2) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        int32_t v;
        std::memcpy(&v, t.bytes + 4 * i, 4);
        sequences.push_back(v);
      }
      if (sequences.front() != 0 || !std::is_sorted(sequences.begin(), sequences.end())) sequences.clear();  // not offsets
    }
  const std::map<std::string, OutputInfo> infos = parse_outputs(expected.metadata, opt.expected_name);
  auto is_output = [](const std::string& n) { return n.rfind("output.", 0) == 0; };
  auto info_of = [&](const io::TensorView& t) {
    auto it = infos.find(t.name);
    OutputInfo o = it != infos.end() ? it->second : OutputInfo{};
    if (auto f = io::dtype_format(t.dtype)) {
      if (o.format.empty()) o.format = format_name(*f);
      Format declared;
      if (o.declared && (!parse_format(o.format, &declared) || declared != *f))
        throw InputError(opt.expected_name + ": tensor '" + t.name + "': fp8ref.outputs says format '" + o.format +
                         "' but the tensor is " + io::dtype_name(t.dtype));
    } else if (o.format.empty()) {
      o.format = io::dtype_name(t.dtype);
    }
    if (o.dims.empty() && t.shape.size() == 2) o.dims = {"row", "col"};
    if (!o.dims.empty() && o.dims.size() != t.shape.size())
      throw InputError(opt.expected_name + ": tensor '" + t.name + "': fp8ref.outputs 'dims' has " +
                       std::to_string(o.dims.size()) + " names for a rank-" + std::to_string(t.shape.size()) + " tensor");
    return o;
  };

  // Order: scale tensors, then data tensors, EXPECTED's file order; then extras in ACTUAL.
  std::vector<const io::TensorView*> order;
  for (int pass = 0; pass < 2; ++pass)
    for (const io::TensorView& t : expected.tensors) {
      if (!is_output(t.name)) continue;
      auto it = infos.find(t.name);
      const bool scale = it != infos.end() && it->second.role == "scale";
      if (scale == (pass == 0)) order.push_back(&t);
    }

  // Validate auxiliary tensors and scale geometry up front (bad input: exit 2, no partial report).
  auto aux = [&](const io::TensorView& out, const char* prefix) -> const io::TensorView* {
    const std::string name = prefix + out.name.substr(7);
    const io::TensorView* x = expected.find(name);
    if (!x) return nullptr;
    if (x->dtype != io::DType::F64 || x->shape != out.shape)
      throw InputError(opt.expected_name + ": tensor '" + name + "' is " + dtype_shape(*x) + ", expected F64 " +
                       detail::shape_string(out.shape) + " (the shape of '" + out.name + "')");
    return x;
  };
  for (const io::TensorView* t : order) {
    const OutputInfo o = info_of(*t);
    aux(*t, "exact.");
    aux(*t, "bound.");
    if (o.role == "scale") {
      const io::TensorView* data = expected.find(o.of);
      if (!data) throw InputError(opt.expected_name + ": scale tensor '" + t->name + "' is 'of' '" + o.of + "', which is not in the file");
      // one scale per block of the data: the scale tensor has the shape of the block grid, or as many elements
      // in row-major order (a KV cache's per-head scales [H] of blocks [P, S, 1, D])
      bool fits = o.block.size() == data->shape.size();
      for (size_t d = 0; fits && d < o.block.size(); ++d) fits = o.block[d] > 0;
      if (fits) {
        const std::vector<int64_t> grid = block_grid(data->shape, o.block);
        int64_t n = 1;
        for (int64_t g : grid) n *= g;
        fits = t->shape == grid || t->numel() == n;
      }
      if (!fits)
        throw InputError(opt.expected_name + ": scale tensor '" + t->name + "' " + detail::shape_string(t->shape) + " with block " +
                         detail::shape_string(o.block) + " does not fit data '" + o.of + "' " + detail::shape_string(data->shape));
    }
  }

  std::map<std::string, AttachedScale> attached;  // data tensor name -> its scale
  for (const io::TensorView* t : order) {
    const OutputInfo o = info_of(*t);
    TensorReport r;
    r.name = t->name;
    r.role = o.role;
    r.format = o.format;
    r.contract = o.contract;
    r.dims = o.dims;
    r.expected_dtype = io::dtype_name(t->dtype);
    r.expected_shape = t->shape;
    const io::TensorView* a = actual.find(t->name);
    if (!a) {
      r.presence = TensorReport::Presence::missing;
      r.presence_note = "missing in " + opt.actual_name;
    } else {
      r.actual_dtype = io::dtype_name(a->dtype);
      r.actual_shape = a->shape;
      if (a->dtype != t->dtype) {
        r.presence = TensorReport::Presence::dtype_mismatch;
        r.presence_note = "dtype differs: " + opt.expected_name + " " + dtype_shape(*t) + ", " + opt.actual_name + " " + dtype_shape(*a);
      } else if (a->shape != t->shape) {
        std::vector<int64_t> rev(t->shape.rbegin(), t->shape.rend());
        if (a->numel() == t->numel() && a->shape == rev) {
          r.presence = TensorReport::Presence::transposed;
          r.presence_note = "transposed: " + opt.expected_name + " " + detail::shape_string(t->shape) + ", " + opt.actual_name + " " +
                            detail::shape_string(a->shape) + " (shape reversed)";
          if (t->shape.size() == 2) {
            const int64_t R = t->shape[0], C = t->shape[1];
            const size_t sz = io::dtype_size(t->dtype);
            bool eq = true;
            for (int64_t i = 0; i < R && eq; ++i)
              for (int64_t j = 0; j < C && eq; ++j)
                eq = std::memcmp(t->bytes + (i * C + j) * sz, a->bytes + (j * R + i) * sz, sz) == 0;
            r.presence_note += eq ? "; its values are EXPECTED transposed, bit for bit" : "; its values are not EXPECTED transposed either";
          }
        } else {
          r.presence = TensorReport::Presence::shape_mismatch;
          r.presence_note = "shape differs: " + opt.expected_name + " " + detail::shape_string(t->shape) + ", " + opt.actual_name +
                            " " + detail::shape_string(a->shape) + (a->numel() == t->numel() ? " (same element count: reshaped)" : "");
        }
      }
    }
    if (r.presence == TensorReport::Presence::ok) {
      AttachedScale* sc = nullptr;
      if (o.role == "scale") {
        const io::TensorView* data = expected.find(o.of);
        fill_scale_section(r, *t, *a, o.block, o.of, data ? &data->shape : nullptr);
        // attach to the data tensor
        AttachedScale& as = attached[o.of];
        as.e = t;
        as.a = a;
        as.fmt.emplace(t->dtype);
        as.block = o.block;
        as.sshape = data ? block_grid(data->shape, o.block) : t->shape;
        as.sstride.assign(as.sshape.size(), 1);
        for (int d = static_cast<int>(as.sshape.size()) - 2; d >= 0; --d) as.sstride[d] = as.sstride[d + 1] * as.sshape[d + 1];
        const uint64_t n = static_cast<uint64_t>(t->numel());
        as.differs.assign(n, 0);
        for (uint64_t i = 0; i < n; ++i)
          if (load(*t, i, as.fmt->size) != load(*a, i, as.fmt->size)) {
            as.differs[i] = 1;
            as.n_differ++;
          }
      } else {
        auto it = attached.find(t->name);
        if (it != attached.end()) {
          sc = &it->second;
          ScaleSection& s = r.scale;
          s.present = true;
          s.tensor = sc->e->name;
          s.block = sc->block;
          s.blocks = sc->differs.size();
          s.blocks_differing = sc->n_differ;
          uint64_t per_block = 1;
          for (int64_t b : sc->block) per_block *= static_cast<uint64_t>(b);
          // elements in differing blocks (edge blocks counted exactly)
          for (uint64_t i = 0; i < sc->differs.size(); ++i) {
            if (!sc->differs[i]) continue;
            const std::vector<int64_t> bi = unravel(i, sc->sshape);
            uint64_t cnt = 1;
            for (size_t d = 0; d < bi.size(); ++d)
              cnt *= static_cast<uint64_t>(std::min(t->shape[d], (bi[d] + 1) * sc->block[d]) - bi[d] * sc->block[d]);
            s.data_in_differing_blocks += cnt;
          }
          (void)per_block;
        }
      }
      Tolerance tol = opt.tol ? *opt.tol : (o.contract == "bound" ? Tolerance{Tolerance::Kind::bound} : Tolerance{});
      Analyzer an(*t, *a, aux(*t, "exact."), aux(*t, "bound."), opt, tol, o.role == "scale", sc);
      if (exact_source) an.rounder.restrict_to_source(*exact_source);
      if (!sequences.empty() && !o.dims.empty() && o.dims[0] == "token") {
        an.segments = &sequences;
        an.segment_name = "sequence (query_start_loc)";
      }
      an.run(r);
    } else {
      r.tol = opt.tol ? *opt.tol : (o.contract == "bound" ? Tolerance{Tolerance::Kind::bound} : Tolerance{});
      r.tol_pass = false;
    }
    r.verdict = r.presence != TensorReport::Presence::ok || !r.tol_pass ? Verdict::fail
                : r.mistrusted                                         ? Verdict::mistrusted
                                                                       : Verdict::pass;
    summarize(r, opt);
    rep.tensors.push_back(std::move(r));
  }
  for (const io::TensorView& t : actual.tensors) {
    if (!is_output(t.name) || expected.find(t.name)) continue;
    TensorReport r;
    r.name = t.name;
    r.presence = TensorReport::Presence::extra;
    r.actual_dtype = io::dtype_name(t.dtype);
    r.actual_shape = t.shape;
    r.presence_note = "extra in " + opt.actual_name + " (" + dtype_shape(t) + "), not in " + opt.expected_name;
    r.tol_pass = false;
    r.verdict = Verdict::fail;
    summarize(r, opt);
    rep.tensors.push_back(std::move(r));
  }
  if (rep.tensors.empty())
    throw InputError(opt.expected_name + ": no output.* tensors to compare (and none in " + opt.actual_name + ")");
  rep.verdict = Verdict::pass;
  for (const TensorReport& r : rep.tensors)
    if (static_cast<int>(r.verdict) > static_cast<int>(rep.verdict)) rep.verdict = r.verdict;
  return rep;
}

std::vector<io::TensorView> views_of(const io::SafetensorsFile& f) {
  std::vector<io::TensorView> v;
  v.reserve(f.tensors.size());
  for (const io::Tensor& t : f.tensors) v.push_back(io::view_of(t));
  return v;
}

}  // namespace

// Scale tensors stored in a layout (fp8ref.outputs "layout") are diffed in their logical form (diff/scale_layouts.h).
DiffReport diff_logical(const std::vector<io::TensorView>& ev, const std::map<std::string, std::string>& emd,
                        const std::vector<io::TensorView>& av, const std::map<std::string, std::string>& amd,
                        const DiffOptions& opt) {
  const detail::LogicalViews l = detail::logical_scale_views(ev, av, emd, opt.expected_name);
  DiffReport rep = diff_views(FileView{l.expected, l.expected_metadata}, FileView{l.actual, amd}, opt);
  // Before a verdict other than PASS blames the device: EXPECTED's tensors against the SHA-256 its metadata records
  // (fp8ref.sha256.*). A golden file damaged or edited since `fp8ref golden` wrote it is bad input (InputError).
  // (A passing diff skips the hashing, ~0.3 s per GB; ACTUAL's checksums are not checked: a device runner may copy
  // the golden's metadata into its result.)
  if (rep.verdict != Verdict::pass)
    for (const io::TensorView& t : ev) golden::check_recorded_sha256(emd, t.name, t.bytes, t.nbytes(), opt.expected_name);
  for (TensorReport& r : rep.tensors) {  // say what was stored, not only the logical form compared
    auto it = l.stored_as.find(r.name);
    if (it != l.stored_as.end() && r.presence == TensorReport::Presence::ok)
      r.presence_note = " (stored " + it->second + "; compared in logical row-major form)";
  }
  return rep;
}

DiffReport diff_files(const io::SafetensorsFile& expected, const io::SafetensorsFile& actual, const DiffOptions& opt) {
  const std::vector<io::TensorView> ev = views_of(expected), av = views_of(actual);
  return diff_logical(ev, expected.metadata, av, actual.metadata, opt);
}

DiffReport diff_files(const io::MappedSafetensors& expected, const io::MappedSafetensors& actual, const DiffOptions& opt) {
  return diff_logical(expected.tensors(), expected.metadata(), actual.tensors(), actual.metadata(), opt);
}

}  // namespace fp8ref::diff
