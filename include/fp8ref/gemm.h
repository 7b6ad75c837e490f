// fp8ref — scaled FP8 matrix multiplication: scaled_mm and scaled_bmm, with the accumulation models of real kernels
// (../shared/NUMERICS.md §5; research/quant-conventions.md §5–6, §8, §11; research/h200-cublas-fp8-model.md;
// research/h200-mma-fp8-model.md; research/paged-attention-conventions.md (d)).
//
// ---- The op ---------------------------------------------------------------------------------------------------
//   out[m, n] = round_out( Σ_k a[m,k] · b[n,k] · sa(m,k) · sb(n,k)  (+ bias[n]) )
// A: [M, K] FP8 codes, row-major. B is given transposed, BT: [N, K] row-major (K-major; what torch._scaled_mm's
// column-major mat2 and DeepGEMM take). Formats: e4m3fn or e5m2 on each side (mixed allowed; fnuz formats are
// refused). Scales are f32 values in *logical* shapes (row-major), one per group:
//   scaling     sa shape          sb shape               group of sa / sb along K
//   tensor      [1]               [1]                    all K
//   rowwise     [M]               [N]                    all K (per token × per output channel)
//   blockwise   [M, KB]           [NB, KB]               1×128 / 128×128 (DeepSeek-V3)     KB = ceil(K/128),
//   group       [M, KB]           [N, KB]                1×128 / 1×128                      NB = ceil(N/128)
//   mx          [M, ceil(K/32)]   [N, ceil(K/32)]        1×32 / 1×32, ue8m0 (f32 powers of two, or 0, +Inf, NaN)
// K % 128 != 0 (K % 32 for mx) is defined: the last scale group along K covers the K % 128 elements present
// (exactly as if A and B were zero-padded to the next multiple); likewise for N % 128 in blockwise.
// Scale values must not be NaN (InputError); ±Inf and 0 are allowed and propagate by IEEE rules (Inf·0 = NaN).
// Output: f32, bf16 or f16 (RNE; overflow to ±Inf). Bias (optional, f32 values [N]):
//   bias=f32  added to the f32 result before the output rounding: out = RN_out(RN32(acc + bias)); for the exact
//             model added exactly, so the output is rounded once;
//   bias=out  added after the rounding, in the output type: out = RN_out(RN_out(acc) + RN_out(bias)) (what
//             sglang/vLLM/DeepSeek callers do with `output + bias`; for f32 output the two modes are equal).
//
// ---- The accumulation models ------------------------------------------------------------------------------------
// exact          The exact real result, every scale included, rounded once to the output type (RNE). Products
//                are exact small integers times powers of two; the sum is a wide fixed-point integer.
// f32-kblock:KB  Per K block of KB (default 128; it must divide the scale group along K: 128, or 32 for mx):
//                P = the exact block partial Σ a·b rounded once to f32 (RNE); then promoted into an f32 acc (from
//                +0, blocks in increasing k) with `promote_arith`:
//                  mul-mul-add  acc = RN(RN(RN(P·sa)·sb) + acc)      (Triton `acc += dot*a_s*b_s`, DeepSeek-V3)
//                  fma          acc = fma(RN(sa·sb), P, acc)          (DeepGEMM sm90)
//                then out = RN_out(acc (+bias)).
// hopper-tc      The H200 wgmma FP8 datapath and cuBLAS 13.0's kernels around it (h200-cublas-fp8-model.md):
//                steps of 32 k aligned to the nominal product exponent E(a)+E(b) and the running partial, every
//                term truncated toward zero to 2^(e−13), the sum truncated to 14 significant bits; promotion into
//                an f32 register every 128 K (promote=128) or never (promote=never = use_fast_accum=True);
//                split-K into `split_k` parts of whole 128-K tiles (ceil(tiles/s) each), parts summed in order in
//                f32; cuBLAS's epilogues: tensor RN(acc·RN(sa·sb)); rowwise RN(RN(acc·sb[n])·sa[m]); blockwise and
//                group acc = fma(RN(sa·sb), P_kb, acc) per 128-K block (P_kb: the 4 steps of block kb from +0).
//                blockwise with `cublas_sb_stride`: sb is read as cuBLAS 13.0 reads it — element (nb, kb) at flat
//                offset nb·roundup(KB, 4) + kb of the buffer given (then of length (NB−1)·roundup(KB,4) + KB) —
//                so a device output can be shown to equal what cuBLAS computes with misread scales.
//                Refused: mx (Hopper has no MX datapath), promote=never with blockwise/group (torch rejects it).
//                Measured on the H200 (tests/data/h200/scaled_mm*_h200.npz, 80 outputs, all bit-exact):
//                e4m3fn×e4m3fn and e4m3fn×e5m2; f32, bf16 and f16 outputs (RNE of the f32 result); torch's bias=
//                is bias=f32 here (RN32 after the scale epilogue, then one rounding to the output type).
//                e5m2×e5m2 (torch refuses it) and group scaling (the blockwise epilogue) are our extension.
// mma-sync-sm90  `mma.sync.m16n8k32` FP8 on sm_90 (fp8→f16, two chained HMMA.16816.F32 steps per 32 k;
//                h200-mma-fp8-model.md; ref::mma_sm90_element), one mma per 32 k chained through C from +0 (a short
//                last chunk zero-padded); tensor/rowwise: hopper-tc's epilogues; blockwise/group/mx: per scale group
//                P from +0 and acc = fma(RN32(sa·sb), P, acc). A model of a hand-written mma.sync kernel of that
//                structure (our definition; only the instruction is measured). cpu backend only.
// fast           The CPU fallback: fp8 → bf16 (exact) and a oneDNN bf16 (AMX) matmul in any order, scales in the
//                epilogue; not bit-exact — within a derived bound of `exact` (src/cpu/gemm_fast.h).
//
// ---- scaled_bmm ---------------------------------------------------------------------------------------------------
// A [Bt, M, K], BT [Bt, N, K] (or [N, K]: one B for every batch), out [Bt, M, N]; per batch b the scaled_mm above
// with scales sa_b, sb_b. Scales: the scaled_mm shapes with a leading batch dimension ([Bt, ...]), or without it
// (shared by every batch) — and for tensor scaling also [Bt] (one scale per batch / per sequence: fms-mo's
// per-sentence k_scale, paged-attention-conventions.md (d.5); the case torch's CPU _scaled_mm cannot serve).
// Our generalization (d.5) uses these models, not torch's CPU mm order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fp8ref/format.h"

namespace fp8ref {

enum class GemmScaling : uint8_t { tensor, rowwise, blockwise, group, mx };
enum class GemmModel : uint8_t { exact, f32_kblock, hopper_tc, mma_sync_sm90, fast };
enum class PromoteArith : uint8_t { mul_mul_add, fma };  // "mul-mul-add" (Triton), "fma" (DeepGEMM)
enum class BiasMode : uint8_t { none, f32, out };

const char* to_string(GemmScaling s);
const char* to_string(GemmModel m);  // "exact", "f32-kblock", "hopper-tc", "mma-sync-sm90", "fast"
const char* to_string(PromoteArith p);
const char* to_string(BiasMode b);
bool parse_gemm_scaling(std::string_view s, GemmScaling* out);
// "exact", "f32-kblock" / "f32-kblock:KB", "hopper-tc", "mma-sync-sm90", "fast". kblock: KB (0 = default) or
// untouched for the other models.
bool parse_gemm_model(std::string_view s, GemmModel* out, int* kblock);
bool parse_promote_arith(std::string_view s, PromoteArith* out);
bool parse_bias_mode(std::string_view s, BiasMode* out);

struct ScaledMmSpec;
// The deterministic models a device output may follow, as variants of `base` (same formats, scaling, output,
// bias, cuBLAS scale stride): exact; f32-kblock with both promotion arithmetics; hopper-tc with promotion every
// 128 K or never, split-K 1..5; mma-sync-sm90. `name` spells the CLI flags ("hopper-tc --promote never
// --split-k 2"). Used by `fp8ref scaled-mm --identify` and by `fp8ref diff` (distance to each model).
struct GemmVariant;
std::vector<GemmVariant> gemm_model_variants(const ScaledMmSpec& base);

struct ScaledMmSpec {
  Format fa = Format::e4m3fn, fb = Format::e4m3fn;  // e4m3fn or e5m2
  GemmScaling scaling = GemmScaling::tensor;
  Format out = Format::bf16;  // f32, bf16, f16
  GemmModel model = GemmModel::exact;
  BiasMode bias = BiasMode::none;
  // f32-kblock
  int kblock = 0;  // 0: the scale group along K (128; 32 for mx)
  PromoteArith promote_arith = PromoteArith::mul_mul_add;
  // hopper-tc
  bool promote_never = false;  // --promote never (cuBLAS use_fast_accum=True)
  int split_k = 1;             // >= 1
  bool cublas_sb_stride = false;

  std::string describe() const;  // one line naming every field that applies
};

struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
};

struct GemmVariant {
  std::string name;
  ScaledMmSpec spec;
};

// Logical scale shapes (row-major) for the spec and shape. sb: with cublas_sb_stride the 1-D buffer length.
std::vector<int64_t> gemm_sa_shape(const ScaledMmSpec& s, const GemmShape& g);
std::vector<int64_t> gemm_sb_shape(const ScaledMmSpec& s, const GemmShape& g);
// The number of scales in those shapes.
size_t gemm_sa_count(const ScaledMmSpec& s, const GemmShape& g);
size_t gemm_sb_count(const ScaledMmSpec& s, const GemmShape& g);
// The effective f32-kblock block size (kblock or the default).
int gemm_kblock(const ScaledMmSpec& s);

// The scales of the group holding column k, read from the logical shapes above (blockwise with cublas_sb_stride:
// element (n/128, k/128) of the flat buffer at (n/128)·roundup(KB, 4) + k/128).
class GemmScales {
 public:
  GemmScales(const ScaledMmSpec& s, const GemmShape& g, const float* sa, const float* sb)
      : scaling_(s.scaling), sa_(sa), sb_(sb), KB_((g.K + 127) / 128), K32_((g.K + 31) / 32),
        stride_(s.cublas_sb_stride ? (KB_ + 3) / 4 * 4 : KB_) {}
  float a(int64_t m, int64_t k) const {
    switch (scaling_) {
      case GemmScaling::tensor: return sa_[0];
      case GemmScaling::rowwise: return sa_[m];
      case GemmScaling::mx: return sa_[m * K32_ + k / 32];
      default: return sa_[m * KB_ + k / 128];
    }
  }
  float b(int64_t n, int64_t k) const {
    switch (scaling_) {
      case GemmScaling::tensor: return sb_[0];
      case GemmScaling::rowwise: return sb_[n];
      case GemmScaling::blockwise: return sb_[(n / 128) * stride_ + k / 128];
      case GemmScaling::group: return sb_[n * KB_ + k / 128];
      case GemmScaling::mx: return sb_[n * K32_ + k / 32];
    }
    return 0;
  }

 private:
  GemmScaling scaling_;
  const float *sa_, *sb_;
  int64_t KB_, K32_, stride_;
};
// Checks that the spec is consistent (formats, out type, model/scaling combinations, kblock, split_k) and that the
// shape is usable; throws InputError with the reason.
void check_scaled_mm(const ScaledMmSpec& s, const GemmShape& g);
// Throws InputError (naming `what` and the index) if any scale is NaN, or, for mx, not 0, +Inf or a positive power
// of two.
void check_gemm_scales(const ScaledMmSpec& s, const float* scales, size_t n, const std::string& what);
// What every scaled_mm entry point checks first: check_scaled_mm, then the operands — a, bt, sa, sb and out not
// null (where there is work), bias given iff spec.bias != none, and check_gemm_scales on sa and sb (their logical
// sizes). Throws InputError.
void check_scaled_mm_operands(const ScaledMmSpec& s, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                              const float* sa, const float* sb, const float* bias, const void* out);

// out: M·N elements of spec.out: f32 values, or bf16/f16 bit patterns (uint16_t). bias: N f32 values or nullptr
// (required iff spec.bias != none). sa/sb: the logical shapes above. a: M·K codes, bt: N·K codes.
namespace ref {
// The reference (reference/gemm_ref.cc): scalar, one output element at a time, integer arithmetic for every
// rounding. Models exact, f32-kblock, hopper-tc.
void scaled_mm(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
               const float* sb, const float* bias, void* out);
// The exact value of every output element before the output rounding (bias=f32 included), rounded to f64 (RNE):
// for the diff's exact.* tensor.
void scaled_mm_exact_f64(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                         const float* sa, const float* sb, const float* bias, double* out);
}  // namespace ref

namespace cpu {
// The CPU implementations (src/cpu/gemm_cpu.cc, OpenMP): exact, f32-kblock and hopper-tc bit-identical to
// ref::scaled_mm; streaming over K. model=fast and mma-sync-sm90 are routed to their implementations.
void scaled_mm(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt, const float* sa,
               const float* sb, const float* bias, void* out);

// scaled_bmm: batch Bt; a [Bt, M, K]; bt [Bt or 1, N, K] (b_batched false = one B shared); sa/sb with
// sa_batched/sb_batched = a leading batch dimension present (else shared). For tensor scaling a batched scale is
// [Bt]. out [Bt, M, N].
struct BmmOperands {
  int64_t batch = 1;
  bool b_batched = true, sa_batched = false, sb_batched = false;
};
void scaled_bmm(const ScaledMmSpec& spec, const GemmShape& g, const BmmOperands& bo, const uint8_t* a,
                const uint8_t* bt, const float* sa, const float* sb, const float* bias, void* out);

// ---- model=fast: the CPU fallback (src/cpu/gemm_fast.{h,cc}; algorithm and bound: docs/gemm-fast.md) ----------
// Not bit-exact: any summation order within the scale groups, within scaled_mm_fast_bound of the exact result.
// cpu::scaled_mm with model=fast calls the first scaled_mm_fast; a FastGemmB converts and packs a weight once for
// many calls (the decode step's repeated products with one B).
// B converted to bf16 and packed for `fast` (N, K and the scaling's K group fixed). Reusable across calls with any
// M, A, scales, bias and output type (a weight converted once).
class FastGemmB {
 public:
  FastGemmB(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* bt);
  int64_t N() const { return N_; }
  int64_t K() const { return K_; }
  int64_t group() const { return G_; }  // K group: 128, 32 or K
  int64_t tile_n() const { return Nt_; }
  const uint16_t* data() const { return data_.data(); }  // [ceil(N/Nt)][KB][Nt][G] bf16 bits
  // the codes in the small-M path's column blocks of 16 (src/cpu/gemm_fast.cc pack_b16); null on CPUs without AVX-512
  // BF16 (and for K = 0)
  const uint8_t* codes16() const { return codes16_.empty() ? nullptr : codes16_.data(); }

 private:
  int64_t N_, K_, G_, Nt_;
  std::vector<uint16_t> data_;
  std::vector<uint8_t> codes16_;
};

// out: M·N of spec.out (f32 values or bf16/f16 bits); scales and bias as in include/fp8ref/gemm.h. spec.model is
// not consulted. Throws InputError for shapes/specs check_scaled_mm refuses.
void scaled_mm_fast(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                    const float* sa, const float* sb, const float* bias, void* out);
void scaled_mm_fast(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const FastGemmB& b,
                    const float* sa, const float* sb, const float* bias, void* out);

// The per-element bound above: |fast(m,n) − v(m,n)| ≤ bound[m·N + n], v = the exact real result (bias included,
// before any output rounding). +Inf where no claim is made.
void scaled_mm_fast_bound(const ScaledMmSpec& spec, const GemmShape& g, const uint8_t* a, const uint8_t* bt,
                          const float* sa, const float* sb, const float* bias, double* bound);
}  // namespace cpu

}  // namespace fp8ref
