// fd_x86's non-linear decode ops: norm, activation, rotary, KV-cache write,
// paged decode attention (kernels_ops.cc, compiled for AVX2 + FMA; the
// attention also in kernels_attn_avx512.cc, for AVX-512 F/BW/VL/DQ).
//
// Same rule as kernels.h: the kernel TU includes no paddle or STL headers,
// and the op (x86_ops.cc) checks shapes, allocates outputs and scratch and
// only calls in here on a CPU with AVX2 + FMA. All tensors are fp32 and
// contiguous unless a stride is given, except the KV pools, which may hold
// another KvDtype (those need AVX-512 F/BW/VL/DQ: the op checks).
#pragma once
#include <cstdint>

namespace fdx86 {

// Element type of a KV pool [S, Hkv, Dh] (fd_core.ops.kv_dtype): fp32;
// bf16 / fp16 (uint16 bit patterns); int8 codes or fp8 e4m3fn codes (uint8
// bit patterns), each with fp32 scales [S, Hkv]: x[s, h, :] ~= code * scale.
// kInt8Static (int8_static, FastDeploy's C8): int8 codes whose writes are
// clip(rint(x), -127, 127) (x already times 127 / S per channel) with scale
// 1; read exactly as kInt8.
enum class KvDtype : int { kF32 = 0, kBf16 = 1, kF16 = 2, kInt8 = 3, kFp8 = 4, kInt8Static = 5 };

inline bool kv_scaled(KvDtype dt) { return dt != KvDtype::kF32 && dt != KvDtype::kBf16 && dt != KvDtype::kF16; }

// Stores rows x [tokens, Hkv, Dh] fp32 into a non-fp32 pool at rows
// slots[t] (negative: skipped), bit-identical to fd_core.ops.kv_dtype's
// quantize: bf16 / fp16 round to nearest even; int8 / fp8 take
// scale = absmax / QMAX (127 / 448) per (token, head) in fp32 (0 for a zero
// row) and codes of x / scale (int8: half away from zero, clipped to 127;
// fp8: nearest even, saturating at 448). kernels_attn_avx512.cc (AVX-512).
void store_kv_avx512(KvDtype dt, const float* x, void* cache, float* scales, const int64_t* slots,
                     int64_t tokens, int64_t Hkv, int64_t Dh);

// out[r] = s * rsqrt(mean(s^2) + eps) * weight with s = x[r] (+ residual[r]);
// with a residual, s is also written to sum[r]. x, residual, out, sum [rows, d].
void rms_norm_avx2(const float* x, const float* residual, const float* weight, float* out, float* sum,
                   int64_t rows, int64_t d, float eps, int threads);

// x [rows, 2*inter] = [gate | up] -> out [rows, inter] = silu(gate) * up.
void silu_and_mul_avx2(const float* x, float* out, int64_t rows, int64_t inter, int threads);

// Rotates x [tokens, heads, dh] at positions [tokens] into out (same shape);
// cos_sin [*, dh] = concat(cos, sin) of dh/2 frequencies. interleaved: pairs
// (x[2i], x[2i+1]); else halves (x[i], x[i + dh/2]). Positions are checked
// by the caller.
void rotary_avx2(const float* x, float* out, int64_t tokens, int64_t heads, int64_t dh,
                 const int64_t* positions, const float* cos_sin, int interleaved, int threads);

// Copies rows k, v [tokens, row] into fp32 k_cache, v_cache [slots, row] at
// slots [tokens]; a negative slot is skipped (slots checked by the caller).
void write_kv_cache(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* slots,
                    int64_t tokens, int64_t row);

// Paged attention over the reference cache layout, for decode (one query per
// request) and prefill (a ragged chunk of queries per request, causal, after
// any context already cached). Query token i of request r sits at position
// seq_lens[r] - query_lens[r] + i and sees cache positions [0, that]; its
// row of q / out is query_starts[r] + i. Work items are (request, tile of up
// to `tile` query tokens, kv head): the tile x G query heads of a kv head
// read each K / V row once; online softmax over chunks of at most 64 tokens
// within a block; the G query heads of a kv head are processed together
// (scores two rows x 8 tokens at a time, values as rank-1 updates of a
// register tile of rows x a Dh slice). Dh % 8 == 0. The AVX-512 kernel
// runs all kv heads of an item together once there are enough items, each
// thread a contiguous range of items with a software stream prefetcher.
// A non-fp32 pool (AVX-512 only) is widened to fp32 in registers; int8 / fp8
// scales multiply the scores (K) and the softmax weights (V).
struct AttentionArgs {
  const float* q = nullptr;       // [T, H, Dh]
  const void* k_cache = nullptr;  // [num_blocks * block_size, Hkv, Dh] of kv_dtype
  const void* v_cache = nullptr;
  const float* k_scales = nullptr;  // [num_blocks * block_size, Hkv] when kv_scaled(kv_dtype)
  const float* v_scales = nullptr;
  KvDtype kv_dtype = KvDtype::kF32;
  const int64_t* block_tables = nullptr;  // [R, W] (block ids checked by the caller)
  const int64_t* seq_lens = nullptr;      // [R], each <= W * block_size
  const int64_t* query_lens = nullptr;    // [R], each in [1, seq_len]; nullptr: 1 each (decode)
  const int64_t* query_starts = nullptr;  // [R]; nullptr: r (decode)
  const int64_t* items = nullptr;         // [num_items, 2] (request, first query token) per tile
  int64_t num_items = 0;
  float* out = nullptr;  // [T, H, Dh]
  int64_t R = 0, H = 0, Hkv = 0, Dh = 0, W = 0, block_size = 0, tile = 1;
  float scale = 1.0f;
  float* scratch = nullptr;  // threads * attention_scratch(tile * H, Dh) floats
  int threads = 1;
};

// Floats of scratch one thread needs for `rows` query rows (tile x H: every
// kv head's rows at once).
int64_t attention_scratch(int64_t rows, int64_t Dh);

void paged_attention_avx2(const AttentionArgs& a);    // fp32 pools only
void paged_attention_avx512(const AttentionArgs& a);  // AVX-512 F/BW/VL/DQ, every KvDtype

// The fused QKV step (kernels_ops.cc): token t's row of qkv [T, (H + 2 Hkv) Dh]
// is [q | k | v]; q and k are rotated at positions[t] (cos_sin as for
// rotary_avx2) into q_out [T, H, Dh] and k_out [T, Hkv, Dh], v copied to
// v_out, and k_out / v_out rows stored in the caches [S, Hkv, Dh] at
// slots[t] (negative: not stored). Positions and slots checked by the caller.
// A non-fp32 pool is stored through store_kv_avx512 (AVX-512 only).
struct QkvArgs {
  const float* qkv = nullptr;
  const int64_t* positions = nullptr;
  const float* cos_sin = nullptr;
  const int64_t* slots = nullptr;
  void* k_cache = nullptr;  // of kv_dtype
  void* v_cache = nullptr;
  float* k_scales = nullptr;  // [S, Hkv] when kv_scaled(kv_dtype)
  float* v_scales = nullptr;
  KvDtype kv_dtype = KvDtype::kF32;
  float* q_out = nullptr;
  float* k_out = nullptr;
  float* v_out = nullptr;
  int64_t T = 0, H = 0, Hkv = 0, Dh = 0;
  int interleaved = 1;
  int threads = 1;
};

void qkv_rope_cache_avx2(const QkvArgs& a);

// One read of `bytes` bytes (a multiple of 64, 64-byte aligned) with 512-bit
// loads over `threads` threads: the memory floor of the benchmarks
// (kernels_attn_avx512.cc; AVX-512 F). Returns an xor of the data.
uint64_t read_memory_avx512(const void* data, int64_t bytes, int threads);

}  // namespace fdx86
