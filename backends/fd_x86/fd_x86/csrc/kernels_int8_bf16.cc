// AVX-512 BF16 kernels: wint8 against bf16 activations (vdpbf16ps), on the
// packed pairs layout (linears) and on the contract layout (MoE experts).
// Compiled for that ISA by the pragma below and only called after the CPU was
// seen to have avx512_bf16 (dense16_has_bf16_dot). Compiled twice: here, and
// again by kernels_int8_bf16_vbmi.cc with FDX86_INT8_BF16_LUT set, for CPUs
// that also have AVX-512 VBMI (the table conversion below); the entry points
// here pick that build at run time.
//
// For a model whose activations are bf16 (`--dtype bfloat16`, FastDeploy's
// numerics): an int8 code (|q| <= 127) is exact in bf16, so vdpbf16ps
// multiplies the reference's operands exactly and sums them in fp32, 32
// products per instruction against the fp32 kernels' 16 per FMA. A code
// becomes bf16 by vpmovsxbd + vcvtdq2ps (exact) and vcvtne2ps2bf16 (exact:
// an integer of at most 8 significant bits), 5 instructions per 32 codes.
//
// Every (row, channel) sums its products in one order, whatever the call's
// row count or the tile it lands in: one accumulator chain per output, the
// inputs in order (pairs, or 16 lanes of pairs summed at the end for the
// contract layout). So a token's result does not depend on the size of the
// step it ran in, and the panel path for many rows (the codes converted to
// bf16 once per work item into a buffer, then read by every row tile) gives
// the same bits as converting in the tile.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#ifndef FDX86_INT8_BF16_LUT
#define FDX86_INT8_BF16_LUT 0
#endif

#if FDX86_INT8_BF16_LUT
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx2,fma")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
#endif

#include "packed_drive.h"
#include "tiling.h"

namespace {

using fdx86::LinearArgs;

// From this many rows in a pass a work item converts its codes to bf16 once
// (a panel) instead of in every row tile: the same bf16 values, so the same bits.
// 64 since session 21 (16 before): the panel's conversion runs apart from the
// products, its memory reads not hidden behind them, and below 64 rows that
// cost more than converting in each 12-row tile. Same process, 0.3B wint8 +
// int8 head decode (Zen 4, 2 threads): B=16 1.10x, B=32 1.11x; mid-size MoE
// wint8 B=32 1.04x. One [1024 x 103424] linear alone (back-to-back processes):
// 16 rows 1.39x, 32 rows 1.24x, 64-512 rows within 3%.
constexpr int64_t kPanelRows = 64;
constexpr int64_t kContractPanelRows = 32;  // the contract tiles' (their 6 x 4 tiles convert less per product)
// Software prefetch distance in each pairs stream: at 1 row over 189 MB of weights, 4 KiB read at
// 0.98-1.09x of the fp32 packed kernel's rate, 1 KiB (packed_drive.h's) at 0.94x (Zen 4, 2 threads).
constexpr int64_t kPairsPrefetch = 4096;  // into L2 (T1): see tiling.h's RunPrefetch

// A thread's panel buffer, grown as needed and kept for the thread's life.
struct PanelBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  ~PanelBuffer() { std::free(p); }
  // null when the memory cannot be had: the kernels then convert in the tiles (the same bits)
  uint16_t* get(size_t need) {
    if (need > bytes) {
      std::free(p);
      const size_t want = (need + 4095) / 4096 * 4096;
      p = std::aligned_alloc(64, want);
      bytes = p != nullptr ? want : 0;
    }
    return static_cast<uint16_t*>(p);
  }
};

thread_local PanelBuffer tl_panel;

// 32 int8 codes -> bf16, lane l = (bf16(q[2l]), bf16(q[2l + 1])) for l < 16:
// lo (16 codes) fills the low 16 words, hi the high 16.
inline __m512bh codes_bf16(const int8_t* q) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  const __m512 hi =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// The table conversion (FDX86_INT8_BF16_LUT, AVX-512 VBMI): 64 codes at once
// by byte lookups instead of widening each to fp32. A code's bf16 is a high
// byte (sign, exponent) and a low byte (exponent's last bit, 7 mantissa
// bits); both come from 128-entry tables indexed by |q| (vpermi2b), the sign
// is or-ed into the high byte, -128 (whose |q| reads as index 0) is patched,
// and two more vpermi2b interleave the bytes into the words codes_bf16 gives:
// 8 instructions per 64 codes against 10. The same bf16 values, so the same
// bits (tested for every code). One row over the 0.3B's 361 MB of wint8 weights, a standalone loop
// (Zen 4): 1.41x on one thread (18.9 -> 26.6 GB/s), 1.39x on two when the
// memory keeps up (36.5 -> 50.7 GB/s), 1.08x on a slow-memory run (32.9 ->
// 35.4); cache-resident, one thread, 1.29x.
struct CodeTables {
  alignas(64) uint8_t hi[128];   // bf16(m) >> 8 for m = |q| < 128
  alignas(64) uint8_t lo[128];   // bf16(m) & 0xff
  alignas(64) uint8_t mix[128];  // vpermi2b indices: word i of the first (second) 32 codes = (lo, hi) byte i (32 + i)
};

constexpr uint16_t small_int_bf16(int m) {  // exact for 0 <= m < 256
  if (m == 0) return 0;
  int e = 0;
  while ((m >> (e + 1)) != 0) ++e;
  return static_cast<uint16_t>(((127 + e) << 7) | ((m << (7 - e)) & 0x7f));
}

constexpr CodeTables make_code_tables() {
  CodeTables t{};
  for (int m = 0; m < 128; ++m) {
    t.hi[m] = static_cast<uint8_t>(small_int_bf16(m) >> 8);
    t.lo[m] = static_cast<uint8_t>(small_int_bf16(m) & 0xff);
  }
  for (int i = 0; i < 32; ++i) {
    t.mix[2 * i] = static_cast<uint8_t>(i);
    t.mix[2 * i + 1] = static_cast<uint8_t>(64 + i);
    t.mix[64 + 2 * i] = static_cast<uint8_t>(32 + i);
    t.mix[64 + 2 * i + 1] = static_cast<uint8_t>(96 + i);
  }
  return t;
}

#if FDX86_INT8_BF16_LUT
alignas(64) constexpr CodeTables kCodeTables = make_code_tables();

// the tables in registers, loaded once per tile
struct CodeLut {
  __m512i hi0, hi1, lo0, lo1, mix0, mix1;
  CodeLut()
      : hi0(_mm512_load_si512(kCodeTables.hi)), hi1(_mm512_load_si512(kCodeTables.hi + 64)),
        lo0(_mm512_load_si512(kCodeTables.lo)), lo1(_mm512_load_si512(kCodeTables.lo + 64)),
        mix0(_mm512_load_si512(kCodeTables.mix)), mix1(_mm512_load_si512(kCodeTables.mix + 64)) {}
};

// 64 codes -> codes_bf16(q), codes_bf16(q + 32)
inline void codes_bf16_x2(const CodeLut& t, const int8_t* q, __m512bh& first, __m512bh& second) {
  const __m512i v = _mm512_loadu_si512(q);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i m = _mm512_abs_epi8(v);  // -128 stays 0x80: index 0, patched below
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, m, t.hi1);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, m, t.lo1);
  hi = _mm512_ternarylogic_epi32(hi, v, sign, 0xF8);  // hi | (v & 0x80)
  hi = _mm512_mask_mov_epi8(hi, _mm512_cmpeq_epi8_mask(v, sign), _mm512_set1_epi8(static_cast<char>(0xC3)));
  first = (__m512bh)_mm512_permutex2var_epi8(lo, t.mix0, hi);
  second = (__m512bh)_mm512_permutex2var_epi8(lo, t.mix1, hi);
}
#else
struct CodeLut {};

inline void codes_bf16_x2(const CodeLut&, const int8_t* q, __m512bh& first, __m512bh& second) {
  first = codes_bf16(q);
  second = codes_bf16(q + 32);
}
#endif

// The table conversion in tiles of up to 4 rows only. Its vpermi2b share
// pipes with vdpbf16ps, which a tile issues once per row and block: from a
// few rows that costs more than the conversion saves. Same process, 0.3B
// wint8 + int8 head decode (Zen 4, 2 threads), tables against widening: B=1
// 1.36x, B=2 1.17x, B=4 1.02x, B=8 0.83x with the tables in every tile
// (0.99x with this limit); mid-size MoE wint8 B=1 1.12-1.17x, wint4
// (FastDeploy's rule: int8 attention, dense layer and shared expert) B=1
// 1.11x, wint8 B=8 1.02x; prefill of 512 tokens (the panels) 1.01-1.02x.
constexpr int kTableRows = 4;
template <int MB, int NB>
constexpr bool kTableTile = FDX86_INT8_BF16_LUT && MB <= kTableRows;

// ------------------------------------------------------------- pairs layout
// fd_x86.linear.pack_weight("wint8_pairs"): int8 [N32][K/2][64], per input
// pair p of a 32-channel stream (two 16-channel blocks) 64 bytes: block b's
// channel c at 32 b + 2 c (input 2p) and 32 b + 2 c + 1 (input 2p + 1). 32 of
// them are one register of 16 channels' bf16 pairs (codes_bf16), multiplied
// with the row's activation pair (x[2p], x[2p + 1]) broadcast: no horizontal
// sums. A work item is two streams (4 blocks): at a few rows a tile takes all
// four, so 4-16 accumulator chains hide vdpbf16ps's latency (each output keeps
// its one chain: more outputs at once, not more chains per output).
struct Wint8PairsBf16 {
  static constexpr int kMaxRows = 12;  // 24 accumulators at two blocks
  static constexpr int kWideRows = 4;  // up to this many rows a tile takes four blocks
  static constexpr int kBlocks = 4;    // a work item: two streams

  static inline const int8_t* block_codes(const LinearArgs& a, int64_t nb) {
    return static_cast<const int8_t*>(a.w) + (nb / 2) * (a.K / 2) * 64 + (nb % 2) * 32;
  }

  // Rows m .. m + MB of blocks nb0 .. nb0 + NB (nb0 even); `panel` (or null,
  // NB <= 2): those blocks' codes in bf16, [K/2][2][32] words.
  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t nb0, const uint16_t* panel) {
    const int64_t K2 = a.K / 2;
    const int8_t* w[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) w[j] = block_codes(a, nb0 + j);
    const uint32_t* xb = a.xb + m * K2;
    __m512 acc[MB][NB];
#pragma GCC unroll 12
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    [[maybe_unused]] const CodeLut lut;
    for (int64_t p = 0; p < K2; ++p) {
      __m512bh wb[NB + 1];  // +1: a stream's second block converted beside an odd NB's last
      if (panel != nullptr) {
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) wb[j] = (__m512bh)_mm512_load_si512(panel + (p * 2 + j) * 32);
      } else {
#pragma GCC unroll 4
        for (int j = 0; j < NB; j += 2)  // one line per stream
          _mm_prefetch(reinterpret_cast<const char*>(w[j] + p * 64 + kPairsPrefetch), _MM_HINT_T1);
        if constexpr (kTableTile<MB, NB>) {
          // a stream's 64 bytes at once (an odd NB's last stream: its pair's padding or next block, unused)
#pragma GCC unroll 2
          for (int j = 0; j < NB; j += 2) codes_bf16_x2(lut, w[j] + p * 64, wb[j], wb[j + 1]);
        } else {
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) wb[j] = codes_bf16(w[j] + p * 64);
        }
      }
#pragma GCC unroll 12
      for (int i = 0; i < MB; ++i) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xb[i * K2 + p]));
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wb[j], xv);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m512 sc = _mm512_maskz_loadu_ps(mask16(a.N - (nb0 + j) * 16), a.scales + (nb0 + j) * 16);
#pragma GCC unroll 12
      for (int i = 0; i < MB; ++i) store16(a, m + i, nb0 + j, _mm512_mul_ps(acc[i][j], sc));
    }
  }

  // blocks nb0 .. nb0 + nb (nb0 even, nb <= 2) in bf16 into `panel`; prefetched as far ahead as the
  // tiles' streams (1 KB before session 21: a 512-token prefill 1.01-1.02x in one process; one
  // [1024 x 103424] linear at 64 rows 1.12x in back-to-back processes)
  static void fill_panel(const LinearArgs& a, int64_t nb0, int64_t nb, uint16_t* panel) {
    const int64_t K2 = a.K / 2;
    const int8_t* w = block_codes(a, nb0);
    const CodeLut lut;
    for (int64_t p = 0; p < K2; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(w + p * 64 + kPairsPrefetch), _MM_HINT_T1);
      __m512bh wb[2];
      codes_bf16_x2(lut, w + p * 64, wb[0], wb[1]);  // the stream's 64 bytes (nb == 1: the second unused)
      for (int64_t j = 0; j < nb; ++j) _mm512_store_si512(panel + (p * 2 + j) * 32, (__m512i)wb[j]);
    }
  }
};

template <int NB, int R>
inline void pairs_tail(const LinearArgs& a, int64_t m, int64_t rest, int64_t nb0, const uint16_t* panel) {
  if constexpr (R > 0) {
    if (rest == R) Wint8PairsBf16::tile<R, NB>(a, m, nb0, panel);
    else pairs_tail<NB, R - 1>(a, m, rest, nb0, panel);
  }
}

template <int NB>
inline void pairs_rows(const LinearArgs& a, int64_t m0, int64_t m1, int64_t nb0, const uint16_t* panel) {
  constexpr int R = Wint8PairsBf16::kMaxRows;
  int64_t m = m0;
  for (; m + R <= m1; m += R) Wint8PairsBf16::tile<R, NB>(a, m, nb0, panel);
  if (m < m1) pairs_tail<NB, R - 1>(a, m, m1 - m, nb0, panel);
}

// rows [m0, m1) of the nb (<= 2) blocks from nb0
inline void pairs_half(const LinearArgs& a, int64_t m0, int64_t m1, int64_t nb0, int64_t nb, const uint16_t* panel) {
  if (nb == 2) pairs_rows<2>(a, m0, m1, nb0, panel);
  else pairs_rows<1>(a, m0, m1, nb0, panel);
}

// the rows [m0, m1) of a work item's nb (<= 4) blocks from nb0, converting in the tiles
inline void pairs_item(const LinearArgs& a, int64_t m0, int64_t m1, int64_t nb0, int64_t nb) {
  constexpr int W = Wint8PairsBf16::kWideRows;
  if (m1 - m0 <= W && nb > 2) {
    const int64_t rest = m1 - m0;
    if (nb == 4) pairs_tail<4, W>(a, m0, rest, nb0, nullptr);
    else pairs_tail<3, W>(a, m0, rest, nb0, nullptr);
    return;
  }
  for (int64_t h = 0; h < nb; h += 2) pairs_half(a, m0, m1, nb0 + h, min64(2, nb - h), nullptr);
}

// --------------------------------------------------------- contract layout
// The experts' int8 [N, K] read in place: a channel's 32 codes at a time as
// bf16 pairs in input order (codes_bf16) against the row's activation pairs
// (x[2l], x[2l + 1]) in 16 lanes, the lanes summed at the end (one tree per
// output, hsum4) and scaled.
// Tiles of up to 6 rows x 4 channels (10 loads per 24 vdpbf16ps; at a
// decode's few rows, four channels' chains hide its latency); `panel` (or null): the tile's channels
// converted to bf16 once per work item, [channel][K] words.
struct Wint8ContractBf16 {
  static constexpr int kMaxRows = 6;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n, const uint16_t* panel, int64_t n_panel) {
    const int64_t K = a.K, K2 = K / 2;
    const int8_t* w = static_cast<const int8_t*>(a.w) + n * K;
    const uint32_t* xb = a.xb + m * K2;
    // tiling.h (B=1 wint8 experts: mid-size MoE 1.35x, 21B widths 1.14x)
    RunPrefetch pf(w, kContractPrefetch);
    __m512 acc[MB][NB];
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    // the products of inputs k .. k + 31 (wb: the NB channels' codes there) into the chains
    const auto mac = [&](const __m512bh* wb, int64_t k) {
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + i * K2 + k / 2);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wb[j], xv);
      }
    };
    int64_t k = 0;
    if constexpr (kTableTile<MB, NB>) {
      // 64 codes of each channel at a time (the same chains in the same order), then a 32-code tail
      if (panel == nullptr) {
        const CodeLut lut;
        for (; k + 64 <= K; k += 64) {
          __m512bh first[NB], second[NB];
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) {
            pf.next();
            codes_bf16_x2(lut, w + j * K + k, first[j], second[j]);
          }
          mac(first, k);
          mac(second, k + 32);
        }
      }
    }
    for (; k < K; k += 32) {
      __m512bh wb[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        if (panel != nullptr) {
          wb[j] = (__m512bh)_mm512_load_si512(panel + (n - n_panel + j) * K + k);
        } else {
          if (k % 64 == 0) pf.next();
          wb[j] = codes_bf16(w + j * K + k);
        }
      }
      mac(wb, k);
    }
    // the lanes summed four outputs at a time (hsum4: each output's own tree, whatever its companions)
    constexpr int kOut = MB * NB, kGroups = (kOut + 3) / 4;
#pragma GCC unroll 8
    for (int g = 0; g < kGroups; ++g) {
      __m512 v[4];
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) v[q] = 4 * g + q < kOut ? acc[(4 * g + q) / NB][(4 * g + q) % NB] : _mm512_setzero_ps();
      alignas(16) float sums[4];
      _mm_store_ps(sums, hsum4(v[0], v[1], v[2], v[3]));
#pragma GCC unroll 4
      for (int q = 0; q < 4 && 4 * g + q < kOut; ++q) {
        const int i = (4 * g + q) / NB, j = (4 * g + q) % NB;
        a.out[(m + i) * a.N + n + j] = sums[q] * a.scales[n + j];
      }
    }
  }
};

template <int NB, int R>
inline void contract_rows_tail(const LinearArgs& a, int64_t m, int64_t rest, int64_t n, const uint16_t* panel,
                               int64_t n_panel) {
  if constexpr (R > 0) {
    if (rest == R) Wint8ContractBf16::tile<R, NB>(a, m, n, panel, n_panel);
    else contract_rows_tail<NB, R - 1>(a, m, rest, n, panel, n_panel);
  }
}

template <int NB>
inline void contract_rows(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n, const uint16_t* panel,
                          int64_t n_panel) {
  constexpr int R = Wint8ContractBf16::kMaxRows;
  int64_t m = m0;
  for (; m + R <= m1; m += R) Wint8ContractBf16::tile<R, NB>(a, m, n, panel, n_panel);
  if (m < m1) contract_rows_tail<NB, R - 1>(a, m, m1 - m, n, panel, n_panel);
}

void pairs_linear(const LinearArgs& a) {
  packed_items<Wint8PairsBf16::kBlocks>(a, [&a](int64_t nb0, int64_t nb) {
    // many rows: each stream's codes converted once into the panel, then every row chunk reads it
    uint16_t* panel =
        a.M < kPanelRows ? nullptr : tl_panel.get(static_cast<size_t>(a.K / 2) * 2 * 32 * sizeof(uint16_t));
    if (panel == nullptr) {
      pairs_item(a, 0, a.M, nb0, nb);
      return;
    }
    for (int64_t h = 0; h < nb; h += 2) {
      const int64_t hb = min64(2, nb - h);
      Wint8PairsBf16::fill_panel(a, nb0 + h, hb, panel);
      for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk) pairs_half(a, m0, min64(m0 + kRowChunk, a.M), nb0 + h, hb, panel);
    }
  });
}

void contract_linear(const LinearArgs& a) {
  const int64_t chunks = (a.N + kOutChunk - 1) / kOutChunk;
  const bool parallel = a.threads > 1 && chunks > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n0 = c * kOutChunk, n1 = min64(n0 + kOutChunk, a.N);
    uint16_t* panel = nullptr;
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk) {
      const int64_t m1 = min64(m0 + kRowChunk, a.M);
      if (m1 - m0 >= kContractPanelRows && panel == nullptr) {
        panel = tl_panel.get(static_cast<size_t>(n1 - n0) * a.K * sizeof(uint16_t));
        const int8_t* w = static_cast<const int8_t*>(a.w);
        const CodeLut lut;
        for (int64_t n = n0; n < n1; ++n) {
          int64_t k = 0;
          for (; k + 64 <= a.K; k += 64) {
            __m512bh first, second;
            codes_bf16_x2(lut, w + n * a.K + k, first, second);
            _mm512_store_si512(panel + (n - n0) * a.K + k, (__m512i)first);
            _mm512_store_si512(panel + (n - n0) * a.K + k + 32, (__m512i)second);
          }
          if (k < a.K) _mm512_store_si512(panel + (n - n0) * a.K + k, (__m512i)codes_bf16(w + n * a.K + k));
        }
      }
      const uint16_t* use = m1 - m0 >= kContractPanelRows ? panel : nullptr;
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) contract_rows<4>(a, m0, m1, n, use, n0);
      for (; n + 2 <= n1; n += 2) contract_rows<2>(a, m0, m1, n, use, n0);
      for (; n < n1; ++n) contract_rows<1>(a, m0, m1, n, use, n0);
    }
  }
}

}  // namespace

namespace fdx86 {

#if FDX86_INT8_BF16_LUT

void wint8_pairs_bf16_vbmi(const LinearArgs& a) { pairs_linear(a); }
void wint8_contract_bf16_vbmi(const LinearArgs& a) { contract_linear(a); }

#else

// AVX-512 VBMI here, and FD_X86_INT8_BF16_TABLES not "0" (an A/B switch, read once)
static bool int8_bf16_tables() {
  static const bool on = [] {
    const char* env = std::getenv("FD_X86_INT8_BF16_TABLES");
    return __builtin_cpu_supports("avx512vbmi") && !(env != nullptr && std::string(env) == "0");
  }();
  return on;
}

void wint8_bf16_prepare_avx512(const float* x, int64_t M, int64_t K, uint32_t* xb, int threads) {
  const int64_t K2 = K / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * K;
    uint16_t* o = reinterpret_cast<uint16_t*>(xb + m * K2);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mk = mask16(K - k);  // RNE, as vdpbf16ps's other operand
      _mm256_mask_storeu_epi16(o + k, mk, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r + k)));
    }
  }
}

void wint8_pairs_bf16_avx512(const LinearArgs& a) {
  if (int8_bf16_tables()) wint8_pairs_bf16_vbmi(a);
  else pairs_linear(a);
}

void wint8_contract_bf16_avx512(const LinearArgs& a) {
  if (int8_bf16_tables()) wint8_contract_bf16_vbmi(a);
  else contract_linear(a);
}

#endif

}  // namespace fdx86
