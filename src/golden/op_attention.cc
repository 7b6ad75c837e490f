// fp8ref — the `kv_cache_write` and `paged_attention` ops in the registry (contract: include/fp8ref/attention.h).
//
//   kv_cache_write convention=vllm-cuda model=bf16 cache=e4m3fn tokens=20 seqs=2 num-blocks=8 block-size=16 ...
//     tensors: input.k, input.v [T, Hkv, D] (model dtype); input.slot_mapping [T] I64 (a random injective map into
//              the cache's slots, every 5th token −1); input.query_start_loc [B+1] I32 (the tokens split evenly);
//              input.k_cache, input.v_cache (F8, the cache before: random finite codes); mode=static:
//              input.k_scale, input.v_scale [n] F32; outputs: output.k_cache, output.v_cache (the cache after);
//              mode=dynamic: output.k_scale, output.v_scale.
//   paged_attention convention=vllm-triton-unified md=bf16 seq-lens=37,1,0,100 q-lens=1,1,0,5 ...
//     tensors: input.q [T, Hq, Dk] (md); input.query_start_loc [B+1] I32; table=dense: input.block_table
//              [B, max_blocks] I32 (pages shuffled; entries past a sequence's need are −1) and input.seq_lens [B] I32;
//              table=csr: input.kv_indptr [B+1], input.kv_indices [nnz], input.kv_last_page_len [B] (I32);
//              input.k_cache (F8 [cache shape]; every slot outside the sequences is NaN 0x7F), input.v_cache (absent
//              with mla=1: V = K[..., :Dv]), input.k_scale, input.v_scale [n] F32 (v_scale absent with mla=1);
//              chunk=unquantized: input.k_new [T, Hkv, Dk], input.v_new [T, Hkv, Dv] (md; v_new absent with mla=1);
//              output.out [T, Hq, Dv] (out dtype); exact.out (F64, the exact convention's f64 result);
//              convention=fast: output.out is the exact convention's (contract "bound") and bound.out (F64) the
//              fast bound (src/cpu/attention_fast.h) plus |output.out − exact.out|.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>

#include "cpu/attention_fast.h"
#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "golden/ops.h"

namespace fp8ref::golden {

namespace {

Format format_key(const Descriptor& d, const char* key) {
  Format f;
  if (!parse_format(d.get(key), &f)) throw InputError(where(d) + "unknown format '" + d.get(key) + "' for " + key);
  return f;
}

int64_t int_key(const Descriptor& d, const char* key, int64_t lo, int64_t hi) {
  const std::string& v = d.get(key);
  size_t pos = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos != v.size() || x < lo || x > hi)
    throw InputError(where(d) + key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], not '" + v + "'");
  return x;
}

double real_key(const Descriptor& d, const char* key) {
  const std::string& v = d.get(key);
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos != v.size() || !std::isfinite(x)) throw InputError(where(d) + key + " must be a number, not '" + v + "'");
  return x;
}

std::vector<int64_t> list_key(const Descriptor& d, const char* key) {
  std::vector<int64_t> out;
  const std::string& v = d.get(key);
  size_t i = 0;
  while (i <= v.size()) {
    const size_t j = std::min(v.find(',', i), v.size());
    const std::string t = v.substr(i, j - i);
    size_t pos = 0;
    int64_t x = -1;
    try {
      x = std::stoll(t, &pos);
    } catch (...) {
      pos = 0;
    }
    if (t.empty() || pos != t.size() || x < 0 || x > (int64_t{1} << 24))
      throw InputError(where(d) + key + " is a comma-separated list of integers in [0, 2^24], not '" + v + "'");
    out.push_back(x);
    i = j + 1;
  }
  return out;
}

template <typename E>
E enum_key(const Descriptor& d, const char* key, bool (*parse)(std::string_view, E*), const char* choices) {
  E e;
  if (!parse(d.get(key), &e)) throw InputError(where(d) + "unknown " + key + " '" + d.get(key) + "' (" + choices + ")");
  return e;
}

template <typename T>
io::Tensor int_tensor(const std::string& name, io::DType dt, const std::vector<int64_t>& shape, const std::vector<T>& v) {
  io::Tensor t = io::make_tensor(name, dt, shape);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

// A random finite code, |value| mostly below 16 (normal(0, 3) rounded, saturating).
uint8_t random_code(Format f, Rng& rng) {
  ConversionSpec s;
  s.to = f;
  s.overflow = Overflow::satfinite;
  return ref::encode_f64(rng.normal() * 3.0, s);
}

// ---- kv_cache_write -----------------------------------------------------------------------------------------------

struct WriteCase {
  attn::KvWriteSpec spec;
  int64_t T = 0, B = 1;
  std::vector<int64_t> kv_shape;  // [T, Hkv, D]
  int64_t n_scales = 1;
};

WriteCase parse_write(const Descriptor& d) {
  WriteCase c;
  c.spec.convention = enum_key(d, "convention", attn::parse_store_convention, "vllm-cuda, sglang, spyre, exact");
  c.spec.model = format_key(d, "model");
  c.spec.cache.format = format_key(d, "cache");
  c.spec.cache.layout = enum_key(d, "layout", attn::parse_kv_layout, "nhd, hnd");
  c.spec.cache.num_blocks = int_key(d, "num-blocks", 1, 1 << 20);
  c.spec.cache.block_size = int_key(d, "block-size", 1, 1024);
  c.spec.cache.num_kv_heads = int_key(d, "kv-heads", 1, 256);
  c.spec.cache.head_dim = int_key(d, "head-dim", 1, 4096);
  c.spec.scale_kind = enum_key(d, "scale-kind", attn::parse_kv_scale_kind, "tensor, head, seq");
  const std::string& mode = d.get("mode");
  if (mode != "static" && mode != "dynamic") throw InputError(where(d) + "mode is static or dynamic, not '" + mode + "'");
  c.spec.dynamic = mode == "dynamic";
  c.T = int_key(d, "tokens", 0, 1 << 20);
  c.B = int_key(d, "seqs", 1, 1 << 16);
  if (c.T > c.spec.cache.num_blocks * c.spec.cache.block_size)
    throw InputError(where(d) + "more tokens than cache slots");
  c.kv_shape = {c.T, c.spec.cache.num_kv_heads, c.spec.cache.head_dim};
  c.n_scales = attn::num_scales(c.spec.scale_kind, c.spec.cache.num_kv_heads, c.B);
  if (c.spec.model != Format::f32 && c.spec.model != Format::bf16 && c.spec.model != Format::f16)
    throw InputError(where(d) + "model is f32, bf16 or f16");
  if (c.spec.cache.format != Format::e4m3fn && c.spec.cache.format != Format::e5m2)
    throw InputError(where(d) + "cache is e4m3fn or e5m2");
  return c;
}

Tensors run_write(const Descriptor& d, const Tensors& in, bool cpu) {
  const WriteCase c = parse_write(d);
  const io::DType md = io::format_dtype(c.spec.model), cd = io::format_dtype(c.spec.cache.format);
  const io::Tensor& k = find_input(d, in, "input.k", md, c.kv_shape);
  const io::Tensor& v = find_input(d, in, "input.v", md, c.kv_shape);
  const io::Tensor& sm = find_input(d, in, "input.slot_mapping", io::DType::I64, {c.T});
  const io::Tensor& qsl = find_input(d, in, "input.query_start_loc", io::DType::I32, {c.B + 1});
  io::Tensor kc = find_input(d, in, "input.k_cache", cd, c.spec.cache.shape());
  io::Tensor vc = find_input(d, in, "input.v_cache", cd, c.spec.cache.shape());
  kc.name = "output.k_cache";
  vc.name = "output.v_cache";
  io::Tensor ks = io::make_tensor("output.k_scale", io::DType::F32, {c.n_scales});
  io::Tensor vs = io::make_tensor("output.v_scale", io::DType::F32, {c.n_scales});
  if (!c.spec.dynamic) {
    ks.data = find_input(d, in, "input.k_scale", io::DType::F32, {c.n_scales}).data;
    vs.data = find_input(d, in, "input.v_scale", io::DType::F32, {c.n_scales}).data;
  }
  attn::KvWriteArgs a;
  a.num_tokens = c.T;
  a.k = k.data.data();
  a.v = v.data.data();
  a.slot_mapping = reinterpret_cast<const int64_t*>(sm.data.data());
  a.num_seqs = c.B;
  a.query_start_loc = reinterpret_cast<const int32_t*>(qsl.data.data());
  a.k_scale = reinterpret_cast<float*>(ks.data.data());
  a.v_scale = reinterpret_cast<float*>(vs.data.data());
  a.k_cache = kc.data.data();
  a.v_cache = vc.data.data();
  if (cpu) attn::cpu::kv_cache_write(c.spec, a);
  else attn::ref::kv_cache_write(c.spec, a);
  if (c.spec.dynamic) return {kc, vc, ks, vs};
  return {kc, vc};
}

// ---- paged_attention ----------------------------------------------------------------------------------------------

struct AttnCase {
  attn::AttnSpec spec;
  std::vector<int64_t> seq_lens, q_lens;
  bool csr = false;
  int64_t B = 0, T = 0, max_blocks = 0, nnz = 0, n_scales = 1;
};

AttnCase parse_attn(const Descriptor& d) {
  AttnCase c;
  attn::AttnSpec& s = c.spec;
  s.convention = enum_key(d, "convention", attn::parse_attn_convention,
                          "exact, vllm-paged-v1, vllm-triton-unified, flashinfer, torch-sdpa-math, spyre, fast");
  s.q_format = format_key(d, "md");
  s.out_format = format_key(d, "out");
  s.cache.format = format_key(d, "cache");
  s.cache.layout = enum_key(d, "layout", attn::parse_kv_layout, "nhd, hnd");
  s.cache.block_size = int_key(d, "block-size", 1, 1024);
  s.cache.num_kv_heads = int_key(d, "kv-heads", 1, 256);
  s.num_q_heads = int_key(d, "q-heads", 1, 4096);
  s.cache.head_dim = int_key(d, "head-dim", 1, 4096);
  s.head_dim_v = int_key(d, "head-dim-v", 0, 4096);
  s.v_from_k = int_key(d, "mla", 0, 1) == 1;
  s.sm_scale = real_key(d, "sm-scale");
  s.causal = enum_key(d, "causal", attn::parse_causal, "bottom-right, top-left, none");
  s.window_left = int_key(d, "window-left", -1, 1 << 24);
  s.softcap = real_key(d, "softcap");
  s.out_scale = real_key(d, "out-scale");
  s.scale_kind = enum_key(d, "scale-kind", attn::parse_kv_scale_kind, "tensor, head, seq");
  s.torch_lanes = static_cast<int>(int_key(d, "torch-lanes", 8, 16));
  s.tile = int_key(d, "tile", 0, 256);
  s.segments = int_key(d, "segments", -1, 64);
  s.kv_chunk = int_key(d, "kv-chunk", -1, 1 << 24);
  s.fi_kernel = enum_key(d, "fi-kernel", attn::parse_fi_kernel, "auto, prefill, decode");
  s.cta_tile_q = int_key(d, "cta-tile-q", 0, 128);
  s.prefill_kv_chunk = int_key(d, "prefill-kv-chunk", -1, 1 << 24);
  const std::string& chunk = d.get("chunk");
  if (chunk != "quantized" && chunk != "unquantized")
    throw InputError(where(d) + "chunk is quantized or unquantized, not '" + chunk + "'");
  s.chunk_unquantized = chunk == "unquantized";
  const std::string& table = d.get("table");
  if (table != "dense" && table != "csr") throw InputError(where(d) + "table is dense or csr, not '" + table + "'");
  c.csr = table == "csr";
  c.seq_lens = list_key(d, "seq-lens");
  c.q_lens = list_key(d, "q-lens");
  if (c.seq_lens.size() != c.q_lens.size())
    throw InputError(where(d) + "seq-lens and q-lens name " + std::to_string(c.seq_lens.size()) + " and " +
                     std::to_string(c.q_lens.size()) + " sequences");
  c.B = static_cast<int64_t>(c.seq_lens.size());
  for (int64_t b = 0; b < c.B; ++b) {
    if (c.q_lens[b] > c.seq_lens[b]) throw InputError(where(d) + "a q-len exceeds its seq-len");
    c.T += c.q_lens[b];
    const int64_t need = (c.seq_lens[b] + s.cache.block_size - 1) / s.cache.block_size;
    c.max_blocks = std::max(c.max_blocks, need);
    c.nnz += need;
  }
  c.max_blocks += 1;  // one spare (−1) entry per row: never read
  s.cache.num_blocks = c.nnz + 2;  // two blocks no sequence uses (NaN)
  c.n_scales = attn::num_scales(s.scale_kind, s.cache.num_kv_heads, c.B);
  return c;
}

attn::CacheShape v_shape(const AttnCase& c) {
  attn::CacheShape v = c.spec.cache;
  v.head_dim = c.spec.dv();
  return v;
}

Tensors make_attn_inputs(const Descriptor& d) {
  const AttnCase c = parse_attn(d);
  const attn::AttnSpec& s = c.spec;
  const uint64_t seed = std::stoull(d.get("seed"));
  Rng rng(seed, 1);
  const int64_t bs = s.cache.block_size, H = s.cache.num_kv_heads, Dk = s.cache.head_dim, Dv = s.dv();
  std::vector<int32_t> perm(static_cast<size_t>(s.cache.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.next() % i]);
  std::vector<int32_t> bt(static_cast<size_t>(c.B * c.max_blocks), -1), sl, qsl = {0}, indptr = {0}, indices, last;
  size_t next = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t need = (c.seq_lens[b] + bs - 1) / bs;
    for (int64_t i = 0; i < need; ++i) {
      bt[static_cast<size_t>(b * c.max_blocks + i)] = perm[next];
      indices.push_back(perm[next++]);
    }
    sl.push_back(static_cast<int32_t>(c.seq_lens[b]));
    qsl.push_back(static_cast<int32_t>(qsl.back() + c.q_lens[b]));
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(static_cast<int32_t>(need ? c.seq_lens[b] - (need - 1) * bs : 1));
  }
  const io::DType cd = io::format_dtype(s.cache.format);
  io::Tensor kc = io::make_tensor("input.k_cache", cd, s.cache.shape());
  io::Tensor vc = io::make_tensor("input.v_cache", cd, v_shape(c).shape());
  std::fill(kc.data.begin(), kc.data.end(), 0x7F);
  std::fill(vc.data.begin(), vc.data.end(), 0x7F);
  const attn::CacheShape vs = v_shape(c);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = 0; j < c.seq_lens[b]; ++j)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t page = bt[static_cast<size_t>(b * c.max_blocks + j / bs)];
        for (int64_t x = 0; x < Dk; ++x) kc.data[static_cast<size_t>(s.cache.offset(page, j % bs, h) + x)] = random_code(s.cache.format, rng);
        if (!s.v_from_k)
          for (int64_t x = 0; x < Dv; ++x) vc.data[static_cast<size_t>(vs.offset(page, j % bs, h) + x)] = random_code(s.cache.format, rng);
      }
  Tensors t = {fill_tensor("input.q", io::format_dtype(s.q_format), {c.T, s.num_q_heads, Dk}, "normal:amax=3", seed, 2),
               int_tensor("input.query_start_loc", io::DType::I32, {c.B + 1}, qsl)};
  if (c.csr) {
    t.push_back(int_tensor("input.kv_indptr", io::DType::I32, {c.B + 1}, indptr));
    t.push_back(int_tensor("input.kv_indices", io::DType::I32, {static_cast<int64_t>(indices.size())}, indices));
    t.push_back(int_tensor("input.kv_last_page_len", io::DType::I32, {c.B}, last));
  } else {
    t.push_back(int_tensor("input.block_table", io::DType::I32, {c.B, c.max_blocks}, bt));
    t.push_back(int_tensor("input.seq_lens", io::DType::I32, {c.B}, sl));
  }
  t.push_back(kc);
  if (!s.v_from_k) t.push_back(vc);
  std::vector<float> ks, vsc;
  // (each draw its own statement: the order of a call's arguments is unspecified, and compilers differ)
  auto scale = [&] {
    const int e = -5 + static_cast<int>(rng.next() % 3);
    return static_cast<float>(std::ldexp(1.0 + rng.uniform(), e));
  };
  for (int64_t i = 0; i < c.n_scales; ++i) {
    ks.push_back(scale());
    vsc.push_back(scale());
  }
  t.push_back(int_tensor("input.k_scale", io::DType::F32, {c.n_scales}, ks));
  if (!s.v_from_k) t.push_back(int_tensor("input.v_scale", io::DType::F32, {c.n_scales}, vsc));
  if (s.chunk_unquantized) {  // the chunk's own K/V in md, of the dequantized cache's magnitude
    t.push_back(fill_tensor("input.k_new", io::format_dtype(s.q_format), {c.T, H, Dk}, "normal:amax=0.5", seed, 3));
    if (!s.v_from_k) t.push_back(fill_tensor("input.v_new", io::format_dtype(s.q_format), {c.T, H, Dv}, "normal:amax=0.5", seed, 4));
  }
  return t;
}

// Binds the inputs to AttnArgs (the tensors must outlive the args).
attn::AttnArgs bind_attn(const Descriptor& d, const AttnCase& c, const Tensors& in) {
  const attn::AttnSpec& s = c.spec;
  attn::AttnArgs a;
  a.num_seqs = c.B;
  a.num_tokens = c.T;
  a.q = find_input(d, in, "input.q", io::format_dtype(s.q_format), {c.T, s.num_q_heads, s.cache.head_dim}).data.data();
  a.query_start_loc = reinterpret_cast<const int32_t*>(find_input(d, in, "input.query_start_loc", io::DType::I32, {c.B + 1}).data.data());
  if (c.csr) {
    a.table.indptr = reinterpret_cast<const int32_t*>(find_input(d, in, "input.kv_indptr", io::DType::I32, {c.B + 1}).data.data());
    a.table.indices = reinterpret_cast<const int32_t*>(find_input(d, in, "input.kv_indices", io::DType::I32, {c.nnz}).data.data());
    a.table.num_indices = c.nnz;
    a.table.last_page_len = reinterpret_cast<const int32_t*>(find_input(d, in, "input.kv_last_page_len", io::DType::I32, {c.B}).data.data());
  } else {
    a.table.block_table = reinterpret_cast<const int32_t*>(find_input(d, in, "input.block_table", io::DType::I32, {c.B, c.max_blocks}).data.data());
    a.table.max_blocks = c.max_blocks;
    a.table.seq_lens = reinterpret_cast<const int32_t*>(find_input(d, in, "input.seq_lens", io::DType::I32, {c.B}).data.data());
  }
  const io::DType cd = io::format_dtype(s.cache.format);
  a.k_cache = find_input(d, in, "input.k_cache", cd, s.cache.shape()).data.data();
  a.k_scale = reinterpret_cast<const float*>(find_input(d, in, "input.k_scale", io::DType::F32, {c.n_scales}).data.data());
  if (s.chunk_unquantized) {
    const io::DType md = io::format_dtype(s.q_format);
    a.k_new = find_input(d, in, "input.k_new", md, {c.T, s.cache.num_kv_heads, s.cache.head_dim}).data.data();
    if (!s.v_from_k) a.v_new = find_input(d, in, "input.v_new", md, {c.T, s.cache.num_kv_heads, s.dv()}).data.data();
  }
  if (!s.v_from_k) {
    a.v_cache = find_input(d, in, "input.v_cache", cd, v_shape(c).shape()).data.data();
    a.v_scale = reinterpret_cast<const float*>(find_input(d, in, "input.v_scale", io::DType::F32, {c.n_scales}).data.data());
  }
  return a;
}

Tensors run_attn(const Descriptor& d, const Tensors& in, bool cpu) {
  const AttnCase c = parse_attn(d);
  attn::AttnArgs a = bind_attn(d, c, in);
  io::Tensor out = io::make_tensor("output.out", io::format_dtype(c.spec.out_format), {c.T, c.spec.num_q_heads, c.spec.dv()});
  a.out = out.data.data();
  attn::AttnSpec s = c.spec;
  if (!cpu && s.convention == attn::AttnConvention::fast) s.convention = attn::AttnConvention::exact;  // fast's golden
  if (cpu) attn::cpu::paged_attention(s, a);
  else attn::ref::paged_attention(s, a);
  return {out};
}

}  // namespace

OpInfo kv_cache_write_op() {
  OpInfo op;
  op.name = "kv_cache_write";
  op.summary = "quantize K/V [T, Hkv, D] into paged FP8 caches through a slot mapping (vLLM / sglang / Spyre)";
  op.params = {
      {"convention", "vllm-cuda", "vllm-cuda, sglang, spyre, exact"},
      {"model", "bf16", "K/V dtype: f32, bf16, f16"},
      {"cache", "e4m3fn", "e4m3fn, e5m2"},
      {"layout", "nhd", "nhd [blocks, bs, Hkv, D] or hnd [blocks, Hkv, bs, D]"},
      {"num-blocks", "8", "cache blocks"},
      {"block-size", "16", "slots per block"},
      {"kv-heads", "2", "Hkv"},
      {"head-dim", "64", "D"},
      {"tokens", "20", "T"},
      {"seqs", "2", "sequences (the tokens split evenly; per-sequence scales)"},
      {"scale-kind", "tensor", "tensor [1], head [Hkv], seq [B]"},
      {"mode", "static", "static (input.k_scale/v_scale) or dynamic (Spyre: amax/200, amax/100, floor 1e-5, in md)"},
      {"fill", "normal:amax=8", "K/V fill (docs/golden-format.md)"},
      {"seed", "1", "case seed"},
  };
  op.make_inputs = [](const Descriptor& d) -> Tensors {
    const WriteCase c = parse_write(d);
    const uint64_t seed = std::stoull(d.get("seed"));
    const io::DType md = io::format_dtype(c.spec.model), cd = io::format_dtype(c.spec.cache.format);
    Tensors t = {fill_tensor("input.k", md, c.kv_shape, d.get("fill"), seed, 0),
                 fill_tensor("input.v", md, c.kv_shape, d.get("fill"), seed, 1)};
    Rng rng(seed, 2);
    const int64_t slots = c.spec.cache.num_blocks * c.spec.cache.block_size;
    std::vector<int64_t> perm(static_cast<size_t>(slots));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.next() % i]);
    std::vector<int64_t> sm(static_cast<size_t>(c.T));
    for (int64_t i = 0; i < c.T; ++i) sm[static_cast<size_t>(i)] = i % 5 == 4 ? -1 : perm[static_cast<size_t>(i)];
    t.push_back(int_tensor("input.slot_mapping", io::DType::I64, {c.T}, sm));
    std::vector<int32_t> qsl;
    for (int64_t b = 0; b <= c.B; ++b) qsl.push_back(static_cast<int32_t>(c.T * b / c.B));
    t.push_back(int_tensor("input.query_start_loc", io::DType::I32, {c.B + 1}, qsl));
    // the cache before: random finite codes (what earlier tokens left), so untouched slots show as unchanged
    io::Tensor kc = io::make_tensor("input.k_cache", cd, c.spec.cache.shape());
    io::Tensor vc = io::make_tensor("input.v_cache", cd, c.spec.cache.shape());
    for (auto* t2 : {&kc, &vc})
      for (auto& x : t2->data) x = random_code(c.spec.cache.format, rng);
    t.push_back(kc);
    t.push_back(vc);
    if (!c.spec.dynamic) {
      std::vector<float> ks, vs;
      for (int64_t i = 0; i < c.n_scales; ++i) {  // small enough that some |x/s| overflow: the policies differ
        ks.push_back(static_cast<float>(std::ldexp(1.0 + rng.uniform(), -6)));
        vs.push_back(static_cast<float>(std::ldexp(1.0 + rng.uniform(), -6)));
      }
      t.push_back(int_tensor("input.k_scale", io::DType::F32, {c.n_scales}, ks));
      t.push_back(int_tensor("input.v_scale", io::DType::F32, {c.n_scales}, vs));
    }
    return t;
  };
  op.outputs_json = [](const Descriptor& d) {
    const WriteCase c = parse_write(d);
    const std::string dims = c.spec.cache.layout == attn::KvLayout::nhd ? R"(["page", "slot", "head", "d"])"
                                                                         : R"(["page", "head", "slot", "d"])";
    const std::string f = format_name(c.spec.cache.format);
    std::string j = R"({"output.k_cache": {"role": "data", "format": ")" + f + R"(", "contract": "exact", "dims": )" + dims +
                    R"(}, "output.v_cache": {"role": "data", "format": ")" + f + R"(", "contract": "exact", "dims": )" + dims + "}";
    if (c.spec.dynamic) {
      // per tensor / per head: scale tensors of their cache, one per block [P, S, H, D] / [P, S, 1, D] (NHD; HND
      // alike), so the diff ties a wrong scale to the cache codes it explains; per sequence (slots, not a block of
      // the cache): data, one per sequence
      const attn::CacheShape& k = c.spec.cache;
      const bool nhd = k.layout == attn::KvLayout::nhd;
      const int64_t H = c.spec.scale_kind == attn::KvScaleKind::head ? 1 : k.num_kv_heads;
      const std::vector<int64_t> block = nhd ? std::vector<int64_t>{k.num_blocks, k.block_size, H, k.head_dim}
                                             : std::vector<int64_t>{k.num_blocks, H, k.block_size, k.head_dim};
      std::string b;
      for (int64_t x : block) b += (b.empty() ? "" : ", ") + std::to_string(x);
      for (const char* kv : {"k", "v"}) {
        const std::string name = std::string("output.") + kv + "_scale";
        if (c.spec.scale_kind == attn::KvScaleKind::seq)
          j += ", \"" + name + R"(": {"role": "data", "format": "f32", "contract": "exact", "dims": ["seq"]})";
        else
          j += ", \"" + name + R"(": {"role": "scale", "format": "f32", "of": "output.)" + kv + R"(_cache", "block": [)" +
               b + "]}";
      }
    }
    return j + "}";
  };
  op.convention = [](const Descriptor& d) { return d.get("convention"); };
  op.models = [](const Descriptor& d) {  // which stack's cache write a device cache follows
    return key_variants(d, "convention", {"vllm-cuda", "sglang", "spyre", "exact"});
  };
  return op;
}

OpInfo paged_attention_op() {
  OpInfo op;
  op.name = "paged_attention";
  op.summary = "attention over a paged FP8 KV cache: decode and chunked prefill, GQA/MQA/MLA, per convention";
  op.params = {
      {"convention", "vllm-triton-unified",
       "exact, vllm-paged-v1, vllm-triton-unified, flashinfer, torch-sdpa-math, spyre, fast (cpu only; bound.out)"},
      {"md", "bf16", "query dtype: f32, bf16, f16"},
      {"out", "bf16", "output dtype: f32, bf16, f16; e4m3fn with out-scale"},
      {"cache", "e4m3fn", "e4m3fn, e5m2"},
      {"layout", "nhd", "nhd or hnd"},
      {"block-size", "16", "slots per page"},
      {"kv-heads", "2", "Hkv"},
      {"q-heads", "8", "Hq (a multiple of Hkv)"},
      {"head-dim", "64", "Dk"},
      {"head-dim-v", "0", "Dv (0: = Dk)"},
      {"mla", "0", "1: V = K cache[..., :Dv] (one latent cache, MLA 576/512)"},
      {"seq-lens", "37,1,0,100", "context length per sequence (comma-separated)"},
      {"q-lens", "1,1,0,5", "query tokens per sequence (1 = decode, >1 = a prefill chunk, 0 = none)"},
      {"table", "dense", "dense (block_table + seq_lens) or csr (indptr, indices, last_page_len)"},
      {"chunk", "quantized", "quantized (the chunk's K/V read back from the cache) or unquantized (input.k_new/v_new)"},
      {"sm-scale", "0", "softmax scale (0: 1/sqrt(Dk))"},
      {"causal", "bottom-right", "bottom-right, top-left, none"},
      {"window-left", "-1", "sliding window (keys >= qpos - window-left); -1: none"},
      {"softcap", "0", "logit soft-cap (exact, vllm-triton-unified, fast); 0: none"},
      {"out-scale", "0", "vllm-triton-unified: vLLM's fused output quantization (output_scale; out=e4m3fn); 0: none"},
      {"scale-kind", "tensor", "tensor [1], head [Hkv], seq [B]"},
      {"torch-lanes", "16", "torch-sdpa-math/spyre: Vectorized<float> lanes (16 AVX512, 8 AVX2)"},
      {"tile", "0", "vllm-triton-unified/flashinfer: keys per online-softmax tile (0: the convention's)"},
      {"segments", "-1",
       "vllm-triton-unified: 0 one pass (2D kernel), 2..64 segments (3D; vLLM: 16), -1 as vLLM picks"},
      {"kv-chunk", "-1", "flashinfer: split-KV chunk in keys (0: one pass), -1 as FlashInfer plans on H100/H200"},
      {"fi-kernel", "auto",
       "flashinfer: auto (prefill sequences FlashInfer's tensor-core prefill kernel, decode ones its decode kernel), "
       "prefill, decode"},
      {"cta-tile-q", "0", "flashinfer prefill kernel: packed query rows per CTA, 16/64/128 (0: as FlashInfer plans)"},
      {"prefill-kv-chunk", "-1",
       "flashinfer prefill kernel: split-KV chunk in keys (0: none), -1 as FlashInfer plans on H100/H200"},
      {"seed", "1", "case seed"},
  };
  op.make_inputs = make_attn_inputs;
  op.outputs_json = [](const Descriptor& d) {
    const AttnCase c = parse_attn(d);
    const bool fast = c.spec.convention == attn::AttnConvention::fast;
    return std::string(R"({"output.out": {"role": "data", "format": ")") + format_name(c.spec.out_format) +
           R"(", "contract": ")" + (fast ? "bound" : "exact") + R"(", "dims": ["token", "head", "d"]}})";
  };
  op.convention = [](const Descriptor& d) { return d.get("convention"); };
  op.models = [](const Descriptor& d) {  // which kernel's softmax and order a device output follows
    Descriptor base = d;  // (each convention with its own tile and launch)
    base.set("tile", "0");
    base.set("segments", "-1");
    base.set("kv-chunk", "-1");
    base.set("fi-kernel", "auto");
    base.set("cta-tile-q", "0");
    base.set("prefill-kv-chunk", "-1");
    auto m = key_variants(base, "convention", {"exact", "vllm-paged-v1", "vllm-triton-unified", "flashinfer",
                                               "torch-sdpa-math", "spyre"});
    // vLLM's Triton kernels forced either way: the 2D kernel (tiles of 32, or 16), the 3D kernel (16 segments)
    for (const auto& [name, segs, tile] : {std::tuple<const char*, const char*, const char*>{
                                               "vllm-triton-unified segments=0", "0", "0"},
                                           {"vllm-triton-unified segments=0 tile=16", "0", "16"},
                                           {"vllm-triton-unified segments=16", "16", "0"}}) {
      Descriptor x = base;
      x.set("convention", "vllm-triton-unified");
      x.set("segments", segs);
      x.set("tile", tile);
      m.emplace_back(name, x);
    }
    // FlashInfer's decode without its split-KV, and with the smallest chunk its plan takes (128 keys)
    for (const char* chunk : {"0", "128"}) {
      Descriptor x = base;
      x.set("convention", "flashinfer");
      x.set("kv-chunk", chunk);
      m.emplace_back(std::string("flashinfer kv-chunk=") + chunk, x);
    }
    // FlashInfer's prefill rows on its decode kernel's steps (as fp8ref <= 0.5.0 modelled them), and the prefill
    // kernel without its split-KV
    for (const auto& [name, key, value] : {std::tuple<const char*, const char*, const char*>{
                                               "flashinfer fi-kernel=decode", "fi-kernel", "decode"},
                                           {"flashinfer prefill-kv-chunk=0", "prefill-kv-chunk", "0"}}) {
      Descriptor x = base;
      x.set("convention", "flashinfer");
      x.set(key, value);
      m.emplace_back(name, x);
    }
    return m;
  };
  op.exact = [](const Descriptor& d, const Tensors& in) -> Tensors {
    const AttnCase c = parse_attn(d);
    const attn::AttnArgs a = bind_attn(d, c, in);
    io::Tensor e = io::make_tensor("exact.out", io::DType::F64, {c.T, c.spec.num_q_heads, c.spec.dv()});
    double* ep = reinterpret_cast<double*>(e.data.data());
    attn::ref::paged_attention(c.spec, a, ep);
    if (c.spec.convention != attn::AttnConvention::fast) return {e};
    // fast: bound.out = the derived bound against exact's f64 result (make_golden adds the golden output's own
    // distance to it, so `diff --tol bound` against output.out is sound).
    io::Tensor bd = io::make_tensor("bound.out", io::DType::F64, {c.T, c.spec.num_q_heads, c.spec.dv()});
    double* bp = reinterpret_cast<double*>(bd.data.data());
    attn::cpu::paged_attention_fast_bound(c.spec, a, bp);
    return {e, bd};
  };
  return op;
}

std::vector<Kernel> attention_kernels() {
  return {
      {"kv_cache_write", "reference", "attn::ref::kv_cache_write (scalar)",
       [](const Descriptor& d, const Tensors& in) { return run_write(d, in, false); }},
      {"kv_cache_write", "cpu", "attn::cpu::kv_cache_write (vector codes per block of tokens, OpenMP)",
       [](const Descriptor& d, const Tensors& in) { return run_write(d, in, true); }},
      {"paged_attention", "reference", "attn::ref::paged_attention (scalar, per convention; fast: the exact result)",
       [](const Descriptor& d, const Tensors& in) { return run_attn(d, in, false); }},
      {"paged_attention", "cpu", "attn::cpu::paged_attention (OpenMP + Highway)",
       [](const Descriptor& d, const Tensors& in) { return run_attn(d, in, true); }},
  };
}

}  // namespace fp8ref::golden
