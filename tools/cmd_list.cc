// fp8ref list — what this build knows: formats, conventions, conversion modes, backends.
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "fp8ref/convert.h"
#include "fp8ref/format.h"
#include "fp8ref/golden.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref list [--json]\n"
    "\n"
    "Lists the number formats, the named conversion conventions (which targets each defines and which stack it\n"
    "reproduces), the rounding / overflow / NaN / f64-path modes that --rounding, --overflow, --nan and\n"
    "--f64-path accept, and the backends with the CPU's SIMD target.\n"
    "\n"
    "Options:\n"
    "  --json      print the same as one JSON object on stdout\n"
    "  -h, --help  this help\n";

const Format kTargets[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz, Format::ue8m0};

const char* format_kind(Format f) {
  if (f == Format::ue8m0) return "scale";
  return is_fp8(f) ? "fp8" : "container";
}

// The targets a convention defines, found by asking resolve_convention (an f32 source).
std::vector<Format> convention_targets(const char* name) {
  std::vector<Format> out;
  for (Format t : kTargets) {
    std::string err;
    if (resolve_convention(name, Format::f32, t, &err)) out.push_back(t);
  }
  return out;
}

// Every value of a mode enum, by name (to_string answers "?" past the last one).
template <typename E>
std::vector<std::string> enum_names() {
  std::vector<std::string> v;
  for (int i = 0; i < 64; ++i) {
    std::string n = to_string(static_cast<E>(i));
    if (n == "?") break;
    v.push_back(n);
  }
  return v;
}

struct Modes {
  std::vector<std::string> rounding = enum_names<Rounding>();
  std::vector<std::string> overflow = enum_names<Overflow>();
  std::vector<std::string> nan = enum_names<NanOut>();
  std::vector<std::string> f64_path = enum_names<F64Path>();
};

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string max_text(const FormatInfo& f) {
  char buf[64];
  if (f.max_value == static_cast<double>(static_cast<long long>(f.max_value)) && f.max_value < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", f.max_value);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", f.max_value);
  // Shorter form when it is exact.
  for (int p = 1; p <= 17; ++p) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.*g", p, f.max_value);
    if (std::strtod(b2, nullptr) == f.max_value) return b2;
  }
  return buf;
}

std::vector<std::string> suite_names() {
  std::vector<std::string> out;
  if (DIR* d = opendir(golden::suites_dir().c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.substr(n.size() - 5) == ".json") out.push_back(n.substr(0, n.size() - 5));
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int print_json() {
  nlohmann::ordered_json j;
  j["version"] = kVersion;
  j["formats"] = nlohmann::ordered_json::array();
  for (Format f : all_formats()) {
    const FormatInfo& i = format_info(f);
    nlohmann::ordered_json e;
    e["name"] = i.name;
    e["kind"] = format_kind(f);
    e["bits"] = i.bits;
    e["exp_bits"] = i.exp_bits;
    e["man_bits"] = i.man_bits;
    e["bias"] = i.bias;
    e["signed"] = i.is_signed;
    e["max_finite"] = i.max_value;
    if (i.bits <= 32) e["max_code"] = i.max_code;
    e["safetensors"] = i.safetensors_tag;
    j["formats"].push_back(e);
  }
  j["conventions"] = nlohmann::ordered_json::array();
  for (const ConventionInfo& c : conventions()) {
    nlohmann::ordered_json e;
    e["name"] = c.name;
    e["stack"] = c.stack;
    e["targets"] = nlohmann::ordered_json::array();
    e["specs"] = nlohmann::ordered_json::object();  // the resolved spec for an f32 source, per target
    for (Format t : convention_targets(c.name)) {
      e["targets"].push_back(format_name(t));
      std::string err;
      if (auto s = resolve_convention(c.name, Format::f32, t, &err)) e["specs"][format_name(t)] = s->describe();
    }
    j["conventions"].push_back(e);
  }
  const Modes m;
  j["rounding"] = m.rounding;
  j["overflow"] = m.overflow;
  j["nan"] = m.nan;
  j["f64_path"] = m.f64_path;
  j["backends"] = nlohmann::ordered_json::array();
  for (const std::string& b : golden::backends()) {
    nlohmann::ordered_json e;
    e["name"] = b;
    if (b == "cpu") e["simd_target"] = cpu::simd_target();
    j["backends"].push_back(e);
  }
  j["ops"] = nlohmann::ordered_json::array();
  for (const golden::OpInfo& op : golden::ops()) {
    nlohmann::ordered_json e;
    e["name"] = op.name;
    e["summary"] = op.summary;
    e["keys"] = nlohmann::ordered_json::array();
    for (const golden::Param& p : op.params)
      e["keys"].push_back({{"key", p.key}, {"default", p.default_value}, {"help", p.help}});
    e["kernels"] = nlohmann::ordered_json::array();
    for (const golden::Kernel& k : golden::kernels())
      if (std::string(k.op) == op.name) e["kernels"].push_back({{"backend", k.backend}, {"name", k.name}});
    j["ops"].push_back(e);
  }
  j["suites"] = suite_names();
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

int print_text() {
  std::printf("Formats:\n");
  std::printf("  %-9s %-9s %4s %3s %3s %5s  %-24s %s\n", "name", "kind", "bits", "exp", "man", "bias", "max finite",
              "safetensors");
  for (Format f : all_formats()) {
    const FormatInfo& i = format_info(f);
    std::printf("  %-9s %-9s %4d %3d %3d %5d  %-24s %s\n", i.name, format_kind(f), i.bits, i.exp_bits, i.man_bits,
                i.bias, max_text(i).c_str(), i.safetensors_tag);
  }
  std::printf("\nConventions (fp8ref convert --convention NAME):\n");
  for (const ConventionInfo& c : conventions()) {
    std::vector<std::string> t;
    for (Format f : convention_targets(c.name)) t.push_back(format_name(f));
    std::printf("  %-16s %s\n  %-16s   %s\n", c.name, join(t).c_str(), "", c.stack);
  }
  const Modes m;
  std::printf("\nOverrides:\n");
  std::printf("  --rounding   %s\n", join(m.rounding, " | ").c_str());
  std::printf("  --overflow   %s\n", join(m.overflow, " | ").c_str());
  std::printf("  --nan        %s\n", join(m.nan, " | ").c_str());
  std::printf("  --f64-path   %s\n", join(m.f64_path, " | ").c_str());
  std::printf("  --nan-code 0xNN, --seed S (stochastic), --exp-clamp LO:HI (ue8m0)\n");
  std::printf("\nOps (descriptor keys with defaults; fp8ref golden --case \"OP key=value ...\"):\n");
  for (const golden::OpInfo& op : golden::ops()) {
    std::printf("  %s — %s\n", op.name, op.summary);
    for (const golden::Param& p : op.params) std::printf("      %-12s %-18s %s\n", p.key, p.default_value, p.help);
    for (const golden::Kernel& k : golden::kernels())
      if (std::string(k.op) == op.name) std::printf("      kernel  %-10s %s\n", k.backend, k.name);
  }
  std::printf("\nBackends: %s (cpu SIMD target %s)\n", join(golden::backends()).c_str(), cpu::simd_target());
  std::printf("Suites (%s): %s\n", golden::suites_dir().c_str(), join(suite_names()).c_str());
  return 0;
}

int list_main(int argc, char** argv) {
  Args args(argc, argv, {{"--json", Kind::flag}});
  args.expect_positionals({});
  return args.has("--json") ? print_json() : print_text();
}

}  // namespace

const Command kCmd_list = {"list", "formats, conventions, conversion modes, backends", &list_main, kHelp};

}  // namespace fp8ref::cli
