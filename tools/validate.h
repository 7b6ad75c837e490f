// fp8ref validate — golden + run + diff over a suite, one summary table (shared by `validate` and `demo`).
#pragma once

#include <string>

namespace fp8ref::cli {

// Generates each case of `suite` with the reference backend, writes it, runs `backend` on it, writes the result,
// diffs the two files as a device team would. keep_dir: where the files go ("" = a temporary directory, removed
// afterwards). Prints the table (and each failing row's repro line); returns 0 if no case failed, else 1.
int validate_suite(const std::string& suite, const std::string& backend, const std::string& keep_dir, bool quiet);

}  // namespace fp8ref::cli
