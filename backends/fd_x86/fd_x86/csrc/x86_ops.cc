// Paddle custom operators for fd_x86's decode ops (kernels in kernels_ops.cc):
//
//   fd_x86_rms_norm(x, weight)                      -> out          x [..., D]
//   fd_x86_add_rms_norm(x, residual, weight)        -> out, x + residual
//   fd_x86_silu_and_mul(x)                          -> out          x [..., 2I] -> [..., I]
//   fd_x86_rotary(q, k, positions, cos_sin)         -> q_out, k_out [T, H(kv), Dh]
//   fd_x86_write_kv_cache(k, v, k_cache, v_cache, slots)   in place (k_cache, v_cache)
//   fd_x86_decode_attention(q, k_cache, v_cache, block_tables, seq_lens) -> out [B, H, Dh]
//   fd_x86_prefill_attention(q, k_cache, v_cache, block_tables, seq_lens, query_lens) -> out [Tp, H, Dh]
//
// Every tensor is fp32 (int64 for positions, slots, tables, lengths), on the
// CPU and contiguous (the Python side makes it so). Indices are checked here
// before a kernel runs, so a bad slot / position / block id is an error, not a
// stray write. Compiled for baseline x86-64; the kernels need AVX2 + FMA.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "ops_kernels.h"
#include "packed_linear.h"
#include "paddle/extension.h"

namespace {

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

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

void WriteKVCache(const paddle::Tensor& k, const paddle::Tensor& v, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
                  const paddle::Tensor& slots) {
  const char* op = "fd_x86_write_kv_cache";
  check_f32(op, "k", k);
  check_f32(op, "v", v);
  check_f32(op, "k_cache", k_cache);
  check_f32(op, "v_cache", v_cache);
  check_i64(op, "slot_mapping", slots);
  PD_CHECK(k.shape() == v.shape() && k_cache.shape() == v_cache.shape(), op, ": k / v or their caches differ in shape");
  PD_CHECK(k.shape().size() == 3 && k_cache.shape().size() == 3, op, ": k must be [T, Hkv, Dh], the caches [S, Hkv, Dh]");
  PD_CHECK(k.shape()[1] == k_cache.shape()[1] && k.shape()[2] == k_cache.shape()[2], op,
           ": k's [Hkv, Dh] differs from the cache's");
  const int64_t tokens = k.shape()[0], rows = k_cache.shape()[0];
  PD_CHECK(slots.numel() == tokens, op, ": slot_mapping has ", slots.numel(), " slots for ", tokens, " tokens");
  const int64_t* s = slots.data<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    PD_CHECK(s[t] < rows, op, ": slot ", s[t], " is past the cache's ", rows, " rows");
  fdx86::write_kv_cache(k.data<float>(), v.data<float>(), k_cache.data<float>(), v_cache.data<float>(), s, tokens,
                        k.shape()[1] * k.shape()[2]);
}

// Checks shared by both attention ops; fills a's shapes and pointers.
void prepare_attention(const char* op, const paddle::Tensor& q, const paddle::Tensor& k_cache,
                       const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                       const paddle::Tensor& seq_lens, int64_t requests, int64_t block_size, float scale,
                       int threads, fdx86::AttentionArgs* a) {
  check_isa(op);
  check_f32(op, "q", q);
  check_f32(op, "k_cache", k_cache);
  check_f32(op, "v_cache", v_cache);
  check_i64(op, "block_tables", block_tables);
  check_i64(op, "seq_lens", seq_lens);
  PD_CHECK(q.shape().size() == 3 && k_cache.shape().size() == 3 && k_cache.shape() == v_cache.shape(), op,
           ": q must be [T, H, Dh], the caches [S, Hkv, Dh] alike");
  PD_CHECK(block_tables.shape().size() == 2, op, ": block_tables must be [R, W]");
  a->H = q.shape()[1];
  a->Dh = q.shape()[2];
  a->Hkv = k_cache.shape()[1];
  a->W = block_tables.shape()[1];
  a->R = requests;
  a->block_size = block_size;
  a->scale = scale;
  a->threads = threads < 1 ? 1 : threads;
  PD_CHECK(k_cache.shape()[2] == a->Dh && a->Dh % 8 == 0, op, ": Dh must match the cache's and be a multiple of 8");
  PD_CHECK(a->Hkv > 0 && a->H % a->Hkv == 0, op, ": H = ", a->H, " is not a multiple of Hkv = ", a->Hkv);
  PD_CHECK(block_size > 0 && k_cache.shape()[0] % block_size == 0, op, ": the cache's ", k_cache.shape()[0],
           " rows are not whole blocks of ", block_size);
  PD_CHECK(block_tables.shape()[0] >= requests && seq_lens.numel() >= requests, op,
           ": block_tables / seq_lens cover fewer than ", requests, " requests");
  const int64_t num_blocks = k_cache.shape()[0] / block_size;
  a->block_tables = block_tables.data<int64_t>();
  a->seq_lens = seq_lens.data<int64_t>();
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
  a->k_cache = k_cache.data<float>();
  a->v_cache = v_cache.data<float>();
}

bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

// The attention kernel: AVX-512 where the CPU has it, else AVX2.
// FD_X86_ATTENTION_ISA=avx2 forces the AVX2 one (tests, comparisons);
// =avx512 on a CPU without it is an error.
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
  if (attention_avx512(op))
    fdx86::paged_attention_avx512(*a);
  else
    fdx86::paged_attention_avx2(*a);
}

std::vector<paddle::Tensor> DecodeAttention(const paddle::Tensor& q, const paddle::Tensor& k_cache,
                                            const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                                            const paddle::Tensor& seq_lens, int64_t block_size, float scale,
                                            int threads) {
  fdx86::AttentionArgs a;
  const int64_t batch = q.shape().empty() ? 0 : q.shape()[0];
  prepare_attention("fd_x86_decode_attention", q, k_cache, v_cache, block_tables, seq_lens, batch, block_size,
                    scale, threads, &a);
  for (int64_t b = 0; b < batch; ++b)
    PD_CHECK(a.seq_lens[b] >= 1, "fd_x86_decode_attention: request ", b, " has no cached tokens");
  std::vector<int64_t> items(2 * batch);
  for (int64_t b = 0; b < batch; ++b) items[2 * b] = b, items[2 * b + 1] = 0;
  paddle::Tensor out = paddle::empty(q.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  run_attention("fd_x86_decode_attention", &a, items, out.data<float>());
  return {out};
}

// Query tokens per prefill work item: about 32 query rows (tile x G).
constexpr int64_t kPrefillRows = 32;

std::vector<paddle::Tensor> PrefillAttention(const paddle::Tensor& q, const paddle::Tensor& k_cache,
                                             const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                                             const paddle::Tensor& seq_lens, const paddle::Tensor& query_lens,
                                             int64_t block_size, float scale, int threads) {
  const char* op = "fd_x86_prefill_attention";
  check_i64(op, "query_lens", query_lens);
  fdx86::AttentionArgs a;
  const int64_t requests = query_lens.numel();
  prepare_attention(op, q, k_cache, v_cache, block_tables, seq_lens, requests, block_size, scale, threads, &a);
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
  return {out};
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
Dtypes F32x1(const paddle::DataType&) { return {paddle::DataType::FLOAT32}; }
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

// ------------------------------------------------- fused QKV -> rope -> cache
//
//   fd_x86_qkv_rope_cache(qkv, positions, cos_sin, slots, k_cache, v_cache)
//       -> q [T, H, Dh], k [T, Hkv, Dh], v [T, Hkv, Dh]
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

std::vector<paddle::Tensor> QkvRopeCache(const paddle::Tensor& qkv, const paddle::Tensor& positions,
                                         const paddle::Tensor& cos_sin, const paddle::Tensor& slots,
                                         const paddle::Tensor& k_cache, const paddle::Tensor& v_cache,
                                         int64_t num_heads, int64_t num_kv_heads, bool interleaved, int threads) {
  const char* op = "fd_x86_qkv_rope_cache";
  check_isa(op);
  check_f32(op, "qkv", qkv);
  check_i64(op, "positions", positions);
  check_f32(op, "cos_sin", cos_sin);
  check_i64(op, "slot_mapping", slots);
  check_f32(op, "k_cache", k_cache);
  check_f32(op, "v_cache", v_cache);
  PD_CHECK(qkv.shape().size() == 2, op, ": qkv must be [T, (H + 2 Hkv) * Dh]");
  PD_CHECK(cos_sin.shape().size() == 2 && k_cache.shape().size() == 3 && k_cache.shape() == v_cache.shape(), op,
           ": cos_sin must be [max_pos, Dh] and the caches [S, Hkv, Dh] alike");
  const int64_t tokens = qkv.shape()[0], dh = cos_sin.shape()[1], max_pos = cos_sin.shape()[0];
  PD_CHECK(num_heads > 0 && num_kv_heads > 0 && dh % 2 == 0, op, ": bad heads ", num_heads, "/", num_kv_heads,
           " or odd Dh ", dh);
  PD_CHECK(qkv.shape()[1] == (num_heads + 2 * num_kv_heads) * dh, op, ": qkv has ", qkv.shape()[1],
           " columns, expected (", num_heads, " + 2 * ", num_kv_heads, ") * ", dh);
  PD_CHECK(k_cache.shape()[1] == num_kv_heads && k_cache.shape()[2] == dh, op, ": the caches' [Hkv, Dh] are [",
           k_cache.shape()[1], ", ", k_cache.shape()[2], "], expected [", num_kv_heads, ", ", dh, "]");
  PD_CHECK(positions.numel() == tokens && slots.numel() == tokens, op, ": qkv has ", tokens, " tokens, positions ",
           positions.numel(), ", slot_mapping ", slots.numel());
  const int64_t* pos = positions.data<int64_t>();
  const int64_t* slot = slots.data<int64_t>();
  check_positions_and_slots(op, pos, slot, tokens, max_pos, k_cache.shape()[0]);
  paddle::Tensor q = paddle::empty({tokens, num_heads, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor k = paddle::empty({tokens, num_kv_heads, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor v = paddle::empty({tokens, num_kv_heads, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  fdx86::QkvArgs a;
  a.qkv = qkv.data<float>();
  a.positions = pos;
  a.cos_sin = cos_sin.data<float>();
  a.slots = slot;
  a.k_cache = const_cast<float*>(k_cache.data<float>());
  a.v_cache = const_cast<float*>(v_cache.data<float>());
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

}  // namespace

PD_BUILD_OP(fd_x86_qkv_rope_cache)
    .Inputs({"QKV", "Positions", "CosSin", "Slots", "KCache", "VCache"})
    .Outputs({"Q", "K", "V"})
    .Attrs({"num_heads: int64_t", "num_kv_heads: int64_t", "interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(QkvRopeCache))
    .SetInferShapeFn(PD_INFER_SHAPE(QkvShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(F32x3));

// ----------------------------------------------------------- decoder layers
//
//   fd_x86_decoder_layers(hidden, residual, cos_sin, positions, slots, block_tables, seq_lens,
//                         norms[2L], k_caches[L], v_caches[L], weights[8L]) -> hidden, residual
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
// heads, rotary layout and scale. The same kernels as the separate ops, so
// the same results; what it saves is ~8 op calls per layer and the Python
// between the layers.
namespace {

// One layer's tensors, checked, and its kernels' arguments.
struct LayerPlan {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  fdx86::AttentionArgs attn;
  fdx86::LinearArgs lin[4];
  int methods[4] = {0, 0, 0, 0};
};

std::vector<paddle::Tensor> DecoderLayers(
    const paddle::Tensor& hidden, const paddle::Tensor& residual, const paddle::Tensor& cos_sin,
    const paddle::Tensor& positions, const paddle::Tensor& slots, const paddle::Tensor& block_tables,
    const paddle::Tensor& seq_lens, const std::vector<paddle::Tensor>& norms,
    const std::vector<paddle::Tensor>& k_caches, const std::vector<paddle::Tensor>& v_caches,
    const std::vector<paddle::Tensor>& weights, bool has_residual, const std::vector<int>& methods,
    const std::vector<int64_t>& out_features, const std::vector<int>& group_sizes, float eps, int64_t num_heads,
    int64_t num_kv_heads, bool interleaved, int64_t block_size, float scale, int threads) {
  const char* op = "fd_x86_decoder_layers";
  check_isa(op);
  check_f32(op, "hidden", hidden);
  check_f32(op, "residual", residual);
  check_f32(op, "cos_sin", cos_sin);
  check_i64(op, "positions", positions);
  check_i64(op, "slot_mapping", slots);
  PD_CHECK(hidden.shape().size() == 2, op, ": hidden must be [T, D]");
  PD_CHECK(!has_residual || residual.shape() == hidden.shape(), op, ": residual must have hidden's shape");
  const size_t L = k_caches.size();
  PD_CHECK(L >= 1 && v_caches.size() == L && norms.size() == 2 * L && weights.size() == 8 * L &&
               methods.size() == 4 * L && out_features.size() == 4 * L && group_sizes.size() == 4 * L,
           op, ": for ", L, " layers needs 2 norms, a k and a v cache, (packed, scales) x 4 weights and 4 methods / "
           "out_features / group_sizes per layer");
  PD_CHECK(cos_sin.shape().size() == 2, op, ": cos_sin must be [max_pos, Dh]");
  const int64_t T = hidden.shape()[0], D = hidden.shape()[1], dh = cos_sin.shape()[1];
  const int64_t H = num_heads, Hkv = num_kv_heads, q_size = H * dh, qkv_size = (H + 2 * Hkv) * dh;
  PD_CHECK(H > 0 && Hkv > 0 && dh % 2 == 0, op, ": bad heads ", H, "/", Hkv, " or odd Dh ", dh);
  PD_CHECK(positions.numel() == T && slots.numel() == T, op, ": hidden has ", T, " tokens, positions ",
           positions.numel(), ", slot_mapping ", slots.numel());
  const int nthreads = threads < 1 ? 1 : threads;

  // every layer's checks first (before anything is written to a cache)
  paddle::Tensor q = paddle::empty({T, H, dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  std::vector<LayerPlan> plans(L);
  int64_t inter_max = 0;
  for (size_t l = 0; l < L; ++l) {
    LayerPlan& p = plans[l];
    const paddle::Tensor &in_norm = norms[2 * l], &post_norm = norms[2 * l + 1];
    check_f32(op, "input_norm", in_norm);
    check_f32(op, "post_norm", post_norm);
    PD_CHECK(in_norm.numel() == D && post_norm.numel() == D, op, ": layer ", l,
             ": the norm weights must have D = ", D, " values");
    const int64_t* outs = out_features.data() + 4 * l;
    PD_CHECK(outs[0] == qkv_size, op, ": layer ", l, ": qkv has ", outs[0], " outputs, expected (", H, " + 2 * ",
             Hkv, ") * ", dh);
    PD_CHECK(outs[1] == D && outs[3] == D, op, ": layer ", l, ": o and down must output D = ", D);
    PD_CHECK(outs[2] % 2 == 0, op, ": layer ", l, ": up_gate must have an even output width");
    const int64_t inter = outs[2] / 2;
    inter_max = std::max(inter_max, inter);
    prepare_attention(op, q, k_caches[l], v_caches[l], block_tables, seq_lens, T, block_size, scale, nthreads,
                      &p.attn);
    PD_CHECK(p.attn.Hkv == Hkv, op, ": layer ", l, ": the caches hold ", p.attn.Hkv, " kv heads, expected ", Hkv);
    if (l == 0)
      check_positions_and_slots(op, positions.data<int64_t>(), slots.data<int64_t>(), T, cos_sin.shape()[0],
                                k_caches[0].shape()[0]);
    else
      PD_CHECK(k_caches[l].shape()[0] == k_caches[0].shape()[0], op, ": layer ", l,
               "'s caches have a different number of rows than layer 0's");
    const int64_t in_features[4] = {D, q_size, D, inter};
    for (int i = 0; i < 4; ++i) {
      p.methods[i] = methods[4 * l + i];
      p.lin[i] = fdx86::packed_linear_args(op, nullptr, T, in_features[i], weights[8 * l + 2 * i],
                                           weights[8 * l + 2 * i + 1], p.methods[i], outs[i],
                                           group_sizes[4 * l + i], nthreads);
    }
    p.input_norm = in_norm.data<float>();
    p.post_norm = post_norm.data<float>();
    p.k_cache = const_cast<float*>(k_caches[l].data<float>());
    p.v_cache = const_cast<float*>(v_caches[l].data<float>());
  }
  for (int64_t b = 0; b < T; ++b)
    PD_CHECK(plans[0].attn.seq_lens[b] >= 1, op, ": request ", b, " has no cached tokens");

  paddle::Tensor h_out = paddle::empty({T, D}, paddle::DataType::FLOAT32, paddle::CPUPlace());
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

  const float* h_in = hidden.data<float>();
  const float* r_in = has_residual ? residual.data<float>() : nullptr;
  for (size_t l = 0; l < L; ++l) {
    LayerPlan& p = plans[l];
    const bool last = l + 1 == L;
    float* h_next = last ? h_out.data<float>() : h_bufs[l % 2];
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
    rope.positions = positions.data<int64_t>();
    rope.cos_sin = cos_sin.data<float>();
    rope.slots = slots.data<int64_t>();
    rope.k_cache = p.k_cache;
    rope.v_cache = p.v_cache;
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
    // post-attention norm: r_next = o + res
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
  return {h_out, res_out};
}

std::vector<std::vector<int64_t>> DecoderLayersShape(
    const std::vector<int64_t>& hidden, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<std::vector<int64_t>>&, const std::vector<std::vector<int64_t>>&,
    const std::vector<std::vector<int64_t>>&, const std::vector<std::vector<int64_t>>&) {
  return {hidden, hidden};
}

std::vector<paddle::DataType> DecoderLayersDtype(
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const std::vector<paddle::DataType>&,
    const std::vector<paddle::DataType>&, const std::vector<paddle::DataType>&,
    const std::vector<paddle::DataType>&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_decoder_layers)
    .Inputs({"Hidden", "Residual", "CosSin", "Positions", "Slots", "BlockTables", "SeqLens", paddle::Vec("Norms"),
             paddle::Vec("KCaches"), paddle::Vec("VCaches"), paddle::Vec("Weights")})
    .Outputs({"HiddenOut", "ResidualOut"})
    .Attrs({"has_residual: bool", "methods: std::vector<int>", "out_features: std::vector<int64_t>",
            "group_sizes: std::vector<int>", "eps: float", "num_heads: int64_t", "num_kv_heads: int64_t",
            "interleaved: bool", "block_size: int64_t", "scale: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(DecoderLayers))
    .SetInferShapeFn(PD_INFER_SHAPE(DecoderLayersShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecoderLayersDtype));
