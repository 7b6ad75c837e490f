// fp8ref mma — one FP8 tensor-core instruction, tile by tile, as a measured device model computes it
// (include/fp8ref/mma.h). Everything is validated before D is written (atomically): on bad input nothing is written.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/error.h"
#include "fp8ref/format.h"
#include "fp8ref/io.h"
#include "fp8ref/mma.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref mma --model NAME --format e4m3fn|e5m2 [--format-b e4m3fn|e5m2] A.npy BT.npy C.npy D.npy\n"
    "\n"
    "Runs D = A·B + C through an instruction-level model of an FP8 tensor-core instruction, bit for bit.\n"
    "\n"
    "Models:\n"
    "  mma-sync-sm90   mma.sync.aligned.m16n8k32.row.col.f32.<a>.<b>.f32 on sm_90 (H100/H200, ptxas 13.0): FP8 ->\n"
    "                  f16, two chained HMMA.16816.F32 blocks (k & 2 == 0 first, 25 fraction bits below the\n"
    "                  nominal maximum exponent, truncation toward zero, RZ to f32), then an f32 RNE add of C.\n"
    "                  Reproduces every tile captured on an H200 (tests/data/h200/mma_sm90).\n"
    "\n"
    "Files (T tiles): A [T,16,32] uint8 codes (A[t][m][k]); BT [T,8,32] uint8 codes (B transposed: BT[t][n][k]);\n"
    "C [T,16,8] float32; D [T,16,8] float32 (written). A single tile may also be given without the T axis.\n"
    "\n"
    "Options:\n"
    "  --model NAME      the instruction model (above)\n"
    "  --format F        A's FP8 format (and B's, unless --format-b): e4m3fn or e5m2\n"
    "  --format-b F      B's FP8 format, for mixed e4m3fn x e5m2 instructions\n"
    "  -h, --help        this help\n"
    "\n"
    "Example:\n"
    "  fp8ref mma --model mma-sync-sm90 --format e4m3fn A.npy BT.npy C.npy D.npy\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

// Reads path, checks its dtype and that its shape is [T, rows, cols] or [rows, cols]; returns T.
int64_t read_tiles(const std::string& path, io::DType dtype, const char* dtype_text, int64_t rows, int64_t cols,
                   io::Tensor* out) {
  *out = io::read_npy(path);
  if (out->dtype != dtype)
    throw InputError(path + ": dtype " + io::dtype_name(out->dtype) + ", expected " + dtype_text);
  const std::vector<int64_t>& s = out->shape;
  if (s.size() == 2 && s[0] == rows && s[1] == cols) return 1;
  if (s.size() == 3 && s[1] == rows && s[2] == cols) return s[0];
  throw InputError(path + ": shape " + shape_text(s) + ", expected [T, " + std::to_string(rows) + ", " +
                   std::to_string(cols) + "] (or [" + std::to_string(rows) + ", " + std::to_string(cols) + "])");
}

Format parse_operand_format(const char* flag, const std::string& v) {
  Format f;
  if (!parse_format(v, &f) || (f != Format::e4m3fn && f != Format::e5m2))
    throw InputError(std::string(flag) + " '" + v + "': expected e4m3fn or e5m2");
  return f;
}

int mma_main(int argc, char** argv) {
  Args args(argc, argv, {{"--model"}, {"--format"}, {"--format-b"}});
  const std::string model_name = args.require("--model");
  const std::string fa_name = args.require("--format");
  args.expect_positionals({"A", "BT", "C", "D"});
  const std::vector<std::string>& p = args.positionals();
  check_paths(p, {3});
  MmaModel model;
  if (!parse_mma_model(model_name, &model)) throw InputError("unknown --model '" + model_name + "' (mma-sync-sm90)");
  const Format fa = parse_operand_format("--format", fa_name);
  const Format fb = args.get("--format-b") ? parse_operand_format("--format-b", *args.get("--format-b")) : fa;
  if (!mma_supports(model, fa, fb))
    throw InputError(std::string("--model ") + model_name + " does not take " + format_name(fa) + " x " +
                     format_name(fb));

  io::Tensor a, bt, c;
  const int64_t ta = read_tiles(p[0], io::DType::U8, "uint8 (FP8 codes)", 16, 32, &a);
  const int64_t tb = read_tiles(p[1], io::DType::U8, "uint8 (FP8 codes)", 8, 32, &bt);
  const int64_t tc = read_tiles(p[2], io::DType::F32, "float32", 16, 8, &c);
  if (ta != tb || ta != tc || a.shape.size() != bt.shape.size() || a.shape.size() != c.shape.size())
    throw InputError("tile counts differ: A " + shape_text(a.shape) + ", BT " + shape_text(bt.shape) + ", C " +
                     shape_text(c.shape));
  io::Tensor d = io::make_tensor("", io::DType::F32, c.shape);
  std::vector<float> cf(static_cast<size_t>(c.numel())), df(cf.size());
  std::memcpy(cf.data(), c.data.data(), c.data.size());
  ref::mma_m16n8k32(model, fa, fb, a.data.data(), bt.data.data(), cf.data(), df.data(), static_cast<size_t>(ta));
  std::memcpy(d.data.data(), df.data(), d.data.size());
  io::write_npy(p[3], d);
  return 0;
}

}  // namespace

const Command kCmd_mma = {"mma", "one FP8 tensor-core instruction (D = A·B + C), as a measured device model", &mma_main,
                          kHelp};

}  // namespace fp8ref::cli
