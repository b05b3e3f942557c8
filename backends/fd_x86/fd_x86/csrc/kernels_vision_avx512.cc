// AVX-512 vision-tower attention (vision_kernels.h): the 2D rotary and the
// bidirectional attention within each frame, in one call. Compiled for
// AVX-512 F/BW/VL/DQ by the pragma below and only called after
// __builtin_cpu_supports says so. No paddle / STL headers (kernels.h).
//
// 1. pack: q and k rotated (separate multiplies and a subtract / add, as the
//    reference's elementwise ops: the rotated values are the reference's), into
//    q [H][N][Dh], kt [H][Dh][N] (k transposed: a row of 16 keys is one load)
//    and v [H][N][Dh].
// 2. per work item (frame, head, block of kRowBlock query rows), in a thread's
//    scratch s [kRowBlock][L]:
//    scores  tiles of 4 query rows x 64 keys: 16 zmm accumulators over Dh, a
//            broadcast of q per row and 4 loads of kt per d; times scale;
//    softmax exact per row over the frame (max, exp, sum; L fits in L2);
//    values  tiles of 4 rows x up to 6 vectors of Dh: one load of v per key
//            and vector feeds the 4 rows; the row sum divides at the end.
// Work items are ordered frame, head, block and split into contiguous ranges
// per thread, so a thread keeps one head's kt and v in L2 across its blocks.
#include <immintrin.h>

#include <omp.h>

#include <cstdint>
#include <cstdlib>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
// the rotation must round its products separately, as the reference does
#pragma GCC optimize("fp-contract=off")
// GCC 12 flags the intrinsics' own `__m512 __Y = __Y;` placeholders once
// they are inlined here; nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "simd_exp.h"

#include "vision_kernels.h"

namespace {

constexpr int64_t kRowBlock = 32;  // query rows per work item
constexpr int kTileRows = 4;       // query rows per register tile
constexpr int kKeyVecs = 4;        // x 16 keys per score tile
constexpr int kOutVecs = 6;        // x 16 values of Dh per value tile (at most)

inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

using fdx86_simd::exp512;  // simd_exp.h

// dst = [x1*c - x2*s, x2*c + x1*s] over halves of `half` values
inline void rotate(const float* x, const float* c, const float* s, int64_t half, float* dst) {
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 m = tail_mask(half - i);
    const __m512 x1 = _mm512_maskz_loadu_ps(m, x + i), x2 = _mm512_maskz_loadu_ps(m, x + half + i);
    const __m512 cc = _mm512_maskz_loadu_ps(m, c + i), ss = _mm512_maskz_loadu_ps(m, s + i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_sub_ps(_mm512_mul_ps(x1, cc), _mm512_mul_ps(x2, ss)));
    _mm512_mask_storeu_ps(dst + half + i, m, _mm512_add_ps(_mm512_mul_ps(x2, cc), _mm512_mul_ps(x1, ss)));
  }
}

struct Packed {
  const float* q;   // [H][N][Dh]
  const float* kt;  // [H][Dh][ldk]
  const float* v;   // [H][N][Dh]
  int64_t N, H, Dh, ldk;
};

// s[r][j] = scale * q[r] . k[j] for MB rows and keys j0 .. j0 + 64 (masked at len)
template <int MB>
inline void score_tile(const float* q, int64_t Dh, const float* kt, int64_t ldk, int64_t len, float scale,
                       float* s, int64_t lds) {
  for (int64_t j0 = 0; j0 < len; j0 += 16 * kKeyVecs) {
    __mmask16 m[kKeyVecs];
    for (int b = 0; b < kKeyVecs; ++b) m[b] = tail_mask(len - j0 - 16 * b > 0 ? len - j0 - 16 * b : 0);
    __m512 acc[MB][kKeyVecs];
    for (int r = 0; r < MB; ++r)
      for (int b = 0; b < kKeyVecs; ++b) acc[r][b] = _mm512_setzero_ps();
    const float* k = kt + j0;
    for (int64_t d = 0; d < Dh; ++d, k += ldk) {
      __m512 kv[kKeyVecs];
      for (int b = 0; b < kKeyVecs; ++b) kv[b] = _mm512_maskz_loadu_ps(m[b], k + 16 * b);
      for (int r = 0; r < MB; ++r) {
        const __m512 qb = _mm512_set1_ps(q[r * Dh + d]);
        for (int b = 0; b < kKeyVecs; ++b) acc[r][b] = _mm512_fmadd_ps(qb, kv[b], acc[r][b]);
      }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < MB; ++r)
      for (int b = 0; b < kKeyVecs; ++b)
        _mm512_mask_storeu_ps(s + r * lds + j0 + 16 * b, m[b], _mm512_mul_ps(acc[r][b], sc));
  }
}

// s[0 .. len) -> exp(s - max) in place; returns 1 / sum
inline float softmax_row(float* s, int64_t len) {
  __m512 mx = _mm512_set1_ps(-3.0e38f);
  for (int64_t j = 0; j < len; j += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-3.0e38f), tail_mask(len - j), s + j));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = tail_mask(len - j);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), top));
    _mm512_mask_storeu_ps(s + j, m, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
  }
  return 1.0f / _mm512_reduce_add_ps(sum);
}

// out[r][16*c ..] = inv[r] * sum_j p[r][j] v[j][16*c ..] for NV vectors from column c0
template <int MB, int NV>
inline void value_tile(const float* p, int64_t lds, int64_t len, const float* v, int64_t Dh, int64_t c0,
                       const float* inv, float* out, int64_t ldo) {
  __mmask16 m[NV];
  for (int c = 0; c < NV; ++c) m[c] = tail_mask(Dh - 16 * (c0 + c));
  __m512 acc[MB][NV];
  for (int r = 0; r < MB; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_setzero_ps();
  const float* vj = v + 16 * c0;
  for (int64_t j = 0; j < len; ++j, vj += Dh) {
    __m512 vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = _mm512_maskz_loadu_ps(m[c], vj + 16 * c);
    for (int r = 0; r < MB; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * lds + j]);
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(pb, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MB; ++r) {
    const __m512 f = _mm512_set1_ps(inv[r]);
    for (int c = 0; c < NV; ++c)
      _mm512_mask_storeu_ps(out + r * ldo + 16 * (c0 + c), m[c], _mm512_mul_ps(acc[r][c], f));
  }
}

template <int MB>
void value_rows(const float* p, int64_t lds, int64_t len, const float* v, int64_t Dh, const float* inv, float* out,
                int64_t ldo) {
  const int64_t nvec = (Dh + 15) / 16;
  for (int64_t c0 = 0; c0 < nvec; c0 += kOutVecs) {
    switch (nvec - c0 >= kOutVecs ? kOutVecs : nvec - c0) {
      case 1: value_tile<MB, 1>(p, lds, len, v, Dh, c0, inv, out, ldo); break;
      case 2: value_tile<MB, 2>(p, lds, len, v, Dh, c0, inv, out, ldo); break;
      case 3: value_tile<MB, 3>(p, lds, len, v, Dh, c0, inv, out, ldo); break;
      case 4: value_tile<MB, 4>(p, lds, len, v, Dh, c0, inv, out, ldo); break;
      case 5: value_tile<MB, 5>(p, lds, len, v, Dh, c0, inv, out, ldo); break;
      default: value_tile<MB, 6>(p, lds, len, v, Dh, c0, inv, out, ldo); break;
    }
  }
}

// One work item: rows r0 .. r0 + rows of frame [start, start + len), head h.
void attend(const Packed& pk, int64_t start, int64_t len, int64_t h, int64_t r0, int64_t rows, float scale,
            float* s, int64_t lds, float* out) {
  const int64_t Dh = pk.Dh, ldo = pk.H * Dh;
  const float* q = pk.q + (h * pk.N + start + r0) * Dh;
  const float* kt = pk.kt + h * Dh * pk.ldk + start;
  const float* v = pk.v + (h * pk.N + start) * Dh;
  float inv[kRowBlock];
  for (int64_t r = 0; r < rows; r += kTileRows) {
    const int64_t mb = rows - r < kTileRows ? rows - r : kTileRows;
    float* sr = s + r * lds;
    const float* qr = q + r * Dh;
    switch (mb) {
      case 1: score_tile<1>(qr, Dh, kt, pk.ldk, len, scale, sr, lds); break;
      case 2: score_tile<2>(qr, Dh, kt, pk.ldk, len, scale, sr, lds); break;
      case 3: score_tile<3>(qr, Dh, kt, pk.ldk, len, scale, sr, lds); break;
      default: score_tile<4>(qr, Dh, kt, pk.ldk, len, scale, sr, lds); break;
    }
  }
  for (int64_t r = 0; r < rows; ++r) inv[r] = softmax_row(s + r * lds, len);
  float* o = out + (start + r0) * ldo + h * Dh;
  for (int64_t r = 0; r < rows; r += kTileRows) {
    const int64_t mb = rows - r < kTileRows ? rows - r : kTileRows;
    switch (mb) {
      case 1: value_rows<1>(s + r * lds, lds, len, v, Dh, inv + r, o + r * ldo, ldo); break;
      case 2: value_rows<2>(s + r * lds, lds, len, v, Dh, inv + r, o + r * ldo, ldo); break;
      case 3: value_rows<3>(s + r * lds, lds, len, v, Dh, inv + r, o + r * ldo, ldo); break;
      default: value_rows<4>(s + r * lds, lds, len, v, Dh, inv + r, o + r * ldo, ldo); break;
    }
  }
}

float* alloc_floats(int64_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, static_cast<size_t>(n > 0 ? n : 1) * sizeof(float)) != 0) return nullptr;
  return static_cast<float*>(p);
}

}  // namespace

namespace fdx86 {

bool vision_attention_avx512(const float* qkv, const float* cos, const float* sin, const int64_t* cu,
                             int64_t frames, int64_t N, int64_t H, int64_t Dh, float scale, float* out,
                             int threads) {
  const int64_t half = Dh / 2, width = 3 * H * Dh, ldk = round16(N);
  const int team = threads < 1 ? 1 : threads;
  int64_t max_len = 0;
  for (int64_t f = 0; f < frames; ++f)
    if (cu[f + 1] - cu[f] > max_len) max_len = cu[f + 1] - cu[f];
  const int64_t lds = round16(max_len);
  float* q = alloc_floats(H * N * Dh);
  float* kt = alloc_floats(H * Dh * ldk);
  float* v = alloc_floats(H * N * Dh);
  float* scratch = alloc_floats(team * kRowBlock * lds);  // a thread's scores [kRowBlock][lds]
  int64_t* first = static_cast<int64_t*>(malloc(sizeof(int64_t) * (frames + 1)));  // first item of each frame
  if (!q || !kt || !v || !scratch || !first) {
    free(q), free(kt), free(v), free(scratch), free(first);
    return false;
  }
  first[0] = 0;
  for (int64_t f = 0; f < frames; ++f)
    first[f + 1] = first[f] + H * ((cu[f + 1] - cu[f] + kRowBlock - 1) / kRowBlock);
  const int64_t items = first[frames];
  const Packed pk{q, kt, v, N, H, Dh, ldk};
#pragma omp parallel num_threads(team)
  {
    float krot[kVisionMaxHeadDim];
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = qkv + n * width;
      const float* c = cos + n * half;
      const float* s = sin + n * half;
      for (int64_t h = 0; h < H; ++h) {
        rotate(row + h * Dh, c, s, half, q + (h * N + n) * Dh);
        rotate(row + (H + h) * Dh, c, s, half, krot);
        float* kcol = kt + h * Dh * ldk + n;
        for (int64_t d = 0; d < Dh; ++d) kcol[d * ldk] = krot[d];
        const float* vs = row + (2 * H + h) * Dh;
        float* vd = v + (h * N + n) * Dh;
        for (int64_t d = 0; d < Dh; d += 16) {
          const __mmask16 m = tail_mask(Dh - d);
          _mm512_mask_storeu_ps(vd + d, m, _mm512_maskz_loadu_ps(m, vs + d));
        }
      }
    }  // implicit barrier: every row packed before any attends
    float* s = scratch + omp_get_thread_num() * kRowBlock * lds;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      int64_t f = 0;
      while (first[f + 1] <= item) ++f;
      const int64_t len = cu[f + 1] - cu[f], blocks = (len + kRowBlock - 1) / kRowBlock;
      const int64_t local = item - first[f], h = local / blocks, r0 = (local % blocks) * kRowBlock;
      const int64_t rows = len - r0 < kRowBlock ? len - r0 : kRowBlock;
      attend(pk, cu[f], len, h, r0, rows, scale, s, lds, out);
    }
  }
  free(first);
  free(scratch);
  free(q);
  free(kt);
  free(v);
  return true;
}

}  // namespace fdx86
