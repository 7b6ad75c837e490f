// fp8ref — paged attention: names, shapes and the input checks shared by every backend (include/fp8ref/attention.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fp8ref/attention.h"
#include "fp8ref/error.h"

namespace fp8ref::attn {

namespace {
// vLLM unified_attention's q block: BLOCK_M = 16 if G <= 16 else next_power_of_2(G) rows; BLOCK_Q = BLOCK_M // G.
int64_t triton_block_m(int64_t G) {
  int64_t block_m = 16;
  while (block_m < G) block_m *= 2;
  return block_m;
}

template <typename E, size_t N>
bool parse_named(std::string_view s, const char* const (&names)[N], E* out) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) {
      *out = static_cast<E>(i);
      return true;
    }
  return false;
}

const char* const kLayouts[] = {"nhd", "hnd"};
const char* const kScaleKinds[] = {"tensor", "head", "seq"};
const char* const kStores[] = {"vllm-cuda", "sglang", "spyre", "exact"};
const char* const kAttns[] = {"exact", "vllm-paged-v1", "vllm-triton-unified", "flashinfer", "torch-sdpa-math", "spyre",
                              "fast"};
const char* const kCausals[] = {"bottom-right", "top-left", "none"};
const char* const kFiKernels[] = {"auto", "prefill", "decode"};

std::string num(int64_t v) { return std::to_string(v); }

bool is_md(Format f) { return f == Format::f32 || f == Format::bf16 || f == Format::f16; }
bool is_cache_format(Format f) { return f == Format::e4m3fn || f == Format::e5m2; }

void check_cache_shape(const CacheShape& c, const char* what) {
  if (!is_cache_format(c.format))
    throw InputError(std::string(what) + ": cache format must be e4m3fn or e5m2, not " + format_name(c.format));
  if (c.num_blocks < 0 || c.block_size < 1 || c.num_kv_heads < 1 || c.head_dim < 1)
    throw InputError(std::string(what) + ": cache shape [" + num(c.num_blocks) + ", " + num(c.block_size) + ", " +
                     num(c.num_kv_heads) + ", " + num(c.head_dim) + "] needs blocks >= 0 and block size, heads, D >= 1");
}

// query_start_loc[0] = 0, non-decreasing, qsl[B] = T.
void check_qsl(const int32_t* qsl, int64_t B, int64_t T, const char* what) {
  if (!qsl) throw InputError(std::string(what) + ": query_start_loc is missing");
  if (qsl[0] != 0) throw InputError(std::string(what) + ": query_start_loc[0] = " + num(qsl[0]) + ", must be 0");
  for (int64_t b = 0; b < B; ++b)
    if (qsl[b + 1] < qsl[b])
      throw InputError(std::string(what) + ": query_start_loc decreases at sequence " + num(b) + " (" + num(qsl[b]) +
                       " -> " + num(qsl[b + 1]) + ")");
  if (qsl[B] != T)
    throw InputError(std::string(what) + ": query_start_loc[" + num(B) + "] = " + num(qsl[B]) + " but there are " +
                     num(T) + " tokens");
}

}  // namespace

const char* to_string(KvLayout v) { return kLayouts[static_cast<int>(v)]; }
const char* to_string(KvScaleKind v) { return kScaleKinds[static_cast<int>(v)]; }
const char* to_string(StoreConvention v) { return kStores[static_cast<int>(v)]; }
const char* to_string(AttnConvention v) { return kAttns[static_cast<int>(v)]; }
const char* to_string(Causal v) { return kCausals[static_cast<int>(v)]; }
const char* to_string(FiKernel v) { return kFiKernels[static_cast<int>(v)]; }
bool parse_kv_layout(std::string_view s, KvLayout* out) { return parse_named(s, kLayouts, out); }
bool parse_kv_scale_kind(std::string_view s, KvScaleKind* out) { return parse_named(s, kScaleKinds, out); }
bool parse_store_convention(std::string_view s, StoreConvention* out) { return parse_named(s, kStores, out); }
bool parse_attn_convention(std::string_view s, AttnConvention* out) { return parse_named(s, kAttns, out); }
bool parse_causal(std::string_view s, Causal* out) { return parse_named(s, kCausals, out); }
bool parse_fi_kernel(std::string_view s, FiKernel* out) { return parse_named(s, kFiKernels, out); }

std::vector<int64_t> CacheShape::shape() const {
  if (layout == KvLayout::nhd) return {num_blocks, block_size, num_kv_heads, head_dim};
  return {num_blocks, num_kv_heads, block_size, head_dim};
}

int64_t scale_index(KvScaleKind kind, int64_t seq, int64_t kv_head) {
  return kind == KvScaleKind::tensor ? 0 : kind == KvScaleKind::head ? kv_head : seq;
}

int64_t num_scales(KvScaleKind kind, int64_t num_kv_heads, int64_t num_seqs) {
  switch (kind) {
    case KvScaleKind::tensor: return 1;
    case KvScaleKind::head: return num_kv_heads;
    case KvScaleKind::seq: return num_seqs;
  }
  return 1;
}

double AttnSpec::scale() const { return sm_scale > 0 ? sm_scale : 1.0 / std::sqrt(static_cast<double>(cache.head_dim)); }
int64_t AttnSpec::tile_keys() const {
  return tile > 0 ? tile : (convention == AttnConvention::flashinfer || segments > 0) ? 16 : 32;
}

namespace {
// FlashInfer 0.7.4's max_grid_size (blocks per SM by occupancy × 132 SMs) for its CUDA-core batch decode kernel
// over an e4m3 cache with bf16 q/out, by head dim, sliding-window variant and group size G, as its work estimation
// computed it on an H100 (nvcc 13.0; tools/device/capture_flashinfer_decode.py, tests/data/h200/flashinfer_occupancy.npy,
// which a test holds this table to). 0: no such kernel (FlashInfer refuses; fp8ref takes one pass).
int64_t flashinfer_max_grid(int64_t d, bool window, int64_t g) {
  static constexpr int64_t kG[7] = {1, 2, 3, 4, 6, 8, 16};
  static constexpr int64_t kGrid[3][2][7] = {
      {{792, 924, 924, 924, 924, 924, 528}, {924, 792, 924, 924, 792, 792, 660}},    // D 64: no window, window
      {{792, 924, 924, 924, 924, 924, 660}, {660, 924, 924, 924, 792, 792, 660}},    // D 128
      {{792, 924, 924, 792, 924, 924, 396}, {660, 924, 924, 924, 792, 792, 264}}};  // D 256
  const int di = d == 64 ? 0 : d == 128 ? 1 : d == 256 ? 2 : -1;
  for (int gi = 0; gi < 7 && di >= 0; ++gi)
    if (kG[gi] == g) return kGrid[di][window ? 1 : 0][gi];
  return 0;
}
}  // namespace

int64_t flashinfer_plan_chunk(const AttnSpec& s, const AttnArgs& a) {
  // DecodePlan (attention/scheduler.cuh) over the sequences that run the decode kernel (the others, prefill chunks
  // on FlashInfer's prefill kernel, have their own plan: vLLM plans its decode and prefill wrappers apart): no split
  // when one of them has more than one query token (fi_kernel decode), when their count·Hkv >= max_grid_size, or when
  // the smallest chunk the binary search finds leaves every sequence one chunk; else chunks of `low` pages, low = the
  // least page count >= max(128 / page, 1) with Σ_b cdiv(pages_b, low)·Hkv <= max_grid_size (binary search between
  // that floor and the largest page count).
  const int64_t H = s.cache.num_kv_heads, G = s.num_q_heads / H, page = s.cache.block_size;
  const int64_t grid = flashinfer_max_grid(s.cache.head_dim, s.window_left >= 0, G);
  std::vector<int64_t> pages;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const SeqPages q = seq_pages(s, a, b);
    if (flashinfer_takes_prefill(s, q)) continue;
    if (q.q_len > 1) return 0;
    pages.push_back((q.seq_len + page - 1) / page);
  }
  const int64_t B = static_cast<int64_t>(pages.size());
  if (grid == 0 || s.dv() != s.cache.head_dim || B == 0 || B * H >= grid) return 0;
  int64_t low = std::max<int64_t>(128 / page, 1), high = 0;
  for (int64_t p : pages) high = std::max(high, p);
  auto chunks = [&](int64_t n, bool at_least_one) {
    int64_t total = 0;
    for (int64_t p : pages) total += ((at_least_one ? std::max<int64_t>(p, 1) : p) + n - 1) / n;
    return total;
  };
  while (low < high) {
    const int64_t mid = (low + high) / 2;
    if (chunks(mid, false) * H > grid) low = mid + 1;
    else high = mid;
  }
  return chunks(low, true) == B ? 0 : low * page;
}

bool flashinfer_prefill_supported(const AttnSpec& s) {
  const int64_t d = s.cache.head_dim;
  return (d == 64 || d == 128 || d == 256) && s.dv() == d && !s.v_from_k && s.softcap == 0 &&
         (s.q_format == Format::bf16 || s.q_format == Format::f16);
}

bool flashinfer_takes_prefill(const AttnSpec& s, const SeqPages& q) {
  if (s.convention != AttnConvention::flashinfer) return false;
  switch (s.fi_kernel) {
    case FiKernel::prefill: return true;
    case FiKernel::decode: return false;
    case FiKernel::automatic: return q.q_len > 1 && flashinfer_prefill_supported(s);
  }
  return false;
}

int64_t flashinfer_prefill_tile(int64_t d, int64_t cta_tile_q, int64_t* warps) {
  // prefill.cuh's dispatch: NUM_WARPS_KV = 4 for cta_tile_q 16, else 1; NUM_MMA_KV from the shared memory a CTA may
  // take (233,472 B per SM, 232,448 per block on Hopper) for bf16 q tiles and 1-byte K/V tiles (+ a bf16 staging
  // tile where the e4m3 tiles are repacked: d != 64 and cta_tile_q > 16), rounded down to 8, 4, 2, 1 and at most
  // 8 / NUM_MMA_Q (NUM_MMA_Q = 2 for cta_tile_q 128); T = NUM_MMA_KV·16.
  *warps = cta_tile_q == 16 ? 4 : 1;
  switch (d) {
    case 64: return cta_tile_q == 16 ? 128 : cta_tile_q == 64 ? 128 : cta_tile_q == 128 ? 64 : 0;
    case 128: return cta_tile_q == 16 ? 64 : cta_tile_q == 64 ? 128 : cta_tile_q == 128 ? 64 : 0;
    case 256: return cta_tile_q == 16 ? 32 : cta_tile_q == 64 ? 64 : 0;
    default: return 0;
  }
}

void flashinfer_prefill_plan(const AttnSpec& s, const AttnArgs& a, int64_t* cta_tile_q, int64_t* chunk) {
  const int64_t H = s.cache.num_kv_heads, G = s.num_q_heads / H, page = s.cache.block_size;
  std::vector<int64_t> packed, pages;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const SeqPages q = seq_pages(s, a, b);
    if (!flashinfer_takes_prefill(s, q)) continue;
    packed.push_back(q.q_len * G);
    pages.push_back(q.num_pages);
  }
  *cta_tile_q = 16;
  *chunk = 0;
  if (packed.empty()) return;
  int64_t sum = 0;
  for (int64_t p : packed) sum += p;
  const int64_t avg = sum / static_cast<int64_t>(packed.size());  // FA2DetermineCtaTileQ (utils.cuh)
  const int64_t ctq = avg > 64 && s.dv() < 256 ? 128 : avg > 16 ? 64 : 16;
  *cta_tile_q = ctq;
  if (s.window_left >= 0)
    for (int64_t& p : pages) p = std::min(p, (s.window_left + ctq + page - 1) / page);
  // PrefillBinarySearchKVChunkSize: max_batch_size_if_split = 2·132 SMs / Hkv (uint division)
  const int64_t max_bs = 264 / H;
  int64_t low = std::max<int64_t>(128 / page, 1), max_kv = 1;
  for (int64_t p : pages) max_kv = std::max(max_kv, p);
  int64_t high = max_kv;
  while (low < high) {
    const int64_t mid = (low + high) / 2;
    int64_t blocks = 0;
    for (size_t i = 0; i < packed.size(); ++i)
      blocks += (packed[i] + ctq - 1) / ctq * ((std::max<int64_t>(pages[i], 1) + mid - 1) / mid);
    if (blocks > max_bs) low = mid + 1;
    else high = mid;
  }
  *chunk = low < max_kv ? low * page : 0;
}

AttnSpec resolve_launch(const AttnSpec& spec, const AttnArgs& a) {
  AttnSpec s = spec;
  if (s.convention == AttnConvention::flashinfer && s.kv_chunk < 0) s.kv_chunk = flashinfer_plan_chunk(s, a);
  if (s.convention == AttnConvention::flashinfer && (s.cta_tile_q == 0 || s.prefill_kv_chunk < 0)) {
    int64_t ctq = 0, chunk = 0;
    flashinfer_prefill_plan(s, a, &ctq, &chunk);
    if (s.cta_tile_q == 0) s.cta_tile_q = ctq;
    if (s.prefill_kv_chunk < 0) s.prefill_kv_chunk = chunk;
  }
  if (s.convention != AttnConvention::vllm_triton_unified || s.segments >= 0) return s;
  // vLLM unified_attention: BLOCK_M = 16 if G <= 16 else next_power_of_2(G); BLOCK_Q = BLOCK_M // G;
  // total_num_q_blocks = T // BLOCK_Q + num_seqs; the 2D kernel if max_seqlen_q > 1 or blocks · Hkv > 128.
  const int64_t G = s.num_q_heads / s.cache.num_kv_heads;
  const int64_t block_q = triton_block_m(G) / G;
  int64_t max_q = 0;
  for (int64_t b = 0; b < a.num_seqs; ++b)
    max_q = std::max<int64_t>(max_q, a.query_start_loc[b + 1] - a.query_start_loc[b]);
  const bool two_d = max_q > 1 || (a.num_tokens / block_q + a.num_seqs) * s.cache.num_kv_heads > 128;
  s.segments = two_d ? 0 : 16;
  return s;
}

bool triton_starts_at_zero(const AttnSpec& s, int64_t seq_len, int64_t q_len, int64_t i, int64_t lo, int64_t hi,
                           int64_t segment) {
  if (s.convention != AttnConvention::vllm_triton_unified) return false;
  const int64_t T = s.tile_keys(), G = s.num_q_heads / s.cache.num_kv_heads;
  const int64_t block_m = triton_block_m(G), block_q = block_m / G;
  // the row's q block: query rows [qlo, qlo + (BLOCK_M − 1) // G], positions from its first row's
  const int64_t qlo = i / block_q * block_q, base = s.causal == Causal::top_left ? 0 : seq_len - q_len;
  const int64_t prefix = s.causal == Causal::none ? seq_len : std::min(base + qlo + (block_m - 1) / G + 1, seq_len);
  const int64_t num_tiles = (prefix + T - 1) / T;
  int64_t ta = 0, tb = num_tiles;
  if (segment < 0) {  // kernel_unified_attention_2d: sliding-window tile pruning over the block's rows
    if (s.window_left >= 0) {
      const int64_t qhi = std::min(qlo + (block_m - 1) / G, q_len - 1);
      const int64_t first = base + qlo - s.window_left, last = base + qhi;
      ta = first > 0 ? first / T : 0;
      tb = std::min(last / T + 1, num_tiles);
    }
  } else {  // kernel_unified_attention_3d: segment `segment` of S, tps tiles each (none past the sequence)
    const int64_t tps = (seq_len + s.segments * T - 1) / (s.segments * T);
    if (segment * tps * T >= seq_len) return false;
    ta = segment * tps;
    tb = std::min((segment + 1) * tps, num_tiles);
  }
  return ta < tb && (ta * T + T - 1 < lo || ta * T > hi);
}

void check_kv_cache_write(const KvWriteSpec& spec, const KvWriteArgs& a) {
  const char* what = "kv_cache_write";
  if (!is_md(spec.model))
    throw InputError(std::string(what) + ": K/V dtype must be f32, bf16 or f16, not " + format_name(spec.model));
  check_cache_shape(spec.cache, what);
  if (a.num_tokens < 0) throw InputError(std::string(what) + ": negative token count");
  if (a.num_tokens > 0 && (!a.k || !a.v || !a.slot_mapping || !a.k_scale || !a.v_scale || !a.k_cache || !a.v_cache))
    throw InputError(std::string(what) + ": a null argument (k, v, slot_mapping, k_scale, v_scale, k_cache or v_cache)");
  const int64_t slots = spec.cache.num_blocks * spec.cache.block_size;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t s = a.slot_mapping[t];
    if (s >= slots)
      throw InputError(std::string(what) + ": slot_mapping[" + num(t) + "] = " + num(s) + " is past the cache (" +
                       num(spec.cache.num_blocks) + " blocks x " + num(spec.cache.block_size) + " = " + num(slots) +
                       " slots)");
  }
  if (spec.scale_kind == KvScaleKind::seq) {
    if (a.num_seqs < 1) throw InputError(std::string(what) + ": per-sequence scales need num_seqs >= 1");
    check_qsl(a.query_start_loc, a.num_seqs, a.num_tokens, what);
  } else if (a.query_start_loc) {  // (not needed, but given: it must still describe the tokens)
    check_qsl(a.query_start_loc, a.num_seqs, a.num_tokens, what);
  }
}

SeqPages seq_pages(const AttnSpec& spec, const AttnArgs& a, int64_t b) {
  SeqPages s;
  const PageTable& t = a.table;
  if (t.indptr) {
    s.pages = t.indices + t.indptr[b];
    s.num_pages = t.indptr[b + 1] - t.indptr[b];
    s.seq_len = s.num_pages == 0 ? 0 : (s.num_pages - 1) * spec.cache.block_size + t.last_page_len[b];
  } else {
    s.pages = t.block_table + b * t.max_blocks;
    s.num_pages = t.max_blocks;
    s.seq_len = t.seq_lens[b];
  }
  s.q_begin = a.query_start_loc[b];
  s.q_len = a.query_start_loc[b + 1] - a.query_start_loc[b];
  return s;
}

void check_paged_attention(const AttnSpec& spec, const AttnArgs& a) {
  const char* what = "paged_attention";
  const CacheShape& c = spec.cache;
  check_cache_shape(c, what);
  if (!is_md(spec.q_format))
    throw InputError(std::string(what) + ": q dtype must be f32, bf16 or f16, not " + format_name(spec.q_format));
  if (spec.out_scale != 0) {
    if (spec.convention != AttnConvention::vllm_triton_unified)
      throw InputError(std::string(what) + ": convention " + to_string(spec.convention) +
                       " has no fused output quantization (vllm-triton-unified has)");
    if (!(spec.out_scale > 0) || std::isinf(spec.out_scale))
      throw InputError(std::string(what) + ": out scale must be positive and finite");
    if (spec.out_format != Format::e4m3fn)
      throw InputError(std::string(what) + ": an out scale quantizes the output to e4m3fn, not " +
                       format_name(spec.out_format) + " (out dtype e4m3fn)");
  } else if (!is_md(spec.out_format)) {
    throw InputError(std::string(what) + ": out dtype must be f32, bf16 or f16, not " + format_name(spec.out_format) +
                     (spec.out_format == Format::e4m3fn ? " (e4m3fn needs an out scale: vllm-triton-unified's fused "
                                                           "output quantization)"
                                                         : ""));
  }
  if (spec.num_q_heads < 1 || spec.num_q_heads % c.num_kv_heads != 0)
    throw InputError(std::string(what) + ": " + num(spec.num_q_heads) + (spec.num_q_heads == 1 ? " query head" : " query heads") +
                     ", not a multiple of " + num(c.num_kv_heads) + (c.num_kv_heads == 1 ? " KV head" : " KV heads"));
  if (spec.head_dim_v < 0 || (spec.v_from_k && spec.dv() > c.head_dim))
    throw InputError(std::string(what) + ": head_dim_v " + num(spec.dv()) + " must be <= the K head dim " +
                     num(c.head_dim) + " when V is read from the K cache (MLA)");
  if (!(spec.scale() > 0) || !std::isfinite(spec.scale()))
    throw InputError(std::string(what) + ": sm_scale must be positive and finite");
  if (spec.softcap > 0 && spec.convention != AttnConvention::exact &&
      spec.convention != AttnConvention::vllm_triton_unified && spec.convention != AttnConvention::fast)
    throw InputError(std::string(what) + ": convention " + to_string(spec.convention) +
                     " has no logit soft-cap (exact, vllm-triton-unified and fast have)");
  if (!(spec.softcap >= 0) || std::isinf(spec.softcap))
    throw InputError(std::string(what) + ": soft-cap must be >= 0 and finite");
  if (spec.chunk_unquantized) {
    if (spec.convention == AttnConvention::flashinfer)
      throw InputError(std::string(what) + ": flashinfer folds the K scale into sm_scale: no unquantized chunk");
    if (!a.k_new || (!spec.v_from_k && !a.v_new))
      throw InputError(std::string(what) + ": the unquantized-chunk variant needs the chunk's K and V (k_new, v_new)");
  }
  if (spec.tile != 0 && spec.convention != AttnConvention::vllm_triton_unified &&
      spec.convention != AttnConvention::flashinfer)
    throw InputError(std::string(what) + ": convention " + to_string(spec.convention) +
                     " has no tile size to set (vllm-triton-unified and flashinfer have)");
  if (spec.segments != -1 && spec.convention != AttnConvention::vllm_triton_unified)
    throw InputError(std::string(what) + ": convention " + to_string(spec.convention) +
                     " has no segments to set (vllm-triton-unified has)");
  if (spec.segments != -1 && spec.segments != 0 &&
      (spec.segments < 2 || spec.segments > 64 || (spec.segments & (spec.segments - 1)) != 0))
    throw InputError(std::string(what) + ": segments must be 0 (one pass), a power of two in [2, 64] or -1 (as vLLM "
                     "picks), not " + num(spec.segments));
  if (spec.kv_chunk != -1 && spec.convention != AttnConvention::flashinfer)
    throw InputError(std::string(what) + ": convention " + to_string(spec.convention) +
                     " has no split-KV chunk to set (flashinfer has)");
  if (spec.convention != AttnConvention::flashinfer &&
      (spec.fi_kernel != FiKernel::automatic || spec.cta_tile_q != 0 || spec.prefill_kv_chunk != -1))
    throw InputError(std::string(what) + ": convention " + to_string(spec.convention) +
                     " has no FlashInfer kernel choice, cta_tile_q or prefill split-KV chunk to set (flashinfer has)");
  if (spec.convention == AttnConvention::flashinfer) {
    if (spec.fi_kernel == FiKernel::prefill && !flashinfer_prefill_supported(spec))
      throw InputError(std::string(what) + ": FlashInfer's prefill kernel takes head dims 64, 128 or 256 (Dk = Dv, no "
                       "MLA) with bf16 or f16 queries, not Dk " + num(c.head_dim) + ", Dv " + num(spec.dv()) + ", q " +
                       format_name(spec.q_format) + (spec.v_from_k ? ", V from K" : ""));
    const int64_t q = spec.cta_tile_q;
    if (q != 0 && q != 16 && q != 64 && !(q == 128 && c.head_dim != 256))
      throw InputError(std::string(what) + ": cta_tile_q must be 16, 64 or 128 (not 128 for head dim 256), or 0 (as "
                       "FlashInfer plans), not " + num(spec.cta_tile_q));
    if (spec.prefill_kv_chunk < -1)
      throw InputError(std::string(what) + ": prefill_kv_chunk must be 0 (no split), a key count > 0 or -1 (as "
                       "FlashInfer plans), not " + num(spec.prefill_kv_chunk));
  }
  if (spec.kv_chunk < -1)
    throw InputError(std::string(what) + ": kv_chunk must be 0 (one pass), a key count > 0 or -1 (as FlashInfer "
                     "plans), not " + num(spec.kv_chunk));
  if (spec.tile != 0 && (spec.tile < 16 || spec.tile > 256 || spec.tile % 16 != 0))
    throw InputError(std::string(what) + ": tile must be a multiple of 16 in [16, 256] (or 0: the convention's), not " +
                     num(spec.tile));
  if (spec.torch_lanes != 8 && spec.torch_lanes != 16)
    throw InputError(std::string(what) + ": torch lanes must be 8 (AVX2) or 16 (AVX512), not " + num(spec.torch_lanes));
  if (a.num_seqs < 0 || a.num_tokens < 0) throw InputError(std::string(what) + ": negative sequence or token count");
  if (!a.k_cache || !a.k_scale || (!spec.v_from_k && (!a.v_cache || !a.v_scale)) || (a.num_tokens > 0 && !a.q))
    throw InputError(std::string(what) + ": a null argument (q, k_cache, v_cache, k_scale or v_scale)");
  check_qsl(a.query_start_loc, a.num_seqs, a.num_tokens, what);
  const PageTable& t = a.table;
  if (t.indptr) {
    if (!t.indices && t.num_indices > 0) throw InputError(std::string(what) + ": CSR indices missing");
    if (t.indptr[0] != 0) throw InputError(std::string(what) + ": indptr[0] = " + num(t.indptr[0]) + ", must be 0");
    for (int64_t b = 0; b < a.num_seqs; ++b) {
      if (t.indptr[b + 1] < t.indptr[b])
        throw InputError(std::string(what) + ": indptr decreases at sequence " + num(b));
      if (t.indptr[b + 1] > t.num_indices)
        throw InputError(std::string(what) + ": indptr[" + num(b + 1) + "] = " + num(t.indptr[b + 1]) +
                         " is past the " + num(t.num_indices) + " indices");
      if (t.indptr[b + 1] > t.indptr[b] && (t.last_page_len[b] < 1 || t.last_page_len[b] > c.block_size))
        throw InputError(std::string(what) + ": last_page_len[" + num(b) + "] = " + num(t.last_page_len[b]) +
                         " must be in [1, " + num(c.block_size) + "]");
    }
  } else {
    if (!t.seq_lens || (!t.block_table && t.max_blocks > 0) || t.max_blocks < 0)
      throw InputError(std::string(what) + ": block_table / seq_lens missing");
  }
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const SeqPages s = seq_pages(spec, a, b);
    if (s.seq_len < 0) throw InputError(std::string(what) + ": seq_lens[" + num(b) + "] is negative");
    const int64_t need = (s.seq_len + c.block_size - 1) / c.block_size;
    if (need > s.num_pages)
      throw InputError(std::string(what) + ": seq_lens[" + num(b) + "] = " + num(s.seq_len) + " needs " + num(need) +
                       " blocks of " + num(c.block_size) + " but the table covers " + num(s.num_pages));
    for (int64_t p = 0; p < need; ++p)
      if (s.pages[p] < 0 || s.pages[p] >= c.num_blocks)
        throw InputError(std::string(what) + ": " +
                         (t.indptr ? "kv_indices[" + num(t.indptr[b] + p) + "] (page " + num(p) + " of sequence " + num(b) + ")"
                                   : "block_table[" + num(b) + ", " + num(p) + "]") +
                         " = " + num(s.pages[p]) + " is outside the cache's " + num(c.num_blocks) + " blocks");
    if (s.q_len > s.seq_len)
      throw InputError(std::string(what) + ": sequence " + num(b) + " has " + num(s.q_len) +
                       " query tokens but seq_len " + num(s.seq_len) + " (q_len <= seq_len)");
  }
}

double bound_exact_f64(int64_t dk, int64_t n_keys, double sm_scale, double max_abs_qk_sum, double max_abs_v,
                       double softcap) {
  const double u = std::ldexp(1.0, -53);
  double el = static_cast<double>(dk + 3) * u * sm_scale * max_abs_qk_sum;
  if (softcap > 0) el += 4 * u * softcap;
  return max_abs_v * (4 * el + static_cast<double>(2 * n_keys + 8) * u);
}

}  // namespace fp8ref::attn
