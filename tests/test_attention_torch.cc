// torch-sdpa-math against PyTorch 2.11's CPU math SDPA, captured on the device machine's CPU (AVX512 capability,
// one thread) by tools/device/capture_attention.py into tests/data/h200/sdpa_math_cpu.safetensors, and again with
// torch held to its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2: 8-lane sums, torch_lanes 8) into
// sdpa_math_cpu_avx2.safetensors. Each captured
// case's dense K/V codes are placed in a paged cache (shuffled pages, block size 16, NaN everywhere else) and run
// through fp8ref; the output must equal torch's bit for bit. The capture's pieces (torch.softmax rows, an f32 matmul)
// check the model's exp, lane-ordered sum and matmul order on their own.
#include <doctest/doctest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "fp8ref/attention.h"
#include "fp8ref/io.h"
#include "support/attention_cases.h"

using namespace fp8ref;

namespace {

const std::string kFile = std::string(FP8REF_TEST_DATA) + "/h200/sdpa_math_cpu.safetensors";
// The same capture with ATEN_CPU_CAPABILITY=avx2 (MKL and oneDNN held to AVX2 too): the kernels an AVX2-only CPU
// runs, Vectorized<float> of 8 lanes (torch_lanes 8).
const std::string kFileAvx2 = std::string(FP8REF_TEST_DATA) + "/h200/sdpa_math_cpu_avx2.safetensors";
const std::string kFiles[] = {kFile, kFileAvx2};

// The lanes of torch's Vectorized<float> in a capture: 16 (AVX512 capability) or 8 (AVX2).
int lanes_of(const io::SafetensorsFile& f) {
  const nlohmann::json t = nlohmann::json::parse(f.metadata.at("torch"));
  return t["capability"].get<std::string>() == "AVX512" ? 16 : 8;
}

const io::Tensor& get(const io::SafetensorsFile& f, const std::string& name) {
  const io::Tensor* t = f.find(name);
  REQUIRE_MESSAGE(t != nullptr, name);
  return *t;
}
template <typename T>
T at(const io::Tensor& t, size_t i) {
  T v;
  std::memcpy(&v, &t.data[i * sizeof(T)], sizeof(T));
  return v;
}

Format md_of(const std::string& s) { return s == "bf16" ? Format::bf16 : s == "f16" ? Format::f16 : Format::f32; }

}  // namespace

TEST_SUITE("attention-torch") {
  TEST_CASE("exp model: within 1 ulp of the correctly rounded exp over the captured inputs (normal results)") {
    // torch.exp (the capture's exp.y) is MKL VML's vsExp, not the Vectorized<float>::exp (Sleef u10) that softmax
    // runs; the softmax test below is the bitwise check of the model. Here: Sleef u10's accuracy claim.
    const io::SafetensorsFile f = io::read_safetensors(kFile);
    const io::Tensor& x = get(f, "exp.x");
    int bad = 0;
    for (size_t i = 0; i < static_cast<size_t>(x.numel()); ++i) {
      const float xi = at<float>(x, i);
      const float want = static_cast<float>(std::exp(static_cast<double>(xi)));
      if (!(want >= 1.17549435e-38f)) continue;
      const float got = attn::ref::exp_sleef(xi);
      if (std::fabs(static_cast<double>(got) - want) > std::ldexp(static_cast<double>(want), -23) && bad++ < 5)
        MESSAGE("exp(" << xi << "): fp8ref " << got << ", correctly rounded " << want);
    }
    CHECK(bad == 0);
  }

  TEST_CASE("softmax model = torch.softmax rows of length 1..70 (max, exp, 16- or 8-lane sum, ·(1/S))") {
    for (const std::string& file : kFiles) {
      CAPTURE(file);
      const io::SafetensorsFile f = io::read_safetensors(file);
      const int W = lanes_of(f);
      const io::Tensor& x = get(f, "smx.x");
      const io::Tensor& y = get(f, "smx.y");
      int bad = 0;
      for (int n = 1; n <= 70; ++n) {
        std::vector<float> e(static_cast<size_t>(n));
        float m = -INFINITY;
        for (int j = 0; j < n; ++j) m = std::max(m, at<float>(x, static_cast<size_t>((n - 1) * 70 + j)));
        for (int j = 0; j < n; ++j)
          e[j] = attn::ref::exp_sleef(at<float>(x, static_cast<size_t>((n - 1) * 70 + j)) - m);
        float S = 0;
        if (n < W) {
          for (int j = 0; j < n; ++j) S = S + e[j];
        } else {
          float lane[16];
          for (int r = 0; r < W; ++r) lane[r] = e[r];
          for (int j = W; j < n; ++j) lane[j % W] = lane[j % W] + e[j];
          for (int w = W / 2; w >= 1; w /= 2)
            for (int r = 0; r < w; ++r) lane[r] = lane[r] + lane[r + w];
          S = lane[0];
        }
        const float inv = 1.0f / S;
        for (int j = 0; j < n; ++j) {
          const float p = e[j] * inv;
          if (std::memcmp(&p, &y.data[static_cast<size_t>((n - 1) * 70 + j) * 4], 4) != 0 && bad++ < 5)
            MESSAGE("row length " << n << " element " << j << ": fp8ref " << p << " torch "
                                  << at<float>(y, static_cast<size_t>((n - 1) * 70 + j)));
        }
      }
      CHECK(bad == 0);
    }
  }

  TEST_CASE("matmul model = torch f32 CPU matmul [8,40]x[40,64] (fma over k in order from +0)") {
    const io::SafetensorsFile f = io::read_safetensors(kFile);
    const io::Tensor& a = get(f, "bmm.a");
    const io::Tensor& b = get(f, "bmm.b");
    const io::Tensor& y = get(f, "bmm.y");
    int bad = 0;
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 64; ++j) {
        float acc = 0;
        for (int k = 0; k < 40; ++k) acc = std::fma(at<float>(a, static_cast<size_t>(i * 40 + k)), at<float>(b, static_cast<size_t>(k * 64 + j)), acc);
        if (std::memcmp(&acc, &y.data[static_cast<size_t>(i * 64 + j) * 4], 4) != 0) ++bad;
      }
    CHECK(bad == 0);
  }

  TEST_CASE("torch-sdpa-math: the captured cases (decode, prefill chunks, bottom-right and top-left masks), bit for bit, ref and cpu") {
    for (const std::string& file : kFiles) {
      CAPTURE(file);
      const io::SafetensorsFile f = io::read_safetensors(file);
      // All 8 cases of the capture (tools/device/capture_attention.py, additive 0/-inf masks as F.sdpa builds them).
      for (int ci = 0; ci < 8; ++ci) {
        const nlohmann::json m = nlohmann::json::parse(f.metadata.at("case" + std::to_string(ci)));
        CAPTURE(ci);
        attn::AttnSpec spec;
        spec.convention = attn::AttnConvention::torch_sdpa_math;
        REQUIRE(attn::parse_causal(m["causal"].get<std::string>(), &spec.causal));
        spec.q_format = spec.out_format = md_of(m["md"]);
        spec.cache.block_size = 16;
        spec.cache.num_kv_heads = m["hkv"];
        spec.cache.head_dim = m["dk"];
        spec.head_dim_v = m["dv"];
        spec.v_from_k = m["dv"] != m["dk"];
        spec.num_q_heads = m["hq"];
        spec.sm_scale = m["sm_scale"];
        spec.torch_lanes = lanes_of(f);
        test::PagedProblem p;
        p.spec = spec;
        p.B = 1;
        p.seq_lens = {m["kv"].get<int64_t>()};
        p.q_lens = {m["q_len"].get<int64_t>()};
        p.kd = {get(f, "c" + std::to_string(ci) + ".k8").data};
        p.vd = {spec.v_from_k ? std::vector<uint8_t>{} : get(f, "c" + std::to_string(ci) + ".v8").data};
        p.ks = {m["k_scale"].get<float>()};
        p.vs = {m["v_scale"].get<float>()};
        p.q = get(f, "c" + std::to_string(ci) + ".q").data;
        p.qsl = {0, static_cast<int32_t>(p.q_lens[0])};
        p.T = p.q_lens[0];
        std::mt19937_64 rng(static_cast<uint64_t>(ci) + 1);
        test::place_pages(p, rng);
        const std::vector<uint8_t>& want = get(f, "c" + std::to_string(ci) + ".out").data;
        p.out.assign(want.size(), 0xCD);
        attn::ref::paged_attention(p.spec, p.args());
        CHECK(p.out == want);
        std::fill(p.out.begin(), p.out.end(), 0xCD);
        attn::cpu::paged_attention(p.spec, p.args());
        CHECK(p.out == want);
      }
    }
  }
}
