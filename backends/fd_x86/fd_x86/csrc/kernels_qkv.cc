// The fused QKV step of an attention layer (x86_ops.cc: fd_x86_qkv_rope_cache):
// split each token's fused projection row [q | k | v], rotate q and k, and
// store k and v in their cache slot. Plain loops the compiler vectorises;
// no paddle / STL headers (kernels.h).
#include <cstdint>

#pragma GCC target("avx2,fma")

#include "ops_kernels.h"

namespace {

// Below this many floats per call the op stays on the calling thread.
constexpr int64_t kParallelMin = 1 << 15;

inline void rotate(const float* x, float* out, int64_t dh, const float* c, int interleaved) {
  const int64_t half = dh / 2;
  const float* s = c + half;
  if (interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[2 * i], x2 = x[2 * i + 1];
      out[2 * i] = x1 * c[i] - x2 * s[i];
      out[2 * i + 1] = x2 * c[i] + x1 * s[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[i + half];
      out[i] = x1 * c[i] - x2 * s[i];
      out[i + half] = x2 * c[i] + x1 * s[i];
    }
  }
}

void one_token(const fdx86::QkvArgs& a, int64_t t) {
  const int64_t dh = a.Dh, q_size = a.H * dh, kv_size = a.Hkv * dh;
  const float* row = a.qkv + t * (q_size + 2 * kv_size);
  const float* c = a.cos_sin + a.positions[t] * dh;
  float* q = a.q_out + t * q_size;
  float* k = a.k_out + t * kv_size;
  float* v = a.v_out + t * kv_size;
  for (int64_t h = 0; h < a.H; ++h) rotate(row + h * dh, q + h * dh, dh, c, a.interleaved);
  for (int64_t h = 0; h < a.Hkv; ++h) rotate(row + q_size + h * dh, k + h * dh, dh, c, a.interleaved);
  const float* v_in = row + q_size + kv_size;
  for (int64_t i = 0; i < kv_size; ++i) v[i] = v_in[i];
  const int64_t slot = a.slots[t];
  if (slot < 0) return;
  float* k_dst = a.k_cache + slot * kv_size;
  float* v_dst = a.v_cache + slot * kv_size;
  for (int64_t i = 0; i < kv_size; ++i) k_dst[i] = k[i];
  for (int64_t i = 0; i < kv_size; ++i) v_dst[i] = v[i];
}

}  // namespace

namespace fdx86 {

void qkv_rope_cache_avx2(const QkvArgs& a) {
  const int64_t work = a.T * (a.H + 2 * a.Hkv) * a.Dh;
  if (a.threads <= 1 || a.T < 2 || work < kParallelMin) {
    for (int64_t t = 0; t < a.T; ++t) one_token(a, t);
    return;
  }
#pragma omp parallel for num_threads(a.threads) schedule(static)
  for (int64_t t = 0; t < a.T; ++t) one_token(a, t);
}

}  // namespace fdx86
