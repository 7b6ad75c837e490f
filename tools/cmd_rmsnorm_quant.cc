// fp8ref rmsnorm-quant — fused (residual add +) RMSNorm + FP8 group quantization of .npy arrays "as <stack> does"
// (include/fp8ref/rmsnorm.h). Everything is validated before any output is written; each output is written
// atomically; on bad input nothing is written and the exit code is 2.
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "fp8ref/rmsnorm.h"
#include "scales_file.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref rmsnorm-quant --from f32|bf16|f16 --to FMT --convention NAME [--group G]\n"
    "                            [--residual R.npy --residual-out R2.npy] [--eps E] [overrides]\n"
    "                            IN.npy WEIGHT.npy Q.npy SCALES.npy\n"
    "\n"
    "Fused RMSNorm + FP8 group quantization, as a real kernel rounds it (--convention), or the exact contract:\n"
    "  z = x (+ residual); r = rsqrt(mean(z^2) + eps); y = z * r * weight; q, scales = group quant of y.\n"
    "Each convention fixes every rounding: the residual sum, the order of the sum of squares, rsqrt, where the\n"
    "normed value is rounded to the input dtype, and the group quant (include/fp8ref/rmsnorm.h lists them).\n"
    "\n"
    "Files: IN [..., K], WEIGHT [K] and the residual [..., K] are '<f4' (f32), '<f2' (f16) or '<u2' arrays of bf16\n"
    "bit patterns (all of the --from type). Q is written as uint8 codes of IN's shape, SCALES as float32 values\n"
    "[..., ceil(K/G)] (exact in the scale dtype), or uint8 E8M0 codes with --scale-dtype ue8m0 --scale-codes, and\n"
    "with --residual the updated residual (x + residual, in the --from type) to --residual-out.\n"
    "\n"
    "Conventions:\n"
    "  exact                every step rounded once (exact mean of squares, correctly rounded rsqrt, exact quant)\n"
    "  aiter-rmsnorm-quant  ROCm aiter fused_rms_fp8_group_quant (Triton): f32 y, s = amax/max, q = clamp(y*(1/s))\n"
    "                       (the device's sum order and rsqrt are not modelled: not bit-exact in the last ulp of r)\n"
    "  vllm-rmsnorm-quant   vLLM rms_norm_per_block_quant (CUDA): cub sum order, y = bf16(bf16(z*r)*w),\n"
    "                       s = max(amax/448, 1/(448*512)), q = clamp(y/s), rsqrtf bit for bit (H200 capture)\n"
    "  deepseek-rmsnorm     DeepSeek-V3 RMSNorm (bf16(w*z*r)) then act_quant (the torch mean is not modelled)\n"
    "\n"
    "Options:\n"
    "  --from F              f32, bf16, f16 (x, weight and residual)\n"
    "  --to FMT              e4m3fn, e5m2, e4m3fnuz, e5m2fnuz (each convention defines some)\n"
    "  --convention NAME     see above\n"
    "  --group G             group size along K (default 128); --granularity row for one scale per row\n"
    "  --scale-dtype D       f32 (default), bf16, f16, ue8m0: the scale variant of the convention's group quant,\n"
    "                        e.g. deepseek-rmsnorm ue8m0 (DeepSeek-V3.1+ act_quant scale_fmt=\"ue8m0\"), exact any\n"
    "  --scale-codes         ue8m0 scales as uint8 E8M0 codes instead of float32 values\n"
    "  --residual FILE       add this residual first; needs --residual-out\n"
    "  --residual-out FILE   where the updated residual goes\n"
    "  --eps E               epsilon (default 1e-6), rounded to f32\n"
    "  --normed FILE         also write y (what the quantizer sees) as float32\n"
    "  --exact FILE          also write y/s (by the stored scale) as float64, before the cast\n"
    "  --rms FILE            also write each row's r = rsqrt(mean(z^2) + eps) as float32 [...] (IN's shape without K)\n"
    "  --backend B           cpu (default) or reference\n"
    "  --verbose             print the resolved spec and the shapes (one line)\n"
    "  -h, --help            this help\n"
    "\n"
    "Overrides of the convention's fields:\n"
    "  --residual-sum f32|dtype               x + residual kept in f32, or rounded to the input dtype first\n"
    "  --variance exact|f32-seq|cub:auto|cub:T  the sum of squares (cub:T = vLLM's block reduce, T threads)\n"
    "  --rsqrt rn|ieee|cuda-rsqrtf            correctly rounded, 1/sqrtf, or CUDA rsqrtf (MUFU.RSQ, captured)\n"
    "  --weight-round f32|dtype-twice|dtype-once   y = z*r*w in f32 / bf16(bf16(z*r)*w) / bf16(z*r*w)\n"
    "  --scale-layout row-major|col-major|tma-aligned|packed-ue8m0   how SCALES is stored: col-major [ceil(K/G), M]\n"
    "                                         (vLLM is_scale_transposed), tma-aligned [ceil(K/G), align4(M)]\n"
    "                                         (DeepGEMM), packed-ue8m0 (4 E8M0 codes per int32, DeepGEMM on sm100)\n"
    "  --granularity, --tail, --amax-nan, --guard, --scale-formula, --scale-round, --scale-store, --formula,\n"
    "  --clamp, --fp8-max, --cast, --div\n"
    "                                         the group quant's fields, as in fp8ref quantize --help\n"
    "\n"
    "Examples:\n"
    "  fp8ref rmsnorm-quant --from bf16 --to e4m3fn --convention vllm-rmsnorm-quant x.npy w.npy q.npy s.npy\n"
    "  fp8ref rmsnorm-quant --from bf16 --to e4m3fnuz --convention aiter-rmsnorm-quant --residual r.npy \\\n"
    "      --residual-out r2.npy x.npy w.npy q.npy s.npy\n"
    "  fp8ref rmsnorm-quant --from bf16 --to e4m3fn --convention deepseek-rmsnorm --scale-dtype ue8m0 --scale-codes \\\n"
    "      x.npy w.npy q.npy s.npy\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

// CLI flag -> spec field (apply_rmsnorm_override).
const std::pair<const char*, const char*> kOverrides[] = {
    {"--residual-sum", "residual-sum"}, {"--variance", "variance"},       {"--rsqrt", "rsqrt"},
    {"--weight-round", "weight"},       {"--granularity", "granularity"}, {"--tail", "tail"},
    {"--amax-nan", "amax-nan"},         {"--guard", "guard"},             {"--scale-formula", "scale-formula"},
    {"--formula", "formula"},           {"--clamp", "clamp"},             {"--fp8-max", "fp8-max"},
    {"--cast", "cast"},                 {"--group", "group"},             {"--eps", "eps"},
    {"--scale-layout", "scale-layout"}, {"--scale-round", "scale-round"}, {"--scale-store", "scale-store"},
    {"--div", "div"}};

io::Tensor read_source(const std::string& path, Format from, const char* what) {
  io::Tensor t = io::read_npy(path);
  const io::DType want = from == Format::bf16 ? io::DType::U16 : io::format_dtype(from);
  if (t.dtype != want)
    throw InputError(path + " (" + what + "): dtype " + io::dtype_name(t.dtype) + ", expected " + io::dtype_name(want) +
                     (from == Format::bf16 ? " (bf16 bit patterns as uint16)" : "") + " for --from " + format_name(from));
  return t;
}

int rmsnorm_quant_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--from"}, {"--to"}, {"--convention"}, {"--group"}, {"--residual"}, {"--residual-out"}, {"--eps"},
             {"--normed"}, {"--exact"}, {"--rms"}, {"--backend"}, {"--verbose", Kind::flag}, {"--residual-sum"}, {"--variance"},
             {"--rsqrt"}, {"--weight-round"}, {"--granularity"}, {"--tail"}, {"--amax-nan"}, {"--guard"},
             {"--scale-formula"}, {"--formula"}, {"--clamp"}, {"--fp8-max"}, {"--cast"}, {"--scale-layout"},
             {"--scale-dtype"}, {"--scale-codes", Kind::flag}, {"--scale-round"}, {"--scale-store"}, {"--div"}});
  const std::string from_name = args.require("--from"), to_name = args.require("--to");
  const std::string convention = args.require("--convention");
  args.expect_positionals({"IN", "WEIGHT", "Q", "SCALES"});
  const auto& pos = args.positionals();
  const std::optional<std::string> res_path = args.get("--residual"), res_out = args.get("--residual-out");
  const std::optional<std::string> normed_path = args.get("--normed"), exact_path = args.get("--exact");
  const std::optional<std::string> rms_path = args.get("--rms");
  if (res_path.has_value() != res_out.has_value())
    throw UsageError("--residual and --residual-out go together (the op returns the updated residual)");
  if (args.has("--group") && args.has("--granularity")) throw UsageError("give --group or --granularity, not both");
  std::vector<std::string> paths(pos.begin(), pos.end());  // inputs IN, WEIGHT (and RESIDUAL); the rest outputs
  std::vector<size_t> outs = {2, 3};
  if (res_path) paths.push_back(*res_path);
  for (const auto* p : {&res_out, &normed_path, &exact_path, &rms_path})
    if (*p) {
      outs.push_back(paths.size());
      paths.push_back(**p);
    }
  check_paths(paths, outs);
  const std::string backend = args.get("--backend").value_or("cpu");
  if (backend != "cpu" && backend != "reference")
    throw UsageError("unknown backend '" + backend + "' for --backend (cpu, reference)");

  Format from, to;
  if (!parse_format(from_name, &from)) throw InputError("unknown format '" + from_name + "' for --from");
  if (from != Format::f32 && from != Format::bf16 && from != Format::f16)
    throw InputError("--from " + from_name + ": rmsnorm-quant reads f32, bf16 (uint16 bit patterns) or f16");
  if (!parse_format(to_name, &to)) throw InputError("unknown format '" + to_name + "' for --to");
  std::optional<ScaleDtype> dt;
  if (auto v = args.get("--scale-dtype")) {
    ScaleDtype d;
    if (!parse_scale_dtype(*v, &d)) throw InputError("unknown --scale-dtype '" + *v + "' (f32, bf16, f16, ue8m0)");
    dt = d;
  }
  std::string err;
  std::optional<RmsNormQuantSpec> spec = resolve_rmsnorm_quant_convention(convention, to, &err, dt);
  if (!spec) throw InputError(err);
  for (const auto& [flag, field] : kOverrides)
    if (auto v = args.get(flag))
      if (!apply_rmsnorm_override(field, *v, &*spec, &err)) throw InputError(std::string(flag) + ": " + err);
  finalize_rmsnorm_quant_spec(&*spec);
  const bool codes = args.has("--scale-codes");
  if (codes && spec->quant.scale_layout == ScaleLayout::packed_ue8m0)
    throw InputError("--scale-codes: packed-ue8m0 scales are written as int32 words of 4 E8M0 codes already");
  if (codes && spec->quant.scale_dtype != ScaleDtype::ue8m0)
    throw InputError(std::string("--scale-codes writes E8M0 codes: it needs ue8m0 scales, not ") +
                     to_string(spec->quant.scale_dtype));

  const io::Tensor x = read_source(pos[0], from, "IN");
  const io::Tensor w = read_source(pos[1], from, "WEIGHT");
  std::optional<io::Tensor> r;
  if (res_path) r = read_source(*res_path, from, "--residual");
  RmsNormLayout L;
  try {
    L = rmsnorm_layout(*spec, from, x.shape, w.shape, r ? &r->shape : nullptr);
  } catch (const InputError& e) {
    throw InputError(pos[0] + " " + shape_text(x.shape) + ", " + pos[1] + " " + shape_text(w.shape) +
                     (r ? ", " + *res_path + " " + shape_text(r->shape) : std::string()) + ": " + e.what());
  }

  io::Tensor q = io::make_tensor("", io::DType::U8, x.shape);
  std::vector<uint8_t> storage(static_cast<size_t>(L.quant.n_scales) *
                               static_cast<size_t>(format_info(scale_storage(spec->quant)).bits / 8));
  io::Tensor r2 = io::make_tensor("", x.dtype, r ? x.shape : std::vector<int64_t>{0});
  io::Tensor normed = io::make_tensor("", io::DType::F32, normed_path ? x.shape : std::vector<int64_t>{0});
  io::Tensor exact = io::make_tensor("", io::DType::F64, exact_path ? x.shape : std::vector<int64_t>{0});
  const std::vector<int64_t> row_shape(x.shape.begin(), x.shape.end() - 1);
  io::Tensor rms = io::make_tensor("", io::DType::F32, rms_path ? row_shape : std::vector<int64_t>{0});
  RmsNormQuantArgs a;
  a.from = from;
  a.x = x.data.data();
  a.weight = w.data.data();
  a.shape = x.shape;
  a.weight_shape = w.shape;
  a.q = q.data.data();
  a.scales = storage.data();
  if (r) {
    a.residual = r->data.data();
    a.residual_out = r2.data.data();
  }
  if (normed_path) a.normed = reinterpret_cast<float*>(normed.data.data());
  if (exact_path) a.exact_q = reinterpret_cast<double*>(exact.data.data());
  if (rms_path) a.rms = reinterpret_cast<float*>(rms.data.data());
  RmsNormQuantSpec logical = *spec;  // the kernels write logical row-major scales; --scale-layout stores them
  logical.quant.scale_layout = ScaleLayout::row_major;
  if (backend == "cpu") cpu::rmsnorm_quant(logical, a);
  else ref::rmsnorm_quant(logical, a);
  const io::Tensor s = stored_scales_file(spec->quant, codes, storage, L.quant);  // values or codes, as stored

  io::OutputFiles files;  // all written, or none
  files.add_npy(pos[2], q);
  files.add_npy(pos[3], s);
  if (r) files.add_npy(*res_out, r2);
  if (normed_path) files.add_npy(*normed_path, normed);
  if (exact_path) files.add_npy(*exact_path, exact);
  if (rms_path) files.add_npy(*rms_path, rms);
  files.commit();
  if (args.has("--verbose"))
    std::printf("rmsnorm-quant from=%s %s shape=%s scales=%s residual=%s backend=%s\n", format_name(from),
                spec->describe().c_str(), shape_text(x.shape).c_str(), shape_text(L.quant.scale_shape).c_str(),
                r ? "yes" : "no", backend.c_str());
  return 0;
}

}  // namespace

const Command kCmd_rmsnorm_quant = {"rmsnorm-quant",
                                    "fused (residual add +) RMSNorm + FP8 group quant of .npy arrays, as a named stack does",
                                    &rmsnorm_quant_main, kHelp};

}  // namespace fp8ref::cli
