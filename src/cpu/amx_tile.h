// fp8ref CPU backend — the AMX tile configuration (palette 1) shared by the kernels that use the tiles
// (src/cpu/attention_fast.cc, src/cpu/gemm_fast.cc). Which CPUs and OSes grant the tile state:
// attn::cpu::fast_attention_has_amx (src/cpu/attention_fast.h).
#pragma once

#include <cstdint>

namespace fp8ref::cpu {

// _tile_loadconfig's 64-byte operand: tile t has rows[t] rows of colsb[t] bytes.
struct alignas(64) TileCfg {
  uint8_t palette = 1, start = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace fp8ref::cpu
