// kv_cache_write benchmark (issue 6, the cache write): a prefill-sized write, T tokens of K and V [T, Hkv, D] in bf16
// into an e4m3fn cache (--conv, default vllm-cuda; per-tensor scales, given or --dynamic), by the reference loop and by the cpu backend, with a memcpy of
// the same input bytes as the anchor, all in one run (interleaved rounds, best of --reps). Compares, never asserts;
// checks that the two backends wrote the same cache bytes.
//
// Usage: bench_kv_write [--tokens 4096] [--reps 5] [--conv vllm-cuda|sglang|spyre|exact] [--dynamic 0|1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fp8ref/attention.h"
#include "fp8ref/convert.h"

using namespace fp8ref;

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
}  // namespace

int main(int argc, char** argv) {
  int64_t T = 4096;
  int reps = 5;
  attn::StoreConvention conv = attn::StoreConvention::vllm_cuda;
  bool dynamic = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") T = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--conv" && attn::parse_store_convention(argv[i + 1], &conv)) continue;
    else if (a == "--dynamic") dynamic = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "usage: bench_kv_write [--tokens 4096] [--reps 5] [--conv vllm-cuda|sglang|spyre|exact] [--dynamic 0|1]\n");
      return 2;
    }
  }
  const int64_t H = 8, D = 128, bs = 16;
  attn::KvWriteSpec s;
  s.convention = conv;
  s.dynamic = dynamic;
  s.model = Format::bf16;
  s.cache.format = Format::e4m3fn;
  s.cache.num_blocks = (T + bs - 1) / bs;
  s.cache.block_size = bs;
  s.cache.num_kv_heads = H;
  s.cache.head_dim = D;
  const size_t n = static_cast<size_t>(T * H * D);
  std::vector<uint16_t> k(n), v(n), copy(2 * n);
  for (size_t i = 0; i < n; ++i) {  // bf16 over ~8 binades around 1, both signs
    const uint32_t h = mix(static_cast<uint32_t>(i));
    k[i] = static_cast<uint16_t>(((h >> 31) << 15) | ((123u + (h >> 8) % 8u) << 7) | (h & 0x7Fu));
    const uint32_t g = mix(h);
    v[i] = static_cast<uint16_t>(((g >> 31) << 15) | ((121u + (g >> 8) % 8u) << 7) | (g & 0x7Fu));
  }
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) slots[static_cast<size_t>(t)] = (t * 37) % T;  // scattered (a permutation unless 37 divides T)
  float ks = 0.01f, vs = 0.02f;
  std::vector<uint8_t> kr(static_cast<size_t>(s.cache.numel())), vr(kr.size()), kc(kr.size()), vc(kr.size());
  attn::KvWriteArgs a;
  a.num_tokens = T;
  a.k = k.data();
  a.v = v.data();
  a.slot_mapping = slots.data();
  a.k_scale = &ks;
  a.v_scale = &vs;
  const int threads = omp_get_max_threads();
  std::vector<double> tm, tr, tc;
  for (int r = -1; r < reps; ++r) {
    double t0 = now_s();
#pragma omp parallel for schedule(static)
    for (int part = 0; part < 2; ++part) std::memcpy(copy.data() + part * n, part ? v.data() : k.data(), n * 2);
    const double m = now_s() - t0;
    a.k_cache = kr.data();
    a.v_cache = vr.data();
    t0 = now_s();
    attn::ref::kv_cache_write(s, a);
    const double rt = now_s() - t0;
    a.k_cache = kc.data();
    a.v_cache = vc.data();
    t0 = now_s();
    attn::cpu::kv_cache_write(s, a);
    const double ct = now_s() - t0;
    if (r >= 0) tm.push_back(m), tr.push_back(rt), tc.push_back(ct);
  }
  const bool same = kr == kc && vr == vc;
  auto best = [](const std::vector<double>& x) { return *std::min_element(x.begin(), x.end()); };
  const double in = 4.0 * static_cast<double>(n), moved = in + 2.0 * static_cast<double>(n);  // bf16 K+V in, codes out
  std::printf("- %s: cpu == reference cache bytes: %s; SIMD target %s, OpenMP threads %d\n", "bench_kv_write",
              same ? "yes" : "NO", cpu::simd_target(), threads);
  std::printf("\n| kv_cache_write %s%s, T=%lld Hkv=8 D=128 bf16 -> e4m3fn | threads | moved (R+W) | best of %d | GB/s | / memcpy | / reference |\n",
              attn::to_string(conv), dynamic ? " (dynamic scales)" : "", static_cast<long long>(T), reps);
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  const double m = best(tm), rt = best(tr), ct = best(tc);
  std::printf("| memcpy of the K and V input | %d | %.1f MB | %.2f ms | %.2f | 1.00 | — |\n", threads, 2 * in / 1e6, m * 1e3,
              2 * in / m / 1e9);
  std::printf("| attn::ref::kv_cache_write | 1 | %.1f MB | %.2f ms | %.2f | %.3f | 1.0× |\n", moved / 1e6, rt * 1e3,
              moved / rt / 1e9, (moved / rt) / (2 * in / m));
  std::printf("| attn::cpu::kv_cache_write | %d | %.1f MB | %.2f ms | %.2f | %.3f | %.1f× |\n", threads, moved / 1e6, ct * 1e3,
              moved / ct / 1e9, (moved / ct) / (2 * in / m), rt / ct);
  return same ? 0 : 1;
}
