// bench_amx_tiles — what the `fast` paged-attention kernel's AMX steps cost on this CPU, in isolation (issue 6).
//
// Compares, never asserts. Measures, in TSC ticks (rdtsc; the TSC runs at a fixed rate, see /proc/cpuinfo), the
// steady-state cost of the tile sequences src/cpu/attention_fast.cc issues per 32-key chunk and KV head, with every
// operand in L1 and nothing else running:
//   dpbf16        _tile_dpbf16ps alone, two independent accumulators (the throughput of one instruction)
//   S step        one d-block of S^T = K·Q̃^T: Q̃ tile + two K tiles loaded, two dpbf16 (the kernel does Dk/32 of these)
//   PV step       one pair of 16-column O blocks of O += P̃·V: O and V tiles loaded, two dpbf16, O stored back, the
//                 next step loading the O it just stored (as when the chunk loop comes back to the same O)
//   PV step, independent O   the same with the stores going elsewhere (no tile store -> tile load dependency)
// for R = 8 (decode, GQA 8:1: S^T tiles of 8 columns, P̃ and O tiles of 8 rows) and R = 16; then which tile
// instructions let vector work (vpermi2b, the FP8 decode's lookup) run beside them, and a tile load right behind a
// vector store to its line (overlap(), below); last the K group of the small-M scaled_mm kernel (src/cpu/gemm_fast.cc
// amx_range: 4 row tiles × one 16-column block, 4 K steps of 32) with its operands in L1 (gemm_group(), below).
// Usage: bench_amx_tiles [--steps 2000000]
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/amx_tile.h"

namespace {

using fp8ref::cpu::TileCfg;  // (src/cpu/amx_tile.h)

alignas(4096) uint8_t buf[65536];

bool amx_available() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1) || !((d >> 24) & 1)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("amx-tile,amx-bf16"))) void run(int R, long n) {
  TileCfg c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  c.colsb[0] = c.colsb[1] = c.colsb[2] = static_cast<uint16_t>(4 * R);  // S^T accumulators, Q̃^T
  _tile_loadconfig(&c);
  _tile_zero(0);
  _tile_zero(1);
  _tile_loadd(2, buf, 64);
  _tile_loadd(3, buf, 64);
  _tile_loadd(4, buf, 64);
  uint64_t t0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    _tile_dpbf16ps(0, 3, 2);
    _tile_dpbf16ps(1, 4, 2);
  }
  const double dp = static_cast<double>(__rdtsc() - t0) / (2.0 * static_cast<double>(n));
  t0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    _tile_loadd(2, buf + 4096, 4 * R);
    _tile_loadd(3, buf, 256);
    _tile_loadd(4, buf + 8192, 256);
    _tile_dpbf16ps(0, 3, 2);
    _tile_dpbf16ps(1, 4, 2);
  }
  const double s = static_cast<double>(__rdtsc() - t0) / static_cast<double>(n);
  TileCfg p = c;  // P̃: R rows × 32 keys; O: R rows × 16 d (f32); V: 16 key pairs × 16 d
  p.rows[5] = p.rows[6] = p.rows[7] = static_cast<uint8_t>(R);
  p.colsb[3] = p.colsb[4] = 64;
  _tile_loadconfig(&p);
  _tile_loadd(5, buf, 64);
  uint8_t* o = buf + 16384;
  t0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    _tile_loadd(6, o, 512);
    _tile_loadd(3, buf, 512);
    _tile_loadd(7, o + 64, 512);
    _tile_loadd(4, buf + 64, 512);
    _tile_dpbf16ps(6, 5, 3);
    _tile_dpbf16ps(7, 5, 4);
    _tile_stored(6, o, 512);
    _tile_stored(7, o + 64, 512);
  }
  const double pv = static_cast<double>(__rdtsc() - t0) / static_cast<double>(n);
  t0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    const long k = (i & 3) * 128;
    _tile_loadd(6, o + k, 512);
    _tile_loadd(3, buf, 512);
    _tile_loadd(7, o + k + 64, 512);
    _tile_loadd(4, buf + 64, 512);
    _tile_dpbf16ps(6, 5, 3);
    _tile_dpbf16ps(7, 5, 4);
    _tile_stored(6, o + 16384 + k, 512);
    _tile_stored(7, o + 16384 + k + 64, 512);
  }
  const double pvi = static_cast<double>(__rdtsc() - t0) / static_cast<double>(n);
  _tile_release();
  std::printf("| %d | %.1f | %.1f | %.1f | %.1f |\n", R, dp, s, pv, pvi);
}

// Which tile instructions let vector work run beside them (the AMX kernels overlap FP8 decodes with the tiles):
// per iteration, k tile instructions (whose operands stay in L1) and/or four independent chains of two vpermi2b each
// (the decode's table lookup; ~2 cycles apiece on Sapphire Rapids) — "both" near max(alone, alone) means the two
// overlap, near the sum that they do not. Then a 64-byte vector store and a tile load of that line (the hand-off of
// a decoded B tile, when the load comes right behind the stores). TSC ticks per iteration.
#define FP8REF_OVERLAP_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,amx-tile,amx-bf16")))

// tiles: 0 none, 1 two dpbf16, 2 two tile loads, 3 one tile store; perms: the vpermi2b chains beside them
FP8REF_OVERLAP_TARGET double overlap_time(int tiles, bool perms, long n) {
  const __m512i t0 = _mm512_loadu_si512(buf + 2048), t1 = _mm512_loadu_si512(buf + 2112);
  __m512i x0 = _mm512_set1_epi8(3), x1 = _mm512_set1_epi8(5), x2 = _mm512_set1_epi8(7), x3 = _mm512_set1_epi8(9);
  const uint64_t s0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    if (tiles == 1) {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 5);
    } else if (tiles == 2) {
      _tile_loadd(6, buf + 4096, 64);
      _tile_loadd(7, buf + 5120, 64);
    } else if (tiles == 3) {
      _tile_stored(2, buf + 8192, 64);
    }
    if (perms)
      for (int j = 0; j < 2; ++j) {
        x0 = _mm512_permutex2var_epi8(t0, x0, t1);
        x1 = _mm512_permutex2var_epi8(t0, x1, t1);
        x2 = _mm512_permutex2var_epi8(t0, x2, t1);
        x3 = _mm512_permutex2var_epi8(t0, x3, t1);
      }
    __asm__ volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3));
  }
  return static_cast<double>(__rdtsc() - s0) / static_cast<double>(n);
}

FP8REF_OVERLAP_TARGET void overlap(long n) {
  TileCfg c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  __asm__ volatile("" : : "r"(&c) : "memory");  // (keep the stores above: GCC does not see ldtilecfg read them)
  _tile_loadconfig(&c);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf + 1024, 64);
  auto time = [n](int tiles, bool perms) { return overlap_time(tiles, perms, n); };
  const double p = time(0, true);
  std::printf("| 8 vpermi2b (4 chains) alone | %.1f | | |\n", p);
  const char* names[] = {"", "2 tdpbf16ps", "2 tile loads (L1)", "1 tile store (L1)"};
  for (int k = 1; k <= 3; ++k) std::printf("| %s | %.1f | %.1f | %.1f |\n", names[k], time(k, false), time(k, true), p);
  uint64_t s0 = __rdtsc();
  for (long i = 0; i < n; ++i) _tile_loadd(6, buf + 12288 + (i & 7) * 1024, 64);
  const double ld = static_cast<double>(__rdtsc() - s0) / static_cast<double>(n);
  s0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    uint8_t* line = buf + 12288 + (i & 7) * 1024;
    _mm512_store_si512(line, _mm512_set1_epi32(static_cast<int>(i)));
    _tile_loadd(6, line, 64);
  }
  const double st = static_cast<double>(__rdtsc() - s0) / static_cast<double>(n);
  std::printf("| a tile load; after a vector store to its first line | %.1f | %.1f | |\n", ld, st);
  _tile_release();
}

// One K group of 128 of src/cpu/gemm_fast.cc's AMX small-M kernel for one slice of 4 row tiles and one column block,
// as amx_chunk_tiles issues it: per K step the B tile (registers 6 and 7 alternating) and per row tile its A tile
// (4 and 5 alternating) then tdpbf16ps into C tile t (0..3); C zeroed before and stored after (amx_zero_c /
// amx_store_c). Parts: 0 the 16 tdpbf16ps alone, 1 with the tile loads, 2 the whole group. A's 16 tiles (16 KiB) and
// B's 4 (4 KiB) in L1, as the kernel's A tiles of one group are for M = 64. TSC ticks per group.
FP8REF_OVERLAP_TARGET double gemm_group_time(int part, long n) {
  const uint8_t* A = buf + 16384;  // 16 tiles: K step s, row tile t at A + (4s + t)·1 KiB
  const uint8_t* B = buf + 32768;  // 4 tiles: K step s at B + s·1 KiB
  float* P = reinterpret_cast<float*>(buf + 40960);
  const uint64_t s0 = __rdtsc();
  for (long i = 0; i < n; ++i) {
    if (part == 2) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int s = 0; s < 4; ++s) {
      const uint8_t* a = A + 4096 * s;
#define FP8REF_GROUP_STEP(BT)                         \
  if (part >= 1) _tile_loadd(BT, B + 1024 * s, 64);   \
  if (part >= 1) _tile_loadd(4, a, 64);               \
  _tile_dpbf16ps(0, 4, BT);                           \
  if (part >= 1) _tile_loadd(5, a + 1024, 64);        \
  _tile_dpbf16ps(1, 5, BT);                           \
  if (part >= 1) _tile_loadd(4, a + 2048, 64);        \
  _tile_dpbf16ps(2, 4, BT);                           \
  if (part >= 1) _tile_loadd(5, a + 3072, 64);        \
  _tile_dpbf16ps(3, 5, BT);
      if (s % 2 == 0) {
        FP8REF_GROUP_STEP(6)
      } else {
        FP8REF_GROUP_STEP(7)
      }
#undef FP8REF_GROUP_STEP
    }
    if (part == 2) {
      _tile_stored(0, P, 64);
      _tile_stored(1, P + 256, 64);
      _tile_stored(2, P + 512, 64);
      _tile_stored(3, P + 768, 64);
    }
  }
  return static_cast<double>(__rdtsc() - s0) / static_cast<double>(n);
}

FP8REF_OVERLAP_TARGET void gemm_group(long n) {
  TileCfg c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  __asm__ volatile("" : : "r"(&c) : "memory");  // (as in overlap())
  _tile_loadconfig(&c);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  const char* names[] = {"16 tdpbf16ps (4 independent C tiles)", "+ the A and B tile loads (L1)",
                         "+ C zeroed before and stored after (the kernel's group)"};
  for (int part = 0; part < 3; ++part) {
    const double t = gemm_group_time(part, n / 16);
    std::printf("| %s | %.1f | %.1f |\n", names[part], t, t / 16);
  }
  _tile_release();
}

}  // namespace

int main(int argc, char** argv) {
  long steps = 2000000;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--steps") steps = std::atol(argv[i + 1]);
  if (!amx_available()) {
    std::printf("no AMX-BF16 on this CPU (or the OS refuses the tile state): nothing to measure\n");
    return 0;
  }
  std::memset(buf, 0, sizeof buf);
  std::printf("| R (rows per KV head) | dpbf16 (TSC/instr) | S step (TSC) | PV step, O round trip (TSC) | PV step, independent O (TSC) |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  for (int R : {8, 16}) run(R, steps);
  std::printf("\n| per iteration (TSC) | alone | with the vpermi2b | vpermi2b alone |\n|---|---:|---:|---:|\n");
  overlap(steps);
  std::printf("\n| scaled_mm small-M kernel, one K group (4 row tiles x 16 columns x 128 K) | TSC per group | per tdpbf16ps |\n|---|---:|---:|\n");
  gemm_group(steps);
  return 0;
}
