// AVX-512 VNNI kernel for ``w4a8`` (int4 weights with group scales,
// per-token dynamic int8 activations: fd_core/quantization/w4a8.py) on the
// contract int4 layout read in place (offline_kernels.h). Compiled for that
// ISA by the pragma below and only called after __builtin_cpu_supports says
// so (x86_offline_op.cc).
//
// Dot-product orientation as w4a8_static's kernel: a channel's K/2 bytes
// against the token's int8 codes split by parity, the nibbles xor 0x88 (code
// + 8, unsigned) and two vpdpbusd per 64 bytes (even inputs against the low
// nibbles, odd against the high). Per group the int32 lanes are exact; the
// 8 * (the group's code sum) correction starts lane 0, the lanes go to fp32
// and FMA with the group scale into fp32 lane accumulators, reduced once at
// the end and times the token's scale. Every (token, channel) value is
// computed alone, in one fixed order, whatever the tile, the channel slice or
// the number of rows: a token's result does not depend on the other tokens.
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")

#include "offline_kernels.h"
#include "tiling.h"

namespace {

using fdx86::LinearArgs;

// Software prefetch this many bytes ahead in the tile's weight stream (a
// tile's channels are adjacent rows: one stream). At one row the kernel
// needs the lines well before the hardware prefetcher brings them: one
// tile ahead (2 KiB at K = 1024) left a mid-size MoE decode step 1.12x
// slower at B = 1 and 1.10x at B = 8 than 8 KiB ahead (Zen 4, 2 threads).
// The prefetches walk that stream in address order, a line per load (the
// tile's NB rows one after the other), not each row's own position: the same
// lines, but the 21B-wide experts' B=1 decode step of a 4-layer model ran
// 1.43x faster and the mid-size MoE's 1.25x (same process, Zen 4, 2
// threads; B=8 unchanged). A microbenchmark of the 21B's expert shapes read
// 32 GB/s against 20 GB/s.
constexpr int64_t kPrefetchAhead = 8192;
constexpr int64_t kW4a8Block = 8;  // channels per block: their weights (8 * K/2 bytes) stay in L1 across row tiles

// MB rows (m ..) x NB channels (n ..). a.xq: the parity planes, a.xsum: the
// group code sums [M, G], a.xscale: the tokens' scales.
template <int MB, int NB>
inline void w4a8_tile(const LinearArgs& a, int64_t m, int64_t n) {
  const int64_t Kh = a.K / 2, ldq = 2 * a.ldh, G = a.groups, gh = a.group_size / 2;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * Kh;
  const float* sc = a.scales + n * G;
  const __m512i eight = _mm512_set1_epi8(0x08), low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MB][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  RunPrefetch pf(w, kPrefetchAhead);  // the tile's rows in address order (tiling.h)
  for (int64_t g = 0; g < G; ++g) {
    __m512i dot[MB][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      const __m512i init = _mm512_maskz_set1_epi32(1, -8 * a.xsum[(m + i) * G + g]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) dot[i][j] = init;
    }
    for (int64_t c = g * gh; c < (g + 1) * gh; c += 64) {
      __m512i lo[NB], hi[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        pf.next();
        // code + 8 = (nibble & 15) ^ 8: one vpternlogd per nibble plane ((a & b) ^ c)
        const __m512i v = _mm512_loadu_si512(w + j * Kh + c);
        lo[j] = _mm512_ternarylogic_epi32(v, low4, eight, 0x6A);
        hi[j] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), low4, eight, 0x6A);
      }
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const int8_t* xr = a.xq + (m + i) * ldq + c;
        const __m512i xl = _mm512_loadu_si512(xr), xh = _mm512_loadu_si512(xr + a.ldh);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          dot[i][j] = _mm512_dpbusd_epi32(dot[i][j], lo[j], xl);
          dot[i][j] = _mm512_dpbusd_epi32(dot[i][j], hi[j], xh);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m512 s = _mm512_set1_ps(sc[j * G + g]);
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][j]), s, acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = _mm512_reduce_add_ps(acc[i][j]) * a.xscale[m + i];
}

// MB rows x channels [n0, n1): 4-channel tiles at 1-2 rows, 2-channel ones at 3-4 (registers)
template <int MB>
inline void w4a8_rows(const LinearArgs& a, int64_t m, int64_t n0, int64_t n1) {
  constexpr int NB = MB <= 2 ? 4 : 2;
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) w4a8_tile<MB, NB>(a, m, n);
  for (; n < n1; ++n) w4a8_tile<MB, 1>(a, m, n);
}

}  // namespace

namespace fdx86 {

void w4a8_split_avx512(const int8_t* xq, int64_t M, int64_t K, int64_t ldq, int64_t group_size, int8_t* planes,
                       int64_t ldh, int32_t* gsum) {
  const int64_t G = K / group_size;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* r = xq + m * ldq;
    int8_t* ev = planes + m * 2 * ldh;
    int8_t* od = ev + ldh;
    for (int64_t g = 0; g < G; ++g) {
      __m512i s = _mm512_setzero_si512();
      for (int64_t k = g * group_size; k < (g + 1) * group_size; k += 64) {
        const __m512i v = _mm512_loadu_si512(r + k);
        s = _mm512_dpbusd_epi32(s, ones, v);
        // int16 lanes: the even byte sign-extended from the low half, the odd one from the high
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(ev + k / 2),
                            _mm512_cvtepi16_epi8(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(od + k / 2), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
      }
      gsum[m * G + g] = _mm512_reduce_add_epi32(s);
    }
  }
}

void w4a8_avx512_vnni(const LinearArgs& a) {
  const int64_t chunks = (a.N + kOutChunk - 1) / kOutChunk;
  const bool parallel = a.threads > 1 && chunks > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n0 = c * kOutChunk, n1 = min64(n0 + kOutChunk, a.N);
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk) {
      const int64_t m1 = min64(m0 + kRowChunk, a.M);
      for (int64_t b = n0; b < n1; b += kW4a8Block) {
        const int64_t b1 = min64(b + kW4a8Block, n1);
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) w4a8_rows<4>(a, m, b, b1);
        switch (m1 - m) {
          case 1: w4a8_rows<1>(a, m, b, b1); break;
          case 2: w4a8_rows<2>(a, m, b, b1); break;
          case 3: w4a8_rows<3>(a, m, b, b1); break;
          default: break;
        }
      }
    }
  }
}

}  // namespace fdx86
