// fp8ref — fused (residual add +) RMSNorm + FP8 group quantization, `rmsnorm_quant`, under named conventions
// (../shared/NUMERICS.md §4 "Fused RMSNorm + group quant"; research/quant-conventions.md §7, §10 rows 15–17).
//
// ---- Shapes -----------------------------------------------------------------------------------------------------
// x [..., K] (rank >= 1; the leading dimensions are M rows), weight [K], residual (optional) [..., K] like x; all of
// the same source format `from` (f32, bf16 or f16 — the kernels require weight and residual in the input dtype).
// Outputs: q [..., K] (FP8 codes), scales [..., ceil(K/G)] (the group quant's logical shape: include/fp8ref/quant.h,
// granularity group:G or row), and with a residual the updated residual [..., K] in `from` (residual_out).
// K = 0 or M = 0: empty outputs, nothing computed.
//
// ---- The steps (each a field of RmsNormQuantSpec; per row) -------------------------------------------------------
// Every f32 operation is IEEE binary32 RNE with the GPU NaN model of quant.h (a NaN result is +NaN 0x7FFFFFFF).
// RN_dt(v) is RNE of an f32 to the input dtype (identity for f32 inputs).
//   1. z = f32(x)                                  without a residual;
//      residual-sum=f32:   z = RN32(f32(x) + f32(r)); residual_out = RN_dt(z)      (aiter; vLLM fused quant kernels)
//      residual-sum=dtype: z = f32(RN_dt(RN32(f32(x) + f32(r)))); residual_out = RN_dt(z)
//                                                  (vLLM fused_add_rms_norm: `scalar_t z = input + residual`)
//   2. v = the mean of z² over the row (N = K), by `variance`:
//      exact      v = RN32(Σ z² / N) with Σ exact (a fixed-point superaccumulator over z² exact in f64), rounded
//                 once; any NaN z -> NaN; any ±Inf z (no NaN) -> +Inf; Σ/N above the f32 range -> +Inf.
//      f32-seq    a = +0; a = fma(z_k, z_k, a) for k = 0..N-1 (one rounding per step, as nvcc/Triton contract
//                 `ss += x * x`); v = RN32(a / f32(N)).
//      cub:T      vLLM vectorized::compute_rms with blockDim T (cub:auto = vLLM's launch rule
//                 T = min(K, M <= 256 ? 512 : 256)); needs K % 4 == 0 (vLLM checks it):
//                   thread t: a_t = +0; for i = t, t+T, ... < K/4: for j = 0..3: a_t = fma(z_4i+j, z_4i+j, a_t)
//                   warp w (threads 32w..32w+31, only those < T): offsets o = 1, 2, 4, 8, 16:
//                     lane l: a_l = RN32(a_l + a_{l+o}) where l + o is a valid lane (cub WarpReduceShfl)
//                   block: s = warp 0's lane 0; s = RN32(s + warp_w) for w = 1, 2, ... (cub ApplyWarpAggregates)
//                   v = RN32(s / f32(K))
//   3. u = RN32(v + eps)                             (eps an f32; `ss / hidden + eps`)
//   4. r = rsqrt(u), by `rsqrt`:
//      rn     the correctly rounded f32 of 1/sqrt(u) (+0 -> +Inf, +Inf -> +0, NaN -> NaN)
//      ieee   RN32(1 / RN32(sqrt(u)))  (CUDA `1.0f / sqrtf(u)`, torch CPU)
//      cuda-rsqrtf  CUDA `rsqrtf` on sm_90 (MUFU.RSQ with subnormal prescaling), bit for bit from a table captured on
//             the H200 (reference/cuda_rsqrtf_ref.cc; matches the device on 2^24 random inputs; equal to rn for only
//             ~88.5% of inputs). torch.rsqrt on CUDA gives the same bits (all captured inputs).
//      NOT modelled: Triton `tl.math.rsqrt` on NVIDIA (differs from rsqrtf on ~3.3% of inputs, measured) and the AMD
//      rsq of aiter's `tl.math.rsqrt` on ROCm; conventions that use them take `rn` and say so (docs/conventions.md).
//   5. a_k = RN32(z_k · r)
//   6. y_k by `weight`:
//      f32           y = RN32(a · f32(w))                                    (aiter: all f32, no rounding before quant)
//      dtype-twice   y = f32(RN_dt(RN32(f32(RN_dt(a)) · f32(w))))            (vLLM: bf16(bf16(x·r)·w))
//      dtype-once    y = f32(RN_dt(RN32(a · f32(w))))                        (DeepSeek-V3 RMSNorm: bf16(w·x·r))
//   7. the group quantization of y (f32 values) with `quant` (a QuantSpec: every step of include/fp8ref/quant.h),
//      dynamic scales, granularity group:G (or row). The reference calls ref::quantize on the normed rows.
//
// ---- Conventions ----------------------------------------------------------------------------------------------
//   exact                every step rounded once: residual-sum=f32, variance=exact, rsqrt=rn, weight=f32, then the
//                        exact group quant (quant.h "exact"), group:128.
//   aiter-rmsnorm-quant  ROCm/aiter fused_rms_fp8_group_quant (research §7.1): residual-sum=f32, weight=f32, then
//                        amax-floor 1e-10, s = amax/max, q = clamp(y·(1/s)), max = finfo (240 e4m3fnuz), group:128.
//                        Not bit-exact with the device: the Triton-on-ROCm sum order and rsqrt are not modelled
//                        (variance=exact, rsqrt=rn stand in; Triton's `/` on ROCm taken as IEEE).
//   vllm-rmsnorm-quant   vLLM rms_norm_per_block_quant (research §7.2; fused_layernorm_dynamic_per_token_quant.cu,
//                        layernorm_utils.cuh): residual-sum=f32, variance=cub:auto, weight=dtype-twice, then
//                        s = max(amax/qmax, 1/(qmax·512)), q = clamp(y/s) (NaN -> +qmax), satfinite cast, group:128
//                        (qmax 224 for e4m3fnuz), rsqrt=cuda-rsqrtf. Checked against a port of the kernel's
//                        arithmetic (real cub::BlockReduce, rsqrtf, nvcc sm_90) run on the H200: codes, scales,
//                        residual and each row's r bit for bit (tests/data/h200/rmsnorm_vllm_h200.npz); vLLM itself
//                        was not run (not installed on the device).
//   deepseek-rmsnorm     DeepSeek-V3 inference/model.py RMSNorm then act_quant (research §7.3 + §3.6): residual
//                        added in bf16 by the caller (residual-sum=dtype), weight=dtype-once, then deepseek-act-quant.
//                        rsqrt=cuda-rsqrtf (torch.rsqrt = rsqrtf, measured). Not bit-exact with the device in the
//                        torch mean (variance=exact stands in; measured on the H200: r differs in 77 of 576 rows, the
//                        bf16 y in 2 rows — docs/conventions.md). The act_quant step is quant convention
//                        deepseek-act-quant (Triton's `/` emulated bit-exactly: div=triton-nv).
// Every field can be overridden (apply_rmsnorm_override; the descriptor keys and CLI flags of the same names).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8ref/format.h"
#include "fp8ref/quant.h"

namespace fp8ref {

enum class ResidualSum : uint8_t { f32, dtype };
enum class Variance : uint8_t { exact, f32_seq, cub };
enum class Rsqrt : uint8_t { rn, ieee, cuda };  // "rn", "ieee", "cuda-rsqrtf"
enum class NormWeight : uint8_t { f32, dtype_twice, dtype_once };

const char* to_string(ResidualSum v);
const char* to_string(Rsqrt v);
const char* to_string(NormWeight v);

struct RmsNormQuantSpec {
  std::string convention = "exact";
  ResidualSum residual_sum = ResidualSum::f32;
  Variance variance = Variance::exact;
  int cub_threads = 0;  // variance=cub: blockDim T; 0 = auto (vLLM's launch rule, from M and K)
  float eps = 1e-6f;
  Rsqrt rsqrt = Rsqrt::rn;
  NormWeight weight = NormWeight::f32;
  QuantSpec quant;  // the group quant of the normed values (source f32)

  std::string variance_text() const;  // "exact", "f32-seq", "cub:auto", "cub:256"
  // One line: "convention=... residual-sum=f32 variance=exact eps=1e-06 rsqrt=rn weight=f32 <quant.describe()>".
  std::string describe() const;
};

struct RmsNormConventionInfo {
  const char* name;
  const char* reproduces;
  const char* research;
  const char* bit_exactness;  // what is and is not bit-exact with the device
  const char* targets;
};
const std::vector<RmsNormConventionInfo>& rmsnorm_quant_conventions();

// The preset `name` for target `to` (group:128 by default). nullopt + *error for an unknown name or target.
// scale_dtype picks the quant's scale variant as resolve_quant_convention does for the quant convention the preset
// runs (e.g. deepseek-rmsnorm with ue8m0 scales: DeepSeek-V3.2's act_quant scale_fmt="ue8m0"); nullopt: f32.
std::optional<RmsNormQuantSpec> resolve_rmsnorm_quant_convention(std::string_view name, Format to, std::string* error,
                                                                 std::optional<ScaleDtype> scale_dtype = std::nullopt);
// Overrides one field: residual-sum (f32|dtype), variance (exact|f32-seq|cub:auto|cub:T), eps (a number >= 0,
// rounded to f32), rsqrt (rn|ieee|cuda-rsqrtf), weight (f32|dtype-twice|dtype-once), group (G: granularity group:G), and
// every quantize field of apply_quant_override. false + *error for an unknown field or a bad value.
bool apply_rmsnorm_override(std::string_view field, std::string_view value, RmsNormQuantSpec* spec, std::string* error);
// Finalizes the quant (dynamic) and checks the fields fit: granularity group:G or row; cub:T with T in [1, 1024].
// Throws InputError.
void finalize_rmsnorm_quant_spec(RmsNormQuantSpec* spec);

// Shapes and checks of one call. Throws InputError (naming the tensor) for a source format other than
// f32/bf16/f16, rank 0, a weight not [K], a residual shape unlike x, cub with K % 4 != 0, or a group tail under
// tail=error.
struct RmsNormLayout {
  int64_t M = 0, K = 0;
  QuantLayout quant;  // of the normed tensor (shape of x)
  int cub_threads = 0;  // the resolved T (variance=cub)
};
RmsNormLayout rmsnorm_layout(const RmsNormQuantSpec& spec, Format from, const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& weight_shape, const std::vector<int64_t>* residual_shape);

// Arguments of one call. x, weight, residual: little-endian elements of `from` (bf16 as bit patterns), C order.
// residual may be null (no residual add); residual_out (n elements of `from`) is written when residual is given,
// and may be the residual or x itself (updated in place, as vLLM's fused_add_rms_norm does).
// q: n codes; scales: n_scales elements of scale_storage(spec.quant). normed (optional): y, n f32 values.
// exact_q (optional): y / s as f64 (the golden file's exact tensor). rms (optional): each row's r (step 4).
struct RmsNormQuantArgs {
  Format from = Format::bf16;
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* residual = nullptr;
  std::vector<int64_t> shape, weight_shape;
  uint8_t* q = nullptr;
  void* scales = nullptr;
  void* residual_out = nullptr;
  float* normed = nullptr;
  double* exact_q = nullptr;
  float* rms = nullptr;  // optional: r = rsqrt(v + eps) of each row (M values; untouched when K = 0)
};

namespace ref {
// The oracle (reference/rmsnorm_quant_ref.cc): scalar, one row at a time, the steps above in order.
void rmsnorm_quant(const RmsNormQuantSpec& spec, const RmsNormQuantArgs& args);
// Step 2 `exact` for one row of f32 values: RN32(Σ z² / n), Σ exact. Exposed for the CPU backend's fallback.
float mean_square_exact(const float* z, int64_t n);
// Step 4 `rn`: the correctly rounded f32 of 1/sqrt(u).
float rsqrt_rn(float u);
// Step 4 `cuda-rsqrtf`: CUDA rsqrtf on sm_90 (reference/cuda_rsqrtf_ref.cc).
float rsqrt_cuda(float u);
// Asks for the cache line of rsqrt_cuda(u)'s table entry (16 MiB table, one entry per input mantissa and exponent
// parity: a cache miss per call otherwise), so that a later rsqrt_cuda(u) finds it. Changes no result.
void rsqrt_cuda_prefetch(float u);
}  // namespace ref

namespace cpu {
// The CPU backend (src/cpu/rmsnorm_quant_cpu.cc): Highway + OpenMP over rows; bit-identical to ref::rmsnorm_quant.
void rmsnorm_quant(const RmsNormQuantSpec& spec, const RmsNormQuantArgs& args);
// Which kernel bf16 rows take where more than one applies (the same bits either way; tests and benchmarks compare
// them): automatic = the AVX-512 BF16 passes where the CPU has AVX512_BF16 + VBMI and Highway dispatches to an
// AVX-512 target (weights rounded to bf16: dtype-twice, dtype-once; and weight=f32 with x*(1/s) on rows without a
// residual; e4m3fn), else Highway; highway = never those.
enum class RmsNormPath : uint8_t { automatic, highway };
void rmsnorm_quant(const RmsNormQuantSpec& spec, const RmsNormQuantArgs& args, RmsNormPath path);
// Whether automatic takes the AVX-512 BF16 passes for some spec on this CPU and SIMD target.
bool rmsnorm_quant_has_avx512bf16();
// ref::rsqrt_rn's result (the correctly rounded f32 of 1/sqrt(u)) from an f64 estimate, the reference's exact
// comparisons only where the estimate lies too near an f32 rounding boundary.
float rsqrt_rn(float u);
// The AVX2 path's bf16 roundings by Veltkamp's split against the integer RNE, on the current SIMD target (AVX2 only:
// elsewhere -1). product false: the f32 with bits i for i in [i0, i1) (i1 <= 2^32); true: RN(a1·w) of the bf16 words
// a1 = i >> 16, w = i & 0xFFFF (finite). Values of ±0 or 2^-126 <= |·| < 2^111 are compared with the integer RNE bit
// for bit; subnormal ones must keep their sign and round to 0 < |·| <= 2^-126 (what the flush argument needs); their
// count in *checked. Returns the mismatches.
int64_t bf16_split_failures(uint64_t i0, uint64_t i1, bool product, int64_t* checked = nullptr);
}  // namespace cpu

}  // namespace fp8ref
