// Paged attention over an FP8 KV cache (include/fp8ref/attention.h): the exact convention against an independent
// dense attention in long double over the gathered, dequantized cache (within the derived bound); vllm-paged-v1,
// vllm-triton-unified and flashinfer against independent dense re-implementations of their steps (bitwise), written
// from the kernels' steps over the gathered cache (per row: its visible keys, in tiles); every convention's output independent of
// the paging (block sizes 1/16/64, shuffled tables, CSR, HND); cpu == reference bit for bit per convention; the exp
// models' SIMD twins; kv_cache_write per convention against a brute-force nearest-code search; bad input.
// Every cache byte outside the valid slots is a NaN code, so a read outside [0, seq_len) shows as NaN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "fp8ref/mma.h"
#include "fp8ref/mufu_ex2.h"
#include "fp8ref/triton_div.h"
#include "support/attention_cases.h"
#include "support/simd_targets.h"

using namespace fp8ref;
using attn::AttnConvention;
using attn::AttnSpec;
using test::PagedProblem;
using test::kv_args;

namespace {

// Independent FP8 value (OCP OFP8 v1.0 tables), not ref::decode.
long double fp8_value(Format f, uint8_t c) {
  const int s = c >> 7;
  int e, m;
  long double v;
  if (f == Format::e4m3fn) {
    e = (c >> 3) & 15;
    m = c & 7;
    if (e == 15 && m == 7) return NAN;
    v = e == 0 ? std::ldexp(static_cast<long double>(m), -9) : std::ldexp(static_cast<long double>(8 + m), e - 10);
  } else {
    e = (c >> 2) & 31;
    m = c & 3;
    if (e == 31) return m ? NAN : INFINITY;
    v = e == 0 ? std::ldexp(static_cast<long double>(m), -16) : std::ldexp(static_cast<long double>(4 + m), e - 17);
  }
  return s ? -v : v;
}

double md_value(Format f, const std::vector<uint8_t>& q, size_t i) {
  return test::out_value(f, q.data() + i * static_cast<size_t>(format_info(f).bits / 8));
}

double ulp_of(Format f, double x) {
  const int man = f == Format::f32 ? 23 : f == Format::bf16 ? 7 : 10;
  const int emin = f == Format::f16 ? -14 : -126;
  int e = x == 0 ? emin : std::ilogb(x);
  if (e < emin) e = emin;
  return std::ldexp(1.0, e - man);
}

// The visible keys of query i of sequence b (its own formula).
bool visible(const AttnSpec& s, int64_t seq_len, int64_t q_len, int64_t i, int64_t j) {
  const int64_t qpos = s.causal == attn::Causal::top_left ? i : seq_len - q_len + i;
  if (s.causal != attn::Causal::none && j > qpos) return false;
  if (s.window_left >= 0 && j < qpos - s.window_left) return false;
  return j < seq_len;
}

int64_t kv_scale_index(const AttnSpec& s, int64_t b, int64_t kvh) {
  return s.scale_kind == attn::KvScaleKind::tensor ? 0 : s.scale_kind == attn::KvScaleKind::head ? kvh : b;
}

// Dense exact attention over the gathered cache in long double; checks p.out within the derived bound.
void check_exact(PagedProblem& p) {
  const AttnSpec& s = p.spec;
  const int64_t H = s.cache.num_kv_heads, Dk = s.cache.head_dim, Dv = s.dv(), G = s.num_q_heads / H;
  const Format f = s.cache.format;
  int bad = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < p.q_lens[b]; ++i)
      for (int64_t h = 0; h < s.num_q_heads; ++h) {
        const int64_t kvh = h / G, row = p.qsl[b] + i, si = kv_scale_index(s, b, kvh);
        const long double sk = p.ks[si], sv = s.v_from_k ? p.ks[si] : p.vs[si];
        std::vector<long double> l;
        std::vector<int64_t> js;
        double max_qk = 0, max_v = 0;
        for (int64_t j = 0; j < p.seq_lens[b]; ++j) {
          if (!visible(s, p.seq_lens[b], p.q_lens[b], i, j)) continue;
          long double acc = 0, absacc = 0;
          const bool fresh = s.chunk_unquantized && j >= p.seq_lens[b] - p.q_lens[b];
          const int64_t tn = p.qsl[b] + j - (p.seq_lens[b] - p.q_lens[b]);
          for (int64_t d = 0; d < Dk; ++d) {
            const long double kval = fresh ? md_value(s.q_format, p.knew, static_cast<size_t>((tn * H + kvh) * Dk + d))
                                           : fp8_value(f, p.kd[b][(j * H + kvh) * Dk + d]) * sk;
            const long double t = md_value(s.q_format, p.q, static_cast<size_t>((row * s.num_q_heads + h) * Dk + d)) * kval;
            acc += t;
            absacc += std::fabs(t);
          }
          long double x = s.scale() * acc;
          if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
          l.push_back(x);
          js.push_back(j);
          max_qk = std::max(max_qk, static_cast<double>(absacc));
        }
        long double m = -INFINITY, S = 0;
        for (long double x : l) m = std::max(m, x);
        std::vector<long double> o(static_cast<size_t>(Dv), 0);
        for (size_t n = 0; n < l.size(); ++n) {
          const long double w = std::exp(l[n] - m);
          S += w;
          const bool fresh = s.chunk_unquantized && js[n] >= p.seq_lens[b] - p.q_lens[b];
          const int64_t tn = p.qsl[b] + js[n] - (p.seq_lens[b] - p.q_lens[b]);
          for (int64_t d = 0; d < Dv; ++d) {
            const uint8_t c = s.v_from_k ? p.kd[b][(js[n] * H + kvh) * Dk + d] : p.vd[b][(js[n] * H + kvh) * Dv + d];
            const long double v =
                !fresh ? fp8_value(f, c) * sv
                       : s.v_from_k ? md_value(s.q_format, p.knew, static_cast<size_t>((tn * H + kvh) * Dk + d))
                                    : md_value(s.q_format, p.vnew, static_cast<size_t>((tn * H + kvh) * Dv + d));
            o[static_cast<size_t>(d)] += w * v;
            max_v = std::max(max_v, static_cast<double>(std::fabs(v)));
          }
        }
        const double B = attn::bound_exact_f64(Dk, static_cast<int64_t>(l.size()), s.scale(), max_qk, max_v, s.softcap);
        for (int64_t d = 0; d < Dv; ++d) {
          const double want = static_cast<double>(o[static_cast<size_t>(d)] / S);
          const double got = test::out_value(s.out_format, &p.out[static_cast<size_t>((row * s.num_q_heads + h) * Dv + d) * p.out_elem()]);
          const double tol = B + 0.5 * ulp_of(s.out_format, std::fabs(want));
          if (!(std::fabs(got - want) <= tol) && bad++ < 5)
            MESSAGE("b " << b << " i " << i << " h " << h << " d " << d << ": got " << got << " want " << want << " tol " << tol);
        }
      }
  CHECK(bad == 0);
}

// RN_t(x) for an f32 x (t = f32: x itself).
float round_to(Format t, float x) {
  if (t == Format::f32) return x;
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b = static_cast<uint32_t>(ref::narrow(t, ref::narrow(Format::f32, b, t), Format::f32));
  std::memcpy(&x, &b, 4);
  return x;
}

// Compares output element (row, h, d) of p with RN_out(want); counts and reports a difference.
void expect_out(const PagedProblem& p, int64_t row, int64_t h, int64_t d, float want, int* bad, bool say = true) {
  const AttnSpec& s = p.spec;
  uint8_t buf[8] = {};
  uint32_t wb;
  std::memcpy(&wb, &want, 4);
  const uint64_t o = ref::narrow(Format::f32, wb, s.out_format);
  std::memcpy(buf, &o, sizeof buf);
  const size_t e = p.out_elem();
  const uint8_t* got = &p.out[static_cast<size_t>((row * s.num_q_heads + h) * s.dv()) * e + static_cast<size_t>(d) * e];
  if (std::memcmp(got, buf, e) != 0 && (*bad)++ < 5 && say)
    MESSAGE("row " << row << " h " << h << " d " << d << ": " << test::out_value(s.out_format, got) << " vs "
                   << test::out_value(s.out_format, buf));
}

// The visible keys of every query row, for the dense re-implementations below: fn(b, row, h, kvh, scale index, js).
template <class Fn>
void for_each_row(const PagedProblem& p, Fn fn) {
  const AttnSpec& s = p.spec;
  const int64_t G = s.num_q_heads / s.cache.num_kv_heads;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < p.q_lens[b]; ++i)
      for (int64_t h = 0; h < s.num_q_heads; ++h) {
        std::vector<int64_t> js;
        for (int64_t j = 0; j < p.seq_lens[b]; ++j)
          if (visible(s, p.seq_lens[b], p.q_lens[b], i, j)) js.push_back(j);
        fn(b, p.qsl[b] + i, h, h / G, kv_scale_index(s, b, h / G), js);
      }
}

// f32 values of query row (row, h) and of cache codes.
float q_val(const PagedProblem& p, int64_t row, int64_t h, int64_t d) {
  const int64_t i = (row * p.spec.num_q_heads + h) * p.spec.cache.head_dim + d;
  return static_cast<float>(md_value(p.spec.q_format, p.q, static_cast<size_t>(i)));
}
float k_code(const PagedProblem& p, int64_t b, int64_t j, int64_t kvh, int64_t d) {
  const int64_t i = (j * p.spec.cache.num_kv_heads + kvh) * p.spec.cache.head_dim + d;
  return static_cast<float>(fp8_value(p.spec.cache.format, p.kd[static_cast<size_t>(b)][static_cast<size_t>(i)]));
}
float v_code(const PagedProblem& p, int64_t b, int64_t j, int64_t kvh, int64_t d) {
  if (p.spec.v_from_k) return k_code(p, b, j, kvh, d);  // MLA: V is the first Dv dims of K
  const int64_t i = (j * p.spec.cache.num_kv_heads + kvh) * p.spec.dv() + d;
  return static_cast<float>(fp8_value(p.spec.cache.format, p.vd[static_cast<size_t>(b)][static_cast<size_t>(i)]));
}
float v_scale(const PagedProblem& p, int64_t si) {
  return p.spec.v_from_k ? p.ks[static_cast<size_t>(si)] : p.vs[static_cast<size_t>(si)];
}

// vllm-paged-v1, re-implemented densely from the steps in attention.h (gather first, then the formula).
void check_paged_v1(PagedProblem& p) {
  const AttnSpec& s = p.spec;
  const int64_t Dk = s.cache.head_dim, Dv = s.dv();
  // deq_md; for md f32 through f16 (the scaled_convert quirk)
  const Format dq = s.q_format == Format::f32 ? Format::f16 : s.q_format;
  int bad = 0;
  for_each_row(p, [&](int64_t b, int64_t row, int64_t h, int64_t kvh, int64_t si, const std::vector<int64_t>& js) {
    std::vector<float> l;
    for (int64_t j : js) {
      float acc = 0;
      for (int64_t d = 0; d < Dk; ++d) acc = std::fma(q_val(p, row, h, d), round_to(dq, k_code(p, b, j, kvh, d) * p.ks[si]), acc);
      l.push_back(static_cast<float>(s.scale()) * acc);
    }
    float m = -INFINITY, S = 0;
    for (float x : l) m = std::max(m, x);
    for (float& x : l) {
      x = attn::ref::exp_sleef(x - m);
      S += x;
    }
    const float inv = 1.0f / (S + 1e-6f);
    for (int64_t d = 0; d < Dv; ++d) {
      float acc = 0;
      for (size_t n = 0; n < l.size(); ++n)
        acc = std::fma(round_to(s.q_format, l[n] * inv), round_to(dq, v_code(p, b, js[n], kvh, d) * p.vs[si]), acc);
      expect_out(p, row, h, d, acc, &bad);
    }
  });
  CHECK(bad == 0);
}

// tl.dot(a, b, c) of vLLM's kernels (operands converted from fp8: Triton's kWidth-4 layout) as mma.sync steps
// (ref::hmma16_step): up to 16 k one step; else each 32 k (zero-padded) as the k with bit 1 clear, then set.
float kw4_dot(Format f, const std::vector<float>& a, const std::vector<float>& b, float c) {
  const size_t n = a.size();
  if (n <= 16) return ref::hmma16_step(f, a.data(), b.data(), static_cast<int>(n), c);
  for (size_t b0 = 0; b0 < n; b0 += 32)
    for (size_t bit = 0; bit < 2; ++bit) {
      float x[16], y[16];
      int m = 0;
      for (size_t k = b0; k < b0 + 32; ++k)
        if (((k >> 1) & 1) == bit) {
          x[m] = k < n ? a[k] : 0.0f;
          y[m++] = k < n ? b[k] : 0.0f;
        }
      c = ref::hmma16_step(f, x, y, 16, c);
    }
  return c;
}

// Triton's tl.sum(x, axis=1) of one row of a [16, T] f32 tile in the MMAv2 layout of 4 warps (measured for T = 16,
// 32: tests/data/h200/triton_rowsum.npz, tools/device/capture_triton_rowsum.py): the owner of slot k is warp
// (k / 8) % 4, lane q = (k % 8) / 2; each thread adds its slots in increasing k, then the lanes q, q ^ 2 and q, q ^ 1,
// then the warps likewise.
float mma_row_sum(const std::vector<float>& x) {
  const size_t T = x.size(), nw = std::min<size_t>(4, T / 8);
  float own[16] = {};
  bool has[16] = {};
  for (size_t k = 0; k < T; ++k) {
    const size_t o = (k / 8) % 4 * 4 + (k % 8) / 2;
    own[o] = has[o] ? own[o] + x[k] : x[k];
    has[o] = true;
  }
  auto pair = [](const float* v) { return (v[0] + v[2]) + (v[1] + v[3]); };
  float w[4];
  for (size_t i = 0; i < nw; ++i) w[i] = pair(&own[4 * i]);
  return nw == 1 ? w[0] : nw == 2 ? w[0] + w[1] : pair(w);
}

// Triton's tl.sum(o, axis=0) of reduce_segments' [S, Dpad] tile (Dpad = Dv rounded up to a power of two) in its
// blocked layout (4 dims a thread; tests/data/h200/triton_segsum.npz): thread lanes along the dims min(32, Dpad/4),
// the other lanes of a warp along the segments, then warps along the dims first; each thread adds its segments' terms
// a·w in order (contracted), then the lanes and the warps along the segments pairwise, halving.
float blocked_axis0_sum(const std::vector<float>& a, const std::vector<float>& w, int64_t dv) {
  int64_t dpad = 1;
  while (dpad < dv) dpad *= 2;
  const int64_t S = static_cast<int64_t>(a.size());
  const int64_t lanes_d = std::min<int64_t>(32, std::max<int64_t>(1, dpad / 4));
  const int64_t warps_d = std::min<int64_t>(4, std::max<int64_t>(1, dpad / (4 * lanes_d)));
  const int64_t lanes_s = std::min<int64_t>(32 / lanes_d, S);
  const int64_t warps_s = std::min<int64_t>(4 / warps_d, std::max<int64_t>(1, S / lanes_s));
  // segment sg goes to thread (warp, lane) = ((sg / lanes_s) % warps_s, sg % lanes_s); each thread's terms a·w in
  // segment order, contracted as Triton's fp fusion builds them: one term RN(a·w); more: fma(a0, w0, RN(a1·w1)),
  // then fma(ak, wk, ·)
  std::vector<std::vector<int64_t>> mine(static_cast<size_t>(lanes_s * warps_s));
  for (int64_t sg = 0; sg < S; ++sg) mine[static_cast<size_t>((sg / lanes_s) % warps_s * lanes_s + sg % lanes_s)].push_back(sg);
  // One segment a thread (Dpad <= 32): the product goes straight to the shuffles and the first one (lane l with lane
  // l ^ lanes_s/2) is the contracted add, fma(a_l, w_l, RN(a_{l^lanes_s/2}·w_{l^lanes_s/2})) on lane l; the warp's
  // sum is lane 0's, the lanes l < lanes_s/2 halving.
  const bool one = mine[0].size() == 1 && lanes_s > 1;
  std::vector<float> part(mine.size(), 0.0f);
  for (size_t o = 0; o < mine.size(); ++o) {
    const auto& t = mine[o];
    auto at = [&](size_t i) { return a[static_cast<size_t>(t[i])]; };
    auto wt = [&](size_t i) { return w[static_cast<size_t>(t[i])]; };
    if (t.size() == 1) part[o] = at(0) * wt(0);
    if (t.size() >= 2) part[o] = std::fma(at(0), wt(0), at(1) * wt(1));
    for (size_t i = 2; i < t.size(); ++i) part[o] = std::fma(at(i), wt(i), part[o]);
  }
  auto halve = [](std::vector<float> x) {
    for (size_t n = x.size(); n > 1; n /= 2)
      for (size_t i = 0; i < n / 2; ++i) x[i] = x[i] + x[i + n / 2];
    return x[0];
  };
  std::vector<float> warp(static_cast<size_t>(warps_s));
  for (int64_t wi = 0; wi < warps_s; ++wi) {
    std::vector<float> lane(part.begin() + wi * lanes_s, part.begin() + (wi + 1) * lanes_s);
    if (one) {
      lane.resize(static_cast<size_t>(lanes_s / 2));
      for (int64_t l = 0; l < lanes_s / 2; ++l) {
        const size_t s0 = static_cast<size_t>(mine[static_cast<size_t>(wi * lanes_s + l)][0]);
        const size_t s1 = static_cast<size_t>(mine[static_cast<size_t>(wi * lanes_s + l + lanes_s / 2)][0]);
        lane[static_cast<size_t>(l)] = std::fma(a[s0], w[s0], a[s1] * w[s1]);
      }
    }
    warp[static_cast<size_t>(wi)] = halve(lane);
  }
  return halve(warp);
}

// Triton's tl.sum(segm_expsum) of reduce_segments' [S] vector (lane l of each warp holds segment l % S; one warp's
// shuffles bfly S/2, ..., 1 and no shared memory, so each lane keeps its own sum), as the lane that stores dim d sees
// it (lane (d/4) % min(32, Dpad/4)): the first shuffle's add contracted, fma(L_l, w_l, RN(L_{l^S/2}·w_{l^S/2})), then
// the lanes of that half, halving.
float segment_expsum(const std::vector<float>& L, const std::vector<float>& w, int64_t dv, int64_t d) {
  int64_t dpad = 1;
  while (dpad < dv) dpad *= 2;
  const size_t S = L.size(), h = S / 2;
  const size_t lane = static_cast<size_t>((d / 4) % std::min<int64_t>(32, std::max<int64_t>(1, dpad / 4))) % S;
  const size_t base = lane & h;
  std::vector<float> x(h);
  for (size_t i = 0; i < h; ++i) x[i] = std::fma(L[base + i], w[base + i], L[(base + i) ^ h] * w[(base + i) ^ h]);
  for (size_t n = h; n > 1; n /= 2)
    for (size_t i = 0; i < n / 2; ++i) x[i] = x[i] + x[i + n / 2];
  return x[0];
}

// vllm-triton-unified, re-implemented densely from vLLM's kernel_unified_attention_2d as attention.h states it
// (pac b.3): deq_md K/V, S = RN32(sm)·dot, Triton's soft-cap formula, online softmax over T-key tiles from M = −inf,
// L = 1, acc = 0; unnormalized P rounded to md before P·V; acc / L at the end.
// The tiles are the ones vLLM's programs walk, each step as the kernel writes it (masked logits −inf; m_j =
// max(M, max S), then where(m_j > −inf, m_j, 0); P = exp(S − m_j), 0 for a masked key; α = exp(M − m_j)): one
// program per q block of BLOCK_Q query rows (BLOCK_M = 16 or the power of two >= G rows), tiles up to the block's
// longest prefix cdiv(min(ctx + qlo + (BLOCK_M − 1) // G + 1, seq_len), T); with a sliding window the 2D kernel starts
// at the tile of the block's first allowed key ctx + qlo − window_left and ends after that of its last query.
// With segments (vLLM's 3D decode kernel, pac b.3.3): segment s walks tiles [s·tps, (s+1)·tps) (tps = cdiv(seq_len,
// S·T); none past the sequence), each from M = −inf, L = 1, acc = 0, merged as reduce_segments: w_s = exp(M_s − max M),
// Σ L_s·w_s in Triton's butterfly order (slot i with slot i + n/2, n halving) and Σ acc_s·w_s in its blocked layout
// (blocked_axis0_sum: the products contracted into each thread's adds), the quotient (0 for a
// zero denominator). Segments −1: vLLM's choice per batch (3D with 16 segments for a decode-only batch of at most 128
// query blocks × KV heads). guard = false drops the where(m_j > −inf, m_j, 0) step (as if M stayed −inf: a mutant
// the guard tests must tell apart). Returns the number of outputs that differ from p.out.
int check_triton_unified(PagedProblem& p, bool guard = true) {
  const AttnSpec& s = p.spec;
  const int64_t Dk = s.cache.head_dim, Dv = s.dv(), Hkv = s.cache.num_kv_heads, G = s.num_q_heads / Hkv;
  const float sm = static_cast<float>(s.scale()), cap = static_cast<float>(s.softcap);
  const int64_t block_m = G <= 16 ? 16 : int64_t{1} << static_cast<int>(std::ceil(std::log2(static_cast<double>(G))));
  const int64_t block_q = block_m / G;
  int64_t S = s.segments;
  if (S < 0) {
    const int64_t max_q = *std::max_element(p.q_lens.begin(), p.q_lens.end());
    S = max_q <= 1 && (p.T / block_q + p.B) * Hkv <= 128 ? 16 : 0;
  }
  const int64_t T = s.tile > 0 ? s.tile : S > 0 ? 16 : 32;
  const bool tc = s.q_format != Format::f32;  // bf16/f16: the dots on the tensor cores (f32: FMAs in order)
  int bad = 0;
  for_each_row(p, [&](int64_t b, int64_t row, int64_t h, int64_t kvh, int64_t si, const std::vector<int64_t>& all) {
    const int64_t n = p.seq_lens[b], tps = S > 0 ? (n + S * T - 1) / (S * T) : 0;
    const int64_t nseg = S > 0 ? (n + tps * T - 1) / (tps * T) : 1;
    // the program's q block and the tiles it walks
    const int64_t i = row - p.qsl[b], qlo = i / block_q * block_q, qhi = std::min(qlo + (block_m - 1) / G, p.q_lens[b] - 1);
    const int64_t ctx = s.causal == attn::Causal::top_left ? 0 : n - p.q_lens[b];
    const int64_t prefix = s.causal == attn::Causal::none ? n : std::min(ctx + qlo + (block_m - 1) / G + 1, n);
    const int64_t num_tiles = (prefix + T - 1) / T;
    std::vector<float> segM, segL;
    std::vector<std::vector<float>> segAcc;
    for (int64_t sg = 0; sg < nseg; ++sg) {
    int64_t t_begin = S > 0 ? sg * tps : 0, t_end = S > 0 ? std::min((sg + 1) * tps, num_tiles) : num_tiles;
    if (S == 0 && s.window_left >= 0) {
      const int64_t first = ctx + qlo - s.window_left, last = ctx + qhi;
      t_begin = std::max<int64_t>(0, first / T);  // (C division: a negative first gives 0 either way)
      t_end = std::min(last / T + 1, num_tiles);
    }
    float M = -INFINITY, L = 1.0f;
    std::vector<float> acc(static_cast<size_t>(Dv), 0.0f);
    for (int64_t t = t_begin; t < t_end; ++t) {
      std::vector<int64_t> tile;  // the tile's visible keys (the rest: S = −inf, P = 0)
      for (int64_t j : all)
        if (j / T == t) tile.push_back(j);
      std::vector<float> S;
      for (int64_t j : tile) {
        float dot = 0;
        if (tc) {  // tl.dot on HMMA.16816: the head dim in the kWidth-4 order, from +0
          std::vector<float> qv, kv;
          for (int64_t d = 0; d < Dk; ++d) {
            qv.push_back(q_val(p, row, h, d));
            kv.push_back(round_to(s.q_format, k_code(p, b, j, kvh, d) * p.ks[si]));
          }
          dot = kw4_dot(s.q_format, qv, kv, 0.0f);
        } else {
          for (int64_t d = 0; d < Dk; ++d) dot = std::fma(q_val(p, row, h, d), round_to(s.q_format, k_code(p, b, j, kvh, d) * p.ks[si]), dot);
        }
        float x = sm * dot;
        if (cap > 0) {  // apply_softcap: x·(p1 − p2)/(p1 + p2), p1 = exp(x/cap), p2 = exp(−x/cap); Triton's / and exp
          const float z = ref::triton_nv_div(x, cap), p1 = ref::triton_exp(z), p2 = ref::triton_exp(-z);
          x = ref::triton_nv_div(cap * (p1 - p2), p1 + p2);
        }
        S.push_back(x);
      }
      float mj = M;
      for (float x : S) mj = std::max(mj, x);
      if (!(mj > -INFINITY) && guard) mj = 0.0f;  // where(m_j > -inf, m_j, 0)
      if (mj == -INFINITY) continue;             // (the mutant: nothing seen yet, the state stays)
      const float alpha = ref::triton_exp(M - mj);
      std::vector<float> P, slots(static_cast<size_t>(T), 0.0f);  // P by the key's slot in the tile
      for (size_t n = 0; n < tile.size(); ++n) {
        P.push_back(ref::triton_exp(S[n] - mj));
        slots[static_cast<size_t>(tile[n] - t * T)] = P.back();
      }
      const float lj = mma_row_sum(slots);
      std::vector<float> pv(static_cast<size_t>(T), 0.0f), vv(static_cast<size_t>(T), 0.0f);
      for (int64_t d = 0; d < Dv; ++d) {
        if (tc) {  // acc = tl.dot(P, V, acc·α): the tile's slots in the kWidth-4 order, chained through acc
          for (size_t n = 0; n < tile.size(); ++n) {
            const size_t k = static_cast<size_t>(tile[n] - t * T);
            pv[k] = round_to(s.q_format, P[n]);
            vv[k] = round_to(s.q_format, v_code(p, b, tile[n], kvh, d) * v_scale(p, si));
          }
          acc[static_cast<size_t>(d)] = kw4_dot(s.q_format, pv, vv, acc[static_cast<size_t>(d)] * alpha);
        } else {
          float t = 0;
          for (size_t n = 0; n < tile.size(); ++n)
            t = std::fma(round_to(s.q_format, P[n]), round_to(s.q_format, v_code(p, b, tile[n], kvh, d) * v_scale(p, si)), t);
          acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] * alpha + t;
        }
      }
      L = std::fma(L, alpha, lj);
      M = mj;
    }
    segM.push_back(M);
    segL.push_back(L);
    segAcc.push_back(acc);
    }
    if (S == 0) {
      for (int64_t d = 0; d < Dv; ++d) expect_out(p, row, h, d, ref::triton_nv_div(segAcc[0][static_cast<size_t>(d)], segL[0]), &bad, guard);
      return;
    }
    float mx = -INFINITY;
    for (float m : segM) mx = std::max(mx, m);
    std::vector<float> w;
    for (size_t sg = 0; sg < segM.size(); ++sg) w.push_back(ref::triton_exp(segM[sg] - mx));
    std::vector<float> ws = w, Ls = segL;
    ws.resize(static_cast<size_t>(S), 0.0f);
    Ls.resize(static_cast<size_t>(S), 0.0f);
    for (int64_t d = 0; d < Dv; ++d) {
      std::vector<float> acc_d;
      for (size_t sg = 0; sg < segM.size(); ++sg) acc_d.push_back(segAcc[sg][static_cast<size_t>(d)]);
      acc_d.resize(static_cast<size_t>(S), 0.0f);
      const float num = blocked_axis0_sum(acc_d, ws, Dv);
      const float den = segment_expsum(Ls, ws, Dv, d);
      expect_out(p, row, h, d, den == 0.0f ? 0.0f : ref::triton_nv_div(num, den), &bad, guard);
    }
  });
  return bad;
}

// FlashInfer's online state and its split-KV merge (shared by the two dense checks below).
struct FiSt {
  float m = -INFINITY, d = 1.0f;
  std::vector<float> o;
};
float fi_ex2(float x) { return ref::mufu_ex2(std::isnan(x) ? -INFINITY : x); }
void fi_merge(FiSt& st, const std::vector<float>& v, float sc) {
  const float mp = st.m;
  st.m = std::max(mp, sc);
  const float f1 = fi_ex2(mp - st.m), f2 = fi_ex2(sc - st.m);
  st.d = std::fma(st.d, f1, f2);
  for (size_t i = 0; i < st.o.size(); ++i) st.o[i] = std::fma(st.o[i], f1, v[i] * f2);
}
std::vector<float> fi_out_of(const FiSt& st, Format of) {  // o·rcp(d), 0 for d = 0, in the output dtype
  std::vector<float> v(st.o.size());
  const float r = st.d > 0 ? attn::ref::mufu_rcp(st.d) : 0.0f;
  for (size_t i = 0; i < v.size(); ++i) v[i] = round_to(of, st.o[i] * r);
  return v;
}
float fi_lse(const FiSt& st) { return st.m + static_cast<float>(std::log2(static_cast<double>(st.d))); }
// The chunks' states (in order) -> the row's output before the V scale: one chunk normalized; several merged in
// L = 128 / (Dv / max(8, Dv/32)) lanes (chunk c to lane c % L), then the lanes in order.
std::vector<float> fi_chunks_out(const std::vector<FiSt>& chunk, int64_t Dv, Format of) {
  if (chunk.size() == 1) return fi_out_of(chunk[0], of);
  const int64_t L = 128 / (Dv / std::max<int64_t>(8, Dv / 32));
  std::vector<FiSt> lane(static_cast<size_t>(L));
  for (FiSt& st : lane) st.o.assign(static_cast<size_t>(Dv), 0.0f);
  for (size_t c = 0; c < chunk.size(); ++c)
    fi_merge(lane[c % static_cast<size_t>(L)], fi_out_of(chunk[c], of), chunk[c].m == -INFINITY ? -INFINITY : fi_lse(chunk[c]));
  FiSt all;
  all.o.assign(static_cast<size_t>(Dv), 0.0f);
  for (const FiSt& st : lane) fi_merge(all, fi_out_of(st, of), fi_lse(st));
  return fi_out_of(all, of);
}

// flashinfer, re-implemented densely from FlashInfer's decode kernel as attention.h states it (pac b.4): the K
// scale folded into the softmax scale (sm·sk in double, then ·log2 e in f32), raw codes in the dot, base-2 online
// softmax over T-key tiles from m = −inf, d = 1, o = 0 with f32 probabilities and the GPU's exp2 (MUFU.EX2,
// ref::mufu_ex2); o·rcp(d) (OutputTransform, rcp the GPU's MUFU.RCP) rounded to the output dtype, then ·sv in the
// output dtype.
// Split-KV (kv_chunk C > 0, or FlashInfer's plan for −1, and a sequence longer than C): every chunk of C keys is such a
// pass (tiles from the chunk's start; m = −inf, d = 0, o = 0 where it sees no key), its o·rcp(d) rounded to the output
// dtype and its lse = m + log2(d) (−inf without a key); PersistentVariableLengthMergeStatesKernel merges them in
// L = 128 / (Dv / max(8, Dv/32)) lanes (chunk c to lane c % L, in order) with state_t::merge(v, s, 1) — m' = max(m,
// s), f1 = exp2(m − m'), f2 = exp2(s − m') (a NaN difference counts −inf), d = fma(d, f1, f2), o = fma(o, f1, v·f2) —
// then normalizes each lane (o·rcp(d), d > 0), rounds it to the output dtype, and merges the lanes in order the same
// way (threadblock_sync_state) before the last o·rcp(d).
void check_flashinfer(PagedProblem& p) {
  const AttnSpec& s = p.spec;
  const int64_t Dk = s.cache.head_dim, Dv = s.dv(), T = s.tile_keys();
  const int64_t C = s.kv_chunk >= 0 ? s.kv_chunk : attn::flashinfer_plan_chunk(s, p.args());
  int bad = 0;
  for_each_row(p, [&](int64_t b, int64_t row, int64_t h, int64_t kvh, int64_t si, const std::vector<int64_t>& js) {
    const float c2 = static_cast<float>(s.scale() * static_cast<double>(p.ks[si])) * static_cast<float>(M_LOG2E);
    const int64_t n = p.seq_lens[b], cs = C > 0 && n > C ? C : std::max<int64_t>(n, 1), nc = (n + cs - 1) / cs;
    std::vector<FiSt> chunk(static_cast<size_t>(std::max<int64_t>(nc, 1)));
    for (int64_t c = 0; c < static_cast<int64_t>(chunk.size()); ++c) {
      FiSt& st = chunk[static_cast<size_t>(c)];
      st.o.assign(static_cast<size_t>(Dv), 0.0f);
      std::vector<std::vector<int64_t>> tiles;  // the chunk's visible keys by tile, tiles from the chunk's start
      for (int64_t j : js)
        if (j / cs == c) {
          if (tiles.empty() || (tiles.back().front() - c * cs) / T != (j - c * cs) / T) tiles.emplace_back();
          tiles.back().push_back(j);
        }
      if (tiles.empty()) st.d = 0.0f;  // (every tile masked: d scaled to 0, m stays −inf)
      for (const std::vector<int64_t>& tile : tiles) {
        std::vector<float> S;
        float mj = st.m;
        for (int64_t j : tile) {
          float dot = 0;
          for (int64_t d = 0; d < Dk; ++d) dot = std::fma(q_val(p, row, h, d), k_code(p, b, j, kvh, d), dot);
          S.push_back(dot * c2);
          mj = std::max(mj, S.back());
        }
        const float a = ref::mufu_ex2(st.m - mj);
        for (float& x : st.o) x *= a;
        st.d *= a;
        for (size_t k = 0; k < tile.size(); ++k) {
          const float pj = ref::mufu_ex2(S[k] - mj);
          st.d += pj;
          for (int64_t d = 0; d < Dv; ++d) st.o[static_cast<size_t>(d)] = std::fma(pj, v_code(p, b, tile[k], kvh, d), st.o[static_cast<size_t>(d)]);
        }
        st.m = mj;
      }
    }
    const std::vector<float> res = fi_chunks_out(chunk, Dv, s.out_format);
    for (int64_t d = 0; d < Dv; ++d) {
      const float od = res[static_cast<size_t>(d)];
      expect_out(p, row, h, d, v_scale(p, si) == 1.0f ? od : od * v_scale(p, si), &bad);
    }
  });
  CHECK(bad == 0);
}

// flashinfer's prefill kernel, re-implemented densely from the steps in attention.h ("flashinfer prefill kernel"):
// per row its visible keys grouped by chunk (from the row's KV start, a window's moved by the row's q tile), KV warp
// and tile (T keys; tile t of a chunk to warp t mod nw), each warp's tiles in order: s = the HMMA.16816 chain over
// dims 16 at a time from 0, the scale inside the base-2 softmax (m rescale by ex2(RN32(m − m')·c), p = ex2(fma(s, c,
// −RN32(m'·c))) rounded to md), d and o by HMMA steps of 16 keys (P·ones, P·V); then m·c, the warps merged in order,
// and the chunks as FlashInfer merges split-KV chunks. Rows of sequences that take the decode kernel are not checked.
void check_flashinfer_prefill(PagedProblem& p) {
  const AttnSpec s = attn::resolve_launch(p.spec, p.args());  // FlashInfer's plan: cta_tile_q and the chunk
  const int64_t Dk = s.cache.head_dim, Dv = s.dv(), G = s.num_q_heads / s.cache.num_kv_heads;
  int64_t nw = 1;
  const int64_t T = attn::flashinfer_prefill_tile(Dk, s.cta_tile_q, &nw);
  REQUIRE(T > 0);
  const Format f = s.q_format;
  const std::vector<float> ones(16, 1.0f);
  int bad = 0, rows = 0;
  for_each_row(p, [&](int64_t b, int64_t row, int64_t h, int64_t kvh, int64_t si, const std::vector<int64_t>& js) {
    if (!attn::flashinfer_takes_prefill(s, attn::seq_pages(s, p.args(), b))) return;
    ++rows;
    const int64_t n = p.seq_lens[b], i = row - p.qsl[b];
    const int64_t qt = (i * G + h % G) / s.cta_tile_q;
    const int64_t a0 = s.window_left >= 0 ? std::max<int64_t>(0, n + qt * s.cta_tile_q / G - p.q_lens[b] - s.window_left) : 0;
    const int64_t C = s.prefill_kv_chunk > 0 ? s.prefill_kv_chunk : std::max<int64_t>(n - a0, 1);
    const float c = static_cast<float>(s.scale() * static_cast<double>(p.ks[si]) * 1.44269502162933349609375);
    std::vector<float> q(static_cast<size_t>(Dk)), k(static_cast<size_t>(Dk));
    for (int64_t d = 0; d < Dk; ++d) q[static_cast<size_t>(d)] = q_val(p, row, h, d);
    // keys[chunk][warp] = the tiles (start, keys) in order
    std::map<int64_t, std::map<int64_t, std::vector<std::pair<int64_t, std::vector<int64_t>>>>> keys;
    for (int64_t j : js) {
      const int64_t ch = (j - a0) / C, t0 = a0 + ch * C + (j - a0 - ch * C) / T * T;
      auto& tiles = keys[ch][((t0 - a0 - ch * C) / T) % nw];
      if (tiles.empty() || tiles.back().first != t0) tiles.push_back({t0, {}});
      tiles.back().second.push_back(j);
    }
    std::vector<FiSt> chunk;
    for (int64_t ch = 0; ch * C < n - a0 || ch == 0; ++ch) {
      std::vector<FiSt> w(static_cast<size_t>(nw));
      for (int64_t wi = 0; wi < nw; ++wi) {
        FiSt& st = w[static_cast<size_t>(wi)];
        st.o.assign(static_cast<size_t>(Dv), 0.0f);
        for (const auto& [t0, tj] : keys[ch][wi]) {
          std::vector<float> sv;
          float mj = st.m;
          for (int64_t j : tj) {
            for (int64_t d = 0; d < Dk; ++d) k[static_cast<size_t>(d)] = k_code(p, b, j, kvh, d);
            sv.push_back(ref::hmma16_dot(f, q.data(), k.data(), Dk, 0.0f));
            mj = std::max(mj, sv.back());
          }
          const float a = st.m == -INFINITY ? 0.0f : fi_ex2((st.m - mj) * c);
          st.d *= a;
          for (float& x : st.o) x *= a;
          std::vector<float> P(static_cast<size_t>(T), 0.0f), V(static_cast<size_t>(T * Dv), 0.0f);
          for (size_t e = 0; e < tj.size(); ++e) {
            const int64_t at = tj[e] - t0;
            P[static_cast<size_t>(at)] = round_to(f, fi_ex2(std::fma(sv[e], c, -(mj * c))));
            for (int64_t d = 0; d < Dv; ++d) V[static_cast<size_t>(d * T + at)] = v_code(p, b, tj[e], kvh, d);
          }
          for (int64_t blk = 0; blk < T; blk += 16) {
            st.d = ref::hmma16_step(f, P.data() + blk, ones.data(), 16, st.d);
            for (int64_t d = 0; d < Dv; ++d)
              st.o[static_cast<size_t>(d)] = ref::hmma16_step(f, P.data() + blk, V.data() + d * T + blk, 16, st.o[static_cast<size_t>(d)]);
          }
          st.m = mj;
        }
        if (st.m == -INFINITY) st.d = 0.0f;
        else st.m *= c;
      }
      FiSt all;  // the warps, in order
      all.o.assign(static_cast<size_t>(Dv), 0.0f);
      for (const FiSt& st : w) {
        const float mp = all.m;
        all.m = std::max(all.m, st.m);
        all.d = std::fma(all.d, fi_ex2(mp - all.m), st.d * fi_ex2(st.m - all.m));
      }
      for (size_t wi = 0; wi < w.size(); ++wi)
        for (int64_t d = 0; d < Dv; ++d) {
          const float t = w[wi].o[static_cast<size_t>(d)], sc = fi_ex2(w[wi].m - all.m);
          all.o[static_cast<size_t>(d)] = wi == 0 ? t * sc : std::fma(t, sc, all.o[static_cast<size_t>(d)]);
        }
      if (all.m == -INFINITY) all.d = 0.0f;
      chunk.push_back(all);
    }
    const std::vector<float> res = fi_chunks_out(chunk, Dv, s.out_format);  // (d = 0 exactly where m = −inf)
    for (int64_t d = 0; d < Dv; ++d) {
      const float od = res[static_cast<size_t>(d)];
      expect_out(p, row, h, d, v_scale(p, si) == 1.0f ? od : od * v_scale(p, si), &bad);
    }
  });
  CHECK(rows > 0);
  CHECK(bad == 0);
}

using Config = test::AttnConfig;
AttnSpec base_spec(int64_t bs, int64_t hkv, int64_t hq, int64_t d) { return test::base_attn_spec(bs, hkv, hq, d); }
std::vector<Config> configs() { return test::attention_configs(); }

const AttnConvention kAll[] = {AttnConvention::exact, AttnConvention::vllm_paged_v1, AttnConvention::vllm_triton_unified,
                               AttnConvention::flashinfer, AttnConvention::torch_sdpa_math, AttnConvention::spyre};

bool has_nan(const PagedProblem& p) {
  for (size_t i = 0; i < p.out.size() / p.out_elem(); ++i)
    if (std::isnan(test::out_value(p.spec.out_format, &p.out[i * p.out_elem()]))) return true;
  return false;
}

}  // namespace

TEST_SUITE("attention") {
  TEST_CASE("mufu_ex2: PTX ex2.approx.ftz on the H100's captured pairs, bit for bit (Sleef exp2 is not)") {
    // tests/data/h200/mufu_ex2_pairs.npy: (x, ex2.approx.ftz x) bit patterns from tools/device/capture_mufu_ex2.py —
    // the edges, every binade's ends down to −2^-149, random x in [-1, 0] and [-150, 0]
    const io::Tensor t = io::read_npy(std::string(FP8REF_TEST_DATA) + "/h200/mufu_ex2_pairs.npy");
    REQUIRE(t.shape.size() == 2);
    REQUIRE(t.shape[1] == 2);
    const int64_t n = t.shape[0];
    CHECK(n >= 65536);
    std::vector<uint32_t> w(static_cast<size_t>(n) * 2);
    std::memcpy(w.data(), t.data.data(), w.size() * 4);
    int64_t bad = 0, sleef_differs = 0, zeros = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = f32_from_bits(w[2 * i]);
      const uint32_t want = w[2 * i + 1], got = bits_of_f32(ref::mufu_ex2(x));
      if (got != want && bad++ < 5) MESSAGE("x bits ", w[2 * i], ": GPU ", want, " fp8ref ", got);
      if (bits_of_f32(attn::ref::exp2_sleef(x)) != want) ++sleef_differs;
      zeros += want == 0;
    }
    CHECK(bad == 0);
    CHECK(sleef_differs > 1000);  // the control: another exp2 is not the GPU's
    CHECK(zeros > 100);           // (ftz and underflow covered)
  }

  TEST_CASE("triton_exp: Triton's tl.exp on the H200's pairs — every normal result bit for bit, most subnormal ones") {
    // tests/data/h200/triton_exp_pairs.npy (tools/device/capture_triton_exp.py): x in [-1, 0] and [-110, 0]
    const io::Tensor t = io::read_npy(std::string(FP8REF_TEST_DATA) + "/h200/triton_exp_pairs.npy");
    REQUIRE(t.shape.size() == 2);
    REQUIRE(t.shape[1] == 2);
    std::vector<uint32_t> w(static_cast<size_t>(t.shape[0]) * 2);
    std::memcpy(w.data(), t.data.data(), w.size() * 4);
    int64_t normal = 0, normal_bad = 0, sub = 0, sub_bad = 0, sleef_differs = 0;
    for (size_t i = 0; i < w.size(); i += 2) {
      const float x = f32_from_bits(w[i]), want = f32_from_bits(w[i + 1]);
      const bool miss = bits_of_f32(ref::triton_exp(x)) != w[i + 1];
      if (want >= 0x1p-126f) {
        ++normal;
        if (miss && normal_bad++ < 5) MESSAGE("x bits ", w[i], ": GPU ", w[i + 1]);
      } else if (want > 0) {
        ++sub;
        sub_bad += miss;
      }
      sleef_differs += bits_of_f32(attn::ref::exp_sleef(x)) != w[i + 1];
    }
    CHECK(normal > 50000);
    CHECK(normal_bad == 0);
    CHECK(sub > 1000);
    CHECK(sub_bad * 20 < sub);    // subnormal results: the table rounded, the GPU's own rounding otherwise (~4 %)
    CHECK(sleef_differs > 1000);  // the control
  }

  TEST_CASE("cpu hmma16_lanes == ref::hmma16_step lane by lane, every SIMD target, specials and subnormals included") {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> ex(-20, 20), kind(0, 39), pick(0, 15);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::vector<std::string> ran = test::for_test_targets([&] {
      const size_t N = attn::cpu::float_lanes();
      REQUIRE(N <= 16);
      int64_t bad = 0, checked = 0;
      for (Format f : {Format::bf16, Format::f16}) {
        auto draw = [&]() {
          switch (kind(rng)) {
            case 0: return 0.0f;
            case 1: return -0.0f;
            case 2: return std::numeric_limits<float>::quiet_NaN();
            case 3: return -std::numeric_limits<float>::infinity();
            case 4: return ref::round_through(f, std::ldexp(nd(rng), f == Format::f16 ? -20 : -135));  // a subnormal
            case 5: return ref::round_through(f, std::ldexp(nd(rng), f == Format::f16 ? 14 : 120));    // large products
            default: return ref::round_through(f, std::ldexp(nd(rng), ex(rng)));
          }
        };
        for (int it = 0; it < 3000; ++it) {
          float a[16], b[16 * 16], c[16], c0[16];
          const bool clean = it % 2 == 0;  // half the cases without specials: the vector path itself
          for (float& x : a) x = clean ? ref::round_through(f, std::ldexp(nd(rng), ex(rng))) : draw();
          for (float& x : b) x = clean ? ref::round_through(f, std::ldexp(nd(rng), ex(rng))) : draw();
          for (float& x : c) x = it % 3 == 0 ? 0.0f : clean ? std::ldexp(nd(rng), ex(rng)) : draw();
          if (it % 5 == 0) a[pick(rng)] = 0.0f;
          const int n = 1 + pick(rng), k_lo = std::min(pick(rng) % 4, n), k_hi = std::max(k_lo, n - pick(rng) % 4);
          const size_t l0 = static_cast<size_t>(pick(rng)) % N, l1 = std::min(N, l0 + 1 + static_cast<size_t>(pick(rng)));
          std::copy(c, c + 16, c0);
          attn::cpu::hmma16_lanes(f, a, n, k_lo, k_hi, b, 0, 16, c, l0, l1);
          for (size_t l = 0; l < N; ++l) {
            float al[16], bl[16];
            for (int k = 0; k < n; ++k) {
              const bool on = k >= k_lo && k < k_hi;
              al[k] = on ? a[k] : 0.0f;
              bl[k] = on ? b[k * 16 + static_cast<int>(l)] : 0.0f;
            }
            const float want = l >= l0 && l < l1 ? ref::hmma16_step(f, al, bl, n, c0[l]) : c0[l];
            const bool same = bits_of_f32(want) == bits_of_f32(c[l]) || (std::isnan(want) && std::isnan(c[l]));
            if (!same && bad++ < 5) MESSAGE(cpu::simd_target() << " lane " << l << ": " << c[l] << " vs " << want);
            ++checked;
          }
        }
      }
      CHECK(bad == 0);
      CHECK(checked >= 6000);
    });
    MESSAGE("SIMD targets checked: " << ran.size());
  }

  TEST_CASE("triton_row_sum and L = fma(L, α, l): Triton's tl.sum over a tensor-core tile on an H100, every row") {
    // tests/data/h200/triton_rowsum/ (tools/device/capture_triton_rowsum.py): tl.sum(x, axis=1) of [16, T] tiles in
    // the dot's layout, values spread over 2^±20 so that each order rounds differently; and L * alpha + l.
    const std::string base = std::string(FP8REF_TEST_DATA) + "/h200/triton_rowsum/";
    auto load = [&](const std::string& n) {
      const io::Tensor t = io::read_npy(base + n + ".npy");
      std::vector<float> v(t.data.size() / 4);
      std::memcpy(v.data(), t.data.data(), t.data.size());
      return v;
    };
    for (int64_t T : {16, 32}) {
      CAPTURE(T);
      const std::string p = "t" + std::to_string(T) + "_";
      const auto v = load(p + "v"), sum = load(p + "sum");
      const size_t rows = sum.size();
      REQUIRE(v.size() == rows * static_cast<size_t>(T));
      int bad = 0, seq_bad = 0;
      for (size_t r = 0; r < rows; ++r) {
        const float* x = &v[r * static_cast<size_t>(T)];
        bad += bits_of_f32(attn::ref::triton_row_sum(x, T)) != bits_of_f32(sum[r]);
        float s = x[0];
        for (int64_t k = 1; k < T; ++k) s = s + x[k];
        seq_bad += bits_of_f32(s) != bits_of_f32(sum[r]);
      }
      CHECK(rows == 1024);
      CHECK(bad == 0);
      CHECK(seq_bad > 300);  // the control: in order, most rows differ
      const auto L = load(p + "l"), al = load(p + "alpha"), ls = load(p + "ls"), out = load(p + "lout");
      int fma_bad = 0, mul_add_bad = 0;
      for (size_t r = 0; r < rows; ++r) {
        fma_bad += bits_of_f32(std::fma(L[r], al[r], ls[r])) != bits_of_f32(out[r]);
        mul_add_bad += bits_of_f32(L[r] * al[r] + ls[r]) != bits_of_f32(out[r]);
      }
      CHECK(fma_bad == 0);
      CHECK(mul_add_bad > 50);
    }
  }

  TEST_CASE("triton_reduce_segments: reduce_segments' sum over 16 segments in Triton's layout on an H100, every dim") {
    // tests/data/h200/triton_segsum/ (tools/device/capture_triton_segsum.py): tl.sum(o, axis=0) of [16, D] tiles loaded
    // as reduce_segments loads them. Through the model itself: M = 0 and L = 1 for every segment give weights
    // tl.exp(0) = 1, den = 16 and out_d = num_d / 16 (exact: MUFU.RCP(16) = 2^-4), so 16·out_d is the axis-0 sum.
    const std::string base = std::string(FP8REF_TEST_DATA) + "/h200/triton_segsum/";
    for (int64_t D : {32, 64, 128, 256}) {
      CAPTURE(D);
      const io::Tensor to = io::read_npy(base + "d" + std::to_string(D) + "_out.npy");
      const io::Tensor ts = io::read_npy(base + "d" + std::to_string(D) + "_osum.npy");
      std::vector<float> o(to.data.size() / 4), want(ts.data.size() / 4);
      std::memcpy(o.data(), to.data.data(), to.data.size());
      std::memcpy(want.data(), ts.data.data(), ts.data.size());
      const size_t R = want.size() / static_cast<size_t>(D);
      REQUIRE(o.size() == R * 16 * static_cast<size_t>(D));
      const std::vector<float> M(16, 0.0f), L(16, 1.0f);
      std::vector<float> out(static_cast<size_t>(D));
      int bad = 0, bfly_bad = 0;
      for (size_t r = 0; r < R; ++r) {
        const float* acc = &o[r * 16 * static_cast<size_t>(D)];
        attn::ref::triton_reduce_segments(M.data(), L.data(), acc, 16, 16, D, out.data());
        for (int64_t d = 0; d < D; ++d) {
          const float w = want[r * static_cast<size_t>(D) + static_cast<size_t>(d)];
          bad += bits_of_f32(out[static_cast<size_t>(d)] * 16.0f) != bits_of_f32(w);
          std::vector<float> v(16);  // the control: the 1D butterfly (slot i + slot i + n/2) for every dim
          for (int s = 0; s < 16; ++s) v[static_cast<size_t>(s)] = acc[s * D + d];
          for (size_t n = 16; n > 1; n /= 2)
            for (size_t i = 0; i < n / 2; ++i) v[i] = v[i] + v[i + n / 2];
          bfly_bad += bits_of_f32(v[0]) != bits_of_f32(w);
        }
      }
      CHECK(R == 16);
      CHECK(bad == 0);
      if (D != 128) CHECK(bfly_bad > static_cast<int>(R) * D / 10);  // (at D = 128 one thread holds 4 segments: ~80 % agree)
    }
  }

  TEST_CASE("flashinfer_plan_chunk: FlashInfer's max_grid_size on the H100, every head dim x window x group size") {
    // tests/data/h200/flashinfer_occupancy.npy: rows (D, window variant, G, SMs, max_grid_size) as FlashInfer's
    // work estimation computed them. The plan shows max_grid_size g exactly (one KV head, decode, pages of 16: one
    // sequence of 256 keys, the others of 128): num_seqs >= g never splits; num_seqs = g − 1 fits its num_seqs + 1
    // chunks of 8 pages (128 keys) in the grid and splits.
    const io::Tensor t = io::read_npy(std::string(FP8REF_TEST_DATA) + "/h200/flashinfer_occupancy.npy");
    REQUIRE(t.shape.size() == 2);
    REQUIRE(t.shape[1] == 5);
    std::vector<int32_t> occ(static_cast<size_t>(t.shape[0] * 5));
    std::memcpy(occ.data(), t.data.data(), occ.size() * 4);
    auto plan = [](int64_t d, bool window, int64_t g, int64_t B) {
      AttnSpec s = base_spec(16, 1, g, d);
      s.convention = AttnConvention::flashinfer;
      s.window_left = window ? 100 : -1;
      std::vector<int32_t> qsl(static_cast<size_t>(B + 1)), sl(static_cast<size_t>(B), 128), bt(static_cast<size_t>(B * 16), 0);
      sl[0] = 256;
      for (int64_t b = 0; b <= B; ++b) qsl[static_cast<size_t>(b)] = static_cast<int32_t>(b);
      attn::AttnArgs a;
      a.num_seqs = a.num_tokens = B;
      a.query_start_loc = qsl.data();
      a.table.block_table = bt.data();
      a.table.max_blocks = 16;
      a.table.seq_lens = sl.data();
      return attn::flashinfer_plan_chunk(s, a);
    };
    CHECK(occ.size() == 42 * 5);
    for (size_t r = 0; r + 5 <= occ.size(); r += 5) {
      const int64_t d = occ[r], g = occ[r + 2], grid = occ[r + 4];
      const bool window = occ[r + 1] != 0;
      CAPTURE(d);
      CAPTURE(window);
      CAPTURE(g);
      CHECK(occ[r + 3] == 132);
      CHECK(plan(d, window, g, grid - 1) == 128);
      CHECK(plan(d, window, g, grid) == 0);
    }
  }

  TEST_CASE("exp models: the SIMD twins equal the scalar reference; exp within 1 ulp of exp") {
    std::mt19937_64 rng(7);
    std::vector<float> x;
    for (float v : {0.0f, -0.0f, -1e-30f, -87.0f, -87.5f, -103.9f, -104.0f, -104.1f, -149.0f, -150.0f, -151.0f, 88.0f,
                    99.0f, 100.5f, 127.9f, 128.0f, -INFINITY, INFINITY, NAN})
      x.push_back(v);
    std::uniform_real_distribution<float> u(-160.0f, 130.0f);
    for (int i = 0; i < 200000; ++i) x.push_back(u(rng));
    std::vector<float> y(x.size()), y2(x.size());
    attn::cpu::exp_sleef(x.data(), y.data(), x.size());
    attn::cpu::exp2_sleef(x.data(), y2.data(), x.size());
    int bad = 0, inacc = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float a = attn::ref::exp_sleef(x[i]), b = attn::ref::exp2_sleef(x[i]);
      if (std::memcmp(&a, &y[i], 4) || std::memcmp(&b, &y2[i], 4)) ++bad;
      const double e = std::exp(static_cast<double>(x[i]));
      if (e >= 1.2e-38 && e < 3e38 && std::fabs(a - e) > std::ldexp(e, -23)) ++inacc;
      const double e2 = std::exp2(static_cast<double>(x[i]));
      if (e2 >= 1.2e-38 && e2 < 3e38 && std::fabs(b - e2) > std::ldexp(e2, -23)) ++inacc;
    }
    CHECK(bad == 0);
    CHECK(inacc == 0);
  }

  TEST_CASE("exact: within the derived bound of a dense long-double attention over the gathered cache") {
    uint64_t seed = 1;
    for (Config c : configs()) {
      for (double cap : {0.0, 5.0}) {
        CAPTURE(c.name);
        CAPTURE(cap);
        c.spec.convention = AttnConvention::exact;
        c.spec.softcap = cap;
        PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed++, c.csr);
        attn::ref::paged_attention(p.spec, p.args());
        CHECK_FALSE(has_nan(p));
        check_exact(p);
      }
    }
  }

  TEST_CASE("vllm-paged-v1: bitwise against a dense re-implementation of its steps") {
    uint64_t seed = 100;
    for (Config c : configs()) {
      if (c.spec.v_from_k) continue;
      CAPTURE(c.name);
      c.spec.convention = AttnConvention::vllm_paged_v1;
      PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed++, c.csr);
      attn::ref::paged_attention(p.spec, p.args());
      check_paged_v1(p);
    }
  }

  TEST_CASE("vllm-triton-unified and flashinfer: bitwise against dense re-implementations of their steps, tiles and segments as vLLM launches them and as forced") {
    uint64_t seed = 150;
    std::vector<Config> cs = configs();  // and decode-only batches (vLLM's 3D kernel by default), GQA 4:1 and 16:1
    cs.push_back({"decode", base_spec(16, 2, 8, 64), {300, 33, 1, 130}, {1, 1, 1, 1}});
    cs.push_back({"decode-g16", base_spec(64, 1, 16, 128), {600, 257}, {1, 1}});
    cs.push_back({"decode-d32", base_spec(16, 2, 16, 32), {1000, 257, 31, 4096}, {1, 1, 1, 1}});  // one segment a thread
    struct Launch {
      AttnConvention conv;
      int64_t tile, segs;
      bool cap;
      int64_t kv_chunk = -1;  // flashinfer: -1 as FlashInfer plans
    };
    const Launch launches[] = {{AttnConvention::vllm_triton_unified, 0, -1, true},  // as vLLM picks
                               {AttnConvention::vllm_triton_unified, 16, 0, true},
                               {AttnConvention::vllm_triton_unified, 48, 0, false},
                               {AttnConvention::vllm_triton_unified, 0, 4, false},
                               {AttnConvention::vllm_triton_unified, 32, 16, false},
                               {AttnConvention::flashinfer, 0, -1, false},
                               {AttnConvention::flashinfer, 32, -1, false},
                               {AttnConvention::flashinfer, 0, -1, false, 0},
                               {AttnConvention::flashinfer, 0, -1, false, 40},
                               {AttnConvention::flashinfer, 32, -1, false, 16}};
    size_t ci = 0;
    for (Config c : cs)
      for (double cap : {0.0, 5.0})
        for (const Launch& l : launches) {
          if (cap > 0 && !l.cap) continue;  // (no soft-cap in flashinfer)
          if (FP8REF_TEST_ASAN && (ci++ % 6) != 0) continue;  // (a sixth of the cases under ASan: it checks memory)
          const AttnConvention conv = l.conv;
          const int64_t tile = l.tile, segs = l.segs;
          CAPTURE(c.name);
          CAPTURE(cap);
          CAPTURE(tile);
          CAPTURE(attn::to_string(conv));
          c.spec.convention = conv;
          c.spec.softcap = cap;
          c.spec.tile = tile;
          c.spec.segments = segs;
          c.spec.kv_chunk = l.kv_chunk;
          // (flashinfer's decode kernel's steps for every row here; its prefill kernel: the capture tests and
          // "flashinfer prefill kernel" below)
          c.spec.fi_kernel = conv == AttnConvention::flashinfer ? attn::FiKernel::decode : attn::FiKernel::automatic;
          CAPTURE(segs);
          CAPTURE(l.kv_chunk);
          PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed++, c.csr);
          attn::ref::paged_attention(p.spec, p.args());
          {  // the cpu backend: bit for bit the reference, with this tile
            PagedProblem pc = p;
            std::fill(pc.out.begin(), pc.out.end(), uint8_t{0xCD});
            attn::cpu::paged_attention(pc.spec, pc.args());
            CHECK(pc.out == p.out);
          }
          if (conv == AttnConvention::flashinfer) {
            check_flashinfer(p);
            std::fill(p.vs.begin(), p.vs.end(), 1.0f);  // sv = 1: FlashInfer skips the output-dtype multiply
            if (p.spec.v_from_k) std::fill(p.ks.begin(), p.ks.end(), 1.0f);
            attn::ref::paged_attention(p.spec, p.args());
            check_flashinfer(p);
          } else {
            CHECK(check_triton_unified(p) == 0);
          }
        }
  }

  TEST_CASE("flashinfer prefill kernel: bitwise against a dense re-implementation of its steps, as planned and forced") {
    struct Case {
      const char* name;
      int64_t bs, hkv, hq, d;
      std::vector<int64_t> seq_lens, q_lens;
      Format md;
      int64_t window, cta_tile_q, chunk;
      attn::FiKernel kernel;
      bool csr;
    };
    const Case cases[] = {
        {"mixed G4 D64", 16, 2, 8, 64, {300, 77, 150, 5}, {9, 1, 30, 5}, Format::bf16, -1, 0, -1, attn::FiKernel::automatic, false},
        {"G1 D128 f16", 16, 4, 4, 128, {129, 400}, {40, 20}, Format::f16, -1, 0, -1, attn::FiKernel::automatic, true},
        {"D256 page1", 1, 2, 8, 256, {300}, {3}, Format::bf16, -1, 0, -1, attn::FiKernel::automatic, false},
        {"window split", 16, 2, 4, 128, {600, 250}, {14, 22}, Format::bf16, 100, 0, -1, attn::FiKernel::automatic, false},
        {"cta16 4 warps", 16, 1, 8, 64, {700, 64}, {3, 1}, Format::bf16, -1, 16, 0, attn::FiKernel::prefill, false},
        {"cta128 chunk 96", 64, 1, 8, 128, {500, 90}, {30, 20}, Format::bf16, -1, 128, 96, attn::FiKernel::automatic, false},
        {"cta64 window chunk", 16, 2, 2, 64, {400, 17}, {60, 17}, Format::f16, 20, 64, 48, attn::FiKernel::prefill, true},
    };
    uint64_t seed = 900;
    size_t ci = 0;
    for (const Case& k : cases) {
      CAPTURE(k.name);
      if (FP8REF_TEST_ASAN && ci++ % 4 != 0) continue;  // (two of the cases under ASan: it checks memory)
      AttnSpec s = base_spec(k.bs, k.hkv, k.hq, k.d);
      s.convention = AttnConvention::flashinfer;
      s.q_format = s.out_format = k.md;
      s.window_left = k.window;
      s.cta_tile_q = k.cta_tile_q;
      s.prefill_kv_chunk = k.chunk;
      s.fi_kernel = k.kernel;
      PagedProblem p = test::random_problem(s, k.seq_lens, k.q_lens, seed++, k.csr);
      attn::ref::paged_attention(p.spec, p.args());
      check_flashinfer_prefill(p);
      PagedProblem pc = p;  // the cpu backend: bit for bit
      std::fill(pc.out.begin(), pc.out.end(), uint8_t{0xCD});
      attn::cpu::paged_attention(pc.spec, pc.args());
      CHECK(pc.out == p.out);
    }
  }

  TEST_CASE("vllm-triton-unified with a sliding window: vLLM's where(m_j > -inf, m_j, 0) guard, 2D and 3D") {
    // Rows whose first walked tile holds none of their keys: in the 2D kernel the rows of a q block after its first
    // (the block starts at the first row's window), in the 3D kernel every segment before the window. With logits
    // below 0 (K codes made positive, q negative) the guard's M = 0 shows in the bits.
    struct Case {
      std::string name;
      AttnSpec spec;
      std::vector<int64_t> seq_lens, q_lens;
      int64_t window, tile, segs;
      bool out_f32 = false;  // (the 3D reduce's other max changes bf16 outputs rarely: f32 shows it)
    };
    const Case cases[] = {
        {"g1-prefill", base_spec(16, 1, 1, 64), {200, 90, 33}, {40, 1, 33}, 37, 0, -1},
        {"g4-prefill", base_spec(16, 2, 8, 64), {150, 260}, {9, 1}, 20, 0, -1},
        {"g4-prefill-tile16", base_spec(64, 2, 8, 64), {150, 260}, {9, 1}, 20, 16, -1},
        {"decode-3d", base_spec(16, 2, 8, 64), {700, 300, 5}, {1, 1, 1}, 100, 0, -1},
        {"decode-3d-g16-outf32", base_spec(64, 1, 16, 128), {900}, {1}, 63, 0, -1, true},
        {"prefill-forced-3d", base_spec(16, 1, 4, 64), {260, 70}, {30, 1}, 45, 0, 4},
    };
    uint64_t seed = 900;
    for (const Case& k : cases)
      for (bool negative : {false, true}) {
        CAPTURE(k.name);
        CAPTURE(negative);
        AttnSpec s = k.spec;
        s.convention = AttnConvention::vllm_triton_unified;
        s.window_left = k.window;
        s.tile = k.tile;
        s.segments = k.segs;
        if (k.out_f32) s.out_format = Format::f32;
        PagedProblem p = test::random_problem(s, k.seq_lens, k.q_lens, seed++, false);
        if (negative) {  // every dot product <= 0: K codes positive (NaN codes stay NaN), q negative
          for (uint8_t& c : p.kc) c &= 0x7F;
          for (std::vector<uint8_t>& kd : p.kd)
            for (uint8_t& c : kd) c &= 0x7F;
          const size_t e = static_cast<size_t>(format_info(s.q_format).bits / 8);
          for (size_t i = e - 1; i < p.q.size(); i += e) p.q[i] |= 0x80;
        }
        // the guard applies to some rows (and not to all)
        const AttnSpec rs = attn::resolve_launch(p.spec, p.args());
        int starts = 0, rows = 0;
        for (int64_t b = 0; b < p.B; ++b)
          for (int64_t i = 0; i < p.q_lens[b]; ++i) {
            const int64_t n = p.seq_lens[b], qpos = n - p.q_lens[b] + i;
            const int64_t lo = std::max<int64_t>(0, qpos - k.window);
            for (int64_t sg = rs.segments > 0 ? 0 : -1; sg < std::max<int64_t>(rs.segments, 0); ++sg, ++rows)
              starts += attn::triton_starts_at_zero(rs, n, p.q_lens[b], i, lo, qpos, sg);
          }
        CHECK(starts > 0);
        CHECK(starts < rows);
        attn::ref::paged_attention(p.spec, p.args());
        PagedProblem pc = p;
        std::fill(pc.out.begin(), pc.out.end(), uint8_t{0xCD});
        attn::cpu::paged_attention(pc.spec, pc.args());
        CHECK(pc.out == p.out);
        CHECK(check_triton_unified(p) == 0);
        // the mutant without the guard (fp8ref before 0.3.0): the same bits unless the logits are negative
        const int without = check_triton_unified(p, false);
        if (negative) CHECK(without > 0);
      }
  }

  TEST_CASE("cpu == reference bit for bit, every convention and configuration; no NaN read from unused slots") {
    uint64_t seed = 200;
    for (Config c : configs())
      for (AttnConvention conv : kAll) {
        CAPTURE(c.name);
        CAPTURE(attn::to_string(conv));
        c.spec.convention = conv;
        c.spec.softcap = (conv == AttnConvention::exact || conv == AttnConvention::vllm_triton_unified) ? 4.0 : 0.0;
        PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed++, c.csr);
        attn::ref::paged_attention(p.spec, p.args());
        const std::vector<uint8_t> want = p.out;
        CHECK_FALSE(has_nan(p));
        std::fill(p.out.begin(), p.out.end(), 0xCD);
        attn::cpu::paged_attention(p.spec, p.args());
        CHECK(p.out == want);
      }
  }

  TEST_CASE("vllm-triton-unified out_scale: e4m3fn codes = triton_fp8_out of the f32 output, both kernels, both backends") {
    // vLLM's fused output quantization is the f32 result's last step: the same run with out f32, quantized with
    // triton_fp8_out, must give the codes (2D and 3D kernels; a scale that saturates some outputs and one that does not)
    for (int64_t segs : {int64_t{0}, int64_t{16}})
      for (double oscale : {0.0123, 0.0004}) {
        CAPTURE(segs);
        CAPTURE(oscale);
        AttnSpec s = base_spec(16, 2, 16, 64);
        s.convention = AttnConvention::vllm_triton_unified;
        s.segments = segs;
        s.out_format = Format::f32;
        PagedProblem pf = test::random_problem(s, {40, 3, 19}, {1, 1, 1}, 77, false);
        attn::ref::paged_attention(pf.spec, pf.args());
        s.out_format = Format::e4m3fn;
        s.out_scale = oscale;
        PagedProblem p8 = test::random_problem(s, {40, 3, 19}, {1, 1, 1}, 77, false);
        REQUIRE(p8.out.size() * 4 == pf.out.size());
        const float inv = 1.0f / static_cast<float>(oscale);
        std::vector<uint8_t> want(p8.out.size());
        int saturated = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          float o;
          std::memcpy(&o, &pf.out[4 * i], 4);
          want[i] = attn::ref::triton_fp8_out(o, inv);
          saturated += (want[i] & 0x7F) == 0x7E;
        }
        attn::ref::paged_attention(p8.spec, p8.args());
        CHECK(p8.out == want);
        std::fill(p8.out.begin(), p8.out.end(), 0xCD);
        attn::cpu::paged_attention(p8.spec, p8.args());
        CHECK(p8.out == want);
        if (oscale < 0.001) CHECK(saturated > 0);
      }
    // tl.clamp(x, -448, 448) stored as e4m3fn on the H100 (vllm_unified_attention_fp8out.npz, "clamp")
    const float x[] = {NAN, -INFINITY, INFINITY, 500.0f, -500.0f, 447.9f, -0.0f, 1e-10f};
    const uint8_t gpu[] = {0x7E, 0xFE, 0x7E, 0x7E, 0xFE, 0x7E, 0x80, 0x00};
    for (int i = 0; i < 8; ++i) CHECK(attn::ref::triton_fp8_out(x[i], 1.0f) == gpu[i]);
  }

  TEST_CASE("cpu == reference on every compiled SIMD target (GQA 8:1, mixed decode/prefill, every convention)") {
    AttnSpec s = base_spec(16, 2, 16, 64);
    std::vector<std::string> seen;
    for (AttnConvention conv : kAll) {
      s.convention = conv;
      PagedProblem p = test::random_problem(s, {40, 3, 19}, {1, 3, 6}, 300, false);
      attn::ref::paged_attention(p.spec, p.args());
      const std::vector<uint8_t> want = p.out;
      seen = fp8ref::test::for_test_targets([&] {
        std::fill(p.out.begin(), p.out.end(), 0xCD);
        attn::cpu::paged_attention(p.spec, p.args());
        CHECK(p.out == want);
        std::vector<float> x = {-103.0f, -50.5f, -1.25f, 0.0f, -0.7f, 3.5f, -149.5f, 120.0f, -20.0f, -9.0f, -3.0f,
                                -2.0f, -1.0f, -0.5f, -0.25f, -0.125f, -60.0f};
        std::vector<float> y(x.size()), y2(x.size());
        attn::cpu::exp_sleef(x.data(), y.data(), x.size());
        attn::cpu::exp2_sleef(x.data(), y2.data(), x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          const float a = attn::ref::exp_sleef(x[i]), b = attn::ref::exp2_sleef(x[i]);
          CHECK(std::memcmp(&a, &y[i], 4) == 0);
          CHECK(std::memcmp(&b, &y2[i], 4) == 0);
        }
      });
    }
    std::string names;
    for (auto& n : seen) names += n + " ";
    MESSAGE("SIMD targets checked: " << names);
    CHECK(!seen.empty());
  }

  // The cpu backend decodes cache codes through per-(unit, KV head) 256-entry tables built by its own decode path,
  // sign-symmetric ones looked up as 128 magnitudes with the sign XORed in. Every finite code under scales that are
  // negative, produce subnormals or overflow, are ±0, ±Inf or NaN: cpu == ref. (NaN/Inf codes in slots that are read
  // are left out: the NaN payload reaching the output differs between cpu and ref there, with or without the tables.)
  TEST_CASE("cpu == reference over every cache code and edge-case scales (decode tables), every md and SIMD target") {
    const float kScales[][2] = {{0.05f, 3.0f},       {-0.75f, 1e-30f}, {1e-38f, -2e-41f}, {1e36f, 0.5f},
                                {0.0f, -0.0f},       {INFINITY, 0.25f}, {0.125f, -INFINITY}, {NAN, 1.0f},
                                {-NAN, 0.0625f}};
    uint64_t seed = 900;
    for (Format cf : {Format::e4m3fn, Format::e5m2})
      for (Format md : {Format::bf16, Format::f16, Format::f32})
        for (bool specials : {false})
          for (AttnConvention conv : kAll) {
            if (conv == AttnConvention::exact) continue;
            AttnSpec s = base_spec(16, 2, 8, 32);
            s.convention = conv;
            s.cache.format = cf;
            s.q_format = s.out_format = md;
            s.scale_kind = attn::KvScaleKind::head;
            PagedProblem p = test::random_problem(s, {40, 3, 19}, {1, 3, 2}, seed++, false);
            // every code, in a different order per tensor; specials (NaN, and Inf for e5m2) only when asked for
            auto code = [&](size_t i, uint32_t salt) {
              uint8_t c = static_cast<uint8_t>(lowbias32(static_cast<uint32_t>(i) ^ salt));
              const uint8_t mag = c & 0x7F;
              const bool special = cf == Format::e4m3fn ? mag == 0x7F : mag >= 0x7C;
              if (special && !specials) c = static_cast<uint8_t>((c & 0x80) | (mag & 0x3F));
              return c;
            };
            for (size_t i = 0; i < p.kc.size(); ++i) p.kc[i] = code(i, 0x1234u);
            for (size_t i = 0; i < p.vc.size(); ++i) p.vc[i] = code(i, 0xBEEFu);
            for (const auto& sc : kScales) {
              const std::string cfn = format_name(cf), mdn = format_name(md), cvn = attn::to_string(conv);
              CAPTURE(cfn);
              CAPTURE(mdn);
              CAPTURE(specials);
              CAPTURE(cvn);
              CAPTURE(sc[0]);
              CAPTURE(sc[1]);
              p.ks = {sc[0], sc[1]};
              p.vs = {sc[1], sc[0]};
              attn::ref::paged_attention(p.spec, p.args());
              const std::vector<uint8_t> want = p.out;
              auto run = [&] {
                std::fill(p.out.begin(), p.out.end(), 0xCD);
                attn::cpu::paged_attention(p.spec, p.args());
                CHECK(p.out == want);
              };
              if (md == Format::bf16) fp8ref::test::for_test_targets(run);
              else run();
            }
          }
  }

  TEST_CASE("paging does not change any convention's output: block sizes 1/16/64, shuffled tables, CSR, HND") {
    for (AttnConvention conv : kAll) {
      CAPTURE(attn::to_string(conv));
      std::vector<uint8_t> first;
      int variant = 0;
      for (int64_t bs : {1, 16, 64})
        for (bool csr : {false, true})
          for (attn::KvLayout lay : {attn::KvLayout::nhd, attn::KvLayout::hnd}) {
            AttnSpec s = base_spec(bs, 2, 8, 64);
            s.convention = conv;
            s.cache.layout = lay;
            // the same logical problem (same seed) placed through a different table each time
            PagedProblem p = test::random_problem(s, {49, 5, 20}, {1, 5, 3}, 77, csr);
            std::mt19937_64 rng(1000 + static_cast<uint64_t>(variant++));
            test::place_pages(p, rng, 2, 5);
            attn::cpu::paged_attention(p.spec, p.args());
            if (first.empty()) first = p.out;
            CHECK(p.out == first);
          }
    }
  }

  TEST_CASE("decode equals the last row of the same prefill (bottom-right causal)") {
    for (AttnConvention conv : kAll) {
      CAPTURE(attn::to_string(conv));
      AttnSpec s = base_spec(16, 1, 4, 64);
      s.convention = conv;
      if (conv == AttnConvention::vllm_triton_unified) s.segments = 0;  // (vLLM would run the decode in its 3D kernel)
      if (conv == AttnConvention::flashinfer) s.fi_kernel = attn::FiKernel::decode;  // (not its prefill kernel's tiles)
      PagedProblem pre = test::random_problem(s, {30}, {6}, 5);
      attn::ref::paged_attention(pre.spec, pre.args());
      PagedProblem dec = pre;
      dec.q_lens = {1};
      dec.qsl = {0, 1};
      dec.T = 1;
      const size_t qrow = static_cast<size_t>(4 * 64 * 2);
      dec.q.assign(pre.q.end() - static_cast<std::ptrdiff_t>(qrow), pre.q.end());
      dec.out.assign(static_cast<size_t>(4 * 64) * 2, 0);
      attn::ref::paged_attention(dec.spec, dec.args());
      CHECK(std::vector<uint8_t>(pre.out.end() - static_cast<std::ptrdiff_t>(dec.out.size()), pre.out.end()) == dec.out);
    }
  }

  TEST_CASE("bad input: clear InputError") {
    AttnSpec s = base_spec(16, 2, 4, 64);
    PagedProblem p = test::random_problem(s, {20, 5}, {1, 1}, 3);
    auto expect = [&](PagedProblem q, const char* what) {
      CAPTURE(what);
      CHECK_THROWS_AS(attn::ref::paged_attention(q.spec, q.args()), InputError);
      CHECK_THROWS_AS(attn::cpu::paged_attention(q.spec, q.args()), InputError);
    };
    {
      PagedProblem q = p;
      q.bt[0] = static_cast<int32_t>(q.spec.cache.num_blocks);
      expect(q, "block table past the cache");
    }
    for (int which = 0; which < 3; ++which) {  // a null pointer is an error, not a crash
      attn::AttnArgs a = p.args();
      if (which == 0) a.k_scale = nullptr;
      if (which == 1) a.v_cache = nullptr;
      if (which == 2) a.q = nullptr;
      CHECK_THROWS_WITH_AS(attn::cpu::paged_attention(p.spec, a), doctest::Contains("a null argument"), InputError);
    }
    for (int64_t tile : {-16, 8, 24, 272}) {
      PagedProblem q = p;
      q.spec.tile = tile;
      expect(q, "tile not a multiple of 16 in [16, 256]");
    }
    {
      PagedProblem q = p;
      q.spec.tile = 16;
      q.spec.convention = AttnConvention::vllm_paged_v1;
      expect(q, "a tile with a convention that has none");
    }
    {
      PagedProblem q = p;
      q.sl[1] = 1000;
      expect(q, "seq_len longer than the table covers");
    }
    {
      PagedProblem q = p;
      q.spec.num_q_heads = 3;
      expect(q, "Hq not a multiple of Hkv");
    }
    {
      PagedProblem q = p;
      q.qsl = {0, 1, 7};
      expect(q, "query_start_loc not ending at T");
    }
    {
      PagedProblem q = p;
      q.spec.softcap = 3;
      q.spec.convention = AttnConvention::flashinfer;
      expect(q, "soft-cap under flashinfer");
    }
    {
      PagedProblem q = p;
      q.sl[1] = 0;
      expect(q, "q_len > seq_len");
    }
  }
}

TEST_SUITE("attention") {
  TEST_CASE("unquantized chunk: exact within the bound; cpu == reference; K/V equal to the cache's give the same bits") {
    uint64_t seed = 400;
    for (Config c : configs())
      for (AttnConvention conv : kAll) {
        if (conv == AttnConvention::flashinfer) continue;
        CAPTURE(c.name);
        CAPTURE(attn::to_string(conv));
        c.spec.convention = conv;
        c.spec.chunk_unquantized = true;
        PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed++, c.csr);
        attn::ref::paged_attention(p.spec, p.args());
        if (conv == AttnConvention::exact) check_exact(p);
        const std::vector<uint8_t> want = p.out;
        std::fill(p.out.begin(), p.out.end(), 0xCD);
        attn::cpu::paged_attention(p.spec, p.args());
        CHECK(p.out == want);
        // k_new / v_new = the dequantized cache values of those positions (bf16/f16 md: deq_md is an md value;
        // f32 md under vllm-paged-v1 would need the f16 detour, so those are skipped) -> the quantized variant's bits
        if (conv == AttnConvention::exact || (c.spec.q_format == Format::f32 && conv == AttnConvention::vllm_paged_v1))
          continue;
        const int64_t H = c.spec.cache.num_kv_heads, Dk = c.spec.cache.head_dim, Dv = c.spec.dv();
        const size_t es = static_cast<size_t>(format_info(c.spec.q_format).bits / 8);
        for (int64_t b = 0; b < p.B; ++b)
          for (int64_t i = 0; i < p.q_lens[b]; ++i) {
            const int64_t j = p.seq_lens[b] - p.q_lens[b] + i, t = p.qsl[b] + i;
            for (int64_t h = 0; h < H; ++h) {
              const int64_t si = kv_scale_index(c.spec, b, h);
              for (int kvsel = 0; kvsel < 2; ++kvsel) {
                if (kvsel && c.spec.v_from_k) continue;
                const int64_t D = kvsel ? Dv : Dk;
                for (int64_t d = 0; d < D; ++d) {
                  const uint8_t code = kvsel ? p.vd[b][(j * H + h) * Dv + d] : p.kd[b][(j * H + h) * Dk + d];
                  const float x = ref::decode_f32(c.spec.cache.format, code) * (kvsel ? p.vs[si] : p.ks[si]);
                  uint32_t xb;
                  std::memcpy(&xb, &x, 4);
                  const uint64_t mb = ref::narrow(Format::f32, xb, c.spec.q_format);
                  std::memcpy(&(kvsel ? p.vnew : p.knew)[static_cast<size_t>((t * H + h) * D + d) * es], &mb, es);
                }
              }
            }
          }
        attn::cpu::paged_attention(p.spec, p.args());
        const std::vector<uint8_t> unq = p.out;
        p.spec.chunk_unquantized = false;
        attn::ref::paged_attention(p.spec, p.args());
        CHECK(unq == p.out);
      }
  }
}

// ---- kv_cache_write ---------------------------------------------------------------------------------------------

namespace {

// Brute force: the code whose value is nearest to v (ties to the even code), among finite codes; beyond the
// largest finite value: satfinite -> ±max, else NaN (e4m3fn) / ±Inf (e5m2) past the midpoint to the next binade.
uint8_t nearest_code(Format f, long double v, bool satfinite) {
  if (std::isnan(v)) return 0x7F;
  const long double maxv = f == Format::e4m3fn ? 448 : 57344;
  const long double lim = f == Format::e4m3fn ? 464 : 61440;
  if (std::fabs(v) >= lim && !satfinite) return f == Format::e4m3fn ? (v < 0 ? 0xFF : 0x7F) : (v < 0 ? 0xFC : 0x7C);
  if (std::fabs(v) > maxv) return f == Format::e4m3fn ? (v < 0 ? 0xFE : 0x7E) : (v < 0 ? 0xFB : 0x7B);
  int best = -1;
  long double bd = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const long double x = fp8_value(f, static_cast<uint8_t>(c));
    if (!std::isfinite(x)) continue;
    if ((c & 0x80) != (std::signbit(v) ? 0x80 : 0)) continue;
    const long double d = std::fabs(x - v);
    if (d < bd || (d == bd && (c & 1) == 0)) {
      bd = d;
      best = c;
    }
  }
  return static_cast<uint8_t>(best);
}

attn::KvWriteSpec kv_spec(attn::StoreConvention conv, Format md, Format cf, int64_t blocks, int64_t bs, int64_t H,
                          int64_t D, attn::KvLayout layout, attn::KvScaleKind kind) {
  attn::KvWriteSpec s;
  s.convention = conv;
  s.model = md;
  s.cache.format = cf;
  s.cache.num_blocks = blocks;
  s.cache.block_size = bs;
  s.cache.num_kv_heads = H;
  s.cache.head_dim = D;
  s.cache.layout = layout;
  s.scale_kind = kind;
  return s;
}

// Element i of an md buffer (f32, bf16 or f16 bit patterns) := x rounded once to md.
void put_md(std::vector<uint8_t>& buf, size_t i, Format md, double x) {
  uint64_t xb;
  std::memcpy(&xb, &x, 8);
  const uint64_t b = ref::narrow(Format::f64, xb, md);
  const size_t es = static_cast<size_t>(format_info(md).bits / 8);
  std::memcpy(&buf[i * es], &b, es);
}


}  // namespace

TEST_SUITE("attention") {
  TEST_CASE("kv_cache_write: every convention against a nearest-code search; slots, skip, layouts, scales") {
    for (attn::StoreConvention conv : {attn::StoreConvention::vllm_cuda, attn::StoreConvention::sglang,
                                       attn::StoreConvention::spyre, attn::StoreConvention::exact})
      for (Format md : {Format::bf16, Format::f16, Format::f32})
        for (Format cf : {Format::e4m3fn, Format::e5m2})
          for (attn::KvScaleKind kind : {attn::KvScaleKind::tensor, attn::KvScaleKind::head, attn::KvScaleKind::seq})
            for (bool dynamic : {false, true}) {
              CAPTURE(attn::to_string(conv));
              CAPTURE(format_name(md));
              CAPTURE(format_name(cf));
              CAPTURE(attn::to_string(kind));
              CAPTURE(dynamic);
              attn::KvWriteSpec s = kv_spec(conv, md, cf, 5, 4, 2, 16,
                                            kind == attn::KvScaleKind::head ? attn::KvLayout::hnd : attn::KvLayout::nhd, kind);
              s.dynamic = dynamic;
              const int64_t T = 9, H = 2, D = 16, B = 2;
              std::mt19937_64 rng(11);
              std::normal_distribution<double> n(0.0, 2.0);
              const size_t es = static_cast<size_t>(format_info(md).bits / 8);
              std::vector<uint8_t> k(static_cast<size_t>(T * H * D) * es), v(k.size());
              for (size_t i = 0; i < k.size() / es; ++i)
                for (auto* buf : {&k, &v}) {
                  double x = n(rng);
                  if (i % 37 == 0) x *= 400;  // overflow under small static scales
                  put_md(*buf, i, md, x);
                }
              std::vector<int64_t> slots = {3, 0, -1, 19, 7, 8, -1, 12, 1};
              std::vector<int32_t> qsl = {0, 4, 9};
              const int64_t ns = attn::num_scales(kind, H, B);
              std::vector<float> ks(static_cast<size_t>(ns)), vs(static_cast<size_t>(ns));
              for (int64_t i = 0; i < ns; ++i) {
                ks[i] = 0.0625f * static_cast<float>(i + 1);
                vs[i] = 0.03125f * static_cast<float>(i + 2);
              }
              std::vector<uint8_t> kc(static_cast<size_t>(s.cache.numel()), 0xAA), vc(kc.size(), 0xAA);
              attn::KvWriteArgs a = kv_args(T, k, v, slots, B, qsl, ks, vs, kc, vc);
              attn::ref::kv_cache_write(s, a);
              // expected scales (dynamic) and codes
              auto md_at = [&](const std::vector<uint8_t>& x, int64_t i) { return static_cast<float>(md_value(md, x, static_cast<size_t>(i))); };
              auto seq_of = [&](int64_t t) { return t < 4 ? 0 : 1; };
              auto sidx = [&](int64_t t, int64_t h) { return kind == attn::KvScaleKind::tensor ? 0 : kind == attn::KvScaleKind::head ? h : seq_of(t); };
              if (dynamic)
                for (int64_t g = 0; g < ns; ++g)
                  for (int kvsel = 0; kvsel < 2; ++kvsel) {
                    float amax = 0;
                    for (int64_t t = 0; t < T; ++t)
                      for (int64_t h = 0; h < H; ++h)
                        if (sidx(t, h) == g)
                          for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(md_at(kvsel ? v : k, (t * H + h) * D + d)));
                    const float want = std::max(round_to(md, amax / (kvsel ? 100.0f : 200.0f)), round_to(md, 1e-5f));
                    CHECK((kvsel ? vs : ks)[static_cast<size_t>(g)] == want);
                  }
              std::vector<bool> written(static_cast<size_t>(s.cache.numel()), false);
              int bad = 0;
              for (int64_t t = 0; t < T; ++t) {
                if (slots[t] < 0) continue;
                for (int64_t h = 0; h < H; ++h)
                  for (int64_t d = 0; d < D; ++d) {
                    const int64_t o = s.cache.offset(slots[t] / 4, slots[t] % 4, h) + d;
                    written[static_cast<size_t>(o)] = true;
                    for (int kvsel = 0; kvsel < 2; ++kvsel) {
                      const float x = md_at(kvsel ? v : k, (t * H + h) * D + d);
                      const float sc = (kvsel ? vs : ks)[static_cast<size_t>(sidx(t, h))];
                      uint8_t want;
                      switch (conv) {
                        case attn::StoreConvention::vllm_cuda: want = nearest_code(cf, x / sc, true); break;
                        case attn::StoreConvention::exact: want = nearest_code(cf, static_cast<long double>(x) / sc, false); break;
                        default: want = nearest_code(cf, round_to(md, x / sc), false); break;
                      }
                      const uint8_t got = (kvsel ? vc : kc)[static_cast<size_t>(o)];
                      if (got != want && bad++ < 3)
                        MESSAGE("t " << t << " h " << h << " d " << d << " x " << x << " s " << sc << ": " << int(got) << " vs " << int(want));
                    }
                  }
              }
              CHECK(bad == 0);
              for (size_t i = 0; i < written.size(); ++i)
                if (!written[i]) CHECK((kc[i] == 0xAA && vc[i] == 0xAA));  // skipped / unused slots untouched
              // cpu backend: the same bytes
              std::vector<uint8_t> kc2(kc.size(), 0xAA), vc2(kc.size(), 0xAA);
              std::vector<float> ks2 = ks, vs2 = vs;
              a.k_cache = kc2.data();
              a.v_cache = vc2.data();
              a.k_scale = ks2.data();
              a.v_scale = vs2.data();
              attn::cpu::kv_cache_write(s, a);
              CHECK(kc2 == kc);
              CHECK(vc2 == vc);
            }
  }

  TEST_CASE("kv_cache_write cpu (vector codes per block, then rows to slots) == reference, adversarial") {
    // src/cpu/attention_cpu.cc computes each block of 512 tokens' codes with vector kernels (vllm-cuda:
    // cpu::quantize_static; sglang/spyre: the md quotient in lanes + the vector torch cast; exact: f64 quotients + the
    // vector exact cast; dynamic scales from vector row maxima), then copies rows to their slots in token order.
    // Inputs: random magnitudes over many binades, ±0, ±Inf, ±NaN, values at the saturation bound; static scales
    // including 0, −0, negative, NaN, Inf, subnormal and huge; dynamic scales (a NaN in some groups under the seq kind);
    // slot_mapping with −1 and a slot written twice (the last write wins); T = 560 (two blocks); D = 40 (a vector
    // tail on every target); both cache formats, every model dtype, scale kind and convention, both layouts.
    // Oracle: attn::ref::kv_cache_write (codes and, dynamic, the scales it writes).
    std::mt19937_64 rng(909);
    const float odd_scales[] = {0.0f, -0.0f, -0.5f, NAN, INFINITY, 1e-40f, 3e38f, 0.0078125f, 1.7f, 1e-20f};
    int cases = 0;
    for (attn::StoreConvention conv : {attn::StoreConvention::vllm_cuda, attn::StoreConvention::sglang,
                                       attn::StoreConvention::spyre, attn::StoreConvention::exact})
    for (bool dynamic : {false, true})
    for (Format cf : {Format::e4m3fn, Format::e5m2})
      for (Format md : {Format::bf16, Format::f16, Format::f32})
        for (attn::KvScaleKind kind : {attn::KvScaleKind::tensor, attn::KvScaleKind::head, attn::KvScaleKind::seq}) {
          CAPTURE(attn::to_string(conv));
          CAPTURE(dynamic);
          CAPTURE(format_name(cf));
          CAPTURE(format_name(md));
          CAPTURE(attn::to_string(kind));
          attn::KvWriteSpec s = kv_spec(conv, md, cf, 80, 16, 2, 40,
                                        (cases & 1) ? attn::KvLayout::hnd : attn::KvLayout::nhd, kind);
          s.dynamic = dynamic;
          const int64_t T = 560, H = 2, D = 40, B = 3;
          const size_t es = static_cast<size_t>(format_info(md).bits / 8);
          std::vector<uint8_t> k(static_cast<size_t>(T * H * D) * es), v(k.size());
          std::normal_distribution<double> n(0.0, 1.0);
          for (size_t i = 0; i < k.size() / es; ++i)
            for (auto* buf : {&k, &v}) {
              double x = std::ldexp(n(rng), static_cast<int>(rng() % 40) - 20);
              // dynamic scales: Inf and NaN only in token 400 (sequence 1 alone) under the seq kind, so that the other
              // groups keep finite scales; static: anywhere
              const bool special = !dynamic || (kind == attn::KvScaleKind::seq && i / static_cast<size_t>(H * D) == 400);
              switch (rng() % 64) {
                case 0: x = 0.0; break;
                case 1: x = -0.0; break;
                case 2: x = special ? ((rng() & 1) ? HUGE_VAL : -HUGE_VAL) : x; break;
                case 3: x = special ? ((rng() & 1) ? std::nan("") : -std::nan("")) : x; break;
                case 4: x = (rng() & 1) ? 448.0 : -57344.0; break;
                default: break;
              }
              put_md(*buf, i, md, x);
            }
          std::vector<int64_t> slots(static_cast<size_t>(T));
          for (int64_t t = 0; t < T; ++t) slots[static_cast<size_t>(t)] = (t % 97 == 5) ? -1 : (t * 7) % (80 * 16);
          slots[17] = slots[3];  // written twice: the later token wins
          std::vector<int32_t> qsl = {0, 400, 401, static_cast<int32_t>(T)};
          const int64_t ns = attn::num_scales(kind, H, B);
          std::vector<float> ks(static_cast<size_t>(ns)), vs(ks.size());
          for (size_t i = 0; i < ks.size(); ++i) {
            ks[i] = std::ldexp(1.0f + static_cast<float>(rng() % 100) / 100.0f, static_cast<int>(rng() % 30) - 15);
            vs[i] = odd_scales[(cases + i) % 10];
          }
          std::vector<uint8_t> kc(static_cast<size_t>(s.cache.numel()), 0xAA), vc(kc.size(), 0xAA);
          std::vector<uint8_t> kc2 = kc, vc2 = vc;
          std::vector<float> ks2 = ks, vs2 = vs;
          attn::KvWriteArgs a = kv_args(T, k, v, slots, B, qsl, ks, vs, kc, vc);
          attn::ref::kv_cache_write(s, a);
          a.k_cache = kc2.data();
          a.v_cache = vc2.data();
          a.k_scale = ks2.data();
          a.v_scale = vs2.data();
          attn::cpu::kv_cache_write(s, a);
          CHECK(kc2 == kc);
          CHECK(vc2 == vc);
          CHECK(std::memcmp(ks2.data(), ks.data(), ks.size() * 4) == 0);  // dynamic: the same scale bits
          CHECK(std::memcmp(vs2.data(), vs.data(), vs.size() * 4) == 0);
          ++cases;
        }
    CHECK(cases == 4 * 2 * 2 * 3 * 3);
  }

  TEST_CASE("kv_cache_write cpu == reference on every compiled SIMD target (md quotient lanes, row maxima)") {
    // The vector kernels of the cpu write (KvMdQuotRows: x/s, RN_md — f16 by Highway's DemoteTo, emulated on targets
    // without F16C —; KvRowAbsMax) on every target this build dispatches to: random values over many binades (f16
    // overflow and subnormal quotients included), ±0, ±Inf, NaN, D = 40 (vector tails), static and dynamic scales.
    std::vector<std::string> seen;
    std::mt19937_64 rng(4242);
    for (attn::StoreConvention conv : {attn::StoreConvention::sglang, attn::StoreConvention::spyre,
                                       attn::StoreConvention::vllm_cuda, attn::StoreConvention::exact})
      for (Format md : {Format::bf16, Format::f16, Format::f32})
        for (bool dynamic : {false, true}) {
          CAPTURE(attn::to_string(conv));
          CAPTURE(format_name(md));
          CAPTURE(dynamic);
          attn::KvWriteSpec s = kv_spec(conv, md, Format::e4m3fn, 4, 16, 2, 40, attn::KvLayout::nhd, attn::KvScaleKind::head);
          s.dynamic = dynamic;
          const int64_t T = 50, H = 2, D = 40;
          const size_t es = static_cast<size_t>(format_info(md).bits / 8);
          std::vector<uint8_t> k(static_cast<size_t>(T * H * D) * es), v(k.size());
          std::normal_distribution<double> n(0.0, 1.0);
          for (size_t i = 0; i < k.size() / es; ++i)
            for (auto* buf : {&k, &v}) {
              double x = std::ldexp(n(rng), static_cast<int>(rng() % 48) - 24);
              switch (rng() % 50) {
                case 0: x = -0.0; break;
                case 1: x = dynamic ? x : HUGE_VAL; break;
                case 2: x = dynamic ? x : std::nan(""); break;
                default: break;
              }
              put_md(*buf, i, md, x);
            }
          std::vector<int64_t> slots(static_cast<size_t>(T));
          for (int64_t t = 0; t < T; ++t) slots[static_cast<size_t>(t)] = (t * 5) % 64;
          std::vector<int32_t> qsl = {0, static_cast<int32_t>(T)};
          std::vector<float> ks = {3e-5f, 0.37f}, vs = {1e-3f, 2.5f};
          std::vector<uint8_t> kc(static_cast<size_t>(s.cache.numel()), 0xAA), vc(kc.size(), 0xAA);
          attn::KvWriteArgs a = kv_args(T, k, v, slots, 1, qsl, ks, vs, kc, vc);
          attn::ref::kv_cache_write(s, a);
          seen = fp8ref::test::for_test_targets([&] {
            std::vector<uint8_t> kc2(kc.size(), 0xAA), vc2(kc.size(), 0xAA);
            std::vector<float> ks2 = {3e-5f, 0.37f}, vs2 = {1e-3f, 2.5f};
            attn::KvWriteArgs b = kv_args(T, k, v, slots, 1, qsl, ks2, vs2, kc2, vc2);
            attn::cpu::kv_cache_write(s, b);
            CHECK(kc2 == kc);
            CHECK(vc2 == vc);
            CHECK(std::memcmp(ks2.data(), ks.data(), 8) == 0);
            CHECK(std::memcmp(vs2.data(), vs.data(), 8) == 0);
          });
        }
    CHECK(seen.size() >= 1);
  }

  TEST_CASE("kv_cache_write sglang/spyre: RN_md before the cast — md ties just above an FP8 tie, cpu == reference") {
    // RN32(x/s) = t + half an md ulp, with t an FP8 rounding tie: RN_md (RNE) goes down to t, the FP8 cast then
    // rounds t to the even code; a single rounding (or rounding the md tie up) gives the other code. One token per
    // target (its own sequence, scale kind seq), x = 1 in md, s = RN32(1/v) searched so that RN32(1/s) = v.
    for (Format md : {Format::bf16, Format::f16})
      for (Format cf : {Format::e4m3fn, Format::e5m2}) {
        CAPTURE(format_name(md));
        CAPTURE(format_name(cf));
        const int md_frac = md == Format::bf16 ? 7 : 10, fp8_frac = cf == Format::e4m3fn ? 3 : 2;
        std::vector<float> scales;
        std::vector<bool> lower_even;  // the tie's lower code is even: RN_md then RNE keeps it, one rounding goes up
        for (int e = -3; e <= 3; ++e)
          for (int m = 0; m < (1 << fp8_frac); ++m) {
            // the FP8 tie between codes of mantissa m and m + 1 in binade 2^e, plus half an md ulp
            const float v = std::ldexp(1.0f + (2.0f * m + 1) / (2 << fp8_frac) + std::ldexp(1.0f, -md_frac - 1), e);
            float sc = 1.0f / v;
            for (int i = 0; i < 8 && 1.0f / sc != v; ++i) sc = std::nextafter(sc, (i & 1) ? 0.0f : 2.0f * sc);
            if (1.0f / sc == v) {
              scales.push_back(sc);
              lower_even.push_back(m % 2 == 0);
            }
          }
        REQUIRE(scales.size() >= 20);
        const int64_t T = static_cast<int64_t>(scales.size()), H = 1, D = 16;
        const uint16_t one = md == Format::bf16 ? 0x3F80 : 0x3C00;
        std::vector<uint8_t> k(static_cast<size_t>(T * H * D) * 2), v(k.size());
        for (size_t i = 0; i < k.size() / 2; ++i) {
          std::memcpy(&k[2 * i], &one, 2);
          std::memcpy(&v[2 * i], &one, 2);
        }
        std::vector<int64_t> slots(static_cast<size_t>(T));
        std::vector<int32_t> qsl(static_cast<size_t>(T + 1));
        for (int64_t t = 0; t <= T; ++t) qsl[static_cast<size_t>(t)] = static_cast<int32_t>(t);
        for (int64_t t = 0; t < T; ++t) slots[static_cast<size_t>(t)] = t;
        for (attn::StoreConvention conv : {attn::StoreConvention::sglang, attn::StoreConvention::spyre}) {
          const attn::KvWriteSpec s = kv_spec(conv, md, cf, (T + 15) / 16, 16, H, D, attn::KvLayout::nhd, attn::KvScaleKind::seq);
          std::vector<float> ks = scales, vs = scales;
          std::vector<uint8_t> kc(static_cast<size_t>(s.cache.numel()), 0xAA), vc(kc.size(), 0xAA), kc2 = kc, vc2 = vc;
          attn::KvWriteArgs a = kv_args(T, k, v, slots, T, qsl, ks, vs, kc, vc);
          attn::ref::kv_cache_write(s, a);
          a.k_cache = kc2.data();
          a.v_cache = vc2.data();
          attn::cpu::kv_cache_write(s, a);
          CHECK(kc2 == kc);
          CHECK(vc2 == vc);
          // non-vacuous: against one rounding of RN32(x/s), the code differs exactly where the tie's lower code is even
          int wrong = 0, differs = 0;
          for (int64_t t = 0; t < T; ++t) {
            const bool d = kc[static_cast<size_t>(s.cache.offset(t / 16, t % 16, 0))] !=
                           nearest_code(cf, 1.0f / scales[static_cast<size_t>(t)], false);
            wrong += d != lower_even[static_cast<size_t>(t)];
            differs += d;
          }
          CHECK(wrong == 0);
          CHECK(differs >= T / 3);
        }
      }
  }

  TEST_CASE("kv_cache_write: bad input") {
    attn::KvWriteSpec s;
    s.cache.num_blocks = 2;
    s.cache.block_size = 4;
    s.cache.num_kv_heads = 1;
    s.cache.head_dim = 8;
    std::vector<uint16_t> k(8, 0), v(8, 0);
    std::vector<int64_t> slots = {8};
    float ks = 1, vs = 1;
    std::vector<uint8_t> kc(64, 0), vc(64, 0);
    attn::KvWriteArgs a;
    a.num_tokens = 1;
    a.k = k.data();
    a.v = v.data();
    a.slot_mapping = slots.data();
    a.k_scale = &ks;
    a.v_scale = &vs;
    a.k_cache = kc.data();
    a.v_cache = vc.data();
    CHECK_THROWS_AS(attn::ref::kv_cache_write(s, a), InputError);  // slot 8 of 2x4 slots
    slots[0] = 3;
    s.scale_kind = attn::KvScaleKind::seq;
    a.num_seqs = 1;
    std::vector<int32_t> qsl = {0, 2};
    a.query_start_loc = qsl.data();
    CHECK_THROWS_AS(attn::ref::kv_cache_write(s, a), InputError);  // query_start_loc ends at 2, not T = 1
    CHECK(std::all_of(kc.begin(), kc.end(), [](uint8_t c) { return c == 0; }));
  }
}
