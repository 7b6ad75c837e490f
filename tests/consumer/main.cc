#include <cstdio>
#include <string>

#include <fp8ref/convert.h>

int main() {
  std::string err;
  auto spec = fp8ref::resolve_convention("cuda-satfinite", fp8ref::Format::f32, fp8ref::Format::e4m3fn, &err);
  float x[3] = {464.0f, 465.0f, -1e9f};
  uint8_t codes[3];
  fp8ref::cpu::encode_f32(x, codes, 3, *spec);
  std::printf("%02x %02x %02x\n", codes[0], codes[1], codes[2]);
  return (codes[0] == 0x7E && codes[1] == 0x7E && codes[2] == 0xFE) ? 0 : 1;
}
