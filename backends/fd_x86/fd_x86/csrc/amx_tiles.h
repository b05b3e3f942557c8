// The tile configuration both AMX kernels use (kernels_amx.cc: int8,
// kernels_amx_bf16.cc: bf16): every tile 16 rows x 64 bytes. Included after
// the TU's `#pragma GCC target` naming amx-tile; internal linkage only.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

// ldtilecfg's 64-byte operand (palette 1)
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
  uint8_t reserved2[16];
};

// Tiles 0-7 all 16 rows x 64 bytes (the kernels: C 0-3, A 4-5, B 6-7)
inline void load_config() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // _tile_loadconfig's asm names only 8 bytes of cfg as its input: make
  // every store above happen first
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

}  // namespace
