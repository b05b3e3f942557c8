// AVX-512 BF16 kernels: wint4 against bf16 activations (vdpbf16ps), on the
// packed words (linears) and on the experts' contract layout (moe_kernels.h). Compiled for that ISA by the pragma below and only called
// after the CPU was seen to have avx512_bf16 (dense16_has_bf16_dot).
//
// For a model whose activations are bf16 (`--dtype bfloat16`, FastDeploy's
// numerics): an int4 code is exact in bf16, so vdpbf16ps multiplies the
// reference's operands exactly and sums them in fp32, 32 products per
// instruction against the fp32 kernel's 16 per FMA, and a code becomes bf16
// in one vpermw instead of a vpermps per 16 (Wint4Words).
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

#include "moe_kernels.h"
#include "packed_drive.h"
#include "tiling.h"

namespace {

using fdx86::LinearArgs;

// The MoE kernels' prefetch distance in each channel's stream (kernels_moe_avx512.cc's kPrefetchAhead)
constexpr int64_t kMoePrefetchAhead = 8192;

// bf16(v) of the signed 4-bit code in an index's low 4 bits (vpermw reads 5): 0 .. 7, -8 .. -1, twice
alignas(64) constexpr uint16_t kCodeBf16[32] = {
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
    0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80};

inline __m512i code_table() { return _mm512_load_si512(kCodeBf16); }

// The word layout (Wint4Words): word (kb, c) holds channel c's codes of inputs
// 8kb .. 8kb+7, input 8kb+t in bits 4t..4t+3. Shifted right by 4t, a word's
// 16-bit halves hold the codes of inputs 8kb+t (low) and 8kb+t+4 (high) in
// their low 4 bits: one vpermw makes the bf16 pair vdpbf16ps multiplies with
// the activation pair (x[8kb+t], x[8kb+t+4]) (wint4_bf16_prepare_avx512's
// order). Per group, the products summed in fp32 (two chains at 1-2 rows),
// then scaled into fp32 accumulators in group order: packed_drive.h's
// Wint4WordsTile, as Wint4Words, with these 4 steps per word.
struct Bf16Codes {
  static constexpr int kSteps = 4;
  const uint32_t* xb;
  int64_t K2;
  __m512i table;
  Bf16Codes(const LinearArgs& a, int64_t m) : xb(a.xb + m * (a.K / 2)), K2(a.K / 2), table(code_table()) {}
  __m512bh codes(__m512i v) const { return (__m512bh)_mm512_permutexvar_epi16(v, table); }
  __m512 madd(__m512 s, __m512bh w, int i, int64_t kb, int t) const {
    return _mm512_dpbf16_ps(s, w, (__m512bh)_mm512_set1_epi32(static_cast<int>(xb[i * K2 + kb * 4 + t])));
  }
};

template <int Blocks, int MaxRows>
using Wint4WordsBf16 = Wint4WordsTile<Bf16Codes, Blocks, MaxRows>;

// moe_kernels.h's Wint4Lut on bf16 activations: a channel's 128 codes of a
// block in one 64-byte load (lane l = inputs 8l .. 8l+7, input 8l+t in bits
// 4t..4t+3), shifted by 4t and turned into bf16 pairs (inputs 8l+t, 8l+t+4)
// by one vpermw, against the activation pairs of wint4_lut_bf16_prepare_avx512.
// The codes are unscaled: each group's products are summed in fp32, then
// scaled into the channel's accumulator (Wint4Lut folds the scale into its
// table), and the lanes are summed at the end. Tiles of up to 2 rows x 4
// channels: 8 accumulators and 8 group sums in registers; a (row, channel)
// sums in the same order whatever its tile, so an expert's output for a
// token does not depend on how many tokens the expert took. (4 x 2 tiles, and
// two sets of group sums at one row, ran slower or broke that.)
struct Wint4LutBf16 {
  static constexpr int kMaxRows = 2;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    constexpr int64_t kBlock = fdx86::kWint4LutBlock;
    const int64_t K = a.K, Kh = K / 2, K2 = K / 2, blocks_per_group = a.group_size / kBlock;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * Kh;
    RunPrefetch pf(w, kMoePrefetchAhead);  // the tile's rows in address order (tiling.h)
    const uint32_t* xb = a.xb + m * K2;
    const __m512i table = code_table();
    __m512 acc[MB][NB];
#pragma GCC unroll 2
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < a.groups; ++g) {
      __m512 gacc[MB][NB];
#pragma GCC unroll 2
      for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) gacc[i][j] = _mm512_setzero_ps();
      const int64_t b1 = min64((g + 1) * blocks_per_group, K / kBlock);  // a short last group
      for (int64_t b = g * blocks_per_group; b < b1; ++b) {
        __m512i v[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const uint8_t* p = w + j * Kh + b * 64;
          pf.next();
          v[j] = _mm512_loadu_si512(p);
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          __m512bh xv[MB];
#pragma GCC unroll 2
          for (int i = 0; i < MB; ++i) xv[i] = (__m512bh)_mm512_loadu_si512(xb + i * K2 + b * 64 + t * 16);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) {
            const __m512bh wb = (__m512bh)_mm512_permutexvar_epi16(v[j], table);
            if (t < 3) v[j] = _mm512_srli_epi32(v[j], 4);
#pragma GCC unroll 2
            for (int i = 0; i < MB; ++i) gacc[i][j] = _mm512_dpbf16_ps(gacc[i][j], wb, xv[i]);
          }
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m512 sc = _mm512_set1_ps(a.scales[(n + j) * a.groups + g]);
#pragma GCC unroll 2
        for (int i = 0; i < MB; ++i) acc[i][j] = _mm512_fmadd_ps(gacc[i][j], sc, acc[i][j]);
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = _mm512_reduce_add_ps(acc[i][j]);
  }
};

}  // namespace

namespace fdx86 {

void wint4_lut_bf16_prepare_avx512(const float* x, int64_t M, int64_t K, uint32_t* xb) {
  constexpr int64_t kBlock = kWint4LutBlock;
  alignas(64) uint16_t h[kBlock];
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K; b += kBlock) {
      for (int q = 0; q < kBlock / 16; ++q)  // RNE, as vdpbf16ps's other operand in wint4_bf16_prepare_avx512
        _mm256_store_si256(reinterpret_cast<__m256i*>(h + 16 * q),
                           (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + m * K + b + 16 * q)));
      uint32_t* o = xb + (m * K + b) / 2;
      for (int t = 0; t < 4; ++t)
        for (int l = 0; l < 16; ++l) o[16 * t + l] = h[8 * l + t] | static_cast<uint32_t>(h[8 * l + t + 4]) << 16;
    }
  }
}

void wint4_lut_bf16_avx512(const LinearArgs& a) { drive<Wint4LutBf16>(a); }

void wint4_bf16_prepare_avx512(const float* x, int64_t M, int64_t K, uint32_t* xb, int threads) {
  // within each 8 inputs: words x0 x4 x1 x5 x2 x6 x3 x7 (dword t = x[t] | x[t + 4] << 16)
  const __m256i order = _mm256_setr_epi16(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const int64_t K2 = K / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * K;
    uint32_t* o = xb + m * K2;
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mk = mask16(K - k);  // K % 8 == 0: 8 or 16 inputs
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r + k));  // RNE
      _mm256_mask_storeu_epi32(o + k / 2, (__mmask8)(mk == 0xFFFF ? 0xFF : 0x0F), _mm256_permutexvar_epi16(order, h));
    }
  }
}

void wint4_words_bf16_avx512(const LinearArgs& a) {
  if (a.M <= 3) drive_packed<Wint4WordsBf16<4, 3>>(a);  // decode: more chains per row
  else drive_packed<Wint4WordsBf16<2, 6>>(a);
}

}  // namespace fdx86
