// fp8ref — the ops of the registry. Each op file defines its OpInfo and its kernels; registry.cc lists them.
// Adding an op: write src/golden/op_NAME.cc with NAME_op() and NAME_kernels(), declare them here, add one line
// to each table in registry.cc.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fp8ref/golden.h"
#include "fp8ref/quant.h"

namespace fp8ref::golden {

// Shared by the op files (golden.cc): "descriptor '<d>': ", the prefix of every error about a case; and the input
// tensor `name` of a case, checked for dtype and shape (InputError naming the tensor and the case otherwise).
std::string where(const Descriptor& d);
const io::Tensor& find_input(const Descriptor& d, const Tensors& inputs, const std::string& name, io::DType dtype,
                             const std::vector<int64_t>& shape);
// The key `scale-dtype` of a case: nullopt for "-" (the convention's default), else f32, bf16, f16 or ue8m0
// (InputError naming the case otherwise).
std::optional<ScaleDtype> scale_dtype_key(const Descriptor& d);

// OpInfo::models for ops whose models are the values of one descriptor key (a convention): the case with `key` set
// to each value, named by it (models.cc).
std::vector<std::pair<std::string, Descriptor>> key_variants(const Descriptor& d, const char* key,
                                                             const std::vector<const char*>& values);

OpInfo convert_op();
std::vector<Kernel> convert_kernels();

// op_quantize.cc: `quantize` and `dequantize`; quantize_kernels() holds the kernels of both.
OpInfo quantize_op();
OpInfo dequantize_op();
std::vector<Kernel> quantize_kernels();

// op_rmsnorm_quant.cc: fused (residual add +) RMSNorm + FP8 group quant.
OpInfo rmsnorm_quant_op();
std::vector<Kernel> rmsnorm_quant_kernels();

// op_scaled_mm.cc: `scaled_mm` and `scaled_bmm`; scaled_mm_kernels() holds the kernels of both.
OpInfo scaled_mm_op();
OpInfo scaled_bmm_op();
std::vector<Kernel> scaled_mm_kernels();

// op_attention.cc: `kv_cache_write` and `paged_attention`; attention_kernels() holds the kernels of both.
OpInfo kv_cache_write_op();
OpInfo paged_attention_op();
std::vector<Kernel> attention_kernels();

}  // namespace fp8ref::golden
