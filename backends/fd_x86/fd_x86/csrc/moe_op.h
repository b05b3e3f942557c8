// The MoE ops' shared pieces (x86_moe_op.cc), used by fd_x86_moe_experts*,
// fd_x86_moe_select and the whole-layer op fd_x86_moe_layer
// (x86_moe_layer_op.cc). Baseline x86-64 code with paddle headers.
#pragma once
#include <cstdint>

#include "paddle/extension.h"

namespace fdx86 {

// The shared expert's weights (2-D), or none.
struct MoeSharedArgs {
  const paddle::Tensor* up_qweight = nullptr;
  const paddle::Tensor* up_scales = nullptr;
  const paddle::Tensor* down_qweight = nullptr;
  const paddle::Tensor* down_scales = nullptr;
  int method = 0, up_group = -1, down_group = -1;  // method: the shared expert's own (wint4 experts, wint8 rest)
};

// out [T, D] = sum_j tw[t, j] * FFN_{ids[t, j]}(x[t]) (+ the shared expert
// after the routed sum): see fd_x86_moe_experts in x86_moe_op.cc. ids /
// tw are [T, k] row-major; ids are checked against the number of experts.
// int8_act_rows > 0 (opt-in, fd_x86.linear's FD_X86_PREFILL_INT8_ACT): in a
// call of at least that many tokens, wint8 linears (the experts', the shared
// expert's) quantize their inputs per token and run w8a8's VNNI kernel on
// the same weight (AVX-512 only), and wint4 ones w4a8's (VNNI; inputs and
// groups multiples of 128: w4a8 stores wint4's layout).
paddle::Tensor moe_forward(const paddle::Tensor& x, const int64_t* ids, const float* tw, int64_t k,
                           const paddle::Tensor& up_qweight, const paddle::Tensor& up_scales,
                           const paddle::Tensor& down_qweight, const paddle::Tensor& down_scales, int method,
                           int up_group, int down_group, int isa, int threads, const MoeSharedArgs* shared,
                           int64_t int8_act_rows = 0);

// moe_forward's checks of the experts (and the shared expert) for inputs of
// width D, alone: a caller that must check before it writes anything (the
// decoder-layers op, before its KV-cache stores) runs them first.
void moe_experts_check(int64_t D, const paddle::Tensor& up_qweight, const paddle::Tensor& up_scales,
                       const paddle::Tensor& down_qweight, const paddle::Tensor& down_scales, int method,
                       int up_group, int down_group, const MoeSharedArgs* shared);

// The reference routing of one token: probs = softmax(logits [E]); the
// top_k experts by probs + bias (bias may be null), descending, lower id
// first on ties, weighted by probs; with renormalize divided by
// max(sum of the k weights, norm_min). probs / score: scratch of E floats,
// idx: of E ids.
void moe_route_row(const float* logits, int64_t E, const float* bias, int top_k, bool renormalize, float norm_min,
                   float* w, int64_t* id, float* probs, float* score, int64_t* idx);

// A whole MoE layer after its norm (fd_x86_moe_layer, x86_moe_layer_op.cc):
// the router, the routing and the routed + shared experts. Its tensors and
// attributes as the op takes them; the decoder-layers op (x86_ops.cc) runs
// a run's MoE layers through the same two functions.
struct MoeLayerArgs {
  const paddle::Tensor *gate, *bias, *up_qweight, *up_scales, *down_qweight, *down_scales;
  const paddle::Tensor *shared_up_qweight, *shared_up_scales, *shared_down_qweight, *shared_down_scales;
  int top_k;
  bool has_bias, renormalize;
  float norm_min;
  int method, up_group, down_group;
  bool has_shared;
  int shared_method, shared_up_group, shared_down_group, isa;
};

// Every check of the layer for inputs of width D: the router's, the bias's,
// top_k's, the isa's, the shared method's and the experts' (moe_experts_check).
void moe_layer_check(const char* op, int64_t D, const MoeLayerArgs& a);

// out [T, D] for x fp32 [T, D] (contiguous, checked by the caller, as the
// layer by moe_layer_check).
paddle::Tensor moe_layer_run(const paddle::Tensor& x, const MoeLayerArgs& a, int threads, int int8_act_rows);

// true: the AVX-512 kernels, false: the AVX2 ones (isa 0 auto, 1 AVX2, 2 AVX-512)
bool moe_use_avx512(int isa);

}  // namespace fdx86
