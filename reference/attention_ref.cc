// fp8ref — the paged-attention oracle: kv_cache_write and paged_attention, scalar, one (sequence, head, query row)
// at a time, in the order of the contract in include/fp8ref/attention.h. Not designed to be fast. Built with
// -ffp-contract=off: every f32 expression below is one IEEE binary32 operation with round-to-nearest-even, fma only
// where std::fma is written; bf16/f16 roundings go through fp8ref::ref::narrow, FP8 casts through fp8ref::ref::encode (integer code).
//
// Rounding steps per convention (the full list with sources is at the top of attention.h; pac = research/
// paged-attention-conventions.md):
//
// kv_cache_write
//   vllm-cuda      1. v = RN32(f32(x) / s)   2. code = RNE, satfinite (cuda-satfinite)               pac a.2.5, 0.4
//   sglang, spyre  1. v = RN32(f32(x) / s)   2. v = RN_md(v)   3. code = torch cast of md v            pac a.1.4, 0.8
//   exact          1. code = RNE(x / s) of the exact quotient, no saturation (convert convention exact)
//   dynamic scale  amax (exact, md) -> RN_md(RN32(amax / R)) -> max(., RN_md(1e-5))                   pac a.1.5
// paged_attention
//   exact                f64 throughout, products exact, one rounding at the output
//   vllm-paged-v1        deq_md (f16 for md f32) -> RN32(scale·dot) -> exp(l − m) -> Σ (+1e-6) -> 1/S ->
//                        RN_md(p·inv) -> Σ p̃·v̂ (fma)  -> RN_out                                          pac b.2
//   vllm-triton-unified  deq_md -> RN32(scale·dot) [soft-cap] -> tiles of T: m', P, α, acc·α + Σ RN_md(P)·v̂,
//                        L·α + ΣP -> RN_out(acc / L)                                                     pac b.3
//   flashinfer           f32(k8) -> RN32(dot·c2), c2 = RN32(RN32(scale·sk)·log2e) -> tiles of T with exp2,
//                        o·a + p·f32(v8) -> RN_out(o / d) -> ·sv in the out dtype                         pac b.4
//   torch-sdpa-math      deq_md -> q·√s, k·√s (f32) -> dot -> +mask -> max, exp, lane-ordered Σ, ·(1/S) ->
//   spyre                Σ p·v̂ (fma) -> RN_md                                                             pac b.1.7
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/mma.h"
#include "fp8ref/mufu_ex2.h"
#include "fp8ref/triton_div.h"

namespace fp8ref::attn {

namespace {

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

size_t elem_size(Format f) { return static_cast<size_t>(format_info(f).bits / 8); }

// Element i of an md array (f32/bf16/f16 bits), widened exactly to f32.
float load_md(Format md, const void* p, int64_t i) { return fp8ref::ref::load_f32(md, p, i); }
uint64_t md_bits(Format md, const void* p, int64_t i) {
  uint64_t b = 0;
  std::memcpy(&b, static_cast<const uint8_t*>(p) + elem_size(md) * i, elem_size(md));
  return b;
}

// RN to `f` (f32 identity, bf16/f16 RNE) and back to f32.
float round_to(Format f, float x) { return fp8ref::ref::round_through(f, x); }

// A NaN result is stored as the canonical quiet NaN (+, 0x7FC00000 / 0x7FC0 / 0x7E00): which NaN operand propagates
// (its sign and payload) depends on each implementation's operand order, not on the convention.
void store_out(Format f, void* out, int64_t i, float x) {
  if (std::isnan(x)) x = std::numeric_limits<float>::quiet_NaN();
  const uint64_t b = fp8ref::ref::narrow(Format::f32, bits_of(x), f);
  std::memcpy(static_cast<uint8_t*>(out) + elem_size(f) * i, &b, elem_size(f));
}
void store_out_f64(Format f, void* out, int64_t i, double x) {
  if (std::isnan(x)) x = std::numeric_limits<double>::quiet_NaN();
  uint64_t xb;
  std::memcpy(&xb, &x, 8);
  const uint64_t b = fp8ref::ref::narrow(Format::f64, xb, f);
  std::memcpy(static_cast<uint8_t*>(out) + elem_size(f) * i, &b, elem_size(f));
}

constexpr float kMagic = 12582912.0f;  // 1.5·2^23: (t + M) − M rounds |t| < 2^22 to the nearest integer, ties even

float pow2i(int e) { return f32_of(static_cast<uint32_t>(e + 127) << 23); }  // 2^e, −126 <= e <= 127
float ldexp2(float u, int q) { return (u * pow2i(q >> 1)) * pow2i(q - (q >> 1)); }

}  // namespace

namespace ref {

// Sleef 3.x xexpf, the FMA form (vmla = fma) that torch's Vectorized<float>::exp() runs on AVX2/AVX512:
//   q = rint(RN32(d · R_LN2f)); s = fma(q, −L2Uf, d); s = fma(q, −L2Lf, s);
//   u = c5; u = fma(u, s, c4) ... fma(u, s, 0.5f); u = RN32(1 + fma(RN32(s·s), u, s)); u = (u·2^(q>>1))·2^(q − (q>>1))
//   d < −104 -> +0; d > 100 -> +Inf; NaN -> NaN. (Checked against torch.softmax rows captured on the device, whose
//   exp this is; torch.exp itself runs MKL VML's vsExp, a different function.)
float exp_sleef(float d) {
  if (std::isnan(d)) return d;
  if (d < -104.0f) return 0.0f;
  if (d > 100.0f) return std::numeric_limits<float>::infinity();
  const float t = d * 1.44269504088896340736f;
  const float qf = (t + kMagic) - kMagic;
  const int q = static_cast<int>(qf);
  float s = std::fma(qf, -0.693145751953125f, d);
  s = std::fma(qf, -1.428606765330187045e-06f, s);
  float u = 0.000198527617612853646278381f;
  u = std::fma(u, s, 0.00139304355252534151077271f);
  u = std::fma(u, s, 0.00833336077630519866943359f);
  u = std::fma(u, s, 0.0416664853692054748535156f);
  u = std::fma(u, s, 0.166666671633720397949219f);
  u = std::fma(u, s, 0.5f);
  u = 1.0f + std::fma(s * s, u, s);
  return ldexp2(u, q);
}

// Sleef 3.x xexp2f, FMA form: u = rint(d); s = d − u (exact); Horner in fma; u = fma(u, s, 1); u·2^q (two steps);
// d >= 128 -> +Inf; d < −150 -> +0; NaN -> NaN.
float exp2_sleef(float d) {
  if (std::isnan(d)) return d;
  if (d < -150.0f) return 0.0f;
  if (d >= 128.0f) return std::numeric_limits<float>::infinity();
  const float uf = (d + kMagic) - kMagic;
  const int q = static_cast<int>(uf);
  const float s = d - uf;
  float u = 0.1535920892e-3f;
  u = std::fma(u, s, 0.1339262701e-2f);
  u = std::fma(u, s, 0.9618384764e-2f);
  u = std::fma(u, s, 0.5550347269e-1f);
  u = std::fma(u, s, 0.2402264476e+0f);
  u = std::fma(u, s, 0.6931471825e+0f);
  u = std::fma(u, s, 1.0f);
  return ldexp2(u, q);
}

// ---- kv_cache_write ---------------------------------------------------------------------------------------------

namespace {

// Spyre/fms-mo dynamic scale of one group, in md: max(RN_md(RN32(amax / range)), RN_md(1e-5)); NaN propagates.
void compute_dynamic_scales(const KvWriteSpec& spec, const KvWriteArgs& a, const void* x, float range, float* out) {
  const int64_t H = spec.cache.num_kv_heads, D = spec.cache.head_dim;
  const int64_t n = num_scales(spec.scale_kind, H, a.num_seqs);
  std::vector<float> amax(static_cast<size_t>(n), 0.0f);
  std::vector<bool> nan(static_cast<size_t>(n), false);
  int64_t b = 0;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    if (spec.scale_kind == KvScaleKind::seq)
      while (b + 1 < a.num_seqs && t >= a.query_start_loc[b + 1]) ++b;
    for (int64_t h = 0; h < H; ++h) {
      const size_t g = static_cast<size_t>(scale_index(spec.scale_kind, b, h));
      for (int64_t d = 0; d < D; ++d) {
        const float v = std::fabs(load_md(spec.model, x, (t * H + h) * D + d));
        if (std::isnan(v)) nan[g] = true;
        else if (v > amax[g]) amax[g] = v;
      }
    }
  }
  for (int64_t g = 0; g < n; ++g)
    out[g] = kv_dynamic_scale(spec.model, nan[static_cast<size_t>(g)] ? std::numeric_limits<float>::quiet_NaN()
                                                                     : amax[static_cast<size_t>(g)], range);
}

struct StoreCodec {
  StoreConvention conv;
  Format md;
  ConversionSpec cast;  // vllm-cuda: f32 -> fp8 satfinite; sglang/spyre: torch-2.11 md -> fp8; exact: f64 -> fp8

  uint8_t operator()(uint64_t xbits, float s) const {
    const float x = f32_of(static_cast<uint32_t>(fp8ref::ref::narrow(md, xbits, Format::f32)));
    switch (conv) {
      case StoreConvention::vllm_cuda: return fp8ref::ref::encode_f32(x / s, cast);
      case StoreConvention::sglang:
      case StoreConvention::spyre: {
        const uint64_t v = fp8ref::ref::narrow(Format::f32, bits_of(x / s), md);
        return fp8ref::ref::encode(md, v, cast);
      }
      case StoreConvention::exact:
        // The f64 quotient of two 24-bit significands is never on the other side of an FP8 rounding boundary (a
        // 5-bit number) from the exact one, and equals it when it is a boundary: one rounding of x/s.
        return fp8ref::ref::encode_f64(static_cast<double>(x) / static_cast<double>(s), cast);
    }
    return 0;
  }
};

StoreCodec store_codec(const KvWriteSpec& spec) {
  StoreCodec c{spec.convention, spec.model, {}};
  std::string err;
  std::optional<ConversionSpec> cs;
  switch (spec.convention) {
    case StoreConvention::vllm_cuda: cs = resolve_convention("cuda-satfinite", Format::f32, spec.cache.format, &err); break;
    case StoreConvention::sglang:
    case StoreConvention::spyre: cs = resolve_convention("torch-2.11", spec.model, spec.cache.format, &err); break;
    case StoreConvention::exact: cs = resolve_convention("exact", Format::f64, spec.cache.format, &err); break;
  }
  if (!cs) throw InputError("kv_cache_write: " + err);
  c.cast = *cs;
  return c;
}

}  // namespace

float kv_dynamic_scale(Format md, float amax, float range) {
  const float s = round_to(md, amax / range);
  const float floor = round_to(md, 1e-5f);
  if (std::isnan(s)) return s;
  return s < floor ? floor : s;
}

void kv_cache_write(const KvWriteSpec& spec, const KvWriteArgs& a) {
  check_kv_cache_write(spec, a);
  const CacheShape& c = spec.cache;
  const int64_t H = c.num_kv_heads, D = c.head_dim;
  if (spec.dynamic) {
    compute_dynamic_scales(spec, a, a.k, 200.0f, a.k_scale);
    compute_dynamic_scales(spec, a, a.v, 100.0f, a.v_scale);
  }
  const StoreCodec codec = store_codec(spec);
  int64_t b = 0;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    if (spec.scale_kind == KvScaleKind::seq)
      while (b + 1 < a.num_seqs && t >= a.query_start_loc[b + 1]) ++b;
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0) continue;
    const int64_t blk = slot / c.block_size, off = slot % c.block_size;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t si = scale_index(spec.scale_kind, b, h);
      const int64_t dst = c.offset(blk, off, h), src = (t * H + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        a.k_cache[dst + d] = codec(md_bits(spec.model, a.k, src + d), a.k_scale[si]);
        a.v_cache[dst + d] = codec(md_bits(spec.model, a.v, src + d), a.v_scale[si]);
      }
    }
  }
}

// ---- paged_attention --------------------------------------------------------------------------------------------

namespace {

// Everything one (sequence, q head) needs.
struct HeadCtx {
  const AttnSpec& spec;
  const AttnArgs& args;
  SeqPages seq;
  int64_t b, h, kvh, Dk, Dv;
  float sk, sv;
  CacheShape vshape;
  ref::HmmaLanes hmma;  // flashinfer prefill: the HMMA steps in lanes (fn null: scalar)

  const uint8_t* krow(int64_t j) const {
    const int64_t bs = spec.cache.block_size;
    return args.k_cache + spec.cache.offset(seq.pages[j / bs], j % bs, kvh);
  }
  const uint8_t* vrow(int64_t j) const {
    const int64_t bs = spec.cache.block_size;
    if (spec.v_from_k) return krow(j);
    return args.v_cache + vshape.offset(seq.pages[j / bs], j % bs, kvh);
  }
  float code(uint8_t c) const { return fp8ref::ref::decode_f32(spec.cache.format, c); }
  // deq_md, with vLLM's f16 detour for f32 md when `f16_quirk`.
  float deq(uint8_t c, float s, bool f16_quirk) const {
    const float x = code(c) * s;
    if (spec.q_format == Format::f32 && f16_quirk) return round_to(Format::f16, x);
    return round_to(spec.q_format, x);
  }
  // Chunked prefill with the chunk's own K/V unquantized: keys j >= ctx come from k_new / v_new (md values).
  bool fresh(int64_t j) const { return spec.chunk_unquantized && j >= seq.seq_len - seq.q_len; }
  float newval(bool is_k, int64_t j, int64_t d) const {
    const int64_t t = seq.q_begin + j - (seq.seq_len - seq.q_len), H = spec.cache.num_kv_heads;
    if (is_k || spec.v_from_k) return load_md(spec.q_format, args.k_new, (t * H + kvh) * Dk + d);
    return load_md(spec.q_format, args.v_new, (t * H + kvh) * Dv + d);
  }
  // Element d of key/value j as the convention sees it: deq_md (cache) or the md value (fresh).
  float kv(bool is_k, int64_t j, int64_t d, bool f16_quirk) const {
    if (fresh(j)) return newval(is_k, j, d);
    return deq((is_k ? krow(j) : vrow(j))[d], is_k ? sk : sv, f16_quirk);
  }
  // The exact value (f64): value(code)·s, or the md value.
  double kv_exact(bool is_k, int64_t j, int64_t d) const {
    if (fresh(j)) return newval(is_k, j, d);
    return fp8ref::ref::value_of(spec.cache.format, (is_k ? krow(j) : vrow(j))[d]) * (is_k ? sk : sv);
  }
  // The visible key range [lo, hi] of query row i (hi < lo: none).
  void visible(int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t ctx = seq.seq_len - seq.q_len;
    const int64_t qpos = spec.causal == Causal::top_left ? i : ctx + i;
    *hi = spec.causal == Causal::none ? seq.seq_len - 1 : std::min(qpos, seq.seq_len - 1);
    *lo = spec.window_left >= 0 ? std::max<int64_t>(0, qpos - spec.window_left) : 0;
  }
};

// dot(a, b): f32, d in order, one fma per step, from +0.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc = std::fma(a[d], b[d], acc);
  return acc;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void row_exact(const HeadCtx& c, const std::vector<float>& q, int64_t lo, int64_t hi, void* out, int64_t oidx,
               double* exact_out) {
  const double sm = c.spec.scale(), cap = c.spec.softcap;
  std::vector<double> l(static_cast<size_t>(std::max<int64_t>(hi - lo + 1, 0)));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = lo; j <= hi; ++j) {
    double acc = 0;
    for (int64_t d = 0; d < c.Dk; ++d) acc += static_cast<double>(q[static_cast<size_t>(d)]) * c.kv_exact(true, j, d);
    double x = sm * acc;
    if (cap > 0) x = cap * std::tanh(x / cap);
    l[static_cast<size_t>(j - lo)] = x;
    m = std::max(m, x);
  }
  double S = 0;
  std::vector<double> o(static_cast<size_t>(c.Dv), 0.0);
  for (int64_t j = lo; j <= hi; ++j) {
    const double p = std::exp(l[static_cast<size_t>(j - lo)] - m);
    S += p;
    for (int64_t d = 0; d < c.Dv; ++d) o[static_cast<size_t>(d)] += p * c.kv_exact(false, j, d);
  }
  for (int64_t d = 0; d < c.Dv; ++d) {
    const double r = hi >= lo ? o[static_cast<size_t>(d)] / S : 0.0;
    if (out) store_out_f64(c.spec.out_format, out, oidx + d, r);
    if (exact_out) exact_out[oidx + d] = r;
  }
}

void row_vllm_paged_v1(const HeadCtx& c, const std::vector<float>& q, int64_t lo, int64_t hi, void* out, int64_t oidx) {
  const float sm = static_cast<float>(c.spec.scale());
  const int64_t n = hi - lo + 1;
  std::vector<float> l(static_cast<size_t>(std::max<int64_t>(n, 0))), kh(static_cast<size_t>(c.Dk));
  float m = kNegInf;
  for (int64_t j = lo; j <= hi; ++j) {
    for (int64_t d = 0; d < c.Dk; ++d) kh[static_cast<size_t>(d)] = c.kv(true, j, d, true);  // 1.
    const float x = sm * dot_f32(q.data(), kh.data(), c.Dk);                                // 2.
    l[static_cast<size_t>(j - lo)] = x;
    m = std::max(m, x);
  }
  float S = 0.0f;
  for (int64_t j = 0; j < n; ++j) {  // 3.
    l[static_cast<size_t>(j)] = exp_sleef(l[static_cast<size_t>(j)] - m);
    S = S + l[static_cast<size_t>(j)];
  }
  const float inv = 1.0f / (S + 1e-6f);
  std::vector<float> acc(static_cast<size_t>(c.Dv), 0.0f);
  for (int64_t j = lo; j <= hi; ++j) {
    const float p = round_to(c.spec.q_format, l[static_cast<size_t>(j - lo)] * inv);  // 4.
    for (int64_t d = 0; d < c.Dv; ++d) acc[static_cast<size_t>(d)] = std::fma(p, c.kv(false, j, d, true), acc[static_cast<size_t>(d)]);  // 5.
  }
  for (int64_t d = 0; d < c.Dv; ++d) store_out(c.spec.out_format, out, oidx + d, acc[static_cast<size_t>(d)]);
}

}  // namespace

// Triton apply_softcap: x·(p1 − p2)/(p1 + p2), p1 = exp(S/x), p2 = exp(−S/x), with tl.exp and Triton's division.
float triton_softcap(float s, float cap) {
  const float t = fp8ref::ref::triton_nv_div(s, cap);
  const float p1 = fp8ref::ref::triton_exp(t), p2 = fp8ref::ref::triton_exp(-t);
  return fp8ref::ref::triton_nv_div(cap * (p1 - p2), p1 + p2);
}

uint8_t triton_fp8_out(float o, float inv) {
  // acc * out_scale; tl.clamp(acc, FP8_MIN, FP8_MAX) (a NaN gives +448, measured); the store's
  // cvt.rn.satfinite.e4m3x2.f32 (RNE; nothing left to saturate; −0 keeps its sign)
  float x = o * inv;
  x = std::isnan(x) ? 448.0f : std::min(std::max(x, -448.0f), 448.0f);
  ConversionSpec cs;
  cs.to = Format::e4m3fn;
  return fp8ref::ref::encode_f64(x, cs);
}

float triton_row_sum(const float* p, int64_t T) {
  const int64_t tiles = T / 8, warps = std::min<int64_t>(4, tiles);
  float w[4];
  for (int64_t wi = 0; wi < warps; ++wi) {
    float lane[4];  // the thread's own columns (q: its pair in each n8 tile), in register order
    for (int64_t q = 0; q < 4; ++q) {
      float acc = 0.0f;
      bool first = true;
      for (int64_t t = wi; t < tiles; t += 4)
        for (int64_t c = 0; c < 2; ++c) {
          const float x = p[8 * t + 2 * q + c];
          acc = first ? x : acc + x;
          first = false;
        }
      lane[q] = acc;
    }
    w[wi] = (lane[0] + lane[2]) + (lane[1] + lane[3]);  // shfl.bfly 2, then 1
  }
  if (warps == 1) return w[0];
  if (warps == 2) return w[0] + w[1];
  return (w[0] + w[2]) + (w[1] + w[3]);  // across the warps through shared memory: bfly 2, then 1
}

namespace {

// The online steps over the tiles of keys [lo, hi] into (M, L, acc).
void triton_online(const HeadCtx& c, const std::vector<float>& q, int64_t lo, int64_t hi, float& M, float& L,
                   float* acc) {
  const float sm = static_cast<float>(c.spec.scale());
  const float cap = static_cast<float>(c.spec.softcap);
  const Format md = c.spec.q_format;
  const bool tc = triton_tensor_cores(md);  // tl.dot on HMMA.16816 (bf16/f16); else f32 FMAs in order
  std::vector<float> kh(static_cast<size_t>(c.Dk)), t(static_cast<size_t>(c.Dv));
  const int64_t T = c.spec.tile_keys();
  std::vector<float> l(static_cast<size_t>(T)), pt(static_cast<size_t>(T)), vd(static_cast<size_t>(T));
  for (int64_t t0 = (lo / T) * T; t0 <= hi; t0 += T) {
    const int64_t a = std::max(lo, t0), e = std::min(hi, t0 + T - 1);
    float mt = M;
    for (int64_t j = a; j <= e; ++j) {
      for (int64_t d = 0; d < c.Dk; ++d) kh[static_cast<size_t>(d)] = c.kv(true, j, d, false);
      float x = sm * (tc ? fp8ref::ref::hmma16_dot_kw4(md, q.data(), kh.data(), c.Dk, 0.0f) : dot_f32(q.data(), kh.data(), c.Dk));
      if (cap > 0) x = triton_softcap(x, cap);
      l[static_cast<size_t>(j - a)] = x;
      mt = std::max(mt, x);
    }
    const float alpha = M == kNegInf ? 0.0f : fp8ref::ref::triton_exp(M - mt);
    for (int64_t d = 0; d < c.Dv; ++d) acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] * alpha;
    std::fill(pt.begin(), pt.end(), 0.0f);  // P over the tile's keys t0 + k (0 where the row sees none)
    for (int64_t j = a; j <= e; ++j) pt[static_cast<size_t>(j - t0)] = fp8ref::ref::triton_exp(l[static_cast<size_t>(j - a)] - mt);
    const float lsum = triton_row_sum(pt.data(), T);  // (f32 P; the dot takes them rounded to md)
    for (int64_t j = a; j <= e; ++j) pt[static_cast<size_t>(j - t0)] = round_to(md, pt[static_cast<size_t>(j - t0)]);
    if (tc) {  // acc = tl.dot(P, V, acc): the tile's slots in the kWidth-4 order, chained through acc
      std::fill(vd.begin(), vd.end(), 0.0f);
      for (int64_t d = 0; d < c.Dv; ++d) {
        for (int64_t j = a; j <= e; ++j) vd[static_cast<size_t>(j - t0)] = c.kv(false, j, d, false);
        acc[static_cast<size_t>(d)] = fp8ref::ref::hmma16_dot_kw4(md, pt.data(), vd.data(), T, acc[static_cast<size_t>(d)]);
      }
    } else {  // (md f32) t = Σ fma from +0, then acc + t
      std::fill(t.begin(), t.end(), 0.0f);
      for (int64_t j = a; j <= e; ++j)
        for (int64_t d = 0; d < c.Dv; ++d)
          t[static_cast<size_t>(d)] = std::fma(pt[static_cast<size_t>(j - t0)], c.kv(false, j, d, false), t[static_cast<size_t>(d)]);
      for (int64_t d = 0; d < c.Dv; ++d) acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] + t[static_cast<size_t>(d)];
    }
    L = std::fma(L, alpha, lsum);  // (L * alpha + l_j: contracted by Triton)
    M = mt;
  }
}

void row_triton_unified(const HeadCtx& c, const std::vector<float>& q, int64_t i, int64_t lo, int64_t hi, void* out,
                        int64_t oidx) {
  const int64_t S = c.spec.segments, Dv = c.Dv;
  std::vector<float> res(static_cast<size_t>(Dv));
  // the state the kernel starts a pass from: M = -inf, L = 1; or M = 0, L = 0 after a first tile it walks in vain
  auto zero = [&](int64_t seg) { return triton_starts_at_zero(c.spec, c.seq.seq_len, c.seq.q_len, i, lo, hi, seg); };
  if (S <= 0) {  // one pass (the 2D kernel)
    const bool z = zero(-1);
    float M = z ? 0.0f : kNegInf, L = z ? 0.0f : 1.0f;
    std::vector<float> acc(static_cast<size_t>(Dv), 0.0f);
    triton_online(c, q, lo, hi, M, L, acc.data());
    for (int64_t d = 0; d < Dv; ++d) res[static_cast<size_t>(d)] = fp8ref::ref::triton_nv_div(acc[static_cast<size_t>(d)], L);
  } else {  // the 3D kernel: segments of tps tiles, then reduce_segments
    const int64_t T = c.spec.tile_keys(), n = c.seq.seq_len;
    const int64_t tps = (n + S * T - 1) / (S * T), act = tps > 0 ? (n + tps * T - 1) / (tps * T) : 0;
    std::vector<float> M(static_cast<size_t>(S), kNegInf), L(static_cast<size_t>(S), 1.0f),
        acc(static_cast<size_t>(S * Dv), 0.0f);
    for (int64_t s = 0; s < act; ++s) {
      if (zero(s)) M[static_cast<size_t>(s)] = L[static_cast<size_t>(s)] = 0.0f;
      triton_online(c, q, std::max(lo, s * tps * T), std::min(hi, (s + 1) * tps * T - 1), M[static_cast<size_t>(s)],
                    L[static_cast<size_t>(s)], acc.data() + s * Dv);
    }
    triton_reduce_segments(M.data(), L.data(), acc.data(), S, act, Dv, res.data());
  }
  if (c.spec.out_scale > 0) {  // vLLM's fused output quantization
    const float inv = 1.0f / static_cast<float>(c.spec.out_scale);
    for (int64_t d = 0; d < Dv; ++d) static_cast<uint8_t*>(out)[oidx + d] = triton_fp8_out(res[static_cast<size_t>(d)], inv);
    return;
  }
  for (int64_t d = 0; d < Dv; ++d) store_out(c.spec.out_format, out, oidx + d, res[static_cast<size_t>(d)]);
}

// FlashInfer's online state (state_t: m, d, o) and its merge(other_o, other_m, other_d = 1) as nvcc compiles it:
// m' = max(m, s); f1 = exp2(max(m − m', −inf)), f2 = exp2(max(s − m', −inf)) (fmaxf: a NaN difference of two −inf
// gives −inf); d = fma(d, f1, f2); o = fma(o, f1, RN32(v·f2)).
struct FiState {
  float m = kNegInf, d = 1.0f;
  std::vector<float> o;
  explicit FiState(int64_t dv) : o(static_cast<size_t>(dv), 0.0f) {}
  void merge(const std::vector<float>& v, float s) {
    auto ex2 = [](float x) { return fp8ref::ref::mufu_ex2(std::isnan(x) ? kNegInf : x); };
    const float mp = m;
    m = std::max(mp, s);
    const float f1 = ex2(mp - m), f2 = ex2(s - m);
    d = std::fma(d, f1, f2);
    for (size_t i = 0; i < o.size(); ++i) o[i] = std::fma(o[i], f1, v[i] * f2);
  }
  // normalize(): o·rcp(d) (0 for d = 0), and the base-2 log-sum-exp m + lg2(d)
  void normalize() {
    const float r = d > 0.0f ? mufu_rcp(d) : 0.0f;
    for (float& x : o) x = x * r;
  }
  float lse() const { return m + static_cast<float>(std::log2(static_cast<double>(d))); }
};

// The flashinfer pass over the row's visible keys [lo, hi] within [a0, a1), tiles of T from a0, into st (m, d, o
// unnormalized; m = −inf, d = 0 where it sees no key).
void flashinfer_pass(const HeadCtx& c, const std::vector<float>& q, int64_t lo, int64_t hi, int64_t a0, int64_t a1,
                     FiState& st) {
  const float c1 = static_cast<float>(c.spec.scale() * static_cast<double>(c.sk));
  const float c2 = c1 * 1.44269504088896340736f;
  const int64_t T = c.spec.tile_keys(), first = std::max(lo, a0), last = std::min(hi, a1 - 1);
  std::vector<float> kf(static_cast<size_t>(c.Dk)), s(static_cast<size_t>(T));
  if (first > last) {  // no visible key: FlashInfer's masked tiles leave m = −inf and scale d to 0
    st.d = 0.0f;
    return;
  }
  for (int64_t t0 = a0 + (first - a0) / T * T; t0 <= last; t0 += T) {
    const int64_t a = std::max(first, t0), e = std::min(last, t0 + T - 1);
    float mt = st.m;
    for (int64_t j = a; j <= e; ++j) {
      const uint8_t* k = c.krow(j);
      for (int64_t d = 0; d < c.Dk; ++d) kf[static_cast<size_t>(d)] = c.code(k[d]);
      s[static_cast<size_t>(j - a)] = dot_f32(q.data(), kf.data(), c.Dk) * c2;
      mt = std::max(mt, s[static_cast<size_t>(j - a)]);
    }
    const float sc = st.m == kNegInf ? 0.0f : fp8ref::ref::mufu_ex2(st.m - mt);
    for (float& x : st.o) x = x * sc;
    st.d = st.d * sc;
    for (int64_t j = a; j <= e; ++j) {
      const float p = fp8ref::ref::mufu_ex2(s[static_cast<size_t>(j - a)] - mt);
      st.d = st.d + p;
      const uint8_t* v = c.vrow(j);
      for (int64_t d = 0; d < c.Dv; ++d) st.o[static_cast<size_t>(d)] = std::fma(p, c.code(v[d]), st.o[static_cast<size_t>(d)]);
    }
    st.m = mt;
  }
}

// A flashinfer row's output from its passes (pass(a, e, st): the keys [a, e) into st, m = −inf, d = 1, o = 0 at the
// start): one pass over [a0, seq_len) normalized (o·rcp(d), 0 where it saw no key), or split-KV chunks of C keys from
// a0, their outputs in the output dtype with their lse merged (flashinfer_merge_chunks); then RN_out and the V scale
// in the output dtype.
template <class Pass>
void flashinfer_row_out(const HeadCtx& c, int64_t a0, int64_t C, void* out, int64_t oidx, Pass pass) {
  const int64_t n = c.seq.seq_len, Dv = c.Dv;
  const Format of = c.spec.out_format;
  FiState res(Dv);
  if (C <= 0 || n - a0 <= C) {
    pass(a0, n, res);
    res.normalize();
  } else {
    const int64_t nc = (n - a0 + C - 1) / C;
    std::vector<float> o(static_cast<size_t>(nc * Dv)), m(static_cast<size_t>(nc)), d(static_cast<size_t>(nc));
    for (int64_t ch = 0; ch < nc; ++ch) {
      FiState st(Dv);
      pass(a0 + ch * C, std::min(n, a0 + ch * C + C), st);
      std::copy(st.o.begin(), st.o.end(), o.begin() + ch * Dv);
      m[static_cast<size_t>(ch)] = st.m;
      d[static_cast<size_t>(ch)] = st.d;
    }
    flashinfer_merge_chunks(o.data(), m.data(), d.data(), nc, Dv, of, res.o.data());
  }
  for (int64_t d = 0; d < Dv; ++d) {
    float r = round_to(of, res.o[static_cast<size_t>(d)]);
    if (c.sv != 1.0f) r = round_to(of, r * c.sv);
    store_out(of, out, oidx + d, r);
  }
}

// -use_fast_math's flush of f32 results below 2^-126, and MUFU.EX2 with a NaN argument (−inf − (−inf)) as −inf.
float ftz(float x) { return std::fabs(x) < 0x1p-126f ? std::copysign(0.0f, x) : x; }
float ex2_ftz(float x) { return fp8ref::ref::mufu_ex2(std::isnan(x) ? kNegInf : x); }

// HmmaLanes::fn's scalar form: ref::hmma16_step per lane, its operands gathered (0 outside [k_lo, k_hi)).
void hmma_lane_steps(Format f, const float* a, int n, int k_lo, int k_hi, const float* b, ptrdiff_t row0,
                     size_t stride, float* c, size_t l0, size_t l1) {
  float ak[16], bk[16];
  for (size_t l = l0; l < l1; ++l) {
    for (int k = 0; k < n; ++k) {
      const bool on = k >= k_lo && k < k_hi;
      ak[k] = on ? a[k] : 0.0f;
      bk[k] = on ? b[(row0 + k) * static_cast<ptrdiff_t>(stride) + static_cast<ptrdiff_t>(l)] : 0.0f;
    }
    c[l] = fp8ref::ref::hmma16_step(f, ak, bk, n, c[l]);
  }
}

// FlashInfer's tensor-core prefill kernel (attention.h, "flashinfer prefill"): the pass of one row over the chunk
// [cs, ce) of its sequence, its visible keys [lo, hi], in nw KV warps of T-key tiles (warp w: tiles from
// cs + (it·nw + w)·T); sets m (scaled by `scale`; −inf: no visible key), d (0 then) and o (unnormalized).
void flashinfer_prefill_pass(const HeadCtx& c, const std::vector<float>& q, int64_t lo, int64_t hi, int64_t cs,
                             int64_t ce, float scale, FiState& res) {
  const Format f = c.spec.q_format;
  const int64_t Dk = c.Dk, Dv = c.Dv;
  int64_t nw = 1;
  const int64_t T = flashinfer_prefill_tile(Dk, c.spec.cta_tile_q, &nw);
  const int64_t first = std::max(lo, cs), last = std::min(hi, ce - 1);
  const auto step = c.hmma.fn ? c.hmma.fn : hmma_lane_steps;
  const int64_t L = c.hmma.fn ? static_cast<int64_t>(c.hmma.lanes) : 16;  // (T, Dv: multiples of 16)
  std::vector<FiState> w(static_cast<size_t>(nw), FiState(Dv));
  // kt: the tile's K codes' values dim-major [Dk][T]; vk: its V key-major [T][Dv] (0 for keys it does not see)
  std::vector<float> kt(static_cast<size_t>(Dk * T)), s(static_cast<size_t>(T)), p(static_cast<size_t>(T)),
      vk(static_cast<size_t>(T * Dv)), ones(16, 1.0f), code(256);
  for (int x = 0; x < 256; ++x) code[static_cast<size_t>(x)] = c.code(static_cast<uint8_t>(x));  // (the codes' values)
  // Tiles without a visible key leave a warp's state as it is (m = −inf: d becomes 0, as every later step keeps it).
  for (int64_t t0 = first > last ? ce : cs + (first - cs) / T * T; t0 <= last; t0 += T) {
    FiState& st = w[static_cast<size_t>(((t0 - cs) / T) % nw)];
    const int64_t a = std::max(first, t0), e = std::min(last, t0 + T - 1);
    float mt = st.m;
    for (int64_t j = 0; j < T; ++j) {
      const uint8_t* k = t0 + j >= a && t0 + j <= e ? c.krow(t0 + j) : nullptr;
      for (int64_t d = 0; d < Dk; ++d) kt[static_cast<size_t>(d * T + j)] = k ? code[k[d]] : 0.0f;
      const uint8_t* v = k ? c.vrow(t0 + j) : nullptr;
      for (int64_t d = 0; d < Dv; ++d) vk[static_cast<size_t>(j * Dv + d)] = v ? code[v[d]] : 0.0f;
    }
    for (int64_t j0 = 0; j0 < T; j0 += L) {  // s: HMMA.16816 steps over dims 16i .. 16i + 15 in order, from C = 0
      std::fill(s.begin() + j0, s.begin() + j0 + L, 0.0f);
      for (int64_t d0 = 0; d0 < Dk; d0 += 16)
        step(f, q.data() + d0, 16, 0, 16, kt.data() + j0, d0, static_cast<size_t>(T), s.data() + j0, 0,
             static_cast<size_t>(L));
    }
    for (int64_t j = 0; j < T; ++j) {
      float& x = s[static_cast<size_t>(j)];
      x = t0 + j >= a && t0 + j <= e ? x : kNegInf;
      mt = std::max(mt, x);
    }
    const float msc = std::max(mt * scale, -std::numeric_limits<float>::max());
    const float osc = st.m == kNegInf ? 0.0f : ex2_ftz((st.m - mt) * scale);
    st.d = ftz(st.d * osc);
    for (float& x : st.o) x = ftz(x * osc);
    for (int64_t j = 0; j < T; ++j)  // p = ex2(fma(s, scale, −m·scale)) rounded to the q dtype (FFMA + MUFU.EX2)
      p[static_cast<size_t>(j)] = round_to(f, ex2_ftz(std::fma(s[static_cast<size_t>(j)], scale, -msc)));
    for (int64_t b = 0; b < T; b += 16) {  // d: the row sum of P on the tensor cores (P·ones), then P·V, 16 keys a step
      st.d = fp8ref::ref::hmma16_step(f, p.data() + b, ones.data(), 16, st.d);
      for (int64_t d0 = 0; d0 < Dv; d0 += L)
        step(f, p.data() + b, 16, 0, 16, vk.data() + d0, b, static_cast<size_t>(Dv), st.o.data() + d0, 0,
             static_cast<size_t>(L));
    }
    st.m = mt;
  }
  for (FiState& st : w) {  // finalize_m: m·scale
    if (st.m == kNegInf) st.d = 0.0f;
    else st.m = st.m * scale;
  }
  if (nw == 1) {
    res = w[0];
    return;
  }
  // threadblock_sync_mdo_states: m = max, d = fma(d, a, RN(d_i·b)) and o = fma(o_i, sc_i, ·) over the warps in order
  float m = kNegInf, d = 1.0f;
  for (const FiState& st : w) {
    const float mp = m;
    m = std::max(m, st.m);
    d = std::fma(d, ex2_ftz(mp - m), st.d * ex2_ftz(st.m - m));
  }
  res.m = m;
  res.d = m == kNegInf ? 0.0f : d;
  for (int64_t k = 0; k < Dv; ++k) {
    float o = 0.0f;
    for (size_t i = 0; i < w.size(); ++i) {
      const float sc = ex2_ftz(w[i].m - m), oi = w[i].o[static_cast<size_t>(k)];
      o = i == 0 ? oi * sc : std::fma(oi, sc, o);
    }
    res.o[static_cast<size_t>(k)] = o;
  }
}

// One row (query i of the sequence, q head h) through the prefill kernel: its chunks from the row's KV start (a
// sliding window moves it by the row's q tile), one pass each, merged as FlashInfer merges split-KV chunks.
void row_flashinfer_prefill(const HeadCtx& c, const std::vector<float>& q, int64_t i, int64_t lo, int64_t hi,
                            void* out, int64_t oidx) {
  const int64_t n = c.seq.seq_len, G = c.spec.num_q_heads / c.spec.cache.num_kv_heads;
  const int64_t qt = (i * G + c.h % G) / c.spec.cta_tile_q;
  const int64_t start =
      c.spec.window_left >= 0 ? std::max<int64_t>(0, n + qt * c.spec.cta_tile_q / G - c.seq.q_len - c.spec.window_left) : 0;
  // sm_scale·k_scale (Python doubles), then ·log2(e) as the kernel's variant does it: in double, rounded to f32
  const float scale = static_cast<float>(c.spec.scale() * static_cast<double>(c.sk) * 1.44269502162933349609375);
  flashinfer_row_out(c, start, c.spec.prefill_kv_chunk, out, oidx, [&](int64_t a, int64_t e, FiState& st) {
    flashinfer_prefill_pass(c, q, lo, hi, a, e, scale, st);
  });
}

void row_flashinfer(const HeadCtx& c, const std::vector<float>& q, int64_t i, int64_t lo, int64_t hi, void* out,
                    int64_t oidx) {
  if (flashinfer_takes_prefill(c.spec, c.seq)) return row_flashinfer_prefill(c, q, i, lo, hi, out, oidx);
  flashinfer_row_out(c, 0, c.spec.kv_chunk, out, oidx,
                     [&](int64_t a, int64_t e, FiState& st) { flashinfer_pass(c, q, lo, hi, a, e, st); });
}

void row_torch_math(const HeadCtx& c, const std::vector<float>& q, int64_t lo, int64_t hi, void* out, int64_t oidx) {
  const float root = static_cast<float>(std::sqrt(c.spec.scale()));
  const int64_t n = c.seq.seq_len;  // the whole row: masked keys get −inf
  std::vector<float> qs(static_cast<size_t>(c.Dk)), kh(static_cast<size_t>(c.Dk)), x(static_cast<size_t>(n));
  for (int64_t d = 0; d < c.Dk; ++d) qs[static_cast<size_t>(d)] = q[static_cast<size_t>(d)] * root;
  float m = kNegInf;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < c.Dk; ++d) kh[static_cast<size_t>(d)] = c.kv(true, j, d, false) * root;
    const float mask = (j >= lo && j <= hi) ? 0.0f : kNegInf;
    x[static_cast<size_t>(j)] = dot_f32(qs.data(), kh.data(), c.Dk) + mask;
    m = std::max(m, x[static_cast<size_t>(j)]);
  }
  // reduce_all(+) over W lanes (ATen vec/functional_base.h).
  const int64_t W = c.spec.torch_lanes;
  for (int64_t j = 0; j < n; ++j) x[static_cast<size_t>(j)] = exp_sleef(x[static_cast<size_t>(j)] - m);
  float S = 0.0f;
  if (n < W) {
    for (int64_t j = 0; j < n; ++j) S = S + x[static_cast<size_t>(j)];
  } else {
    float lane[16];
    for (int64_t r = 0; r < W; ++r) lane[r] = x[static_cast<size_t>(r)];
    for (int64_t j = W; j < n; ++j) lane[j % W] = lane[j % W] + x[static_cast<size_t>(j)];
    for (int64_t w = W / 2; w >= 1; w /= 2)
      for (int64_t r = 0; r < w; ++r) lane[r] = lane[r] + lane[r + w];
    S = lane[0];
  }
  const float inv = 1.0f / S;
  std::vector<float> acc(static_cast<size_t>(c.Dv), 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float p = x[static_cast<size_t>(j)] * inv;
    for (int64_t d = 0; d < c.Dv; ++d) acc[static_cast<size_t>(d)] = std::fma(p, c.kv(false, j, d, false), acc[static_cast<size_t>(d)]);
  }
  for (int64_t d = 0; d < c.Dv; ++d) store_out(c.spec.out_format, out, oidx + d, round_to(c.spec.q_format, acc[static_cast<size_t>(d)]));
}

}  // namespace

void paged_attention_head(const AttnSpec& spec, const AttnArgs& args, int64_t b, int64_t h, double* exact_out,
                          HmmaLanes hmma) {
  const int64_t G = spec.num_q_heads / spec.cache.num_kv_heads;
  HeadCtx c{spec, args, seq_pages(spec, args, b), b, h, h / G, spec.cache.head_dim, spec.dv(), 0, 0, spec.cache, hmma};
  c.vshape.head_dim = c.Dv;
  const int64_t si = scale_index(spec.scale_kind, b, c.kvh);
  c.sk = args.k_scale[si];
  c.sv = spec.v_from_k ? c.sk : args.v_scale[si];
  std::vector<float> q(static_cast<size_t>(c.Dk));
  for (int64_t i = 0; i < c.seq.q_len; ++i) {
    const int64_t row = c.seq.q_begin + i;
    for (int64_t d = 0; d < c.Dk; ++d)
      q[static_cast<size_t>(d)] = load_md(spec.q_format, args.q, (row * spec.num_q_heads + h) * c.Dk + d);
    int64_t lo, hi;
    c.visible(i, &lo, &hi);
    const int64_t oidx = (row * spec.num_q_heads + h) * c.Dv;
    if (exact_out) row_exact(c, q, lo, hi, nullptr, oidx, exact_out);
    if (!args.out) continue;
    switch (spec.convention) {
      case AttnConvention::exact: row_exact(c, q, lo, hi, args.out, oidx, nullptr); break;
      case AttnConvention::vllm_paged_v1: row_vllm_paged_v1(c, q, lo, hi, args.out, oidx); break;
      case AttnConvention::vllm_triton_unified: row_triton_unified(c, q, i, lo, hi, args.out, oidx); break;
      case AttnConvention::flashinfer: row_flashinfer(c, q, i, lo, hi, args.out, oidx); break;
      case AttnConvention::torch_sdpa_math:
      case AttnConvention::spyre: row_torch_math(c, q, lo, hi, args.out, oidx); break;
      case AttnConvention::fast: break;  // refused by paged_attention
    }
  }
}

void paged_attention(const AttnSpec& spec, const AttnArgs& args, double* exact_out) {
  check_paged_attention(spec, args);
  // fast (any order, error-bounded) has no reference, as GemmModel fast: its golden is the exact convention's output
  // with a bound (src/golden/op_attention.cc). exact_out alone (args.out null) is still computed.
  if (spec.convention == AttnConvention::fast && args.out)
    throw InputError("the reference has no fast attention convention (not bit-exact; its golden is exact's with a "
                     "bound); use the cpu backend");
  const AttnSpec rs = resolve_launch(spec, args);
  for (int64_t b = 0; b < args.num_seqs; ++b)
    for (int64_t h = 0; h < rs.num_q_heads; ++h) paged_attention_head(rs, args, b, h, exact_out);
}

void flashinfer_merge_chunks(const float* o, const float* m, const float* d, int64_t nc, int64_t dv,
                             Format out_format, float* out) {
  const int64_t L = 128 / (dv / std::max<int64_t>(8, dv / 32));  // PersistentVariableLengthMergeStatesKernel's bdy
  std::vector<FiState> lane(static_cast<size_t>(L), FiState(dv));
  for (int64_t ch = 0; ch < nc; ++ch) {  // each chunk: OutputTransform in the output dtype, and its lse
    FiState st(dv);
    st.m = m[ch];
    st.d = d[ch];
    std::copy(o + ch * dv, o + ch * dv + dv, st.o.begin());
    st.normalize();  // (m = −inf: o = 0, and lse = −inf as get_lse gives)
    for (float& x : st.o) x = round_to(out_format, x);
    lane[static_cast<size_t>(ch % L)].merge(st.o, st.m == kNegInf ? kNegInf : st.lse());
  }
  FiState res(dv);
  for (FiState& st : lane) {  // threadblock_sync_state: each lane normalized, in the output dtype, with its lse
    st.normalize();
    for (float& x : st.o) x = round_to(out_format, x);
    res.merge(st.o, st.lse());
  }
  res.normalize();
  std::copy(res.o.begin(), res.o.end(), out);
}

float mufu_rcp(float y) {
  const uint32_t b = bits_of(y);
  return std::ldexp(fp8ref::ref::triton_nv_rcp_mantissa(b & 0x7FFFFFu), 127 - static_cast<int>(b >> 23));
}

void triton_reduce_segments(const float* M, const float* L, const float* acc, int64_t S, int64_t act, int64_t dv,
                            float* out) {
  float m = kNegInf;
  for (int64_t s = 0; s < act; ++s) m = std::max(m, M[s]);
  std::vector<float> w(static_cast<size_t>(S), 0.0f);
  for (int64_t s = 0; s < act; ++s) w[static_cast<size_t>(s)] = fp8ref::ref::triton_exp(M[s] - m);
  // overall_expsum = tl.sum(segm_expsum): the [S] vector in its own 1D blocked layout (lane l of every warp holds
  // segment l % S), reduced by one warp's shuffles alone (bfly S/2, ..., 1; no shared memory), so every lane keeps
  // its own sum — and the first add is contracted with the lane's own product: lane l adds
  // fma(L_l, w_l, RN(L_{l^S/2}·w_{l^S/2})), then its half's lanes halving. The lanes l < S/2 mod S and the others
  // differ; dim d's quotient takes the den of the lane that stores it (column lane (d/4) mod td, row 0). (S = 64,
  // two segments a lane: the same formula as the thread's own contracted add, then the lanes.) Measured: vLLM's 3D
  // decode kernel at head dim 32 (tests/data/h200/vllm_unified_attention_d32.npz) has one output that needs this and
  // the contracted lane add below together; which lane's den a dim takes changes no captured output.
  auto Lw = [&](int64_t s) { return s < act ? L[s] : 0.0f; };
  float den_half[2];
  for (int64_t h = 0; h < 2; ++h) {  // S >= 2, a power of two (check_attn_spec)
    std::vector<float> x(static_cast<size_t>(S / 2));
    for (int64_t i = 0; i < S / 2; ++i) {
      const int64_t s = h * (S / 2) + i, o = s ^ (S / 2);
      x[static_cast<size_t>(i)] = std::fma(Lw(s), w[static_cast<size_t>(s)], Lw(o) * w[static_cast<size_t>(o)]);
    }
    for (size_t n = x.size(); n > 1; n /= 2)
      for (size_t i = 0; i < n / 2; ++i) x[i] = x[i] + x[i + n / 2];
    den_half[h] = x[0];
  }
  // tl.sum(segm_output, axis=0) over the [S, Dpad] tile in its blocked layout (4 warps, 4 dims a thread): td threads
  // of a warp along the dims, tr = 32/td along the segments, wd warps along the dims, wr along the segments. Thread
  // (w, l) adds its segments k·tr·wr + w·tr + l in order; then the lanes, then the warps, halving (bfly).
  int64_t dpad = 1;
  while (dpad < dv) dpad *= 2;
  const int64_t td = std::min<int64_t>(32, std::max<int64_t>(dpad / 4, 1)), wd = std::min<int64_t>(4, std::max<int64_t>(dpad / (4 * td), 1));
  const int64_t tr = std::min<int64_t>(32 / td, S), wr = std::min<int64_t>(4 / wd, std::max<int64_t>(S / tr, 1));
  const int64_t per = S / (tr * wr);
  std::vector<float> lanes(static_cast<size_t>(tr)), warps(static_cast<size_t>(wr));
  auto halve = [](std::vector<float>& x, size_t count) {  // x[0, count), count a power of two
    for (size_t n = count; n > 1; n /= 2)
      for (size_t i = 0; i < n / 2; ++i) x[i] = x[i] + x[i + n / 2];
    return x[0];
  };
  // Each thread's terms segm_output·w are contracted into its adds (Triton compiles with fp fusion: LLVM turns
  // fadd(fmul(x, y), z) into fma(x, y, z)): fma(a_s0, w_s0, RN(a_s1·w_s1)), then fma(a_sk, w_sk, ·) for k >= 2 — on
  // vLLM's 3D decode captures this (and not products rounded first, 5 outputs differing) matches every output.
  // One segment a thread (per = 1, head dims <= 32): the lane shuffles' first add instead (below); one a warp (tr =
  // 1): the product alone (through shared memory, not measured).
  const bool lane_fma = per == 1 && tr > 1;
  for (int64_t d = 0; d < dv; ++d) {
    auto a = [&](int64_t s) { return s < act ? acc[s * dv + d] : 0.0f; };
    for (int64_t wi = 0; wi < wr; ++wi) {
      for (int64_t l = 0; l < tr; ++l) {
        const int64_t s0 = wi * tr + l;
        const float w0 = w[static_cast<size_t>(s0)];
        float x = a(s0) * w0;
        if (lane_fma) {  // one segment a thread: the product goes to the shuffles; the first (bfly tr/2) add is
          // contracted: lane l adds fma(a_l, w_l, RN(a_{l^tr/2}·w_{l^tr/2})); the later levels plain. The warp's
          // value is row lane 0's, so lanes[l] for l < tr/2 is the sum of lanes l and l + tr/2.
          if (l >= tr / 2) break;
          const int64_t s1 = s0 + tr / 2;
          x = std::fma(a(s0), w0, a(s1) * w[static_cast<size_t>(s1)]);
        }
        if (per > 1) {
          const int64_t s1 = tr * wr + s0;
          x = std::fma(a(s0), w0, a(s1) * w[static_cast<size_t>(s1)]);
          for (int64_t k = 2; k < per; ++k) {
            const int64_t sk = k * tr * wr + s0;
            x = std::fma(a(sk), w[static_cast<size_t>(sk)], x);
          }
        }
        lanes[static_cast<size_t>(l)] = x;
      }
      warps[static_cast<size_t>(wi)] = halve(lanes, static_cast<size_t>(lane_fma ? tr / 2 : tr));
    }
    const float num = halve(warps, warps.size());
    const int64_t lane = (d / 4) % td;
    const float den = den_half[(lane % S) & (S / 2) ? 1 : 0];
    out[d] = den == 0.0f ? 0.0f : fp8ref::ref::triton_nv_div(num, den);
  }
}

}  // namespace ref
}  // namespace fp8ref::attn
