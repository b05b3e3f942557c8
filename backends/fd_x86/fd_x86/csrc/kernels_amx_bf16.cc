// AMX-BF16 GEMM for dense bf16 linears (Sapphire Rapids and later):
// out fp32 [M, N] = bf16(x) @ W (+ bias), W bf16 [K, N] in the reference's
// layout, read in place. The numerics are the avx512_bf16 GEMM's
// (kernels_dense16.cc): x rounded to bf16 (RNE) once per call, products of
// two bf16s exact, fp32 accumulation (tdpbf16ps sums its pairs in its own
// order, so results agree with the vdpbf16ps GEMM to fp32 summation, not bit
// for bit): |out - ref| <= 2^-9 * sum_k |x_k w_k| + fp32 summation.
//
// Per thread, per 64-output panel: the whole of K is packed once into
// thread-local scratch in the pair-interleaved layout [Kp/2][64][2] (Kp = K
// rounded up to 32, zeros past K), which is AMX's B-tile layout already: a
// B tile (16 pairs x 16 outputs) is 16 rows of 64 bytes at a stride of 256.
// Every 32 rows of x then run over it: C tiles 0-3 (2 row x 2 output
// blocks of 16), A tiles 4-5, B tiles 6-7, K in steps of 32; each half of the
// panel (32 outputs) in turn. x is rounded into [Mp][Kp] (Mp = M rounded up
// to 32, zero rows), so no tile reads past a buffer; C goes through a small
// buffer to `out` (masks for the last rows and outputs, bias added).
//
// Compiled for AMX + AVX-512 by the pragma below and only called after
// fdx86::amx_bf16_available() (kernels_cpu.cc) said yes.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

#include "amx_tiles.h"
#include "kernels.h"

namespace {

using fdx86::Dense16Args;

constexpr int64_t kPanelCols = 64;
constexpr int64_t kMinParallelMacs = int64_t(1) << 20;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
inline __mmask16 mask16(int64_t n) {
  return n <= 0 ? (__mmask16)0 : n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}
inline __mmask32 mask32(int64_t n) {
  return n <= 0 ? (__mmask32)0 : n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
}

// x fp32 [M, K] -> bf16 (RNE) [Mp, kp] as uint16, zero past K and past M
void round_rows(const Dense16Args& a, uint16_t* xb, int64_t mp, int64_t kp, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && a.M * a.K >= (1 << 16))
  for (int64_t m = 0; m < mp; ++m) {
    const float* r = m < a.M ? a.x + m * a.ldx : a.x;
    for (int64_t k = 0; k < kp; k += 16) {
      const __mmask16 mk = m < a.M ? mask16(a.K - k) : (__mmask16)0;
      const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xb + m * kp + k), v);
    }
  }
}

// W[0 .. K, n .. n + 64) -> panel [kp/2][64][2] (pair p, output c: (W[2p, n+c],
// W[2p+1, n+c])), zeros past K and N
void pack_panel(const Dense16Args& a, int64_t n, int64_t kp, uint32_t* panel) {
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  for (int64_t k = 0; k < kp; k += 2) {
    uint32_t* dst = panel + k / 2 * kPanelCols;
    for (int64_t col = 0; col < kPanelCols; col += 32) {
      const __mmask32 mk = mask32(a.N - n - col);
      const __m512i w0 = k < a.K ? _mm512_maskz_loadu_epi16(mk, w + k * a.N + n + col) : _mm512_setzero_si512();
      const __m512i w1 = k + 1 < a.K ? _mm512_maskz_loadu_epi16(mk, w + (k + 1) * a.N + n + col)
                                     : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + col, _mm512_permutex2var_epi16(w0, lo_idx, w1));
      _mm512_storeu_si512(dst + col + 16, _mm512_permutex2var_epi16(w0, hi_idx, w1));
    }
  }
}

// C tile buffer (16 x 16 fp32, 64-byte rows) -> out rows [m, m + 16) x
// outputs [n, n + 16), masked to M and N, bias added
inline void store_tile(const Dense16Args& a, const float* c, int64_t m, int64_t n) {
  const __mmask16 mk = mask16(a.N - n);
  if (mk == 0) return;
  const __m512 b = a.bias != nullptr ? _mm512_maskz_loadu_ps(mk, a.bias + n) : _mm512_setzero_ps();
  const int64_t rows = min64(16, a.M - m);
  for (int64_t i = 0; i < rows; ++i)
    _mm512_mask_storeu_ps(a.out + (m + i) * a.N + n, mk, _mm512_add_ps(_mm512_loadu_ps(c + i * 16), b));
}

// rows [m, m + 32) x outputs [n, n + 32) of this panel's half at `half`
void tile2x2(const Dense16Args& a, const uint16_t* xb, int64_t kp, const uint32_t* half, int64_t m, int64_t n,
             float (*buf)[256]) {
  const int64_t lda = kp * 2;  // bytes per row of xb
  const uint16_t* x0 = xb + m * kp;
  const uint16_t* x1 = x0 + 16 * kp;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < kp; k += 32) {
    const uint32_t* b = half + k / 2 * kPanelCols;
    _tile_loadd(4, x0 + k, lda);
    _tile_loadd(6, b, kPanelCols * 4);
    _tile_loadd(7, b + 16, kPanelCols * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, x1 + k, lda);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, buf[0], 64);
  _tile_stored(1, buf[1], 64);
  _tile_stored(2, buf[2], 64);
  _tile_stored(3, buf[3], 64);
  store_tile(a, buf[0], m, n);
  store_tile(a, buf[1], m, n + 16);
  if (m + 16 < a.M) {
    store_tile(a, buf[2], m + 16, n);
    store_tile(a, buf[3], m + 16, n + 16);
  }
}

// This thread's panel scratch, grown to `words` and kept (an allocation per
// call this size would be mmap'd and faulted in each time)
uint32_t* thread_panel(int64_t words) {
  static thread_local uint32_t* panel = nullptr;
  static thread_local int64_t capacity = 0;
  if (words > capacity) {
    std::free(panel);
    panel = static_cast<uint32_t*>(std::aligned_alloc(64, static_cast<size_t>(round_up(words * 4, 64))));
    capacity = panel == nullptr ? 0 : words;
  }
  return panel;
}

}  // namespace

namespace fdx86 {

bool dense16_gemm_amx(const Dense16Args& a) {
  if (a.wtype != kDense16Bf16 || a.M <= 0 || a.N <= 0 || a.K <= 0) return false;
  const int64_t kp = round_up(a.K, 32), mp = round_up(a.M, 32);
  const int64_t panels = (a.N + kPanelCols - 1) / kPanelCols;
  int threads = a.threads < 1 ? 1 : a.threads;
  if (a.M * a.N * a.K < kMinParallelMacs || panels < 2) threads = 1;
  uint16_t* xb = static_cast<uint16_t*>(std::aligned_alloc(64, static_cast<size_t>(round_up(mp * kp * 2, 64))));
  if (xb == nullptr) return false;
  round_rows(a, xb, mp, kp, threads);
  int failed = 0;
  // panels split into one contiguous run per thread (as the vdpbf16ps GEMM)
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) reduction(| : failed)
  for (int64_t t = 0; t < threads; ++t) {
    uint32_t* panel = thread_panel(kp / 2 * kPanelCols);
    if (panel == nullptr) {
      failed = 1;
      continue;
    }
    load_config();
    alignas(64) float buf[4][256];
    for (int64_t p = panels * t / threads; p < panels * (t + 1) / threads; ++p) {
      const int64_t n = p * kPanelCols;
      pack_panel(a, n, kp, panel);
      for (int64_t half = 0; half < kPanelCols && n + half < a.N; half += 32)
        for (int64_t m = 0; m < a.M; m += 32) tile2x2(a, xb, kp, panel + half, m, n + half, buf);
    }
    _tile_release();
  }
  std::free(xb);
  return failed == 0;
}

}  // namespace fdx86
