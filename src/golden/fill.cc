// fp8ref — FP8-aware input fills, from a documented PRNG (xoshiro256** seeded by splitmix64).
//
// Fill grammar (docs/golden-format.md): kind[:k=v[,k=v]...][+special:rate=R]. Values are generated as doubles
// and rounded once (RNE, integer code: ref::narrow) to the tensor's dtype; FP8-typed tensors get codes.
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"

namespace fp8ref::golden {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

struct FillSpec {
  std::string kind;
  std::map<std::string, std::string> opts;
  double special_rate = 0;
};

FillSpec parse_fill(std::string_view text) {
  FillSpec f;
  std::string s(text);
  const size_t plus = s.find('+');
  if (plus != std::string::npos) {
    const std::string extra = s.substr(plus + 1);
    s = s.substr(0, plus);
    const std::string prefix = "special:rate=";
    if (extra.rfind(prefix, 0) != 0) throw InputError("fill '" + std::string(text) + "': after '+' expected special:rate=R");
    try {
      size_t pos = 0;
      const std::string r = extra.substr(prefix.size());
      f.special_rate = std::stod(r, &pos);
      if (pos != r.size()) throw 1;
    } catch (...) {
      throw InputError("fill '" + std::string(text) + "': bad special rate");
    }
    if (!(f.special_rate >= 0 && f.special_rate <= 1)) throw InputError("fill '" + std::string(text) + "': rate not in [0,1]");
  }
  const size_t colon = s.find(':');
  f.kind = s.substr(0, colon);
  if (colon != std::string::npos) {
    std::string rest = s.substr(colon + 1);
    size_t i = 0;
    while (i < rest.size()) {
      const size_t comma = rest.find(',', i);
      const std::string kv = rest.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) throw InputError("fill '" + std::string(text) + "': option '" + kv + "' is not k=v");
      if (!f.opts.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second)
        throw InputError("fill '" + std::string(text) + "': option '" + kv.substr(0, eq) + "' given twice");
      if (comma == std::string::npos) break;
      i = comma + 1;
    }
  }
  // each kind's options (a typo would otherwise fall back to the default without a word)
  const std::string allowed = f.kind == "normal" || f.kind == "uniform" ? "amax" : f.kind == "ints" ? "max" : "format";
  for (const auto& kv : f.opts)
    if (kv.first != allowed)
      throw InputError("fill '" + std::string(text) + "': " + f.kind + " has no option '" + kv.first + "' (its option: " +
                       allowed + ")");
  return f;
}

double opt_double(const FillSpec& f, const char* key, double def, std::string_view text,
                  double hi = std::numeric_limits<double>::max()) {
  auto it = f.opts.find(key);
  if (it == f.opts.end()) return def;
  try {
    size_t pos;
    const double v = std::stod(it->second, &pos);
    if (pos != it->second.size() || !(v >= 0 && v <= hi)) throw 1;
    return v;
  } catch (...) {
    char h[32];
    std::snprintf(h, sizeof h, "%g", hi);
    throw InputError("fill '" + std::string(text) + "': " + key + " must be a number in [0, " + h + "], not '" +
                     it->second + "'");
  }
}

Format opt_format(const FillSpec& f, std::string_view text) {
  auto it = f.opts.find("format");
  const std::string name = it == f.opts.end() ? "e4m3fn" : it->second;
  Format fmt;
  if (!parse_format(name, &fmt) || !is_fp8(fmt)) throw InputError("fill '" + std::string(text) + "': bad format '" + name + "'");
  return fmt;
}

// The sorted positive finite values of an FP8 format.
std::vector<double> positive_values(Format f) {
  std::vector<double> v;
  for (int c = 0; c < 256; ++c) {
    const CodeClass k = classify_code(f, static_cast<uint8_t>(c));
    if ((k == CodeClass::normal || k == CodeClass::subnormal) && !(c & 0x80 && format_info(f).is_signed))
      v.push_back(ref::value_of(f, static_cast<uint8_t>(c)));
  }
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0x9E3779B97F4A7C15ull);
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {  // xoshiro256** 1.0 (Blackman & Vigna)
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  double u1 = uniform();
  while (u1 <= 0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::vector<double> fill_values(std::string_view text, size_t n, Format source, uint64_t seed, uint64_t stream) {
  const FillSpec f = parse_fill(text);
  Rng rng(seed, stream);
  std::vector<double> out(n);
  const double src_ulp_scale = std::ldexp(1.0, -format_info(source).man_bits);  // relative ulp of the source
  auto sign = [&] { return (rng.next() >> 63) ? -1.0 : 1.0; };
  if (f.kind == "normal") {
    const double amax = opt_double(f, "amax", 448, text);
    for (auto& x : out) {
      x = rng.normal() * amax / 3;
      x = std::fmax(-amax, std::fmin(amax, x));
    }
  } else if (f.kind == "uniform") {
    const double amax = opt_double(f, "amax", 448, text);
    for (auto& x : out) x = (2 * rng.uniform() - 1) * amax;
  } else if (f.kind == "codes") {
    const auto vals = positive_values(opt_format(f, text));
    for (auto& x : out) {
      const uint64_t r = rng.next() % (2 * vals.size() + 1);
      x = r == 2 * vals.size() ? 0.0 : (r & 1 ? -1.0 : 1.0) * vals[r / 2];
    }
  } else if (f.kind == "near-max") {
    const Format fmt = opt_format(f, text);
    const double mx = format_info(fmt).max_value;
    // 0.5·max to 1.25·max: the band where saturation policies and overflow ties differ (about 1/3 overflow)
    for (auto& x : out) {  // (one draw per statement: operand order is unspecified, and compilers differ)
      const double sg = sign();
      x = sg * mx * (0.5 + 0.75 * rng.uniform());
    }
  } else if (f.kind == "ties") {
    const auto vals = positive_values(opt_format(f, text));
    for (auto& x : out) {
      const size_t i = rng.next() % vals.size();
      const double lo = i == 0 ? 0.0 : vals[i - 1], hi = vals[i];
      const double mid = (lo + hi) / 2;
      const int nudge = static_cast<int>(rng.next() % 3) - 1;  // the tie, or one source ulp either side
      x = sign() * (mid + nudge * std::fabs(mid) * src_ulp_scale);
    }
  } else if (f.kind == "subnormal") {
    const auto vals = positive_values(opt_format(f, text));
    double min_normal = 0;
    for (double v : vals) {
      if (v >= std::ldexp(1.0, 1 - format_info(opt_format(f, text)).bias)) {
        min_normal = v;
        break;
      }
    }
    for (auto& x : out) {
      const double sg = sign();
      const int ex = -static_cast<int>(rng.next() % 4);
      x = sg * min_normal * std::ldexp(rng.uniform(), ex);
    }
  } else if (f.kind == "ints") {
    const double mx = std::floor(opt_double(f, "max", 4, text, 0x1p52));
    const uint64_t span = static_cast<uint64_t>(2 * mx + 1);
    for (auto& x : out) x = static_cast<double>(rng.next() % span) - mx;
  } else {
    throw InputError("unknown fill '" + std::string(text) +
                     "' (normal, uniform, codes, near-max, ties, subnormal, ints, each optionally +special:rate=R)");
  }
  if (f.special_rate > 0) {
    const double specials[] = {std::nan(""), -std::nan(""), HUGE_VAL, -HUGE_VAL, -0.0};
    for (auto& x : out)
      if (rng.uniform() < f.special_rate) x = specials[rng.next() % 5];
  }
  return out;
}

io::Tensor fill_tensor(const std::string& name, io::DType dtype, const std::vector<int64_t>& shape,
                       std::string_view fill, uint64_t seed, uint64_t stream) {
  io::Tensor t = io::make_tensor(name, dtype, shape);
  const size_t n = static_cast<size_t>(t.numel());
  const auto fmt = io::dtype_format(dtype);
  if (!fmt) throw InputError("cannot fill tensor '" + name + "' of dtype " + io::dtype_name(dtype));
  const auto vals = fill_values(fill, n, *fmt, seed, stream);
  for (size_t i = 0; i < n; ++i) {
    uint64_t b;
    std::memcpy(&b, &vals[i], 8);
    switch (*fmt) {
      case Format::f64: std::memcpy(&t.data[8 * i], &b, 8); break;
      case Format::f32: {
        const uint32_t v = static_cast<uint32_t>(ref::narrow(Format::f64, b, Format::f32));
        std::memcpy(&t.data[4 * i], &v, 4);
        break;
      }
      case Format::bf16:
      case Format::f16: {
        // one rounding from f64 straight to the 16-bit type
        const uint16_t v = static_cast<uint16_t>(ref::narrow(Format::f64, b, *fmt));
        std::memcpy(&t.data[2 * i], &v, 2);
        break;
      }
      default: {  // FP8: exact contract (one RNE rounding, overflow to NaN/Inf) from f64
        std::string err;
        auto spec = resolve_convention(*fmt == Format::ue8m0 ? "cuda-nosat" : "torch-2.11", Format::f64, *fmt, &err);
        spec->f64_path = F64Path::direct;
        t.data[i] = ref::encode(Format::f64, b, *spec, i);
      }
    }
  }
  return t;
}

}  // namespace fp8ref::golden
