// AMX-int8 kernel for w8a8 on the packed weight (Sapphire Rapids and later).
// Compiled for AMX + AVX-512 by the pragma below and only called after
// fdx86::amx_available() (kernels_cpu.cc: CPUID and the kernel's permission
// for the tile data) said yes, with K % 64 == 0.
//
// The packed w8a8 weight uint8 [N16][K4][16][4] (w ^ 0x80) is AMX's B-tile
// ("VNNI") format already: for 16-channel block j and K chunk of 64, the 16
// rows of 64 bytes at w + (j * K4 + k / 4) * 64 are one B tile (row = 4
// inputs, 16 channels x 4 bytes). A tiles are 16 rows x 64 bytes of xq (row
// stride ldq). tdpbsud (A signed, B unsigned) gives the same int32 sums as
// vpdpbusd in kernels_avx512.cc, so the epilogue (- 128 * xsum,
// (float(dot) * xscale) * scale) is the VNNI kernel's: bit-identical.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "amx_tiles.h"
#include "tiling.h"

namespace {

using fdx86::LinearArgs;

inline __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

// out rows [m, m + rows) x channels of block `block` from the int32 tile c
// (16 x 16, stride 64 bytes): the VNNI kernel's epilogue, op for op.
inline void epilogue(const LinearArgs& a, const int32_t* c, int64_t m, int64_t rows, int64_t block) {
  const int64_t n = block * 16;
  const __mmask16 mk = mask16(a.N - n);
  const __m512 sc = _mm512_maskz_loadu_ps(mk, a.scales + n);
  for (int64_t i = 0; i < rows; ++i) {
    __m512i s = _mm512_load_si512(c + i * 16);
    s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * a.xsum[m + i]));
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a.xscale[m + i])), sc);
    _mm512_mask_storeu_ps(a.out + (m + i) * a.N + n, mk, y);
  }
}

struct Amx {
  const LinearArgs& a;
  const int8_t* tail;  // the last row tile, zero padded to 16 rows (or null)
  int64_t row_tiles, full_tiles, blocks, K4;

  const int8_t* rows_ptr(int64_t t) const { return t < full_tiles ? a.xq + t * 16 * a.ldq : tail; }
  int64_t rows_in(int64_t t) const { return min64(16, a.M - t * 16); }
  const uint8_t* block_ptr(int64_t j) const { return static_cast<const uint8_t*>(a.w) + j * K4 * 64; }

  // 32 rows (tiles t, t + 1) x 32 channels (blocks j0, j1; j1 == j0 when
  // the chunk has one block: computed twice, stored once)
  void tile2x2(int64_t t, int64_t j0, int64_t j1, bool store1, int32_t (*buf)[256]) const {
    const int8_t* x0 = rows_ptr(t);
    const int8_t* x1 = rows_ptr(t + 1);
    const uint8_t* w0 = block_ptr(j0);
    const uint8_t* w1 = block_ptr(j1);
    const int64_t ldq = a.ldq;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < a.K; k += 64) {
      _tile_loadd(4, x0 + k, ldq);
      _tile_loadd(6, w0 + k * 16, 64);
      _tile_loadd(7, w1 + k * 16, 64);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
      _tile_loadd(5, x1 + k, ldq);
      _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
    _tile_stored(0, buf[0], 64);
    _tile_stored(1, buf[1], 64);
    _tile_stored(2, buf[2], 64);
    _tile_stored(3, buf[3], 64);
    epilogue(a, buf[0], t * 16, rows_in(t), j0);
    if (store1) epilogue(a, buf[1], t * 16, rows_in(t), j1);
    epilogue(a, buf[2], (t + 1) * 16, rows_in(t + 1), j0);
    if (store1) epilogue(a, buf[3], (t + 1) * 16, rows_in(t + 1), j1);
  }

  // 16 rows (tile t) x 32 channels
  void tile1x2(int64_t t, int64_t j0, int64_t j1, bool store1, int32_t (*buf)[256]) const {
    const int8_t* x0 = rows_ptr(t);
    const uint8_t* w0 = block_ptr(j0);
    const uint8_t* w1 = block_ptr(j1);
    const int64_t ldq = a.ldq;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t k = 0; k < a.K; k += 64) {
      _tile_loadd(4, x0 + k, ldq);
      _tile_loadd(6, w0 + k * 16, 64);
      _tile_loadd(7, w1 + k * 16, 64);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
    }
    _tile_stored(0, buf[0], 64);
    _tile_stored(1, buf[1], 64);
    epilogue(a, buf[0], t * 16, rows_in(t), j0);
    if (store1) epilogue(a, buf[1], t * 16, rows_in(t), j1);
  }

  // 16 rows (one tile: M <= 16) x 64 channels (blocks j[0..3], repeats of
  // the last block where the chunk has fewer: computed, not stored). The B
  // tiles rotate over three registers, so each load overlaps the previous
  // products (tile registers are not renamed).
  void tile1x4(const int64_t (&j)[4], int nstore, int32_t (*buf)[256]) const {
    const int8_t* x0 = rows_ptr(0);
    const uint8_t* w0 = block_ptr(j[0]);
    const uint8_t* w1 = block_ptr(j[1]);
    const uint8_t* w2 = block_ptr(j[2]);
    const uint8_t* w3 = block_ptr(j[3]);
    const int64_t ldq = a.ldq;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < a.K; k += 64) {
      _tile_loadd(4, x0 + k, ldq);
      _tile_loadd(5, w0 + k * 16, 64);
      _tile_loadd(6, w1 + k * 16, 64);
      _tile_dpbsud(0, 4, 5);
      _tile_loadd(7, w2 + k * 16, 64);
      _tile_dpbsud(1, 4, 6);
      _tile_loadd(5, w3 + k * 16, 64);
      _tile_dpbsud(2, 4, 7);
      _tile_dpbsud(3, 4, 5);
    }
    _tile_stored(0, buf[0], 64);
    _tile_stored(1, buf[1], 64);
    _tile_stored(2, buf[2], 64);
    _tile_stored(3, buf[3], 64);
    for (int q = 0; q < nstore; ++q) epilogue(a, buf[q], 0, rows_in(0), j[q]);
  }

  // chunk c: blocks_per_chunk() blocks x every row of x (W's channels stay
  // in L1/L2 while the row tiles pass over them)
  int64_t blocks_per_chunk() const { return row_tiles == 1 ? 4 : 2; }

  void chunk(int64_t c, int32_t (*buf)[256]) const {
    if (row_tiles == 1) {
      const int64_t j0 = 4 * c;
      const int nstore = int(min64(4, blocks - j0));
      const int64_t j[4] = {j0, j0 + min64(1, nstore - 1), j0 + min64(2, nstore - 1), j0 + min64(3, nstore - 1)};
      tile1x4(j, nstore, buf);
      return;
    }
    const int64_t j0 = 2 * c;
    const bool two = j0 + 1 < blocks;
    const int64_t j1 = two ? j0 + 1 : j0;
    int64_t t = 0;
    for (; t + 2 <= row_tiles; t += 2) tile2x2(t, j0, j1, two, buf);
    if (t < row_tiles) tile1x2(t, j0, j1, two, buf);
  }
};

}  // namespace

namespace fdx86 {

bool w8a8_packed_amx(const LinearArgs& a) {
  const int64_t row_tiles = (a.M + 15) / 16, full_tiles = a.M / 16;
  int8_t* tail = nullptr;
  if (full_tiles < row_tiles) {  // the last M % 16 rows, zero padded to a whole tile
    const size_t bytes = size_t(16 * a.ldq);
    tail = static_cast<int8_t*>(std::malloc(bytes));
    if (tail == nullptr) return false;
    std::memset(tail, 0, bytes);
    std::memcpy(tail, a.xq + full_tiles * 16 * a.ldq, size_t((a.M - full_tiles * 16) * a.ldq));
  }
  const int64_t blocks = (a.N + 15) / 16;
  const Amx amx{a, tail, row_tiles, full_tiles, blocks, (a.K + 3) / 4};
  const int64_t chunks = (blocks + amx.blocks_per_chunk() - 1) / amx.blocks_per_chunk();
  const bool parallel = a.threads > 1 && chunks > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel num_threads(a.threads) if (parallel)
  {
    alignas(64) int32_t buf[4][256];
    load_config();  // per thread: the tile state is per thread
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) amx.chunk(c, buf);
    _tile_release();
  }
  std::free(tail);
  return true;
}

}  // namespace fdx86
