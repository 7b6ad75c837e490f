// fp8ref — case descriptors: `op key=value ...`, canonical key order from the op registry.
#include <cctype>
#include <sstream>

#include "fp8ref/error.h"
#include "fp8ref/golden.h"

namespace fp8ref::golden {

namespace {

bool valid_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_' ||
          c == '-'))
      return false;
  return true;
}

}  // namespace

const std::string& Descriptor::get(std::string_view key) const {
  for (const auto& kv : fields)
    if (kv.first == key) return kv.second;
  throw InputError("descriptor '" + to_string(*this) + "': no key '" + std::string(key) + "'");
}

bool Descriptor::has(std::string_view key) const {
  for (const auto& kv : fields)
    if (kv.first == key) return true;
  return false;
}

void Descriptor::set(std::string_view key, std::string value) {
  for (auto& kv : fields) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  fields.emplace_back(std::string(key), std::move(value));
}

Descriptor parse_descriptor(std::string_view line) {
  std::istringstream in{std::string(line)};
  std::string tok;
  Descriptor raw;
  const std::string quoted = "descriptor '" + std::string(line) + "'";
  if (!(in >> raw.op)) throw InputError(quoted + ": empty");
  const OpInfo& info = op_info(raw.op);
  while (in >> tok) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == tok.size())
      throw InputError(quoted + ": '" + tok + "' is not key=value");
    const std::string key = tok.substr(0, eq), value = tok.substr(eq + 1);
    if (!valid_token(key)) throw InputError(quoted + ": bad key '" + key + "'");
    if (value.find('=') != std::string::npos && value.find(':') == std::string::npos)
      throw InputError(quoted + ": bad value '" + value + "' for key '" + key + "'");
    bool known = false;
    for (const Param& p : info.params) known |= key == p.key;
    if (!known) {
      std::string keys;
      for (const Param& p : info.params) keys += std::string(keys.empty() ? "" : ", ") + p.key;
      throw InputError(quoted + ": op '" + raw.op + "' has no key '" + key + "' (keys: " + keys + ")");
    }
    if (raw.has(key)) throw InputError(quoted + ": key '" + key + "' given twice");
    // the seed names the case: one spelling per value (decimal, no sign or leading zeros), within 64 bits
    if (key == "seed" && (value.find_first_not_of("0123456789") != std::string::npos || value.size() > 20 ||
                          (value.size() > 1 && value[0] == '0') ||
                          (value.size() == 20 && value > "18446744073709551615")))
      throw InputError(quoted + ": seed '" + value + "' is not a decimal integer in [0, 2^64)");
    raw.fields.emplace_back(key, value);
  }
  Descriptor d;
  d.op = raw.op;
  for (const Param& p : info.params) d.fields.emplace_back(p.key, raw.has(p.key) ? raw.get(p.key) : p.default_value);
  return d;
}

std::string to_string(const Descriptor& d) {
  // Keys at their default are left out: parsing puts them back, so parse(to_string(d)) == d.
  const OpInfo* info = nullptr;
  for (const OpInfo& op : ops())
    if (d.op == op.name) info = &op;
  std::string s = d.op;
  for (const auto& kv : d.fields) {
    bool is_default = false;
    if (info)
      for (const Param& p : info->params) is_default |= kv.first == p.key && kv.second == p.default_value;
    if (!is_default) s += " " + kv.first + "=" + kv.second;
  }
  return s;
}

std::string repro_command(const Descriptor& d) { return "fp8ref golden --case '" + to_string(d) + "' --out repro"; }

std::vector<int64_t> parse_shape(std::string_view s) {
  std::vector<int64_t> shape;
  if (s.empty() || s == "-" || s == "scalar") return shape;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t x = s.find('x', i);
    const std::string part(s.substr(i, x == std::string_view::npos ? std::string_view::npos : x - i));
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 12)
      throw InputError("bad shape '" + std::string(s) + "' (want e.g. 64x128)");
    shape.push_back(std::stoll(part));
    if (x == std::string_view::npos) break;
    i = x + 1;
  }
  return shape;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

}  // namespace fp8ref::golden
