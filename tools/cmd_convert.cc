// fp8ref convert — FP8 / UE8M0 encode and decode of whole arrays under a named convention.
//
// Everything is validated (arguments, convention, overrides, input file, dtype, shape) before the output is
// written, and the writers are atomic: on any error no output file exists afterwards.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/format.h"
#include "fp8ref/io.h"
#include "io/internal.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref convert --from f32|f16|bf16|f64 --to FMT --convention NAME [overrides] IN OUT\n"
    "       fp8ref convert --decode --from FMT --convention NAME [--to-container f32|f64] IN OUT\n"
    "\n"
    "Encodes an array to FP8 / UE8M0 codes, or decodes codes back to f32 or f64, exactly as the stack named by\n"
    "--convention does (fp8ref list shows the conventions and the targets each defines).\n"
    "\n"
    "Files: IN and OUT end in .npy or .bin. Encoding reads a .npy of the source type (f32: '<f4', f16: '<f2',\n"
    "f64: '<f8', bf16: a uint16 '<u2' array of bit patterns; big-endian and Fortran-order arrays are accepted)\n"
    "and writes a uint8 .npy of codes with the same shape. Decoding reads uint8 codes and writes f32 or f64.\n"
    "A .bin is raw little-endian data: as input it needs --shape; as output it gets the data only.\n"
    "\n"
    "Options:\n"
    "  --from FMT           source: f32, f16, bf16, f64 (encoding); the FP8 format of the codes (--decode)\n"
    "  --to FMT             target: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, ue8m0\n"
    "  --convention NAME    torch-2.11, cuda-satfinite, cuda-nosat, ml_dtypes, ocp-sat, ocp-nosat, mx, ... \n"
    "  --decode             decode codes instead of encoding\n"
    "  --to-container C     decoded type: f32 (default) or f64\n"
    "  --backend B          cpu (default; SIMD + OpenMP) or reference (the scalar reference encoder)\n"
    "  --shape D0,D1,...    the shape of a .bin input (its size must be the shape times the element size)\n"
    "  --verbose            print the resolved spec, the element count and the backend (one line)\n"
    "  -h, --help           this help\n"
    "\n"
    "Overrides of the convention's fields (encoding only; applied in this order):\n"
    "  --rounding R         rne, rz, ru, rd, rna, stochastic (ue8m0 under cuda-*: rz or ru)\n"
    "  --overflow O         satfinite, saturate, nonsat\n"
    "  --nan N              canonical, keep-sign, payload\n"
    "  --nan-code 0xNN      the NaN code written for a NaN input (its sign bit is set by --nan keep-sign)\n"
    "  --f64-path P         direct, via-f32 (round f64 inputs to f32 first)\n"
    "  --seed S             the seed of --rounding stochastic (refused without it)\n"
    "  --exp-clamp LO:HI    ue8m0: clamp the code to [LO, HI] (DeepGEMM: 1:254)\n"
    "\n"
    "Examples:\n"
    "  fp8ref convert --from f32 --to e4m3fn --convention torch-2.11 x.npy x_fp8.npy\n"
    "  fp8ref convert --decode --from e4m3fn --convention torch-2.11 x_fp8.npy y.npy\n"
    "  fp8ref convert --from bf16 --to ue8m0 --convention cuda-satfinite --rounding ru --shape 64 s.bin s8.bin\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

const char* const kOverrideFields[] = {"rounding", "overflow", "nan", "nan-code", "f64-path", "seed", "exp-clamp"};

enum class Backend { cpu, reference };

// The numpy name of a dtype (as read from a .npy).
std::string numpy_name(io::DType d) {
  switch (d) {
    case io::DType::BOOL: return "bool ('|b1')";
    case io::DType::U8: return "uint8 ('|u1')";
    case io::DType::I8: return "int8 ('|i1')";
    case io::DType::U16: return "uint16 ('<u2')";
    case io::DType::I16: return "int16 ('<i2')";
    case io::DType::U32: return "uint32 ('<u4')";
    case io::DType::I32: return "int32 ('<i4')";
    case io::DType::U64: return "uint64 ('<u8')";
    case io::DType::I64: return "int64 ('<i8')";
    case io::DType::F16: return "float16 ('<f2')";
    case io::DType::F32: return "float32 ('<f4')";
    case io::DType::F64: return "float64 ('<f8')";
    default: return io::dtype_name(d);
  }
}

// The .npy dtype a source format is read from (bf16: uint16 bit patterns), and back for outputs.
io::DType container_dtype(Format f) {
  switch (f) {
    case Format::f32: return io::DType::F32;
    case Format::f16: return io::DType::F16;
    case Format::bf16: return io::DType::U16;
    case Format::f64: return io::DType::F64;
    default: return io::DType::U8;  // FP8 codes
  }
}

std::string fp8_names() {
  std::string s;
  for (Format f : all_formats())
    if (is_fp8(f)) s += (s.empty() ? "" : ", ") + std::string(format_name(f));
  return s;
}

Format parse_format_flag(const std::string& flag, const std::string& value) {
  Format f;
  if (!parse_format(value, &f))
    throw InputError("unknown format '" + value + "' for " + flag + " (formats: " + fp8_names() +
                     ", bf16, f16, f32, f64)");
  return f;
}

std::string shape_csv(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s;
}

std::vector<int64_t> parse_shape(const std::string& s) {
  std::vector<int64_t> shape;
  size_t pos = 0;
  while (true) {
    const size_t comma = s.find(',', pos);
    const std::string part = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (part.empty() || part.size() > 18 || part.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError("--shape '" + s + "': expected non-negative integers separated by commas, e.g. 4,1024");
    shape.push_back(std::stoll(part));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return shape;
}

// Reads IN as a tensor of dtype `want` (a .npy, or a raw .bin with `shape`). `want_text` says why, e.g.
// "float32 ('<f4') for --from f32".
io::Tensor read_input(const std::string& path, const std::optional<std::vector<int64_t>>& shape, io::DType want,
                      const std::string& want_text) {
  if (ends_with(path, ".bin")) {
    uint64_t nbytes = io::dtype_size(want);
    for (int64_t d : *shape)
      if (io::detail::mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes))
        throw InputError("--shape " + shape_csv(*shape) + " is too large");
    io::detail::MappedFile f(path);
    if (f.size() != nbytes)
      throw InputError(path + ": has " + std::to_string(f.size()) + " bytes, but --shape " + shape_csv(*shape) +
                       " of " + want_text + " needs " + std::to_string(nbytes));
    io::Tensor t = io::make_tensor("", want, *shape);
    if (nbytes) std::memcpy(t.data.data(), f.data(), nbytes);
    return t;
  }
  io::Tensor t = io::read_npy(path);
  if (t.dtype != want)
    throw InputError(path + ": dtype " + numpy_name(t.dtype) + ", expected " + want_text);
  return t;
}

void write_output(const std::string& path, const io::Tensor& t) {
  if (ends_with(path, ".bin"))
    io::write_file_atomic(path, t.data);
  else
    io::write_npy(path, t);
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

io::Tensor encode(Format from, const io::Tensor& in, const ConversionSpec& spec, Backend backend) {
  io::Tensor out = io::make_tensor("", io::DType::U8, in.shape);
  const size_t n = static_cast<size_t>(in.numel());
  const uint8_t* src = in.data.data();
  uint8_t* dst = out.data.data();
  if (n == 0) return out;
  if (backend == Backend::cpu) {
    switch (from) {
      case Format::f32: cpu::encode_f32(reinterpret_cast<const float*>(src), dst, n, spec); break;
      case Format::f64: cpu::encode_f64(reinterpret_cast<const double*>(src), dst, n, spec); break;
      default: cpu::encode_bits16(from, reinterpret_cast<const uint16_t*>(src), dst, n, spec); break;
    }
    return out;
  }
  const size_t es = io::dtype_size(in.dtype);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = src + i * es;
    const uint64_t bits = es == 2 ? load<uint16_t>(p) : es == 4 ? load<uint32_t>(p) : load<uint64_t>(p);
    dst[i] = ref::encode(from, bits, spec, i);
  }
  return out;
}

io::Tensor decode(Format from, const io::Tensor& in, Format container, const DecodeSpec& d, Backend backend) {
  io::Tensor out = io::make_tensor("", container_dtype(container), in.shape);
  const size_t n = static_cast<size_t>(in.numel());
  const uint8_t* src = in.data.data();
  if (n == 0) return out;
  if (backend == Backend::cpu) {
    if (container == Format::f32)
      cpu::decode_f32(from, src, reinterpret_cast<float*>(out.data.data()), n, d);
    else
      cpu::decode_f64(from, src, reinterpret_cast<double*>(out.data.data()), n, d);
    return out;
  }
  for (size_t i = 0; i < n; ++i) {
    if (container == Format::f32) {
      const uint32_t b = ref::decode_f32_bits(from, src[i], d);
      std::memcpy(out.data.data() + 4 * i, &b, 4);
    } else {
      const uint64_t b = ref::decode_f64_bits(from, src[i], d);
      std::memcpy(out.data.data() + 8 * i, &b, 8);
    }
  }
  return out;
}

std::string backend_text(Backend b) {
  return b == Backend::cpu ? std::string("cpu(") + cpu::simd_target() + ")" : std::string("reference");
}

int convert_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--from"}, {"--to"}, {"--convention"}, {"--decode", Kind::flag}, {"--to-container"}, {"--backend"},
             {"--shape"}, {"--verbose", Kind::flag}, {"--rounding"}, {"--overflow"}, {"--nan"}, {"--nan-code"},
             {"--f64-path"}, {"--seed"}, {"--exp-clamp"}});
  const bool decoding = args.has("--decode");

  // ---- arguments -----------------------------------------------------------------------------------------------
  const std::string from_name = args.require("--from");
  std::string to_name;
  if (decoding) {
    std::optional<std::string> c = args.get("--to-container"), t = args.get("--to");
    if (c && t && *c != *t) throw UsageError("--to " + *t + " and --to-container " + *c + " disagree");
    to_name = c ? *c : t ? *t : "f32";
  } else {
    if (args.has("--to-container")) throw UsageError("--to-container applies to --decode only");
    to_name = args.require("--to");
  }
  const std::string convention = args.require("--convention");
  args.expect_positionals({"IN", "OUT"});
  const std::string in_path = args.positionals()[0], out_path = args.positionals()[1];

  Backend backend = Backend::cpu;
  if (auto b = args.get("--backend")) {
    if (*b == "reference")
      backend = Backend::reference;
    else if (*b != "cpu")
      throw UsageError("unknown backend '" + *b + "' for --backend (cpu, reference)");
  }
  check_paths({in_path, out_path}, {1}, {".npy", ".bin"});
  std::optional<std::vector<int64_t>> shape;
  if (auto s = args.get("--shape")) shape = parse_shape(*s);
  const bool in_bin = ends_with(in_path, ".bin");
  if (in_bin && !shape) throw UsageError("raw input '" + in_path + "' needs --shape D0,D1,...");
  if (!in_bin && shape) throw UsageError("--shape applies to raw .bin input only; '" + in_path + "' is a .npy");

  const Format from = parse_format_flag("--from", from_name);
  const Format to = parse_format_flag(decoding ? "--to-container" : "--to", to_name);
  std::string err;

  if (decoding) {
    for (const char* f : kOverrideFields)
      if (args.has(std::string("--") + f)) throw UsageError(std::string("--") + f + " applies to encoding, not --decode");
    if (!is_fp8(from))
      throw InputError("--decode --from " + from_name + ": not an FP8 format (" + fp8_names() + ")");
    if (to != Format::f32 && to != Format::f64)
      throw InputError("--to-container " + to_name + ": decoding writes f32 or f64");
    const std::optional<DecodeSpec> d = resolve_decode(convention, from, &err);
    if (!d) throw InputError(err);

    const io::Tensor in = read_input(in_path, shape, io::DType::U8,
                                     std::string("uint8 ('|u1') codes of ") + format_name(from) + " for --decode");
    const io::Tensor out = decode(from, in, to, *d, backend);
    write_output(out_path, out);
    if (args.has("--verbose")) {
      char nan[64];
      std::snprintf(nan, sizeof nan, "nan=0x%08x%s%s", d->nan_f32, d->nan_keep_sign ? " keep-sign" : "",
                    d->nan_payload ? " payload" : "");
      std::printf("decode from=%s convention=%s to=%s %s elements=%lld backend=%s\n", format_name(from),
                  convention.c_str(), format_name(to), nan, static_cast<long long>(in.numel()),
                  backend_text(backend).c_str());
    }
    return 0;
  }

  if (from != Format::f32 && from != Format::f16 && from != Format::bf16 && from != Format::f64)
    throw InputError("--from " + from_name +
                     ": encoding reads f32, f16, bf16 or f64 (use --decode to decode FP8 codes)");
  if (!is_fp8(to)) throw InputError("--to " + to_name + ": not an FP8 target (" + fp8_names() + ")");
  std::optional<ConversionSpec> spec = resolve_convention(convention, from, to, &err);
  if (!spec) throw InputError(err);
  for (const char* f : kOverrideFields) {
    if (auto v = args.get(std::string("--") + f))
      if (!apply_override(convention, f, *v, &*spec, &err)) throw InputError(err);
  }
  if (args.has("--seed") && spec->rounding != Rounding::stochastic)
    throw UsageError(std::string("--seed applies to stochastic rounding; this conversion rounds ") +
                     to_string(spec->rounding) + " (add --rounding stochastic)");

  std::string want = numpy_name(container_dtype(from));
  if (from == Format::bf16) want = "uint16 ('<u2') bf16 bit patterns";
  const io::Tensor in = read_input(in_path, shape, container_dtype(from), want + " for --from " + from_name);
  const io::Tensor out = encode(from, in, *spec, backend);
  write_output(out_path, out);
  if (args.has("--verbose"))
    std::printf("encode from=%s convention=%s %s elements=%lld backend=%s\n", format_name(from), convention.c_str(),
                spec->describe().c_str(), static_cast<long long>(in.numel()), backend_text(backend).c_str());
  return 0;
}

}  // namespace

const Command kCmd_convert = {"convert", "encode arrays to FP8/UE8M0 codes or decode them, under a named convention",
                              &convert_main, kHelp};

}  // namespace fp8ref::cli
