// Paddle custom operator for the vision tower's attention (fd_vision_attention):
//
//   fd_x86_vision_attention(qkv, cos, sin, cu_seqlens)   -> out [N, H*Dh]
//
// qkv [N, 3*H*Dh], cos / sin [N, Dh/2] fp32, cu_seqlens [frames + 1] int64, all
// contiguous CPU tensors; attrs num_heads, scale, threads. The rotary and the
// attention within each frame as vision_kernels.h states; AVX-512 only (the
// Python side declines elsewhere, and the reference answers).
#include <cstdint>
#include <vector>

#include "cpu_features.h"
#include "paddle/extension.h"
#include "vision_kernels.h"

namespace {

void check_cpu(const char* op, const char* name, const paddle::Tensor& t, paddle::DataType dtype, size_t rank) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be on the CPU");
  PD_CHECK(t.dtype() == dtype, op, ": ", name, " has the wrong dtype");
  PD_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  PD_CHECK(t.shape().size() == rank, op, ": ", name, " must have ", rank, " axes");
}

std::vector<paddle::Tensor> VisionAttention(const paddle::Tensor& qkv, const paddle::Tensor& cos,
                                            const paddle::Tensor& sin, const paddle::Tensor& cu_seqlens,
                                            int num_heads, float scale, int threads) {
  const char* op = "fd_x86_vision_attention";
  PD_CHECK(fdx86::cpu_has_avx512(), op, ": needs AVX-512 F/BW/VL/DQ, which this CPU lacks");
  check_cpu(op, "qkv", qkv, paddle::DataType::FLOAT32, 2);
  check_cpu(op, "cos", cos, paddle::DataType::FLOAT32, 2);
  check_cpu(op, "sin", sin, paddle::DataType::FLOAT32, 2);
  check_cpu(op, "cu_seqlens", cu_seqlens, paddle::DataType::INT64, 1);
  const int64_t n = qkv.shape()[0], width = qkv.shape()[1];
  PD_CHECK(num_heads > 0 && width % (3 * num_heads) == 0, op, ": qkv's width ", width, " is not 3 x ", num_heads,
           " heads");
  const int64_t dh = width / (3 * num_heads);
  PD_CHECK(dh % 2 == 0 && dh <= fdx86::kVisionMaxHeadDim, op, ": head size ", dh, " must be even and at most ",
           fdx86::kVisionMaxHeadDim);
  PD_CHECK(cos.shape() == std::vector<int64_t>({n, dh / 2}) && sin.shape() == cos.shape(), op,
           ": cos and sin must be [", n, ", ", dh / 2, "]");
  const int64_t frames = cu_seqlens.shape()[0] - 1;
  PD_CHECK(frames >= 1, op, ": cu_seqlens needs at least 2 values");
  const int64_t* cu = cu_seqlens.data<int64_t>();
  PD_CHECK(cu[0] == 0 && cu[frames] == n, op, ": cu_seqlens must run from 0 to ", n);
  for (int64_t f = 0; f < frames; ++f) PD_CHECK(cu[f + 1] >= cu[f], op, ": cu_seqlens must not decrease");
  paddle::Tensor out = paddle::empty({n, num_heads * dh}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (n > 0)
    PD_CHECK(fdx86::vision_attention_avx512(qkv.data<float>(), cos.data<float>(), sin.data<float>(), cu, frames, n,
                                            num_heads, dh, scale, out.data<float>(), threads),
             op, ": out of memory for the scratch of ", n, " rows x ", num_heads, " heads");
  return {out};
}

std::vector<std::vector<int64_t>> VisionAttentionShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {{qkv[0], qkv[1] / 3}};
}

std::vector<paddle::DataType> VisionAttentionDtype(const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_vision_attention)
    .Inputs({"QKV", "Cos", "Sin", "CuSeqlens"})
    .Outputs({"Out"})
    .Attrs({"num_heads: int", "scale: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(VisionAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(VisionAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(VisionAttentionDtype));
