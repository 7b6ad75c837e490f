// bench_attention — paged-attention decode over an FP8 KV cache against this machine's read bandwidth (issue 6).
//
// Compares, never asserts. Problem (the issue's): decode, batch 32, context 4096, Hkv 8, Hq 64 (GQA 8:1), D 128,
// e4m3fn cache (block size 16, pages shuffled), bf16 queries and output. The cache is 2 × 32·4096·8·128 B = 256 MiB.
// Anchor measured in the same run, on the same thread count: a read-only pass over a buffer of the cache's size
// (an OpenMP sum of 64-bit words, vectorised; the ceiling for "read the cache once"). Reported: the time per decode
// step (best of --reps, median in parentheses), the cache bytes read per second, and that as a fraction of the
// anchor. torch CPU SDPA is not installed on this machine (no anchor row for it; see bench/RESULTS.md).
//
// `fast` is the CPU-fallback convention (src/cpu/attention_fast.cc: AMX where the CPU has it; not bit-exact, within a
// derived bound of exact); --conv fast runs only it (with the anchor).
// --huge 1: the cache and the anchor's buffer on transparent huge pages (2 MiB-aligned, madvise MADV_HUGEPAGE; both,
// so the comparison stays like for like); default 0 (4 KiB pages, as before).
// --hkv/--hq: other head counts (GQA Hq/Hkv); --softcap X: the logit soft-cap's cost — fast runs with and without it
// in the same interleaved rounds (and, with --conv all, vllm-triton-unified with it).
// --hot N: every page of the block table points into the first N blocks (the same work, its codes resident in cache:
// the kernel's compute alone; N = 32 is 1 MiB of K and V). The GB/s column then counts the codes the kernel reads.
// --qlen N: N query tokens per sequence (a chunked-prefill step: the chunk is the context's last N positions, causal).
// --paged 1: a second anchor, the cache itself read in the kernels' order (per sequence, OpenMP dynamic; page by page
// through the block table, each page's K block then its V block, 64-bit words summed; the next page's lines
// prefetched into L2 one per line read — of the variants tried, the fastest: bench/RESULTS.md session 27): what
// reading the shuffled pages alone costs, beside the sequential read pass. --busy N: N rounds of four independent
// 512-bit FMAs per 64-byte line of that pass (with --hot: the compute alone) — how well this machine overlaps a
// paged read with compute that does not touch memory. --shuffle 0: the block table in page order (default 1: shuffled,
// as a serving cache's pages are). --kv-chunk N: flashinfer's split-KV chunk (default -1: FlashInfer's plan; 0: one
// pass). --bs N: the cache's block size (default 16, vLLM's GPU default; a page is
// N·Hkv·D bytes of K and as many of V).
// Usage: bench_attention [--threads 2] [--reps 5] [--conv NAME|all] [--ctx 4096] [--batch 32] [--huge 0|1] [--hkv 8] [--hq 64] [--softcap 0]
//        [--fast-paths avx512bf16,avx2,amx,portable] [--hot 0] [--qlen 1] [--paged 0|1] [--busy 0] [--shuffle 1] [--bs 16] [--kv-chunk -1]
// Run with OMP_WAIT_POLICY=passive on this 2-core VM.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "cpu/attention_fast.h"

using namespace fp8ref;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A zero-filled buffer, 2 MiB-aligned and advised for transparent huge pages when `huge`.
template <typename T>
struct Buffer {
  T* p = nullptr;
  size_t n = 0;
  Buffer(size_t count, bool huge) : n(count) {
    const size_t align = huge ? size_t{2} << 20 : 64, bytes = (count * sizeof(T) + align - 1) / align * align;
    p = static_cast<T*>(std::aligned_alloc(align, bytes));
    if (!p) {
      std::fprintf(stderr, "bench_attention: out of memory\n");
      std::exit(2);
    }
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T& operator[](size_t i) { return p[i]; }
  T* data() { return p; }
  size_t size() const { return n; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// --busy: comp rounds of four independent FMA chains (the CPU must have AVX-512F).
__attribute__((target("avx512f"))) uint64_t busy(uint64_t x, int comp) {
  __m512 a0 = _mm512_set1_ps(static_cast<float>(x & 7)), a1 = a0, a2 = a0, a3 = a0;
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int r = 0; r < comp; ++r) {
    a0 = _mm512_fmadd_ps(a0, m, c);
    a1 = _mm512_fmadd_ps(a1, m, c);
    a2 = _mm512_fmadd_ps(a2, m, c);
    a3 = _mm512_fmadd_ps(a3, m, c);
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return static_cast<uint64_t>(t[0] + t[15]);
}

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  int64_t ctx = 4096, B = 32;
  int64_t Hkv = 8, Hq = 64, hot = 0, qlen = 1, bs = 16, kv_chunk = -1;
  double softcap = 0;
  bool huge = false, paged = false, shuffle = true;
  int busy_rounds = 0;
  std::string conv = "all";
  std::string fast_paths;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--conv") conv = argv[i + 1];
    else if (a == "--ctx") ctx = std::atoll(argv[i + 1]);
    else if (a == "--batch") B = std::atoll(argv[i + 1]);
    else if (a == "--huge") huge = std::atoi(argv[i + 1]) != 0;
    else if (a == "--hkv") Hkv = std::atoll(argv[i + 1]);
    else if (a == "--hq") Hq = std::atoll(argv[i + 1]);
    else if (a == "--softcap") softcap = std::atof(argv[i + 1]);
    else if (a == "--fast-paths") fast_paths = argv[i + 1];
    else if (a == "--hot") hot = std::atoll(argv[i + 1]);
    else if (a == "--qlen") qlen = std::atoll(argv[i + 1]);
    else if (a == "--paged") paged = std::atoi(argv[i + 1]) != 0;
    else if (a == "--busy") busy_rounds = std::atoi(argv[i + 1]);
    else if (a == "--shuffle") shuffle = std::atoi(argv[i + 1]) != 0;
    else if (a == "--bs") bs = std::atoll(argv[i + 1]);
    else if (a == "--kv-chunk") kv_chunk = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_attention: unknown option %s (see the usage at the top of bench/bench_attention.cc)\n", a.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "bench_attention: option %s has no value\n", argv[argc - 1]);
    return 2;
  }
  if (busy_rounds < 0 || (busy_rounds > 0 && !__builtin_cpu_supports("avx512f"))) {
    std::fprintf(stderr, "bench_attention: --busy needs N >= 0 and a CPU with AVX-512F\n");
    return 2;
  }
  if (Hkv < 1 || Hq < Hkv || Hq % Hkv != 0 || !(softcap >= 0) || hot < 0 || qlen < 1 || qlen > ctx || bs < 1) {
    std::fprintf(stderr, "bench_attention: --hq must be a positive multiple of --hkv, --softcap >= 0, --hot >= 0, 1 <= --qlen <= --ctx, --bs >= 1\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const int64_t D = 128;
  attn::AttnSpec spec;
  spec.cache.block_size = bs;
  spec.cache.num_kv_heads = Hkv;
  spec.cache.head_dim = D;
  spec.num_q_heads = Hq;
  const int64_t blocks_per_seq = (ctx + bs - 1) / bs;
  spec.cache.num_blocks = B * blocks_per_seq;
  const size_t cache_bytes = static_cast<size_t>(spec.cache.numel());
  Buffer<uint8_t> kc(cache_bytes, huge), vc(cache_bytes, huge);
  {
    std::mt19937_64 rng(1);
    ConversionSpec cs;
    cs.overflow = Overflow::satfinite;
    std::vector<uint8_t> table(4096);
    std::normal_distribution<double> n(0.0, 3.0);
    for (auto& c : table) c = ref::encode_f64(n(rng), cs);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(cache_bytes); ++i) {
      kc[static_cast<size_t>(i)] = table[static_cast<size_t>(lowbias32(static_cast<uint32_t>(i)) & 4095)];
      vc[static_cast<size_t>(i)] = table[static_cast<size_t>(lowbias32(static_cast<uint32_t>(i) ^ 0x9E3779B9u) & 4095)];
    }
  }
  std::vector<int32_t> perm(static_cast<size_t>(spec.cache.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  if (shuffle) std::shuffle(perm.begin(), perm.end(), std::mt19937_64(2));
  if (hot > 0)
    for (auto& p : perm) p = static_cast<int32_t>(p % hot);
  std::vector<int32_t> bt = perm, sl(static_cast<size_t>(B), static_cast<int32_t>(ctx)), qsl(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) qsl[static_cast<size_t>(b)] = static_cast<int32_t>(b * qlen);
  std::vector<uint16_t> q(static_cast<size_t>(B * qlen * Hq * D));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint16_t>(0x3F00 | (lowbias32(static_cast<uint32_t>(i)) & 0x80FF));
  std::vector<uint16_t> out(q.size());
  float ks = 0.05f, vs = 0.07f;
  attn::AttnArgs a;
  a.num_seqs = B;
  a.num_tokens = B * qlen;
  a.q = q.data();
  a.query_start_loc = qsl.data();
  a.table.block_table = bt.data();
  a.table.max_blocks = blocks_per_seq;
  a.table.seq_lens = sl.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.k_scale = &ks;
  a.v_scale = &vs;
  a.out = out.data();

  // Anchor: read a buffer of the cache's total size (K and V) once.
  Buffer<uint64_t> buf((2 * cache_bytes) / 8, huge);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  auto read_pass = [&] {
    uint64_t s = 0;
    const int64_t n = static_cast<int64_t>(buf.size());
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < n; ++i) s += buf[static_cast<size_t>(i)];
    return s;
  };

  // --paged: the pages in the kernels' order (a block's K, then its V: block_size·Hkv·D bytes each)
  const int64_t page_bytes = bs * Hkv * D;
  auto paged_pass = [&] {
    uint64_t s = 0;
#pragma omp parallel for reduction(+ : s) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < blocks_per_seq; ++j) {
        const int64_t pg = bt[static_cast<size_t>(b * blocks_per_seq + j)];
        const int64_t npg = j + 1 < blocks_per_seq ? bt[static_cast<size_t>(b * blocks_per_seq + j + 1)] : -1;
        for (const uint8_t* base : {kc.data(), vc.data()}) {
          const uint64_t* w = reinterpret_cast<const uint64_t*>(base + pg * page_bytes);
          const char* nw = npg >= 0 ? reinterpret_cast<const char*>(base + npg * page_bytes) : nullptr;
          for (int64_t i = 0; i < page_bytes / 8; i += 8) {  // a line of this page, a line of the next
            if (nw) _mm_prefetch(nw + i * 8, _MM_HINT_T1);
            for (int64_t k = 0; k < 8; ++k) s += w[i + k];
            if (busy_rounds) s += busy(w[i], busy_rounds);
          }
        }
      }
    return s;
  };

  // the rows: a convention and the soft-cap it runs with (--softcap X: fast with and without it, interleaved, so the
  // cap's cost is measured in the same rounds; and the bit-exact convention that has one)
  struct Row {
    attn::AttnConvention conv;
    double softcap;
    int path = -1;  // fast on a forced path (--fast-paths), else cpu::paged_attention
  };
  std::vector<Row> rows;
  if (conv == "all") {
    if (softcap > 0) {
      rows.push_back({attn::AttnConvention::vllm_triton_unified, softcap});
      rows.push_back({attn::AttnConvention::fast, 0.0});
      rows.push_back({attn::AttnConvention::fast, softcap});
    } else {
      for (auto c : {attn::AttnConvention::vllm_triton_unified, attn::AttnConvention::vllm_paged_v1,
                     attn::AttnConvention::flashinfer, attn::AttnConvention::torch_sdpa_math, attn::AttnConvention::fast})
        rows.push_back({c, 0.0});
    }
  } else {
    attn::AttnConvention c;
    if (!attn::parse_attn_convention(conv, &c)) {
      std::fprintf(stderr, "unknown convention %s\n", conv.c_str());
      return 2;
    }
    if (softcap <= 0 || c == attn::AttnConvention::fast) rows.push_back({c, 0.0});
    if (softcap > 0) rows.push_back({c, softcap});
  }
  // --fast-paths avx512bf16,avx2,portable: fast on each of these paths as well, interleaved (A/B in one process)
  for (size_t at = 0; !fast_paths.empty() && at <= fast_paths.size();) {
    const size_t end = std::min(fast_paths.find(',', at), fast_paths.size());
    const std::string name = fast_paths.substr(at, end - at);
    const int pth = name == "avx512bf16" ? static_cast<int>(attn::cpu::FastPath::avx512bf16)
                    : name == "avx2"     ? static_cast<int>(attn::cpu::FastPath::avx2)
                    : name == "amx"      ? static_cast<int>(attn::cpu::FastPath::amx)
                    : name == "portable" ? static_cast<int>(attn::cpu::FastPath::portable)
                                         : -1;
    if (pth < 0) {
      std::fprintf(stderr, "bench_attention: unknown fast path %s (avx512bf16, avx2, amx, portable)\n", name.c_str());
      return 2;
    }
    rows.push_back({attn::AttnConvention::fast, 0.0, pth});
    at = end + 1;
  }
  std::vector<std::vector<double>> t(rows.size() + 1);
  std::vector<double> tp;  // (--paged)
  volatile uint64_t sink = 0;
  read_pass();
  for (int r = 0; r < reps; ++r) {  // interleaved rounds
    double t0 = now_s();
    sink = sink + read_pass();
    t[0].push_back(now_s() - t0);
    if (paged) {
      t0 = now_s();
      sink = sink + paged_pass();
      tp.push_back(now_s() - t0);
    }
    for (size_t c = 0; c < rows.size(); ++c) {
      spec.convention = rows[c].conv;
      spec.softcap = rows[c].softcap;
      spec.kv_chunk = rows[c].conv == attn::AttnConvention::flashinfer ? kv_chunk : -1;
      t0 = now_s();
      if (rows[c].path >= 0) attn::cpu::paged_attention_fast(spec, a, static_cast<attn::cpu::FastPath>(rows[c].path));
      else attn::cpu::paged_attention(spec, a);
      t[c + 1].push_back(now_s() - t0);
    }
  }
  const double gib = static_cast<double>(2 * cache_bytes) / (1u << 30);
  const double anchor = *std::min_element(t[0].begin(), t[0].end());
  std::printf("| kernel (%s B=%lld ctx=%lld Hkv=%lld Hq=%lld D=128 e4m3fn bs=%lld) | threads | cache read | best of %d (median) | GB/s | / read pass |\n",
              qlen == 1 ? "decode" : ("prefill chunk " + std::to_string(qlen)).c_str(), static_cast<long long>(B),
              static_cast<long long>(ctx), static_cast<long long>(Hkv), static_cast<long long>(Hq), static_cast<long long>(bs), reps);
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  std::printf("| anchor: read pass over %.0f MiB | %d | %.2f GiB | %.1f ms (%.1f) | %.2f | 1.00 |\n", gib * 1024, threads, gib,
              anchor * 1e3, median(t[0]) * 1e3, static_cast<double>(2 * cache_bytes) / anchor / 1e9);
  if (paged) {
    const double best = *std::min_element(tp.begin(), tp.end());
    std::printf("| anchor: the cache read page by page in block-table order | %d | %.2f GiB | %.1f ms (%.1f) | %.2f | %.3f |\n",
                threads, gib, best * 1e3, median(tp) * 1e3, static_cast<double>(2 * cache_bytes) / best / 1e9, anchor / best);
  }
  for (size_t c = 0; c < rows.size(); ++c) {
    const double best = *std::min_element(t[c + 1].begin(), t[c + 1].end());
    static const char* const kPathNames[] = {"automatic", "amx", "avx2", "portable", "avx512bf16"};
    const std::string cap = (rows[c].softcap > 0 ? " softcap=" + std::to_string(rows[c].softcap).substr(0, 5) : "") +
                            (rows[c].path >= 0 ? std::string(" (") + kPathNames[rows[c].path] + " path)" : "");
    std::printf("| cpu::paged_attention %s%s | %d | %.2f GiB | %.1f ms (%.1f) | %.2f | %.3f |\n", attn::to_string(rows[c].conv),
                cap.c_str(), threads, gib, best * 1e3, median(t[c + 1]) * 1e3, static_cast<double>(2 * cache_bytes) / best / 1e9,
                anchor / best);
  }
  return 0;
}
