// dense16_common.h: what kernels_dense16.cc (stream kernel, one-row split,
// dispatch) and kernels_dense16_gemm.cc (the panel kernel and the bf16 GEMM)
// share: the weight types, the tile constants, masks, widening, and per-thread
// scratch. Include it after the TU's `#pragma GCC target` (AVX-512 F/BW/VL/DQ):
// its helpers use those intrinsics.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "kernels.h"

namespace fdx86 {
// kernels_dense16_gemm.cc; false (nothing written) when scratch cannot be allocated
bool dense16_gemm_panel(const Dense16Args& a);  // kDense16Panel, any wtype
bool dense16_gemm_bf16(const Dense16Args& a);   // kDense16Gemm on avx512_bf16, bf16 W
}  // namespace fdx86

namespace {

using fdx86::Dense16Args;

constexpr int kBf16 = 0, kFp16 = 1, kFp32 = 2;  // Dense16Args::wtype (kernels.h)

// a weight element of each type
template <int WT>
struct Elem {
  using T = uint16_t;
};
template <>
struct Elem<kFp32> {
  using T = float;
};
// Register tiles. Stream: 3 rows x 8 blocks of 16 outputs (256 B of W per
// row: 4 lines, so the row streams stay long); GEMMs: 6 rows x 4 blocks.
constexpr int kStreamBlocks = 8, kStreamRows = 3;
constexpr int kGemmBlocks = 4, kGemmRows = 6;
constexpr int64_t kGemmCols = 16 * kGemmBlocks;
// The GEMM packs kGemmSuper 64-output panels at once (1 KB runs of each row
// of W, 128 KB of panels: L2), then runs every row of x on each
constexpr int64_t kGemmSuper = 8;
constexpr int64_t kPackAhead = 8;    // rows of W the GEMM's pack prefetches ahead
constexpr int64_t kGemmKc = 128;     // inputs per packed panel: 64 pairs x 64 outputs x 4 B = 16 KB (L1)
constexpr int64_t kPanelWords = kGemmKc / 2 * 64;  // one packed panel, in bf16 pairs
// Below this many multiply-adds a call runs on one thread (waking the team costs more)
constexpr int64_t kMinParallelMacs = int64_t(1) << 20;
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u); }

// The maskz forms with every lane on: GCC 12 warns (-Wmaybe-uninitialized)
// about the unmasked intrinsics' undefined pass-through operand.
constexpr __mmask16 kAll = 0xFFFF;
inline __m512i zext16(__m256i h) { return _mm512_maskz_cvtepu16_epi32(kAll, h); }  // u16 -> u32 lanes
inline __m512i high16(__m512i v) { return _mm512_maskz_slli_epi32(kAll, v, 16); }   // lane << 16

// 16 weights from p (masked: the lanes past the mask are 0) as fp32
template <int WT>
inline __m512 widen16(const typename Elem<WT>::T* p, __mmask16 mk) {
  if constexpr (WT == kFp32) {
    return _mm512_maskz_loadu_ps(mk, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    if constexpr (WT == kBf16) return _mm512_castsi512_ps(high16(zext16(h)));
    else return _mm512_maskz_cvtph_ps(kAll, h);
  }
}

// Scratch kept by the calling host thread, grown as needed and freed when the
// thread ends; null when it cannot be allocated
struct Scratch {
  void* p = nullptr;
  int64_t bytes = 0;
  ~Scratch() { std::free(p); }
  void* get(int64_t want) {
    want = (want + 63) / 64 * 64;
    if (want > bytes) {
      std::free(p);
      bytes = 0;
      p = std::aligned_alloc(64, want);
      if (p != nullptr) bytes = want;
    }
    return p;
  }
};

}  // namespace
