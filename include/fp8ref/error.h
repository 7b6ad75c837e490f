// fp8ref — errors. Library code never prints or exits: it throws; the CLI maps the type to an exit code.
//   InputError  — bad input or bad usage (malformed file, wrong dtype or shape, unknown name): exit 2.
//   The message names the file, the tensor and the problem, in one line.
#pragma once

#include <stdexcept>
#include <string>

namespace fp8ref {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace fp8ref
