// AVX-512 paged attention (see ops_kernels.h): the same work items, chunks
// and semantics as kernels_ops.cc's AVX2 kernel, laid out for 32 zmm
// registers. Compiled for AVX-512 F/BW/VL/DQ by the pragma below and only
// called after __builtin_cpu_supports says so. No paddle / STL headers
// (kernels.h).
//
// Per work item (request, query tile, kv head) the rows = tile x G query
// heads share every K / V row:
//   scores  two query rows x 8 tokens at a time: 16 zmm accumulators over
//           Dh (each K load feeds both rows), reduced by one transpose-add
//           tree into a zmm of 16 scores (row a's 8 tokens | row b's);
//   softmax online over chunks of at most 64 tokens within a block, 16
//           scores per zmm, masked lanes exactly 0;
//   values  rank-1 updates of a register tile (up to 8 rows x a Dh slice):
//           one V load per token and slice vector feeds every row.
// Dh % 8 == 0; a Dh that is not a multiple of 16 runs its last vector masked.
//
// KV dtypes: the kernel is a template over the pool's element type (Kv*
// below): bf16 / fp16 / int8 / fp8 rows are widened to fp32 in registers as
// they are loaded (exactly: the same values fd_core's reference dequantizes),
// and an int8 / fp8 row's scale multiplies its score (K) and its softmax
// weight after the row sum (V). store_kv_avx512 writes those pools.
//
// Memory (the K / V rows come from DRAM in a decode step: the matmuls between
// layers evict them): with enough requests a unit of work is a (request,
// tile) with all its kv heads, each chunk's heads in turn, so a chunk's K
// (and V) rows are one contiguous run; each thread takes a contiguous range
// of units of about equal work (not a dynamic schedule) and a stream
// prefetcher (Stream) walks that range kAhead tokens ahead of the compute,
// across chunks, blocks and units, into L2.
#include <immintrin.h>

#include <omp.h>

#include <cstdint>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
// GCC 12 flags the intrinsics' own `__m512 __Y = __Y;` placeholders once
// they are inlined here; nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "simd_exp.h"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "ops_kernels.h"

namespace {

using fdx86::AttentionArgs;
using fdx86::KvDtype;

// How the kernel reads a pool of one KvDtype: 16 elements -> an fp32 zmm
// (exact), masked or not; kScaled: rows carry an fp32 scale, multiplied by
// kScaleMul (a power of two folded out of the widening).
struct KvF32 {
  using T = float;
  static constexpr bool kScaled = false;
  static constexpr float kScaleMul = 1.0f;
  static __m512 load(const T* p) { return _mm512_loadu_ps(p); }
  static __m512 load(__mmask16 m, const T* p) { return _mm512_maskz_loadu_ps(m, p); }
};

struct KvBf16 {  // bf16 bits are an fp32's top half
  using T = uint16_t;
  static constexpr bool kScaled = false;
  static constexpr float kScaleMul = 1.0f;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load(const T* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load(__mmask16 m, const T* p) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

struct KvF16 {
  using T = uint16_t;
  static constexpr bool kScaled = false;
  static constexpr float kScaleMul = 1.0f;
  static __m512 load(const T* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load(__mmask16 m, const T* p) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

struct KvInt8 {
  using T = int8_t;
  static constexpr bool kScaled = true;
  static constexpr float kScaleMul = 1.0f;
  static __m512 widen(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
  static __m512 load(const T* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m512 load(__mmask16 m, const T* p) { return widen(_mm_maskz_loadu_epi8(m, p)); }
};

// e4m3fn (bias 7) moved into fp16 (bias 15): exponent and mantissa shifted
// left 7, sign to bit 15 (sign-extended, shifted, bit 14 cleared), so fp16
// value = e4m3 value * 2^-8, subnormals included; kScaleMul puts the 2^8
// back. Codes 0x7F / 0xFF (NaN in e4m3fn, never written: writes saturate at
// 448) read as +-480.
struct KvFp8 {
  using T = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr float kScaleMul = 256.0f;
  static __m512 widen(__m128i b) {
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0xBFFF))));
  }
  static __m512 load(const T* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m512 load(__mmask16 m, const T* p) { return widen(_mm_maskz_loadu_epi8(m, p)); }
};

constexpr int64_t kChunk = 64;  // tokens per online-softmax step
constexpr float kMasked = -1e30f;
constexpr int64_t kParallelMin = 1 << 15;  // floats of K / V below which one thread runs it

using fdx86_simd::exp512;  // simd_exp.h

inline float exp1(float x) { return _mm512_cvtss_f32(exp512(_mm512_set1_ps(x))); }

// lane i = sum of the lanes of v[i]
inline __m512 reduce16(const __m512* v) {
  __m512 p[8], q[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
    p[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: partial sums of v[4i .. 4i+3]
    const __m512d x = _mm512_castps_pd(p[2 * i]), y = _mm512_castps_pd(p[2 * i + 1]);
    q[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 r0 = _mm512_add_ps(_mm512_shuffle_f32x4(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 r1 = _mm512_add_ps(_mm512_shuffle_f32x4(q[2], q[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(q[2], q[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The cache lines of one K / V row of Dh elements, into L1. K and V rows sit
// a slot (Hkv * Dh elements) apart in shuffled blocks, which the hardware
// prefetchers follow poorly: the loads stalled on memory without this.
template <_mm_hint kHint, class T>
inline void prefetch_row(const T* row, int64_t Dh) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < Dh * static_cast<int64_t>(sizeof(T)); b += 64) _mm_prefetch(bytes + b, kHint);
}

inline __mmask16 tail_mask(int64_t rem) {
  return rem >= 16 ? static_cast<__mmask16>(0xFFFF) : rem <= 0 ? 0 : static_cast<__mmask16>((1u << rem) - 1);
}

// Lanes 0-7: query row qa . the 8 key rows kr[0..7]; lanes 8-15: qb . the same.
template <class Kv>
inline __m512 scores_2x8(const float* qa, const float* qb, const typename Kv::T* const* kr, int64_t Dh) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= Dh; d += 16) {
    const __m512 xa = _mm512_loadu_ps(qa + d), xb = _mm512_loadu_ps(qb + d);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 k = Kv::load(kr[j] + d);
      acc[j] = _mm512_fmadd_ps(xa, k, acc[j]);
      acc[8 + j] = _mm512_fmadd_ps(xb, k, acc[8 + j]);
    }
  }
  if (d < Dh) {
    const __mmask16 m = tail_mask(Dh - d);
    const __m512 xa = _mm512_maskz_loadu_ps(m, qa + d), xb = _mm512_maskz_loadu_ps(m, qb + d);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 k = Kv::load(m, kr[j] + d);
      acc[j] = _mm512_fmadd_ps(xa, k, acc[j]);
      acc[8 + j] = _mm512_fmadd_ps(xb, k, acc[8 + j]);
    }
  }
  return reduce16(acc);
}

// sc [rows, kChunk] = scores of qs [rows, Dh] against n <= kChunk key rows at
// positions pos0.. (row t at k + t * stride, times ks[t] when Kv::kScaled);
// a query row sees positions < limit[row]; other lanes, up to a multiple of
// 8, get kMasked. Prefetches the next 8 key rows into L1 as it goes, and
// calls ahead(t) after the first t rows (the stream prefetcher's pace).
template <class Kv, class Ahead>
void chunk_scores(const float* qs, const typename Kv::T* k, int64_t stride, int64_t n, int64_t pos0, int64_t rows,
                  int64_t Dh, const int32_t* limit, const float* ks, float* sc, const Ahead& ahead) {
  const __m512i lane8 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m512 masked = _mm512_set1_ps(kMasked);
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    const int64_t nt = n - t0 < 8 ? n - t0 : 8;
    const typename Kv::T* kr[8];
    for (int j = 0; j < 8; ++j) kr[j] = k + (t0 + (j < nt ? j : nt - 1)) * stride;
    for (int64_t t = t0 + 8; t < n && t < t0 + 16; ++t) prefetch_row<_MM_HINT_T0>(k + t * stride, Dh);
    ahead(t0 + nt);
    __m512 kscale = _mm512_set1_ps(1.0f);
    if constexpr (Kv::kScaled) kscale = _mm512_broadcast_f32x8(_mm256_loadu_ps(ks + t0));
    const __m512i pos = _mm512_add_epi32(lane8, _mm512_set1_epi32(static_cast<int32_t>(pos0 + t0)));
    const __mmask16 in_chunk = _mm512_cmplt_epi32_mask(lane8, _mm512_set1_epi32(static_cast<int32_t>(nt)));
    for (int64_t ra = 0; ra < rows; ra += 2) {
      const int64_t rb = ra + 1 < rows ? ra + 1 : ra;
      float* outa = sc + ra * kChunk + t0;
      float* outb = sc + rb * kChunk + t0;
      if (limit[ra] <= pos0 + t0 && limit[rb] <= pos0 + t0) {
        _mm256_storeu_ps(outa, _mm512_castps512_ps256(masked));
        _mm256_storeu_ps(outb, _mm512_castps512_ps256(masked));
        continue;
      }
      __m512 s = scores_2x8<Kv>(qs + ra * Dh, qs + rb * Dh, kr, Dh);
      if constexpr (Kv::kScaled) s = _mm512_mul_ps(s, kscale);
      const __m512i lim = _mm512_inserti64x4(_mm512_set1_epi32(limit[ra]),
                                             _mm256_set1_epi32(limit[rb]), 1);
      const __mmask16 keep = in_chunk & _mm512_cmplt_epi32_mask(pos, lim);
      const __m512 v = _mm512_mask_mov_ps(masked, keep, s);
      _mm256_storeu_ps(outa, _mm512_castps512_ps256(v));
      if (rb != ra) _mm256_storeu_ps(outb, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    }
  }
}

// acc[r] = acc[r] * alpha[r] + sum_t p[r][t] v_t for RB rows (p row stride
// kChunk, acc row stride Dh) and n value rows (row t at v + t * stride), in
// Dh slices of NS vectors held in registers.
template <class Kv, int RB, int NS>
void values_tile(const float* p, const float* alpha, const typename Kv::T* v, int64_t stride, int64_t n, int64_t Dh,
                 float* acc) {
  for (int64_t d = 0; d < Dh; d += 16 * NS) {
    __mmask16 mk[NS];
    for (int j = 0; j < NS; ++j) mk[j] = tail_mask(Dh - d - 16 * j);
    __m512 c[RB][NS];
    for (int r = 0; r < RB; ++r) {
      const __m512 al = _mm512_set1_ps(alpha[r]);
      for (int j = 0; j < NS; ++j)
        c[r][j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[j], acc + r * Dh + d + 16 * j), al);
    }
    const typename Kv::T* vr = v + d;
    for (int64_t t = 0; t < n; ++t, vr += stride) {
      __m512 vv[NS];
      for (int j = 0; j < NS; ++j) vv[j] = Kv::load(mk[j], vr + 16 * j);
      for (int r = 0; r < RB; ++r) {
        const __m512 pb = _mm512_set1_ps(p[r * kChunk + t]);
        for (int j = 0; j < NS; ++j) c[r][j] = _mm512_fmadd_ps(pb, vv[j], c[r][j]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < NS; ++j) _mm512_mask_storeu_ps(acc + r * Dh + d + 16 * j, mk[j], c[r][j]);
  }
}

template <class Kv>
void values(const float* p, const float* alpha, const typename Kv::T* v, int64_t stride, int64_t n, int64_t rows,
            int64_t Dh, float* acc) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t rb = rows - r0 < 8 ? rows - r0 : 8;
    const float* pr = p + r0 * kChunk;
    const float* al = alpha + r0;
    float* ac = acc + r0 * Dh;
    switch (rb) {
      case 8: values_tile<Kv, 8, 2>(pr, al, v, stride, n, Dh, ac); break;
      case 7: values_tile<Kv, 7, 3>(pr, al, v, stride, n, Dh, ac); break;
      case 6: values_tile<Kv, 6, 3>(pr, al, v, stride, n, Dh, ac); break;
      case 5: values_tile<Kv, 5, 4>(pr, al, v, stride, n, Dh, ac); break;
      case 4: values_tile<Kv, 4, 4>(pr, al, v, stride, n, Dh, ac); break;
      case 3: values_tile<Kv, 3, 6>(pr, al, v, stride, n, Dh, ac); break;
      case 2: values_tile<Kv, 2, 8>(pr, al, v, stride, n, Dh, ac); break;
      default: values_tile<Kv, 1, 8>(pr, al, v, stride, n, Dh, ac); break;
    }
  }
}

// A thread's work: units u in [begin, end) of its share. Unit u is item
// u / Hkv with kv head u % Hkv alone, or with by_request item u and all kv
// heads (a token's K / V rows for every head are adjacent, so a chunk of
// them is one contiguous run of memory).
struct Units {
  const AttentionArgs* a;
  bool by_request;
  int64_t count() const { return by_request ? a->num_items : a->num_items * a->Hkv; }
  int64_t item(int64_t u) const { return by_request ? u : u / a->Hkv; }
  int64_t head0(int64_t u) const { return by_request ? 0 : u % a->Hkv; }
  int64_t heads() const { return by_request ? a->Hkv : 1; }
  // positions the unit's last query token sees: its K / V rows are 0 .. end-1
  int64_t end(int64_t u) const {
    const int64_t i = item(u), r = a->items[2 * i], i0 = a->items[2 * i + 1];
    const int64_t qlen = a->query_lens ? a->query_lens[r] : 1;
    const int64_t last = i0 + a->tile < qlen ? i0 + a->tile : qlen;
    return a->seq_lens[r] - qlen + last;
  }
};

// Software prefetch into L2 of the K / V rows a thread reads next, running a
// fixed number of tokens ahead of the compute across chunks, blocks and
// units. Slots of a block are 1 KB+ apart and blocks are scattered, so the
// hardware prefetchers (which stop at 4 KB pages) bring in little of it.
struct Stream {
  const Units* units;
  int64_t u = 0, u_end = 0, pos = 0, end = 0;
  int64_t issued = 0;  // tokens prefetched so far
  int64_t esize = 4;   // bytes per element of the pool
  const char* k = nullptr;
  const char* v = nullptr;
  int64_t lines = 0;  // cache lines of one token's rows (heads of the unit)

  void start(int64_t unit) {
    u = unit;
    pos = 0;
    if (u >= u_end) return;
    end = units->end(u);
    const AttentionArgs& a = *units->a;
    k = static_cast<const char*>(a.k_cache) + units->head0(u) * a.Dh * esize;
    v = static_cast<const char*>(a.v_cache) + units->head0(u) * a.Dh * esize;
    lines = (units->heads() * a.Dh * esize + 63) / 64;
  }
  void run_to(int64_t target) {
    const AttentionArgs& a = *units->a;
    const int64_t stride = a.Hkv * a.Dh, bs = a.block_size;
    while (issued < target && u < u_end) {
      const int64_t* table = a.block_tables + a.items[2 * units->item(u)] * a.W;
      const int64_t slot = table[pos / bs] * bs + pos % bs;
      const char* kr = k + slot * stride * esize;
      const char* vr = v + slot * stride * esize;
      for (int64_t c = 0; c < lines; ++c) {
        _mm_prefetch(kr + 64 * c, _MM_HINT_T1);
        _mm_prefetch(vr + 64 * c, _MM_HINT_T1);
      }
      if (a.k_scales != nullptr) {  // the token's row scales ([S, Hkv] fp32)
        _mm_prefetch(reinterpret_cast<const char*>(a.k_scales + slot * a.Hkv), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(a.v_scales + slot * a.Hkv), _MM_HINT_T1);
      }
      ++issued;
      if (++pos >= end) start(u + 1);
    }
  }
};

// Tokens the stream prefetcher runs ahead of the compute (K + V of every
// head of the unit: 32 KB at Hkv = 2, Dh = 128). Measured on Zen 4 at B = 8
// / 32, ctx 140 and B = 1, ctx 5000: 8 and 16 too few, 32 - 128 alike.
constexpr int64_t kAhead = 32;

// One unit: request r, query tokens [i0, i0 + nq), kv heads [h0, h0 + nh);
// query row j = (i - i0) * G + g of head h is head h * G + g of token i.
// `done` tokens of the thread's stream precede this unit.
template <class Kv>
void attend_unit(const AttentionArgs& a, int64_t r, int64_t i0, int64_t h0, int64_t nh, float* scratch,
                 Stream* pf, int64_t done) {
  using T = typename Kv::T;
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  alignas(64) float ks[kChunk], vs[kChunk];  // the chunk's K / V row scales (Kv::kScaled)
  const int64_t G = a.H / a.Hkv, Dh = a.Dh, bs = a.block_size;
  const int64_t stride = a.Hkv * Dh;  // elements between consecutive slots
  const int64_t len = a.seq_lens[r];
  const int64_t qlen = a.query_lens ? a.query_lens[r] : 1;
  const int64_t qstart = a.query_starts ? a.query_starts[r] : r;
  const int64_t nq = qlen - i0 < a.tile ? qlen - i0 : a.tile;
  const int64_t rows = nq * G;
  // per head: qs [rows, Dh], acc [rows, Dh], m [rows], l [rows]
  const int64_t per_head = rows * (2 * Dh + 2);
  float* sc = scratch + nh * per_head;  // [rows, kChunk], shared by the heads
  float* alpha = sc + rows * kChunk;
  int32_t* limit = reinterpret_cast<int32_t*>(alpha + rows);
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t h = 0; h < nh; ++h) {
    float* qs = scratch + h * per_head;
    float* acc = qs + rows * Dh;
    float* m = acc + rows * Dh;
    float* l = m + rows;
    for (int64_t i = 0; i < nq; ++i) {
      const float* q = a.q + ((qstart + i0 + i) * a.H + (h0 + h) * G) * Dh;
      float* qi = qs + i * G * Dh;
      float* ai = acc + i * G * Dh;
      int64_t e = 0;
      for (; e + 16 <= G * Dh; e += 16) {
        _mm512_storeu_ps(qi + e, _mm512_mul_ps(_mm512_loadu_ps(q + e), scale));
        _mm512_storeu_ps(ai + e, _mm512_setzero_ps());
      }
      for (; e < G * Dh; ++e) qi[e] = q[e] * a.scale, ai[e] = 0.0f;
      for (int64_t g = 0; g < G; ++g) m[i * G + g] = kMasked, l[i * G + g] = 0.0f;
    }
  }
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t g = 0; g < G; ++g) limit[i * G + g] = static_cast<int32_t>(len - qlen + i0 + i + 1);
  const int64_t end = len - qlen + i0 + nq;  // positions the tile's last token sees
  const int64_t* table = a.block_tables + r * a.W;
  const __m512 masked = _mm512_set1_ps(kMasked);
  for (int64_t pos = 0; pos < end;) {
    const int64_t off = pos % bs;
    int64_t n = bs - off;
    if (n > kChunk) n = kChunk;
    if (n > end - pos) n = end - pos;
    const int64_t slot0 = table[pos / bs] * bs + off;
    const int64_t first = slot0 * stride + h0 * Dh;
    for (int64_t h = 0; h < nh; ++h) {
      float* qs = scratch + h * per_head;
      float* acc = qs + rows * Dh;
      float* m = acc + rows * Dh;
      float* l = m + rows;
      const int64_t kv = first + h * Dh;
      if constexpr (Kv::kScaled) {  // lanes past n: 0 (masked anyway)
        const float* ksrc = a.k_scales + slot0 * a.Hkv + h0 + h;
        const float* vsrc = a.v_scales + slot0 * a.Hkv + h0 + h;
        for (int64_t t = 0; t < kChunk; ++t) {
          ks[t] = t < n ? ksrc[t * a.Hkv] * Kv::kScaleMul : 0.0f;
          vs[t] = t < n ? vsrc[t * a.Hkv] * Kv::kScaleMul : 0.0f;
        }
      }
      // the stream runs kAhead tokens past this chunk's share done so far
      const auto ahead = [&](int64_t t) { pf->run_to(done + pos + (h * n + t) / nh + kAhead); };
      chunk_scores<Kv>(qs, k_cache + kv, stride, n, pos, rows, Dh, limit, ks, sc, ahead);
      if (pos + n < end || h + 1 < nh) {  // the next key rows, while the values run
        const int64_t next = h + 1 < nh ? pos : pos + n, nn = end - next < 8 ? end - next : 8;
        const T* k_next = k_cache + (table[next / bs] * bs + next % bs) * stride + h0 * Dh +
                          (h + 1 < nh ? h + 1 : 0) * Dh;
        for (int64_t t = 0; t < nn && next % bs + t < bs; ++t) prefetch_row<_MM_HINT_T0>(k_next + t * stride, Dh);
      }
      const int64_t padded = (n + 7) / 8 * 8;
      for (int64_t j = 0; j < rows; ++j) {
        float* p = sc + j * kChunk;
        if (limit[j] <= pos) {  // sees nothing here: p = 0, acc kept
          for (int64_t t = 0; t < padded; t += 8) _mm256_storeu_ps(p + t, _mm256_setzero_ps());
          alpha[j] = 1.0f;
          continue;
        }
        __m512 mx = masked;
        for (int64_t t = 0; t < padded; t += 16)
          mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(masked, tail_mask(padded - t), p + t));
        const float chunk_max = _mm512_reduce_max_ps(mx);
        const float m_new = m[j] > chunk_max ? m[j] : chunk_max;
        const __m512 mv = _mm512_set1_ps(m_new);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < padded; t += 16) {
          const __mmask16 in = tail_mask(padded - t);
          const __m512 s = _mm512_mask_loadu_ps(masked, in, p + t);
          const __mmask16 live = _mm512_cmp_ps_mask(s, _mm512_set1_ps(0.5f * kMasked), _CMP_GT_OQ);
          const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(s, mv)));
          if constexpr (Kv::kScaled)  // the V row's scale joins its weight after the sum
            _mm512_mask_storeu_ps(p + t, in, _mm512_mul_ps(e, _mm512_loadu_ps(vs + t)));
          else
            _mm512_mask_storeu_ps(p + t, in, e);
          sum = _mm512_add_ps(sum, e);
        }
        alpha[j] = m[j] == kMasked ? 0.0f : exp1(m[j] - m_new);
        l[j] = l[j] * alpha[j] + _mm512_reduce_add_ps(sum);
        m[j] = m_new;
      }
      values<Kv>(sc, alpha, v_cache + kv, stride, n, rows, Dh, acc);
    }
    pos += n;
  }
  for (int64_t h = 0; h < nh; ++h) {
    const float* acc = scratch + h * per_head + rows * Dh;
    const float* l = acc + rows * Dh + rows;
    for (int64_t i = 0; i < nq; ++i) {
      float* out = a.out + ((qstart + i0 + i) * a.H + (h0 + h) * G) * Dh;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t j = i * G + g;
        const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
        const __m512 iv = _mm512_set1_ps(inv);
        for (int64_t d = 0; d < Dh; d += 16) {
          const __mmask16 mk = tail_mask(Dh - d);
          _mm512_mask_storeu_ps(out + g * Dh + d, mk,
                                _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, acc + j * Dh + d), iv));
        }
      }
    }
  }
}

// Units [begin, end) in order, with one stream prefetcher running ahead.
template <class Kv>
void run_units(const Units& units, int64_t begin, int64_t end, float* scratch) {
  const AttentionArgs& a = *units.a;
  Stream pf;
  pf.units = &units;
  pf.u_end = end;
  pf.esize = sizeof(typename Kv::T);
  pf.start(begin);
  int64_t done = 0;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t i = units.item(u);
    attend_unit<Kv>(a, a.items[2 * i], a.items[2 * i + 1], units.head0(u), units.heads(), scratch, &pf, done);
    done += units.end(u);
  }
}

template <class Kv>
void paged_attention(const AttentionArgs& a) {
  const int64_t per_thread = fdx86::attention_scratch(a.tile * a.H, a.Dh);
  int nt = a.threads < 1 ? 1 : a.threads;
  // With enough (request, tile) items, a unit is an item with all its kv
  // heads (one contiguous run of K / V per chunk); else an item's kv head.
  const Units units{&a, a.num_items >= 2 * nt};
  const int64_t count = units.count();
  int64_t work = 0;  // K / V tokens read, summed over units
  for (int64_t u = 0; u < count; ++u) work += units.end(u);
  if (nt <= 1 || work * units.heads() * a.Dh * 2 < kParallelMin || count < 2) nt = 1;
  if (count < nt) nt = static_cast<int>(count);
  if (nt == 1) {
    run_units<Kv>(units, 0, count, a.scratch);
    return;
  }
  // Each thread takes a contiguous range of units of about equal work, so
  // its prefetcher knows what comes next.
  int64_t bounds[65];
  if (nt > 64) nt = 64;
  bounds[0] = 0;
  {
    int64_t u = 0, sum = 0;
    for (int t = 1; t < nt; ++t) {
      const int64_t target = work * t / nt;
      while (u < count && sum + units.end(u) / 2 < target) sum += units.end(u++);
      bounds[t] = u;
    }
    bounds[nt] = count;
  }
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    run_units<Kv>(units, bounds[t], bounds[t + 1], a.scratch + per_thread * t);
  }
}

// ------------------------------------------------------------ KV stores
//
// One (token, head) row x [Dh] fp32 into a pool row, bit-identical to
// fd_core.ops.kv_dtype.quantize (every step an IEEE fp32 operation in the
// reference's order; no FMA contraction in these loops).

void store_bf16(const float* x, uint16_t* out, int64_t Dh) {
  const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  for (int64_t d = 0; d < Dh; d += 16) {
    const __mmask16 m = tail_mask(Dh - d);
    const __m512i b = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + d));
    // round to nearest even: bits + 0x7FFF + (bit 16), top half
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, half), _mm512_and_si512(_mm512_srli_epi32(b, 16), one));
    _mm256_mask_storeu_epi16(out + d, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}

void store_f16(const float* x, uint16_t* out, int64_t Dh) {
  for (int64_t d = 0; d < Dh; d += 16) {
    const __mmask16 m = tail_mask(Dh - d);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(out + d, m, h);
  }
}

// absmax / qmax in fp32 -> *scale; returns the divisor (1 for a zero row)
float row_scale(const float* x, int64_t Dh, float qmax, float* scale) {
  __m512 mx = _mm512_setzero_ps();
  for (int64_t d = 0; d < Dh; d += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(Dh - d), x + d)));
  const float s = _mm512_reduce_max_ps(mx) / qmax;
  *scale = s;
  return s > 0.0f ? s : 1.0f;
}

// codes = sign(y) * min(floor(|y| + 0.5), 127) with y = x / scale
void store_int8(const float* x, int8_t* out, float* scale, int64_t Dh) {
  const __m512 div = _mm512_set1_ps(row_scale(x, Dh, 127.0f, scale));
  for (int64_t d = 0; d < Dh; d += 16) {
    const __mmask16 m = tail_mask(Dh - d);
    const __m512 y = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + d), div);
    __m512 a = _mm512_roundscale_ps(_mm512_add_ps(_mm512_abs_ps(y), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    a = _mm512_min_ps(a, _mm512_set1_ps(127.0f));
    __m512i c = _mm512_cvttps_epi32(a);
    c = _mm512_mask_sub_epi32(c, _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_si512(), c);
    _mm512_mask_cvtepi32_storeu_epi8(out + d, m, c);
  }
}

// e4m3fn code of y = x / scale: |y| saturated at 448, rounded to nearest even
// (normal: the fp32 mantissa rounded to 3 bits, exponent rebiased 127 -> 7;
// below 2^-6: multiples of 2^-9), sign bit unless the code is 0.
void store_fp8(const float* x, uint8_t* out, float* scale, int64_t Dh) {
  const __m512 div = _mm512_set1_ps(row_scale(x, Dh, 448.0f, scale));
  for (int64_t d = 0; d < Dh; d += 16) {
    const __mmask16 m = tail_mask(Dh - d);
    const __m512 y = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + d), div);
    const __m512 mag = _mm512_min_ps(_mm512_abs_ps(y), _mm512_set1_ps(448.0f));
    const __m512i bits = _mm512_castps_si512(mag);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFFF)), lsb);
    const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(rounded, 20), _mm512_set1_epi32(120 << 3));
    const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(mag, _mm512_set1_ps(512.0f)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 tiny = _mm512_cmp_ps_mask(mag, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
    const __m512i code = _mm512_mask_mov_epi32(normal, tiny, sub);
    const __mmask16 neg = _mm512_cmplt_epi32_mask(_mm512_castps_si512(y), _mm512_setzero_si512()) &
                          _mm512_test_epi32_mask(code, code);
    _mm512_mask_cvtepi32_storeu_epi8(out + d, m, _mm512_mask_or_epi32(code, neg, code, _mm512_set1_epi32(0x80)));
  }
}

// int8_static: codes = clip(rint(x), -127, 127), round half to even (FastDeploy's
// roundWithTiesToEven; x is already x * 127 / S), and the slot's scale 1
void store_int8_static(const float* x, int8_t* out, float* scale, int64_t Dh) {
  *scale = 1.0f;
  for (int64_t d = 0; d < Dh; d += 16) {
    const __mmask16 m = tail_mask(Dh - d);
    __m512 r = _mm512_roundscale_ps(_mm512_maskz_loadu_ps(m, x + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_max_ps(_mm512_min_ps(r, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-127.0f));
    _mm512_mask_cvtepi32_storeu_epi8(out + d, m, _mm512_cvttps_epi32(r));
  }
}

}  // namespace

namespace fdx86 {

void paged_attention_avx512(const AttentionArgs& a) {
  switch (a.kv_dtype) {
    case KvDtype::kF32: paged_attention<KvF32>(a); break;
    case KvDtype::kBf16: paged_attention<KvBf16>(a); break;
    case KvDtype::kF16: paged_attention<KvF16>(a); break;
    case KvDtype::kInt8:
    case KvDtype::kInt8Static: paged_attention<KvInt8>(a); break;  // its scales are 1
    case KvDtype::kFp8: paged_attention<KvFp8>(a); break;
  }
}

void store_kv_avx512(KvDtype dt, const float* x, void* cache, float* scales, const int64_t* slots, int64_t tokens,
                     int64_t Hkv, int64_t Dh) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t h = 0; h < Hkv; ++h) {
      const float* row = x + (t * Hkv + h) * Dh;
      const int64_t dst = slots[t] * Hkv + h;  // row of the pool's [S * Hkv, Dh]
      switch (dt) {
        case KvDtype::kF32:
          __builtin_memcpy(static_cast<float*>(cache) + dst * Dh, row, Dh * sizeof(float));
          break;
        case KvDtype::kBf16: store_bf16(row, static_cast<uint16_t*>(cache) + dst * Dh, Dh); break;
        case KvDtype::kF16: store_f16(row, static_cast<uint16_t*>(cache) + dst * Dh, Dh); break;
        case KvDtype::kInt8: store_int8(row, static_cast<int8_t*>(cache) + dst * Dh, scales + dst, Dh); break;
        case KvDtype::kFp8: store_fp8(row, static_cast<uint8_t*>(cache) + dst * Dh, scales + dst, Dh); break;
        case KvDtype::kInt8Static:
          store_int8_static(row, static_cast<int8_t*>(cache) + dst * Dh, scales + dst, Dh);
          break;
      }
    }
  }
}

}  // namespace fdx86

namespace fdx86 {

// The memory floor benchmarks compare against: one read of `bytes` bytes
// (a multiple of 64, 64-byte aligned), threads splitting the range, 4
// independent 512-bit loads in flight per thread; returns an xor of the data
// so the loads are not optimized away.
uint64_t read_memory_avx512(const void* data, int64_t bytes, int threads) {
  const int64_t lines = bytes / 64;
  const __m512i* p = static_cast<const __m512i*>(data);
  uint64_t result = 0;
#pragma omp parallel num_threads(threads < 1 ? 1 : threads) reduction(^ : result)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = lines * t / nt, end = lines * (t + 1) / nt;
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
      b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 1));
      c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 2));
      d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 3));
    }
    for (; i < end; ++i) a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    const __m512i all = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(reinterpret_cast<__m512i*>(lanes), all);
    for (uint64_t lane : lanes) result ^= lane;
  }
  return result;
}

}  // namespace fdx86
