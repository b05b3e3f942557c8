// A whole MoE layer of a decode step in one paddle custom operator:
//
//   fd_x86_moe_layer(x, gate, bias, up_qweight, up_scales, down_qweight, down_scales,
//                    shared_up_qweight, shared_up_scales, shared_down_qweight, shared_down_scales)
//     x fp32 [T, D]; gate fp32 [D, E] (the router, fd-core's layout);
//     bias fp32 [E] (has_bias; else any fp32 tensor, unread); the stacked
//     expert weights as fd_x86_moe_experts takes them; the shared expert's
//     2-D weights as fd_x86_moe_experts_shared (has_shared; else unread).
//     -> out fp32 [T, D] = routed experts (+ shared expert), where the
//     routing is fd_x86_moe_select's on logits = x @ gate: softmax, top_k
//     by probs + bias, weights from probs, renormalised with norm_min.
//     int8_act_rows > 0: with at least that many tokens, wint8 linears take
//     int8 activations (the opt-in prefill path, moe_op.h); 0 off.
//
// It replaces the router linear, fd_x86_moe_select and
// fd_x86_moe_experts(_shared) (three ops, their Python dispatch and two
// intermediate tensors) with one call. The logits are summed in fp32 over
// d in ascending order (AVX-512; a plain loop elsewhere), so they may
// differ from paddle's matmul in the last bits: only a near-tie at the
// top-k boundary can then pick another expert.
// Baseline x86-64 code with paddle headers, like x86_moe_op.cc.
#include <cstdint>
#include <vector>

#include "moe_kernels.h"
#include "moe_op.h"
#include "offline_op.h"
#include "paddle/extension.h"

namespace {

void router_logits(const float* x, int64_t T, int64_t D, const float* gate, int64_t E, float* out, bool avx512,
                   int threads) {
  if (avx512) {
    fdx86::router_logits_avx512(x, T, D, gate, E, out, threads);
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * E;
    for (int64_t e = 0; e < E; ++e) o[e] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float xv = x[t * D + d];
      const float* g = gate + d * E;
      for (int64_t e = 0; e < E; ++e) o[e] += xv * g[e];
    }
  }
}

fdx86::MoeSharedArgs shared_args(const fdx86::MoeLayerArgs& a) {
  fdx86::MoeSharedArgs shared;
  shared.method = a.shared_method;
  shared.up_qweight = a.shared_up_qweight;
  shared.up_scales = a.shared_up_scales;
  shared.down_qweight = a.shared_down_qweight;
  shared.down_scales = a.shared_down_scales;
  shared.up_group = a.shared_up_group;
  shared.down_group = a.shared_down_group;
  return shared;
}

}  // namespace

void fdx86::moe_layer_check(const char* op, int64_t D, const MoeLayerArgs& a) {
  const paddle::Tensor &gate = *a.gate, &bias = *a.bias;
  PD_CHECK(gate.is_cpu() && gate.dtype() == paddle::DataType::FLOAT32 && gate.shape().size() == 2 &&
               gate.is_contiguous() && gate.shape()[0] == D,
           op, ": gate must be contiguous float32 [D = ", D, ", E] on the CPU");
  const int64_t E = gate.shape()[1];
  PD_CHECK(a.top_k >= 1 && a.top_k <= E, op, ": top_k must be in [1, E = ", E, "], got ", a.top_k);
  if (a.has_bias)
    PD_CHECK(bias.is_cpu() && bias.dtype() == paddle::DataType::FLOAT32 && bias.numel() == E && bias.is_contiguous(),
             op, ": correction_bias must be contiguous float32 with E = ", E, " values");
  PD_CHECK(a.up_qweight->shape().size() == 3 && a.up_qweight->shape()[0] == E, op, ": the router has ", E,
           " experts, up_gate qweight ", a.up_qweight->shape().empty() ? 0 : a.up_qweight->shape()[0]);
  if (a.has_shared)
    PD_CHECK((a.shared_method >= 0 && a.shared_method <= 2) || a.shared_method == fdx86::kMoeW4a8 ||
                 a.shared_method == fdx86::kMoeWint4Bf16 || a.shared_method == fdx86::kMoeWint8Bf16, op,
             ": shared_method must be 0 (wint8), 1 (wint4), 2 (w8a8), 5 (w4a8), 6 (wint4, bf16 activations) or 7 "
             "(wint8, bf16 activations), got ",
             a.shared_method);
  fdx86::moe_use_avx512(a.isa);  // its checks (isa 0 / 1 / 2, the CPU has it)
  const fdx86::MoeSharedArgs shared = shared_args(a);
  fdx86::moe_experts_check(D, *a.up_qweight, *a.up_scales, *a.down_qweight, *a.down_scales, a.method, a.up_group,
                           a.down_group, a.has_shared ? &shared : nullptr);
}

paddle::Tensor fdx86::moe_layer_run(const paddle::Tensor& x, const MoeLayerArgs& a, int threads, int int8_act_rows) {
  const int64_t T = x.shape()[0], D = x.shape()[1], E = a.gate->shape()[1];
  const int top_k = a.top_k;
  threads = threads < 1 ? 1 : threads;
  std::vector<float> logits(T * E), w(T * top_k), probs(E), score(E);
  std::vector<int64_t> ids(T * top_k), idx(E);
  router_logits(x.data<float>(), T, D, a.gate->data<float>(), E, logits.data(), fdx86::moe_use_avx512(a.isa),
                threads);
  const float* b = a.has_bias ? a.bias->data<float>() : nullptr;
  for (int64_t t = 0; t < T; ++t)
    fdx86::moe_route_row(logits.data() + t * E, E, b, top_k, a.renormalize, a.norm_min, w.data() + t * top_k,
                         ids.data() + t * top_k, probs.data(), score.data(), idx.data());
  const fdx86::MoeSharedArgs shared = shared_args(a);
  return fdx86::moe_forward(x, ids.data(), w.data(), top_k, *a.up_qweight, *a.up_scales, *a.down_qweight,
                            *a.down_scales, a.method, a.up_group, a.down_group, a.isa, threads,
                            a.has_shared ? &shared : nullptr, int8_act_rows);
}

std::vector<paddle::Tensor> MoeLayer(
    const paddle::Tensor& x, const paddle::Tensor& gate, const paddle::Tensor& bias, const paddle::Tensor& up_qweight,
    const paddle::Tensor& up_scales, const paddle::Tensor& down_qweight, const paddle::Tensor& down_scales,
    const paddle::Tensor& shared_up_qweight, const paddle::Tensor& shared_up_scales,
    const paddle::Tensor& shared_down_qweight, const paddle::Tensor& shared_down_scales, int top_k, bool has_bias,
    bool renormalize, float norm_min, int method, int up_group, int down_group, bool has_shared, int shared_method,
    int shared_up_group, int shared_down_group, int isa, int threads, int int8_act_rows) {
  const char* op = "fd_x86_moe_layer";
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2 && x.is_contiguous(), op,
           ": x must be contiguous float32 [T, D] on the CPU");
  const fdx86::MoeLayerArgs a{&gate, &bias, &up_qweight, &up_scales, &down_qweight, &down_scales,
                              &shared_up_qweight, &shared_up_scales, &shared_down_qweight, &shared_down_scales,
                              top_k, has_bias, renormalize, norm_min, method, up_group, down_group, has_shared,
                              shared_method, shared_up_group, shared_down_group, isa};
  fdx86::moe_layer_check(op, x.shape()[1], a);
  return {fdx86::moe_layer_run(x, a, threads, int8_act_rows)};
}

std::vector<std::vector<int64_t>> MoeLayerInferShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>& gate, const std::vector<int64_t>& bias,
    const std::vector<int64_t>& uq, const std::vector<int64_t>& us, const std::vector<int64_t>& dq,
    const std::vector<int64_t>& ds, const std::vector<int64_t>& suq, const std::vector<int64_t>& sus,
    const std::vector<int64_t>& sdq, const std::vector<int64_t>& sds, int top_k, bool has_bias, bool renormalize,
    float norm_min, int method, int up_group, int down_group, bool has_shared, int shared_method,
    int shared_up_group, int shared_down_group, int isa, int threads, int int8_act_rows) {
  return {x};
}

std::vector<paddle::DataType> MoeLayerInferDtype(
    const paddle::DataType& x, const paddle::DataType& gate, const paddle::DataType& bias, const paddle::DataType& uq,
    const paddle::DataType& us, const paddle::DataType& dq, const paddle::DataType& ds, const paddle::DataType& suq,
    const paddle::DataType& sus, const paddle::DataType& sdq, const paddle::DataType& sds) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_x86_moe_layer)
    .Inputs({"X", "Gate", "Bias", "UpQWeight", "UpScales", "DownQWeight", "DownScales", "SharedUpQWeight",
             "SharedUpScales", "SharedDownQWeight", "SharedDownScales"})
    .Outputs({"Out"})
    .Attrs({"top_k: int", "has_bias: bool", "renormalize: bool", "norm_min: float", "method: int", "up_group: int",
            "down_group: int", "has_shared: bool", "shared_method: int", "shared_up_group: int",
            "shared_down_group: int", "isa: int", "threads: int", "int8_act_rows: int"})
    .SetKernelFn(PD_KERNEL(MoeLayer))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeLayerInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeLayerInferDtype));
