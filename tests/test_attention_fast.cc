// The `fast` paged-attention convention (src/cpu/attention_fast.{h,cc}; contract in include/fp8ref/attention.h):
// every path (automatic: AMX where the CPU has it; AVX-512 BF16; AVX2; portable C++) against the exact convention's f64 result, elementwise within
// the derived bound, on random and adversarial problems (GQA, MLA, windows, block sizes 1/16/64, shuffled and CSR
// tables, HND, empty sequences, kv_len % block_size != 0, NaN in every unused cache slot, large logit spreads,
// near-ties, logit soft-caps); the bound is not vacuous (< 1 % of max|v̂| on random data with bf16 queries); its exp2
// against std::exp2 and its soft-cap tanh against std::tanh; what fast refuses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/attention_fast.h"
#include "fp8ref/attention.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "support/attention_cases.h"

using namespace fp8ref;
using attn::AttnSpec;
using test::PagedProblem;

namespace {

AttnSpec spec_of(int64_t bs, int64_t hkv, int64_t hq, int64_t d) {
  AttnSpec s;
  s.convention = attn::AttnConvention::fast;
  s.cache.block_size = bs;
  s.cache.num_kv_heads = hkv;
  s.cache.head_dim = d;
  s.num_q_heads = hq;
  return s;
}

struct Case {
  std::string name;
  AttnSpec spec;
  std::vector<int64_t> seq_lens, q_lens;
  bool csr = false;
  bool nonvacuous = false;  // assert bound < 1 % of max|v̂| (random data, bf16 queries)
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (int64_t bs : {1, 16, 64}) c.push_back({"mixed-bs" + std::to_string(bs), spec_of(bs, 2, 4, 64), {37, 1, 0, 70, 12}, {1, 1, 0, 5, 12}, false, true});
  c.push_back({"gqa8-decode-d128", spec_of(16, 2, 16, 128), {300, 33, 17}, {1, 1, 1}, false, true});
  c.push_back({"gqa8-prefill", spec_of(16, 1, 8, 128), {70, 40}, {5, 40}, false, true});
  c.push_back({"d256", spec_of(16, 2, 2, 256), {40}, {2}, false, true});
  // a head dim that is no multiple of 16 (the AVX2 path's code tails) and 5 rows per KV head (padded lanes)
  c.push_back({"d40-gqa5", spec_of(16, 2, 10, 40), {75, 4, 33}, {1, 3, 2}, false, true});
  // Dv = 80: the AVX-512 BF16 path's 32-column P̃·V blocks (8 rows) reach past the last column (d0 = 96 > Dv)
  c.push_back({"d80-gqa8", spec_of(16, 1, 8, 80), {75, 4, 33}, {1, 1, 2}, false, true});
  // many sequences: the AMX path groups a decode step's KV heads into one unit (whole pages per pass); the prefill
  // chunk (3 x 8 rows > 16) takes per-head units in the same call; HND and head scales in the second variant
  c.push_back({"many-seqs-grouped-heads", spec_of(16, 4, 32, 64), {70, 1, 33, 0, 16, 17, 90, 5, 48, 2, 31, 64},
               {1, 1, 1, 0, 1, 3, 1, 1, 1, 1, 1, 1}, false, true});
  c.push_back({"many-seqs-odd-head-group", spec_of(16, 3, 12, 64), {40, 17, 1, 64, 33, 9, 50, 2, 70, 16},
               {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, false, true});  // 3 KV heads per unit: a pair and a single
  {
    Case m{"many-seqs-grouped-heads-hnd-headscale-bs64", spec_of(64, 4, 16, 128), {70, 1, 33, 130, 16, 17, 90, 5, 48, 2},
           {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, true, true};
    m.spec.cache.layout = attn::KvLayout::hnd;
    m.spec.scale_kind = attn::KvScaleKind::head;
    c.push_back(m);
  }
  {
    Case m{"mla-576-512", spec_of(64, 1, 16, 576), {90, 3}, {1, 2}, false, true};
    m.spec.head_dim_v = 512;
    m.spec.v_from_k = true;
    c.push_back(m);
  }
  for (const test::AttnConfig& k : test::attention_configs()) {  // the bit-exact conventions' configurations, under fast
    const std::string n = k.name;
    if (n != "csr-hnd" && n != "window-topleft-f16-e5m2-headscale" && n != "f32-seqscale-nocausal-outf32") continue;
    Case m{n, k.spec, k.seq_lens, k.q_lens, k.csr, n == "csr-hnd"};
    m.spec.convention = attn::AttnConvention::fast;
    c.push_back(m);
  }
  {
    Case m{"window-bottomright-d96", spec_of(16, 2, 6, 96), {100, 7}, {3, 1}, false, true};
    m.spec.window_left = 20;
    c.push_back(m);
  }
  {
    Case m{"large-logit-spread", spec_of(16, 2, 4, 64), {80, 33}, {1, 4}};
    m.spec.sm_scale = 6.0;  // logits spread over hundreds: most weights flushed, ties at the maximum likely
    c.push_back(m);
  }
  // soft-cap: caps the logits exceed (tanh saturating: many weights near-equal) on a GQA 8:1 batch with a prefill
  // chunk, Gemma-2's 50 on a wide spread, and a cap with a sliding window over many sequences (grouped-head units)
  for (double cap : {0.5, 4.0}) {
    Case m{"softcap-" + std::to_string(cap), spec_of(16, 2, 16, 128), {300, 33, 17, 90}, {1, 1, 1, 6}, false, true};
    m.spec.softcap = cap;
    c.push_back(m);
  }
  {
    Case m{"softcap-50-large-spread", spec_of(16, 2, 4, 64), {80, 33}, {1, 4}};
    m.spec.sm_scale = 6.0;
    m.spec.softcap = 50.0;
    c.push_back(m);
  }
  {
    Case m{"softcap-window-many-seqs", spec_of(16, 4, 32, 64), {70, 1, 33, 0, 16, 17, 90, 5, 48, 2, 31, 64},
           {1, 1, 1, 0, 1, 3, 1, 1, 1, 1, 1, 1}, false, true};
    m.spec.softcap = 2.0;
    m.spec.window_left = 24;
    c.push_back(m);
  }
  return c;
}

// The exact convention's f64 result on p and fast's bound, per output element.
void exact_and_bound(PagedProblem& p, std::vector<double>* ex, std::vector<double>* bd) {
  const attn::AttnArgs a = p.args();
  const size_t n = static_cast<size_t>(p.T * p.spec.num_q_heads * p.spec.dv());
  ex->assign(n, 0.0);
  bd->assign(n, 0.0);
  attn::AttnArgs ea = a;
  ea.out = nullptr;
  attn::ref::paged_attention(p.spec, ea, ex->data());
  attn::cpu::paged_attention_fast_bound(p.spec, a, bd->data());
}

// Runs fast on p (path), the exact f64 result and the bound; counts violations and returns max bound / max|v̂|.
double check_against_exact(PagedProblem& p, attn::cpu::FastPath path, int* bad, int* nonfinite) {
  const AttnSpec& s = p.spec;
  attn::AttnArgs a = p.args();
  attn::cpu::paged_attention_fast(s, a, path);
  const int64_t n = p.T * s.num_q_heads * s.dv();
  std::vector<double> ex, bd;
  exact_and_bound(p, &ex, &bd);
  double vmax = 0;
  for (size_t b = 0; b < p.vd.size() || b < p.kd.size(); ++b) {
    const auto& src = s.v_from_k ? p.kd[b] : p.vd[b];
    for (uint8_t c : src) vmax = std::max(vmax, std::fabs(ref::value_of(s.cache.format, c)));
  }
  double smax = 0;
  for (float x : s.v_from_k ? p.ks : p.vs) smax = std::max(smax, static_cast<double>(x));
  vmax *= smax;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double got = test::out_value(s.out_format, &p.out[static_cast<size_t>(i) * p.out_elem()]);
    if (!std::isfinite(got) || !std::isfinite(bd[static_cast<size_t>(i)])) {
      if ((*nonfinite)++ < 3) MESSAGE("element " << i << ": fast " << got << ", bound " << bd[static_cast<size_t>(i)]);
      continue;
    }
    const double err = std::fabs(got - ex[static_cast<size_t>(i)]);
    if (err > bd[static_cast<size_t>(i)] && (*bad)++ < 5)
      MESSAGE("element " << i << ": fast " << got << " exact " << ex[static_cast<size_t>(i)] << " err " << err << " > bound "
                         << bd[static_cast<size_t>(i)]);
    worst = std::max(worst, bd[static_cast<size_t>(i)]);
  }
  return vmax > 0 ? worst / vmax : 0;
}

}  // namespace

TEST_SUITE("attention-fast") {
  TEST_CASE("fast: |fast − exact_f64| <= the derived bound, elementwise, every path; the bound is not vacuous") {
    uint64_t seed = 100;
    MESSAGE("AMX path available: " << attn::cpu::fast_attention_has_amx()
                                    << ", AVX-512 BF16 path available: " << attn::cpu::fast_attention_has_avx512bf16()
                                    << ", AVX2 path available: " << attn::cpu::fast_attention_has_avx2());
    for (const Case& c : cases()) {
      for (auto path : {attn::cpu::FastPath::automatic, attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2, attn::cpu::FastPath::portable}) {
        CAPTURE(c.name);
        CAPTURE(static_cast<int>(path));
        PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed, c.csr);
        int bad = 0, nonfinite = 0;
        const double rel = check_against_exact(p, path, &bad, &nonfinite);
        CHECK(bad == 0);
        CHECK(nonfinite == 0);  // no NaN read from the NaN-filled unused slots; every bound finite
        if (c.nonvacuous) CHECK(rel < 1e-2);
        CHECK(rel > 0);
      }
      ++seed;
    }
  }

  TEST_CASE("fast: calls of other shapes in a row — the per-thread scratch kept across calls is set up again") {
    // A prefill chunk of one KV head (its 320 rows run as row blocks: 16 loop heads, 1 KV head per unit), then a
    // decode step with 16 KV heads per unit (16 loop heads as well, on 1 or 2 threads), then the first again: each
    // call's units must find buffers sized for their own heads (ASan reports any overrun), and every result is
    // within the bound.
    const Case calls[] = {{"prefill-rows-blocks", spec_of(16, 1, 8, 64), {300}, {40}},
                          {"decode-16-heads", spec_of(16, 16, 16, 64), {90, 90}, {1, 1}},
                          {"prefill-rows-blocks-again", spec_of(16, 1, 8, 64), {300}, {40}}};
    uint64_t seed = 40;
    for (const Case& c : calls) {
      CAPTURE(c.name);
      PagedProblem p = test::random_problem(c.spec, c.seq_lens, c.q_lens, seed++, c.csr);
      int bad = 0, nonfinite = 0;
      check_against_exact(p, attn::cpu::FastPath::automatic, &bad, &nonfinite);
      CHECK(bad == 0);
      CHECK(nonfinite == 0);
    }
  }

  TEST_CASE("fast: adversarial — near-ties (identical keys), cancelling dot products, a dominant key, extreme scales") {
    uint64_t seed = 7;
    for (int kind = 0; kind < 6; ++kind) {
      for (auto path : {attn::cpu::FastPath::automatic, attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2, attn::cpu::FastPath::portable}) {
        CAPTURE(kind);
        AttnSpec s = spec_of(16, 2, 16, 128);
        if (kind >= 4) s.out_format = Format::f32;  // (a bf16 output's η_out would hide what kinds 4, 5 test)
        PagedProblem p = test::random_problem(s, {129, 64, 1}, {1, 3, 1}, seed);
        const int64_t H = s.cache.num_kv_heads, D = s.cache.head_dim;
        std::mt19937_64 rng(seed);
        for (int64_t b = 0; b < p.B; ++b)
          for (int64_t j = 0; j < p.seq_lens[b]; ++j)
            for (int64_t h = 0; h < H; ++h) {
              uint8_t* k = &p.kd[b][static_cast<size_t>((j * H + h) * D)];
              if (kind == 0 || kind >= 4) std::memcpy(k, p.kd[b].data() + h * D, static_cast<size_t>(D));  // ties
              if (kind == 1)  // k_d and k_{d+1} opposite: large Σ|q k|, small logits
                for (int64_t d = 0; d + 1 < D; d += 2) k[d + 1] = static_cast<uint8_t>(k[d] ^ 0x80);
              if (kind == 2 && j == 5)  // one key of huge logit among small ones
                for (int64_t d = 0; d < D; ++d) k[d] = 0x70;  // e4m3fn 256
            }
        if (kind == 3) {  // extreme scales: tiny K scale, huge V scale
          for (auto& x : p.ks) x = std::ldexp(x, -40);
          for (auto& x : p.vs) x = std::ldexp(x, 40);
        }
        // the final factor RN32(sv / L) below f32's normal range (equal weights, L = the key count): an f32
        // subnormal V scale, and a normal one (2^-120) divided by up to 129 keys (the audit of session 31)
        if (kind == 4)
          for (auto& x : p.vs) x = 1e-44f;
        if (kind == 5)
          for (auto& x : p.vs) x = std::ldexp(1.0f + static_cast<float>(rng() % 64) / 64, -120);
        test::place_pages(p, rng);
        int bad = 0, nonfinite = 0;
        check_against_exact(p, path, &bad, &nonfinite);
        CHECK(bad == 0);
        CHECK(nonfinite == 0);
      }
      ++seed;
    }
  }

  TEST_CASE("fast: a bf16 output is the f32 output rounded to nearest even, on every path (subnormal outputs too)") {
    // Every path computes the f32 value RN32(O · RN32(sv / L)) and rounds it once for bf16 (the vector paths 16 at a
    // time): the bf16 run's bits must be the reference's RNE narrowing (ref::narrow) of the f32 run's, element for
    // element.
    for (int64_t d : {int64_t{128}, int64_t{40}})
      for (int tiny = 0; tiny < 2; ++tiny)
        for (auto path : {attn::cpu::FastPath::automatic, attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2,
                          attn::cpu::FastPath::portable}) {
          CAPTURE(d);
          CAPTURE(tiny);
          AttnSpec s = spec_of(16, 2, 16, d);
          s.out_format = Format::f32;
          PagedProblem p = test::random_problem(s, {70, 0, 33}, {1, 0, 2}, 21 + static_cast<uint64_t>(d));
          if (tiny)  // outputs below 2^-126: subnormal in f32 and in bf16
            for (auto& x : p.vs) x = std::ldexp(x, -127);
          attn::AttnArgs a = p.args();
          attn::cpu::paged_attention_fast(p.spec, a, path);
          std::vector<uint32_t> f(p.out.size() / 4);
          std::memcpy(f.data(), p.out.data(), p.out.size());
          PagedProblem q = p;
          q.spec.out_format = Format::bf16;
          q.out.assign(f.size() * 2, 0xEE);
          attn::AttnArgs qa = q.args();
          attn::cpu::paged_attention_fast(q.spec, qa, path);
          int bad = 0, subnormal = 0;
          for (size_t i = 0; i < f.size(); ++i) {
            uint16_t h;
            std::memcpy(&h, &q.out[2 * i], 2);
            bad += h != ref::narrow(Format::f32, f[i], Format::bf16);
            subnormal += (h & 0x7F80) == 0 && (h & 0x7F) != 0;
          }
          CHECK(bad == 0);
          if (tiny) CHECK(subnormal > 0);
        }
  }

  TEST_CASE("fast: the cpu backend dispatches to it; the reference refuses it; unquantized chunks refused") {
    PagedProblem p = test::random_problem(spec_of(16, 2, 8, 64), {40, 9}, {1, 2}, 3);
    const AttnSpec s = p.spec;
    attn::AttnArgs a = p.args();
    attn::cpu::paged_attention(s, a);
    const std::vector<uint8_t> via_cpu = p.out;
    attn::cpu::paged_attention_fast(s, a);
    CHECK(via_cpu == p.out);
    {  // automatic takes the most capable path the CPU has: AMX, else AVX-512 BF16, else AVX2. Each path sums in its
       // own order, so with f32 outputs theirs differ in low bits: the forced path's output identifies the choice.
      AttnSpec s32 = spec_of(16, 2, 8, 128);
      s32.out_format = Format::f32;
      PagedProblem p32 = test::random_problem(s32, {300, 77}, {1, 3}, 4);
      {  // The second sequence's dot products cancel: q·k = 2^24 (d 0) + k_1 (d 1, in [1/8, 1]) − 2^24 (d 8), so a
         // sum in d order loses k_1 (2^24 + k_1 rounds back to 2^24) and every logit is 0, while sums in lanes (d mod
         // 8 together) keep it. Random data alone cannot tell the AVX2 and portable paths apart: they differ only in
         // the dot order, which rarely survives P̃'s bf16 rounding.
        std::mt19937_64 rng(5);
        ConversionSpec e4;
        e4.to = Format::e4m3fn;
        const int64_t H = s32.cache.num_kv_heads, D = s32.cache.head_dim;
        for (int64_t j = 0; j < 77; ++j)
          for (int64_t h = 0; h < H; ++h) {
            uint8_t* k = &p32.kd[1][static_cast<size_t>((j * H + h) * D)];
            k[0] = k[8] = ref::encode_f64(256.0, e4);
            k[1] = ref::encode_f64(std::ldexp(1.0 + static_cast<double>(rng() % 8) / 8, -1 - static_cast<int>(rng() % 3)), e4);
          }
        for (int64_t r = p32.qsl[1]; r < p32.qsl[2]; ++r)
          for (int64_t h = 0; h < s32.num_q_heads; ++h) {
            uint16_t* q = reinterpret_cast<uint16_t*>(&p32.q[static_cast<size_t>((r * s32.num_q_heads + h) * D) * 2]);
            std::fill(q, q + D, uint16_t{0});
            q[0] = 0x4780;  // 2^16 (bf16)
            q[1] = 0x3F80;  // 1
            q[8] = 0xC780;  // −2^16
          }
        test::place_pages(p32, rng);
      }
      attn::AttnArgs a32 = p32.args();
      const attn::cpu::FastPath want = attn::cpu::fast_attention_has_amx()            ? attn::cpu::FastPath::amx
                                       : attn::cpu::fast_attention_has_avx512bf16() ? attn::cpu::FastPath::avx512bf16
                                       : attn::cpu::fast_attention_has_avx2()       ? attn::cpu::FastPath::avx2
                                                                                    : attn::cpu::FastPath::portable;
      attn::cpu::paged_attention_fast(p32.spec, a32, want);
      const std::vector<uint8_t> forced = p32.out;
      attn::cpu::paged_attention(p32.spec, a32);
      CHECK(forced == p32.out);
      int differing = 0;  // the paths this CPU has besides the chosen one give other bits somewhere (else the check
                          // above could not tell them apart)
      for (auto other : {attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2, attn::cpu::FastPath::portable}) {
        if (other == want) continue;
        attn::cpu::paged_attention_fast(p32.spec, a32, other);
        differing += p32.out != forced;
      }
      if (want != attn::cpu::FastPath::portable) CHECK(differing >= 1);  // (a CPU without AVX2 has one path only)
    }
    CHECK_THROWS_AS(attn::ref::paged_attention(s, a), InputError);
    AttnSpec cap = s;  // soft-cap: accepted (checked against exact in the cases above); a negative one refused
    cap.softcap = 5;
    CHECK_NOTHROW(attn::cpu::paged_attention(cap, a));
    cap.softcap = -1;
    CHECK_THROWS_AS(attn::cpu::paged_attention(cap, a), InputError);
    AttnSpec chunk = s;
    chunk.chunk_unquantized = true;
    CHECK_THROWS_AS(attn::cpu::paged_attention(chunk, a), InputError);
    attn::AttnConvention c;
    CHECK(attn::parse_attn_convention("fast", &c));
    CHECK(c == attn::AttnConvention::fast);
    CHECK(std::string(attn::to_string(attn::AttnConvention::fast)) == "fast");
  }

  TEST_CASE("fast: the soft-cap's tanh is within kFastTanhErr of tanh, every path; odd; NaN stays NaN") {
    // every 61st positive f32 up to 64 (tanh = 1 in f32 from ~9; exp2's argument passes −126 at ~43.7) and
    // hand-picked values around the branch and the cancellation region
    std::vector<float> u;
    for (uint32_t b = 0; b <= 0x42800000u; b += 61) u.push_back(fp8ref::f32_from_bits(b));
    for (float v : {0.0f, 1e-30f, 1e-7f, 0.5f, 0.549306f, 1.0f, 9.0f, 43.6682f, 43.6683f, 43.7f, 1e30f, 3e38f})
      u.push_back(v);
    const size_t n = u.size();
    for (size_t i = 0; i < n; ++i) u.push_back(-u[i]);
    u.push_back(std::numeric_limits<float>::infinity());
    u.push_back(-std::numeric_limits<float>::infinity());
    for (auto path : {attn::cpu::FastPath::automatic, attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2, attn::cpu::FastPath::portable}) {
      CAPTURE(static_cast<int>(path));
      std::vector<float> y(u.size());
      attn::cpu::fast_tanh(u.data(), y.data(), u.size(), path);
      int bad = 0, odd = 0;
      double worst = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        const double e = std::fabs(static_cast<double>(y[i]) - std::tanh(static_cast<double>(u[i])));
        worst = std::max(worst, e);
        if (!(e <= attn::cpu::kFastTanhErr) && bad++ < 3) MESSAGE("tanh(" << u[i] << ") = " << y[i]);
        if (i < n && !(y[i] == -y[i + n] && std::signbit(y[i]) != std::signbit(y[i + n]))) ++odd;
      }
      MESSAGE("max |tanh_fast − tanh| = 2^" << std::log2(worst));
      CHECK(bad == 0);
      CHECK(odd == 0);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      float ny = 0;
      attn::cpu::fast_tanh(&nan, &ny, 1, path);
      CHECK(std::isnan(ny));
    }
  }

  TEST_CASE("fast: exp2 on [-126, 0] equals ref::exp2_sleef and is within 2^-22 of exp2") {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> u(-126.0f, 0.0f);
    std::vector<float> z;
    for (float v : {0.0f, -0.0f, -0.5f, -1.0f, -125.5f, -126.0f, -1e-30f}) z.push_back(v);
    for (int i = 0; i < 300000; ++i) z.push_back(u(rng));
    std::vector<float> y(z.size());
    for (auto path : {attn::cpu::FastPath::automatic, attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2, attn::cpu::FastPath::portable}) {
      CAPTURE(static_cast<int>(path));
      attn::cpu::fast_exp2(z.data(), y.data(), z.size(), path);
      int diff = 0, inacc = 0;
      for (size_t i = 0; i < z.size(); ++i) {
        const float r = attn::ref::exp2_sleef(z[i]);
        if (std::memcmp(&r, &y[i], 4) != 0) ++diff;
        const long double e = std::exp2(static_cast<long double>(z[i]));
        if (std::fabs(static_cast<long double>(y[i]) - e) > std::ldexp(e, -22)) ++inacc;
      }
      CHECK(diff == 0);
      CHECK(inacc == 0);
    }
  }

  TEST_CASE("fast: the AVX2 path's tanh is the scalar tanh_fast bit for bit") {
    if (!attn::cpu::fast_attention_has_avx2()) {  // avx2 would fall back to the scalar steps: nothing to compare
      MESSAGE("skipped: no AVX2 + FMA + F16C on this CPU");
      return;
    }
    std::mt19937_64 rng(12);
    std::uniform_real_distribution<float> d(-50.0f, 50.0f);
    std::vector<float> u{0.0f, -0.0f, 1e-30f, 43.7f, -43.7f, 3e38f, std::numeric_limits<float>::infinity()};
    for (int i = 0; i < 100000; ++i) u.push_back(d(rng));
    std::vector<float> a(u.size()), b(u.size());
    attn::cpu::fast_tanh(u.data(), a.data(), u.size(), attn::cpu::FastPath::avx2);
    attn::cpu::fast_tanh(u.data(), b.data(), u.size(), attn::cpu::FastPath::portable);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  }

  TEST_CASE("fast: a non-finite code (e4m3fn NaN, e5m2 Inf/NaN) sends its AVX2 / AVX-512 BF16 unit to the portable path, bit for bit") {
    // the AVX2 and AVX-512 BF16 paths hand such a unit to the portable steps (masked keys would turn 0·Inf into NaN)
    for (Format f : {Format::e4m3fn, Format::e5m2})
      for (int where = 0; where < 2; ++where) {
        CAPTURE(format_name(f));
        CAPTURE(where);
        AttnSpec s = spec_of(16, 2, 8, 64);
        s.cache.format = f;
        PagedProblem p = test::random_problem(s, {50, 20}, {1, 3}, 60 + static_cast<uint64_t>(where));
        const int64_t H = s.cache.num_kv_heads, D = s.cache.head_dim;
        // K: a NaN in sequence 0's key 45 (e5m2: −NaN); V: an Inf/NaN in sequence 1's key 18, which its query tokens
        // 1 and 2 see but not token 0 (tokens 0 and 1 share an AVX2 unit: 2 × 4 rows) (e5m2: +Inf) — head 1 both times
        const uint8_t bad = f == Format::e4m3fn ? 0xFF : where == 0 ? 0xFE : 0x7C;
        if (where == 0) p.kd[0][static_cast<size_t>((45 * H + 1) * D + 9)] = bad;
        else p.vd[1][static_cast<size_t>((18 * H + 1) * D + 9)] = bad;
        std::mt19937_64 rng(6);
        test::place_pages(p, rng);
        attn::AttnArgs a = p.args();
        attn::cpu::paged_attention_fast(p.spec, a, attn::cpu::FastPath::portable);
        const std::vector<uint8_t> want = p.out;
        for (auto path : {attn::cpu::FastPath::avx2, attn::cpu::FastPath::avx512bf16}) {
          if (path == attn::cpu::FastPath::avx2 ? !attn::cpu::fast_attention_has_avx2()
                                                : !attn::cpu::fast_attention_has_avx512bf16())
            continue;
          CAPTURE(static_cast<int>(path));
          std::fill(p.out.begin(), p.out.end(), 0xCD);
          attn::cpu::paged_attention_fast(p.spec, a, path);
          // the rows of KV head 1 (q heads 4..7) of every token: token 0 (sequence 0), tokens 1..3 (sequence 1)
          const size_t e = p.out_elem(), row = static_cast<size_t>(D) * e;
          for (size_t tok = 0; tok < 4; ++tok) {
            CAPTURE(tok);
            CHECK(std::memcmp(&p.out[(tok * 8 + 4) * row], &want[(tok * 8 + 4) * row], 4 * row) == 0);
          }
          // a V code's Inf/NaN shows in its column of the row that sees it, and only there (a K code's NaN: in every
          // element of the rows that see it — the NaN-policy test below)
          if (where == 1) {
            CHECK(!std::isfinite(test::out_value(s.out_format, &p.out[(2 * 8 + 4) * row + 9 * e])));
            CHECK(std::isfinite(test::out_value(s.out_format, &p.out[(1 * 8 + 4) * row + 9 * e])));
          }
        }
      }
  }
}

TEST_SUITE("attention-fast") {
  TEST_CASE("a NaN code in a visible key: cpu == reference bit for bit, every bit-exact convention") {
    const attn::AttnConvention convs[] = {attn::AttnConvention::exact, attn::AttnConvention::vllm_paged_v1,
                                          attn::AttnConvention::vllm_triton_unified, attn::AttnConvention::flashinfer,
                                          attn::AttnConvention::torch_sdpa_math, attn::AttnConvention::spyre};
    for (int where = 0; where < 3; ++where)  // NaN in K, in V, in both
      for (Format md : {Format::bf16, Format::f32})
        for (attn::AttnConvention conv : convs) {
          CAPTURE(where);
          const std::string cname = attn::to_string(conv), mname = format_name(md);
          CAPTURE(cname);
          CAPTURE(mname);
          AttnSpec s = spec_of(16, 2, 4, 64);
          s.convention = conv;
          s.q_format = s.out_format = md;
          PagedProblem p = test::random_problem(s, {37, 20, 5}, {1, 4, 1}, 40 + static_cast<uint64_t>(where));
          const int64_t H = s.cache.num_kv_heads, D = s.cache.head_dim;
          for (int64_t b = 0; b < p.B; ++b) {  // key 3 of every sequence, head 1, a few dims; the sign varies
            if (where != 1) p.kd[b][static_cast<size_t>((3 * H + 1) * D + 5)] = 0x7F;
            if (where != 0) {
              p.vd[b][static_cast<size_t>((3 * H + 1) * D + 7)] = 0xFF;
              p.vd[b][static_cast<size_t>((3 * H + 1) * D + 8)] = 0x7F;
            }
          }
          std::mt19937_64 rng(5);
          test::place_pages(p, rng);
          attn::AttnArgs a = p.args();
          attn::ref::paged_attention(p.spec, a);
          const std::vector<uint8_t> want = p.out;
          std::fill(p.out.begin(), p.out.end(), 0xCD);
          attn::cpu::paged_attention(p.spec, a);
          int diff = 0;
          for (size_t i = 0; i < p.out.size(); i += p.out_elem())
            if (std::memcmp(&p.out[i], &want[i], p.out_elem()) != 0 && diff++ < 3)
              MESSAGE("element " << i / p.out_elem() << ": cpu " << test::out_value(md, &p.out[i]) << " reference "
                                 << test::out_value(md, &want[i]));
          CHECK(diff == 0);
        }
  }
}

TEST_SUITE("attention-fast") {
  // NaN policy (include/fp8ref/attention.h, convention fast): what is NaN (±Inf) in exact's result is NaN (±Inf) in
  // fast's, on every path — a NaN or ±Inf query element, a NaN (e5m2: ±Inf) code in a key a row sees, a NaN/Inf code
  // in a V row a row sees; codes in keys a row cannot see change nothing; every other element stays within the
  // bound. (Before: a NaN logit got weight 0 — a NaN query gave a row of zeros — and a vector-path unit of several
  // KV heads handed to the portable steps had only its first head written.)
  TEST_CASE("fast: NaN and Inf inputs give NaN / Inf exactly where exact's result has them, every path") {
    struct Bad {
      const char* what;
      int kind;          // 0: q element, 1: K code, 2: V code, 3: the K scale, 4: the V scale (q_bits: f32 bits >> 16)
      size_t tok, head;  // q: token, q head; K/V: sequence, key
      uint16_t q_bits;   // q (bf16) bits
      uint8_t code;      // K/V code (of KV head 1, d 9)
    };
    // two sequences (50 keys, decode; 20 keys, a 3-token chunk at 17..19): one KV head per vector-path unit
    const Bad few[] = {
        {"q NaN (token 0)", 0, 0, 5, 0x7FC0, 0},
        {"q +Inf (token 2)", 0, 2, 1, 0x7F80, 0},
        {"q -Inf (token 3)", 0, 3, 6, 0xFF80, 0},
        {"K NaN code, seq 0 key 45", 1, 0, 45, 0, 0x7F},
        {"K NaN code, seq 1 key 18 (tokens 2, 3 see it)", 1, 1, 18, 0, 0xFF},
        {"V NaN code, seq 1 key 18", 2, 1, 18, 0, 0x7F},
        {"K NaN code, seq 1 key 19 (only token 3 sees it)", 1, 1, 19, 0, 0x7F},
        {"K scale NaN", 3, 0, 0, 0x7FC0, 0},
        {"K scale +Inf", 3, 0, 0, 0x7F80, 0},
        {"V scale NaN", 4, 0, 0, 0x7FC0, 0},
    };
    // 40 decode sequences over 4 KV heads: the vector paths group a step's KV heads into one unit
    const Bad many[] = {
        {"many: q NaN (token 7, q head 5)", 0, 7, 5, 0x7FC0, 0},
        {"many: K NaN code, seq 11 key 0", 1, 11, 0, 0, 0x7F},
        {"many: V NaN code, seq 30 key 2", 2, 30, 2, 0, 0xFF},
    };
    for (int cfg = 0; cfg < 2; ++cfg)
      for (Format f : {Format::e4m3fn, Format::e5m2})
        for (int extra = 0; extra < 3; ++extra)
          for (const Bad& b : cfg == 0 ? std::vector<Bad>(std::begin(few), std::end(few))
                                       : std::vector<Bad>(std::begin(many), std::end(many))) {
            Bad bd = b;
            if (extra > 0) {  // e5m2 only: ±Inf codes in K and V
              if (f != Format::e5m2 || b.kind == 0 || b.kind > 2) continue;
              bd.code = extra == 1 ? 0x7C : 0xFC;
            }
            const std::string what = bd.what, fmt = format_name(f);
            CAPTURE(fmt);
            CAPTURE(what);
            CAPTURE(static_cast<int>(bd.code));
            AttnSpec s = cfg == 0 ? spec_of(16, 2, 8, 64) : spec_of(16, 4, 16, 64);
            s.cache.format = f;
            std::vector<int64_t> sl{50, 20}, ql{1, 3};
            if (cfg == 1) {
              sl.clear();
              ql.assign(40, 1);
              for (int i = 0; i < 40; ++i) sl.push_back(1 + (i * 37) % 60);
            }
            PagedProblem p = test::random_problem(s, sl, ql, 77);
            const int64_t H = s.cache.num_kv_heads, D = s.cache.head_dim;
            if (bd.kind == 0)
              std::memcpy(&p.q[((bd.tok * static_cast<size_t>(s.num_q_heads) + bd.head) * D + 7) * 2], &bd.q_bits, 2);
            else if (bd.kind <= 2)
              (bd.kind == 1 ? p.kd : p.vd)[bd.tok][static_cast<size_t>((bd.head * H + 1) * D + 9)] = bd.code;
            else
              (bd.kind == 3 ? p.ks : p.vs)[0] = f32_from_bits(static_cast<uint32_t>(bd.q_bits) << 16);
            std::mt19937_64 rng(8);
            test::place_pages(p, rng);
            s = p.spec;
            attn::AttnArgs a = p.args();
            const int64_t n = p.T * s.num_q_heads * s.dv();
            std::vector<double> ex, bound;
            exact_and_bound(p, &ex, &bound);
            int nonfinite = 0;
            for (double v : ex) nonfinite += !std::isfinite(v);
            if (extra == 0 || bd.kind != 1) CHECK(nonfinite > 0);  // NaN or Inf in exact (an Inf key may give −Inf logits)
            for (auto path : {attn::cpu::FastPath::automatic, attn::cpu::FastPath::avx512bf16, attn::cpu::FastPath::avx2, attn::cpu::FastPath::portable}) {
              CAPTURE(static_cast<int>(path));
              std::fill(p.out.begin(), p.out.end(), 0xCD);
              attn::cpu::paged_attention_fast(s, a, path);
              int wrong = 0;
              for (int64_t i = 0; i < n; ++i) {
                const double got = test::out_value(s.out_format, &p.out[static_cast<size_t>(i) * p.out_elem()]);
                const double want = ex[static_cast<size_t>(i)], bd_i = bound[static_cast<size_t>(i)];
                const bool same = std::isnan(got) == std::isnan(want) && std::isinf(got) == std::isinf(want) &&
                                  (!std::isinf(got) || (got > 0) == (want > 0)) &&
                                  (!std::isfinite(want) || !std::isfinite(bd_i) || std::fabs(got - want) <= bd_i);
                if (!same && wrong++ < 3) MESSAGE("element " << i << ": fast " << got << ", exact " << want << ", bound " << bd_i);
              }
              CHECK(wrong == 0);
            }
          }
  }
}
