// fp8ref scaled-mm / scaled-bmm — A8·B8 with scales under a named accumulation model (include/fp8ref/gemm.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/error.h"
#include "fp8ref/gemm.h"
#include "fp8ref/io.h"

namespace fp8ref::cli {

namespace {

const char* kScaledMmHelp =
    "Usage: fp8ref scaled-mm --format FMT[,FMT_B] --scaling S --model NAME --out-dtype bf16|f16|f32\n"
    "                        [--promote 128|never] [--split-k S] [--promote-arith mul-mul-add|fma]\n"
    "                        [--sb-stride dense|cublas] [--bias BIAS.npy [--bias-mode f32|out]]\n"
    "                        [--backend cpu|reference] [--exact EXACT.npy] A.npy BT.npy SA.npy SB.npy OUT.npy\n"
    "\n"
    "out[m,n] = round_out( sum_k a[m,k] * b[k,n] * scales (+ bias) ), B given transposed (BT [N,K], K-major, as\n"
    "torch._scaled_mm's column-major mat2 and DeepGEMM take it). The accumulation model says how the sum and the\n"
    "scales are rounded; include/fp8ref/gemm.h has the exact contract of each.\n"
    "\n"
    "Files: A [M,K] and BT [N,K] uint8 FP8 codes. Scales float32 in logical shapes:\n"
    "  tensor     SA [] or [1]             SB [] or [1]\n"
    "  rowwise    SA [M,1] or [M]          SB [1,N] or [N]\n"
    "  blockwise  SA [M, ceil(K/128)]      SB [ceil(N/128), ceil(K/128)]   (1x128 x 128x128, DeepSeek-V3)\n"
    "             with --sb-stride cublas: SB is the flat buffer cuBLAS 13.0 reads, block (nb,kb) at\n"
    "             nb*roundup(K/128,4)+kb, length (ceil(N/128)-1)*roundup(K/128,4)+ceil(K/128)\n"
    "  group      SA [M, ceil(K/128)]      SB [N, ceil(K/128)]             (1x128 x 1x128)\n"
    "  mx         SA [M, ceil(K/32)]       SB [N, ceil(K/32)]              (ue8m0: f32 powers of two, or uint8\n"
    "                                                                       E8M0 codes)\n"
    "K not a multiple of 128 (32 for mx): the last scale group covers the K % 128 columns present. NaN scales are\n"
    "refused. OUT: float32 for f32, float16 for f16, uint16 bit patterns for bf16. BIAS: float32 [N].\n"
    "\n"
    "Options:\n"
    "  --format FMT[,FMT_B]   e4m3fn or e5m2 (A's, then B's if different)\n"
    "  --scaling S            tensor, rowwise, blockwise, group, mx\n"
    "  --model NAME           exact          the exact result, rounded once\n"
    "                         f32-kblock[:KB] exact K-block partials rounded to f32, promoted into an f32 acc\n"
    "                                        (KB default: the scale group, 128; 32 for mx)\n"
    "                         hopper-tc      the H200 wgmma + cuBLAS 13.0 model (torch._scaled_mm bit for bit)\n"
    "                         fast           CPU fallback (oneDNN bf16), within a derived bound of exact\n"
    "                         mma-sync-sm90  mma.sync.m16n8k32 on sm_90 (fp8->f16, HMMA)\n"
    "  --promote 128|never    hopper-tc: promotion into f32 every 128 K (default) or never (use_fast_accum=True)\n"
    "  --split-k S            hopper-tc: split K into S parts of whole 128-K tiles (cuBLAS chooses per shape)\n"
    "  --promote-arith A      f32-kblock: mul-mul-add ((p*sa)*sb + acc: Triton, DeepSeek; default) or fma\n"
    "                         (fma(sa*sb, p, acc): DeepGEMM)\n"
    "  --sb-stride cublas     blockwise: read SB as cuBLAS 13.0 does (see above)\n"
    "  --bias-mode f32|out    f32: added to the f32 result before the output rounding (default); out: added after\n"
    "                         it, in the output type\n"
    "  --out-dtype T          bf16, f16, f32\n"
    "  --backend B            cpu (default) or reference\n"
    "  --exact EXACT.npy      also write the exact value before the output rounding (float64)\n"
    "  --identify             OUT is a device's output: run every deterministic model (exact, f32-kblock both\n"
    "                         arithmetics, hopper-tc promote 128/never x split-k 1..5, mma-sync-sm90) and rank them\n"
    "                         by bit-equal share and max ulp distance (--model not needed)\n"
    "  -h, --help             this help\n"
    "\n"
    "Example (what torch._scaled_mm computes on an H200 for 32x256x7168 tensorwise, use_fast_accum=True):\n"
    "  fp8ref scaled-mm --format e4m3fn --scaling tensor --model hopper-tc --promote never --split-k 2 \\\n"
    "      --out-dtype bf16 a.npy bt.npy sa.npy sb.npy out.npy\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

const char* kScaledBmmHelp =
    "Usage: fp8ref scaled-bmm (the options of scaled-mm) A.npy BT.npy SA.npy SB.npy OUT.npy\n"
    "\n"
    "A batch of scaled_mm: A [B,M,K], BT [B,N,K] (or [N,K]: one B for every batch), OUT [B,M,N]. Scales: the\n"
    "scaled-mm shapes with a leading batch dimension [B, ...] (per batch / per sequence), or without it (shared by\n"
    "every batch); tensor scales may also be [B] (one per sequence, as fms-mo's per-sentence scales — the case\n"
    "torch's CPU _scaled_mm cannot serve). Every model of scaled-mm applies per batch.\n"
    "\n"
    "Exit codes: 0 success, 2 bad usage or bad input (nothing is written).\n";

Format fp8_format(const std::string& name) {
  Format f;
  if (!parse_format(name, &f) || (f != Format::e4m3fn && f != Format::e5m2))
    throw InputError("--format: '" + name + "' is not a scaled_mm operand format (e4m3fn, e5m2)");
  return f;
}

struct Parsed {
  ScaledMmSpec spec;
  std::string backend;
  std::string a, bt, sa, sb, out;
  std::optional<std::string> bias, exact;
  bool identify = false;
};

Parsed parse(int argc, char** argv) {
  Args args(argc, argv,
            {{"--format"}, {"--scaling"}, {"--model"}, {"--promote"}, {"--split-k"}, {"--promote-arith"},
             {"--sb-stride"}, {"--bias"}, {"--bias-mode"}, {"--out-dtype"}, {"--backend"}, {"--exact"},
             {"--identify", Kind::flag}});
  args.expect_positionals({"A", "BT", "SA", "SB", "OUT"});
  Parsed p;
  const auto& pos = args.positionals();
  p.a = pos[0], p.bt = pos[1], p.sa = pos[2], p.sb = pos[3], p.out = pos[4];
  p.bias = args.get("--bias");
  p.exact = args.get("--exact");
  // inputs may repeat (SA = SB); an output (OUT, EXACT) must be none of the other files
  std::vector<std::string> paths = {p.a, p.bt, p.sa, p.sb, p.out};
  std::vector<size_t> outs = {4};
  if (p.bias) paths.push_back(*p.bias);
  if (p.exact) {
    outs.push_back(paths.size());
    paths.push_back(*p.exact);
  }
  check_paths(paths, outs);
  p.backend = args.get("--backend").value_or("cpu");
  if (p.backend != "cpu" && p.backend != "reference")
    throw UsageError("unknown backend '" + p.backend + "' for --backend (cpu, reference)");

  ScaledMmSpec& s = p.spec;
  const std::string fmt = args.require("--format");
  const size_t comma = fmt.find(',');
  s.fa = fp8_format(fmt.substr(0, comma));
  s.fb = comma == std::string::npos ? s.fa : fp8_format(fmt.substr(comma + 1));
  const std::string scaling = args.require("--scaling");
  if (!parse_gemm_scaling(scaling, &s.scaling))
    throw InputError("unknown --scaling '" + scaling + "' (tensor, rowwise, blockwise, group, mx)");
  p.identify = args.has("--identify");
  const std::string model = p.identify ? args.get("--model").value_or("exact") : args.require("--model");
  if (!parse_gemm_model(model, &s.model, &s.kblock))
    throw InputError("unknown --model '" + model + "' (exact, f32-kblock[:KB], hopper-tc, fast, mma-sync-sm90)");
  const std::string od = args.require("--out-dtype");
  if (!parse_format(od, &s.out) || (s.out != Format::f32 && s.out != Format::bf16 && s.out != Format::f16))
    throw InputError("--out-dtype: '" + od + "' is not bf16, f16 or f32");
  if (auto v = args.get("--promote")) {
    if (*v == "never") s.promote_never = true;
    else if (*v != "128") throw InputError("--promote: '" + *v + "' is not 128 or never");
    if (s.model != GemmModel::hopper_tc) throw InputError("--promote applies to --model hopper-tc");
  }
  if (auto v = args.get("--split-k")) {
    char* end = nullptr;
    const long k = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end || k < 1 || k > 1024) throw InputError("--split-k: '" + *v + "' is not in [1, 1024]");
    s.split_k = static_cast<int>(k);
  }
  if (auto v = args.get("--promote-arith")) {
    if (!parse_promote_arith(*v, &s.promote_arith)) throw InputError("--promote-arith: '" + *v + "' is not mul-mul-add or fma");
    if (s.model != GemmModel::f32_kblock) throw InputError("--promote-arith applies to --model f32-kblock");
  }
  if (auto v = args.get("--sb-stride")) {
    if (*v == "cublas") s.cublas_sb_stride = true;
    else if (*v != "dense") throw InputError("--sb-stride: '" + *v + "' is not dense or cublas");
  }
  if (p.bias) {
    s.bias = BiasMode::f32;
    if (auto v = args.get("--bias-mode"))
      if (!parse_bias_mode(*v, &s.bias) || s.bias == BiasMode::none)
        throw InputError("--bias-mode: '" + *v + "' is not f32 or out");
  } else if (args.has("--bias-mode")) {
    throw UsageError("--bias-mode needs --bias");
  }
  return p;
}

io::Tensor read_codes(const std::string& path, const char* what) {
  io::Tensor t = io::read_npy(path);
  if (t.dtype != io::DType::U8)
    throw InputError(path + ": " + what + " must be uint8 FP8 codes, not " + io::dtype_name(t.dtype));
  return t;
}

// Reads scales: float32 values, or (mx) uint8 E8M0 codes. `logical`: the accepted shapes (first = canonical).
std::vector<float> read_scales(const std::string& path, const ScaledMmSpec& s, const char* what,
                               const std::vector<std::vector<int64_t>>& shapes, int64_t batch, bool* batched) {
  io::Tensor t = io::read_npy(path);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == io::DType::U8 && s.scaling == GemmScaling::mx) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.data[i] == 0xFF) throw InputError(path + ": " + what + " E8M0 code " + std::to_string(i) + " is 0xFF (NaN)");
      v[i] = std::ldexp(1.0f, static_cast<int>(t.data[i]) - 127);
    }
  } else if (t.dtype == io::DType::F32) {
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
  } else {
    throw InputError(path + ": " + what + " must be float32" +
                     (s.scaling == GemmScaling::mx ? " (or uint8 E8M0 codes)" : "") + ", not " +
                     io::dtype_name(t.dtype));
  }
  *batched = false;
  for (const auto& sh : shapes) {
    if (t.shape == sh) return v;
    if (batch >= 0) {
      std::vector<int64_t> b = {batch};  // [B] + an accepted shape: tensor scaling's [1] and () give [B, 1] and [B]
      b.insert(b.end(), sh.begin(), sh.end());
      if (t.shape == b) {
        *batched = true;
        return v;
      }
    }
  }
  std::string want;
  for (const auto& sh : shapes) want += (want.empty() ? "" : " or ") + shape_text(sh);
  throw InputError(path + ": " + what + " has shape " + shape_text(t.shape) + ", but " + to_string(s.scaling) +
                   " scaling needs " + want + (batch >= 0 ? " (optionally with a leading batch dimension)" : ""));
}

std::vector<std::vector<int64_t>> accepted(const std::vector<int64_t>& logical, GemmScaling sc, bool is_a, bool stride) {
  std::vector<std::vector<int64_t>> out = {logical};
  if (sc == GemmScaling::tensor) out.push_back({});
  if (sc == GemmScaling::rowwise) out.push_back(is_a ? std::vector<int64_t>{logical[0], 1} : std::vector<int64_t>{1, logical[0]});
  (void)stride;
  return out;
}

// OUT's .npy dtype: '<f4', '<f2', or bf16 as '<u2' bit patterns (as every command writes them).
io::DType out_dtype(Format f) { return f == Format::f32 ? io::DType::F32 : f == Format::f16 ? io::DType::F16 : io::DType::U16; }

// --identify: OUT is a device's output; every deterministic model (with its parameters) is run on the inputs and
// ranked by the share of bit-equal elements, then by the largest distance in units in the last place.
int64_t ordered(uint64_t bits, Format f) {  // a monotone integer image of the value (ulp distances)
  const int total = f == Format::f32 ? 32 : 16;
  const uint64_t sign = uint64_t{1} << (total - 1);
  const int64_t mag = static_cast<int64_t>(bits & (sign - 1));
  return (bits & sign) ? -mag : mag;
}

int identify(const Parsed& p, const GemmShape& g, int64_t batch, const cpu::BmmOperands& bo, const io::Tensor& A,
             const io::Tensor& B, const std::vector<float>& sa, const std::vector<float>& sb, const float* bias,
             const std::vector<int64_t>& oshape) {
  const ScaledMmSpec& base = p.spec;
  const io::Tensor dev = io::read_npy(p.out);
  const io::DType want = out_dtype(base.out);  // (f16 also as uint16 bit patterns, as before)
  if ((dev.dtype != want && !(base.out == Format::f16 && dev.dtype == io::DType::U16)) || dev.shape != oshape)
    throw InputError(p.out + ": the device output must be " + io::dtype_name(want) + " " + shape_text(oshape) +
                     " (--identify reads OUT), got " + io::dtype_name(dev.dtype) + " " + shape_text(dev.shape));
  struct Row {
    std::string name;
    double equal;
    int64_t max_ulp;
  };
  std::vector<Row> rows;
  const size_t n = static_cast<size_t>(dev.numel()), es = base.out == Format::f32 ? 4 : 2;
  auto try_spec = [&](ScaledMmSpec s, const std::string& name) {
    try {
      check_scaled_mm(s, g);
    } catch (const InputError&) {
      return;
    }
    io::Tensor out = io::make_tensor("", want, oshape);
    cpu::scaled_bmm(s, g, bo, A.data.data(), B.data.data(), sa.data(), sb.data(), bias, out.data.data());
    size_t eq = 0;
    int64_t worst = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t x = 0, y = 0;
      std::memcpy(&x, out.data.data() + i * es, es);
      std::memcpy(&y, dev.data.data() + i * es, es);
      if (x == y) {
        ++eq;
        continue;
      }
      const int64_t d = std::llabs(ordered(x, s.out) - ordered(y, s.out));
      worst = std::max(worst, d);
    }
    rows.push_back({name, n ? static_cast<double>(eq) / static_cast<double>(n) : 1.0, worst});
  };
  (void)batch;
  for (const GemmVariant& v : gemm_model_variants(base)) try_spec(v.spec, v.name);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return a.equal != b.equal ? a.equal > b.equal : a.max_ulp < b.max_ulp;
  });
  std::printf("%-44s %12s %10s\n", "model", "bit-equal", "max ulp");
  for (const Row& r : rows) std::printf("%-44s %11.4f%% %10lld\n", r.name.c_str(), 100 * r.equal, static_cast<long long>(r.max_ulp));
  if (!rows.empty() && rows[0].equal == 1.0) std::printf("=> bit-exact: %s\n", rows[0].name.c_str());
  else std::printf("=> no model reproduces the output bit for bit\n");
  return 0;
}

int run(int argc, char** argv, bool bmm) {
  Parsed p = parse(argc, argv);
  const ScaledMmSpec& s = p.spec;
  const io::Tensor A = read_codes(p.a, "A");
  const io::Tensor B = read_codes(p.bt, "BT");
  const size_t ra = bmm ? 3 : 2;
  if (A.shape.size() != ra)
    throw InputError(p.a + ": A has shape " + shape_text(A.shape) + ", expected " + (bmm ? "[B, M, K]" : "[M, K]"));
  if (!(B.shape.size() == 2 || (bmm && B.shape.size() == 3)))
    throw InputError(p.bt + ": BT has shape " + shape_text(B.shape) + ", expected " + (bmm ? "[B, N, K] or [N, K]" : "[N, K]"));
  const int64_t batch = bmm ? A.shape[0] : 1;
  GemmShape g;
  g.M = A.shape[ra - 2], g.K = A.shape[ra - 1];
  g.N = B.shape[B.shape.size() - 2];
  const int64_t kb = B.shape.back();
  if (kb != g.K)
    throw InputError("mismatched K: A " + p.a + " has K = " + std::to_string(g.K) + ", BT " + p.bt + " has K = " +
                     std::to_string(kb) + " (BT is B transposed: [N, K])");
  cpu::BmmOperands bo;
  bo.batch = batch;
  bo.b_batched = B.shape.size() == 3;
  if (bo.b_batched && B.shape[0] != batch)
    throw InputError("batch mismatch: A has " + std::to_string(batch) + " batches, BT " + std::to_string(B.shape[0]));
  check_scaled_mm(s, g);
  const std::vector<float> sa = read_scales(p.sa, s, "SA", accepted(gemm_sa_shape(s, g), s.scaling, true, false),
                                            bmm ? batch : -1, &bo.sa_batched);
  const std::vector<float> sb = read_scales(p.sb, s, "SB", accepted(gemm_sb_shape(s, g), s.scaling, false, s.cublas_sb_stride),
                                            bmm ? batch : -1, &bo.sb_batched);
  check_gemm_scales(s, sa.data(), sa.size(), p.sa);
  check_gemm_scales(s, sb.data(), sb.size(), p.sb);
  std::vector<float> bias;
  if (p.bias) {
    io::Tensor t = io::read_npy(*p.bias);
    if (t.dtype != io::DType::F32 || t.shape != std::vector<int64_t>{g.N})
      throw InputError(*p.bias + ": bias must be float32 [" + std::to_string(g.N) + "], got " + io::dtype_name(t.dtype) +
                       " " + shape_text(t.shape));
    bias.resize(static_cast<size_t>(g.N));
    std::memcpy(bias.data(), t.data.data(), bias.size() * 4);
  }
  if (p.backend == "reference" && (s.model == GemmModel::fast || s.model == GemmModel::mma_sync_sm90))
    throw InputError(std::string("--backend reference has no ") + to_string(s.model) + " model; use --backend cpu");

  std::vector<int64_t> oshape = {g.M, g.N};
  if (bmm) oshape.insert(oshape.begin(), batch);
  if (p.identify) return identify(p, g, batch, bo, A, B, sa, sb, p.bias ? bias.data() : nullptr, oshape);
  io::Tensor out = io::make_tensor("", out_dtype(s.out), oshape);
  io::Tensor ex = io::make_tensor("", io::DType::F64, p.exact ? oshape : std::vector<int64_t>{0});
  const float* bp = p.bias ? bias.data() : nullptr;
  const size_t es = s.out == Format::f32 ? 4 : 2;
  const int64_t sa_n = static_cast<int64_t>(sa.size()) / (bo.sa_batched ? batch : 1);
  const int64_t sb_n = static_cast<int64_t>(sb.size()) / (bo.sb_batched ? batch : 1);
  if (p.backend == "cpu" && !p.exact) {
    cpu::scaled_bmm(s, g, bo, A.data.data(), B.data.data(), sa.data(), sb.data(), bp, out.data.data());
  } else {
    for (int64_t b = 0; b < batch; ++b) {
      const uint8_t* ab = A.data.data() + b * g.M * g.K;
      const uint8_t* bb = B.data.data() + (bo.b_batched ? b * g.N * g.K : 0);
      const float* sab = sa.data() + (bo.sa_batched ? b * sa_n : 0);
      const float* sbb = sb.data() + (bo.sb_batched ? b * sb_n : 0);
      void* ob = out.data.data() + static_cast<size_t>(b * g.M * g.N) * es;
      if (p.backend == "cpu") cpu::scaled_mm(s, g, ab, bb, sab, sbb, bp, ob);
      else ref::scaled_mm(s, g, ab, bb, sab, sbb, bp, ob);
      if (p.exact)
        ref::scaled_mm_exact_f64(s, g, ab, bb, sab, sbb, bp,
                                 reinterpret_cast<double*>(ex.data.data()) + b * g.M * g.N);
    }
  }
  io::OutputFiles files;  // both written, or neither
  files.add_npy(p.out, out);
  if (p.exact) files.add_npy(*p.exact, ex);
  files.commit();
  return 0;
}

int scaled_mm_main(int argc, char** argv) { return run(argc, argv, false); }
int scaled_bmm_main(int argc, char** argv) { return run(argc, argv, true); }

}  // namespace

const Command kCmd_scaled_mm = {"scaled-mm", "FP8 GEMM with scales under a named accumulation model (exact, "
                                             "f32-kblock, hopper-tc, fast, mma-sync-sm90)",
                                &scaled_mm_main, kScaledMmHelp};
const Command kCmd_scaled_bmm = {"scaled-bmm", "batched scaled-mm with per-batch (per-sequence) scales",
                                 &scaled_bmm_main, kScaledBmmHelp};

}  // namespace fp8ref::cli
