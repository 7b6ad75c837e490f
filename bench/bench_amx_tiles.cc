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
// for R = 8 (decode, GQA 8:1: S^T tiles of 8 columns, P̃ and O tiles of 8 rows) and R = 16.
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

namespace {

struct alignas(64) TileCfg {
  uint8_t palette = 1, start = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

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
  return 0;
}
