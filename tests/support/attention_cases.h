// Paged-attention test problems: logical (dense) per-sequence K/V codes placed into a paged cache through a
// shuffled, non-contiguous page table (dense block_table or FlashInfer CSR), every other cache byte a NaN code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"

namespace fp8ref::test {

struct PagedProblem {
  attn::AttnSpec spec;
  int64_t B = 0, T = 0;
  bool csr = false;
  std::vector<int64_t> seq_lens, q_lens;
  std::vector<std::vector<uint8_t>> kd, vd;  // per sequence [seq_len, Hkv, D] codes (vd empty with v_from_k)
  std::vector<uint8_t> kc, vc;               // the caches
  std::vector<float> ks, vs;
  std::vector<uint8_t> q;                    // [T, Hq, Dk] md bytes
  std::vector<int32_t> qsl, bt, sl, indptr, indices, last;
  std::vector<uint8_t> out;                  // [T, Hq, Dv] out bytes
  std::vector<uint8_t> knew, vnew;           // chunk_unquantized: [T, Hkv, Dk] / [T, Hkv, Dv] md bytes

  attn::AttnArgs args() {
    attn::AttnArgs a;
    a.num_seqs = B;
    a.num_tokens = T;
    a.q = q.data();
    a.query_start_loc = qsl.data();
    if (csr) {
      a.table.indptr = indptr.data();
      a.table.indices = indices.data();
      a.table.num_indices = static_cast<int64_t>(indices.size());
      a.table.last_page_len = last.data();
    } else {
      a.table.block_table = bt.data();
      a.table.max_blocks = B ? static_cast<int64_t>(bt.size()) / B : 0;
      a.table.seq_lens = sl.data();
    }
    a.k_cache = kc.data();
    a.v_cache = vc.data();
    a.k_scale = ks.data();
    a.v_scale = vs.data();
    a.out = out.data();
    a.k_new = knew.empty() ? nullptr : knew.data();
    a.v_new = vnew.empty() ? nullptr : vnew.data();
    return a;
  }
  size_t out_elem() const { return static_cast<size_t>(format_info(spec.out_format).bits / 8); }
};

inline uint8_t nan_code(Format) { return 0x7F; }  // e4m3fn and e5m2: 0x7F is a NaN

// A random finite code (no NaN/Inf) of moderate magnitude: |value| <= 2^4 roughly.
inline uint8_t random_code(Format f, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, 3.0);
  ConversionSpec s;
  s.to = f;
  s.overflow = Overflow::satfinite;
  return ref::encode_f64(n(rng), s);
}

// Places dense per-sequence codes into a paged cache: pages are a random permutation of the cache's blocks
// (extra unused blocks included), every byte outside the valid slots is a NaN code.
inline void place_pages(PagedProblem& p, std::mt19937_64& rng, int64_t max_blocks_extra = 1, int64_t extra_blocks = 3) {
  const attn::CacheShape& c = p.spec.cache;
  const int64_t bs = c.block_size, H = c.num_kv_heads, Dk = c.head_dim, Dv = p.spec.dv();
  std::vector<int64_t> need(static_cast<size_t>(p.B));
  int64_t total = 0, maxneed = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    need[b] = (p.seq_lens[b] + bs - 1) / bs;
    total += need[b];
    maxneed = std::max(maxneed, need[b]);
  }
  p.spec.cache.num_blocks = total + extra_blocks;
  std::vector<int32_t> perm(static_cast<size_t>(p.spec.cache.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.kc.assign(static_cast<size_t>(p.spec.cache.numel()), nan_code(c.format));
  attn::CacheShape vshape = p.spec.cache;
  vshape.head_dim = Dv;
  p.vc.assign(p.spec.v_from_k ? 0 : static_cast<size_t>(vshape.numel()), nan_code(c.format));
  const int64_t mb = maxneed + max_blocks_extra;
  p.bt.assign(static_cast<size_t>(p.B * mb), -1);  // entries past what a sequence needs stay −1 (never read)
  p.sl.assign(static_cast<size_t>(p.B), 0);
  p.indptr.assign(1, 0);
  p.indices.clear();
  p.last.assign(static_cast<size_t>(p.B), 1);
  size_t next = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    p.sl[b] = static_cast<int32_t>(p.seq_lens[b]);
    for (int64_t i = 0; i < need[b]; ++i) {
      const int32_t page = perm[next++];
      p.bt[b * mb + i] = page;
      p.indices.push_back(page);
    }
    p.indptr.push_back(static_cast<int32_t>(p.indices.size()));
    p.last[b] = static_cast<int32_t>(need[b] ? p.seq_lens[b] - (need[b] - 1) * bs : 1);
    for (int64_t j = 0; j < p.seq_lens[b]; ++j) {
      const int64_t page = p.bt[b * mb + j / bs];
      for (int64_t h = 0; h < H; ++h) {
        const int64_t o = p.spec.cache.offset(page, j % bs, h);
        std::memcpy(&p.kc[o], &p.kd[b][(j * H + h) * Dk], Dk);
        if (!p.spec.v_from_k) std::memcpy(&p.vc[vshape.offset(page, j % bs, h)], &p.vd[b][(j * H + h) * Dv], Dv);
      }
    }
  }
}

// A random problem: codes, scales (2^[-5,-2)·[1,2), f32), queries ~ N(0, 1) rounded to md.
inline PagedProblem random_problem(const attn::AttnSpec& spec, const std::vector<int64_t>& seq_lens,
                                   const std::vector<int64_t>& q_lens, uint64_t seed, bool csr = false) {
  PagedProblem p;
  p.spec = spec;
  p.B = static_cast<int64_t>(seq_lens.size());
  p.csr = csr;
  p.seq_lens = seq_lens;
  p.q_lens = q_lens;
  std::mt19937_64 rng(seed);
  const int64_t H = spec.cache.num_kv_heads, Dk = spec.cache.head_dim, Dv = spec.dv();
  p.kd.resize(static_cast<size_t>(p.B));
  p.vd.resize(static_cast<size_t>(p.B));
  for (int64_t b = 0; b < p.B; ++b) {
    p.kd[b].resize(static_cast<size_t>(seq_lens[b] * H * Dk));
    for (auto& x : p.kd[b]) x = random_code(spec.cache.format, rng);
    if (!spec.v_from_k) {
      p.vd[b].resize(static_cast<size_t>(seq_lens[b] * H * Dv));
      for (auto& x : p.vd[b]) x = random_code(spec.cache.format, rng);
    }
  }
  const int64_t ns = attn::num_scales(spec.scale_kind, H, p.B);
  std::uniform_real_distribution<double> u(1.0, 2.0);
  for (int64_t i = 0; i < ns; ++i) {
    p.ks.push_back(static_cast<float>(std::ldexp(u(rng), -5 + static_cast<int>(rng() % 3))));
    p.vs.push_back(static_cast<float>(std::ldexp(u(rng), -5 + static_cast<int>(rng() % 3))));
  }
  p.qsl.assign(1, 0);
  for (int64_t b = 0; b < p.B; ++b) p.qsl.push_back(static_cast<int32_t>(p.qsl.back() + q_lens[b]));
  p.T = p.qsl.back();
  const size_t es = static_cast<size_t>(format_info(spec.q_format).bits / 8);
  p.q.resize(static_cast<size_t>(p.T * spec.num_q_heads * Dk) * es);
  std::normal_distribution<double> n(0.0, 1.0);
  for (size_t i = 0; i < p.q.size() / es; ++i) {
    const double v = n(rng);
    uint64_t vb;
    std::memcpy(&vb, &v, 8);
    const uint64_t b = ref::narrow(Format::f64, vb, spec.q_format);
    std::memcpy(&p.q[i * es], &b, es);
  }
  place_pages(p, rng);
  if (spec.chunk_unquantized) {  // the chunk's own K/V in md, ~N(0, 0.05): the magnitude of the dequantized cache
    for (auto* buf : {&p.knew, &p.vnew}) {
      const int64_t d = buf == &p.knew ? Dk : Dv;
      buf->resize(static_cast<size_t>(p.T * H * d) * es);
      for (size_t i = 0; i < buf->size() / es; ++i) {
        const double v = 0.05 * n(rng);
        uint64_t vb;
        std::memcpy(&vb, &v, 8);
        const uint64_t b = ref::narrow(Format::f64, vb, spec.q_format);
        std::memcpy(&(*buf)[i * es], &b, es);
      }
    }
  }
  p.out.assign(static_cast<size_t>(p.T * spec.num_q_heads * Dv) * p.out_elem(), 0xCD);
  return p;
}

struct AttnConfig {
  const char* name;
  attn::AttnSpec spec;
  std::vector<int64_t> seq_lens, q_lens;
  bool csr = false;
};

inline attn::AttnSpec base_attn_spec(int64_t bs, int64_t hkv, int64_t hq, int64_t d) {
  attn::AttnSpec s;
  s.cache.block_size = bs;
  s.cache.num_kv_heads = hkv;
  s.cache.head_dim = d;
  s.num_q_heads = hq;
  return s;
}

// The shared configurations of the paged-attention tests (every convention, and fast).
inline std::vector<AttnConfig> attention_configs() {
  std::vector<AttnConfig> c;
  // mixed decode and chunked prefill, an empty sequence, kv_len % block_size != 0
  for (int64_t bs : {1, 16, 64}) c.push_back({"mixed", base_attn_spec(bs, 2, 4, 64), {37, 1, 0, 70, 12}, {1, 1, 0, 5, 12}});
  c.push_back({"gqa8", base_attn_spec(16, 1, 8, 128), {70, 33}, {1, 3}});
  c.push_back({"d256", base_attn_spec(16, 2, 2, 256), {40}, {2}});
  {
    AttnConfig m{"mla", base_attn_spec(64, 1, 4, 576), {90, 3}, {1, 2}};
    m.spec.head_dim_v = 512;
    m.spec.v_from_k = true;
    c.push_back(m);
  }
  {
    AttnConfig m{"csr-hnd", base_attn_spec(16, 2, 4, 64), {50, 16, 17}, {1, 4, 17}, true};
    m.spec.cache.layout = attn::KvLayout::hnd;
    c.push_back(m);
  }
  {
    AttnConfig m{"window-topleft-f16-e5m2-headscale", base_attn_spec(16, 2, 4, 64), {60, 30}, {6, 1}};
    m.spec.window_left = 9;
    m.spec.causal = attn::Causal::top_left;
    m.spec.q_format = m.spec.out_format = Format::f16;
    m.spec.cache.format = Format::e5m2;
    m.spec.scale_kind = attn::KvScaleKind::head;
    c.push_back(m);
  }
  {
    AttnConfig m{"f32-seqscale-nocausal-outf32", base_attn_spec(16, 1, 2, 64), {45, 20}, {3, 2}};
    m.spec.q_format = Format::f32;
    m.spec.out_format = Format::f32;
    m.spec.causal = attn::Causal::none;
    m.spec.scale_kind = attn::KvScaleKind::seq;
    m.spec.sm_scale = 0.3;
    c.push_back(m);
  }
  return c;
}

// The arguments of a kv_cache_write over these buffers.
inline attn::KvWriteArgs kv_args(int64_t T, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v,
                                 const std::vector<int64_t>& slots, int64_t B, const std::vector<int32_t>& qsl,
                                 std::vector<float>& ks, std::vector<float>& vs, std::vector<uint8_t>& kc,
                                 std::vector<uint8_t>& vc) {
  attn::KvWriteArgs a;
  a.num_tokens = T;
  a.k = k.data();
  a.v = v.data();
  a.slot_mapping = slots.data();
  a.num_seqs = B;
  a.query_start_loc = qsl.data();
  a.k_scale = ks.data();
  a.v_scale = vs.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  return a;
}

// An output element (f32, or a bf16/f16 bit pattern) as a double.
inline double out_value(Format f, const uint8_t* p) {
  if (f == Format::f32) {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t b = static_cast<uint32_t>(ref::narrow(f, h, Format::f32));
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

}  // namespace fp8ref::test
