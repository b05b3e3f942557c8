// AVX2 + FMA kernels for the decode ops (see ops_kernels.h): plain loops
// where the compiler vectorises them, intrinsics for the reductions, exp
// and the attention inner loops. No paddle / STL headers (kernels.h).
#include <immintrin.h>

#include <omp.h>

#include <cstdint>

#pragma GCC target("avx2,fma")

#include "ops_kernels.h"

namespace {

// Below this many floats of work an op runs on the calling thread: an
// OpenMP region costs a few microseconds, more than the work it splits.
constexpr int64_t kParallelMin = 1 << 15;

constexpr int64_t kChunk = 64;  // attention: tokens per online-softmax step

inline int team(int threads, int64_t work, int64_t items) {
  if (threads <= 1 || work < kParallelMin || items < 2) return 1;
  return items < threads ? static_cast<int>(items) : threads;
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// lane j = sum of the lanes of a[j]
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // a0..a3 low halves | a0..a3 high halves
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// exp(x), Cephes' polynomial (relative error ~1e-7); 0 below -87.3.
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
  __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

inline float exp1(float x) {
  return _mm256_cvtss_f32(exp256(_mm256_set1_ps(x)));
}

void rms_norm_row(const float* x, const float* r, const float* w, float* out, float* sum, int64_t d,
                  float eps) {
  const float* s = x;
  if (r != nullptr) {
    for (int64_t i = 0; i < d; ++i) sum[i] = x[i] + r[i];
    s = sum;
  }
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 v = _mm256_loadu_ps(s + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (; i < d; ++i) ss += s[i] * s[i];
  const float inv = 1.0f / __builtin_sqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t j = 0; j < d; ++j) out[j] = s[j] * inv * w[j];
}

void silu_mul_row(const float* x, float* out, int64_t inter) {
  const float* gate = x;
  const float* up = x + inter;
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= inter; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_sub_ps(zero, g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < inter; ++i) out[i] = gate[i] / (1.0f + exp1(-gate[i])) * up[i];
}

void rotate_token(const float* x, float* out, int64_t heads, int64_t dh, const float* c, int interleaved) {
  const int64_t half = dh / 2;
  const float* s = c + half;
  for (int64_t h = 0; h < heads; ++h) {
    const float* xh = x + h * dh;
    float* oh = out + h * dh;
    if (interleaved) {
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xh[2 * i], x2 = xh[2 * i + 1];
        oh[2 * i] = x1 * c[i] - x2 * s[i];
        oh[2 * i + 1] = x2 * c[i] + x1 * s[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        oh[i] = x1 * c[i] - x2 * s[i];
        oh[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

// The fused QKV step for token t: token t's row of qkv is [q | k | v].
void qkv_token(const fdx86::QkvArgs& a, int64_t t) {
  const int64_t dh = a.Dh, q_size = a.H * dh, kv_size = a.Hkv * dh;
  const float* row = a.qkv + t * (q_size + 2 * kv_size);
  const float* c = a.cos_sin + a.positions[t] * dh;
  float* q = a.q_out + t * q_size;
  float* k = a.k_out + t * kv_size;
  float* v = a.v_out + t * kv_size;
  rotate_token(row, q, a.H, dh, c, a.interleaved);
  rotate_token(row + q_size, k, a.Hkv, dh, c, a.interleaved);
  const float* v_in = row + q_size + kv_size;
  for (int64_t i = 0; i < kv_size; ++i) v[i] = v_in[i];
  const int64_t slot = a.slots[t];
  if (slot < 0) return;
  if (a.kv_dtype != fdx86::KvDtype::kF32) {  // the op checked for AVX-512
    fdx86::store_kv_avx512(a.kv_dtype, k, a.k_cache, a.k_scales, &slot, 1, a.Hkv, dh);
    fdx86::store_kv_avx512(a.kv_dtype, v, a.v_cache, a.v_scales, &slot, 1, a.Hkv, dh);
    return;
  }
  float* k_dst = static_cast<float*>(a.k_cache) + slot * kv_size;
  float* v_dst = static_cast<float*>(a.v_cache) + slot * kv_size;
  for (int64_t i = 0; i < kv_size; ++i) k_dst[i] = k[i];
  for (int64_t i = 0; i < kv_size; ++i) v_dst[i] = v[i];
}

using fdx86::AttentionArgs;

constexpr float kMasked = -1e30f;

// The cache lines of one K / V row of Dh floats. K and V rows sit a slot
// (Hkv * Dh floats) apart in shuffled blocks, which the hardware prefetchers
// follow poorly: the loads stalled on memory without this.
template <_mm_hint kHint>
inline void prefetch_row(const float* row, int64_t Dh) {
  for (int64_t d = 0; d < Dh; d += 16) _mm_prefetch(reinterpret_cast<const char*>(row + d), kHint);
}

// Scores of `rows` scaled queries qs [rows, Dh] against n <= kChunk key rows
// at positions pos0.. (row t at k + t * stride) into sc [rows, kChunk]; a
// query row sees positions < limit[row]; lanes it does not see, up to a
// multiple of 8, get kMasked (exp -> 0). Rows that see nothing here are
// skipped (seen[row] = 0). Prefetches the next 8 key rows and the value
// rows v (same layout) as it goes.
void chunk_scores(const float* qs, const float* k, const float* v, int64_t stride, int64_t n, int64_t pos0,
                  int64_t rows, int64_t Dh, const int32_t* limit, float* sc, int32_t* seen) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 masked = _mm256_set1_ps(kMasked);
  for (int64_t r = 0; r < rows; ++r) seen[r] = limit[r] > pos0;
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    const int64_t nt = n - t0 < 8 ? n - t0 : 8;
    const float* kr[8];
    for (int j = 0; j < 8; ++j) kr[j] = k + (t0 + (j < nt ? j : nt - 1)) * stride;
    for (int64_t t = t0 + 8; t < n && t < t0 + 16; ++t) prefetch_row<_MM_HINT_T0>(k + t * stride, Dh);
    for (int64_t t = t0; t < t0 + nt; ++t) prefetch_row<_MM_HINT_T1>(v + t * stride, Dh);  // L2: a chunk fills L1
    const __m256i pos = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(pos0 + t0)));
    const __m256i in_chunk = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(nt)), lane);
    for (int64_t r = 0; r < rows; ++r) {
      float* out = sc + r * kChunk + t0;
      if (!seen[r] || limit[r] <= pos0 + t0) {
        _mm256_storeu_ps(out, masked);
        continue;
      }
      const float* qr = qs + r * Dh;
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t d = 0; d < Dh; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qr + d);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[j] + d), acc[j]);
      }
      const __m256i keep = _mm256_and_si256(in_chunk, _mm256_cmpgt_epi32(_mm256_set1_epi32(limit[r]), pos));
      _mm256_storeu_ps(out, _mm256_blendv_ps(masked, hsum8(acc), _mm256_castsi256_ps(keep)));
    }
  }
}

// acc[r] = acc[r] * alpha[r] + sum_t p[r][t] v_t for RB rows (p row stride
// kChunk, acc row stride Dh) and n value rows (row t at v + t * stride): a
// register tile of RB rows x NS vectors per Dh slice, one V load per token
// and vector for all RB rows.
template <int RB, int NS>
void values_tile(const float* p, const float* alpha, const float* v, int64_t stride, int64_t n, int64_t Dh,
                 int64_t d0, int64_t d1, float* acc) {
  for (int64_t d = d0; d + 8 * NS <= d1; d += 8 * NS) {
    __m256 c[RB][NS];
    for (int r = 0; r < RB; ++r) {
      const __m256 al = _mm256_set1_ps(alpha[r]);
      for (int j = 0; j < NS; ++j) c[r][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * Dh + d + 8 * j), al);
    }
    const float* vr = v + d;
    for (int64_t t = 0; t < n; ++t, vr += stride) {
      __m256 vv[NS];
      for (int j = 0; j < NS; ++j) vv[j] = _mm256_loadu_ps(vr + 8 * j);
      for (int r = 0; r < RB; ++r) {
        const __m256 pb = _mm256_broadcast_ss(p + r * kChunk + t);
        for (int j = 0; j < NS; ++j) c[r][j] = _mm256_fmadd_ps(pb, vv[j], c[r][j]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < NS; ++j) _mm256_storeu_ps(acc + r * Dh + d + 8 * j, c[r][j]);
  }
}

template <int RB>
void values_rows(const float* p, const float* alpha, const float* v, int64_t stride, int64_t n, int64_t Dh,
                 float* acc) {
  constexpr int NS = RB >= 4 ? 2 : 4;
  const int64_t body = Dh / (8 * NS) * (8 * NS);
  values_tile<RB, NS>(p, alpha, v, stride, n, Dh, 0, body, acc);
  if (body < Dh) values_tile<RB, 1>(p, alpha, v, stride, n, Dh, body, Dh, acc);
}

void values(const float* p, const float* alpha, const float* v, int64_t stride, int64_t n, int64_t rows, int64_t Dh,
            float* acc) {
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const int64_t rb = rows - r0 < 4 ? rows - r0 : 4;
    const float* pr = p + r0 * kChunk;
    const float* al = alpha + r0;
    float* ac = acc + r0 * Dh;
    switch (rb) {
      case 4: values_rows<4>(pr, al, v, stride, n, Dh, ac); break;
      case 3: values_rows<3>(pr, al, v, stride, n, Dh, ac); break;
      case 2: values_rows<2>(pr, al, v, stride, n, Dh, ac); break;
      default: values_rows<1>(pr, al, v, stride, n, Dh, ac); break;
    }
  }
}

// One work item: request r, query tokens [i0, i0 + nq), kv head kvh; query
// row j = (i - i0) * G + g is head kvh * G + g of token i.
void attend_item(const AttentionArgs& a, int64_t r, int64_t i0, int64_t kvh, float* scratch) {
  const int64_t G = a.H / a.Hkv, Dh = a.Dh, bs = a.block_size;
  const int64_t stride = a.Hkv * Dh;  // floats between consecutive slots
  const int64_t len = a.seq_lens[r];
  const int64_t qlen = a.query_lens ? a.query_lens[r] : 1;
  const int64_t qstart = a.query_starts ? a.query_starts[r] : r;
  const int64_t nq = qlen - i0 < a.tile ? qlen - i0 : a.tile;
  const int64_t rows = nq * G;
  float* qs = scratch;          // [rows, Dh]
  float* acc = qs + rows * Dh;  // [rows, Dh]
  float* sc = acc + rows * Dh;  // [rows, kChunk]
  float* m = sc + rows * kChunk;
  float* l = m + rows;
  float* alpha = l + rows;
  int32_t* limit = reinterpret_cast<int32_t*>(alpha + rows);
  int32_t* seen = limit + rows;
  for (int64_t i = 0; i < nq; ++i) {
    const float* q = a.q + ((qstart + i0 + i) * a.H + kvh * G) * Dh;
    for (int64_t e = 0; e < G * Dh; ++e) {
      qs[i * G * Dh + e] = q[e] * a.scale;
      acc[i * G * Dh + e] = 0.0f;
    }
    for (int64_t g = 0; g < G; ++g) {
      m[i * G + g] = kMasked;
      l[i * G + g] = 0.0f;
      limit[i * G + g] = static_cast<int32_t>(len - qlen + i0 + i + 1);
    }
  }
  const int64_t end = len - qlen + i0 + nq;  // positions the tile's last token sees
  const int64_t* table = a.block_tables + r * a.W;
  const float* k_cache = static_cast<const float*>(a.k_cache);  // fp32 pools only here
  const float* v_cache = static_cast<const float*>(a.v_cache);
  for (int64_t pos = 0; pos < end;) {
    const int64_t off = pos % bs;
    int64_t n = bs - off;
    if (n > kChunk) n = kChunk;
    if (n > end - pos) n = end - pos;
    const int64_t first = (table[pos / bs] * bs + off) * stride + kvh * Dh;
    chunk_scores(qs, k_cache + first, v_cache + first, stride, n, pos, rows, Dh, limit, sc, seen);
    if (pos + n < end) {  // the next chunk's first key rows, while the values run
      const int64_t next = pos + n, nn = end - next < 8 ? end - next : 8;
      const float* k_next = k_cache + (table[next / bs] * bs + next % bs) * stride + kvh * Dh;
      for (int64_t t = 0; t < nn && next % bs + t < bs; ++t) prefetch_row<_MM_HINT_T0>(k_next + t * stride, Dh);
    }
    const int64_t padded = (n + 7) / 8 * 8;
    for (int64_t j = 0; j < rows; ++j) {
      float* p = sc + j * kChunk;
      if (!seen[j]) {  // sees nothing here: p = 0, acc kept
        for (int64_t t = 0; t < padded; t += 8) _mm256_storeu_ps(p + t, _mm256_setzero_ps());
        alpha[j] = 1.0f;
        continue;
      }
      __m256 mx = _mm256_set1_ps(kMasked);
      for (int64_t t = 0; t < padded; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(p + t));
      const float chunk_max = hmax(mx);
      const float m_new = m[j] > chunk_max ? m[j] : chunk_max;
      const __m256 mv = _mm256_set1_ps(m_new);
      const __m256 live_min = _mm256_set1_ps(0.5f * kMasked);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t t = 0; t < padded; t += 8) {
        const __m256 s = _mm256_loadu_ps(p + t);
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(s, mv)), _mm256_cmp_ps(s, live_min, _CMP_GT_OQ));
        _mm256_storeu_ps(p + t, e);
        sum = _mm256_add_ps(sum, e);
      }
      alpha[j] = m[j] == kMasked ? 0.0f : exp1(m[j] - m_new);
      l[j] = l[j] * alpha[j] + hsum(sum);
      m[j] = m_new;
    }
    values(sc, alpha, v_cache + first, stride, n, rows, Dh, acc);
    pos += n;
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* out = a.out + ((qstart + i0 + i) * a.H + kvh * G) * Dh;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t j = i * G + g;
      const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
      for (int64_t d = 0; d < Dh; ++d) out[g * Dh + d] = acc[j * Dh + d] * inv;
    }
  }
}

}  // namespace

namespace fdx86 {

void rms_norm_avx2(const float* x, const float* residual, const float* weight, float* out, float* sum,
                   int64_t rows, int64_t d, float eps, int threads) {
  const int nt = team(threads, rows * d, rows);
  if (nt == 1) {
    for (int64_t r = 0; r < rows; ++r)
      rms_norm_row(x + r * d, residual ? residual + r * d : nullptr, weight, out + r * d,
                   sum ? sum + r * d : nullptr, d, eps);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    rms_norm_row(x + r * d, residual ? residual + r * d : nullptr, weight, out + r * d,
                 sum ? sum + r * d : nullptr, d, eps);
}

void silu_and_mul_avx2(const float* x, float* out, int64_t rows, int64_t inter, int threads) {
  const int nt = team(threads, rows * inter, rows);
  if (nt == 1) {
    for (int64_t r = 0; r < rows; ++r) silu_mul_row(x + r * 2 * inter, out + r * inter, inter);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; ++r) silu_mul_row(x + r * 2 * inter, out + r * inter, inter);
}

void rotary_avx2(const float* x, float* out, int64_t tokens, int64_t heads, int64_t dh,
                 const int64_t* positions, const float* cos_sin, int interleaved, int threads) {
  const int64_t row = heads * dh;
  const int nt = team(threads, tokens * row, tokens);
  if (nt == 1) {
    for (int64_t t = 0; t < tokens; ++t)
      rotate_token(x + t * row, out + t * row, heads, dh, cos_sin + positions[t] * dh, interleaved);
    return;
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t t = 0; t < tokens; ++t)
    rotate_token(x + t * row, out + t * row, heads, dh, cos_sin + positions[t] * dh, interleaved);
}

void write_kv_cache(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* slots,
                    int64_t tokens, int64_t row) {
  const uint64_t bytes = static_cast<uint64_t>(row) * sizeof(float);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    __builtin_memcpy(k_cache + slot * row, k + t * row, bytes);
    __builtin_memcpy(v_cache + slot * row, v + t * row, bytes);
  }
}

int64_t attention_scratch(int64_t rows, int64_t Dh) { return rows * (2 * Dh + kChunk + 8); }

void paged_attention_avx2(const AttentionArgs& a) {
  const int64_t G = a.H / a.Hkv;
  const int64_t per_thread = attention_scratch(a.tile * G, a.Dh);
  const int64_t items = a.num_items * a.Hkv;
  int64_t work = 0;  // K / V floats read, summed over work items
  for (int64_t i = 0; i < a.num_items; ++i) {
    const int64_t r = a.items[2 * i];
    const int64_t qlen = a.query_lens ? a.query_lens[r] : 1;
    const int64_t last = a.items[2 * i + 1] + a.tile < qlen ? a.items[2 * i + 1] + a.tile : qlen;
    work += a.seq_lens[r] - qlen + last;
  }
  work *= a.Hkv * a.Dh * 2;
  const int nt = team(a.threads, work, items);
  if (nt == 1) {
    for (int64_t i = 0; i < items; ++i)
      attend_item(a, a.items[2 * (i / a.Hkv)], a.items[2 * (i / a.Hkv) + 1], i % a.Hkv, a.scratch);
    return;
  }
  // With enough (request, tile) items, a thread takes all kv heads of one:
  // a token's K / V rows for every head are adjacent, so the second head
  // reads what the hardware prefetcher brought in for the first. Split by
  // head across threads, two cores stream the same lines twice (measured:
  // 2 threads slower than 1 at B=32 on Zen 4).
  const bool by_request = a.num_items >= 2 * nt;
#pragma omp parallel num_threads(nt)
  {
    float* scratch = a.scratch + per_thread * omp_get_thread_num();
    if (by_request) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < a.num_items; ++i)
        for (int64_t h = 0; h < a.Hkv; ++h) attend_item(a, a.items[2 * i], a.items[2 * i + 1], h, scratch);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < items; ++i)
        attend_item(a, a.items[2 * (i / a.Hkv)], a.items[2 * (i / a.Hkv) + 1], i % a.Hkv, scratch);
    }
  }
}

void qkv_rope_cache_avx2(const QkvArgs& a) {
  const int64_t work = a.T * (a.H + 2 * a.Hkv) * a.Dh;
  if (a.threads <= 1 || a.T < 2 || work < kParallelMin) {
    for (int64_t t = 0; t < a.T; ++t) qkv_token(a, t);
    return;
  }
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t t = 0; t < a.T; ++t) qkv_token(a, t);
}

}  // namespace fdx86
