// fp8ref diff — the one-byte scan kernel: the diff's inner loop over two tensors of one-byte codes.
//
// Highway dynamic dispatch (the widest SIMD target of the machine, picked at run time). Per block of at most
// kScan8Block bytes it counts EXPECTED's codes equal to four given codes, and lists (ascending) the positions of
// EXPECTED's rare codes (magnitude above max) and the positions where EXPECTED and ACTUAL differ. Everything else
// (classes, metrics, structure) is done by the caller on those positions, in element order.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "diff/scan.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "diff/internal.h"

HWY_BEFORE_NAMESPACE();
namespace fp8ref::diff::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr size_t kPrefetchBytes = 4096;

// Appends base + (index of each set bit) of the mask to out.
template <class D, class M>
HWY_INLINE size_t Positions(D d, M m, size_t base, uint16_t* out, size_t k) {
  uint8_t bits[HWY_MAX_BYTES / 8 + 8] = {};  // one bit per byte lane
  const size_t nbytes = hn::StoreMaskBits(d, m, bits);
  for (size_t w = 0; w < nbytes; w += 8) {
    uint64_t word;
    std::memcpy(&word, bits + w, 8);
    while (word) {
      out[k++] = static_cast<uint16_t>(base + w * 8 + static_cast<size_t>(__builtin_ctzll(word)));
      word &= word - 1;
    }
  }
  return k;
}

void Scan8(const detail::Scan8Params& prm, const uint8_t* HWY_RESTRICT p, const uint8_t* HWY_RESTRICT q, size_t n,
           uint16_t* HWY_RESTRICT rare_pos, uint16_t* HWY_RESTRICT diff_pos, detail::Scan8Result* res) {
  const hn::ScalableTag<uint8_t> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Repartition<uint64_t, decltype(d)> d64;
  using V = hn::Vec<decltype(d)>;
  using V64 = hn::Vec<decltype(d64)>;
  const size_t N = hn::Lanes(d);
  const V f0 = hn::Set(d, prm.freq[0]), f1 = hn::Set(d, prm.freq[1]), f2 = hn::Set(d, prm.freq[2]),
          f3 = hn::Set(d, prm.freq[3]);
  const V m7f = hn::Set(d, 0x7F);
  const auto mx = hn::Set(di, static_cast<int8_t>(prm.max_mag & 0x7F));
  const bool rare = prm.rare_by_mag;
  V64 s0 = hn::Zero(d64), s1 = s0, s2 = s0, s3 = s0;
  size_t nr = 0, nd = 0, i = 0;
  while (i + N <= n) {
    V a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;  // byte counters: at most 255 vectors per round
    const size_t end = i + HWY_MIN((n - i) / N, size_t{255}) * N;
    for (; i < end; i += N) {
      // Software prefetch 4 KiB ahead in both streams: on the 2-vCPU KVM guest of bench/RESULTS.md the hardware
      // prefetchers alone leave a single thread latency-bound (~20% slower). Prefetches never fault, so running
      // past the end of the inputs is harmless.
      __builtin_prefetch(p + i + kPrefetchBytes);
      __builtin_prefetch(q + i + kPrefetchBytes);
      const V x = hn::LoadU(d, p + i), y = hn::LoadU(d, q + i);
      a0 = hn::Sub(a0, hn::VecFromMask(d, hn::Eq(x, f0)));
      a1 = hn::Sub(a1, hn::VecFromMask(d, hn::Eq(x, f1)));
      a2 = hn::Sub(a2, hn::VecFromMask(d, hn::Eq(x, f2)));
      a3 = hn::Sub(a3, hn::VecFromMask(d, hn::Eq(x, f3)));
      const auto ne = hn::Ne(x, y);
      if (!hn::AllFalse(d, ne)) nd = Positions(d, ne, i, diff_pos, nd);
      if (rare) {
        // (x & 0x7F) > max_mag, as signed bytes (both sides are in [0, 127])
        const auto big = hn::Gt(hn::BitCast(di, hn::And(x, m7f)), mx);
        if (!hn::AllFalse(di, big)) nr = Positions(di, big, i, rare_pos, nr);
      }
    }
    s0 = hn::Add(s0, hn::SumsOf8(a0));
    s1 = hn::Add(s1, hn::SumsOf8(a1));
    s2 = hn::Add(s2, hn::SumsOf8(a2));
    s3 = hn::Add(s3, hn::SumsOf8(a3));
  }
  uint64_t tot[4] = {hn::GetLane(hn::SumOfLanes(d64, s0)), hn::GetLane(hn::SumOfLanes(d64, s1)),
                     hn::GetLane(hn::SumOfLanes(d64, s2)), hn::GetLane(hn::SumOfLanes(d64, s3))};
  for (; i < n; ++i) {  // the tail: the same tests, one byte at a time
    const uint8_t x = p[i];
    for (int k = 0; k < 4; ++k) tot[k] += x == prm.freq[k];
    if (x != q[i]) diff_pos[nd++] = static_cast<uint16_t>(i);
    if (rare && (x & 0x7F) > (prm.max_mag & 0x7F)) rare_pos[nr++] = static_cast<uint16_t>(i);
  }
  for (int k = 0; k < 4; ++k) res->freq[k] = tot[k];
  res->n_rare = nr;
  res->n_diff = nd;
}

}  // namespace fp8ref::diff::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp8ref::diff {
HWY_EXPORT(Scan8);
namespace detail {
void scan8(const Scan8Params& prm, const uint8_t* p, const uint8_t* q, size_t n, uint16_t* rare_pos, uint16_t* diff_pos,
           Scan8Result* res) {
  HWY_DYNAMIC_DISPATCH(Scan8)(prm, p, q, n, rare_pos, diff_pos, res);
}
}  // namespace detail
}  // namespace fp8ref::diff
#endif  // HWY_ONCE
