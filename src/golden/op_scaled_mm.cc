// fp8ref — the `scaled_mm` and `scaled_bmm` ops in the registry (contract: include/fp8ref/gemm.h).
//
//   scaled_mm shape=64x256x512 a=e4m3fn b=e4m3fn scaling=blockwise model=hopper-tc out=bf16 fill=normal:amax=4 seed=1
//     shape = MxNxK. tensors: input.a [M,K] (F8 tag of a), input.bt [N,K] (B transposed, F8 tag of b), input.sa,
//     input.sb (F32, the logical scale shapes of gemm.h; sb-stride=cublas: the flat buffer cuBLAS reads), input.bias
//     [N] (F32, bias != none); output.out [M,N] (F32/BF16/F16); exact.out (F64: the exact value before the output
//     rounding, bias included); bound.out (F64: the fast model's derived error bound, which covers f32 accumulation in
//     any order within the scale groups; the contract of model=fast, a classification aid for the others).
//     Scales: f32 2^U(-4,4) (generic values; mx: powers of two 2^[-6,5]); bias: normal, amax 30.
//     The golden output of model=fast is the exact model's (contract "bound": the diff applies bound.out);
//     model=mma-sync-sm90 is computed by chaining ref::mma_sm90_element (the instruction model).
//   scaled_bmm shape=BxMxNxK ... b-batched=true batch-scales=ab
//     input.a [B,M,K], input.bt [B,N,K] (b-batched=false: [N,K], shared), input.sa/sb with a leading batch
//     dimension when batch-scales names them (a, b, ab; none: shared; tensor scaling: [B]); output.out [B,M,N].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu/gemm_fast.h"
#include "fp8ref/error.h"
#include "fp8ref/gemm.h"
#include "golden/ops.h"

namespace fp8ref::golden {

namespace {

struct MmCase {
  ScaledMmSpec s;
  GemmShape g;
  int64_t batch = 1;
  bool bmm = false, b_batched = true, sa_batched = false, sb_batched = false;
};

MmCase parse_case(const Descriptor& d, bool bmm) {
  MmCase c;
  c.bmm = bmm;
  const std::vector<int64_t> shape = parse_shape(d.get("shape"));
  if (shape.size() != (bmm ? 4u : 3u))
    throw InputError(where(d) + "shape is " + (bmm ? "BxMxNxK" : "MxNxK") + ", not '" + d.get("shape") + "'");
  if (bmm) c.batch = shape[0];
  c.g = GemmShape{shape[bmm ? 1 : 0], shape[bmm ? 2 : 1], shape[bmm ? 3 : 2]};
  ScaledMmSpec& s = c.s;
  for (const char* key : {"a", "b"}) {
    Format f;
    if (!parse_format(d.get(key), &f)) throw InputError(where(d) + "unknown format '" + d.get(key) + "' for " + key);
    (key[0] == 'a' ? s.fa : s.fb) = f;
  }
  if (!parse_gemm_scaling(d.get("scaling"), &s.scaling))
    throw InputError(where(d) + "unknown scaling '" + d.get("scaling") + "' (tensor, rowwise, blockwise, group, mx)");
  if (!parse_gemm_model(d.get("model"), &s.model, &s.kblock))
    throw InputError(where(d) + "unknown model '" + d.get("model") + "'");
  if (!parse_format(d.get("out"), &s.out)) throw InputError(where(d) + "unknown out '" + d.get("out") + "'");
  const std::string& pr = d.get("promote");
  if (pr != "128" && pr != "never") throw InputError(where(d) + "promote is 128 or never");
  s.promote_never = pr == "never";
  const std::string& sk = d.get("split-k");
  if (sk.empty() || sk.size() > 4 || sk.find_first_not_of("0123456789") != std::string::npos)
    throw InputError(where(d) + "split-k '" + sk + "' is not a whole number in [1, 1024]");
  s.split_k = std::stoi(sk);
  if (!parse_promote_arith(d.get("promote-arith"), &s.promote_arith))
    throw InputError(where(d) + "promote-arith is mul-mul-add or fma");
  const std::string& st = d.get("sb-stride");
  if (st != "dense" && st != "cublas") throw InputError(where(d) + "sb-stride is dense or cublas");
  s.cublas_sb_stride = st == "cublas";
  if (!parse_bias_mode(d.get("bias"), &s.bias)) throw InputError(where(d) + "bias is none, f32 or out");
  if (bmm) {
    const std::string& bb = d.get("b-batched");
    if (bb != "true" && bb != "false") throw InputError(where(d) + "b-batched is true or false");
    c.b_batched = bb == "true";
    const std::string& bs = d.get("batch-scales");
    if (bs != "none" && bs != "a" && bs != "b" && bs != "ab") throw InputError(where(d) + "batch-scales is none, a, b or ab");
    c.sa_batched = bs == "a" || bs == "ab";
    c.sb_batched = bs == "b" || bs == "ab";
  }
  if (c.batch < 0 || c.g.M * c.g.N * c.g.K * std::max<int64_t>(c.batch, 1) > (int64_t{1} << 34))
    throw InputError(where(d) + "shape too large for a golden case");
  try {
    check_scaled_mm(s, c.g);
  } catch (const InputError& e) {
    throw InputError(where(d) + e.what());
  }
  return c;
}

std::vector<int64_t> with_batch(const MmCase& c, bool batched, std::vector<int64_t> shape) {
  if (!c.bmm || !batched) return shape;
  shape.insert(shape.begin(), c.batch);
  return shape;
}
// Scales: tensor scales with a batch dimension are [B] (one per batch / sequence).
std::vector<int64_t> scale_with_batch(const MmCase& c, bool batched, std::vector<int64_t> shape) {
  if (c.bmm && batched && c.s.scaling == GemmScaling::tensor) return {c.batch};
  return with_batch(c, batched, shape);
}

std::vector<int64_t> a_shape(const MmCase& c) { return with_batch(c, true, {c.g.M, c.g.K}); }
std::vector<int64_t> b_shape(const MmCase& c) { return with_batch(c, c.b_batched, {c.g.N, c.g.K}); }
std::vector<int64_t> sa_shape(const MmCase& c) { return scale_with_batch(c, c.sa_batched, gemm_sa_shape(c.s, c.g)); }
std::vector<int64_t> sb_shape(const MmCase& c) { return scale_with_batch(c, c.sb_batched, gemm_sb_shape(c.s, c.g)); }
std::vector<int64_t> out_shape(const MmCase& c) { return with_batch(c, true, {c.g.M, c.g.N}); }

struct Inputs {
  const io::Tensor *a, *b, *sa, *sb, *bias = nullptr;
};

Inputs get_inputs(const Descriptor& d, const MmCase& c, const Tensors& in) {
  Inputs r;
  r.a = &find_input(d, in, "input.a", io::format_dtype(c.s.fa), a_shape(c));
  r.b = &find_input(d, in, "input.bt", io::format_dtype(c.s.fb), b_shape(c));
  r.sa = &find_input(d, in, "input.sa", io::DType::F32, sa_shape(c));
  r.sb = &find_input(d, in, "input.sb", io::DType::F32, sb_shape(c));
  if (c.s.bias != BiasMode::none) r.bias = &find_input(d, in, "input.bias", io::DType::F32, {c.g.N});
  const float* sa = reinterpret_cast<const float*>(r.sa->data.data());
  const float* sb = reinterpret_cast<const float*>(r.sb->data.data());
  check_gemm_scales(c.s, sa, static_cast<size_t>(r.sa->numel()), "input.sa");
  check_gemm_scales(c.s, sb, static_cast<size_t>(r.sb->numel()), "input.sb");
  return r;
}

const float* fptr(const io::Tensor* t) { return t ? reinterpret_cast<const float*>(t->data.data()) : nullptr; }

// Calls fn(spec-for-batch, a, bt, sa, sb, out-offset-elements) per batch.
template <class Fn>
void per_batch(const MmCase& c, const Inputs& in, Fn fn) {
  const int64_t san = static_cast<int64_t>(in.sa->numel()) / (c.bmm && c.sa_batched ? c.batch : 1);
  const int64_t sbn = static_cast<int64_t>(in.sb->numel()) / (c.bmm && c.sb_batched ? c.batch : 1);
  for (int64_t b = 0; b < c.batch; ++b)
    fn(in.a->data.data() + b * c.g.M * c.g.K, in.b->data.data() + (c.bmm && c.b_batched ? b * c.g.N * c.g.K : 0),
       fptr(in.sa) + (c.bmm && c.sa_batched ? b * san : 0), fptr(in.sb) + (c.bmm && c.sb_batched ? b * sbn : 0),
       b * c.g.M * c.g.N);
}

io::DType out_dtype(const MmCase& c) { return io::format_dtype(c.s.out); }

Tensors run_kernel(const Descriptor& d, const Tensors& inputs, bool bmm, bool cpu) {
  const MmCase c = parse_case(d, bmm);
  const Inputs in = get_inputs(d, c, inputs);
  io::Tensor out = io::make_tensor("output.out", out_dtype(c), out_shape(c));
  const size_t es = io::dtype_size(out.dtype);
  ScaledMmSpec s = c.s;
  if (!cpu && s.model == GemmModel::fast) s.model = GemmModel::exact;  // the golden of `fast`: the exact result
  per_batch(c, in, [&](const uint8_t* a, const uint8_t* bt, const float* sa, const float* sb, int64_t off) {
    void* o = out.data.data() + static_cast<size_t>(off) * es;
    if (cpu || s.model == GemmModel::mma_sync_sm90) cpu::scaled_mm(s, c.g, a, bt, sa, sb, fptr(in.bias), o);
    else ref::scaled_mm(s, c.g, a, bt, sa, sb, fptr(in.bias), o);
  });
  return {out};
}

Tensors mm_reference(const Descriptor& d, const Tensors& in) { return run_kernel(d, in, false, false); }
Tensors mm_cpu(const Descriptor& d, const Tensors& in) { return run_kernel(d, in, false, true); }
Tensors bmm_reference(const Descriptor& d, const Tensors& in) { return run_kernel(d, in, true, false); }
Tensors bmm_cpu(const Descriptor& d, const Tensors& in) { return run_kernel(d, in, true, true); }

Tensors make_inputs(const Descriptor& d, bool bmm) {
  const MmCase c = parse_case(d, bmm);
  const uint64_t seed = std::stoull(d.get("seed"));
  Tensors t;
  t.push_back(fill_tensor("input.a", io::format_dtype(c.s.fa), a_shape(c), d.get("fill"), seed, 0));
  t.push_back(fill_tensor("input.bt", io::format_dtype(c.s.fb), b_shape(c), d.get("fill"), seed, 1));
  Rng rng(seed, 2);
  for (int which = 0; which < 2; ++which) {
    io::Tensor s = io::make_tensor(which ? "input.sb" : "input.sa", io::DType::F32, which ? sb_shape(c) : sa_shape(c));
    for (int64_t i = 0; i < s.numel(); ++i) {
      const float v = c.s.scaling == GemmScaling::mx
                          ? std::ldexp(1.0f, static_cast<int>(rng.next() % 12) - 6)
                          : static_cast<float>(std::exp2(rng.uniform() * 8 - 4));  // rounded to f32 (RNE)
      std::memcpy(&s.data[4 * static_cast<size_t>(i)], &v, 4);
    }
    t.push_back(s);
  }
  if (c.s.bias != BiasMode::none) {
    io::Tensor b = io::make_tensor("input.bias", io::DType::F32, {c.g.N});
    for (int64_t i = 0; i < c.g.N; ++i) {
      const float v = static_cast<float>(rng.normal() * 10);
      std::memcpy(&b.data[4 * static_cast<size_t>(i)], &v, 4);
    }
    t.push_back(b);
  }
  return t;
}

Tensors exact_outputs(const Descriptor& d, const Tensors& inputs, bool bmm) {
  const MmCase c = parse_case(d, bmm);
  const Inputs in = get_inputs(d, c, inputs);
  io::Tensor e = io::make_tensor("exact.out", io::DType::F64, out_shape(c));
  double* ep = reinterpret_cast<double*>(e.data.data());
  // bound.out for every model: fast's derived bound, which holds for f32 accumulation in any order within the
  // scale groups (docs/gemm-fast.md) — model=fast's contract; for the bit-exact models it lets the diff tell an
  // accumulation-order difference (class `accumulation`, `--tol bound`) from a wrong value
  io::Tensor bd = io::make_tensor("bound.out", io::DType::F64, out_shape(c));
  double* bp = reinterpret_cast<double*>(bd.data.data());
  per_batch(c, in, [&](const uint8_t* a, const uint8_t* bt, const float* sa, const float* sb, int64_t off) {
    ref::scaled_mm_exact_f64(c.s, c.g, a, bt, sa, sb, fptr(in.bias), ep + off);
    cpu::scaled_mm_fast_bound(c.s, c.g, a, bt, sa, sb, fptr(in.bias), bp + off);
  });
  return {e, bd};  // (make_golden adds the golden output's distance to exact)
}

std::vector<Param> common_params(bool bmm) {
  return {
      {"shape", bmm ? "4x32x128x256" : "64x256x512", bmm ? "BxMxNxK" : "MxNxK (A [M,K], BT [N,K])"},
      {"a", "e4m3fn", "A's format: e4m3fn, e5m2"},
      {"b", "e4m3fn", "B's format: e4m3fn, e5m2"},
      {"scaling", "tensor", "tensor, rowwise, blockwise (1x128 x 128x128), group (1x128 x 1x128), mx (1x32 ue8m0)"},
      {"model", "exact", "exact, f32-kblock[:KB], hopper-tc, mma-sync-sm90, fast"},
      {"promote", "128", "hopper-tc: 128 or never (cuBLAS use_fast_accum=True)"},
      {"split-k", "1", "hopper-tc: parts of whole 128-K tiles, summed in order"},
      {"promote-arith", "mul-mul-add", "f32-kblock: mul-mul-add ((p*sa)*sb + acc) or fma (fma(sa*sb, p, acc))"},
      {"sb-stride", "dense", "blockwise: dense, or cublas (scale_b read with n-block stride roundup(K/128,4))"},
      {"bias", "none", "none, f32 (before the output rounding), out (after it, in the output type)"},
      {"out", "bf16", "output: f32, bf16, f16"},
  };
}

std::string outputs_json(const Descriptor& d, bool bmm) {
  const MmCase c = parse_case(d, bmm);
  return std::string(R"({"output.out": {"role": "data", "format": ")") + format_name(c.s.out) +
         R"(", "contract": ")" + (c.s.model == GemmModel::fast ? "bound" : "exact") + R"(", "dims": )" +
         (bmm ? R"(["batch", "row", "col"])" : R"(["row", "col"])") + "}}";
}

// The deterministic models of the case (gemm_model_variants), for fp8ref diff --models.
std::vector<std::pair<std::string, Descriptor>> models(const Descriptor& d, bool bmm) {
  const MmCase c = parse_case(d, bmm);
  std::vector<std::pair<std::string, Descriptor>> out;
  for (const GemmVariant& v : gemm_model_variants(c.s)) {
    Descriptor x = d;
    x.set("model", to_string(v.spec.model));
    x.set("promote", v.spec.promote_never ? "never" : "128");
    x.set("split-k", std::to_string(v.spec.split_k));
    x.set("promote-arith", to_string(v.spec.promote_arith));
    out.emplace_back(v.name, x);
  }
  return out;
}

}  // namespace

OpInfo scaled_mm_op() {
  OpInfo op;
  op.name = "scaled_mm";
  op.summary = "FP8 GEMM with tensor/rowwise/blockwise/group/mx scales under an accumulation model";
  op.params = common_params(false);
  op.params.push_back({"fill", "normal:amax=4", "fill of A and B (rounded to their FP8 format)"});
  op.params.push_back({"seed", "1", "case seed"});
  op.make_inputs = [](const Descriptor& d) { return make_inputs(d, false); };
  op.outputs_json = [](const Descriptor& d) { return outputs_json(d, false); };
  op.convention = [](const Descriptor&) { return std::string("-"); };
  op.exact = [](const Descriptor& d, const Tensors& in) { return exact_outputs(d, in, false); };
  op.models = [](const Descriptor& d) { return models(d, false); };
  return op;
}

OpInfo scaled_bmm_op() {
  OpInfo op;
  op.name = "scaled_bmm";
  op.summary = "batched scaled_mm with per-batch (per-sequence) or shared scales and B";
  op.params = common_params(true);
  op.params.push_back({"b-batched", "true", "true: BT [B,N,K]; false: BT [N,K] shared by every batch"});
  op.params.push_back({"batch-scales", "ab", "which scales carry the batch dimension: none, a, b, ab"});
  op.params.push_back({"fill", "normal:amax=4", "fill of A and B (rounded to their FP8 format)"});
  op.params.push_back({"seed", "1", "case seed"});
  op.make_inputs = [](const Descriptor& d) { return make_inputs(d, true); };
  op.outputs_json = [](const Descriptor& d) { return outputs_json(d, true); };
  op.convention = [](const Descriptor&) { return std::string("-"); };
  op.exact = [](const Descriptor& d, const Tensors& in) { return exact_outputs(d, in, true); };
  op.models = [](const Descriptor& d) { return models(d, true); };
  return op;
}

std::vector<Kernel> scaled_mm_kernels() {
  return {
      {"scaled_mm", "reference", "ref::scaled_mm (scalar; fast: the exact result; mma-sync-sm90: ref::mma chain)",
       mm_reference},
      {"scaled_mm", "cpu", "cpu::scaled_mm (OpenMP; fast: oneDNN bf16)", mm_cpu},
      {"scaled_bmm", "reference", "ref::scaled_mm per batch", bmm_reference},
      {"scaled_bmm", "cpu", "cpu::scaled_mm per batch", bmm_cpu},
  };
}

}  // namespace fp8ref::golden
