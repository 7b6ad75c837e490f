// fp8ref command line — the subcommand table and a small argument parser.
//
// Adding a subcommand: write tools/cmd_NAME.cc defining
//     const fp8ref::cli::Command fp8ref::cli::kCmd_NAME = {"NAME", "one-line summary", &main_fn, help_text};
// and add X(NAME) to FP8REF_COMMANDS below (the order there is the order `fp8ref --help` lists them).
//
// A command's main gets argv[0] = its name and the arguments after it. main.cc has already answered --help/-h
// (by printing Command::help) and maps exceptions to exit codes:
//   UsageError        -> "fp8ref NAME: error: <msg> (see 'fp8ref NAME --help')", exit 2
//   fp8ref::InputError -> "fp8ref NAME: error: <msg>", exit 2
// A command returns 0 on success and 1 for a numerical failure (diff, validate).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8ref/golden.h"

namespace fp8ref::cli {

constexpr const char* kVersion = fp8ref::golden::kVersion;  // (one version: the golden files' fp8ref.version)

struct Command {
  const char* name;
  const char* summary;
  int (*main)(int argc, char** argv);
  const char* help;  // the full text of `fp8ref NAME --help`
};

// The subcommands, in listing order. One entry per command.
#define FP8REF_COMMANDS(X) \
  X(list)                  \
  X(convert)               \
  X(quantize)              \
  X(dequantize)            \
  X(rmsnorm_quant)         \
  X(scaled_mm)             \
  X(scaled_bmm)            \
  X(kv_cache_write)        \
  X(paged_attention)       \
  X(golden)                \
  X(run)                   \
  X(diff)                  \
  X(validate)              \
  X(mma)                   \
  X(demo)

#define FP8REF_DECLARE_COMMAND(name) extern const Command kCmd_##name;
FP8REF_COMMANDS(FP8REF_DECLARE_COMMAND)
#undef FP8REF_DECLARE_COMMAND

// Bad usage: unknown or missing flags, malformed flag values, wrong number of positionals.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

// ---- argument parser -----------------------------------------------------------------------------------------
//   --name VALUE, --name=VALUE   value options (a following argument that starts with "--" is not taken as value)
//   --name                       boolean flags (--name=... is an error)
//   -x                           a short alias of a long option, where one is declared
//   --                           everything after it is positional
// Unknown options, a value option given twice (unless `repeat`), a missing value: UsageError.
enum class Kind { flag, value, repeat };

struct Option {
  const char* name;  // "--to"
  Kind kind = Kind::value;
  const char* alias = nullptr;  // "-o"
};

class Args {
 public:
  Args(int argc, char** argv, std::initializer_list<Option> options) : options_(options) {
    bool only_positionals = false;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (only_positionals || a.size() < 2 || a[0] != '-') {
        positionals_.push_back(a);
        continue;
      }
      if (a == "--") {
        only_positionals = true;
        continue;
      }
      std::string name = a;
      std::optional<std::string> inline_value;
      if (a.rfind("--", 0) == 0) {
        const size_t eq = a.find('=');
        if (eq != std::string::npos) {
          name = a.substr(0, eq);
          inline_value = a.substr(eq + 1);
        }
      }
      const Option* opt = find(name);
      if (!opt) throw UsageError("unknown option '" + name + "'");
      if (opt->kind == Kind::flag) {
        if (inline_value) throw UsageError(std::string(opt->name) + " takes no value");
        values_.emplace_back(opt->name, "");
        continue;
      }
      std::string value;
      if (inline_value) {
        value = *inline_value;
      } else {
        if (i + 1 >= argc || std::string_view(argv[i + 1]).rfind("--", 0) == 0)
          throw UsageError(std::string(opt->name) + " needs a value");
        value = argv[++i];
      }
      if (opt->kind == Kind::value && has(opt->name)) throw UsageError(std::string(opt->name) + " given twice");
      values_.emplace_back(opt->name, value);
    }
  }

  // A boolean flag or value option was given.
  bool has(std::string_view name) const {
    for (const auto& kv : values_)
      if (kv.first == name) return true;
    return false;
  }
  // The value of a value option, if given.
  std::optional<std::string> get(std::string_view name) const {
    for (const auto& kv : values_)
      if (kv.first == name) return kv.second;
    return std::nullopt;
  }
  // The value of a required value option; UsageError "missing --name" if absent.
  std::string require(std::string_view name) const {
    auto v = get(name);
    if (!v) throw UsageError("missing " + std::string(name));
    return *v;
  }
  // Every value of a repeatable option, in order.
  std::vector<std::string> all(std::string_view name) const {
    std::vector<std::string> out;
    for (const auto& kv : values_)
      if (kv.first == name) out.push_back(kv.second);
    return out;
  }
  const std::vector<std::string>& positionals() const { return positionals_; }
  // Exactly the positionals named in `names` (e.g. {"IN", "OUT"}); UsageError naming what is missing or extra.
  void expect_positionals(std::initializer_list<const char*> names) const {
    std::vector<const char*> n(names);
    if (positionals_.size() < n.size())
      throw UsageError(std::string("missing ") + n[positionals_.size()] + " (expected " + join(n) + ")");
    if (positionals_.size() > n.size() && n.empty())
      throw UsageError("unexpected argument '" + positionals_[0] + "' (this command takes no arguments)");
    if (positionals_.size() > n.size())
      throw UsageError("unexpected argument '" + positionals_[n.size()] + "' (expected " + join(n) + ")");
  }

 private:
  const Option* find(const std::string& name) const {
    for (const Option& o : options_)
      if (name == o.name || (o.alias && name == o.alias)) return &o;
    return nullptr;
  }
  static std::string join(const std::vector<const char*>& n) {
    std::string s;
    for (const char* x : n) s += (s.empty() ? "" : " ") + std::string(x);
    return s;
  }

  std::vector<Option> options_;
  std::vector<std::pair<std::string, std::string>> values_;  // (option name, value) in command-line order
  std::vector<std::string> positionals_;
};

// Shared by the commands' messages and file checks.
inline bool ends_with(const std::string& s, const char* suffix) {
  const std::string_view v(suffix);
  return s.size() >= v.size() && s.compare(s.size() - v.size(), v.size(), v) == 0;
}
// A shape as numpy prints it: "(2, 3)", "(5,)", "()".
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// The value of an integer option: a whole decimal number in [lo, hi], else UsageError naming the flag.
inline long long parse_integer(const std::string& flag, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || n < lo || n > hi)
    throw UsageError(flag + " needs a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" +
                     v + "'");
  return n;
}

// Whether two paths name one file: the same inode where both exist, else the same canonical path (a file not
// there yet), so "q.npy", "./q.npy" and "dir/../q.npy" are one file.
inline bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ea);
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ea), ea), cb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return !ea && !eb ? ca == cb : a == b;
}
// The files of a command: every path ends in one of `exts` (none: any name); each output (its index in
// `outputs`) is a file apart from every other path given — another output, or an input it would overwrite. Inputs
// may repeat (SA = SB).
// UsageError otherwise.
inline void check_paths(const std::vector<std::string>& paths, const std::vector<size_t>& outputs,
                        std::initializer_list<const char*> exts = {".npy"}) {
  for (const std::string& p : paths) {
    bool ok = exts.size() == 0;
    std::string list;
    for (const char* e : exts) {
      ok = ok || ends_with(p, e);
      list += std::string(list.empty() ? "" : " or ") + e;
    }
    if (!ok) throw UsageError("'" + p + "' must end in " + list);
  }
  for (size_t o : outputs)
    for (size_t b = 0; b < paths.size(); ++b)
      if (b != o && same_file(paths[o], paths[b]))
        throw UsageError("the output file '" + paths[o] + "' is also given as " +
                         (std::find(outputs.begin(), outputs.end(), b) != outputs.end() ? "another output" : "an input") +
                         (paths[b] == paths[o] ? std::string() : " ('" + paths[b] + "')"));
}

}  // namespace fp8ref::cli
