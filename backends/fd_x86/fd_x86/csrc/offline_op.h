// The offline-checkpoint expert formats as the MoE ops and the linear op
// call them (x86_offline_op.cc): fd-core's w4a8_static and wint2 layouts
// checked and addressed, and their kernels (offline_kernels.h) run with the
// activation preparation they need. Baseline x86-64 code with paddle headers.
#pragma once
#include <cstdint>
#include <vector>

#include "paddle/extension.h"

namespace fdx86 {

// fd_x86_moe_experts' / fd_x86_moe_layer's ``method`` codes past wint8 (0),
// wint4 (1) and w8a8 (2). w4a8 (5) reads wint4's contract layout (the MoE
// ops' Stacked checks it as wint4's) and runs w4a8_linear below. wint4 on bf16
// activations (6: a model whose activations are bf16) reads wint4's layout too
// and runs wint4_lut_bf16_avx512 (moe_kernels.h) where it can; wint8 on bf16
// activations (7) reads wint8's layout and runs wint8_contract_bf16_avx512
// (kernels.h) where it can.
constexpr int kMoeW4a8Static = 3, kMoeWint2 = 4, kMoeW4a8 = 5, kMoeWint4Bf16 = 6, kMoeWint8Bf16 = 7;

inline bool moe_offline_method(int method) { return method == kMoeW4a8Static || method == kMoeWint2; }

// A stacked (dims 3, [E, ...]) or single (dims 2) weight of an offline
// `method` for K inputs: checks qweight's dtype and shape and sets N (output
// channels), the bytes per expert over N (``row_bytes``: an expert is
// N * row_bytes bytes) and the scales per expert over N (``groups``).
//   w4a8_static: qweight uint8 [.., N, K/2], scales [.., N, 2]
//   wint2:       qweight uint8 [.., K/4, N], scales [.., K/64 + 3, N]
void moe_offline_layout(const char* name, int method, const paddle::Tensor& qweight, size_t dims, int64_t K,
                        int64_t* N, int64_t* row_bytes, int64_t* groups);

// out [M, N] = x [M, K] @ one matrix of `method` (w: its bytes, scales: its
// scales, as moe_offline_layout addresses them). xq / xsum (w4a8_static),
// xs (wint2): scratch reused across calls. Needs AVX-512 VNNI (checked).
void offline_linear(int method, const uint8_t* w, const float* scales, const float* x, int64_t M, int64_t N,
                    int64_t K, float* out, int threads, std::vector<int8_t>* xq, std::vector<int32_t>* xsum,
                    std::vector<float>* xs);

// w4a8's per-call activation buffers, reused across calls.
struct W4a8Scratch {
  std::vector<int8_t> codes, planes;
  std::vector<float> xscale;
  std::vector<int32_t> gsum, rowsum;  // rowsum: quantize_rows' whole-row sums (unused)
};

// out [M, N] = x [M, K] @ one w4a8 matrix on the contract int4 layout (w:
// uint8 [N, K/2], scales fp32 [N, K / group_size]): x quantized per token as
// the reference (quantize_rows_avx512: s_t = max|x_t| / 127, rint, clip),
// exact int32 dot products per group, group scales and s_t in fp32
// (w4a8_avx512_vnni). K and group_size multiples of 128 (group_size = K per
// channel); checked, as AVX-512 VNNI. Every token's row is computed alone:
// the same bits at any M.
void w4a8_linear(const uint8_t* w, const float* scales, const float* x, int64_t M, int64_t N, int64_t K,
                 int64_t group_size, float* out, int threads, W4a8Scratch* scratch);

}  // namespace fdx86
