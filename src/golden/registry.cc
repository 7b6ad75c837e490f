// fp8ref — the op registry: every op and every kernel, iterated by `list`, `run`, `validate`, tests, benchmarks.
#include <set>

#include "fp8ref/error.h"
#include "golden/ops.h"

namespace fp8ref::golden {

const std::vector<OpInfo>& ops() {
  static const std::vector<OpInfo> all = {convert_op(),
                                           quantize_op(), dequantize_op(),
                                           rmsnorm_quant_op(),
                                           scaled_mm_op(), scaled_bmm_op(),
                                           kv_cache_write_op(), paged_attention_op()};
  return all;
}

const std::vector<Kernel>& kernels() {
  static const std::vector<Kernel> all = [] {
    std::vector<Kernel> k;
    for (auto&& v : {convert_kernels(),
                     quantize_kernels(),
                     rmsnorm_quant_kernels(),
                     scaled_mm_kernels(),
                     attention_kernels()})
      k.insert(k.end(), v.begin(), v.end());
    return k;
  }();
  return all;
}

const OpInfo& op_info(std::string_view name) {
  for (const OpInfo& op : ops())
    if (name == op.name) return op;
  std::string names;
  for (const OpInfo& op : ops()) names += std::string(names.empty() ? "" : ", ") + op.name;
  throw InputError("unknown op '" + std::string(name) + "' (ops: " + names + ")");
}

const Kernel& find_kernel(std::string_view op, std::string_view backend) {
  for (const Kernel& k : kernels())
    if (op == k.op && backend == k.backend) return k;
  std::string names;
  for (const Kernel& k : kernels())
    if (op == k.op) names += std::string(names.empty() ? "" : ", ") + k.backend;
  throw InputError("no kernel for op '" + std::string(op) + "' on backend '" + std::string(backend) + "' (backends: " +
                   names + ")");
}

std::vector<std::string> backends() {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const Kernel& k : kernels())
    if (seen.insert(k.backend).second) out.push_back(k.backend);
  return out;
}

}  // namespace fp8ref::golden
