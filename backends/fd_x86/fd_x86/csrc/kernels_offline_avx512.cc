// AVX-512 kernels for the offline-checkpoint expert formats (offline_kernels.h).
// Compiled for that ISA by the pragma below and only called after
// __builtin_cpu_supports says so (x86_offline_op.cc).
//
// w4a8_static: the contract int4 rows (a channel's K/2 bytes) against int8
// activations, two vpdpbusd per 64 bytes (even inputs from the low nibbles,
// odd ones from the high), exact int32 per channel, scaled once at the end.
// wint2: fd-core's [K/4, N] rows (16 channels per 16 bytes) decoded in
// registers: per byte vector one code computation (three rounded fp32 steps
// and a floor), per input a vpternlogd and a subtraction give the window
// value q (times 2^s, the activations scaled by 2^-s); x * q FMA into
// per-group sums of MB rows x 64 channels, each group's sums then times its
// scale (nibble * super_scale) onto the total. Calls of more than
// kWint2RegRows rows decode each 64-input group of a 64-channel block once
// into a small panel (16 KiB, L1) that every row tile reuses (the same sums
// in the same order: equal results).
#include <immintrin.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")

#include "offline_kernels.h"
#include "tiling.h"

namespace {
// as kernels_w4a8_avx512.cc (the same stream): one tile ahead left a decode step of the W4A8C8 mid-size MoE
// 1.045x slower than 8 KiB ahead (Zen 4, 2 threads). The prefetches walk a tile's NB rows in address order
// (kernels_w4a8_avx512.cc's note), not each row at its own position: that decode step 1.30x faster at B=1
// and 1.27x at B=8 (benchmarks/offline_moe_decode.py's model, the two taking turns in one process).
constexpr int64_t kPrefetchAhead = 8192;

using fdx86::LinearArgs;

inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

// ---- w4a8_static ---------------------------------------------------------

struct W4a8s {
  static constexpr int kMaxRows = 4;

  template <int MB, int NB>
  static inline void tile(const LinearArgs& a, int64_t m, int64_t n) {
    const int64_t Kh = a.K / 2, ldq = 2 * a.ldh;
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * Kh;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x88)), low4 = _mm512_set1_epi8(0x0F);
    RunPrefetch pf(w, kPrefetchAhead);  // the tile's rows in address order (tiling.h)
    __m512i acc[MB][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_si512();
    for (int64_t c = 0; c < Kh; c += 64) {
      const __mmask64 mk = Kh - c >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (Kh - c)) - 1);
      __m512i lo[NB], hi[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        // code + 8 as unsigned nibbles; a masked-off byte reads 0x88 (8, 8) against zero activations
        // the weights stream from memory: kPrefetchAhead bytes ahead in the tile's run, in address order
        pf.next();
        const __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, w + j * Kh + c), flip);
        lo[j] = _mm512_and_si512(v, low4);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) {
        const int8_t* xr = a.xq + (m + i) * ldq + c;
        const __m512i xl = _mm512_loadu_si512(xr), xh = _mm512_loadu_si512(xr + a.ldh);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo[j], xl);
          acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi[j], xh);
        }
      }
    }
    const float per_code = a.scales[1] / 127.0f;  // the activation max, the same in every row
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const int32_t dot = _mm512_reduce_add_epi32(acc[i][j]) - 8 * a.xsum[m + i];
        a.out[(m + i) * a.N + n + j] = static_cast<float>(dot) * a.scales[2 * (n + j)] * per_code;
      }
  }
};

// ---- wint2 ---------------------------------------------------------------

// 16-channel blocks per work item: 64 channels, a cache line of each row
constexpr int kNB = 4;
// more rows: the panel (measured, K = 1024, N = 1536, one thread: the
// register tile 1.0-1.2x faster up to 4 rows, the panel 1.15x from 5)
constexpr int64_t kWint2RegRows = 4;
constexpr int64_t kWint2Ahead = 16;   // rows of codes prefetched ahead (one 64-input group)

// The 16 codes of one byte vector: floor(byte * code_scale + code_zp + 0.5),
// each step rounded to fp32 as the reference's separate paddle / numpy ops
// (the _round_ forms are never contracted into an FMA).
inline __m512i wint2_codes(const uint8_t* p, __mmask16 mk, __m512 cs, __m512 zp) {
  constexpr int kRn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, p)));
  const __m512 v = _mm512_add_round_ps(_mm512_add_round_ps(_mm512_mul_round_ps(f, cs, kRn), zp, kRn),
                                       _mm512_set1_ps(0.5f), kRn);
  return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

// input 4r + t of the byte, q = ((code >> s) & 63) - 32 with s = 9 - 3t,
// as q * 2^s in a float without a shift or a conversion: the window's bits,
// in place, or'ed into 2^23's mantissa (one vpternlogd), minus 2^23 + 32 *
// 2^s (exact). The activations come scaled by 2^-s (a.xe), so each product
// is x * q exactly as unscaled. The group scale is applied per group.
template <int T>
inline __m512 wint2_weight(__m512i code) {
  constexpr int kShift = 9 - 3 * T;
  const __m512i bits = _mm512_ternarylogic_epi32(code, _mm512_set1_epi32(0x3F << kShift),
                                                 _mm512_set1_epi32(0x4B000000), 0xEA);  // (a & b) | c
  return _mm512_sub_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(8388608.0f + 32.0f * (1 << kShift)));
}

struct Wint2Block {  // a work item's per-channel constants
  __mmask16 mk[kNB];
  __m512 cs[kNB], zp[kNB], sup[kNB];

  Wint2Block(const LinearArgs& a, int64_t n0) {
    const int64_t G = a.K / 64;
    for (int j = 0; j < kNB; ++j) {
      const int64_t n = n0 + 16 * j;
      mk[j] = mask16(a.N - n);
      sup[j] = _mm512_maskz_loadu_ps(mk[j], a.scales + G * a.N + n);
      cs[j] = _mm512_maskz_loadu_ps(mk[j], a.scales + (G + 1) * a.N + n);
      zp[j] = _mm512_maskz_loadu_ps(mk[j], a.scales + (G + 2) * a.N + n);
    }
  }

  __m512 group_scale(const LinearArgs& a, int64_t g, int64_t n0, int j) const {
    return _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[j], a.scales + g * a.N + n0 + 16 * j), sup[j]);
  }
};

// MB rows (m ..) x 64 channels (n0 ..), weights decoded in registers.
template <int MB>
void wint2_rows(const LinearArgs& a, const Wint2Block& blk, int64_t m, int64_t n0) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int64_t G = a.K / 64;
  __m512 acc[MB][kNB], part[MB][kNB];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < kNB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < kNB; ++j) part[i][j] = _mm512_setzero_ps();
    for (int64_t r = 16 * g; r < 16 * g + 16; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + kWint2Ahead) * a.N + n0), _MM_HINT_T0);
      const float* xr = a.xe + m * a.K + 4 * r;
#pragma GCC unroll 4
      for (int j = 0; j < kNB; ++j) {
        if (!blk.mk[j]) continue;
        const __m512i code = wint2_codes(w + r * a.N + n0 + 16 * j, blk.mk[j], blk.cs[j], blk.zp[j]);
        const __m512 w0 = wint2_weight<0>(code), w1 = wint2_weight<1>(code);
        const __m512 w2 = wint2_weight<2>(code), w3 = wint2_weight<3>(code);
#pragma GCC unroll 4
        for (int i = 0; i < MB; ++i) {
          const float* xi = xr + i * a.K;
          part[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(xi[0]), w0, part[i][j]);
          part[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(xi[1]), w1, part[i][j]);
          part[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(xi[2]), w2, part[i][j]);
          part[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(xi[3]), w3, part[i][j]);
        }
      }
    }
    for (int j = 0; j < kNB; ++j) {
      const __m512 gs = blk.group_scale(a, g, n0, j);
#pragma GCC unroll 4
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm512_fmadd_ps(part[i][j], gs, acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < kNB; ++j)
      if (blk.mk[j]) _mm512_mask_storeu_ps(a.out + (m + i) * a.N + n0 + 16 * j, blk.mk[j], acc[i][j]);
}

// MB rows against a decoded group panel [64 inputs][64 channels]; partial sums carried in out.
template <int MB>
inline void wint2_panel_rows(const LinearArgs& a, const Wint2Block& blk, const float* panel, const __m512* gs,
                             int64_t g, int64_t m, int64_t n0) {
  __m512 acc[MB][kNB];
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < kNB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int k = 0; k < 64; ++k) {
    __m512 wk[kNB];
#pragma GCC unroll 4
    for (int j = 0; j < kNB; ++j) wk[j] = _mm512_load_ps(panel + k * 16 * kNB + 16 * j);
#pragma GCC unroll 4
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = _mm512_set1_ps(a.xe[(m + i) * a.K + 64 * g + k]);
#pragma GCC unroll 4
      for (int j = 0; j < kNB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wk[j], acc[i][j]);
    }
  }
  // the group's sums times its scale, onto the earlier groups' (as the register path)
#pragma GCC unroll 4
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < kNB; ++j) {
      if (!blk.mk[j]) continue;
      float* o = a.out + (m + i) * a.N + n0 + 16 * j;
      const __m512 prev = g == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(blk.mk[j], o);
      _mm512_mask_storeu_ps(o, blk.mk[j], _mm512_fmadd_ps(acc[i][j], gs[j], prev));
    }
}

void wint2_panel(const LinearArgs& a, const Wint2Block& blk, int64_t n0) {
  alignas(64) float panel[64 * 16 * kNB];
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  for (int64_t g = 0; g < a.K / 64; ++g) {
    __m512 gs[kNB];
    for (int j = 0; j < kNB; ++j) {
      gs[j] = blk.group_scale(a, g, n0, j);
      for (int64_t r = 0; r < 16; ++r) {
        const __m512i code = wint2_codes(w + (16 * g + r) * a.N + n0 + 16 * j, blk.mk[j], blk.cs[j], blk.zp[j]);
        float* p = panel + 4 * r * 16 * kNB + 16 * j;
        _mm512_store_ps(p, wint2_weight<0>(code));
        _mm512_store_ps(p + 16 * kNB, wint2_weight<1>(code));
        _mm512_store_ps(p + 32 * kNB, wint2_weight<2>(code));
        _mm512_store_ps(p + 48 * kNB, wint2_weight<3>(code));
      }
    }
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) wint2_panel_rows<4>(a, blk, panel, gs, g, m, n0);
    switch (a.M - m) {
      case 1: wint2_panel_rows<1>(a, blk, panel, gs, g, m, n0); break;
      case 2: wint2_panel_rows<2>(a, blk, panel, gs, g, m, n0); break;
      case 3: wint2_panel_rows<3>(a, blk, panel, gs, g, m, n0); break;
      default: break;
    }
  }
}

}  // namespace

namespace fdx86 {

void w4a8s_quantize_avx512(const float* x, int64_t M, int64_t K, float amax, int8_t* xq, int64_t ldh,
                           int32_t* xsum) {
  const float inv = 127.0f / amax;
  const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * K;
    int8_t* ev = xq + m * 2 * ldh;
    int8_t* od = ev + ldh;
    for (int64_t i = 0; i < 2 * ldh; ++i) ev[i] = 0;
    __m512i sum = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      __m512i q[2];
      for (int h = 0; h < 2; ++h) {
        const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(r + k + 16 * h), vinv),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q[h] = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
        sum = _mm512_add_epi32(sum, q[h]);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(ev + k / 2), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], even, q[1])));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(od + k / 2), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], odd, q[1])));
    }
    int32_t s = _mm512_reduce_add_epi32(sum);
    for (; k < K; ++k) {
      float v = __builtin_rintf(r[k] * inv);
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
      const int32_t c = static_cast<int32_t>(v);
      s += c;
      (k % 2 ? od : ev)[k / 2] = static_cast<int8_t>(c);
    }
    xsum[m] = s;
  }
}

void w4a8s_avx512_vnni(const LinearArgs& a) { drive<W4a8s>(a); }

void wint2_scale_rows(const float* x, int64_t M, int64_t K, float* xs) {
  const __m512 scale = _mm512_setr_ps(0x1p-9f, 0x1p-6f, 0x1p-3f, 1.0f, 0x1p-9f, 0x1p-6f, 0x1p-3f, 1.0f, 0x1p-9f,
                                      0x1p-6f, 0x1p-3f, 1.0f, 0x1p-9f, 0x1p-6f, 0x1p-3f, 1.0f);
  for (int64_t i = 0; i < M * K; i += 16)  // K % 128 == 0: whole vectors, k % 4 == lane % 4
    _mm512_storeu_ps(xs + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), scale));
}

void wint2_avx512(const LinearArgs& a) {
  const int64_t items = (a.N + 16 * kNB - 1) / (16 * kNB);
  const bool parallel = a.threads > 1 && items > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t n0 = it * 16 * kNB;
    const Wint2Block blk(a, n0);
    if (a.M > kWint2RegRows) {
      wint2_panel(a, blk, n0);
      continue;
    }
    switch (a.M) {
      case 1: wint2_rows<1>(a, blk, 0, n0); break;
      case 2: wint2_rows<2>(a, blk, 0, n0); break;
      case 3: wint2_rows<3>(a, blk, 0, n0); break;
      case 4: wint2_rows<4>(a, blk, 0, n0); break;
      default: break;
    }
  }
}

}  // namespace fdx86
