// fp8ref quantize / dequantize — FP8 quantization of .npy arrays "as <stack> does" (include/fp8ref/quant.h).
//
// Everything (arguments, convention, overrides, files, dtypes, shapes, static scales) is validated before any
// output is written, and each output is written atomically: on bad input nothing is written and the exit code is 2.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/error.h"
#include "fp8ref/format.h"
#include "fp8ref/io.h"
#include "fp8ref/quant.h"
#include "scales_file.h"

namespace fp8ref::cli {
namespace {

const char* kQuantizeHelp =
    "Usage: fp8ref quantize --from f32|bf16|f16 --to FMT --convention NAME [--granularity G] [overrides]\n"
    "                       IN.npy Q.npy SCALES.npy\n"
    "       fp8ref quantize ... --static SCALES_IN.npy IN.npy Q.npy\n"
    "\n"
    "Quantizes an array to FP8 codes with scales per tensor, row, column, 1xG group, BmxBk block or MX block,\n"
    "reproducing a real implementation step by step (--convention), or the exact contract (--convention exact).\n"
    "Dynamic (default): scales from each group's amax, written to SCALES.npy. Static (--static FILE): the scales\n"
    "are given and only Q.npy is written.\n"
    "\n"
    "Files: IN is '<f4' (f32), '<f2' (f16) or a '<u2' array of bf16 bit patterns; Q is written as uint8 codes of\n"
    "the same shape. SCALES has the scales' logical shape (data [..., M, K] with group:G -> [..., M, ceil(K/G)];\n"
    "row -> [..., M, 1]; col -> [1, ..., K]; tensor -> [1, ..., 1]; block:BmxBk -> [..., ceil(M/Bm), ceil(K/Bk)])\n"
    "and holds float32 values (bf16/f16/ue8m0 scales exactly widened), or uint8 E8M0 codes with\n"
    "--scale-dtype ue8m0 --scale-codes. --scale-layout stores them transformed: col-major [..., C, R] for logical\n"
    "[..., R, C]; tma-aligned [..., C, Ra] with R padded to 16 bytes of the scales' storage in the stack (4 rows\n"
    "for f32, and for ue8m0 held as f32: deepgemm, vllm-group, deepseek-act-quant, sglang-triton; 8 bf16/f16; 16\n"
    "E8M0 bytes), pads 0 (either ue8m0 padding is read back); packed-ue8m0: an int32 array [..., ceil(C/4),\n"
    "align4(R)], byte j of word [p, r] = the E8M0 code of scale [r, 4p+j] (DeepGEMM/sglang). A --static file is\n"
    "read in the same layout.\n"
    "\n"
    "Conventions (the default granularity in brackets):\n"
    "  exact               scale = amax/max rounded once, q = x/s rounded once [group:128]\n"
    "  vllm-group          vLLM per_token_group_quant_fp8 (CUDA) [group:128]\n"
    "  vllm-per-token      vLLM dynamic per-token scaled_fp8_quant [row]\n"
    "  deepseek-act-quant  DeepSeek-V3 act_quant (Triton) [group:128]\n"
    "  deepgemm            DeepGEMM per_token_cast_to_fp8 (torch on CUDA) [group:128]\n"
    "  sglang-triton       sglang per_token_group_quant_fp8, Triton, row-major [group:128]\n"
    "  sglang-triton-colmajor  sglang Triton colmajor kernel, x/s, tma-aligned scales [group:128]\n"
    "  sgl-kernel          sglang sgl-kernel CUDA per_token_group_quant_8bit (ue8m0: packed-ue8m0) [group:128]\n"
    "  sglang-jit          sglang JIT CUDA per_token_group_quant (ue8m0: packed-ue8m0) [group:128]\n"
    "  mx                  OCP MX v1.0 (E8M0 scales, floor rule) [mx:32]\n"
    "\n"
    "Options:\n"
    "  --from F              f32, bf16, f16\n"
    "  --to FMT              e4m3fn, e5m2, e4m3fnuz, e5m2fnuz (each convention defines some)\n"
    "  --convention NAME     see above\n"
    "  --granularity G       tensor, row, col, group:G, block:BmxBk, mx:32\n"
    "  --scale-dtype D       f32, bf16, f16, ue8m0 (picks the convention's variant, e.g. vllm-group ue8m0)\n"
    "  --scale-codes         ue8m0 scales as uint8 E8M0 codes instead of float32 values\n"
    "  --static FILE         static quantization with these scales\n"
    "  --exact FILE          also write x/s (by the stored scale) as float64, before any rounding\n"
    "  --backend B           cpu (default) or reference\n"
    "  --verbose             print the resolved spec and the shapes (one line)\n"
    "  -h, --help            this help\n"
    "\n"
    "Overrides of the convention's fields (include/fp8ref/quant.h defines each):\n"
    "  --tail error|partial                     a last group shorter than G (partial = zero padding)\n"
    "  --amax-nan ignore|propagate              NaN in amax: skipped (fmaxf) or poisoning (torch)\n"
    "  --guard none|amax-floor:E|min-scale:M    (or both, comma-separated)\n"
    "  --scale-formula 'amax/max'|'amax*(1/max)'|exact\n"
    "  --scale-round rne|pow2-ceil|pow2-ceil-clamp|mx-floor\n"
    "  --scale-store native|f32                 ue8m0 held as E8M0 codes or as f32 powers of two\n"
    "  --formula 'x/s'|'x*(1/s)'|'x*(max/amax)'|'x*(max*rcp(amax))'|exact|'x*rcp-bits(s)'|'x*rcp-bits(s)@in'\n"
    "  --div ieee|triton-nv                     every `/`: IEEE, or Triton's div.full.f32 on NVIDIA (bit-exact)\n"
    "  --scale-layout row-major|col-major|tma-aligned|packed-ue8m0   how SCALES is stored (see Files)\n"
    "  --clamp none|nan-to-max|nan-to-min|nan-kept\n"
    "  --fp8-max V|finfo                        e.g. 224 for e4m3fnuz as vLLM and sglang use\n"
    "  --cast CONVENTION                        the final cast (fp8ref convert's conventions)\n"
    "\n"
    "Examples:\n"
    "  fp8ref quantize --from bf16 --to e4m3fn --convention vllm-group x.npy q.npy s.npy\n"
    "  fp8ref quantize --from bf16 --to e4m3fn --convention deepgemm --scale-dtype ue8m0 --scale-codes x.npy q.npy s.npy\n"
    "  fp8ref quantize --from f32 --to e4m3fn --convention exact --granularity block:128x128 w.npy q.npy s.npy\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

const char* kDequantizeHelp =
    "Usage: fp8ref dequantize --from FMT --granularity G [--scale-dtype D] [--scale-codes] [--to f32|bf16|f16]\n"
    "                         Q.npy SCALES.npy OUT.npy\n"
    "\n"
    "x = value(q) * scale per element: the product rounded once to f32 (one f32 multiply); for --to bf16/f16 then\n"
    "rounded to that type (RNE). NaN codes, NaN scales and Inf*0 give the canonical NaN 0x7FFFFFFF.\n"
    "\n"
    "Files: Q is uint8 codes; SCALES has the logical scale shape (see fp8ref quantize --help), float32 values, or\n"
    "uint8 E8M0 codes with --scale-dtype ue8m0 --scale-codes. OUT is float32, float16, or uint16 bf16 bit patterns.\n"
    "\n"
    "Options:\n"
    "  --from FMT            the codes' format: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz\n"
    "  --granularity G       tensor, row, col, group:G, block:BmxBk, mx:32\n"
    "  --scale-dtype D       f32 (default), bf16, f16, ue8m0: values in SCALES must be exact in D\n"
    "  --scale-codes         ue8m0 scales given as uint8 codes\n"
    "  --scale-store S       ue8m0: native (code 0 = 2^-127, default) or f32 (code 0 = 0.0, as f32-held scales)\n"
    "  --tail error|partial  allow a last group shorter than G\n"
    "  --scale-layout L      row-major (default), col-major, tma-aligned, packed-ue8m0 (see fp8ref quantize --help)\n"
    "  --to T                f32 (default), bf16, f16\n"
    "  --backend B           cpu (default) or reference\n"
    "  -h, --help            this help\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

const char* const kOverrides[] = {"tail", "amax-nan", "guard", "scale-formula", "scale-round", "scale-store",
                                  "formula", "clamp", "fp8-max", "cast", "div", "scale-layout"};

std::string numpy_name(io::DType d) {
  switch (d) {
    case io::DType::U8: return "uint8";
    case io::DType::U16: return "uint16";
    case io::DType::F16: return "float16";
    case io::DType::F32: return "float32";
    case io::DType::F64: return "float64";
    default: return io::dtype_name(d);
  }
}

Format parse_format_flag(const char* flag, const std::string& v) {
  Format f;
  if (!parse_format(v, &f)) throw InputError(std::string("unknown format '") + v + "' for " + flag);
  return f;
}

// The .npy dtype of a quantize source.
io::DType source_dtype(Format f) { return f == Format::bf16 ? io::DType::U16 : io::format_dtype(f); }

io::Tensor read_typed(const std::string& path, io::DType want, const std::string& why) {
  io::Tensor t = io::read_npy(path);
  if (t.dtype != want) throw InputError(path + ": dtype " + numpy_name(t.dtype) + ", expected " + numpy_name(want) + " " + why);
  return t;
}

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }

// Reads scales (in spec.scale_layout) into their logical storage bytes (scale_storage(spec)), checking every value
// fits.
std::vector<uint8_t> read_scales(const std::string& path, const QuantSpec& spec, bool codes, const QuantLayout& L) {
  const Format st = scale_storage(spec);
  const bool ue8m0 = spec.scale_dtype == ScaleDtype::ue8m0;
  const StoredScaleShape stored = stored_scales(spec, L);
  const std::string layout = to_string(spec.scale_layout);
  auto shape_error = [&](const io::Tensor& t) {
    return InputError(path + ": shape " + shape_text(t.shape) + ", but granularity " + to_string(spec.granularity) +
                      " with scale-layout " + layout + " needs scales of shape " + shape_text(stored.shape) +
                      (spec.scale_layout == ScaleLayout::row_major ? std::string()
                                                                    : " (logical " + shape_text(L.scale_shape) + ")"));
  };
  if (stored.packed) {  // int32 words of 4 E8M0 codes: every byte is a code
    const io::Tensor t = read_typed(path, io::DType::I32, "(packed-ue8m0: int32 words of 4 E8M0 codes)");
    if (t.shape != stored.shape) throw shape_error(t);
    return unlayout_scales(spec, L, t.data.data());
  }
  io::Tensor t = read_typed(path, codes ? io::DType::U8 : io::DType::F32,
                            codes ? "(E8M0 codes, --scale-codes)" : "(scale values)");
  size_t align_bytes = static_cast<size_t>(format_info(st).bits / 8);  // the storage whose 16 bytes pad tma-aligned
  if (t.shape != stored.shape && spec.scale_layout == ScaleLayout::tma_aligned && ue8m0) {
    // ue8m0 scales padded as E8M0 bytes (16 rows) or as the f32 the kernel held them in (4 rows: deepgemm,
    // vllm-group, sglang-triton): either reads (the pad rows are ignored)
    for (size_t alt : {size_t{1}, size_t{4}})
      if (stored_scale_shape(spec.scale_layout, L.scale_shape, io::dtype_size(t.dtype), true, alt).shape == t.shape)
        align_bytes = alt;
    if (stored_scale_shape(spec.scale_layout, L.scale_shape, io::dtype_size(t.dtype), true, align_bytes).shape != t.shape)
      throw shape_error(t);
  } else if (t.shape != stored.shape) {
    throw shape_error(t);
  }
  if (spec.scale_layout != ScaleLayout::row_major) {  // to the logical order (the file may hold wider elements)
    t.data = from_scale_layout(spec.scale_layout, L.scale_shape, io::dtype_size(t.dtype), ue8m0, t.data.data(),
                               align_bytes);
    t.shape = L.scale_shape;
  }
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<uint8_t> out(n * static_cast<size_t>(format_info(st).bits / 8));
  for (size_t i = 0; i < n; ++i) {
    auto bad = [&](const std::string& why) {
      uint32_t b;
      std::memcpy(&b, &t.data[4 * i], 4);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f32_of(b)));
      return InputError(path + ": scale [" + std::to_string(i) + "] (flat index) = " + buf + " " + why);
    };
    if (codes) {
      const uint8_t c = t.data[i];
      if (st == Format::ue8m0) {
        out[i] = c;
      } else {  // ue8m0 held as f32
        const uint32_t b = c == 0xFF ? 0x7FFFFFFFu : static_cast<uint32_t>(c) << 23;
        std::memcpy(&out[4 * i], &b, 4);
      }
      continue;
    }
    uint32_t b;
    std::memcpy(&b, &t.data[4 * i], 4);
    const uint32_t mag = b & 0x7FFFFFFFu;
    const bool nan = mag > 0x7F800000u;
    if (st == Format::f32) {
      if (ue8m0 && !nan && (b >> 31 || (mag != 0 && mag != 0x7F800000u && (mag & 0x7FFFFF) != 0)))
        throw bad("is not 0, a positive power of two (normal f32), +Inf or NaN: not a ue8m0 scale held as f32");
      std::memcpy(&out[4 * i], &b, 4);
    } else if (st == Format::ue8m0) {
      if (nan) {
        out[i] = 0xFF;
      } else {
        const double v = f32_of(b);
        int e = 0;
        const double m = std::frexp(v, &e);
        if (!(v > 0) || std::isinf(v) || m != 0.5 || e - 1 < -127 || e - 1 > 127)
          throw bad("is not a power of two in [2^-127, 2^127]: not an E8M0 scale (use --scale-codes for codes; "
                    "ue8m0 scales held as f32, where 0 and +Inf occur, need --scale-store f32)");
        out[i] = static_cast<uint8_t>(e - 1 + 127);
      }
    } else {  // bf16 / f16: exactly representable
      const uint64_t h = ref::narrow(Format::f32, b, st);
      const uint32_t back = static_cast<uint32_t>(ref::narrow(st, h, Format::f32));
      if (back != b && !(nan && (back & 0x7FFFFFFFu) > 0x7F800000u))
        throw bad(std::string("is not exactly representable in ") + format_name(st));
      const uint16_t h16 = static_cast<uint16_t>(h);
      std::memcpy(&out[2 * i], &h16, 2);
    }
  }
  return out;
}

// The layout of a tensor read from `path`; its shape errors name the file and the command.
QuantLayout layout_of(const QuantSpec& spec, const io::Tensor& t, const std::string& path, const char* command) {
  try {
    QuantLayout L = quant_layout(spec, t.shape);
    (void)stored_scales(spec, L);  // (the scale layout's own shape requirements)
    return L;
  } catch (const InputError& e) {
    std::string m = e.what();
    if (m.rfind("quantize: ", 0) == 0) m = m.substr(10);
    throw InputError(path + ": " + command + ": " + m);
  }
}

std::string backend_of(const Args& args) {
  const std::string b = args.get("--backend").value_or("cpu");
  if (b != "cpu" && b != "reference") throw UsageError("unknown backend '" + b + "' for --backend (cpu, reference)");
  return b;
}

int quantize_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--from"}, {"--to"}, {"--convention"}, {"--granularity"}, {"--scale-dtype"}, {"--scale-codes", Kind::flag},
             {"--static"}, {"--exact"}, {"--backend"}, {"--verbose", Kind::flag}, {"--tail"}, {"--amax-nan"}, {"--guard"},
             {"--scale-formula"}, {"--scale-round"}, {"--scale-store"}, {"--formula"}, {"--clamp"}, {"--fp8-max"},
             {"--cast"}, {"--div"}, {"--scale-layout"}});
  const std::string from_name = args.require("--from"), to_name = args.require("--to");
  const std::string convention = args.require("--convention");
  const std::optional<std::string> static_path = args.get("--static"), exact_path = args.get("--exact");
  const bool dynamic = !static_path;
  if (dynamic) args.expect_positionals({"IN", "Q", "SCALES"});
  else args.expect_positionals({"IN", "Q"});
  const std::string in_path = args.positionals()[0], q_path = args.positionals()[1];
  const std::string scales_path = dynamic ? args.positionals()[2] : *static_path;
  std::vector<std::string> paths = {in_path, q_path, scales_path};  // outputs: Q, SCALES (dynamic), EXACT
  std::vector<size_t> outs = {1};
  if (dynamic) outs.push_back(2);
  if (exact_path) {
    paths.push_back(*exact_path);
    outs.push_back(3);
  }
  check_paths(paths, outs);
  const std::string backend = backend_of(args);
  const bool codes = args.has("--scale-codes");

  const Format from = parse_format_flag("--from", from_name);
  if (from != Format::f32 && from != Format::bf16 && from != Format::f16)
    throw InputError("--from " + from_name + ": quantize reads f32, bf16 (uint16 bit patterns) or f16");
  const Format to = parse_format_flag("--to", to_name);
  std::optional<ScaleDtype> dt;
  if (auto v = args.get("--scale-dtype")) {
    ScaleDtype d;
    if (!parse_scale_dtype(*v, &d)) throw InputError("unknown --scale-dtype '" + *v + "' (f32, bf16, f16, ue8m0)");
    dt = d;
  }
  std::string err;
  std::optional<QuantSpec> spec = resolve_quant_convention(convention, to, dt, &err);
  if (!spec) throw InputError(err);
  if (auto g = args.get("--granularity"))
    if (!apply_quant_override("granularity", *g, &*spec, &err)) throw InputError(err);
  for (const char* f : kOverrides)
    if (auto v = args.get(std::string("--") + f))
      if (!apply_quant_override(f, *v, &*spec, &err)) throw InputError("--" + std::string(f) + ": " + err);
  finalize_quant_spec(&*spec, dynamic);
  if (codes && spec->scale_layout == ScaleLayout::packed_ue8m0)
    throw InputError("--scale-codes: packed-ue8m0 scales are written as int32 words of 4 E8M0 codes already");
  if (codes && spec->scale_dtype != ScaleDtype::ue8m0)
    throw InputError(std::string("--scale-codes writes E8M0 codes: it needs ue8m0 scales, not ") + to_string(spec->scale_dtype));

  const io::Tensor in = read_typed(in_path, source_dtype(from),
                                   "for --from " + from_name + (from == Format::bf16 ? " (bf16 bit patterns)" : ""));
  const QuantLayout L = layout_of(*spec, in, in_path, "quantize");
  const size_t scale_bytes = static_cast<size_t>(L.n_scales) * static_cast<size_t>(format_info(scale_storage(*spec)).bits / 8);
  std::vector<uint8_t> storage(scale_bytes);
  if (!dynamic) storage = read_scales(scales_path, *spec, codes, L);

  io::Tensor q = io::make_tensor("", io::DType::U8, in.shape);
  io::Tensor exact = io::make_tensor("", io::DType::F64, exact_path ? in.shape : std::vector<int64_t>{0});
  double* ex = exact_path ? reinterpret_cast<double*>(exact.data.data()) : nullptr;
  // cpu: src/cpu/quant_cpu.cc (Highway + OpenMP; it runs the reference itself for the specs it does not vectorise)
  const bool cpu_backend = backend == "cpu";
  if (dynamic && cpu_backend) cpu::quantize(*spec, from, in.data.data(), in.shape, q.data.data(), storage.data(), ex);
  else if (dynamic) ref::quantize(*spec, from, in.data.data(), in.shape, q.data.data(), storage.data(), ex);
  else if (cpu_backend) cpu::quantize_static(*spec, from, in.data.data(), in.shape, storage.data(), q.data.data(), ex);
  else ref::quantize_static(*spec, from, in.data.data(), in.shape, storage.data(), q.data.data(), ex);

  const io::Tensor s_out = dynamic ? stored_scales_file(*spec, codes, storage, L) : io::Tensor{};
  io::OutputFiles files;  // all written, or none
  files.add_npy(q_path, q);
  if (dynamic) files.add_npy(scales_path, s_out);
  if (exact_path) files.add_npy(*exact_path, exact);
  files.commit();
  if (args.has("--verbose"))
    std::printf("quantize from=%s %s mode=%s shape=%s scales=%s backend=%s\n", format_name(from), spec->describe().c_str(),
                dynamic ? "dynamic" : "static", shape_text(in.shape).c_str(), shape_text(L.scale_shape).c_str(),
                cpu_backend ? ("cpu: " + cpu::quant_path(*spec, dynamic, ex != nullptr)).c_str() : "reference");
  return 0;
}

int dequantize_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--from"}, {"--to"}, {"--granularity"}, {"--scale-dtype"}, {"--scale-codes", Kind::flag},
             {"--scale-store"}, {"--tail"}, {"--backend"}, {"--scale-layout"}});
  const std::string from_name = args.require("--from");
  const std::string gran = args.require("--granularity");
  args.expect_positionals({"Q", "SCALES", "OUT"});
  const std::string q_path = args.positionals()[0], s_path = args.positionals()[1], out_path = args.positionals()[2];
  check_paths({q_path, s_path, out_path}, {2});
  const bool cpu_backend = backend_of(args) == "cpu";
  const bool codes = args.has("--scale-codes");

  QuantSpec spec;
  spec.to = parse_format_flag("--from", from_name);
  if (!is_fp8(spec.to) || spec.to == Format::ue8m0)
    throw InputError("--from " + from_name + ": dequantize reads FP8 codes (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz)");
  const Format out_format = parse_format_flag("--to", args.get("--to").value_or("f32"));
  if (out_format != Format::f32 && out_format != Format::bf16 && out_format != Format::f16)
    throw InputError("--to: dequantize writes f32, bf16 or f16");
  if (auto v = args.get("--scale-dtype"))
    if (!parse_scale_dtype(*v, &spec.scale_dtype)) throw InputError("unknown --scale-dtype '" + *v + "' (f32, bf16, f16, ue8m0)");
  std::string err;
  if (!apply_quant_override("granularity", gran, &spec, &err)) throw InputError(err);
  for (const char* f : {"tail", "scale-store", "scale-layout"})
    if (auto v = args.get(std::string("--") + f))
      if (!apply_quant_override(f, *v, &spec, &err)) throw InputError("--" + std::string(f) + ": " + err);
  if (spec.scale_dtype != ScaleDtype::ue8m0 && (codes || spec.scale_store != ScaleStore::native))
    throw InputError("--scale-codes and --scale-store apply to --scale-dtype ue8m0");
  if (codes && spec.scale_layout == ScaleLayout::packed_ue8m0)
    throw InputError("--scale-codes: packed-ue8m0 scales are read as int32 words of 4 E8M0 codes already");
  if (spec.granularity.kind == GranularityKind::mx && spec.scale_dtype != ScaleDtype::ue8m0)
    throw InputError("granularity mx:32 has ue8m0 scales: pass --scale-dtype ue8m0");

  const io::Tensor q = read_typed(q_path, io::DType::U8, std::string("(") + format_name(spec.to) + " codes)");
  const QuantLayout L = layout_of(spec, q, q_path, "dequantize");
  const std::vector<uint8_t> storage = read_scales(s_path, spec, codes, L);
  io::Tensor out = io::make_tensor("", out_format == Format::bf16 ? io::DType::U16 : io::format_dtype(out_format), q.shape);
  if (cpu_backend) cpu::dequantize(spec, q.data.data(), q.shape, storage.data(), out_format, out.data.data());
  else ref::dequantize(spec, q.data.data(), q.shape, storage.data(), out_format, out.data.data());
  io::write_npy(out_path, out);
  return 0;
}

}  // namespace

const Command kCmd_quantize = {"quantize", "quantize .npy arrays to FP8 with scales, as a named stack does",
                               &quantize_main, kQuantizeHelp};
const Command kCmd_dequantize = {"dequantize", "FP8 codes times their scales, back to f32/bf16/f16",
                                 &dequantize_main, kDequantizeHelp};

}  // namespace fp8ref::cli
