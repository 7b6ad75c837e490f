// A downstream program on the installed headers alone: a conversion under a named convention, a group quant as
// vLLM does (resolve, finalize, run), and the fast scaled_mm with a packed weight, checked against its own bound.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fp8ref/convert.h>
#include <fp8ref/gemm.h>
#include <fp8ref/quant.h>

using namespace fp8ref;

int main() {
  std::string err;
  int failures = 0;
  // 1. convert: satfinite clamps 464 and 465 to 448
  const auto conv = resolve_convention("cuda-satfinite", Format::f32, Format::e4m3fn, &err);
  float x[3] = {464.0f, 465.0f, -1e9f};
  uint8_t codes[3];
  cpu::encode_f32(x, codes, 3, *conv);
  std::printf("convert: %02x %02x %02x\n", codes[0], codes[1], codes[2]);
  failures += !(codes[0] == 0x7E && codes[1] == 0x7E && codes[2] == 0xFE);
  // 2. group quant 1x128 (vllm-group): a row of 1.0 and 448.0 has scale 448/448 = 1, codes 0x38 and 0x7E
  QuantSpec q = *resolve_quant_convention("vllm-group", Format::e4m3fn, std::nullopt, &err);
  finalize_quant_spec(&q, true);
  std::vector<float> xs(128, 1.0f);
  xs[5] = 448.0f;
  std::vector<uint8_t> qc(128);
  float scale = 0;
  cpu::quantize(q, Format::f32, xs.data(), {1, 128}, qc.data(), &scale);
  std::printf("quantize: scale %g, codes %02x %02x\n", scale, qc[0], qc[5]);
  failures += !(scale == 1.0f && qc[0] == 0x38 && qc[5] == 0x7E);
  // 3. scaled_mm fast with a packed B, within its bound of the exact value: A = B = 1.0 (0x38), K = 256, scales 0.5
  ScaledMmSpec s;
  s.model = GemmModel::fast;
  s.out = Format::f32;
  const GemmShape g{2, 3, 256};
  std::vector<uint8_t> a(2 * 256, 0x38), bt(3 * 256, 0x38);
  const float sa = 0.5f, sb = 0.5f;
  const cpu::FastGemmB packed(s, g, bt.data());
  std::vector<float> out(6);
  std::vector<double> bound(6);
  cpu::scaled_mm_fast(s, g, a.data(), packed, &sa, &sb, nullptr, out.data());
  cpu::scaled_mm_fast_bound(s, g, a.data(), bt.data(), &sa, &sb, nullptr, bound.data());
  std::printf("scaled_mm fast: %g (bound %g)\n", out[0], bound[0]);
  for (int i = 0; i < 6; ++i) failures += !(std::fabs(out[i] - 64.0) <= bound[i]);
  return failures == 0 ? 0 : 1;
}
