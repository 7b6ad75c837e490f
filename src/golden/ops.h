// fp8ref — the ops of the registry. Each op file defines its OpInfo and its kernels; registry.cc lists them.
// Adding an op: write src/golden/op_NAME.cc with NAME_op() and NAME_kernels(), declare them here, add one line
// to each table in registry.cc.
#pragma once

#include <vector>

#include "fp8ref/golden.h"

namespace fp8ref::golden {

OpInfo convert_op();
std::vector<Kernel> convert_kernels();

// op_quantize.cc: `quantize` and `dequantize`; quantize_kernels() holds the kernels of both.
OpInfo quantize_op();
OpInfo dequantize_op();
std::vector<Kernel> quantize_kernels();

}  // namespace fp8ref::golden
