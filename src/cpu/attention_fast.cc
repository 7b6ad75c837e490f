// fp8ref CPU backend — the `fast` paged-attention convention (contract and bound: include/fp8ref/attention.h,
// "fast"; API: src/cpu/attention_fast.h). Not bit-exact; within paged_attention_fast_bound of the exact convention.
//
// Work split: OpenMP (dynamic) over units. AMX path: a sequence whose query rows per KV head fit in 16 (decode: the
// GQA group's Hq/Hkv heads) is one unit over a group of KV heads (as many as keep every thread a unit and the largest
// unit within a thread's share of the work) — so each page (NHD: all heads of a slot adjacent) is read in one pass,
// K/V read once per KV head; longer prefill chunks: one unit per (sequence, KV head, up to 256 rows), run as row
// blocks of 16 over one decode of each key chunk. AVX-512 BF16 and AVX2 paths: the same with units of 8 rows and up
// to 16 row blocks of 8 (LaneBlocks). Portable path: one unit per (sequence, KV head, 16 rows). A row is
// one (query position, q head). Keys go in chunks of 32 through the page table (any block size, NHD or HND); the next
// chunk's rows are prefetched while a chunk is computed.
//
// AMX path (CPUs with AMX-BF16, AVX512-BF16 and AVX512-VBMI, chosen at run time; this file is compiled without
// -march flags, the kernels carry __attribute__((target)); the tile state is requested with arch_prctl):
//   K chunk: FP8 codes -> bf16 code values (exact) with two 128-entry vpermi2b tables (low and high bytes) and a
//     byte interleave, rows [32][Dk] as they are in the cache; V chunk likewise into the VNNI pair layout
//     [16 key pairs][Dv][2] (AMX's B operand) by interleaving two keys' codes before the lookup. Both decodes run
//     under the S tiles: while head h's S steps run on the AMX unit, the vector units decode head h + 1's K rows
//     (into the other of two K buffers; after the last head, the next chunk's first head's) and head h's V pairs.
//   S^T[key][row] = K · Q̃^T with _tile_dpbf16ps, two 16-key accumulation chains (Q̃ = q rounded to bf16 once,
//   pre-packed as the B operand); logits t' = RN32(S·c2), c2 = RN32(RN32(sm_scale·sk)·RN32(log2 e)); the rows sit
//   in the 16 lanes of a vector — with <= 8 rows (decode GQA 8:1), two KV heads share the vectors (lanes 0..7 and
//   8..15), so the softmax runs once per pair of heads.
//   Online softmax in base 2 with an integer running maximum m2 = ceil(max t'): rescaling O and L by 2^(m2 − m2')
//   is exact; p = exp2(RN32(t' − m2)) (Sleef's exp2 polynomial, the one of ref::exp2_sleef) for t' − m2 >= −126,
//   else 0; P̃ = RN_bf16(p); L += P̃ (f32); the P̃ tile is transposed to rows (16×16 dword transpose) and
//   O[row][d] += P̃ · V with _tile_dpbf16ps (O in memory, f32; two 16-d blocks per step).
//   out = RN_out(RN32(O · RN32(sv / L))); a row with no visible key gets 0.
//   Soft-cap (cap > 0): the lanes' multiplier is c1' = RN32(sm_scale·sk / cap) and t' = RN32(c_l·tanh_vec(RN32(S·c1'))),
//   c_l = RN32(cap·log2 e) (tanh_vec: exp2_vec, then (1 − e)/(1 + e) by rcp14 and one Newton step; 5–13 % slower).
// AVX2 path (no AMX; AVX2 + FMA + F16C): the same steps with the rows of one KV head in the 8 f32 lanes — see "AVX2
// path" below.
// Portable path: the same steps per row in scalar C++ (f32 fma dot products, ref::exp2_sleef), one key at a time,
// and the NaN policy (attention.h): a NaN or +Inf logit, or only −Inf ones, makes the row NaN. The vector paths hand
// it every unit whose queries or codes (the keys [LO, HI] they read) hold a NaN or an Inf; a unit of several KV
// heads is run head by head.
// Scratch per thread (AMX; kept across calls): two K chunks 32·Dk bf16, V pairs of two heads 32·Dv bf16, and per
// loop head of the unit (KV head, or row block of a prefill chunk) Q̃ 16·Dk bf16 and O 16·Dv f32, S 32·16 f32, the row
// pointers of two chunks and the next chunk's line addresses.
// Prefetching (AMX): the next chunk's lines into L2 at a steady pace (listed from the next chunk's row pointers, issued
// by ticks in the decodes, the softmax and the P̃·V steps). Session 26 (a Sapphire Rapids-class VM, 2 threads,
// alternated runs; bench/RESULTS.md): the list instead of PrefetchCursor's per-line state machine and the unit
// specialized for head dim 128 took the decode step from 24–26 ms to 19–20 ms (compute alone, `--hot 32`, 1 thread:
// 33.6 → 25.8 ms). Tried there, none better: two chunks ahead, prefetcht0, the lines front-loaded into the first half
// of the chunk, every other line (the hardware prefetchers left to fill in: 32 ms), the order of use (head 0's K, then
// K of head h + 1 with V of head h), all K rows before the V rows, each line prefetched twice, the next-but-one
// chunk's pages touched early (their translations). Measured on the device machine's Sapphire Rapids host (session
// 21, decode B=32 ctx=4096, 2 threads, three rounds of alternated processes, ratio to each process's read pass): the
// previous scheme (decode, then S; the next chunk's rows of a head into L1 in one burst with its K decode) 0.51–0.56;
// paced into L2 alone 0.56–0.62; the decodes under S alone 0.59–0.60; both (kept) 0.62–0.65 — 21.1–24.7 vs 25.2–31.1
// ms, 1 thread 40.3–42.3 vs 50.4–50.9 ms. No software prefetch 0.35–0.40; paced into L1 0.49–0.61; two chunks ahead
// 0.39–0.57. Session 5 (an Emerald Rapids VM) had measured the two changes one at a time as no gain.
// Tried and dropped (no gain, measured): 64-key chunks (half the O tile traffic), prefetching per head into L1.
// Session 5, same-process A/B
// (bench_attention decode, two variants alternating call by call): the next chunk's lines prefetched in address
// order (slot-major) — equal; only every 4th line of them (leaving the rest to the L2 streamer) — 25% slower; two
// chunks ahead into L2 — 2–4% slower; the prefetches paced over the whole chunk (a queue ticked by every decode,
// tile and softmax step) instead of issued with the K decode — 1–4% slower; fewer KV heads per unit (4, 2) — slower
// (the decode loads miss more); O rows strided by R instead of 16 — equal; prefetchnta (codes through L1 without
// displacing the scratch) — 2× slower; the cache on huge pages (bench_attention --huge 1) — the same ratio to the
// read pass (both faster); the slots in a two-stage pipeline (the S tiles of slot s + 1 before the softmax of slot s,
// so S's tile stores land before the vector loads read them: that hand-off alone, faked, measured ~7%) — equal or 2–5%
// slower (twice the V buffers). Kept: the 64-byte-aligned, staggered scratch (~10%) and the in-lane byte interleave.
#include "cpu/amx_tile.h"
#include "cpu/attention_fast.h"
#include "cpu/rmsnorm_quant_avx512.h"

// GCC 12 flags its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include <omp.h>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"

namespace fp8ref::attn::cpu {

namespace {

constexpr int64_t kChunk = 32;  // keys per chunk (two AMX row tiles; one P̃ tile of 32 keys)
constexpr int64_t kRows = 16;   // rows per unit (AMX tile rows / vector lanes)

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

// f32 -> bf16 RNE (NaN quieted, sign kept).
uint16_t bf16_rne(float x) {
  const uint32_t b = bits_of(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
float bf16_val(uint16_t h) { return f32_of(static_cast<uint32_t>(h) << 16); }

// Q̃: q rounded to bf16 once (RNE), values below 2^-126 in magnitude flushed to a signed zero (AMX treats bf16
// subnormal inputs as zero; flushing here makes both paths see the same Q̃).
uint16_t q_tilde(Format md, const void* q, int64_t i) {
  float x;
  if (md == Format::bf16) {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(q) + 2 * i, 2);
    return (h & 0x7F80) == 0 ? static_cast<uint16_t>(h & 0x8000) : h;  // already bf16: only the flush
  }
  if (md == Format::f32) {
    std::memcpy(&x, static_cast<const uint8_t*>(q) + 4 * i, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(q) + 2 * i, 2);
    x = f32_of(static_cast<uint32_t>(fp8ref::ref::narrow(md, h, Format::f32)));
  }
  uint16_t b = bf16_rne(x);
  if ((b & 0x7F80) == 0) b &= 0x8000;
  return b;
}

void store_out(Format f, void* out, int64_t i, float x) {
  uint8_t* p = static_cast<uint8_t*>(out);
  if (f == Format::f32) {
    std::memcpy(p + 4 * i, &x, 4);
  } else if (f == Format::bf16) {
    const uint16_t h = bf16_rne(x);
    std::memcpy(p + 2 * i, &h, 2);
  } else {
    const uint16_t h = static_cast<uint16_t>(fp8ref::ref::narrow(Format::f32, bits_of(x), f));
    std::memcpy(p + 2 * i, &h, 2);
  }
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One unit: rows [r0, r1) of sequence b for KV heads [g0, g1) (the AMX path groups a decode step's KV heads so a
// page is read in one pass; the portable path takes one head); row r = (query position r / G, q head g·G + r % G).
struct Unit {
  int64_t b, g0, g1, r0, r1;
};
constexpr int64_t kMaxHeads = 16;  // KV heads per AMX unit
constexpr int64_t kBlockRows = 256;  // rows per AMX unit of a prefill chunk (row blocks of 16; <= 16 · kMaxHeads)

// What every unit of a call shares.
struct Ctx {
  const AttnSpec& s;
  const AttnArgs& a;
  int64_t G, Dk, Dv, Hq;
  CacheShape vshape;
  float c_log2e = 0;  // RN32(log2 e)
};

struct RowInfo {
  int64_t lo, hi;      // visible keys [lo, hi] (hi < lo: none)
  int64_t qrow, head;  // query token row and q head
};

RowInfo row_info(const Ctx& c, const SeqPages& sp, const Unit& u, int64_t r) {
  RowInfo ri;
  const int64_t i = r / c.G;
  ri.qrow = sp.q_begin + i;
  ri.head = u.g0 * c.G + r % c.G;
  const int64_t ctx = sp.seq_len - sp.q_len;
  const int64_t qpos = c.s.causal == Causal::top_left ? i : ctx + i;
  ri.hi = c.s.causal == Causal::none ? sp.seq_len - 1 : std::min(qpos, sp.seq_len - 1);
  ri.lo = c.s.window_left >= 0 ? std::max<int64_t>(0, qpos - c.s.window_left) : 0;
  return ri;
}

const uint8_t* k_row(const Ctx& c, const SeqPages& sp, int64_t g, int64_t j) {
  const int64_t bs = c.s.cache.block_size;
  return c.a.k_cache + c.s.cache.offset(sp.pages[j / bs], j % bs, g);
}
const uint8_t* v_row(const Ctx& c, const SeqPages& sp, int64_t g, int64_t j) {
  if (c.s.v_from_k) return k_row(c, sp, g, j);
  const int64_t bs = c.s.cache.block_size;
  return c.a.v_cache + c.vshape.offset(sp.pages[j / bs], j % bs, g);
}

float logit_scale(const Ctx& c, float sk) {
  const float c1 = static_cast<float>(c.s.scale() * static_cast<double>(sk));
  return c1 * c.c_log2e;
}

// Soft-cap (cap > 0): t = RN32(cl·tanh_fast(RN32(c1'·acc))), c1' = RN32(sm_scale·sk / cap) (f64, rounded once),
// cl = RN32(cap·log2 e): the base-2 logit of cap·tanh(l / cap). The per-lane multiplier of the AMX path is c1' then.
float capped_scale(const Ctx& c, float sk) {
  return static_cast<float>(c.s.scale() * static_cast<double>(sk) / c.s.softcap);
}
float cap_log2e(const Ctx& c) { return static_cast<float>(c.s.softcap * 1.44269504088896340736); }

// tanh for the soft-cap, absolute error <= kFastTanhErr (derivation: include/fp8ref/attention.h, convention fast):
// sign(u)·RN32(RN32(1 − e) / RN32(1 + e)), e = exp2(−RN32(c_t·|u|)) by Sleef's exp2 (0 where that argument is below
// −126), c_t = RN32(2·log2 e); a NaN u stays NaN.
constexpr float kTwoLog2e = 2.88539008177792681472f;
float tanh_fast(float u) {
  if (std::isnan(u)) return u;
  const float z = kTwoLog2e * std::fabs(u);
  const float e = z <= 126.0f ? ref::exp2_sleef(-z) : 0.0f;
  return std::copysign((1.0f - e) / (1.0f + e), u);
}

// ---- portable path ------------------------------------------------------------------------------------------------

// One KV head (u.g0) of a unit.
void unit_portable_head(const Ctx& c, const Unit& u) {
  const SeqPages sp = seq_pages(c.s, c.a, u.b);
  const int64_t si = scale_index(c.s.scale_kind, u.b, u.g0);
  const float sk = c.a.k_scale[si], sv = c.s.v_from_k ? sk : c.a.v_scale[si];
  const bool capped = c.s.softcap > 0;
  const float c2 = capped ? capped_scale(c, sk) : logit_scale(c, sk), cl = capped ? cap_log2e(c) : 0.0f;
  const Format f = c.s.cache.format;
  std::vector<float> q(static_cast<size_t>(c.Dk)), k(static_cast<size_t>(c.Dk)), o(static_cast<size_t>(c.Dv));
  for (int64_t r = u.r0; r < u.r1; ++r) {
    const RowInfo ri = row_info(c, sp, u, r);
    const int64_t qbase = (ri.qrow * c.Hq + ri.head) * c.Dk;
    for (int64_t d = 0; d < c.Dk; ++d) q[static_cast<size_t>(d)] = bf16_val(q_tilde(c.s.q_format, c.a.q, qbase + d));
    std::fill(o.begin(), o.end(), 0.0f);
    float m2 = -std::numeric_limits<float>::infinity(), L = 0.0f;
    bool nan_row = false, any_key = false;  // the NaN policy (attention.h, fast): a NaN or +Inf logit, or only −Inf
    for (int64_t j = ri.lo; j <= ri.hi; ++j) {
      const uint8_t* kr = k_row(c, sp, u.g0, j);
      float acc = 0.0f;
      for (int64_t d = 0; d < c.Dk; ++d) acc = std::fma(q[static_cast<size_t>(d)], fp8ref::ref::decode_f32(f, kr[d]), acc);
      const float x = capped ? cl * tanh_fast(acc * c2) : acc * c2;
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
        nan_row = true;
        break;
      }
      any_key = any_key || x > -std::numeric_limits<float>::infinity();  // (−Inf: weight 0 below)
      const float mn = std::max(m2, std::ceil(x));
      if (mn > m2) {  // exact power-of-two rescale (0 from −inf)
        const float alpha = m2 == -std::numeric_limits<float>::infinity()
                                ? 0.0f
                                : std::ldexp(1.0f, static_cast<int>(std::max(-300.0f, m2 - mn)));
        for (auto& v : o) v *= alpha;
        L *= alpha;
        m2 = mn;
      }
      const float z = x - m2;
      const float p = z >= -126.0f ? ref::exp2_sleef(z) : 0.0f;
      const float pt = bf16_val(bf16_rne(p));
      L += pt;
      const uint8_t* vr = v_row(c, sp, u.g0, j);
      for (int64_t d = 0; d < c.Dv; ++d) o[static_cast<size_t>(d)] = std::fma(pt, fp8ref::ref::decode_f32(f, vr[d]), o[static_cast<size_t>(d)]);
    }
    const int64_t obase = (ri.qrow * c.Hq + ri.head) * c.Dv;
    if (nan_row || (!any_key && ri.hi >= ri.lo)) {
      for (int64_t d = 0; d < c.Dv; ++d) store_out(c.s.out_format, c.a.out, obase + d, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float fac = L > 0 ? sv / L : 0.0f;
    for (int64_t d = 0; d < c.Dv; ++d) store_out(c.s.out_format, c.a.out, obase + d, L > 0 ? o[static_cast<size_t>(d)] * fac : 0.0f);
  }
}

// Every KV head of a unit (the vector paths hand a unit of several heads here when they cannot run it).
void unit_portable(const Ctx& c, const Unit& u) {
  for (int64_t g = u.g0; g < u.g1; ++g) unit_portable_head(c, Unit{u.b, g, g + 1, u.r0, u.r1});
}

// ---- AMX path -----------------------------------------------------------------------------------------------------

#define FP8REF_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16,amx-tile,amx-bf16")))
// The decode helpers shared with the AVX-512 BF16 path (a subset of both kernels' targets, so they inline into each).
#define FP8REF_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16")))

using fp8ref::cpu::TileCfg;  // (src/cpu/amx_tile.h)

// bf16 code-value tables of the 128 magnitudes: low bytes [0..127] and high bytes [0..127] (the sign is ORed in).
struct DecodeTables {
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t hi[128];
};

// The high byte of a decoded magnitude that is Inf or NaN (bf16 0x7F80 / 0x7FC0); every finite one's is smaller (the
// largest finite e4m3fn and e5m2 values are bf16 0x43E0 and 0x4760): the decode's non-finite scan (decode_pair_store).
constexpr uint8_t kNonfiniteHigh = 0x7F;

DecodeTables make_tables(Format f) {
  DecodeTables t;
  for (int m = 0; m < 128; ++m) {
    const float v = fp8ref::ref::decode_f32(f, static_cast<uint8_t>(m));
    const uint16_t h = bf16_rne(v);  // exact (NaN: quiet, Inf: Inf)
    t.lo[m] = static_cast<uint8_t>(h & 0xFF);
    t.hi[m] = static_cast<uint8_t>(h >> 8);
    if ((t.hi[m] >= kNonfiniteHigh) == std::isfinite(v))
      throw std::logic_error("attention fast: the decode table's high bytes do not mark the non-finite codes");
  }
  return t;
}

using Arena = std::unique_ptr<uint8_t, void (*)(void*)>;

// n zeroed buffers of the given sizes in one 4096-aligned allocation, buffer i at offset off[i] = 1 KiB · i modulo
// 4 KiB (a store to one buffer and a load from another never share address bits 0..11: no 4K aliasing).
Arena staggered_arena(const size_t* bytes, int n, size_t* off) {
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    at = (at + 4095) / 4096 * 4096 + static_cast<size_t>(i) * 1024;
    off[i] = at;
    at += bytes[i];
  }
  Arena a(static_cast<uint8_t*>(std::aligned_alloc(4096, (at + 4095) / 4096 * 4096)), std::free);
  if (!a) throw std::bad_alloc();
  std::memset(a.get(), 0, at);
  return a;
}

// The shape a per-thread scratch was set up for (scratch is kept across calls: thread_scratch): same() records the
// new shape and says whether it equals the old one (the buffers then fit as they are).
template <size_t N>
struct ShapeKey {
  std::array<int64_t, N> v;
  ShapeKey() { v.fill(-1); }
  bool same(const std::array<int64_t, N>& now) {
    if (now == v) return true;
    v = now;
    return false;
  }
};

struct Scratch {
  // The decode buffers, Q̃, O and one output row live in one 64-byte-aligned arena (AMX tile rows and the decode's
  // 64-byte stores each within one cache line), the buffers staggered by 1 KiB modulo 4 KiB so that a store to one
  // and a load from another never share address bits 0..11 (4K aliasing). Measured (same-process A/B, bench_attention
  // decode): the old std::vector buffers, 16 bytes off a line, ~8% slower; unstaggered ~2% slower.
  Arena arena{nullptr, std::free};
  uint16_t* kbuf = nullptr;  // [2][32][Dks] bf16 (AMX; the AVX-512 BF16 path: one, blocked)
  uint32_t* vbuf = nullptr;  // [2 heads][16 pairs][Dvp] (bf16 pairs)
  uint32_t* qb = nullptr;    // [heads][Dks/32][16 pairs][16 rows]
  float* obuf = nullptr;     // [heads][16][Dvp] (columns in decoded V order, vperm64)
  float* ord = nullptr;      // [Dvp]: one O row in d order
  std::vector<const uint8_t*> kp, vp;  // row pointers [2][heads][32]
  std::vector<const char*> pre;        // the next chunk's lines to prefetch (AMX)
  std::vector<uint16_t> qt;            // a unit's Q̃ rows of one head, d order [16][Dks] (AMX)
  alignas(64) float sbuf[kChunk * 16] = {};
  alignas(64) uint32_t pbuf[16 * 16] = {};  // P̃ rows [16][16 key pairs]

  // Kept per thread across calls (thread_scratch): set up again only when the path (0: AMX, 1: AVX-512 BF16), the KV
  // heads per unit, the loop heads per unit (KV heads or row blocks: Q̃ and O each) or the head dims change — a
  // decode step's call allocated and zeroed ~150 KiB per thread before, ~80 µs of page faults and memset at short
  // contexts (bench/RESULTS.md session 26). reuse: true when the buffers fit as they are.
  ShapeKey<5> shape;
  bool reuse(int64_t path, int64_t hg, int64_t loop_heads, int64_t dk, int64_t dv) {
    return shape.same({path, hg, loop_heads, dk, dv});
  }
  // The AMX path's sizes (two K buffers: one read by S, the next head's decoded under it).
  void allocate(int64_t hg, int64_t Dks, int64_t Dvp) {
    place({static_cast<size_t>(2 * kChunk * Dks) * 2, static_cast<size_t>(2 * (kChunk / 2) * Dvp) * 4,
           static_cast<size_t>(hg * (Dks / 32) * 16 * 16) * 4, static_cast<size_t>(hg * kRows * Dvp) * 4,
           static_cast<size_t>(Dvp) * 4});
  }
  // The AVX-512 BF16 path's (see there): kbuf [Dks / 64][kChunk][64] bf16, vbuf [16 key pairs][Dvp] (row blocks),
  // qb (Q̃ᵀ) [loop heads][Dks / 2][8] pairs, obuf [loop heads][8][Dvp]; pbuf's first 16·8 pairs; no ord.
  void allocate_bf16(int64_t hg, int64_t loop_heads, int64_t Dks, int64_t Dvp);

 private:
  void place(const std::array<size_t, 5>& bytes) {
    size_t off[5];
    arena = staggered_arena(bytes.data(), 5, off);
    kbuf = reinterpret_cast<uint16_t*>(arena.get() + off[0]);
    vbuf = reinterpret_cast<uint32_t*>(arena.get() + off[1]);
    qb = reinterpret_cast<uint32_t*>(arena.get() + off[2]);
    obuf = reinterpret_cast<float*>(arena.get() + off[3]);
    ord = reinterpret_cast<float*>(arena.get() + off[4]);
  }
};

struct AmxKernels {
  DecodeTables tab;
  alignas(64) int32_t tr[4][2][16];      // transpose16's permutex2var indices per stage (s = 8, 4, 2, 1)
};

// The decode tables and shuffle indices, in registers for a unit.
struct Regs {
  __m512i lo0, lo1, hi0, hi1, sign;
};

FP8REF_AVX512_TARGET inline Regs load_regs(const AmxKernels& K) {
  return {_mm512_load_si512(K.tab.lo), _mm512_load_si512(K.tab.lo + 64), _mm512_load_si512(K.tab.hi),
          _mm512_load_si512(K.tab.hi + 64),
          _mm512_set1_epi8(static_cast<char>(0x80))};
}

// 64 codes -> 64 bf16 code values, two 64-byte stores, in the order of the in-lane byte interleave (unpacklo/hi:
// one p5 cycle each where a cross-lane vpermi2b takes two): word p of the 64 holds code perm64(p) (below). The d
// order of a decoded K row and the column order of decoded V pairs are permuted this way within every 64-block; Q̃
// is packed in the same order (the dot products are order-free: AMX sums in its own order anyway) and O's columns
// are put back in order when the output is written.
// *mx = max(*mx, the magnitude's high byte) bytewise: kNonfiniteHigh exactly for the codes that are Inf or NaN
// (make_tables) — the looked-up byte itself, where c & 0x7F took one more instruction per 64 codes.
FP8REF_AVX512_TARGET inline void decode_pair(const Regs& g, __m512i c, __m512i* w0, __m512i* w1, __m512i* mx) {
  const __m512i lo = _mm512_permutex2var_epi8(g.lo0, c, g.lo1);
  __m512i hi = _mm512_permutex2var_epi8(g.hi0, c, g.hi1);
  *mx = _mm512_max_epu8(*mx, hi);
  hi = _mm512_ternarylogic_epi32(hi, c, g.sign, 0xF8);  // hi | (c & 0x80)
  *w0 = _mm512_unpacklo_epi8(lo, hi);
  *w1 = _mm512_unpackhi_epi8(lo, hi);
}
FP8REF_AVX512_TARGET inline void decode_pair_store(const Regs& g, __m512i c, uint16_t* dst, __m512i* mx) {
  __m512i w0, w1;
  decode_pair(g, c, &w0, &w1, mx);
  _mm512_storeu_si512(dst, w0);
  _mm512_storeu_si512(dst + 32, w1);
}

FP8REF_AVX512_TARGET inline __mmask64 tail_mask(int64_t m) { return m >= 64 ? ~__mmask64{0} : ((__mmask64{1} << m) - 1); }

// An output row in bf16, 16 at a time: bf16_rne(RN32(orow[d] · fac)) for d < Dv rounded down to 16 (vcvtneps2bf16
// would flush subnormal results to zero: the rounding here is bf16_rne's, on the bits); returns how many it wrote.
FP8REF_AVX512_TARGET inline int64_t out_row_bf16(const float* orow, float fac, int64_t Dv, uint16_t* o16) {
  const __m512 fv = _mm512_set1_ps(fac);
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF), quiet = _mm512_set1_epi32(0x40),
                inf = _mm512_set1_epi32(0x7F800000), mag = _mm512_set1_epi32(0x7FFFFFFF);
  int64_t d = 0;
  for (; d + 16 <= Dv; d += 16) {
    const __m512i b = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(orow + d), fv));
    const __m512i rne =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, half), _mm512_and_si512(_mm512_srli_epi32(b, 16), one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, mag), inf);  // NaN: quieted, as bf16_rne
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o16 + d),
                        _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(rne, nan, _mm512_srli_epi32(b, 16), quiet)));
  }
  return d;
}

// n codes (the rest of the 64-multiple row zero) -> bf16; the 64-code block b at dst + b·stride (stride 64: one row
// in natural order; the AVX-512 BF16 path blocks its K chunk [Dks / 64][kChunk][64]).
FP8REF_AVX512_TARGET inline void decode_row(const Regs& g, const uint8_t* src, int64_t n, uint16_t* dst, int64_t stride,
                                            __m512i* mx) {
  for (int64_t d = 0; d < n; d += 64)
    decode_pair_store(g, _mm512_maskz_loadu_epi8(tail_mask(n - d), src + d), dst + d / 64 * stride, mx);
}

// Two keys' V codes (b may be null: zeros) -> VNNI pairs (v_a[d], v_b[d]) for d < n (64-multiple): the codes
// byte-interleaved in lane (a_d b_d pairs), then decoded as above; dword q of each 64-block holds column vperm64(q).
FP8REF_AVX512_TARGET inline void decode_vpair(const Regs& g, const uint8_t* a, const uint8_t* b, int64_t n, uint32_t* dst,
                                            __m512i* mx) {
  for (int64_t d = 0; d < n; d += 64) {
    const __mmask64 mk = tail_mask(n - d);
    const __m512i ca = _mm512_maskz_loadu_epi8(mk, a + d);
    const __m512i cb = b ? _mm512_maskz_loadu_epi8(mk, b + d) : _mm512_setzero_si512();
    decode_pair_store(g, _mm512_unpacklo_epi8(ca, cb), reinterpret_cast<uint16_t*>(dst + d), mx);
    decode_pair_store(g, _mm512_unpackhi_epi8(ca, cb), reinterpret_cast<uint16_t*>(dst + d + 32), mx);
  }
}

// The orders above. Word p of a decoded 64-code block (two 32-word stores of unpacklo / unpackhi, 128-bit lanes L):
// store s = p / 32, lane L = (p % 32) / 8, i = p % 8 -> code 16·L + 8·s + i.
constexpr int64_t perm64(int64_t p) { return 16 * ((p % 32) / 8) + 8 * (p / 32) + p % 8; }
// Dword q of a decoded V block: decode_pair_store of x0 = unpacklo(ca, cb) (q < 32) or x1 = unpackhi (q >= 32);
// within it, word pair q' = q % 32 sits at words 2q', 2q' + 1 = bytes 2q', 2q' + 1 of x, i.e. byte-pair
// perm64(2q') / 2 of x, and byte pair j of x (lane L = j / 8, i = j % 8) holds column 16·L + 8·(q / 32) + i.
// The inverse of perm64: the word position of code c.
constexpr int64_t pos64(int64_t c) { return 32 * ((c % 16) / 8) + 8 * (c / 16) + c % 8; }
constexpr int64_t vperm64(int64_t q) {
  const int64_t j = perm64(2 * (q % 32)) / 2;
  return 16 * (j / 8) + 8 * (q / 32) + j % 8;
}
// perm64 as a table (the AMX path's per-unit Q̃ packing)
constexpr std::array<uint8_t, 64> kPerm64 = [] {
  std::array<uint8_t, 64> t{};
  for (size_t i = 0; i < 64; ++i) t[i] = static_cast<uint8_t>(perm64(static_cast<int64_t>(i)));
  return t;
}();
// The un-permuting of a 64-column block of O (column q holds d = vperm64(q)) by vector permutes: output vector o
// (d = 16·o + i) takes column c = vperm64⁻¹(d) from the block's vectors 0–1 (c < 32) or 2–3 (c >= 32), lane c % 32.
struct Unperm64 {
  int32_t idx[4][16];
  uint16_t hi[4];  // lanes whose column is >= 32
};
constexpr Unperm64 make_unperm64() {
  Unperm64 u{};
  for (int64_t q = 0; q < 64; ++q) {
    const int64_t d = vperm64(q);
    u.idx[d / 16][d % 16] = static_cast<int32_t>(q % 32);
    if (q >= 32) u.hi[d / 16] = static_cast<uint16_t>(u.hi[d / 16] | (1u << (d % 16)));
  }
  return u;
}
constexpr Unperm64 kUnperm64 = make_unperm64();

// ref::exp2_sleef's polynomial in s = z − round(z), Horner from the highest degree (both vector paths).
constexpr float kExp2Poly[7] = {0.1535920892e-3f, 0.1339262701e-2f, 0.9618384764e-2f, 0.5550347269e-1f,
                                0.2402264476e+0f, 0.6931471825e+0f, 1.0f};

// Sleef exp2 (ref::exp2_sleef's polynomial and steps) for z in [-126, 0]; lanes outside (or NaN) give 0.
FP8REF_AMX_TARGET inline __m512 exp2_vec(__m512 z) {
  const __mmask16 ok = _mm512_cmp_ps_mask(z, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 zc = _mm512_max_ps(z, _mm512_set1_ps(-126.0f));
  const __m512 u = _mm512_roundscale_ps(zc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 s = _mm512_sub_ps(zc, u);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(kExp2Poly[i]));
  return _mm512_maskz_mov_ps(ok, _mm512_scalef_ps(p, u));
}

// tanh_fast in lanes (the same steps but the division; a NaN lane stays NaN).
FP8REF_AMX_TARGET inline __m512 tanh_vec(__m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp2_vec(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-kTwoLog2e)));  // 0 below −126
  // (1 − e) / (1 + e) with the reciprocal by rcp14 and one Newton step (relative error <= 2^-27 + 2u; a division
  // here cost ~4% of the soft-capped kernel)
  const __m512 b = _mm512_add_ps(one, e), r0 = _mm512_rcp14_ps(b);
  const __m512 r = _mm512_fmadd_ps(r0, _mm512_fnmadd_ps(b, r0, one), r0);
  const __m512 t = _mm512_mul_ps(_mm512_sub_ps(one, e), r);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(u), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  const __m512 sgn_t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
  return _mm512_mask_mov_ps(sgn_t, _mm512_cmp_ps_mask(u, u, _CMP_UNORD_Q), u);
}

// 16×16 dword transpose in place (bit-swap stages: rows i / i+s exchange their off-diagonal s-blocks).
FP8REF_AMX_TARGET inline void transpose16(const AmxKernels& K, __m512i* r) {
  int st = 0;
  for (int s = 8; s >= 1; s >>= 1, ++st) {
    const __m512i xa = _mm512_load_si512(K.tr[st][0]), xb = _mm512_load_si512(K.tr[st][1]);
    for (int i = 0; i < 16; ++i) {
      if (i & s) continue;
      const __m512i a = r[i], b = r[i + s];
      r[i] = _mm512_permutex2var_epi32(a, xa, b);
      r[i + s] = _mm512_permutex2var_epi32(a, xb, b);
    }
  }
}

// The K and V row pointers of keys [j0, j0 + n) of KV head g: one division per chunk, rows stepped within a page.
void row_ptrs(const Ctx& c, const SeqPages& sp, int64_t g, int64_t j0, int64_t n, const uint8_t** kp, const uint8_t** vp) {
  const int64_t bs = c.s.cache.block_size;
  const int64_t ks = c.s.cache.layout == KvLayout::nhd ? c.s.cache.num_kv_heads * c.s.cache.head_dim : c.s.cache.head_dim;
  const int64_t vs = c.vshape.layout == KvLayout::nhd ? c.vshape.num_kv_heads * c.vshape.head_dim : c.vshape.head_dim;
  int64_t page = j0 / bs, slot = j0 % bs;
  for (int64_t k = 0; k < n;) {
    const int64_t blk = sp.pages[page];
    const uint8_t* kb = c.a.k_cache + c.s.cache.offset(blk, slot, g);
    const uint8_t* vb = c.s.v_from_k ? kb : c.a.v_cache + c.vshape.offset(blk, slot, g);
    const int64_t m = std::min(n - k, bs - slot);
    for (int64_t i = 0; i < m; ++i, ++k) {
      kp[k] = kb + i * ks;
      vp[k] = c.s.v_from_k ? kp[k] : vb + i * vs;
    }
    ++page;
    slot = 0;
  }
}

// The K and V row pointers of two chunks (this one, the next) for a unit's heads, [2][heads][kChunk] in the thread's
// vectors: set(buf, j0, n) fills buffer buf with keys [j0, j0 + n) of every head; next(cur, j0, HI) the next chunk's
// (none past HI) into buffer cur ^ 1 and returns how many keys it has.
struct ChunkRows {
  const Ctx& c;
  const SeqPages& sp;
  const Unit& u;
  const uint8_t** kp[2];
  const uint8_t** vp[2];
  // (and the first chunk's, keys LO .. HI: none when LO > HI)
  ChunkRows(const Ctx& cx, const SeqPages& s, const Unit& un, std::vector<const uint8_t*>& k, std::vector<const uint8_t*>& v,
            int64_t LO, int64_t HI)
      : c(cx), sp(s), u(un), kp{k.data(), k.data() + (un.g1 - un.g0) * kChunk}, vp{v.data(), v.data() + (un.g1 - un.g0) * kChunk} {
    if (LO <= HI) set(0, LO, std::min<int64_t>(kChunk, HI + 1 - LO));
  }
  void set(int64_t buf, int64_t j0, int64_t n) {
    for (int64_t gi = 0; gi < u.g1 - u.g0; ++gi) row_ptrs(c, sp, u.g0 + gi, j0, n, kp[buf] + gi * kChunk, vp[buf] + gi * kChunk);
  }
  int64_t next(int64_t cur, int64_t j0, int64_t HI) {
    if (j0 + kChunk > HI) return 0;
    const int64_t nn = std::min<int64_t>(kChunk, HI + 1 - (j0 + kChunk));
    set(cur ^ 1, j0 + kChunk, nn);
    return nn;
  }
};

// The next chunk's K and V rows of every head of the unit, one 64-byte line a tick, in address order (key by key: the
// K rows of the unit's heads, then their V rows — one span each where the heads of a slot lie back to back, as in
// NHD, else head by head) into L2, ticked from the AVX-512 BF16 path's P̃·V loop (the AMX path lists the same lines
// from its row pointers instead: unit_amx), so the lines are requested at
// a steady pace through the chunk's compute. Measured for the AVX-512 BF16 path on Zen 4 (decode B=32
// ctx=4096, 2 threads, `bench_attention --conv fast`; "A/B": two variants alternated call by call in one process):
// the AVX2 path's scheme (the next head-chunk's rows into L1 in one burst at its decode) 36–53 ms; the next
// head-chunk paced 41–44 ms; the next chunk paced into L1 26–31 ms, into L2 21–25 ms (alternated runs); two or three
// chunks ahead equal (A/B); ticks in the S loop as well (every other d pair, one a P̃·V step) 26.0–28.5 vs 24.2–24.5
// ms (A/B); no software prefetch 55 ms, or 35 ms with the chunk decoded for every head first in address order (A/B:
// the hardware prefetchers then follow, but not as well); only each 1 KiB or 4 KiB line of the rows 41 ms (A/B). The
// prefetches of a burst stall in the line-fill buffers and on 4 KiB-page walks (45 % of the samples sat on a
// prefetcht0; with the cache on 2 MiB pages the burst scheme ran at 26.6 ms). A tick is a prefetch, an add and a
// compare (the line address from the cache layout once per span, not per line): 1 thread 47.9 -> 44.9 ms (best of
// three alternated runs; bench/RESULTS.md session 17).
struct PrefetchCursor {
  const Ctx* c = nullptr;
  const SeqPages* sp = nullptr;
  int64_t g0 = 0, heads = 0, key = 0, kend = 0, lkv = 0, h = 0, page = 0, slot = 0;  // lkv: lines per key and head
  int part = 0;                      // 0: K rows, 1: V rows
  bool kspan = false, vspan = false;  // the heads' rows of a slot lie back to back (NHD): one span for all of them
  const char* p = nullptr;           // the next line to prefetch, and the end of the current span
  const char* end = nullptr;
  // keys [a, b) of heads [g0, g0 + hg)
  void start(const Ctx& cx, const SeqPages& s, int64_t g, int64_t hg, int64_t a, int64_t b) {
    c = &cx;
    sp = &s;
    g0 = g;
    heads = hg;
    key = a;
    kend = b;
    lkv = (cx.Dk + 63) / 64 + (cx.s.v_from_k ? 0 : (cx.Dv + 63) / 64);
    kspan = hg == 1 || cx.s.cache.offset(0, 0, 1) == cx.Dk;
    vspan = hg == 1 || cx.vshape.offset(0, 0, 1) == cx.Dv;
    h = 0;
    part = 0;
    if (key < kend) {
      page = sp->pages[key / cx.s.cache.block_size];
      slot = key % cx.s.cache.block_size;
      open();
    }
  }
  // p, end: the lines of (key, part, head h) — or of every head of the unit where they form one span
  void open() {
    const bool v = part == 1;
    const int64_t off = v ? c->vshape.offset(page, slot, g0 + h) : c->s.cache.offset(page, slot, g0 + h);
    const char* base = reinterpret_cast<const char*>((v ? c->a.v_cache : c->a.k_cache) + off);
    const int64_t len = (v ? c->Dv : c->Dk) * ((v ? vspan : kspan) ? heads : 1);
    p = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) & ~uintptr_t{63});
    end = base + len;
  }
  void advance() {
    if (!(part == 1 ? vspan : kspan) && ++h < heads) return open();
    h = 0;
    if (part == 0 && !c->s.v_from_k) {
      part = 1;
      return open();
    }
    part = 0;
    if (++key >= kend) return;
    if (++slot == c->s.cache.block_size) {
      slot = 0;
      page = sp->pages[key / c->s.cache.block_size];
    }
    open();
  }
  void tick() {
    if (key >= kend) return;
    _mm_prefetch(p, _MM_HINT_T1);
    p += 64;
    if (p >= end) advance();
  }
  void drain() {  // the lines the ticks did not reach
    while (key < kend) tick();
  }
};

// Returns false (nothing written) when the unit's queries or the codes it reads hold a non-finite value: the caller
// runs the portable path then (the NaN policy).
// DK: the head dims when both are DK (128: the decode loops unrolled, their masks and divisions folded), else 0.
template <int64_t DK>
FP8REF_AMX_TARGET bool unit_amx(const Ctx& c, const AmxKernels& K, Scratch& w, const Unit& u) {
  const int64_t Dk = DK ? DK : c.Dk, Dv = DK ? DK : c.Dv;
  const SeqPages sp = seq_pages(c.s, c.a, u.b);
  // Row blocks (a prefill chunk's unit of one KV head with more than kRows rows): blocks of kRows rows, each run as a
  // "head" of the loops below (its own Q̃, O, softmax state and visible ranges) over one shared decode of every
  // chunk's K and V — where units of kRows rows decoded the chunk once per 16 rows. kvi(gi): the KV head index (in
  // the unit) whose rows loop-head gi reads.
  const bool blocks = u.r1 - u.r0 > kRows;
  const int64_t R = blocks ? kRows : u.r1 - u.r0;
  const int64_t HG = blocks ? (u.r1 - u.r0 + kRows - 1) / kRows : u.g1 - u.g0;  // loop heads
  const int64_t HKV = u.g1 - u.g0;                                              // KV heads (1 with blocks)
  const auto kvi = [blocks](int64_t gi) { return blocks ? int64_t{0} : gi; };
  // whether loop-head gi has a row r (a last block's rows may end early), and its row info (q head included)
  const auto exists = [&](int64_t gi, int64_t r) { return r < R && (!blocks || u.r0 + gi * kRows + r < u.r1); };
  const auto rinfo = [&](int64_t gi, int64_t r) {
    RowInfo x = row_info(c, sp, u, u.r0 + (blocks ? gi * kRows : 0) + r);
    if (!blocks) x.head += gi * c.G;
    return x;
  };
  const int64_t Dks = round_up(Dk, 64), Dvp = round_up(Dv, 64);
  const int64_t nb = Dks / 32, qbs = nb * 16 * 16, obs = kRows * Dvp;
  const Regs g = load_regs(K);
  // Lanes: with R <= 8 rows, two KV heads share the softmax vectors (head gi in lanes 0..7, gi + 1 in 8..15);
  // otherwise one head per slot (lanes 0..R-1). A slot = the heads sharing lanes.
  const int64_t LW = R <= 8 ? 8 : 16, PH = 16 / LW;  // lanes per head, heads per slot
  // rows: visible ranges per slot lane (a slot's heads share the lanes; without blocks every head's are the same)
  const int64_t NS = (HG + PH - 1) / PH;  // slots
  alignas(64) int32_t lo_a[kMaxHeads][16], hi_a[kMaxHeads][16];
  int64_t LO = std::numeric_limits<int64_t>::max(), HI = -1;
  for (int64_t sl = 0; sl < NS; ++sl)
    for (int64_t l = 0; l < 16; ++l) {
      lo_a[sl][l] = std::numeric_limits<int32_t>::max();
      hi_a[sl][l] = -1;
      const int64_t gi = sl * PH + l / LW, r = l % LW;
      if (gi >= HG || !exists(gi, r)) continue;
      const RowInfo x = rinfo(gi, r);
      if (x.hi < x.lo) continue;
      lo_a[sl][l] = static_cast<int32_t>(x.lo);
      hi_a[sl][l] = static_cast<int32_t>(x.hi);
      LO = std::min(LO, x.lo);
      HI = std::max(HI, x.hi);
    }
  // per head: Q̃ packed as the B operand [Dks/32][16 pairs][R] (dwords = two consecutive positions of the decoded K
  // order: position p holds d = perm64), scales; per slot: state
  float sv[kMaxHeads];
  const bool capped = c.s.softcap > 0;
  const __m512 clv = _mm512_set1_ps(capped ? cap_log2e(c) : 0.0f);
  alignas(64) float c2a[kMaxHeads][16];
  __m512 m2[kMaxHeads], L[kMaxHeads];
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t gi = 0; gi < HG; ++gi) std::fill(w.obuf + gi * obs, w.obuf + gi * obs + R * Dvp, 0.0f);  // (rows < R)
  for (int64_t gi = 0; gi < HG; ++gi) {
    const int64_t kvh = u.g0 + kvi(gi), si = scale_index(c.s.scale_kind, u.b, kvh);
    const float sk = c.a.k_scale[si];
    sv[gi] = c.s.v_from_k ? sk : c.a.v_scale[si];
    const float mult = capped ? capped_scale(c, sk) : logit_scale(c, sk);  // soft-cap: c1' (cl after the tanh)
    if (!(std::fabs(mult) <= std::numeric_limits<float>::max())) return false;  // a NaN/Inf scale: the portable path
    for (int64_t l = 0; l < LW; ++l) c2a[gi / PH][(gi % PH) * LW + l] = mult;
    m2[gi] = ninf;
    L[gi] = _mm512_setzero_ps();
    uint32_t* qb = w.qb + gi * qbs;
    uint32_t qmax = 0;  // the largest |Q̃| bits: a NaN or Inf query goes to the portable path
    for (int64_t r = 0; r < R; ++r) {
      uint16_t* qt = w.qt.data() + r * Dks;  // row r of Q̃ in d order, zero past Dk
      if (!exists(gi, r)) {  // (a last block's rows past the unit: zero)
        std::fill(qt, qt + Dk, uint16_t{0});
        continue;
      }
      const RowInfo x = rinfo(gi, r);
      const int64_t qbase = (x.qrow * c.Hq + x.head) * Dk;
      if (c.s.q_format == Format::bf16) {  // (q_tilde's bf16 case, inline)
        const uint16_t* q16 = static_cast<const uint16_t*>(c.a.q) + qbase;
        for (int64_t d = 0; d < Dk; ++d)
          qt[d] = (q16[d] & 0x7F80) == 0 ? static_cast<uint16_t>(q16[d] & 0x8000) : q16[d];
      } else {
        for (int64_t d = 0; d < Dk; ++d) qt[d] = q_tilde(c.s.q_format, c.a.q, qbase + d);
      }
      for (int64_t d = 0; d < Dk; ++d) qmax = std::max<uint32_t>(qmax, qt[d] & 0x7FFFu);
    }
    // position p of a decoded K row holds d = perm64(p) of its 64-block: dword (p / 2) of the head's [Dks / 2][R]
    // block is the positions p, p + 1 of each row (every dword written)
    for (int64_t b = 0; b < Dks; b += 64)
      for (int64_t j = 0; j < 32; ++j) {
        const uint16_t* t0 = w.qt.data() + b + kPerm64[2 * j];
        const uint16_t* t1 = w.qt.data() + b + kPerm64[2 * j + 1];
        uint32_t* dst = qb + (b / 2 + j) * R;
        for (int64_t r = 0; r < R; ++r) dst[r] = t0[r * Dks] | static_cast<uint32_t>(t1[r * Dks]) << 16;
      }
    if (qmax >= 0x7F80u) return false;
  }
  if (HG % PH) std::fill(c2a[HG / PH] + (HG % PH) * LW, c2a[HG / PH] + 16, 0.0f);
  TileCfg cfg;  // shapes shared by the S and the P̃·V phases
  cfg.rows[0] = 16, cfg.colsb[0] = static_cast<uint16_t>(4 * R);  // S^T keys 0..15: 16 keys × R rows f32
  cfg.rows[1] = 16, cfg.colsb[1] = static_cast<uint16_t>(4 * R);  // S^T keys 16..31
  cfg.rows[2] = 16, cfg.colsb[2] = static_cast<uint16_t>(4 * R);  // Q̃^T: 16 d pairs × R rows
  cfg.rows[3] = 16, cfg.colsb[3] = 64;                             // K keys 0..15 × 32 d / V: 16 key pairs × 16 d
  cfg.rows[4] = 16, cfg.colsb[4] = 64;                             // K keys 16..31 / V (odd d blocks)
  cfg.rows[5] = static_cast<uint8_t>(R), cfg.colsb[5] = 64;        // P̃: R rows × 32 keys bf16
  cfg.rows[6] = static_cast<uint8_t>(R), cfg.colsb[6] = 64;        // O: R rows × 16 d f32 (even d blocks)
  cfg.rows[7] = static_cast<uint8_t>(R), cfg.colsb[7] = 64;        // O (odd d blocks)
  _tile_loadconfig(&cfg);

  __m512i cmx = _mm512_setzero_si512();  // max of the decoded magnitudes' high bytes (decode_pair_store)
  const __m512i nonfinite = _mm512_set1_epi8(static_cast<char>(kNonfiniteHigh));
  ChunkRows rows(c, sp, u, w.kp, w.vp, LO, HI);
  auto& kp = rows.kp;
  auto& vp = rows.vp;
  // K rows go through two buffers: head gi's S reads one while the next head's rows (the next chunk's first head's
  // after the last head) are decoded into the other under S's tiles; the first head's rows before the loop. With row
  // blocks every block reads the chunk's one buffer, each decoding a share of the next chunk's rows under its S, and
  // the first block decodes the chunk's V pairs for all.
  int64_t kb = 0;  // the buffer holding the current head's K rows
  if (LO <= HI)
    for (int64_t k = 0; k < std::min<int64_t>(kChunk, HI + 1 - LO); ++k)
      decode_row(g, kp[0][k], Dk, w.kbuf + k * Dks, 64, &cmx);
  for (int64_t j0 = LO, cur = 0; j0 <= HI; j0 += kChunk, cur ^= 1) {
    const int64_t nk = std::min<int64_t>(kChunk, HI + 1 - j0), np = (nk + 1) / 2;
    const int64_t nx = cur ^ 1, nn = rows.next(cur, j0, HI);  // the next chunk's row pointers and keys
    // the next chunk's lines (every head, in address order) into L2, ticked through this chunk's work: per head a
    // tick per K row and two per V pair decoded, eight per P̃·V step; per slot two per key of the softmax. They are
    // listed once from the chunk's row pointers (a span per key where the heads' rows lie back to back, as in NHD);
    // a tick issues the next `per`. (PrefetchCursor, whose state machine ran per line out of line, cost ~10% here.)
    const bool kspan = HKV == 1 || c.s.cache.offset(0, 0, 1) == Dk;
    const bool vspan = HKV == 1 || c.vshape.offset(0, 0, 1) == Dv;
    int64_t nl = 0, ip = 0;
    const char** pre = w.pre.data();
    const auto list = [&](const uint8_t* row, int64_t len) {
      const char* r = reinterpret_cast<const char*>(row);
      const char* q = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(r) & ~uintptr_t{63});
      for (; q < r + len; q += 64) pre[nl++] = q;
    };
    for (int64_t k = 0; k < nn; ++k) {  // key by key: the heads' K rows (one span in NHD), then their V rows
      if (kspan) list(kp[nx][k], HKV * Dk);
      else
        for (int64_t gi = 0; gi < HKV; ++gi) list(kp[nx][gi * kChunk + k], Dk);
      if (c.s.v_from_k) continue;
      if (vspan) list(vp[nx][k], HKV * Dv);
      else
        for (int64_t gi = 0; gi < HKV; ++gi) list(vp[nx][gi * kChunk + k], Dv);
    }
    const int64_t points = (blocks ? 2 * kChunk : HG * 2 * kChunk) + HG * 8 * (Dvp / 32) + NS * 2 * kChunk;
    const int64_t per = (nl + points - 1) / points;
    auto tick = [&ip, pre, nl, per] {
      for (const int64_t e = std::min(ip + per, nl); ip < e; ++ip) _mm_prefetch(pre[ip], _MM_HINT_T1);
    };
    for (int64_t g0 = 0; g0 < HG; g0 += PH) {  // one slot: heads g0 .. g0 + nh − 1
      const int64_t nh = std::min(PH, HG - g0), slot = g0 / PH;
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t gi = g0 + h;
        // S^T = K · Q̃^T into lanes [h·LW, h·LW + R) of sbuf, two independent accumulation chains (keys 0..15,
        // 16..31); under each step's tiles a share of the next head's K rows and of this head's V pairs decoded
        // (keys past nk: V pairs zero, P̃ = 0 there)
        const uint8_t* const* vpc = vp[cur] + kvi(gi) * kChunk;
        uint32_t* vb = w.vbuf + h * (kChunk / 2) * Dvp;
        const int64_t npd = blocks && gi > 0 ? 0 : np;  // V pairs this head decodes
        for (int64_t k = np * 2; npd > 0 && k < kChunk; k += 2)
          std::memset(vb + (k / 2) * Dvp, 0, static_cast<size_t>(Dvp) * 4);
        const uint16_t* kcur = w.kbuf + kb * kChunk * Dks;
        uint16_t* knext = w.kbuf + (kb ^ 1) * kChunk * Dks;
        const uint8_t* const* ksrc = !blocks && gi + 1 < HG ? kp[cur] + (gi + 1) * kChunk : kp[nx];
        // the K rows [k0, k1) of ksrc this head decodes (blocks: its share of the next chunk's)
        const int64_t k0 = blocks ? nn * gi / HG : 0, k1 = blocks ? nn * (gi + 1) / HG : gi + 1 < HG ? nk : nn;
        const uint32_t* qb = w.qb + gi * qbs;
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t db = 0, kd = k0, vd = 0; db < nb; ++db) {
          _tile_loadd(2, qb + db * 16 * R, static_cast<int>(4 * R));
          _tile_loadd(3, kcur + db * 32, static_cast<int>(Dks * 2));
          _tile_loadd(4, kcur + 16 * Dks + db * 32, static_cast<int>(Dks * 2));
          _tile_dpbf16ps(0, 3, 2);
          _tile_dpbf16ps(1, 4, 2);
          for (const int64_t ke = k0 + (k1 - k0) * (db + 1) / nb; kd < ke; ++kd) {
            decode_row(g, ksrc[kd], Dk, knext + kd * Dks, 64, &cmx);
            tick();
          }
          for (const int64_t ve = npd * (db + 1) / nb; vd < ve; ++vd) {
            const int64_t k = 2 * vd;
            decode_vpair(g, vpc[k], k + 1 < nk ? vpc[k + 1] : nullptr, Dv, vb + vd * Dvp, &cmx);
            tick();
            tick();
          }
        }
        _tile_stored(0, w.sbuf + h * LW, 64);
        _tile_stored(1, w.sbuf + 16 * 16 + h * LW, 64);
        if (!blocks) kb ^= 1;
      }
      // logits, running maximum, rescale (lanes of the slot's heads)
      const __m512 c2v = _mm512_load_ps(c2a[slot]);
      const __m512i lo_v = _mm512_load_si512(lo_a[slot]), hi_v = _mm512_load_si512(hi_a[slot]);
      __m512 x[kChunk];
      __m512 cmax = ninf;
      for (int64_t k = 0; k < kChunk; ++k) {
        const __m512i jv = _mm512_set1_epi32(static_cast<int32_t>(j0 + k));
        const __mmask16 vis = k < nk ? static_cast<__mmask16>(_mm512_cmp_epi32_mask(jv, lo_v, _MM_CMPINT_NLT) &
                                                               _mm512_cmp_epi32_mask(jv, hi_v, _MM_CMPINT_LE))
                                     : __mmask16{0};
        const __m512 s = _mm512_load_ps(w.sbuf + k * 16);  // S^T row k: the slot's rows' dot products
        x[k] = capped ? _mm512_mask_mul_ps(ninf, vis, tanh_vec(_mm512_mul_ps(s, c2v)), clv)
                      : _mm512_mask_mul_ps(ninf, vis, s, c2v);
        cmax = _mm512_max_ps(cmax, x[k]);
        tick();
      }
      const __m512 mn = _mm512_max_ps(m2[slot], _mm512_roundscale_ps(cmax, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
      const __mmask16 changed = _mm512_cmp_ps_mask(mn, m2[slot], _CMP_GT_OQ);
      if (changed) {
        const __m512 alpha = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_sub_ps(m2[slot], mn));  // 2^(m2 − mn); 0 from −inf
        L[slot] = _mm512_mask_mul_ps(L[slot], changed, L[slot], alpha);
        alignas(64) float al[16];
        _mm512_store_ps(al, alpha);
        for (int64_t l = 0; l < 16; ++l) {
          if (!((changed >> l) & 1) || l % LW >= R || l / LW >= nh) continue;
          const __m512 a = _mm512_set1_ps(al[l]);
          float* orow = w.obuf + (g0 + l / LW) * obs + (l % LW) * Dvp;
          for (int64_t d = 0; d < Dvp; d += 16) _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), a));
        }
        m2[slot] = mn;
      }
      // P̃ = RN_bf16(exp2(t' − m2)); L += P̃; pairs of keys -> dwords, transposed to rows (lane l -> pbuf row l)
      __m512i pr[16];
      __m512 Lg = L[slot];
      for (int64_t i = 0; i < 16; ++i) {
        const __m512 p0 = exp2_vec(_mm512_sub_ps(x[2 * i], m2[slot]));
        const __m512 p1 = exp2_vec(_mm512_sub_ps(x[2 * i + 1], m2[slot]));
        const __m512i b0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p0));
        const __m512i b1 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p1));
        Lg = _mm512_add_ps(Lg, _mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)));
        Lg = _mm512_add_ps(Lg, _mm512_castsi512_ps(_mm512_slli_epi32(b1, 16)));
        pr[i] = _mm512_or_si512(b0, _mm512_slli_epi32(b1, 16));
        tick();
        tick();
      }
      L[slot] = Lg;
      transpose16(K, pr);
      for (int64_t l = 0; l < 16; ++l) _mm512_store_si512(w.pbuf + l * 16, pr[l]);
      // O += P̃ · V per head of the slot, two 16-d blocks at a time (independent tiles)
      for (int64_t h = 0; h < nh; ++h) {
        float* obuf = w.obuf + (g0 + h) * obs;
        const uint32_t* vb = w.vbuf + h * (kChunk / 2) * Dvp;
        _tile_loadd(5, w.pbuf + h * LW * 16, 64);
        for (int64_t db = 0; db < Dvp / 16; db += 2) {
          _tile_loadd(6, obuf + db * 16, static_cast<int>(Dvp * 4));
          _tile_loadd(3, vb + db * 16, static_cast<int>(Dvp * 4));
          _tile_loadd(7, obuf + db * 16 + 16, static_cast<int>(Dvp * 4));
          _tile_loadd(4, vb + db * 16 + 16, static_cast<int>(Dvp * 4));
          _tile_dpbf16ps(6, 5, 3);
          for (int t = 0; t < 4; ++t) tick();
          _tile_dpbf16ps(7, 5, 4);
          for (int t = 0; t < 4; ++t) tick();
          _tile_stored(6, obuf + db * 16, static_cast<int>(Dvp * 4));
          _tile_stored(7, obuf + db * 16 + 16, static_cast<int>(Dvp * 4));
        }
      }
    }
    if (blocks) kb ^= 1;  // (the next chunk's rows, decoded by the blocks' shares)
    for (; ip < nl; ++ip) _mm_prefetch(pre[ip], _MM_HINT_T1);
    if (_mm512_cmpge_epu8_mask(cmx, nonfinite)) return false;  // a non-finite code: the portable path
  }
  for (int64_t gi = 0; gi < HG; ++gi) {
    alignas(64) float Ls[16];
    _mm512_store_ps(Ls, L[gi / PH]);
    for (int64_t r = 0; r < R && exists(gi, r); ++r) {
      const float Lr = Ls[(gi % PH) * LW + r];
      const RowInfo x = rinfo(gi, r);
      const int64_t obase = (x.qrow * c.Hq + x.head) * Dv;
      const float fac = Lr > 0 ? sv[gi] / Lr : 0.0f;
      const float* orow = w.ord;  // O's row with its columns back in d order
      const float* ob = w.obuf + gi * obs + r * Dvp;
      for (int64_t b = 0; b < Dvp; b += 64) {
        const __m512 v0 = _mm512_loadu_ps(ob + b), v1 = _mm512_loadu_ps(ob + b + 16), v2 = _mm512_loadu_ps(ob + b + 32),
                     v3 = _mm512_loadu_ps(ob + b + 48);
        for (int o = 0; o < 4; ++o) {
          const __m512i ix = _mm512_loadu_si512(kUnperm64.idx[o]);
          const __m512 lo = _mm512_permutex2var_ps(v0, ix, v1), hi = _mm512_permutex2var_ps(v2, ix, v3);
          _mm512_storeu_ps(w.ord + b + 16 * o, _mm512_mask_blend_ps(kUnperm64.hi[o], lo, hi));
        }
      }
      int64_t d = 0;
      if (c.s.out_format == Format::bf16 && Lr > 0)
        d = out_row_bf16(orow, fac, Dv, static_cast<uint16_t*>(c.a.out) + obase);
      for (; d < Dv; ++d) store_out(c.s.out_format, c.a.out, obase + d, Lr > 0 ? orow[d] * fac : 0.0f);
    }
  }
  return true;
}

FP8REF_AMX_TARGET void tile_release() { _tile_release(); }

// F over n values in lanes (fast_exp2 and fast_tanh, for the tests of their accuracy).
template <__m512 (*F)(__m512)>
FP8REF_AMX_TARGET void map_lanes(const float* x, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, F(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// The CPU and OS have what the AVX-512 BF16 path's target needs (AVX-512 F/BW/DQ/VL/VBMI, AVX512_BF16, the OS's
// AVX-512 state): cpu_has_avx512bf16 (src/cpu/rmsnorm_quant_avx512.cc, shared with rmsnorm_quant and quantize).
bool bf16_usable() { return fp8ref::cpu::cpu_has_avx512bf16(); }

// bf16_usable and AMX: leaf 7.0 EDX AMX-BF16 (22), AMX-TILE (24); XCR0 XTILECFG/XTILEDATA (17, 18); the tile state
// granted by arch_prctl.
bool amx_usable() {
  static const bool ok = [] {
    if (!bf16_usable()) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1) || !((d >> 24) & 1)) return false;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

AmxKernels make_kernels(Format f) {
  AmxKernels k;
  k.tab = make_tables(f);
  int st = 0;
  for (int sh = 8; sh >= 1; sh >>= 1, ++st)
    for (int j = 0; j < 16; ++j) {
      k.tr[st][0][j] = (j & sh) ? 16 + (j - sh) : j;
      k.tr[st][1][j] = (j & sh) ? 16 + j : j + sh;
    }
  return k;
}

// The decode tables of a cache format, built once per process (a call built them each time).
const AmxKernels& kernels_of(Format f) {
  static std::mutex m;
  static std::vector<std::pair<Format, std::unique_ptr<AmxKernels>>> made;
  const std::lock_guard<std::mutex> lock(m);
  for (const auto& e : made)
    if (e.first == f) return *e.second;
  made.emplace_back(f, std::make_unique<AmxKernels>(make_kernels(f)));
  return *made.back().second;
}

// The calling thread's scratch of a path (Scratch: AMX and AVX-512 BF16; Avx2Scratch), kept across calls. On the
// heap: as a thread_local object (in the TLS block) Scratch's sbuf / pbuf sat elsewhere relative to the arena's
// buffers, and the AMX unit ran 1.5–3 % slower (bench_attention --hot 32, 1 thread, alternated runs: 25.8–26.2 vs
// 24.4–24.6 ms).
template <class S>
S& thread_scratch() {
  thread_local std::unique_ptr<S> w;
  if (!w) w = std::make_unique<S>();
  return *w;
}

// ---- AVX2 path ----------------------------------------------------------------------------------------------------
// CPUs with AVX2, FMA and F16C but no AMX (AMD Zen 2-4, Intel before Sapphire Rapids; chosen at run time). The same
// arithmetic as the portable path, in f32 lanes: one unit = (sequence, KV heads, <= 8 rows per head), keys in chunks
// of 32.
//   Decode: 16 codes -> f16 patterns by integer ops (e5m2: c << 8, its f16 bits; e4m3fn: sign | (c & 0x7F) << 7,
//     the f16 of value·2^-8, subnormals included) -> f32 by vcvtph2ps, exactly. e4m3fn's 2^-8 is put back exactly:
//     c2 (logits) is taken ·2^8 and O (f32, the values ·2^-8) ·2^8 before the final factor RN32(sv / L); products
//     and sums of the scaled values are the unscaled ones ·2^-8 (exact power-of-two steps, the f32 subnormal range
//     aside, which the bound's η terms cover).
//   S = K·Q̃^T: per key, 8 row accumulators of 8 lanes (f32 FMA, d in blocks of 16), reduced by an hadd tree into
//   one vector of the 8 rows' dot products; then the logits, the integer running maximum, exp2 (the Sleef steps of
//   ref::exp2_sleef, bit for bit), P̃ = RN_bf16(p) and L += P̃ as in the AMX path, with the rows in lanes.
//   O += P̃·V: V's chunk decoded to f32 once, then 4 rows × 16 d register tiles over the chunk's keys.
//   A unit whose queries or codes hold a non-finite value (e4m3fn NaN, e5m2 Inf/NaN; max of c & 0x7F per chunk) is
//   redone by the portable path (masked keys would otherwise turn 0·Inf into NaN for rows that cannot see them).
//   A decode step's KV heads form one unit (as in the AMX path: each page's slots read whole, K/V once per head);
//   within a chunk the heads go one after another; during a head's S loop its V rows and the next head-chunk's K
//   rows are prefetched key by key.
// Scratch per thread: per KV head of the unit Q̃ 8·Dk and O 8·Dv f32; the V chunk 32·Dv f32, P̃ 32·8 f32, row
// pointers of two chunks.

#define FP8REF_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

constexpr int64_t kAvxRows = 8;

struct Avx2Scratch {
  Arena arena{nullptr, std::free};
  float* q = nullptr;     // [heads][8][Dkp] Q̃ values (rows past R and d past Dk zero)
  float* o = nullptr;     // [heads][8][Dvp]
  float* vbuf = nullptr;  // [kChunk][Dvp]
  float* kbuf = nullptr;  // [kChunk][Dkp] (row blocks: the chunk's K rows, decoded once)
  alignas(32) float pbuf[kChunk * kAvxRows] = {};
  std::vector<const uint8_t*> kp, vp;  // row pointers [2][heads][kChunk]

  // KV heads and loop heads (KV heads or row blocks: Q̃ and O each) per unit, Dkp, Dvp of the buffers (kept per
  // thread across calls: thread_scratch)
  ShapeKey<4> shape;
  void allocate(int64_t hg, int64_t loop_heads, int64_t Dkp, int64_t Dvp) {
    if (shape.same({hg, loop_heads, Dkp, Dvp})) return;
    kp.assign(static_cast<size_t>(2 * hg * kChunk), nullptr);
    vp.assign(static_cast<size_t>(2 * hg * kChunk), nullptr);
    const size_t bytes[4] = {static_cast<size_t>(loop_heads * kAvxRows * Dkp) * 4,
                             static_cast<size_t>(loop_heads * kAvxRows * Dvp) * 4, static_cast<size_t>(kChunk * Dvp) * 4,
                             static_cast<size_t>(kChunk * Dkp) * 4};
    size_t off[4];
    arena = staggered_arena(bytes, 4, off);
    q = reinterpret_cast<float*>(arena.get() + off[0]);
    o = reinterpret_cast<float*>(arena.get() + off[1]);
    vbuf = reinterpret_cast<float*>(arena.get() + off[2]);
    kbuf = reinterpret_cast<float*>(arena.get() + off[3]);
  }
};

// 16 codes (n < 16: the first n, the rest zero) -> two vectors of f32 values (e4m3fn: ·2^-8); *mx = max(*mx, c & 0x7F).
template <bool E5M2>
FP8REF_AVX2_TARGET inline void decode16(const uint8_t* src, int64_t n, __m128i* mx, __m256& a, __m256& b) {
  __m128i c;
  if (n >= 16) {
    c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  } else {
    alignas(16) uint8_t t[16] = {};
    std::memcpy(t, src, static_cast<size_t>(std::max<int64_t>(n, 0)));
    c = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
  }
  *mx = _mm_max_epu8(*mx, _mm_and_si128(c, _mm_set1_epi8(0x7F)));
  __m256i w = _mm256_cvtepi8_epi16(c);
  if (E5M2) w = _mm256_slli_epi16(w, 8);
  else w = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBF80)));
  a = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
  b = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

// ref::exp2_sleef for z in [-126, 0], bit for bit; lanes outside (or NaN) give 0.
FP8REF_AVX2_TARGET inline __m256 exp2_avx2(__m256 z) {
  const __m256 lim = _mm256_set1_ps(-126.0f);
  const __m256 ok = _mm256_cmp_ps(z, lim, _CMP_GE_OQ);
  const __m256 zc = _mm256_max_ps(z, lim);
  const __m256 u = _mm256_round_ps(zc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 s = _mm256_sub_ps(zc, u);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(kExp2Poly[i]));
  // 2^u for u in [-126, 0]: a normal f32 built from its exponent; p·2^u rounds once, as ldexp does
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(u), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(ok, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// tanh_fast in lanes, bit for bit (the division included); a NaN lane stays NaN.
FP8REF_AVX2_TARGET inline __m256 tanh_avx2(__m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 e = exp2_avx2(_mm256_mul_ps(_mm256_andnot_ps(sign, u), _mm256_set1_ps(-kTwoLog2e)));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 st = _mm256_or_ps(t, _mm256_and_ps(u, sign));
  return _mm256_blendv_ps(st, u, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
}

// The 8 accumulators' lane sums, row r in lane r.
FP8REF_AVX2_TARGET inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// Rows 0..3 of acc[r] + acc[r + 4] summed, row r in lanes r and r + 4.
FP8REF_AVX2_TARGET inline __m256 reduce4(const __m256* a) {
  const __m256 b0 = _mm256_add_ps(a[0], a[4]), b1 = _mm256_add_ps(a[1], a[5]), b2 = _mm256_add_ps(a[2], a[6]),
               b3 = _mm256_add_ps(a[3], a[7]);
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
  return _mm256_add_ps(t, _mm256_permute2f128_ps(t, t, 0x01));
}

// Rows [0, R) of a unit of the AVX2 / AVX-512 BF16 paths (<= 8 rows, a row per lane): their visible key ranges in
// lo_a / hi_a (rows past R and rows that see nothing: an empty range), and [*LO, *HI] over them (*HI < *LO: none).
void lane_rows(const Ctx& c, const SeqPages& sp, const Unit& u, int32_t* lo_a, int32_t* hi_a, RowInfo* ri, int64_t* LO,
               int64_t* HI) {
  *LO = std::numeric_limits<int64_t>::max();
  *HI = -1;
  for (int64_t r = 0; r < kAvxRows; ++r) {
    lo_a[r] = std::numeric_limits<int32_t>::max();
    hi_a[r] = -1;
    if (r >= u.r1 - u.r0) continue;
    ri[r] = row_info(c, sp, u, u.r0 + r);  // q head of KV head g0 (+ gi·G for head g0 + gi)
    if (ri[r].hi >= ri[r].lo) {
      lo_a[r] = static_cast<int32_t>(ri[r].lo);
      hi_a[r] = static_cast<int32_t>(ri[r].hi);
      *LO = std::min(*LO, ri[r].lo);
      *HI = std::max(*HI, ri[r].hi);
    }
  }
}

// The scales part of lane_heads: sv[gi] and the logit multiplier mult[gi] (·ks) per KV head gi of the unit; false
// when a multiplier overflows.
bool lane_scales(const Ctx& c, const Unit& u, float ks, float* mult, float* sv) {
  const bool capped = c.s.softcap > 0;
  for (int64_t gi = 0; gi < u.g1 - u.g0; ++gi) {
    const int64_t si = scale_index(c.s.scale_kind, u.b, u.g0 + gi);
    const float sk = c.a.k_scale[si];
    sv[gi] = c.s.v_from_k ? sk : c.a.v_scale[si];
    mult[gi] = (capped ? capped_scale(c, sk) : logit_scale(c, sk)) * ks;  // exact, unless it overflows
    if (!(std::fabs(mult[gi]) <= std::numeric_limits<float>::max())) return false;
  }
  return true;
}

// Per KV head gi of a lane unit: sv[gi], the logit multiplier mult[gi] (·ks: the AVX2 path's e4m3fn scaling) and Q̃'s
// bf16 bits of each (row r < R, d) handed to put(gi, r, d, bits). False (the unit goes to the portable path) when a
// multiplier overflows or a query is NaN or ±Inf (the NaN policy).
template <class Put>
bool lane_heads(const Ctx& c, const Unit& u, const RowInfo* ri, float ks, float* mult, float* sv, Put&& put) {
  if (!lane_scales(c, u, ks, mult, sv)) return false;
  for (int64_t gi = 0; gi < u.g1 - u.g0; ++gi) {
    uint32_t qmax = 0;  // the largest |Q̃| bits
    for (int64_t r = 0; r < u.r1 - u.r0; ++r) {
      const int64_t qbase = (ri[r].qrow * c.Hq + ri[r].head + gi * c.G) * c.Dk;
      for (int64_t d = 0; d < c.Dk; ++d) {
        const uint32_t h = q_tilde(c.s.q_format, c.a.q, qbase + d);
        qmax = std::max(qmax, h & 0x7FFFu);
        put(gi, r, d, h);
      }
    }
    if (qmax >= 0x7F80u) return false;
  }
  return true;
}

// A lane unit's loop heads: its KV heads (<= kAvxRows rows, shared by the heads), or — a prefill chunk's unit of one KV
// head with more rows — row blocks of kAvxRows rows, each with its own rows, Q̃, O and softmax state, over one decode
// of each chunk's K and V (the AVX2 and AVX-512 BF16 paths; where units of kAvxRows rows decoded the whole context
// once per 8 rows). Row set b: the rows loop heads share (block b, or the unit's), as a unit su[b], with their
// visible ranges lo_a[b] / hi_a[b] and row infos ri[b] (q heads of KV head g0).
struct LaneBlocks {
  bool blocks;
  int64_t G, HKV, HG, NB;  // q heads per KV head; KV heads (1 with blocks), loop heads, row sets
  alignas(32) int32_t lo_a[kMaxHeads][kAvxRows], hi_a[kMaxHeads][kAvxRows];
  RowInfo ri[kMaxHeads][kAvxRows];
  Unit su[kMaxHeads];
  int64_t LO = std::numeric_limits<int64_t>::max(), HI = -1;  // keys any row sees
  LaneBlocks(const Ctx& c, const SeqPages& sp, const Unit& u)
      : blocks(u.r1 - u.r0 > kAvxRows), G(c.G), HKV(u.g1 - u.g0),
        HG(blocks ? (u.r1 - u.r0 + kAvxRows - 1) / kAvxRows : HKV), NB(blocks ? HG : 1) {
    for (int64_t b = 0; b < NB; ++b) {
      su[b] = blocks ? Unit{u.b, u.g0, u.g1, u.r0 + b * kAvxRows, std::min(u.r1, u.r0 + (b + 1) * kAvxRows)} : u;
      int64_t lo, hi;
      lane_rows(c, sp, su[b], lo_a[b], hi_a[b], ri[b], &lo, &hi);
      LO = std::min(LO, lo);
      HI = std::max(HI, hi);
    }
  }
  int64_t bi(int64_t gi) const { return blocks ? gi : 0; }   // loop-head gi's row set
  int64_t kvi(int64_t gi) const { return blocks ? 0 : gi; }  // its KV head, from g0
  int64_t rows(int64_t gi) const { return su[bi(gi)].r1 - su[bi(gi)].r0; }
  int64_t head0(int64_t gi) const { return kvi(gi) * G; }  // added to ri's q heads
  // loop-head gi's visible ranges in lanes
  FP8REF_AVX2_TARGET void ranges(int64_t gi, __m256i* lo, __m256i* hi) const {
    *lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_a[bi(gi)]));
    *hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_a[bi(gi)]));
  }
  // lane_heads per row set, put(gi, r, d, h) with gi the loop head
  template <class Put>
  bool heads(const Ctx& c, float ks, float* mult, float* sv, Put&& put) const {
    for (int64_t b = 0; b < NB; ++b)
      if (!lane_heads(c, su[b], ri[b], ks, mult, sv,
                      [&](int64_t g, int64_t r, int64_t d, uint32_t h) { put(blocks ? b : g, r, d, h); }))
        return false;
    return true;
  }
};

// A lane unit's soft-cap constant in lanes, and its loop heads' online-softmax state (running maxima −inf, sums 0).
// (The visible ranges in lanes: LaneBlocks::ranges.)
struct LaneState {
  __m256 clv;
  __m256 m2[kMaxHeads], L[kMaxHeads];
};
FP8REF_AVX2_TARGET inline void lane_state(const Ctx& c, int64_t HG, LaneState* st) {
  st->clv = _mm256_set1_ps(c.s.softcap > 0 ? cap_log2e(c) : 0.0f);
  for (int64_t gi = 0; gi < HG; ++gi) {
    st->m2[gi] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    st->L[gi] = _mm256_setzero_ps();
  }
}

// The base-2 logits t' of key j for the 8 rows in lanes (s: their dot products; c2v: the multiplier, c1' when capped;
// clv: cap·log2 e), −inf in the lanes of rows that do not see key j.
FP8REF_AVX2_TARGET inline __m256 lane_logits(__m256 s, __m256 c2v, __m256 clv, bool capped, int64_t j, __m256i lo_v,
                                             __m256i hi_v) {
  const __m256i jv = _mm256_set1_epi32(static_cast<int32_t>(j));
  const __m256 vis = _mm256_castsi256_ps(
      _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpgt_epi32(lo_v, jv), _mm256_cmpgt_epi32(jv, hi_v)), _mm256_set1_epi32(-1)));
  const __m256 t = capped ? _mm256_mul_ps(clv, tanh_avx2(_mm256_mul_ps(s, c2v))) : _mm256_mul_ps(s, c2v);
  return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), t, vis);
}

// The running maximum m2 (an integer per row) raised to ceil(cmax) where that is larger, with the exact
// power-of-two rescale of L and of the O rows [0, R) (ob: [8][Dvp] f32) where it grows (0 from −inf).
FP8REF_AVX2_TARGET inline void lane_running_max(__m256 cmax, int64_t R, float* ob, int64_t Dvp, __m256* m2, __m256* L) {
  const __m256 mn = _mm256_max_ps(*m2, _mm256_round_ps(cmax, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
  const int changed = _mm256_movemask_ps(_mm256_cmp_ps(mn, *m2, _CMP_GT_OQ));
  if (!changed) return;
  alignas(32) float a_m2[kAvxRows], a_mn[kAvxRows], al[kAvxRows];
  _mm256_store_ps(a_m2, *m2);
  _mm256_store_ps(a_mn, mn);
  for (int64_t r = 0; r < kAvxRows; ++r) {
    al[r] = 1.0f;
    if (!((changed >> r) & 1)) continue;
    al[r] = a_m2[r] == -std::numeric_limits<float>::infinity()
                ? 0.0f
                : std::ldexp(1.0f, static_cast<int>(std::max(-300.0f, a_m2[r] - a_mn[r])));
    if (r >= R) continue;
    const __m256 av = _mm256_set1_ps(al[r]);
    float* orow = ob + r * Dvp;
    for (int64_t d = 0; d < Dvp; d += 8) _mm256_store_ps(orow + d, _mm256_mul_ps(_mm256_load_ps(orow + d), av));
  }
  *L = _mm256_mul_ps(*L, _mm256_load_ps(al));
  *m2 = mn;
}

// RP: row accumulators of the S loop, 8 or (units of <= 4 rows) 4.
// Returns false (nothing written) when the unit's codes hold a non-finite value or its scales overflow the e4m3fn
// rescaling; the caller runs the portable path then.
// BLOCKS: the unit has row blocks (more than kAvxRows rows; RP 8) — a template argument so that the decode units'
// loops stay free of the blocks' branches (3.5 % slower with them, measured).
template <bool E5M2, int RP, bool BLOCKS = false>
FP8REF_AVX2_TARGET bool unit_avx2(const Ctx& c, Avx2Scratch& w, const Unit& u) {
  const SeqPages sp = seq_pages(c.s, c.a, u.b);
  // loop heads: the unit's KV heads (rows shared), or row blocks (LaneBlocks: the first block decodes the chunk's K
  // rows into kbuf and its V rows into vbuf, the others read them)
  const LaneBlocks lb(c, sp, u);
  constexpr bool blocks = BLOCKS;
  const int64_t HG = lb.HG, LO = lb.LO, HI = lb.HI, Dkp = round_up(c.Dk, 16), Dvp = round_up(c.Dv, 16);
  const int64_t qs = kAvxRows * Dkp, os = kAvxRows * Dvp;  // per-loop-head strides of Q̃ and O
  const bool capped = c.s.softcap > 0;
  const float KS = E5M2 ? 1.0f : 256.0f;
  // per loop head: Q̃ (rows past R and d past Dk zero), the logit multiplier (·2^8 for e4m3fn), sv, state
  float mult[kMaxHeads], sv[kMaxHeads];
  std::fill(w.q, w.q + HG * qs, 0.0f);
  if (!lb.heads(c, KS, mult, sv, [&](int64_t gi, int64_t r, int64_t d, uint32_t h) {
        w.q[gi * qs + r * Dkp + d] = bf16_val(static_cast<uint16_t>(h));
      }))
    return false;
  std::fill(w.o, w.o + HG * os, 0.0f);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  LaneState st;
  lane_state(c, HG, &st);
  __m128i mx = _mm_setzero_si128();
  const int64_t Dk16 = c.Dk / 16 * 16, Dv16 = c.Dv / 16 * 16;
  ChunkRows rows(c, sp, u, w.kp, w.vp, LO, HI);
  auto& kp = rows.kp;
  auto& vp = rows.vp;
  for (int64_t j0 = LO, cur = 0; j0 <= HI; j0 += kChunk, cur ^= 1) {
    const int64_t nk = std::min<int64_t>(kChunk, HI + 1 - j0), nx = cur ^ 1, nn = rows.next(cur, j0, HI);
    for (int64_t gi = 0; gi < HG; ++gi) {
      const int64_t R = lb.rows(gi);
      const bool have = blocks && gi > 0;  // kbuf and vbuf hold the chunk's rows (the first block decoded them)
      const uint8_t* const* kpc = kp[cur] + lb.kvi(gi) * kChunk;
      const uint8_t* const* vpc = vp[cur] + lb.kvi(gi) * kChunk;
      const float* q = w.q + gi * qs;
      float* ob = w.o + gi * os;
      const __m256 c2v = _mm256_set1_ps(mult[lb.kvi(gi)]);
      __m256i lo_v, hi_v;
      lb.ranges(gi, &lo_v, &hi_v);
      // S, logits, chunk maximum
      __m256 x[kChunk];
      __m256 cmax = ninf;
      for (int64_t k = 0; k < nk; ++k) {
        const uint8_t* kr = kpc[k];
        float* kd = w.kbuf + k * Dkp;  // (row blocks)
        // 8 accumulators: rows 0..7 (RP = 8), or rows 0..3 twice — the d halves of each 16-block apart — (RP = 4:
        // half the multiply-adds for a unit of <= 4 rows, still 8 independent chains)
        __m256 acc[kAvxRows];
        for (auto& a : acc) a = _mm256_setzero_ps();
        // M: 0 the K row decoded, 1 decoded and kept in kd (a first row block), 2 read from kd (the other blocks)
        const auto dots = [&](auto m) FP8REF_AVX2_TARGET {
          constexpr int M = decltype(m)::value;
          for (int64_t d = 0; d < Dkp; d += 16) {
            __m256 k0, k1;
            if constexpr (M == 2) {
              k0 = _mm256_load_ps(kd + d);
              k1 = _mm256_load_ps(kd + d + 8);
            } else {
              decode16<E5M2>(kr + d, d < Dk16 ? 16 : c.Dk - d, &mx, k0, k1);
              if constexpr (M == 1) {
                _mm256_store_ps(kd + d, k0);
                _mm256_store_ps(kd + d + 8, k1);
              }
            }
            if constexpr (RP == 8) {
              for (int64_t r = 0; r < kAvxRows; ++r) {
                acc[r] = _mm256_fmadd_ps(_mm256_load_ps(q + r * Dkp + d), k0, acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_load_ps(q + r * Dkp + d + 8), k1, acc[r]);
              }
            } else {
              for (int64_t r = 0; r < 4; ++r) {
                acc[r] = _mm256_fmadd_ps(_mm256_load_ps(q + r * Dkp + d), k0, acc[r]);
                acc[r + 4] = _mm256_fmadd_ps(_mm256_load_ps(q + r * Dkp + d + 8), k1, acc[r + 4]);
              }
            }
          }
        };
        if constexpr (!blocks) dots(std::integral_constant<int, 0>{});
        else if (have) dots(std::integral_constant<int, 2>{});
        else dots(std::integral_constant<int, 1>{});
        // prefetch, key by key: this head's V row (decoded right after the S loop) and the K row of the next
        // (head, chunk) in processing order — head gi + 1 of this chunk, or head 0 of the next chunk. Measured on
        // Zen 3 (bench_attention decode, alternating runs): a whole chunk of all heads ahead (64 KiB at D = 128, over
        // L1's 32 KiB) 1.6× slower than this; the V rows a head-chunk ahead as well 1.3× slower.
        // (row blocks: the first block prefetches this chunk's V rows, the last the next chunk's K rows)
        if (!c.s.v_from_k && !have)
          for (int64_t b = 0; b < c.Dv; b += 64) _mm_prefetch(reinterpret_cast<const char*>(vpc[k] + b), _MM_HINT_T0);
        if ((gi + 1 < HG && !blocks) || (gi + 1 == HG && k < nn)) {
          const uint8_t* pk = gi + 1 < HG ? kp[cur][(gi + 1) * kChunk + k] : kp[nx][k];
          for (int64_t b = 0; b < c.Dk; b += 64) _mm_prefetch(reinterpret_cast<const char*>(pk + b), _MM_HINT_T0);
        }
        x[k] = lane_logits(RP == 8 ? reduce8(acc) : reduce4(acc), c2v, st.clv, capped, j0 + k, lo_v, hi_v);
        cmax = _mm256_max_ps(cmax, x[k]);
      }
      lane_running_max(cmax, R, ob, Dvp, &st.m2[gi], &st.L[gi]);  // the running maximum, exact rescale of O and L
      // P̃ = RN_bf16(exp2(t' − m2)) (p >= 0: round half to even on the bits), L += P̃
      __m256 Lg = st.L[gi];
      for (int64_t k = 0; k < nk; ++k) {
        const __m256i b = _mm256_castps_si256(exp2_avx2(_mm256_sub_ps(x[k], st.m2[gi])));
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
        const __m256i rb = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), odd),
                                            _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
        const __m256 pt = _mm256_castsi256_ps(rb);
        Lg = _mm256_add_ps(Lg, pt);
        _mm256_store_ps(w.pbuf + k * kAvxRows, pt);
      }
      st.L[gi] = Lg;
      // V chunk -> f32 (row blocks: the first block's), then O += P̃·V in 4-row × 16-d tiles
      for (int64_t k = 0; k < (have ? 0 : nk); ++k) {
        const uint8_t* vr = vpc[k];
        float* vb = w.vbuf + k * Dvp;
        for (int64_t d = 0; d < Dvp; d += 16) {
          __m256 v0, v1;
          decode16<E5M2>(vr + d, d < Dv16 ? 16 : c.Dv - d, &mx, v0, v1);
          _mm256_store_ps(vb + d, v0);
          _mm256_store_ps(vb + d + 8, v1);
        }
      }
      for (int64_t r0 = 0; r0 < R; r0 += 4) {
        for (int64_t d = 0; d < Dvp; d += 16) {
          __m256 o[4][2];
          for (int i = 0; i < 4; ++i) {
            o[i][0] = _mm256_load_ps(ob + (r0 + i) * Dvp + d);
            o[i][1] = _mm256_load_ps(ob + (r0 + i) * Dvp + d + 8);
          }
          for (int64_t k = 0; k < nk; ++k) {
            const __m256 v0 = _mm256_load_ps(w.vbuf + k * Dvp + d), v1 = _mm256_load_ps(w.vbuf + k * Dvp + d + 8);
            const float* pk = w.pbuf + k * kAvxRows + r0;
            for (int i = 0; i < 4; ++i) {
              const __m256 p = _mm256_broadcast_ss(pk + i);
              o[i][0] = _mm256_fmadd_ps(p, v0, o[i][0]);
              o[i][1] = _mm256_fmadd_ps(p, v1, o[i][1]);
            }
          }
          for (int i = 0; i < 4; ++i) {
            _mm256_store_ps(ob + (r0 + i) * Dvp + d, o[i][0]);
            _mm256_store_ps(ob + (r0 + i) * Dvp + d + 8, o[i][1]);
          }
        }
      }
    }
    // a byte of mx >= 0x7F (e4m3fn NaN) / 0x7C (e5m2 Inf, NaN): max(mx, T) == mx there
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(mx, _mm_set1_epi8(E5M2 ? 0x7C : 0x7F)), mx))) return false;
  }
  for (int64_t gi = 0; gi < HG; ++gi) {
    alignas(32) float Ls[kAvxRows];
    _mm256_store_ps(Ls, st.L[gi]);
    const RowInfo* rg = lb.ri[lb.bi(gi)];
    for (int64_t r = 0; r < lb.rows(gi); ++r) {
      const int64_t obase = (rg[r].qrow * c.Hq + rg[r].head + lb.head0(gi)) * c.Dv;
      const float fac = Ls[r] > 0 ? sv[lb.kvi(gi)] / Ls[r] : 0.0f;
      const float* orow = w.o + gi * os + r * Dvp;
      for (int64_t d = 0; d < c.Dv; ++d)
        store_out(c.s.out_format, c.a.out, obase + d, Ls[r] > 0 ? (orow[d] * KS) * fac : 0.0f);
    }
  }
  return true;
}

// ---- AVX-512 BF16 path --------------------------------------------------------------------------------------------
// CPUs with AVX-512 (F, BW, VL, VBMI) and AVX512_BF16 but no AMX (AMD Zen 4 and 5, Intel Cooper Lake; chosen at run
// time). The AMX path's arithmetic — bf16 products (exact in f32) summed in f32 — by vdpbf16ps, twice the
// multiply-adds per instruction of the AVX2 path's f32 FMAs; the softmax steps are the AVX2 path's (rows in 8 lanes).
//   Decode: the AMX path's table decode — K rows as bf16 in the perm64 order into a buffer, the next 16 keys' rows
//     one 64-code block per step of S's loop (s16_bf16's KJob: under the multiply-adds, into the half of the buffer
//     S is not reading); V in registers inside the P̃·V loop (pv_fused), as VNNI pairs of keys in column order.
//   S = K·Q̃^T, 16 keys at a time: per key one accumulator of 16 lanes (row r's even d pairs in lane 2r, its odd
//     ones in 2r + 1); per two d pairs, Q̃^T's two pairs (8 rows' dwords each, interleaved; packed once per unit in
//     the decoded K order) times the key's two pairs broadcast as one qword (vdpbf16ps zmm): 16 independent chains;
//     the two halves summed at the end, so the rows land in 8 lanes as the softmax wants (s16_bf16).
//   Logits, the integer running maximum, exp2, P̃ = RN_bf16(p) (vcvtneps2bf16; p is 0 or >= 2^-126), L += P̃: as the
//     AVX2 path; P̃ of two keys interleaved per row (dword = the even key's P̃ low, the odd one's high).
//   O += P̃·V: O [8 rows][Dvp] f32 in memory, columns in order; 8 rows × 32 columns (4 rows × 64 for units of <= 4
//     rows: 16 zmm accumulators) per pass over the chunk's key pairs, each pair's V codes of those columns decoded
//     there (pv_fused), vdpbf16ps zmm of a V pair vector by the row's P̃ pair broadcast.
//   Units: <= 8 rows (a decode step's KV heads together), or a prefill chunk's up to kMaxHeads row blocks of 8 rows
//     of one KV head, which share each chunk's K decode and one decode of its V pairs into a buffer (unit_bf16).
//   The NaN policy and prefetching as the AVX2/AMX paths.
// Scratch per thread (the AMX path's Scratch, allocate_bf16): the K chunk 32·Dks bf16, the V pairs of a chunk 16·Dvp
// (row blocks), per loop head (KV head or row block) Q̃^T (Dks/2)·8 and O 8·Dvp f32, P̃ 16·8 pairs, the row pointers
// of two chunks (no output row).

#define FP8REF_BF16_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512bf16")))

void Scratch::allocate_bf16(int64_t hg, int64_t loop_heads, int64_t Dks, int64_t Dvp) {
  kp.assign(static_cast<size_t>(2 * hg * kChunk), nullptr);
  vp.assign(static_cast<size_t>(2 * hg * kChunk), nullptr);
  // (no output row: O's columns are in order)
  place({static_cast<size_t>(kChunk * Dks) * 2, static_cast<size_t>(kChunk / 2 * Dvp) * 4,
         static_cast<size_t>(loop_heads * Dks / 2 * kAvxRows) * 4,
         static_cast<size_t>(loop_heads * kAvxRows * Dvp) * 4, size_t{0}});
}

// S for 16 keys of the chunk, from key k0: out[k] (8 lanes: the rows) for key k0 + k. Q̃^T is packed by pairs of d
// pairs: dword 2r + (P & 1) of its 16-dword block P / 2 is row r's pair P; a key's pairs P, P + 1 are adjacent dwords
// of the blocked K [Dks / 64][kChunk][32 pairs], so one 64-bit broadcast puts them in the even and odd lanes and one
// vdpbf16ps zmm adds both pairs' products for the 8 rows (lane 2r: the even pairs, 2r + 1: the odd ones; Zen 4 runs one
// per cycle, where the 8-lane ymm form ran at ~0.6 cycles for half the work). The two halves are summed at the end
// (`fast` allows any order): two keys at a time by two lane gathers and an add.
// Decoding under the multiply-adds: the job's n (<= 16) K rows src[0..n) are decoded into the K buffer's rows
// dst0.. (another half of the chunk than the one S reads) one 64-code block per step of the d loop — Dks / 4 blocks
// for 16 keys, as many as the steps, so the lookups and stores run in the vdpbf16ps stream's shadow.
struct KJob {
  const uint8_t* const* src = nullptr;
  int64_t n = 0, dst0 = 0;
};
FP8REF_BF16_TARGET inline void s16_bf16(const uint32_t* qt, const uint32_t* kbuf, int64_t k0, int64_t Dks,
                                        __m256* out, const Regs& g, const KJob& job, int64_t Dk, uint16_t* kdst,
                                        __m512i* mx) {
  __m512 acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
  const int64_t nb = Dks / 64;
  int64_t jk = 0, jb = 0;  // the job's next key and 64-code block
  for (int64_t db = 0; db < nb; ++db) {
    const uint32_t* kb = kbuf + (db * kChunk + k0) * 32;
    const uint32_t* q = qt + db * 32 * kAvxRows;
    for (int p = 0; p < 32; p += 2) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + p * kAvxRows);
      for (int k = 0; k < 16; ++k) {
        long long two;
        std::memcpy(&two, kb + k * 32 + p, 8);
        acc[k] = _mm512_dpbf16_ps(acc[k], qv, (__m512bh)_mm512_set1_epi64(two));
      }
      if (jk < job.n) {
        const uint8_t* src = job.src[jk] + jb * 64;
        const __m512i c = jb * 64 + 64 <= Dk ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(tail_mask(Dk - jb * 64), src);
        decode_pair_store(g, c, kdst + (jb * kChunk + job.dst0 + jk) * 64, mx);
        if (++jb == nb) {
          jb = 0;
          ++jk;
        }
      }
    }
  }
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int k = 0; k < 16; k += 2) {
    const __m512 s = _mm512_add_ps(_mm512_permutex2var_ps(acc[k], ev, acc[k + 1]),
                                   _mm512_permutex2var_ps(acc[k], od, acc[k + 1]));
    out[k] = _mm512_castps512_ps256(s);
    out[k + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
  }
}

// kVpairIndex: the byte order (a vpermt2b index over the codes of keys a and b: a's column j is byte j, b's 64 + j)
// that makes decode_pair's two unpacks give VNNI pairs of keys a and b in column order: dword q of the unpacklo
// (unpackhi) vector is words 8L + 2(q % 4) and + 1 of 128-bit lane L = q / 4, which unpack c's bytes 16L + 2(q % 4)
// and + 1 (+ 8 for unpackhi): those bytes take column q (16 + q) of a and of b. ix[0]: columns 0..31 of the codes,
// ix[1]: 32..63.
struct VpairIndex {
  alignas(64) uint8_t ix[2][64];
  VpairIndex() {
    for (int half = 0; half < 2; ++half)
      for (int q = 0; q < 16; ++q)
        for (int hl = 0; hl < 2; ++hl) {
          const int p = 16 * (q / 4) + 8 * hl + 2 * (q % 4), col = 32 * half + 16 * hl + q;
          ix[half][p] = static_cast<uint8_t>(col);           // a's code (first operand of vpermt2b)
          ix[half][p + 1] = static_cast<uint8_t>(64 + col);  // b's code
        }
  }
};
const VpairIndex kVpairIndex;

// O[rows 0..NR)[Dvp] += P̃ · V for the chunk's key pairs, V decoded in registers (no V buffer): per block of 16·J
// columns (J = 16 / NR zmm per row, NR·J = 16 accumulators), per key pair the two keys' codes of the block
// byte-interleaved by one vpermt2b into the order above (kVpairIndex), decoded by decode_pair (2 vpermi2b, the sign,
// two unpacks) into J VNNI pair vectors in column order, then NR·J vdpbf16ps with the row's P̃ pair broadcast. Zen 4
// stores one 256-bit half a cycle: the decoded V's stores to a buffer (four zmm per key) and their reloads cost more
// than the lookups — for one block of rows; a prefill unit's row blocks share one decode into vb (decode_vpairs) and
// load the pairs from there (vb non-null). Ticks the prefetch cursor `ticks` times per key pair and block.
template <int NR>
FP8REF_BF16_TARGET inline void pv_fused(const Regs& g, const uint8_t* const* vpc, int64_t nk, int64_t Dv, int64_t Dvp,
                                        const uint32_t* pbuf, float* ob, PrefetchCursor& pf, int64_t ticks, __m512i* mx,
                                        const uint32_t* vb = nullptr) {
  constexpr int J = 16 / NR;
  const __m512i ix0 = _mm512_load_si512(kVpairIndex.ix[0]), ix1 = _mm512_load_si512(kVpairIndex.ix[1]);
  const int64_t npairs = (nk + 1) / 2;
  for (int64_t d0 = 0; d0 < Dvp; d0 += 16 * J) {
    __m512 o[NR][J];
    for (int i = 0; i < NR; ++i)
      for (int j = 0; j < J; ++j) o[i][j] = _mm512_load_ps(ob + i * Dvp + d0 + 16 * j);
    const int64_t left = Dv - d0;  // (<= 0 in a last 32-column block past Dv, e.g. Dv = 80: nothing to load)
    const __mmask64 mk = left <= 0 ? __mmask64{0} : tail_mask(std::min<int64_t>(16 * J, left));
    for (int64_t kq = 0; kq < npairs; ++kq) {
      for (int64_t t = 0; t < ticks; ++t) pf.tick();
      __m512i v[J];
      if (vb) {
        for (int j = 0; j < J; ++j) v[j] = _mm512_load_si512(vb + kq * Dvp + d0 + 16 * j);
      } else {
        const __m512i A = _mm512_maskz_loadu_epi8(mk, vpc[2 * kq] + d0);
        const __m512i B = 2 * kq + 1 < nk ? _mm512_maskz_loadu_epi8(mk, vpc[2 * kq + 1] + d0) : _mm512_setzero_si512();
        for (int h = 0; h < J / 2; ++h)
          decode_pair(g, _mm512_permutex2var_epi8(A, h == 0 ? ix0 : ix1, B), &v[2 * h], &v[2 * h + 1], mx);
      }
      const uint32_t* pq = pbuf + kq * kAvxRows;
      for (int i = 0; i < NR; ++i) {
        const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pq[i]));
        for (int j = 0; j < J; ++j) o[i][j] = _mm512_dpbf16_ps(o[i][j], (__m512bh)v[j], pb);
      }
    }
    for (int i = 0; i < NR; ++i)
      for (int j = 0; j < J; ++j) _mm512_store_ps(ob + i * Dvp + d0 + 16 * j, o[i][j]);
  }
}

// The chunk's V pairs as pv_fused decodes them, into vb [key pair][Dvp] (dword d: the pair's column d; zero past Dv).
FP8REF_BF16_TARGET inline void decode_vpairs(const Regs& g, const uint8_t* const* vpc, int64_t nk, int64_t Dv,
                                             int64_t Dvp, uint32_t* vb, __m512i* mx) {
  const __m512i ix0 = _mm512_load_si512(kVpairIndex.ix[0]), ix1 = _mm512_load_si512(kVpairIndex.ix[1]);
  for (int64_t kq = 0; kq < (nk + 1) / 2; ++kq)
    for (int64_t d0 = 0; d0 < Dvp; d0 += 64) {
      const __mmask64 mk = tail_mask(Dv - d0);  // (Dv - d0 > 0: Dvp is Dv rounded up to 64)
      const __m512i A = _mm512_maskz_loadu_epi8(mk, vpc[2 * kq] + d0);
      const __m512i B = 2 * kq + 1 < nk ? _mm512_maskz_loadu_epi8(mk, vpc[2 * kq + 1] + d0) : _mm512_setzero_si512();
      __m512i v[4];
      decode_pair(g, _mm512_permutex2var_epi8(A, ix0, B), &v[0], &v[1], mx);
      decode_pair(g, _mm512_permutex2var_epi8(A, ix1, B), &v[2], &v[3], mx);
      for (int j = 0; j < 4; ++j) _mm512_store_si512(vb + kq * Dvp + d0 + 16 * j, v[j]);
    }
}

// Q̃ of bf16 queries packed for s16_bf16 in lanes (what lane_heads' per-element put does for any query format): row
// r's words in the decoded K order (position p holds d = perm64(p % 64) of its 64-block; subnormals flushed), and its
// qword of positions 4b..4b+3 at qword b·8 + r of the head's Q̃ᵀ. False for a NaN or ±Inf query (qb partly written).
struct QPermIndex {
  alignas(64) uint16_t ix[2][32];
  QPermIndex() {
    for (int i = 0; i < 64; ++i) ix[i / 32][i % 32] = static_cast<uint16_t>(perm64(i));
  }
};
const QPermIndex kQPerm;
FP8REF_BF16_TARGET bool pack_q_bf16(const Ctx& c, const Unit& u, const RowInfo* ri, uint32_t* qb, int64_t qs) {
  const int64_t Dks = round_up(c.Dk, 64);
  const __m512i i0 = _mm512_load_si512(kQPerm.ix[0]), i1 = _mm512_load_si512(kQPerm.ix[1]);
  const __m512i expo = _mm512_set1_epi16(0x7F80), sign = _mm512_set1_epi16(static_cast<int16_t>(0x8000)),
                mag = _mm512_set1_epi16(0x7FFF);
  __m512i qmax = _mm512_setzero_si512();
  alignas(64) uint64_t t[16];
  for (int64_t gi = 0; gi < u.g1 - u.g0; ++gi) {
    uint64_t* q64 = reinterpret_cast<uint64_t*>(qb + gi * qs);
    for (int64_t r = 0; r < u.r1 - u.r0; ++r) {
      const uint16_t* src = static_cast<const uint16_t*>(c.a.q) + (ri[r].qrow * c.Hq + ri[r].head + gi * c.G) * c.Dk;
      for (int64_t b0 = 0; b0 < Dks; b0 += 64) {
        __m512i h[2];
        for (int j = 0; j < 2; ++j) {
          const int64_t left = c.Dk - b0 - 32 * j;
          const __mmask32 m = left >= 32 ? ~__mmask32{0} : left <= 0 ? __mmask32{0} : (__mmask32{1} << left) - 1;
          h[j] = _mm512_maskz_loadu_epi16(m, src + b0 + 32 * j);
          const __mmask32 sub = _mm512_testn_epi16_mask(h[j], expo);  // zero or subnormal: ±0
          h[j] = _mm512_mask_mov_epi16(h[j], sub, _mm512_and_si512(h[j], sign));
          qmax = _mm512_max_epu16(qmax, _mm512_and_si512(h[j], mag));
        }
        _mm512_store_si512(t, _mm512_permutex2var_epi16(h[0], i0, h[1]));
        _mm512_store_si512(t + 8, _mm512_permutex2var_epi16(h[0], i1, h[1]));
        for (int64_t b = 0; b < 16; ++b) q64[(b0 / 4 + b) * kAvxRows + r] = t[b];
      }
    }
  }
  return _mm512_cmpge_epu16_mask(qmax, expo) == 0;
}

// Returns false (nothing written) when the unit's queries or the codes it reads hold a non-finite value, or a scale
// overflows the logit multiplier: the caller runs the portable path then.
// Row blocks (LaneBlocks): the first block decodes the chunk's K rows (the last the next chunk's first half) and its V
// pairs into vbuf (decode_vpairs); the others read them.
FP8REF_BF16_TARGET bool unit_bf16(const Ctx& c, const AmxKernels& K, Scratch& w, const Unit& u) {
  const SeqPages sp = seq_pages(c.s, c.a, u.b);
  const LaneBlocks lb(c, sp, u);
  const bool blocks = lb.blocks;
  const int64_t HKV = lb.HKV, HG = lb.HG, LO = lb.LO, HI = lb.HI;
  const int64_t Dks = round_up(c.Dk, 64), Dvp = round_up(c.Dv, 64);
  const int64_t qs = Dks / 2 * kAvxRows, os = kAvxRows * Dvp;  // per-loop-head strides of Q̃^T and O
  const bool capped = c.s.softcap > 0;
  const Regs g = load_regs(K);
  float mult[kMaxHeads], sv[kMaxHeads];
  std::fill(w.qb, w.qb + HG * qs, 0u);
  if (c.s.q_format == Format::bf16) {  // (the same words as below, 32 at a time)
    if (!lane_scales(c, u, 1.0f, mult, sv)) return false;
    for (int64_t b = 0; b < lb.NB; ++b)  // (row set b's loop heads: b with blocks, else the KV heads from 0)
      if (!pack_q_bf16(c, lb.su[b], lb.ri[b], w.qb + b * qs, qs)) return false;
  } else if (!lb.heads(c, 1.0f, mult, sv, [&](int64_t gi, int64_t r, int64_t d, uint32_t h) {
               const int64_t p = d / 64 * 64 + pos64(d % 64);  // d's position in a decoded K row
               const int64_t P = p / 2;  // the d pair; s16_bf16's layout: block P / 2, dword 2r + (P & 1)
               w.qb[gi * qs + (P / 2) * 2 * kAvxRows + 2 * r + (P & 1)] |= h << (16 * (p & 1));
             })) {
    return false;
  }
  std::fill(w.obuf, w.obuf + HG * os, 0.0f);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  LaneState st;
  lane_state(c, HG, &st);
  __m512i cmx = _mm512_setzero_si512();  // max of the decoded magnitudes' high bytes (decode_pair_store)
  const __m512i nonfinite = _mm512_set1_epi8(static_cast<char>(kNonfiniteHigh));
  ChunkRows rows(c, sp, u, w.kp, w.vp, LO, HI);
  bool half0_ready = false;  // the K buffer's keys 0..15 hold head gi's (decoded under the previous head's S)
  for (int64_t j0 = LO, cur = 0; j0 <= HI; j0 += kChunk, cur ^= 1) {
    const int64_t nk = std::min<int64_t>(kChunk, HI + 1 - j0);
    const int64_t nn = rows.next(cur, j0, HI);  // the next chunk's keys
    const int64_t npairs = (nk + 1) / 2;
    // the next chunk's rows (every head, in address order), paced through this chunk's compute
    PrefetchCursor pf;
    pf.start(c, sp, u.g0, HKV, j0 + kChunk, std::min(HI + 1, j0 + 2 * kChunk));
    // lines per P̃·V step: the chunk's lines over the loop heads' P̃·V steps of a full chunk
    for (int64_t gi = 0; gi < HG; ++gi) {
      const int64_t R = lb.rows(gi);
      const int64_t steps = Dvp / (R <= 4 ? 64 : 32) * (kChunk / 2) * HG;
      const int64_t ticks = (kChunk * pf.lkv * HKV + steps - 1) / steps;
      const uint8_t* const* kpc = rows.kp[cur] + lb.kvi(gi) * kChunk;
      const uint8_t* const* vpc = rows.vp[cur] + lb.kvi(gi) * kChunk;
      // K rows blocked [Dks / 64][kChunk][64] (s16_bf16): keys 0..15 before S unless the previous head's S decoded
      // them; keys 16..31 under S of keys 0..15; the next head's keys 0..15 (the next chunk's first head's after the
      // last head) under S of keys 16..31. Row blocks after the first read the rows the first decoded.
      const bool have = blocks && gi > 0;
      if (!half0_ready && !have)
        for (int64_t k = 0; k < std::min<int64_t>(16, nk); ++k)
          decode_row(g, kpc[k], c.Dk, w.kbuf + k * 64, kChunk * 64, &cmx);
      half0_ready = false;
      // S and the logits (keys past nk: −inf)
      const uint32_t* qt = w.qb + gi * qs;
      const __m256 c2v = _mm256_set1_ps(mult[lb.kvi(gi)]);
      __m256i lo_v, hi_v;
      lb.ranges(gi, &lo_v, &hi_v);
      __m256 x[kChunk];
      __m256 cmax = ninf;
      for (int64_t kb = 0; kb < kChunk; kb += 16) {
        if (kb >= nk) {
          for (int64_t k = kb; k < kb + 16; ++k) x[k] = ninf;
          continue;
        }
        __m256 acc[16];  // S of the 16 keys, rows in lanes
        KJob job;
        if (kb == 0) {
          if (!have) job = {kpc + 16, std::max<int64_t>(0, nk - 16), 16};
        } else if (gi + 1 < HG) {
          if (!blocks) job = {rows.kp[cur] + (gi + 1) * kChunk, 16, 0};  // (nk > 16 here)
          half0_ready = true;
        } else if (nn > 0) {  // the next chunk's first head
          job = {rows.kp[cur ^ 1], std::min<int64_t>(16, nn), 0};
          half0_ready = true;
        }
        s16_bf16(qt, reinterpret_cast<const uint32_t*>(w.kbuf), kb, Dks, acc, g, job, c.Dk, w.kbuf, &cmx);
        for (int64_t k = 0; k < 16; ++k) {
          x[kb + k] = kb + k < nk ? lane_logits(acc[k], c2v, st.clv, capped, j0 + kb + k, lo_v, hi_v) : ninf;
          cmax = _mm256_max_ps(cmax, x[kb + k]);
        }
      }
      float* ob = w.obuf + gi * os;
      lane_running_max(cmax, R, ob, Dvp, &st.m2[gi], &st.L[gi]);  // the running maximum, exact rescale of O and L
      // P̃ = RN_bf16(exp2(t' − m2)), L += P̃; pairs of keys interleaved per row
      __m256 Lg = st.L[gi];
      for (int64_t kq = 0; kq < npairs; ++kq) {
        const __m128i b0 = (__m128i)_mm256_cvtneps_pbh(exp2_avx2(_mm256_sub_ps(x[2 * kq], st.m2[gi])));
        const __m128i b1 = (__m128i)_mm256_cvtneps_pbh(exp2_avx2(_mm256_sub_ps(x[2 * kq + 1], st.m2[gi])));
        Lg = _mm256_add_ps(Lg, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b0), 16)));
        Lg = _mm256_add_ps(Lg, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b1), 16)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(w.pbuf + kq * kAvxRows),
                           _mm256_set_m128i(_mm_unpackhi_epi16(b0, b1), _mm_unpacklo_epi16(b0, b1)));
      }
      st.L[gi] = Lg;
      // O += P̃ · V, V decoded in registers (pv_fused) — with row blocks, once per chunk into vbuf (the first block)
      // and loaded from there: 4 rows × 64 columns or 8 rows × 32 columns a block
      if (blocks && gi == 0) decode_vpairs(g, vpc, nk, c.Dv, Dvp, w.vbuf, &cmx);
      const uint32_t* vb = blocks ? w.vbuf : nullptr;
      if (R <= 4) pv_fused<4>(g, vpc, nk, c.Dv, Dvp, w.pbuf, ob, pf, ticks, &cmx, vb);
      else pv_fused<8>(g, vpc, nk, c.Dv, Dvp, w.pbuf, ob, pf, ticks, &cmx, vb);
    }
    pf.drain();  // (what the P̃·V loop's ticks did not reach)
    if (_mm512_cmpge_epu8_mask(cmx, nonfinite)) return false;  // a non-finite code: the portable path
  }
  for (int64_t gi = 0; gi < HG; ++gi) {
    alignas(32) float Ls[kAvxRows];
    _mm256_store_ps(Ls, st.L[gi]);
    const RowInfo* rg = lb.ri[lb.bi(gi)];
    for (int64_t r = 0; r < lb.rows(gi); ++r) {
      const float Lr = Ls[r];
      const int64_t obase = (rg[r].qrow * c.Hq + rg[r].head + lb.head0(gi)) * c.Dv;
      const float fac = Lr > 0 ? sv[lb.kvi(gi)] / Lr : 0.0f;
      const float* orow = w.obuf + gi * os + r * Dvp;  // (columns in order: pv_fused)
      int64_t d = 0;
      if (c.s.out_format == Format::bf16 && Lr > 0)
        d = out_row_bf16(orow, fac, c.Dv, static_cast<uint16_t*>(c.a.out) + obase);
      for (; d < c.Dv; ++d) store_out(c.s.out_format, c.a.out, obase + d, Lr > 0 ? orow[d] * fac : 0.0f);
    }
  }
  return true;
}

bool avx2_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return false;
    // leaf 1 ECX: FMA (12), OSXSAVE (27), AVX (28), F16C (29); leaf 7.0 EBX: AVX2 (5); XCR0: SSE and AVX state
    if (!((c >> 12) & 1) || !((c >> 27) & 1) || !((c >> 28) & 1) || !((c >> 29) & 1)) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 5) & 1)) return false;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    return (xlo & 6u) == 6u;
  }();
  return ok;
}

template <__m256 (*F)(__m256)>
FP8REF_AVX2_TARGET void map_lanes_avx2(const float* x, float* out, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    alignas(32) float t[8] = {};
    std::memcpy(t, x + i, std::min<size_t>(8, n - i) * 4);
    _mm256_store_ps(t, F(_mm256_load_ps(t)));
    std::memcpy(out + i, t, std::min<size_t>(8, n - i) * 4);
  }
}

void check_fast(const AttnSpec& spec, const AttnArgs& args) {
  check_paged_attention(spec, args);
  if (spec.chunk_unquantized)
    throw InputError("paged_attention: convention fast does not support the unquantized-chunk variant (chunk=unquantized)");
}

}  // namespace

bool fast_attention_has_amx() { return amx_usable(); }
bool fast_attention_has_avx2() { return avx2_usable(); }
bool fast_attention_has_avx512bf16() { return bf16_usable(); }

void fast_exp2(const float* z, float* out, size_t n, FastPath path) {
  if ((path == FastPath::automatic || path == FastPath::amx) && amx_usable()) return map_lanes<exp2_vec>(z, out, n);
  if (path != FastPath::portable && avx2_usable()) return map_lanes_avx2<exp2_avx2>(z, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = z[i] >= -126.0f ? ref::exp2_sleef(z[i]) : 0.0f;
}

void fast_tanh(const float* u, float* out, size_t n, FastPath path) {
  if ((path == FastPath::automatic || path == FastPath::amx) && amx_usable()) return map_lanes<tanh_vec>(u, out, n);
  if (path != FastPath::portable && avx2_usable()) return map_lanes_avx2<tanh_avx2>(u, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = tanh_fast(u[i]);
}

void paged_attention_fast(const AttnSpec& spec, const AttnArgs& args, FastPath path) {
  check_fast(spec, args);
  Ctx c{spec, args, spec.num_q_heads / spec.cache.num_kv_heads, spec.cache.head_dim, spec.dv(), spec.num_q_heads,
        spec.cache, static_cast<float>(1.44269504088896340736)};
  c.vshape.head_dim = c.Dv;
  const bool amx = (path == FastPath::automatic || path == FastPath::amx) && amx_usable();
  const bool bf16 = !amx && path != FastPath::portable && path != FastPath::avx2 && bf16_usable();
  const bool avx2 = !amx && !bf16 && path != FastPath::portable && avx2_usable();
  // A decode-like sequence (<= unit_rows rows per KV head) is one unit over a group of hg KV heads (whole pages read
  // in one pass, NHD); longer chunks: one unit per (head, prefill_rows rows). hg: the most heads (halving from
  // min(Hkv, kMaxHeads)) that still give every thread a unit and keep the largest unit within one thread's share of
  // the call's work (a unit's ~ its keys × heads). More heads share the softmax lanes, the decodes under S and the
  // per-chunk work: decode B=1 ctx=4096 on 2 threads 0.9–1.0 ms with the previous rule (>= 4 units per thread, hg 1)
  // vs 0.6 ms (hg 4; bench/RESULTS.md session 26).
  const int64_t Hkv = spec.cache.num_kv_heads;
  const int64_t unit_rows = avx2 || bf16 ? kAvxRows : kRows;
  const int64_t nt = omp_get_max_threads();
  std::vector<int64_t> rows_b(static_cast<size_t>(args.num_seqs)), keys_b(rows_b.size());
  for (int64_t b = 0; b < args.num_seqs; ++b) {
    rows_b[static_cast<size_t>(b)] = (args.query_start_loc[b + 1] - args.query_start_loc[b]) * c.G;
    keys_b[static_cast<size_t>(b)] = seq_pages(spec, args, b).seq_len;
  }
  // a longer chunk's units: AMX, up to kBlockRows rows of one KV head (row blocks of 16: unit_amx), AVX-512 BF16 and
  // AVX2 up to kMaxHeads blocks of kAvxRows (LaneBlocks) — halved while the chunks would give fewer units than
  // threads; portable: unit_rows
  int64_t prefill_rows = amx ? kBlockRows : bf16 || avx2 ? kMaxHeads * kAvxRows : unit_rows;
  const auto prefill_units = [&](int64_t span) {
    int64_t n = 0;
    for (int64_t rb : rows_b)
      if (rb > unit_rows) n += Hkv * ((rb + span - 1) / span);
    return n;
  };
  while (prefill_rows > unit_rows && prefill_units(prefill_rows) < nt) prefill_rows /= 2;
  int64_t hg = 1;
  if (amx || bf16 || avx2) {
    for (hg = std::min<int64_t>(Hkv, kMaxHeads); hg > 1; hg = (hg + 1) / 2) {
      int64_t total = 0, largest = 0, n = 0;
      for (size_t b = 0; b < rows_b.size(); ++b) {
        // (work ~ keys × heads for a decode-like sequence's units, keys × row blocks for a longer chunk's)
        const bool dec = rows_b[b] <= unit_rows;
        const int64_t per = dec ? (Hkv + hg - 1) / hg : Hkv * ((rows_b[b] + prefill_rows - 1) / prefill_rows);
        const int64_t blk = (std::min(rows_b[b], prefill_rows) + unit_rows - 1) / unit_rows;
        n += per;
        total += keys_b[b] * (dec ? Hkv : Hkv * ((rows_b[b] + unit_rows - 1) / unit_rows));
        largest = std::max(largest, keys_b[b] * (dec ? std::min(hg, Hkv) : blk));
      }
      if (n >= nt && largest * nt <= total) break;
    }
  }
  std::vector<Unit> units;
  for (int64_t b = 0; b < args.num_seqs; ++b) {
    const int64_t rows = rows_b[static_cast<size_t>(b)];
    const int64_t step = rows <= unit_rows ? hg : 1, span = rows <= unit_rows ? unit_rows : prefill_rows;
    for (int64_t g = 0; g < Hkv; g += step)
      for (int64_t r = 0; r < rows; r += span)
        units.push_back({b, g, std::min(Hkv, g + step), r, std::min(rows, r + span)});
  }
  const int64_t nu = static_cast<int64_t>(units.size());
  int64_t loop_heads = hg;  // KV heads of a decode unit, or row blocks of a prefill unit (Q̃ and O each)
  const int64_t block_rows = amx ? kRows : kAvxRows;
  for (const Unit& un : units) loop_heads = std::max(loop_heads, (un.r1 - un.r0 + block_rows - 1) / block_rows);
  if (avx2) {
    const bool e5m2 = spec.cache.format == Format::e5m2;
#pragma omp parallel
    {
      Avx2Scratch& w = thread_scratch<Avx2Scratch>();
      w.allocate(hg, loop_heads, round_up(c.Dk, 16), round_up(c.Dv, 16));
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < nu; ++i) {
        const Unit& un = units[static_cast<size_t>(i)];
        const bool four = un.r1 - un.r0 <= 4, blocks = un.r1 - un.r0 > kAvxRows;
        const bool ok = e5m2 ? (four     ? unit_avx2<true, 4>(c, w, un)
                                : blocks ? unit_avx2<true, 8, true>(c, w, un)
                                         : unit_avx2<true, 8>(c, w, un))
                             : (four     ? unit_avx2<false, 4>(c, w, un)
                                : blocks ? unit_avx2<false, 8, true>(c, w, un)
                                         : unit_avx2<false, 8>(c, w, un));
        if (!ok) unit_portable(c, un);
      }
    }
    return;
  }
  if (bf16) {
    const AmxKernels& K = kernels_of(spec.cache.format);
#pragma omp parallel
    {
      Scratch& w = thread_scratch<Scratch>();
      if (!w.reuse(1, hg, loop_heads, c.Dk, c.Dv)) w.allocate_bf16(hg, loop_heads, round_up(c.Dk, 64), round_up(c.Dv, 64));
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < nu; ++i)
        if (!unit_bf16(c, K, w, units[static_cast<size_t>(i)])) unit_portable(c, units[static_cast<size_t>(i)]);
    }
    return;
  }
  if (!amx) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t i = 0; i < nu; ++i) unit_portable(c, units[static_cast<size_t>(i)]);
    return;
  }
  const AmxKernels& K = kernels_of(spec.cache.format);
#pragma omp parallel
  {
    Scratch& w = thread_scratch<Scratch>();
    if (!w.reuse(0, hg, loop_heads, c.Dk, c.Dv)) {
      const int64_t Dks = round_up(c.Dk, 64), Dvp = round_up(c.Dv, 64);
      w.allocate(loop_heads, Dks, Dvp);  // (Q̃ and O per loop head: KV heads or row blocks)
      w.kp.assign(static_cast<size_t>(2 * hg * kChunk), nullptr);
      w.vp.assign(static_cast<size_t>(2 * hg * kChunk), nullptr);
      w.pre.assign(static_cast<size_t>(hg * kChunk * ((c.Dk + 63) / 64 + (c.Dv + 63) / 64 + 2)), nullptr);
      w.qt.assign(static_cast<size_t>(kRows * Dks), 0);  // (zero past Dk: the shape keeps Dk)
    }
    bool used = false;
    const bool d128 = c.Dk == 128 && c.Dv == 128;
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < nu; ++i) {
      const Unit& un = units[static_cast<size_t>(i)];
      if (!(d128 ? unit_amx<128>(c, K, w, un) : unit_amx<0>(c, K, w, un))) unit_portable(c, un);
      used = true;
    }
    if (used) tile_release();
  }
}

// ---- the bound ----------------------------------------------------------------------------------------------------

void paged_attention_fast_bound(const AttnSpec& spec, const AttnArgs& args, double* bound) {
  check_fast(spec, args);
  const int64_t Hkv = spec.cache.num_kv_heads, G = spec.num_q_heads / Hkv, Dk = spec.cache.head_dim, Dv = spec.dv();
  const Format f = spec.cache.format;
  CacheShape vshape = spec.cache;
  vshape.head_dim = Dv;
  Ctx c{spec, args, G, Dk, Dv, spec.num_q_heads, vshape, 0};
  const double inf = std::numeric_limits<double>::infinity();
  const double u = std::ldexp(1.0, -24), up = std::ldexp(1.0, -23), ub = std::ldexp(1.0, -8);
  const double uq = spec.q_format == Format::bf16 ? 0.0 : ub;
  const double eps_e = std::ldexp(1.0, -22), eta = std::ldexp(1.0, -126), eta_w = std::ldexp(1.0, -125);
  const double u_out = spec.out_format == Format::f32 ? u : spec.out_format == Format::bf16 ? ub : std::ldexp(1.0, -11);
  // (bf16: vcvtneps2bf16 treats subnormal f32 inputs as zero: up to 2^-126 lost)
  const double eta_out = spec.out_format == Format::f32 ? std::ldexp(1.0, -150)
                         : spec.out_format == Format::bf16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -25);
  const double max_out = spec.out_format == Format::f16 ? 65504.0 : 3.3895313892515355e38;
  const auto gamma = [](double n, double uu) { return n * uu / (1 - n * uu); };
  const double sm = spec.scale(), cap = spec.softcap;
  const double kappa = std::pow(1 + u, 4) * (1 + std::ldexp(1.0, -52)) - 1;  // c2's three roundings and t' = RN32(c2·acc)
#pragma omp parallel for schedule(dynamic)
  for (int64_t bg = 0; bg < args.num_seqs * Hkv; ++bg) {
    const int64_t b = bg / Hkv, g = bg % Hkv;
    const SeqPages sp = seq_pages(spec, args, b);
    const int64_t si = scale_index(spec.scale_kind, b, g);
    const double sk = args.k_scale[si], sv = spec.v_from_k ? sk : args.v_scale[si];
    // no claim when any code of this (sequence, KV head) the kernel may read is not finite, or a scale is not
    bool finite = std::isfinite(sk) && std::isfinite(sv) && sk > 0 && sv > 0 && sm * sk > std::ldexp(1.0, -100);
    for (int64_t j = 0; j < sp.seq_len && finite; ++j) {
      const uint8_t* kr = k_row(c, sp, g, j);
      const uint8_t* vr = v_row(c, sp, g, j);
      for (int64_t d = 0; d < Dk && finite; ++d) finite = std::isfinite(fp8ref::ref::value_of(f, kr[d]));
      for (int64_t d = 0; d < Dv && finite; ++d) finite = std::isfinite(fp8ref::ref::value_of(f, vr[d]));
    }
    const Unit un{b, g, g + 1, 0, sp.q_len * G};
    std::vector<double> q(static_cast<size_t>(Dk)), l, vmax(static_cast<size_t>(Dv)), vmin(static_cast<size_t>(Dv)),
        o(static_cast<size_t>(Dv));
    for (int64_t r = 0; r < sp.q_len * G; ++r) {
      const RowInfo ri = row_info(c, sp, un, r);
      double* out = bound + (ri.qrow * spec.num_q_heads + ri.head) * Dv;
      const int64_t n = std::max<int64_t>(0, ri.hi - ri.lo + 1);
      bool ok = finite;
      for (int64_t d = 0; d < Dk; ++d) {
        float x;
        const int64_t qi = (ri.qrow * spec.num_q_heads + ri.head) * Dk + d;
        if (spec.q_format == Format::f32) std::memcpy(&x, static_cast<const uint8_t*>(args.q) + 4 * qi, 4);
        else {
          uint16_t h;
          std::memcpy(&h, static_cast<const uint8_t*>(args.q) + 2 * qi, 2);
          x = f32_of(static_cast<uint32_t>(fp8ref::ref::narrow(spec.q_format, h, Format::f32)));
        }
        q[static_cast<size_t>(d)] = x;
        if (!std::isfinite(x) || std::fabs(x) > 3.3e38) ok = false;
      }
      if (n == 0) {
        std::fill(out, out + Dv, 0.0);
        continue;
      }
      if (!ok) {
        std::fill(out, out + Dv, inf);
        continue;
      }
      // logits (f64; the exact q, for |o| and the ranges), Σ|q k| and Σ|k| (code units), value ranges
      double Aq = 0, K1 = 0, lmax = -inf;
      l.assign(static_cast<size_t>(n), 0.0);
      std::fill(vmax.begin(), vmax.end(), -inf);
      std::fill(vmin.begin(), vmin.end(), inf);
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = ri.lo; j <= ri.hi; ++j) {
        const uint8_t* kr = k_row(c, sp, g, j);
        double acc = 0, aq = 0, k1 = 0;
        for (int64_t d = 0; d < Dk; ++d) {
          const double kv = fp8ref::ref::value_of(f, kr[d]);
          acc += q[static_cast<size_t>(d)] * kv;
          aq += std::fabs(q[static_cast<size_t>(d)] * kv);
          k1 += std::fabs(kv);
        }
        Aq = std::max(Aq, aq);
        K1 = std::max(K1, k1);
        const double lj = cap > 0 ? cap * std::tanh(sm * sk * acc / cap) : sm * sk * acc;
        l[static_cast<size_t>(j - ri.lo)] = lj;
        lmax = std::max(lmax, lj);
      }
      double S = 0;
      for (int64_t j = ri.lo; j <= ri.hi; ++j) {
        const double w = std::exp(l[static_cast<size_t>(j - ri.lo)] - lmax);
        S += w;
        const uint8_t* vr = v_row(c, sp, g, j);
        for (int64_t d = 0; d < Dv; ++d) {
          const double vv = fp8ref::ref::value_of(f, vr[d]);
          o[static_cast<size_t>(d)] += w * vv;
          vmax[static_cast<size_t>(d)] = std::max(vmax[static_cast<size_t>(d)], vv);
          vmin[static_cast<size_t>(d)] = std::min(vmin[static_cast<size_t>(d)], vv);
        }
      }
      const double dn = static_cast<double>(n), dk = static_cast<double>(Dk);
      // logit error (natural units): q -> Q̃, the f32 accumulation (any order, FTZ), c2 and the product's roundings
      const double dacc = uq * Aq + eta * K1 + gamma(dk, up) * ((1 + uq) * Aq + eta * K1) + dk * eta;
      // soft-cap: tanh is 1-Lipschitz (the error above passes through), plus tanh_fast's error and cl, t's roundings
      const double El = sm * sk * (dacc * (1 + kappa) + kappa * Aq) + std::ldexp(1.0, -149) +
                        (cap > 0 ? cap * (kFastTanhErr + (2 * u + u * u) * (1 + kFastTanhErr)) : 0.0);
      // per-key relative weight error: logits, z = RN32(t' − m2) (|z| <= 126), exp2, P̃'s bf16 rounding
      const double theta = std::exp(El + 126 * u * std::log(2.0)) * (1 + eps_e) * (1 + ub) - 1;
      const double acc_g = gamma(dn, up);
      if (!(theta < 0.25) || !(acc_g < 0.25) || !std::isfinite(sm * sk * Aq)) {
        std::fill(out, out + Dv, inf);
        continue;
      }
      double vabs_row = 0;
      for (int64_t d = 0; d < Dv; ++d)
        vabs_row = std::max({vabs_row, std::fabs(vmax[static_cast<size_t>(d)]), std::fabs(vmin[static_cast<size_t>(d)])});
      const double bex = bound_exact_f64(Dk, n, sm, Aq * sk, vabs_row * sv, cap);
      for (int64_t d = 0; d < Dv; ++d) {
        const double range = (vmax[static_cast<size_t>(d)] - vmin[static_cast<size_t>(d)]) * sv;
        const double V = std::max(std::fabs(vmax[static_cast<size_t>(d)]), std::fabs(vmin[static_cast<size_t>(d)]));
        const double od = std::fabs(o[static_cast<size_t>(d)] / S) * sv;
        // the computed weights' ratio against the exact one (weights sum >= 1/2: the maximum key's P̃ >= 1/2)
        const double e_ratio = range * (theta * (1 + 2 * dn * eta_w) / (1 - theta) + 2 * dn * eta_w);
        // N̂ and D̂ (f32, any order, flushes), then their ratio (D >= 1/2)
        const double e_acc = sv * (2 * acc_g * V + (3 + 2 * V) * dn * eta * 2) / (1 - acc_g - 8 * dn * eta);
        const double A = od + e_ratio + e_acc;
        // (+ n·V_d·2^-149: RN32(sv / L) below f32's normal range is off by up to 2^-150 absolutely, times N <= n·V_d)
        const double e_fin = (2 * u + u * u) * A + std::ldexp(1.0, -148) + dn * V * std::ldexp(1.0, -149) +
                             u_out * A * (1 + 3 * u) + eta_out;
        double bd = (e_ratio + e_acc + e_fin + bex) * (1 + std::ldexp(1.0, -40));
        if (A * (1 + 4 * u_out) >= max_out) bd = inf;
        out[d] = bd;
      }
    }
  }
}

}  // namespace fp8ref::attn::cpu
