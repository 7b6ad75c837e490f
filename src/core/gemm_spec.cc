// fp8ref — scaled_mm spec: names, shapes and checks (include/fp8ref/gemm.h).
#include <cmath>
#include <cstring>
#include <string>

#include "fp8ref/error.h"
#include "fp8ref/gemm.h"

namespace fp8ref {

namespace {
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

const char* to_string(GemmScaling s) {
  switch (s) {
    case GemmScaling::tensor: return "tensor";
    case GemmScaling::rowwise: return "rowwise";
    case GemmScaling::blockwise: return "blockwise";
    case GemmScaling::group: return "group";
    case GemmScaling::mx: return "mx";
  }
  return "?";
}
const char* to_string(GemmModel m) {
  switch (m) {
    case GemmModel::exact: return "exact";
    case GemmModel::f32_kblock: return "f32-kblock";
    case GemmModel::hopper_tc: return "hopper-tc";
    case GemmModel::mma_sync_sm90: return "mma-sync-sm90";
    case GemmModel::fast: return "fast";
  }
  return "?";
}
const char* to_string(PromoteArith p) { return p == PromoteArith::fma ? "fma" : "mul-mul-add"; }
const char* to_string(BiasMode b) {
  switch (b) {
    case BiasMode::none: return "none";
    case BiasMode::f32: return "f32";
    case BiasMode::out: return "out";
  }
  return "?";
}

bool parse_gemm_scaling(std::string_view s, GemmScaling* out) {
  for (GemmScaling v : {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise, GemmScaling::group,
                        GemmScaling::mx})
    if (s == to_string(v)) {
      *out = v;
      return true;
    }
  return false;
}

bool parse_gemm_model(std::string_view s, GemmModel* out, int* kblock) {
  if (s.rfind("f32-kblock", 0) == 0) {
    std::string_view rest = s.substr(10);
    int kb = 0;
    if (!rest.empty()) {
      if (rest[0] != ':' || rest.size() < 2 || rest.size() > 7) return false;
      for (char c : rest.substr(1)) {
        if (c < '0' || c > '9') return false;
        kb = kb * 10 + (c - '0');
      }
      if (kb < 1) return false;
    }
    *out = GemmModel::f32_kblock;
    if (kblock) *kblock = kb;
    return true;
  }
  for (GemmModel v : {GemmModel::exact, GemmModel::hopper_tc, GemmModel::mma_sync_sm90, GemmModel::fast})
    if (s == to_string(v)) {
      *out = v;
      return true;
    }
  return false;
}

bool parse_promote_arith(std::string_view s, PromoteArith* out) {
  if (s == "fma") *out = PromoteArith::fma;
  else if (s == "mul-mul-add") *out = PromoteArith::mul_mul_add;
  else return false;
  return true;
}

bool parse_bias_mode(std::string_view s, BiasMode* out) {
  for (BiasMode v : {BiasMode::none, BiasMode::f32, BiasMode::out})
    if (s == to_string(v)) {
      *out = v;
      return true;
    }
  return false;
}

std::string ScaledMmSpec::describe() const {
  std::string s = std::string("a=") + format_name(fa) + " b=" + format_name(fb) + " scaling=" + to_string(scaling) +
                  " out=" + format_name(out) + " model=" + to_string(model);
  if (model == GemmModel::f32_kblock)
    s += ":" + std::to_string(gemm_kblock(*this)) + " promote-arith=" + to_string(promote_arith);
  if (model == GemmModel::hopper_tc)
    s += std::string(" promote=") + (promote_never ? "never" : "128") + " split-k=" + std::to_string(split_k);
  if (scaling == GemmScaling::blockwise && cublas_sb_stride) s += " sb-stride=cublas";
  s += std::string(" bias=") + to_string(bias);
  return s;
}

int gemm_kblock(const ScaledMmSpec& s) {
  if (s.kblock > 0) return s.kblock;
  return s.scaling == GemmScaling::mx ? 32 : 128;
}

std::vector<int64_t> gemm_sa_shape(const ScaledMmSpec& s, const GemmShape& g) {
  switch (s.scaling) {
    case GemmScaling::tensor: return {1};
    case GemmScaling::rowwise: return {g.M};
    case GemmScaling::blockwise:
    case GemmScaling::group: return {g.M, cdiv(g.K, 128)};
    case GemmScaling::mx: return {g.M, cdiv(g.K, 32)};
  }
  return {};
}

std::vector<int64_t> gemm_sb_shape(const ScaledMmSpec& s, const GemmShape& g) {
  switch (s.scaling) {
    case GemmScaling::tensor: return {1};
    case GemmScaling::rowwise: return {g.N};
    case GemmScaling::blockwise: {
      const int64_t kb = cdiv(g.K, 128), nb = cdiv(g.N, 128);
      if (s.cublas_sb_stride) return {nb == 0 ? 0 : (nb - 1) * ((kb + 3) / 4 * 4) + kb};
      return {nb, kb};
    }
    case GemmScaling::group: return {g.N, cdiv(g.K, 128)};
    case GemmScaling::mx: return {g.N, cdiv(g.K, 32)};
  }
  return {};
}

namespace {
size_t count_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}
}  // namespace

size_t gemm_sa_count(const ScaledMmSpec& s, const GemmShape& g) { return count_of(gemm_sa_shape(s, g)); }
size_t gemm_sb_count(const ScaledMmSpec& s, const GemmShape& g) { return count_of(gemm_sb_shape(s, g)); }

void check_scaled_mm(const ScaledMmSpec& s, const GemmShape& g) {
  for (Format f : {s.fa, s.fb})
    if (f != Format::e4m3fn && f != Format::e5m2)
      throw InputError(std::string("scaled_mm takes e4m3fn or e5m2 operands, not ") + format_name(f));
  if (s.out != Format::f32 && s.out != Format::bf16 && s.out != Format::f16)
    throw InputError(std::string("scaled_mm writes f32, bf16 or f16, not ") + format_name(s.out));
  if (g.M < 0 || g.N < 0 || g.K < 0 || g.K > (int64_t{1} << 24))
    throw InputError("scaled_mm: bad shape M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
                     " K=" + std::to_string(g.K) + " (K at most 2^24)");
  if (s.cublas_sb_stride && s.scaling != GemmScaling::blockwise)
    throw InputError("the cuBLAS scale_b stride applies to blockwise scaling only");
  if (s.model == GemmModel::f32_kblock) {
    const int kb = gemm_kblock(s);
    const int group = s.scaling == GemmScaling::mx ? 32 : 128;
    const bool grouped = s.scaling != GemmScaling::tensor && s.scaling != GemmScaling::rowwise;
    if (kb < 1 || kb > (1 << 20) || (grouped && group % kb != 0))
      throw InputError("f32-kblock:" + std::to_string(kb) + ": the K block must divide the scale group along K (" +
                       std::to_string(group) + ") for " + to_string(s.scaling) + " scaling");
  }
  if (s.model == GemmModel::hopper_tc) {
    if (s.scaling == GemmScaling::mx)
      throw InputError("hopper-tc does not take mx scaling (Hopper has no MX datapath; use exact or f32-kblock)");
    if (s.promote_never && (s.scaling == GemmScaling::blockwise || s.scaling == GemmScaling::group))
      throw InputError("hopper-tc: promote never (fast accumulation) is refused with 128-block scales, as torch does");
  }
  if (s.split_k < 1 || s.split_k > 1024) throw InputError("split-k must be in [1, 1024], not " + std::to_string(s.split_k));
  if (s.split_k != 1 && s.model != GemmModel::hopper_tc)
    throw InputError(std::string("split-k applies to the hopper-tc model only, not ") + to_string(s.model));
  if (s.promote_never && s.model != GemmModel::hopper_tc)
    throw InputError(std::string("promote never applies to the hopper-tc model only, not ") + to_string(s.model));
}

void check_gemm_scales(const ScaledMmSpec& s, const float* scales, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    const float v = scales[i];
    if (std::isnan(v)) throw InputError(what + ": scale " + std::to_string(i) + " is NaN");
    if (s.scaling == GemmScaling::mx) {
      int e = 0;
      const bool pow2 = v > 0 && std::isfinite(v) && std::frexp(v, &e) == 0.5f;
      if (!(v == 0 && !std::signbit(v)) && !(std::isinf(v) && v > 0) && !pow2)
        throw InputError(what + ": scale " + std::to_string(i) + " (" + std::to_string(v) +
                         ") is not a ue8m0 value (0, +Inf or a positive power of two)");
    }
  }
}

void check_scaled_mm_operands(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                              const float* sa, const float* sb, const float* bias, const void* out) {
  check_scaled_mm(s, g);
  if (g.M == 0 || g.N == 0) return;
  if ((g.K > 0 && (!a || !bt)) || (!sa && gemm_sa_count(s, g) > 0) || (!sb && gemm_sb_count(s, g) > 0) || !out)
    throw InputError("scaled_mm: a null operand (a, bt, sa, sb or out)");
  if ((s.bias != BiasMode::none) != (bias != nullptr))
    throw InputError(s.bias != BiasMode::none ? "scaled_mm: bias mode " + std::string(to_string(s.bias)) + " needs a bias"
                                              : std::string("scaled_mm: a bias given with bias mode none"));
  check_gemm_scales(s, sa, gemm_sa_count(s, g), "scaled_mm sa");
  check_gemm_scales(s, sb, gemm_sb_count(s, g), "scaled_mm sb");
}

std::vector<GemmVariant> gemm_model_variants(const ScaledMmSpec& base) {
  std::vector<GemmVariant> v;
  ScaledMmSpec s = base;
  s.split_k = 1, s.promote_never = false, s.kblock = 0, s.promote_arith = PromoteArith::mul_mul_add;
  s.model = GemmModel::exact;
  v.push_back({"exact", s});
  s.model = GemmModel::f32_kblock;
  for (PromoteArith pa : {PromoteArith::mul_mul_add, PromoteArith::fma}) {
    s.promote_arith = pa;
    v.push_back({std::string("f32-kblock --promote-arith ") + to_string(pa), s});
  }
  s.promote_arith = PromoteArith::mul_mul_add;
  s.model = GemmModel::hopper_tc;
  for (bool never : {false, true})
    for (int split = 1; split <= 5; ++split) {
      s.promote_never = never, s.split_k = split;
      v.push_back({std::string("hopper-tc --promote ") + (never ? "never" : "128") + " --split-k " + std::to_string(split), s});
    }
  s.promote_never = false, s.split_k = 1;
  s.model = GemmModel::mma_sync_sm90;
  v.push_back({"mma-sync-sm90", s});
  return v;
}

}  // namespace fp8ref
