// Paddle custom operators for fd_x86's decode ops (kernels in kernels_ops.cc):
//
//   fd_x86_rms_norm(x, weight)                      -> out          x [..., D]
//   fd_x86_add_rms_norm(x, residual, weight)        -> out, x + residual
//   fd_x86_silu_and_mul(x)                          -> out          x [..., 2I] -> [..., I]
//   fd_x86_rotary(q, k, positions, cos_sin)         -> q_out, k_out [T, H(kv), Dh]
//   fd_x86_write_kv_cache(k, v, k_cache, v_cache, slots)   in place (k_cache, v_cache)
//   fd_x86_decode_attention(q, k_cache, v_cache, block_tables, seq_lens) -> out [B, H, Dh]
//   fd_x86_prefill_attention(q, k_cache, v_cache, block_tables, seq_lens, query_lens) -> out [Tp, H, Dh]
//   ..._q8 forms of the three KV ops and of fd_x86_qkv_rope_cache (below): the
//   caches are int8 / fp8 codes, with k_scales, v_scales [S, Hkv] after them
//
// Every tensor is fp32 (int64 for positions, slots, tables, lengths), on the
// CPU and contiguous (the Python side makes it so), except the KV pools
// [S, Hkv, Dh]: float32, bfloat16 or float16, or in the _q8 ops int8 codes
// (KvDtype::kInt8) or uint8 fp8 e4m3fn codes (kFp8) with fp32 scales
// (fd_core.ops.kv_dtype). A non-fp32 pool needs AVX-512 F/BW/VL/DQ. Indices
// are checked here before a kernel runs, so a bad slot / position / block id
// is an error, not a stray write. Compiled for baseline x86-64; the kernels
// need AVX2 + FMA.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cpu_features.h"
#include "moe_op.h"
#include "sample_kernels.h"
#include "sample_op.h"
#include "ops_kernels.h"
#include "packed_linear.h"
#include "paddle/extension.h"

namespace {

using fdx86::cpu_has_avx2;
using fdx86::cpu_has_avx512;

void check_f32(const char* op, const char* name, const paddle::Tensor& t) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be on the CPU");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, op, ": ", name, " must be float32");
  PD_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void check_i64(const char* op, const char* name, const paddle::Tensor& t) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be on the CPU");
  PD_CHECK(t.dtype() == paddle::DataType::INT64, op, ": ", name, " must be int64");
  PD_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

void check_isa(const char* op) {
  PD_CHECK(cpu_has_avx2(), op, ": needs AVX2 + FMA, which this CPU lacks; use fd-core's cpu backend");
}

int64_t last_dim(const paddle::Tensor& t) { return t.shape().empty() ? 1 : t.shape().back(); }

// One layer's K or V pool [S, Hkv, Dh] as the kernels see it, checked.
struct KvPool {
  void* data = nullptr;
  float* scales = nullptr;  // [S, Hkv] for int8 / fp8 codes
  fdx86::KvDtype dtype = fdx86::KvDtype::kF32;
  std::vector<int64_t> shape;
};

const char* kv_name(fdx86::KvDtype dt) {
  switch (dt) {
    case fdx86::KvDtype::kF32: return "float32";
    case fdx86::KvDtype::kBf16: return "bfloat16";
    case fdx86::KvDtype::kF16: return "float16";
    case fdx86::KvDtype::kInt8: return "int8";
    case fdx86::KvDtype::kFp8: return "fp8";
    case fdx86::KvDtype::kInt8Static: return "int8_static";
  }
  return "?";
}

// scales == nullptr: a float32 / bfloat16 / float16 pool; else int8 codes
// (int8) or fp8 e4m3fn codes (uint8) with their fp32 scales [S, Hkv].
KvPool kv_pool(const char* op, const char* name, const paddle::Tensor& cache, const paddle::Tensor* scales) {
  using DT = paddle::DataType;
  PD_CHECK(cache.is_cpu() && cache.is_contiguous(), op, ": ", name, " must be a contiguous CPU tensor");
  PD_CHECK(cache.shape().size() == 3, op, ": ", name, " must be [S, Hkv, Dh]");
  KvPool p;
  p.shape = cache.shape();
  const DT dt = cache.dtype();
  if (scales == nullptr) {
    PD_CHECK(dt == DT::FLOAT32 || dt == DT::BFLOAT16 || dt == DT::FLOAT16, op, ": ", name,
             " must be float32, bfloat16 or float16 (int8 / fp8 codes: the _q8 op, with their scales)");
    p.dtype = dt == DT::FLOAT32 ? fdx86::KvDtype::kF32 : dt == DT::BFLOAT16 ? fdx86::KvDtype::kBf16
                                                                          : fdx86::KvDtype::kF16;
  } else {
    PD_CHECK(dt == DT::INT8 || dt == DT::UINT8, op, ": ", name,
             " must hold int8 codes (int8) or fp8 e4m3fn codes (uint8)");
    p.dtype = dt == DT::INT8 ? fdx86::KvDtype::kInt8 : fdx86::KvDtype::kFp8;
    check_f32(op, "scales", *scales);
    PD_CHECK(scales->shape() == std::vector<int64_t>({p.shape[0], p.shape[1]}), op, ": ", name,
             "'s scales must be [S, Hkv] = [", p.shape[0], ", ", p.shape[1], "]");
    p.scales = const_cast<float*>(scales->data<float>());
  }
  PD_CHECK(p.dtype == fdx86::KvDtype::kF32 || cpu_has_avx512(), op, ": a ", kv_name(p.dtype),
           " KV pool needs AVX-512 F/BW/VL/DQ, which this CPU lacks; fd-core's reference reads it");
  p.data = const_cast<void*>(cache.data());
  return p;
}

// The K and V pools of one layer: same dtype, same shape.
void check_pair(const char* op, const KvPool& k, const KvPool& v) {
  PD_CHECK(k.dtype == v.dtype && k.shape == v.shape, op, ": the K and V pools differ (", kv_name(k.dtype), " vs ",
           kv_name(v.dtype), " or in shape)");
}

std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x, const paddle::Tensor& weight, float eps, int threads) {
  const char* op = "fd_x86_rms_norm";
  check_isa(op);
  check_f32(op, "x", x);
  check_f32(op, "weight", weight);
  const int64_t d = last_dim(x);
  PD_CHECK(weight.numel() == d, op, ": weight has ", weight.numel(), " values, x's last axis ", d);
  paddle::Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (x.numel() > 0)
    fdx86::rms_norm_avx2(x.data<float>(), nullptr, weight.data<float>(), out.data<float>(), nullptr,
                         x.numel() / d, d, eps, threads);
  return {out};
}

std::vector<paddle::Tensor> AddRmsNorm(const paddle::Tensor& x, const paddle::Tensor& residual,
                                       const paddle::Tensor& weight, float eps, int threads) {
  const char* op = "fd_x86_add_rms_norm";
  check_isa(op);
  check_f32(op, "x", x);
  check_f32(op, "residual", residual);
  check_f32(op, "weight", weight);
  const int64_t d = last_dim(x);
  PD_CHECK(weight.numel() == d, op, ": weight has ", weight.numel(), " values, x's last axis ", d);
  PD_CHECK(residual.shape() == x.shape(), op, ": residual's shape differs from x's");
  paddle::Tensor out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor sum = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (x.numel() > 0)
    fdx86::rms_norm_avx2(x.data<float>(), residual.data<float>(), weight.data<float>(), out.data<float>(),
                         sum.data<float>(), x.numel() / d, d, eps, threads);
  return {out, sum};
}

std::vector<paddle::Tensor> SiluAndMul(const paddle::Tensor& x, int threads) {
  const char* op = "fd_x86_silu_and_mul";
  check_isa(op);
  check_f32(op, "x", x);
  PD_CHECK(!x.shape().empty() && last_dim(x) % 2 == 0, op, ": x's last axis must be even");
  std::vector<int64_t> shape = x.shape();
  shape.back() /= 2;
  paddle::Tensor out = paddle::empty(shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t inter = shape.back();
  if (x.numel() > 0) fdx86::silu_and_mul_avx2(x.data<float>(), out.data<float>(), x.numel() / (2 * inter), inter, threads);
  return {out};
}

std::vector<paddle::Tensor> Rotary(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& positions,
                                   const paddle::Tensor& cos_sin, bool interleaved, int threads) {
  const char* op = "fd_x86_rotary";
  check_isa(op);
  check_f32(op, "q", q);
  check_f32(op, "k", k);
  check_i64(op, "positions", positions);
  check_f32(op, "cos_sin", cos_sin);
  PD_CHECK(q.shape().size() == 3 && k.shape().size() == 3, op, ": q and k must be [T, heads, Dh]");
  PD_CHECK(cos_sin.shape().size() == 2, op, ": cos_sin must be [max_pos, Dh]");
  const int64_t tokens = q.shape()[0], dh = q.shape()[2], max_pos = cos_sin.shape()[0];
  PD_CHECK(k.shape()[0] == tokens && positions.numel() == tokens, op, ": q, k and positions disagree on T");
  PD_CHECK(k.shape()[2] == dh && cos_sin.shape()[1] == dh && dh % 2 == 0, op,
           ": q, k and cos_sin must share an even Dh");
  const int64_t* pos = positions.data<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    PD_CHECK(pos[t] >= 0 && pos[t] < max_pos, op, ": position ", pos[t], " is outside the table [0, ", max_pos, ")");
  paddle::Tensor q_out = paddle::empty(q.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor k_out = paddle::empty(k.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (tokens > 0) {
    fdx86::rotary_avx2(q.data<float>(), q_out.data<float>(), tokens, q.shape()[1], dh, pos, cos_sin.data<float>(),
                       interleaved, threads);
    fdx86::rotary_avx2(k.data<float>(), k_out.data<float>(), tokens, k.shape()[1], dh, pos, cos_sin.data<float>(),
                       interleaved, threads);
  }
  return {q_out, k_out};
}

// k, v [T, Hkv, Dh] fp32 into the pools at slots (negative: skipped),
// rounded / quantized to the pools' dtype.
void write_kv(const char* op, const paddle::Tensor& k, const paddle::Tensor& v, const KvPool& kp, const KvPool& vp,
              const paddle::Tensor& slots) {
  check_f32(op, "k", k);
  check_f32(op, "v", v);
  check_i64(op, "slot_mapping", slots);
  check_pair(op, kp, vp);
  PD_CHECK(k.shape() == v.shape(), op, ": k and v differ in shape");
  PD_CHECK(k.shape().size() == 3, op, ": k must be [T, Hkv, Dh], the caches [S, Hkv, Dh]");
  PD_CHECK(k.shape()[1] == kp.shape[1] && k.shape()[2] == kp.shape[2], op, ": k's [Hkv, Dh] differs from the cache's");
  const int64_t tokens = k.shape()[0], rows = kp.shape[0];
  PD_CHECK(slots.numel() == tokens, op, ": slot_mapping has ", slots.numel(), " slots for ", tokens, " tokens");
  const int64_t* s = slots.data<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    PD_CHECK(s[t] < rows, op, ": slot ", s[t], " is past the cache's ", rows, " rows");
  if (kp.dtype == fdx86::KvDtype::kF32) {
    fdx86::write_kv_cache(k.data<float>(), v.data<float>(), static_cast<float*>(kp.data),
                          static_cast<float*>(vp.data), s, tokens, k.shape()[1] * k.shape()[2]);
    return;
  }
  fdx86::store_kv_avx512(kp.dtype, k.data<float>(), kp.data, kp.scales, s, tokens, kp.shape[1], kp.shape[2]);
  fdx86::store_kv_avx512(vp.dtype, v.data<float>(), vp.data, vp.scales, s, tokens, vp.shape[1], vp.shape[2]);
}

void WriteKVCache(const paddle::Tensor& k, const paddle::Tensor& v, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
                  const paddle::Tensor& slots) {
  const char* op = "fd_x86_write_kv_cache";
  write_kv(op, k, v, kv_pool(op, "k_cache", k_cache, nullptr), kv_pool(op, "v_cache", v_cache, nullptr), slots);
}

// int8_static pools (fd_core.ops.kv_dtype): k, v already times 127 / S per channel;
// codes clip(rint(x)), scales 1. Attention reads such a pool through the _q8 ops.
void WriteKVCacheI8S(const paddle::Tensor& k, const paddle::Tensor& v, paddle::Tensor& k_cache,
                     paddle::Tensor& v_cache, paddle::Tensor& k_scales, paddle::Tensor& v_scales,
                     const paddle::Tensor& slots) {
  const char* op = "fd_x86_write_kv_cache_i8s";
  PD_CHECK(k_cache.dtype() == paddle::DataType::INT8 && v_cache.dtype() == paddle::DataType::INT8, op,
           ": int8_static pools hold int8 codes");
  KvPool kp = kv_pool(op, "k_cache", k_cache, &k_scales), vp = kv_pool(op, "v_cache", v_cache, &v_scales);
  kp.dtype = vp.dtype = fdx86::KvDtype::kInt8Static;
  write_kv(op, k, v, kp, vp, slots);
}

void WriteKVCacheQ8(const paddle::Tensor& k, const paddle::Tensor& v, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
                    paddle::Tensor& k_scales, paddle::Tensor& v_scales, const paddle::Tensor& slots) {
  const char* op = "fd_x86_write_kv_cache_q8";
  write_kv(op, k, v, kv_pool(op, "k_cache", k_cache, &k_scales), kv_pool(op, "v_cache", v_cache, &v_scales), slots);
}

// Checks shared by the attention ops; fills a's shapes and pointers. This form takes the block
// tables [requests, W] and seq_lens [requests] as pointers (fd_x86_decoder_layers reads them from
// its step ints); the tensor form below checks their tensors first.
void prepare_attention_pools(const char* op, const paddle::Tensor& q, const KvPool& kp, const KvPool& vp,
                             const int64_t* block_tables, int64_t W, const int64_t* seq_lens, int64_t requests,
                             int64_t block_size, float scale, int threads, fdx86::AttentionArgs* a) {
  check_isa(op);
  check_f32(op, "q", q);
  check_pair(op, kp, vp);
  PD_CHECK(q.shape().size() == 3, op, ": q must be [T, H, Dh], the caches [S, Hkv, Dh] alike");
  const std::vector<int64_t>& cache_shape = kp.shape;
  a->H = q.shape()[1];
  a->Dh = q.shape()[2];
  a->Hkv = cache_shape[1];
  a->W = W;
  a->R = requests;
  a->block_size = block_size;
  a->scale = scale;
  a->threads = threads < 1 ? 1 : threads;
  PD_CHECK(cache_shape[2] == a->Dh && a->Dh % 8 == 0, op, ": Dh must match the cache's and be a multiple of 8");
  PD_CHECK(a->Hkv > 0 && a->H % a->Hkv == 0, op, ": H = ", a->H, " is not a multiple of Hkv = ", a->Hkv);
  PD_CHECK(block_size > 0 && cache_shape[0] % block_size == 0, op, ": the cache's ", cache_shape[0],
           " rows are not whole blocks of ", block_size);
  const int64_t num_blocks = cache_shape[0] / block_size;
  a->block_tables = block_tables;
  a->seq_lens = seq_lens;
  for (int64_t r = 0; r < requests; ++r) {
    const int64_t len = a->seq_lens[r];
    PD_CHECK(len >= 0 && len <= a->W * block_size && len < (int64_t{1} << 31), op, ": request ", r, " has ", len,
             " tokens, its table holds ", a->W * block_size);
    for (int64_t j = 0; j < (len + block_size - 1) / block_size; ++j) {
      const int64_t blk = a->block_tables[r * a->W + j];
      PD_CHECK(blk >= 0 && blk < num_blocks, op, ": request ", r, " names block ", blk, " of ", num_blocks);
    }
  }
  a->q = q.data<float>();
  a->k_cache = kp.data;
  a->v_cache = vp.data;
  a->k_scales = kp.scales;
  a->v_scales = vp.scales;
  a->kv_dtype = kp.dtype;
}

void prepare_attention_pools(const char* op, const paddle::Tensor& q, const KvPool& kp, const KvPool& vp,
                             const paddle::Tensor& block_tables, const paddle::Tensor& seq_lens, int64_t requests,
                             int64_t block_size, float scale, int threads, fdx86::AttentionArgs* a) {
  check_i64(op, "block_tables", block_tables);
  check_i64(op, "seq_lens", seq_lens);
  PD_CHECK(block_tables.shape().size() == 2, op, ": block_tables must be [R, W]");
  PD_CHECK(block_tables.shape()[0] >= requests && seq_lens.numel() >= requests, op,
           ": block_tables / seq_lens cover fewer than ", requests, " requests");
  prepare_attention_pools(op, q, kp, vp, block_tables.data<int64_t>(), block_tables.shape()[1],
                          seq_lens.data<int64_t>(), requests, block_size, scale, threads, a);
}

// The fp32 form (fd_x86_decoder_layers reads fp32 pools only).
void prepare_attention(const char* op, const paddle::Tensor& q, const paddle::Tensor& k_cache,
                       const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                       const paddle::Tensor& seq_lens, int64_t requests, int64_t block_size, float scale,
                       int threads, fdx86::AttentionArgs* a) {
  check_f32(op, "k_cache", k_cache);
  check_f32(op, "v_cache", v_cache);
  prepare_attention_pools(op, q, kv_pool(op, "k_cache", k_cache, nullptr), kv_pool(op, "v_cache", v_cache, nullptr),
                          block_tables, seq_lens, requests, block_size, scale, threads, a);
}

// The attention kernel: AVX-512 where the CPU has it, else AVX2.
// FD_X86_ATTENTION_ISA=avx2 forces the AVX2 one (tests, comparisons) for
// fp32 pools (the others have only the AVX-512 kernel); =avx512 on a CPU
// without it is an error.
bool attention_avx512(const char* op) {
  const char* isa = std::getenv("FD_X86_ATTENTION_ISA");
  if (isa != nullptr && std::strcmp(isa, "avx2") == 0) return false;
  if (isa != nullptr && std::strcmp(isa, "avx512") == 0)
    PD_CHECK(cpu_has_avx512(), op, ": FD_X86_ATTENTION_ISA=avx512, but this CPU lacks AVX-512 F/BW/VL/DQ");
  return cpu_has_avx512();
}

void run_attention(const char* op, fdx86::AttentionArgs* a, const std::vector<int64_t>& items, float* out) {
  a->items = items.data();
  a->num_items = static_cast<int64_t>(items.size() / 2);
  a->out = out;
  if (a->num_items == 0) return;
  std::vector<float> scratch(a->threads * fdx86::attention_scratch(a->tile * a->H, a->Dh));
  a->scratch = scratch.data();
  if (a->kv_dtype != fdx86::KvDtype::kF32 || attention_avx512(op))
    fdx86::paged_attention_avx512(*a);
  else
    fdx86::paged_attention_avx2(*a);
}

paddle::Tensor decode_attention(const char* op, const paddle::Tensor& q, const KvPool& kp, const KvPool& vp,
                                const paddle::Tensor& block_tables, const paddle::Tensor& seq_lens,
                                int64_t block_size, float scale, int threads) {
  fdx86::AttentionArgs a;
  const int64_t batch = q.shape().empty() ? 0 : q.shape()[0];
  prepare_attention_pools(op, q, kp, vp, block_tables, seq_lens, batch, block_size, scale, threads, &a);
  for (int64_t b = 0; b < batch; ++b) PD_CHECK(a.seq_lens[b] >= 1, op, ": request ", b, " has no cached tokens");
  std::vector<int64_t> items(2 * batch);
  for (int64_t b = 0; b < batch; ++b) items[2 * b] = b, items[2 * b + 1] = 0;
  paddle::Tensor out = paddle::empty(q.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  run_attention(op, &a, items, out.data<float>());
  return out;
}

std::vector<paddle::Tensor> DecodeAttention(const paddle::Tensor& q, const paddle::Tensor& k_cache,
                                            const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                                            const paddle::Tensor& seq_lens, int64_t block_size, float scale,
                                            int threads) {
  const char* op = "fd_x86_decode_attention";
  return {decode_attention(op, q, kv_pool(op, "k_cache", k_cache, nullptr), kv_pool(op, "v_cache", v_cache, nullptr),
                           block_tables, seq_lens, block_size, scale, threads)};
}

std::vector<paddle::Tensor> DecodeAttentionQ8(const paddle::Tensor& q, const paddle::Tensor& k_cache,
                                              const paddle::Tensor& v_cache, const paddle::Tensor& k_scales,
                                              const paddle::Tensor& v_scales, const paddle::Tensor& block_tables,
                                              const paddle::Tensor& seq_lens, int64_t block_size, float scale,
                                              int threads) {
  const char* op = "fd_x86_decode_attention_q8";
  return {decode_attention(op, q, kv_pool(op, "k_cache", k_cache, &k_scales),
                           kv_pool(op, "v_cache", v_cache, &v_scales), block_tables, seq_lens, block_size, scale,
                           threads)};
}

// Query tokens per prefill work item: about 32 query rows (tile x G).
constexpr int64_t kPrefillRows = 32;

paddle::Tensor prefill_attention(const char* op, const paddle::Tensor& q, const KvPool& kp, const KvPool& vp,
                                 const paddle::Tensor& block_tables, const paddle::Tensor& seq_lens,
                                 const paddle::Tensor& query_lens, int64_t block_size, float scale, int threads) {
  check_i64(op, "query_lens", query_lens);
  fdx86::AttentionArgs a;
  const int64_t requests = query_lens.numel();
  prepare_attention_pools(op, q, kp, vp, block_tables, seq_lens, requests, block_size, scale, threads, &a);
  const int64_t* qlens = query_lens.data<int64_t>();
  const int64_t G = a.H / a.Hkv;
  a.tile = G >= kPrefillRows ? 1 : kPrefillRows / G;
  std::vector<int64_t> starts(requests), items;
  int64_t total = 0;
  for (int64_t r = 0; r < requests; ++r) {
    PD_CHECK(qlens[r] >= 1 && qlens[r] <= a.seq_lens[r], op, ": request ", r, " has ", qlens[r],
             " new tokens and ", a.seq_lens[r], " in the cache");
    starts[r] = total;
    total += qlens[r];
    for (int64_t i = 0; i < qlens[r]; i += a.tile) items.push_back(r), items.push_back(i);
  }
  PD_CHECK(total == q.shape()[0], op, ": query_lens sum to ", total, ", q has ", q.shape()[0], " tokens");
  a.query_lens = qlens;
  a.query_starts = starts.data();
  paddle::Tensor out = paddle::empty(q.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  run_attention(op, &a, items, out.data<float>());
  return out;
}

std::vector<paddle::Tensor> PrefillAttention(const paddle::Tensor& q, const paddle::Tensor& k_cache,
                                             const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                                             const paddle::Tensor& seq_lens, const paddle::Tensor& query_lens,
                                             int64_t block_size, float scale, int threads) {
  const char* op = "fd_x86_prefill_attention";
  return {prefill_attention(op, q, kv_pool(op, "k_cache", k_cache, nullptr),
                            kv_pool(op, "v_cache", v_cache, nullptr), block_tables, seq_lens, query_lens,
                            block_size, scale, threads)};
}

std::vector<paddle::Tensor> PrefillAttentionQ8(const paddle::Tensor& q, const paddle::Tensor& k_cache,
                                               const paddle::Tensor& v_cache, const paddle::Tensor& k_scales,
                                               const paddle::Tensor& v_scales, const paddle::Tensor& block_tables,
                                               const paddle::Tensor& seq_lens, const paddle::Tensor& query_lens,
                                               int64_t block_size, float scale, int threads) {
  const char* op = "fd_x86_prefill_attention_q8";
  return {prefill_attention(op, q, kv_pool(op, "k_cache", k_cache, &k_scales),
                            kv_pool(op, "v_cache", v_cache, &v_scales), block_tables, seq_lens, query_lens,
                            block_size, scale, threads)};
}

using Shapes = std::vector<std::vector<int64_t>>;
using Dtypes = std::vector<paddle::DataType>;

Shapes SameShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) { return {x}; }
Shapes SameShape2(const std::vector<int64_t>& x, const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {x, x};
}
Shapes HalfLast(const std::vector<int64_t>& x) {
  std::vector<int64_t> s = x;
  if (!s.empty()) s.back() /= 2;
  return {s};
}
Shapes RotaryShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k, const std::vector<int64_t>&,
                   const std::vector<int64_t>&) {
  return {q, k};
}
Shapes DecodeShape(const std::vector<int64_t>& q, const std::vector<int64_t>&, const std::vector<int64_t>&,
                   const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {q};
}
Shapes PrefillShape(const std::vector<int64_t>& q, const std::vector<int64_t>&, const std::vector<int64_t>&,
                    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {q};
}
using Shape = std::vector<int64_t>;
Shapes DecodeShapeQ8(const Shape& q, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&) { return {q}; }
Shapes PrefillShapeQ8(const Shape& q, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&) { return {q}; }
Dtypes F32x1(const paddle::DataType&) { return {paddle::DataType::FLOAT32}; }
Dtypes F32x1e(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) { return {paddle::DataType::FLOAT32}; }
Dtypes F32x1f(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) { return {paddle::DataType::FLOAT32}; }
Dtypes F32x1b(const paddle::DataType&, const paddle::DataType&) { return {paddle::DataType::FLOAT32}; }
Dtypes F32x2(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}
Dtypes F32x2b(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}
Dtypes F32x1c(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
              const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}
Dtypes F32x1d(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
              const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

}  // namespace

namespace {

// fd_x86_read_memory(data uint8 [n]) -> int64 [1]: the xor of one read of data's
// whole 64-byte lines (the benchmarks' memory floor; AVX-512 CPUs only).
std::vector<paddle::Tensor> ReadMemory(const paddle::Tensor& data, int threads) {
  const char* op = "fd_x86_read_memory";
  PD_CHECK(cpu_has_avx512(), op, ": needs AVX-512 F/BW/VL/DQ");
  PD_CHECK(data.is_cpu() && data.is_contiguous() && data.dtype() == paddle::DataType::UINT8, op,
           ": data must be a contiguous uint8 CPU tensor");
  const auto address = reinterpret_cast<uintptr_t>(data.data());
  const int64_t skip = static_cast<int64_t>((64 - address % 64) % 64);
  const int64_t bytes = std::max<int64_t>(0, data.numel() - skip) / 64 * 64;
  paddle::Tensor out = paddle::empty({1}, paddle::DataType::INT64, paddle::CPUPlace());
  out.data<int64_t>()[0] = static_cast<int64_t>(
      fdx86::read_memory_avx512(static_cast<const uint8_t*>(data.data()) + skip, bytes, threads));
  return {out};
}

std::vector<std::vector<int64_t>> ReadMemoryShape(const std::vector<int64_t>&) { return {{1}}; }
std::vector<paddle::DataType> ReadMemoryDtype(const paddle::DataType&) { return {paddle::DataType::INT64}; }

}  // namespace

PD_BUILD_OP(fd_x86_read_memory)
    .Inputs({"Data"})
    .Outputs({"Checksum"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(ReadMemory))
    .SetInferShapeFn(PD_INFER_SHAPE(ReadMemoryShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(ReadMemoryDtype));

PD_BUILD_OP(fd_x86_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"eps: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(RmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(SameShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x1b));

PD_BUILD_OP(fd_x86_add_rms_norm)
    .Inputs({"X", "Residual", "Weight"})
    .Outputs({"Out", "Sum"})
    .Attrs({"eps: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(AddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(SameShape2))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x2));

PD_BUILD_OP(fd_x86_silu_and_mul)
    .Inputs({"X"})
    .Outputs({"Out"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(SiluAndMul))
    .SetInferShapeFn(PD_INFER_SHAPE(HalfLast))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x1));

PD_BUILD_OP(fd_x86_rotary)
    .Inputs({"Q", "K", "Positions", "CosSin"})
    .Outputs({"QOut", "KOut"})
    .Attrs({"interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(Rotary))
    .SetInferShapeFn(PD_INFER_SHAPE(RotaryShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x2b));

PD_BUILD_OP(fd_x86_write_kv_cache)
    .Inputs({"K", "V", "KCache", "VCache", "Slots"})
    .Outputs({"KCacheOut", "VCacheOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .SetKernelFn(PD_KERNEL(WriteKVCache));

PD_BUILD_OP(fd_x86_write_kv_cache_q8)
    .Inputs({"K", "V", "KCache", "VCache", "KScales", "VScales", "Slots"})
    .Outputs({"KCacheOut", "VCacheOut", "KScalesOut", "VScalesOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}, {"KScales", "KScalesOut"},
                    {"VScales", "VScalesOut"}})
    .SetKernelFn(PD_KERNEL(WriteKVCacheQ8));

PD_BUILD_OP(fd_x86_write_kv_cache_i8s)
    .Inputs({"K", "V", "KCache", "VCache", "KScales", "VScales", "Slots"})
    .Outputs({"KCacheOut", "VCacheOut", "KScalesOut", "VScalesOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}, {"KScales", "KScalesOut"},
                    {"VScales", "VScalesOut"}})
    .SetKernelFn(PD_KERNEL(WriteKVCacheI8S));

PD_BUILD_OP(fd_x86_decode_attention)
    .Inputs({"Q", "KCache", "VCache", "BlockTables", "SeqLens"})
    .Outputs({"Out"})
    .Attrs({"block_size: int64_t", "scale: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(DecodeAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x1c));

PD_BUILD_OP(fd_x86_prefill_attention)
    .Inputs({"Q", "KCache", "VCache", "BlockTables", "SeqLens", "QueryLens"})
    .Outputs({"Out"})
    .Attrs({"block_size: int64_t", "scale: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(PrefillAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(PrefillShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x1d));

PD_BUILD_OP(fd_x86_decode_attention_q8)
    .Inputs({"Q", "KCache", "VCache", "KScales", "VScales", "BlockTables", "SeqLens"})
    .Outputs({"Out"})
    .Attrs({"block_size: int64_t", "scale: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(DecodeAttentionQ8))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeShapeQ8))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x1e));

PD_BUILD_OP(fd_x86_prefill_attention_q8)
    .Inputs({"Q", "KCache", "VCache", "KScales", "VScales", "BlockTables", "SeqLens", "QueryLens"})
    .Outputs({"Out"})
    .Attrs({"block_size: int64_t", "scale: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(PrefillAttentionQ8))
    .SetInferShapeFn(PD_INFER_SHAPE(PrefillShapeQ8))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x1f));

// ------------------------------------------------- fused QKV -> rope -> cache
//
//   fd_x86_qkv_rope_cache(qkv, positions, cos_sin, slots, k_cache, v_cache)
//       -> q [T, H, Dh], k [T, Hkv, Dh], v [T, Hkv, Dh]
//   fd_x86_qkv_rope_cache_q8(qkv, positions, cos_sin, slots, k_cache, v_cache, k_scales, v_scales)
//       the same over int8 / fp8 pools (their scales written with the codes)
//
// qkv [T, (H + 2 Hkv) Dh] is an attention layer's fused projection; q and k
// come back rotated, and k / v are also stored in the caches at slots (-1:
// not stored). The caches are written through their data pointers (paddle
// sees them as inputs): they are never part of an autograd graph.
namespace {

void check_positions_and_slots(const char* op, const int64_t* pos, const int64_t* slot, int64_t tokens,
                               int64_t max_pos, int64_t rows) {
  for (int64_t t = 0; t < tokens; ++t) {
    PD_CHECK(pos[t] >= 0 && pos[t] < max_pos, op, ": position ", pos[t], " is outside the table [0, ", max_pos, ")");
    PD_CHECK(slot[t] < rows, op, ": slot ", slot[t], " is past the cache's ", rows, " rows");
  }
}

std::vector<paddle::Tensor> qkv_rope_cache(const char* op, const paddle::Tensor& qkv, const paddle::Tensor& positions,
                                           const paddle::Tensor& cos_sin, const paddle::Tensor& slots,
                                           const KvPool& kp, const KvPool& vp, int64_t num_heads,
                                           int64_t num_kv_heads, bool interleaved, int threads) {
  check_isa(op);
  check_f32(op, "qkv", qkv);
  check_i64(op, "positions", positions);
  check_f32(op, "cos_sin", cos_sin);
  check_i64(op, "slot_mapping", slots);
  check_pair(op, kp, vp);
  const std::vector<int64_t>& cache_shape = kp.shape;
  PD_CHECK(qkv.shape().size() == 2, op, ": qkv must be [T, (H + 2 Hkv) * Dh]");
  PD_CHECK(cos_sin.shape().size() == 2, op, ": cos_sin must be [max_pos, Dh] and the caches [S, Hkv, Dh] alike");
  const int64_t tokens = qkv.shape()[0], dh = cos_sin.shape()[1], max_pos = cos_sin.shape()[0];
  PD_CHECK(num_heads > 0 && num_kv_heads > 0 && dh % 2 == 0, op, ": bad heads ", num_heads, "/", num_kv_heads,
           " or odd Dh ", dh);
  PD_CHECK(qkv.shape()[1] == (num_heads + 2 * num_kv_heads) * dh, op, ": qkv has ", qkv.shape()[1],
           " columns, expected (", num_heads, " + 2 * ", num_kv_heads, ") * ", dh);
  PD_CHECK(cache_shape[1] == num_kv_heads && cache_shape[2] == dh, op, ": the caches' [Hkv, Dh] are [",
           cache_shape[1], ", ", cache_shape[2], "], expected [", num_kv_heads, ", ", dh, "]");
  PD_CHECK(positions.numel() == tokens && slots.numel() == tokens, op, ": qkv has ", tokens, " tokens, positions ",
           positions.numel(), ", slot_mapping ", slots.numel());
  const int64_t* pos = positions.data<int64_t>();
  const int64_t* slot = slots.data<int64_t>();
  check_positions_and_slots(op, pos, slot, tokens, max_pos, cache_shape[0]);
  paddle::Tensor q = paddle::empty({tokens, num_heads, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor k = paddle::empty({tokens, num_kv_heads, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor v = paddle::empty({tokens, num_kv_heads, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  fdx86::QkvArgs a;
  a.qkv = qkv.data<float>();
  a.positions = pos;
  a.cos_sin = cos_sin.data<float>();
  a.slots = slot;
  a.k_cache = kp.data;
  a.v_cache = vp.data;
  a.k_scales = kp.scales;
  a.v_scales = vp.scales;
  a.kv_dtype = kp.dtype;
  a.q_out = q.data<float>();
  a.k_out = k.data<float>();
  a.v_out = v.data<float>();
  a.T = tokens;
  a.H = num_heads;
  a.Hkv = num_kv_heads;
  a.Dh = dh;
  a.interleaved = interleaved ? 1 : 0;
  a.threads = threads < 1 ? 1 : threads;
  if (tokens > 0) fdx86::qkv_rope_cache_avx2(a);
  return {q, k, v};
}

std::vector<paddle::Tensor> QkvRopeCache(const paddle::Tensor& qkv, const paddle::Tensor& positions,
                                         const paddle::Tensor& cos_sin, const paddle::Tensor& slots,
                                         const paddle::Tensor& k_cache, const paddle::Tensor& v_cache,
                                         int64_t num_heads, int64_t num_kv_heads, bool interleaved, int threads) {
  const char* op = "fd_x86_qkv_rope_cache";
  return qkv_rope_cache(op, qkv, positions, cos_sin, slots, kv_pool(op, "k_cache", k_cache, nullptr),
                        kv_pool(op, "v_cache", v_cache, nullptr), num_heads, num_kv_heads, interleaved, threads);
}

std::vector<paddle::Tensor> QkvRopeCacheQ8(const paddle::Tensor& qkv, const paddle::Tensor& positions,
                                           const paddle::Tensor& cos_sin, const paddle::Tensor& slots,
                                           const paddle::Tensor& k_cache, const paddle::Tensor& v_cache,
                                           const paddle::Tensor& k_scales, const paddle::Tensor& v_scales,
                                           int64_t num_heads, int64_t num_kv_heads, bool interleaved, int threads) {
  const char* op = "fd_x86_qkv_rope_cache_q8";
  return qkv_rope_cache(op, qkv, positions, cos_sin, slots, kv_pool(op, "k_cache", k_cache, &k_scales),
                        kv_pool(op, "v_cache", v_cache, &v_scales), num_heads, num_kv_heads, interleaved, threads);
}

std::vector<std::vector<int64_t>> QkvShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>&,
                                           const std::vector<int64_t>& cos_sin, const std::vector<int64_t>&,
                                           const std::vector<int64_t>&, const std::vector<int64_t>&,
                                           int64_t num_heads, int64_t num_kv_heads) {
  const int64_t dh = cos_sin.size() == 2 ? cos_sin[1] : -1;
  return {{qkv[0], num_heads, dh}, {qkv[0], num_kv_heads, dh}, {qkv[0], num_kv_heads, dh}};
}

std::vector<paddle::DataType> F32x3(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
                                    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

std::vector<std::vector<int64_t>> QkvShapeQ8(const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>& cos_sin,
                                             const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t num_heads, int64_t num_kv_heads) {
  const int64_t dh = cos_sin.size() == 2 ? cos_sin[1] : -1;
  return {{qkv[0], num_heads, dh}, {qkv[0], num_kv_heads, dh}, {qkv[0], num_kv_heads, dh}};
}

std::vector<paddle::DataType> F32x3q8(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_qkv_rope_cache)
    .Inputs({"QKV", "Positions", "CosSin", "Slots", "KCache", "VCache"})
    .Outputs({"Q", "K", "V"})
    .Attrs({"num_heads: int64_t", "num_kv_heads: int64_t", "interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(QkvRopeCache))
    .SetInferShapeFn(PD_INFER_SHAPE(QkvShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x3));

PD_BUILD_OP(fd_x86_qkv_rope_cache_q8)
    .Inputs({"QKV", "Positions", "CosSin", "Slots", "KCache", "VCache", "KScales", "VScales"})
    .Outputs({"Q", "K", "V"})
    .Attrs({"num_heads: int64_t", "num_kv_heads: int64_t", "interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(QkvRopeCacheQ8))
    .SetInferShapeFn(PD_INFER_SHAPE(QkvShapeQ8))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x3q8));

// ----------------------------------------------------------- decoder layers
//
//   fd_x86_decoder_layers(hidden, residual, cos_sin, step_ints, ids, embed_table,
//                         norms[2L], k_caches[L], v_caches[L], k_scales[L], v_scales[L],
//                         weights[2 n], moe_tensors[10 M], final_norm, head[2]) -> hidden, residual
//   step_ints [3 T + T W] int64: the T tokens' positions, cache slots and sequence lengths, then
//   their block tables [T, W] (AttentionMetadata.decode_ints); embed: the run starts at the token
//   embedding, the rows ids [T] of embed_table [V, D] (fp32, bf16 or fp16) in fp32 (hidden unused)
//   kinds[L]: each layer's kind, 0 dense (4 linears), 1 attention only (2: qkv, o; the last layer
//   only), 2 MoE (2 linears, then its MoE block); n linears in all: methods / out_features /
//   group_sizes [n]; M MoE layers: moe_ints [11 M], moe_norm_min [M]; head_method >= 0: the run
//   ends with the model's head (final_norm [D] with head_eps, the LM head (packed, scales) of
//   head_out outputs and its kernel code and group) and returns the logits [T, head_out] first
//
// A run of L consecutive pre-norm decoder layers of a decode step (one token
// per request, T requests), in one call. Each layer: RMSNorm (with the
// residual add; in the first layer, when has_residual is false, residual =
// hidden), the packed QKV projection, rotary + KV-cache store, paged decode
// attention, the O projection, the second RMSNorm with its residual add, the
// packed up_gate projection, SiLU-and-mul and the packed down projection.
// norms = (input, post) per layer; weights = (packed, scales) of qkv, o,
// up_gate, down per layer as fd_x86.linear packs them; methods,
// out_features and group_sizes (4 per layer) give each one's kernel
// (packed_linear.h), output width and wint4 group. The layers share eps,
// heads, rotary layout and scale. The caches may be of any KvDtype (the
// layers' alike; non-fp32 ones need AVX-512): int8 / fp8 code pools take
// their scales [S, Hkv] from k_scales / v_scales, whose entries a float
// pool's layer ignores (any fp32 tensor). The same kernels as the separate ops, so
// the same results; what it saves is ~8 op calls per layer and the Python
// between the layers. An attention-only last layer (kind 1) has no MLP (a
// MoE layer's attention half: its qkv and o weights only) and the op returns
// that layer's post-attention-normed hidden state (the MLP's input) and the
// residual stream after the attention add, the same code path stopped after
// the second norm. A MoE layer (kind 2) runs its MoE block on the
// post-attention-normed stream: fd_x86_moe_layer's code (moe_layer_run) with
// that layer's 10 tensors (gate, bias, the stacked up_gate / down qweights and
// scales, the shared expert's four) and 11 ints (top_k, has_bias,
// renormalize, method, up_group, down_group, has_shared, shared_method,
// shared_up_group, shared_down_group, isa), so a MoE model's whole decode
// step is one call.
namespace {

constexpr int kDenseLayer = 0, kAttentionOnlyLayer = 1, kMoeLayer = 2;

// One layer's tensors, checked, and its kernels' arguments.
struct LayerPlan {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  KvPool k_pool, v_pool;
  fdx86::AttentionArgs attn;
  fdx86::LinearArgs lin[4];
  int methods[4] = {0, 0, 0, 0};
  int kind = kDenseLayer;  // attention only: no up_gate / down, stop after the post-attention norm
  fdx86::MoeLayerArgs moe{};  // a MoE layer's block
};

// Rows ids [T] of the embedding table [V, D] (fp32, bf16 or fp16; ids checked) into out [T, D] fp32.
void embedding_rows(const paddle::Tensor& table, const int64_t* ids, int64_t T, float* out) {
  const int64_t D = table.shape()[1];
  for (int64_t b = 0; b < T; ++b) {
    float* row = out + b * D;
    if (table.dtype() == paddle::DataType::FLOAT32) {
      std::copy_n(table.data<float>() + ids[b] * D, D, row);
    } else if (table.dtype() == paddle::DataType::BFLOAT16) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(table.data<paddle::bfloat16>()) + ids[b] * D;
      for (int64_t d = 0; d < D; ++d) {
        const uint32_t bits = static_cast<uint32_t>(src[d]) << 16;
        std::memcpy(row + d, &bits, sizeof(float));
      }
    } else {
      const paddle::float16* src = table.data<paddle::float16>() + ids[b] * D;
      for (int64_t d = 0; d < D; ++d) row[d] = static_cast<float>(src[d]);
    }
  }
}

// The same rows from a table held transposed, [D, V] (a tied float LM head's weight, whose [V, D] view the model
// embeds with): column ids[b] of each of the D rows.
void embedding_columns(const paddle::Tensor& table_t, const int64_t* ids, int64_t T, float* out) {
  const int64_t D = table_t.shape()[0], V = table_t.shape()[1];
  for (int64_t b = 0; b < T; ++b) {
    float* row = out + b * D;
    if (table_t.dtype() == paddle::DataType::FLOAT32) {
      const float* src = table_t.data<float>() + ids[b];
      for (int64_t d = 0; d < D; ++d) row[d] = src[d * V];
    } else if (table_t.dtype() == paddle::DataType::BFLOAT16) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(table_t.data<paddle::bfloat16>()) + ids[b];
      for (int64_t d = 0; d < D; ++d) {
        const uint32_t bits = static_cast<uint32_t>(src[d * V]) << 16;
        std::memcpy(row + d, &bits, sizeof(float));
      }
    } else {
      const paddle::float16* src = table_t.data<paddle::float16>() + ids[b];
      for (int64_t d = 0; d < D; ++d) row[d] = static_cast<float>(src[d * V]);
    }
  }
}

std::vector<paddle::Tensor> DecoderLayers(
    const paddle::Tensor& hidden, const paddle::Tensor& residual, const paddle::Tensor& cos_sin,
    const paddle::Tensor& step_ints, const paddle::Tensor& ids, const paddle::Tensor& embed_table,
    const std::vector<paddle::Tensor>& norms,
    const std::vector<paddle::Tensor>& k_caches, const std::vector<paddle::Tensor>& v_caches,
    const std::vector<paddle::Tensor>& k_scales, const std::vector<paddle::Tensor>& v_scales,
    const std::vector<paddle::Tensor>& weights, const std::vector<paddle::Tensor>& moe_tensors,
    const paddle::Tensor& final_norm, const std::vector<paddle::Tensor>& head, bool has_residual,
    const std::vector<int>& kinds, const std::vector<int>& methods,
    const std::vector<int64_t>& out_features, const std::vector<int>& group_sizes, float eps, int64_t num_heads,
    int64_t num_kv_heads, bool interleaved, int64_t block_size, float scale, int threads,
    const std::vector<int>& moe_ints, const std::vector<float>& moe_norm_min, int int8_act_rows, int head_method,
    int64_t head_out, int head_group, float head_eps, bool embed) {
  const char* op = "fd_x86_decoder_layers";
  check_isa(op);
  check_f32(op, "cos_sin", cos_sin);
  check_i64(op, "step_ints", step_ints);
  if (embed) {
    check_i64(op, "ids", ids);
    PD_CHECK(!has_residual, op, ": a run that starts at the embedding has no residual stream yet");
    PD_CHECK(embed_table.is_cpu() && embed_table.is_contiguous() && embed_table.shape().size() == 2 &&
                 (embed_table.dtype() == paddle::DataType::FLOAT32 ||
                  embed_table.dtype() == paddle::DataType::BFLOAT16 || embed_table.dtype() == paddle::DataType::FLOAT16),
             op, ": the embedding table must be a contiguous [V, D] fp32, bf16 or fp16 CPU tensor");
    PD_CHECK(ids.shape().size() == 1, op, ": ids must be [T]");
  } else {
    check_f32(op, "hidden", hidden);
    check_f32(op, "residual", residual);
    PD_CHECK(hidden.shape().size() == 2, op, ": hidden must be [T, D]");
    PD_CHECK(!has_residual || residual.shape() == hidden.shape(), op, ": residual must have hidden's shape");
  }
  const size_t L = k_caches.size();
  PD_CHECK(L >= 1 && kinds.size() == L, op, ": ", L, " layers' caches, ", kinds.size(), " layer kinds");
  size_t lins = 0, moes = 0;  // linears and MoE layers in the run
  for (size_t l = 0; l < L; ++l) {
    PD_CHECK(kinds[l] == kDenseLayer || kinds[l] == kMoeLayer || (kinds[l] == kAttentionOnlyLayer && l + 1 == L),
             op, ": layer ", l, " has kind ", kinds[l], "; expected 0 (dense), 2 (MoE) or 1 (attention only, the last "
             "layer only)");
    lins += kinds[l] == kDenseLayer ? 4 : 2;
    moes += kinds[l] == kMoeLayer ? 1 : 0;
  }
  PD_CHECK(v_caches.size() == L && k_scales.size() == L && v_scales.size() == L && norms.size() == 2 * L &&
               weights.size() == 2 * lins && methods.size() == lins && out_features.size() == lins &&
               group_sizes.size() == lins,
           op, ": for ", L, " layers needs 2 norms, a k and a v cache, (packed, scales) x 4 weights and 4 methods / "
           "out_features / group_sizes per dense layer (2 of each in an attention-only or MoE layer)");
  PD_CHECK((moes == 0 || moe_tensors.size() == 10 * moes) && moe_ints.size() == 11 * moes &&
               moe_norm_min.size() == moes,
           op, ": ", moes, " MoE layers need 10 tensors, 11 ints and a norm_min each; got ", moe_tensors.size(), ", ",
           moe_ints.size(), ", ", moe_norm_min.size());
  PD_CHECK(cos_sin.shape().size() == 2, op, ": cos_sin must be [max_pos, Dh]");
  const int64_t T = embed ? ids.shape()[0] : hidden.shape()[0];
  const int64_t D = embed ? embed_table.shape()[1] : hidden.shape()[1], dh = cos_sin.shape()[1];
  const int64_t H = num_heads, Hkv = num_kv_heads, q_size = H * dh, qkv_size = (H + 2 * Hkv) * dh;
  PD_CHECK(H > 0 && Hkv > 0 && dh % 2 == 0, op, ": bad heads ", H, "/", Hkv, " or odd Dh ", dh);
  const int64_t n_ints = step_ints.numel();
  PD_CHECK(T == 0 || (n_ints >= 4 * T && n_ints % T == 0), op, ": step_ints has ", n_ints, " values, expected ",
           "3 T + T W for T = ", T, " tokens (positions, slots, seq_lens, block tables [T, W])");
  const int64_t* positions = step_ints.data<int64_t>();
  const int64_t *slots = positions + T, *seq_lens = positions + 2 * T, *block_tables = positions + 3 * T;
  const int64_t W = T == 0 ? 0 : (n_ints - 3 * T) / T;
  const int nthreads = threads < 1 ? 1 : threads;

  // every layer's checks first (before anything is written to a cache)
  paddle::Tensor q = paddle::empty({T, H, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  std::vector<LayerPlan> plans(L);
  int64_t inter_max = 0;
  size_t lin = 0, moe = 0;  // the layer's first linear, its MoE layer's index
  for (size_t l = 0; l < L; ++l) {
    LayerPlan& p = plans[l];
    const paddle::Tensor &in_norm = norms[2 * l], &post_norm = norms[2 * l + 1];
    check_f32(op, "input_norm", in_norm);
    check_f32(op, "post_norm", post_norm);
    PD_CHECK(in_norm.numel() == D && post_norm.numel() == D, op, ": layer ", l,
             ": the norm weights must have D = ", D, " values");
    p.kind = kinds[l];
    const bool dense = p.kind == kDenseLayer;
    const int nlin = dense ? 4 : 2;
    const int64_t* outs = out_features.data() + lin;
    PD_CHECK(outs[0] == qkv_size, op, ": layer ", l, ": qkv has ", outs[0], " outputs, expected (", H, " + 2 * ",
             Hkv, ") * ", dh);
    PD_CHECK(outs[1] == D && (!dense || outs[3] == D), op, ": layer ", l, ": o and down must output D = ", D);
    PD_CHECK(!dense || outs[2] % 2 == 0, op, ": layer ", l, ": up_gate must have an even output width");
    const int64_t inter = dense ? outs[2] / 2 : 0;
    if (p.kind == kMoeLayer) {
      const paddle::Tensor* t = moe_tensors.data() + 10 * moe;
      const int* m = moe_ints.data() + 11 * moe;
      p.moe = fdx86::MoeLayerArgs{t,         t + 1,     t + 2, t + 3, t + 4,          t + 5, t + 6, t + 7, t + 8,
                                  t + 9,     m[0],      m[1] != 0, m[2] != 0, moe_norm_min[moe], m[3], m[4], m[5],
                                  m[6] != 0, m[7],      m[8], m[9], m[10]};
      fdx86::moe_layer_check(op, D, p.moe);
      ++moe;
    }
    inter_max = std::max(inter_max, inter);
    // an int8 / fp8 pool (int8 / uint8 codes) comes with its scales; a float pool's entry is unused
    const bool scaled = k_caches[l].dtype() == paddle::DataType::INT8 || k_caches[l].dtype() == paddle::DataType::UINT8;
    p.k_pool = kv_pool(op, "k_cache", k_caches[l], scaled ? &k_scales[l] : nullptr);
    p.v_pool = kv_pool(op, "v_cache", v_caches[l], scaled ? &v_scales[l] : nullptr);
    prepare_attention_pools(op, q, p.k_pool, p.v_pool, block_tables, W, seq_lens, T, block_size, scale, nthreads,
                            &p.attn);
    PD_CHECK(p.attn.Hkv == Hkv, op, ": layer ", l, ": the caches hold ", p.attn.Hkv, " kv heads, expected ", Hkv);
    if (l == 0)
      check_positions_and_slots(op, positions, slots, T, cos_sin.shape()[0], k_caches[0].shape()[0]);
    else
      PD_CHECK(k_caches[l].shape()[0] == k_caches[0].shape()[0], op, ": layer ", l,
               "'s caches have a different number of rows than layer 0's");
    const int64_t in_features[4] = {D, q_size, D, inter};
    for (int i = 0; i < nlin; ++i) {
      p.methods[i] = methods[lin + i];
      p.lin[i] = fdx86::packed_linear_args(op, nullptr, T, in_features[i], weights[2 * (lin + i)],
                                           weights[2 * (lin + i) + 1], p.methods[i], outs[i], group_sizes[lin + i],
                                           nthreads);
    }
    lin += nlin;
    p.input_norm = in_norm.data<float>();
    p.post_norm = post_norm.data<float>();
  }
  for (int64_t b = 0; b < T; ++b)
    PD_CHECK(plans[0].attn.seq_lens[b] >= 1, op, ": request ", b, " has no cached tokens");
  const int64_t vocab = embed ? embed_table.shape()[0] : 0;
  for (int64_t b = 0; embed && b < T; ++b) {
    const int64_t id = ids.data<int64_t>()[b];
    PD_CHECK(id >= 0 && id < vocab, op, ": token id ", id, " is outside the embedding's [0, ", vocab, ")");
  }
  // the model's head after the last layer (head_method >= 0): final norm, then the LM head -> logits
  const bool has_head = head_method >= 0;
  fdx86::LinearArgs head_lin;
  if (has_head) {
    PD_CHECK(kinds[L - 1] != kAttentionOnlyLayer, op, ": a run that ends attention only cannot end with the head");
    check_f32(op, "final_norm", final_norm);
    PD_CHECK(final_norm.numel() == D, op, ": the final norm weight must have D = ", D, " values, got ",
             final_norm.numel());
    PD_CHECK(head.size() == 2 && head_out > 0, op, ": the head needs (packed, scales) and out_features > 0, got ",
             head.size(), " tensors and ", head_out);
    head_lin = fdx86::packed_linear_args(op, nullptr, T, D, head[0], head[1], head_method, head_out, head_group,
                                         nthreads);
  }

  paddle::Tensor h_out = paddle::empty({T, has_head ? head_out : D}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor res_out = paddle::empty({T, D}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (T == 0) return {h_out, res_out};
  // scratch, uninitialized (every element is written before it is read): one
  // allocation carved into the steps' buffers; hidden and residual pass from
  // layer to layer through two pairs of buffers
  const int64_t sizes[11] = {T * D, T * qkv_size,      T * Hkv * dh,  T * Hkv * dh, T * q_size, T * D,
                             T * D, T * 2 * inter_max, T * inter_max, 2 * T * D,    2 * T * D};
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::unique_ptr<float[]> scratch(new float[total]);
  float* bufs[11];
  int64_t off = 0;
  for (int i = 0; i < 11; off += sizes[i], ++i) bufs[i] = scratch.get() + off;
  float *x = bufs[0], *qkv = bufs[1], *k = bufs[2], *v = bufs[3], *ctx = bufs[4], *o = bufs[5], *r_mid = bufs[6],
        *up_gate = bufs[7], *act = bufs[8];
  float* h_bufs[2] = {bufs[9], bufs[9] + T * D};  // layer l writes [l % 2], reads [(l - 1) % 2]
  float* r_bufs[2] = {bufs[10], bufs[10] + T * D};
  std::vector<int64_t> items(2 * T);
  for (int64_t b = 0; b < T; ++b) items[2 * b] = b, items[2 * b + 1] = 0;
  // a MoE layer's block input (moe_layer_run takes a tensor) and output (the next layer's input,
  // read in place: copied only when the run's last layer is MoE)
  paddle::Tensor moe_x = moes > 0 ? paddle::empty({T, D}, paddle::DataType::FLOAT32, paddle::CPUPlace()) : q;
  paddle::Tensor moe_y;

  // the embedding's rows in fp32: the first layer's input, in the buffer the second layer writes
  if (embed) embedding_rows(embed_table, ids.data<int64_t>(), T, h_bufs[1]);
  const float* h_in = embed ? h_bufs[1] : hidden.data<float>();
  const float* r_in = has_residual ? residual.data<float>() : nullptr;
  for (size_t l = 0; l < L; ++l) {
    LayerPlan& p = plans[l];
    const bool last = l + 1 == L;
    float* h_next = last && !has_head ? h_out.data<float>() : h_bufs[l % 2];
    float* r_next = last ? res_out.data<float>() : r_bufs[l % 2];
    // input norm: r_mid = h_in + r_in (or h_in itself in the first layer)
    const float* res = h_in;
    if (r_in != nullptr) {
      fdx86::rms_norm_avx2(h_in, r_in, p.input_norm, x, r_mid, T, D, eps, nthreads);
      res = r_mid;
    } else {
      fdx86::rms_norm_avx2(h_in, nullptr, p.input_norm, x, nullptr, T, D, eps, nthreads);
    }
    p.lin[0].x = x;
    p.lin[0].out = qkv;
    fdx86::run_packed_linear(p.lin[0], p.methods[0]);
    fdx86::QkvArgs rope;
    rope.qkv = qkv;
    rope.positions = positions;
    rope.cos_sin = cos_sin.data<float>();
    rope.slots = slots;
    rope.k_cache = p.k_pool.data;
    rope.v_cache = p.v_pool.data;
    rope.k_scales = p.k_pool.scales;
    rope.v_scales = p.v_pool.scales;
    rope.kv_dtype = p.k_pool.dtype;
    rope.q_out = q.data<float>();
    rope.k_out = k;
    rope.v_out = v;
    rope.T = T;
    rope.H = H;
    rope.Hkv = Hkv;
    rope.Dh = dh;
    rope.interleaved = interleaved ? 1 : 0;
    rope.threads = nthreads;
    fdx86::qkv_rope_cache_avx2(rope);
    run_attention(op, &p.attn, items, ctx);
    p.lin[1].x = ctx;
    p.lin[1].out = o;
    fdx86::run_packed_linear(p.lin[1], p.methods[1]);
    // post-attention norm: r_next = o + res; an attention-only (last) layer returns its output
    if (p.kind == kAttentionOnlyLayer) {
      fdx86::rms_norm_avx2(o, res, p.post_norm, h_next, r_next, T, D, eps, nthreads);
      break;
    }
    if (p.kind == kMoeLayer) {
      fdx86::rms_norm_avx2(o, res, p.post_norm, moe_x.data<float>(), r_next, T, D, eps, nthreads);
      moe_y = fdx86::moe_layer_run(moe_x, p.moe, nthreads, int8_act_rows);
      if (last && !has_head) std::copy_n(moe_y.data<float>(), T * D, h_next);
      h_in = moe_y.data<float>();  // the next layer reads it in its input norm only (r_in is set)
      r_in = r_next;
      continue;
    }
    fdx86::rms_norm_avx2(o, res, p.post_norm, x, r_next, T, D, eps, nthreads);
    p.lin[2].x = x;
    p.lin[2].out = up_gate;
    fdx86::run_packed_linear(p.lin[2], p.methods[2]);
    fdx86::silu_and_mul_avx2(up_gate, act, T, p.lin[2].N / 2, nthreads);
    p.lin[3].x = act;
    p.lin[3].out = h_next;
    fdx86::run_packed_linear(p.lin[3], p.methods[3]);
    h_in = h_next;
    r_in = r_next;
  }
  if (has_head) {  // logits = head(norm(h + r)); h_in / r_in: the last layer's output and residual stream
    fdx86::rms_norm_avx2(h_in, r_in, final_norm.data<float>(), x, r_mid, T, D, head_eps, nthreads);
    head_lin.x = x;
    head_lin.out = h_out.data<float>();
    fdx86::run_packed_linear(head_lin, head_method);
  }
  return {h_out, res_out};
}

std::vector<std::vector<int64_t>> DecoderLayersShape(
    const std::vector<int64_t>& hidden, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<std::vector<int64_t>>&, const std::vector<std::vector<int64_t>>&,
    const std::vector<std::vector<int64_t>>&, const std::vector<std::vector<int64_t>>&,
    const std::vector<std::vector<int64_t>>&, const std::vector<std::vector<int64_t>>&,
    const std::vector<std::vector<int64_t>>&, const std::vector<int64_t>&, const std::vector<std::vector<int64_t>>&) {
  return {{hidden[0], -1}, hidden};  // HiddenOut: [T, D], or the logits [T, V] with a head
}

std::vector<paddle::DataType> DecoderLayersDtype(
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const std::vector<paddle::DataType>&,
    const std::vector<paddle::DataType>&, const std::vector<paddle::DataType>&,
    const std::vector<paddle::DataType>&, const std::vector<paddle::DataType>&,
    const std::vector<paddle::DataType>&, const std::vector<paddle::DataType>&, const paddle::DataType&,
    const std::vector<paddle::DataType>&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_decoder_layers)
    .Inputs({"Hidden", "Residual", "CosSin", "StepInts", "Ids", "EmbedTable", paddle::Vec("Norms"),
             paddle::Vec("KCaches"), paddle::Vec("VCaches"), paddle::Vec("KScales"), paddle::Vec("VScales"),
             paddle::Vec("Weights"), paddle::Vec("MoeTensors"), "FinalNorm", paddle::Vec("Head")})
    .Outputs({"HiddenOut", "ResidualOut"})
    .Attrs({"has_residual: bool", "kinds: std::vector<int>", "methods: std::vector<int>",
            "out_features: std::vector<int64_t>", "group_sizes: std::vector<int>", "eps: float", "num_heads: int64_t",
            "num_kv_heads: int64_t", "interleaved: bool", "block_size: int64_t", "scale: float", "threads: int",
            "moe_ints: std::vector<int>", "moe_norm_min: std::vector<float>", "int8_act_rows: int",
            "head_method: int", "head_out: int64_t", "head_group: int", "head_eps: float", "embed: bool"})
    .SetKernelFn(PD_KERNEL(DecoderLayers))
    .SetInferShapeFn(PD_INFER_SHAPE(DecoderLayersShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecoderLayersDtype));

// ------------------------------------------------------------- run plans
//
//   fd_x86_run_plan_new(norms, k_caches, v_caches, k_scales, v_scales, weights, moe_tensors, final_norm,
//                       head; the run's attributes) -> plan [1] int64
//   fd_x86_run_plan_step(hidden, residual, cos_sin, step_ints, ids, embed_table; plan and the step's
//                        attributes) -> hidden, residual (or the logits)
//   fd_x86_run_plan_steps(cos_sin, step_ints, ids, embed_table; plan, the step's attributes, steps, vocab,
//                         transposed)
//                        -> tokens [steps, T]: greedy multi-step decoding (RunPlanSteps)
//   fd_x86_run_plan_free(any) with plan                  (forgets the plan; unknown ids are fine)
//
// A run's per-layer tensors and attributes held natively under an id, so that a
// decode step passes six tensors and a few numbers instead of the ~80 tensors
// and the attribute lists of fd_x86_decoder_layers, whose dispatch alone costs
// ~30 us a call. A step runs fd_x86_decoder_layers' code (every check included)
// on the held inputs; the holder (fd_x86.layer, with the run's cache entry)
// frees the plan when the entry goes.
namespace {

struct RunPlan {
  std::vector<paddle::Tensor> norms, k_caches, v_caches, k_scales, v_scales, weights, moe_tensors, head;
  paddle::Tensor final_norm;
  std::vector<int> kinds, methods, group_sizes, moe_ints;
  std::vector<int64_t> out_features;
  std::vector<float> moe_norm_min;
  float eps = 0, scale = 0, head_eps = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_out = 0;
  bool interleaved = true;
  int head_method = -1, head_group = -1;
};

// Never destroyed: a plan left at exit must not release its tensors from a static destructor, after
// Python (which may own their memory) is finalized. fd_x86.run_step frees every plan at exit.
std::mutex& g_plans_mutex = *new std::mutex;
std::unordered_map<int64_t, std::shared_ptr<const RunPlan>>& g_plans =
    *new std::unordered_map<int64_t, std::shared_ptr<const RunPlan>>;
int64_t g_next_plan = 1;

std::vector<paddle::Tensor> RunPlanNew(
    const std::vector<paddle::Tensor>& norms, const std::vector<paddle::Tensor>& k_caches,
    const std::vector<paddle::Tensor>& v_caches, const std::vector<paddle::Tensor>& k_scales,
    const std::vector<paddle::Tensor>& v_scales, const std::vector<paddle::Tensor>& weights,
    const std::vector<paddle::Tensor>& moe_tensors, const paddle::Tensor& final_norm,
    const std::vector<paddle::Tensor>& head, const std::vector<int>& kinds, const std::vector<int>& methods,
    const std::vector<int64_t>& out_features, const std::vector<int>& group_sizes, float eps, int64_t num_heads,
    int64_t num_kv_heads, bool interleaved, float scale, const std::vector<int>& moe_ints,
    const std::vector<float>& moe_norm_min, int head_method, int64_t head_out, int head_group, float head_eps) {
  auto plan = std::make_shared<RunPlan>();
  plan->norms = norms;
  plan->k_caches = k_caches;
  plan->v_caches = v_caches;
  plan->k_scales = k_scales;
  plan->v_scales = v_scales;
  plan->weights = weights;
  plan->moe_tensors = moe_tensors;
  plan->final_norm = final_norm;
  plan->head = head;
  plan->kinds = kinds;
  plan->methods = methods;
  plan->out_features = out_features;
  plan->group_sizes = group_sizes;
  plan->moe_ints = moe_ints;
  plan->moe_norm_min = moe_norm_min;
  plan->eps = eps;
  plan->num_heads = num_heads;
  plan->num_kv_heads = num_kv_heads;
  plan->interleaved = interleaved;
  plan->scale = scale;
  plan->head_method = head_method;
  plan->head_out = head_out;
  plan->head_group = head_group;
  plan->head_eps = head_eps;
  paddle::Tensor id = paddle::empty({1}, paddle::DataType::INT64, paddle::CPUPlace());
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  id.data<int64_t>()[0] = g_next_plan;
  g_plans[g_next_plan++] = std::move(plan);
  return {id};
}

std::vector<paddle::Tensor> RunPlanStep(const paddle::Tensor& hidden, const paddle::Tensor& residual,
                                        const paddle::Tensor& cos_sin, const paddle::Tensor& step_ints,
                                        const paddle::Tensor& ids, const paddle::Tensor& embed_table, int64_t plan_id,
                                        bool has_residual, int64_t block_size, int threads, int int8_act_rows,
                                        bool embed) {
  std::shared_ptr<const RunPlan> plan;
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    const auto it = g_plans.find(plan_id);
    PD_CHECK(it != g_plans.end(), "fd_x86_run_plan_step: no run plan ", plan_id, " (freed, or never made)");
    plan = it->second;
  }
  const RunPlan& p = *plan;
  return DecoderLayers(hidden, residual, cos_sin, step_ints, ids, embed_table, p.norms, p.k_caches, p.v_caches,
                       p.k_scales, p.v_scales, p.weights, p.moe_tensors, p.final_norm, p.head, has_residual, p.kinds,
                       p.methods, p.out_features, p.group_sizes, p.eps, p.num_heads, p.num_kv_heads, p.interleaved,
                       block_size, p.scale, threads, p.moe_ints, p.moe_norm_min, int8_act_rows, p.head_method,
                       p.head_out, p.head_group, p.head_eps, embed);
}

// fd_x86_run_plan_steps: `steps` decode steps of a plan that ends with the head, from the token embedding
// (multi-step decoding, fd_core's --num-scheduler-steps). Step s runs fd_x86_run_plan_step on the ids, takes
// each row's token from the logits' first `vocab` columns (greedy; with `sampled`, fd_x86_sample's draw with the
// row's temperature [T], top_k [T], top_p [T], min_p [T] and uniforms [steps, T, R] at step s: the same code,
// so the same token as one step at a time), and feeds it to step s + 1 one position later (its slot from the
// row's block table, its sequence one longer). -> tokens [steps, T] int64.
// `transposed`: the table is given as [D, V] (a tied float head's weight): its columns are gathered here and
// the run starts from those rows, as the model's own embedding of the [V, D] view gives them.
std::vector<paddle::Tensor> RunPlanSteps(const paddle::Tensor& cos_sin, const paddle::Tensor& step_ints,
                                         const paddle::Tensor& ids, const paddle::Tensor& embed_table,
                                         const paddle::Tensor& temperature, const paddle::Tensor& top_k,
                                         const paddle::Tensor& top_p, const paddle::Tensor& min_p,
                                         const paddle::Tensor& uniforms, int64_t plan_id, int64_t block_size,
                                         int threads, int int8_act_rows, int64_t steps, int64_t vocab,
                                         bool transposed, bool sampled) {
  const char* op = "fd_x86_run_plan_steps";
  std::shared_ptr<const RunPlan> plan;
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    const auto it = g_plans.find(plan_id);
    PD_CHECK(it != g_plans.end(), op, ": no run plan ", plan_id, " (freed, or never made)");
    plan = it->second;
  }
  const RunPlan& p = *plan;
  PD_CHECK(p.head_method >= 0, op, ": the plan has no head (the steps sample from its logits)");
  PD_CHECK(steps >= 1, op, ": steps must be >= 1, got ", steps);
  PD_CHECK(vocab >= 1 && vocab <= p.head_out, op, ": vocab ", vocab, " must be in [1, ", p.head_out,
           "] (the head's outputs)");
  PD_CHECK(block_size >= 1, op, ": block_size must be >= 1, got ", block_size);
  check_i64(op, "ids", ids);
  check_i64(op, "step_ints", step_ints);
  PD_CHECK(ids.shape().size() == 1 && ids.numel() >= 1, op, ": ids must be [T] with T >= 1");
  const int64_t T = ids.numel(), n_ints = step_ints.numel();
  PD_CHECK(n_ints >= 4 * T && n_ints % T == 0, op, ": step_ints has ", n_ints, " values, expected 3 T + T W for T = ",
           T, " tokens (positions, slots, seq_lens, block tables [T, W])");
  const int64_t W = n_ints / T - 3;
  int64_t R = 0;
  if (sampled) {
    fdx86::check_sampling_rows(op, T, temperature, top_k, top_p, min_p);
    PD_CHECK(uniforms.is_cpu() && uniforms.dtype() == paddle::DataType::FLOAT32 && uniforms.shape().size() == 3 &&
                 uniforms.shape()[0] == steps && uniforms.shape()[1] == T && uniforms.shape()[2] >= 1 &&
                 uniforms.is_contiguous(),
             op, ": uniforms must be a contiguous [steps, T, R >= 1] fp32 host tensor for ", steps, " steps of ", T,
             " rows");
    R = uniforms.shape()[2];
  }
  paddle::Tensor ints = paddle::empty({n_ints}, paddle::DataType::INT64, paddle::CPUPlace());
  paddle::Tensor cur = paddle::empty({T}, paddle::DataType::INT64, paddle::CPUPlace());
  std::copy_n(step_ints.data<int64_t>(), n_ints, ints.data<int64_t>());
  std::copy_n(ids.data<int64_t>(), T, cur.data<int64_t>());
  int64_t* positions = ints.data<int64_t>();
  int64_t *slots = positions + T, *seq_lens = positions + 2 * T;
  const int64_t* tables = positions + 3 * T;
  // every step's position must lie in the rotary table and its slot in the row's block table and the cache:
  // checked before the first step writes any KV (each step checks its own again)
  const int64_t max_pos = cos_sin.shape().size() == 2 ? cos_sin.shape()[0] : 0;
  const int64_t cache_rows = p.k_caches.empty() ? 0 : p.k_caches[0].shape()[0];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t last = positions[t] + steps - 1;
    PD_CHECK(positions[t] >= 0 && last / block_size < W, op, ": row ", t, " at position ", positions[t], " needs ",
             steps, " steps, past its block table of ", W, " blocks of ", block_size);
    PD_CHECK(last < max_pos, op, ": row ", t, " at position ", positions[t], " needs ", steps,
             " steps, past the rotary table's ", max_pos, " positions");
    for (int64_t pos = positions[t]; pos <= last; ++pos) {
      const int64_t slot = tables[t * W + pos / block_size] * block_size + pos % block_size;
      PD_CHECK(slot >= 0 && slot < cache_rows, op, ": row ", t, " at position ", pos, " maps to slot ", slot,
               ", outside the cache's ", cache_rows, " rows");
    }
  }
  paddle::Tensor rows_in = cos_sin;  // the transposed table's rows, gathered each step
  if (transposed) {
    PD_CHECK(embed_table.is_cpu() && embed_table.is_contiguous() && embed_table.shape().size() == 2 &&
                 (embed_table.dtype() == paddle::DataType::FLOAT32 || embed_table.dtype() == paddle::DataType::BFLOAT16 ||
                  embed_table.dtype() == paddle::DataType::FLOAT16),
             op, ": a transposed table must be a contiguous [D, V] fp32, bf16 or fp16 host tensor");
    rows_in = paddle::empty({T, embed_table.shape()[0]}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  }
  const int64_t table_rows = embed_table.shape()[transposed ? 1 : 0];
  paddle::Tensor tokens = paddle::empty({steps, T}, paddle::DataType::INT64, paddle::CPUPlace());
  int64_t* out = tokens.data<int64_t>();
  for (int64_t s = 0; s < steps; ++s) {
    if (transposed) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t id = cur.data<int64_t>()[t];
        PD_CHECK(id >= 0 && id < table_rows, op, ": token id ", id, " is outside the embedding's [0, ", table_rows,
                 ")");
      }
      embedding_columns(embed_table, cur.data<int64_t>(), T, rows_in.data<float>());
    }
    const std::vector<paddle::Tensor> logits = DecoderLayers(
        rows_in, rows_in, cos_sin, ints, cur, embed_table, p.norms, p.k_caches, p.v_caches, p.k_scales, p.v_scales,
        p.weights, p.moe_tensors, p.final_norm, p.head, false, p.kinds, p.methods, p.out_features, p.group_sizes,
        p.eps, p.num_heads, p.num_kv_heads, p.interleaved, block_size, p.scale, threads, p.moe_ints, p.moe_norm_min,
        int8_act_rows, p.head_method, p.head_out, p.head_group, p.head_eps, !transposed);
    const float* rows = logits[0].data<float>();
    int64_t* next = cur.data<int64_t>();
    if (sampled) {
      const float *tt = temperature.data<float>(), *tp = top_p.data<float>(), *tm = min_p.data<float>();
      const float* u = uniforms.data<float>() + s * T * R;
      const int64_t* tk = top_k.data<int64_t>();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (T > 1 && threads > 1)
      for (int64_t t = 0; t < T; ++t) {
        next[t] = out[s * T + t] = fdx86::sample_row(rows + t * p.head_out, vocab, tt[t], tk[t], tp[t], tm[t],
                                                     u[t * R], T == 1 ? threads : 1);
      }
    } else {
      for (int64_t t = 0; t < T; ++t) next[t] = out[s * T + t] = fdx86::greedy_token(rows + t * p.head_out, vocab);
    }
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = ++positions[t];
      slots[t] = tables[t * W + pos / block_size] * block_size + pos % block_size;
      ++seq_lens[t];
    }
  }
  return {tokens};
}

std::vector<paddle::Tensor> RunPlanFree(const paddle::Tensor& any, int64_t plan_id) {
  std::shared_ptr<const RunPlan> plan;  // released after the lock
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    const auto it = g_plans.find(plan_id);
    if (it != g_plans.end()) {
      plan = std::move(it->second);
      g_plans.erase(it);
    }
  }
  return {paddle::empty({0}, paddle::DataType::INT64, paddle::CPUPlace())};
}

std::vector<std::vector<int64_t>> RunPlanStepShape(const std::vector<int64_t>& hidden, const std::vector<int64_t>&,
                                                   const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                   const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {{hidden[0], -1}, hidden};
}

std::vector<paddle::DataType> RunPlanStepDtype(const paddle::DataType&, const paddle::DataType&,
                                               const paddle::DataType&, const paddle::DataType&,
                                               const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_run_plan_new)
    .Inputs({paddle::Vec("Norms"), paddle::Vec("KCaches"), paddle::Vec("VCaches"), paddle::Vec("KScales"),
             paddle::Vec("VScales"), paddle::Vec("Weights"), paddle::Vec("MoeTensors"), "FinalNorm",
             paddle::Vec("Head")})
    .Outputs({"Plan"})
    .Attrs({"kinds: std::vector<int>", "methods: std::vector<int>", "out_features: std::vector<int64_t>",
            "group_sizes: std::vector<int>", "eps: float", "num_heads: int64_t", "num_kv_heads: int64_t",
            "interleaved: bool", "scale: float", "moe_ints: std::vector<int>", "moe_norm_min: std::vector<float>",
            "head_method: int", "head_out: int64_t", "head_group: int", "head_eps: float"})
    .SetKernelFn(PD_KERNEL(RunPlanNew));

PD_BUILD_OP(fd_x86_run_plan_step)
    .Inputs({"Hidden", "Residual", "CosSin", "StepInts", "Ids", "EmbedTable"})
    .Outputs({"HiddenOut", "ResidualOut"})
    .Attrs({"plan: int64_t", "has_residual: bool", "block_size: int64_t", "threads: int", "int8_act_rows: int",
            "embed: bool"})
    .SetKernelFn(PD_KERNEL(RunPlanStep))
    .SetInferShapeFn(PD_INFER_SHAPE(RunPlanStepShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RunPlanStepDtype));

PD_BUILD_OP(fd_x86_run_plan_steps)
    .Inputs({"CosSin", "StepInts", "Ids", "EmbedTable", "Temperature", "TopK", "TopP", "MinP", "Uniforms"})
    .Outputs({"Tokens"})
    .Attrs({"plan: int64_t", "block_size: int64_t", "threads: int", "int8_act_rows: int", "steps: int64_t",
            "vocab: int64_t", "transposed: bool", "sampled: bool"})
    .SetKernelFn(PD_KERNEL(RunPlanSteps));

PD_BUILD_OP(fd_x86_run_plan_free)
    .Inputs({"Any"})
    .Outputs({"Out"})
    .Attrs({"plan: int64_t"})
    .SetKernelFn(PD_KERNEL(RunPlanFree));
