// Paddle custom operator for block-wise fp8 linear layers:
//
//   fd_x86_block_fp8_linear(x, qweight, scales)   x fp32 [M, K],
//     qweight uint8 [N, K] (e4m3 codes), scales fp32 [ceil(N/128), ceil(K/128)]
//
// Returns out fp32 [M, N]: activations quantized per token and group of 128
// as fd_core.quantization.block_fp8 does, then the block-scaled product
// (fp8_kernels.h). Needs AVX-512 (F/BW/VL/DQ). Compiled for baseline x86-64.
#include <cstdint>
#include <vector>

#include "cpu_features.h"
#include "fp8_kernels.h"
#include "paddle/extension.h"

namespace {

std::vector<paddle::Tensor> BlockFp8Linear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                           const paddle::Tensor& scales, int threads) {
  const char* op = "fd_x86_block_fp8_linear";
  PD_CHECK(fdx86::cpu_has_avx512(), op, ": needs AVX-512 (F/BW/VL/DQ), which this CPU lacks");
  PD_CHECK(x.is_cpu() && qweight.is_cpu() && scales.is_cpu(), op, ": tensors must be on the CPU");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2, op, ": x must be float32 [M, K]");
  PD_CHECK(qweight.dtype() == paddle::DataType::UINT8 && qweight.shape().size() == 2, op,
           ": qweight must be uint8 [N, K]");
  PD_CHECK(scales.dtype() == paddle::DataType::FLOAT32 && scales.shape().size() == 2, op,
           ": scales must be float32 [ceil(N/128), ceil(K/128)]");
  PD_CHECK(x.is_contiguous() && qweight.is_contiguous() && scales.is_contiguous(), op,
           ": x, qweight and scales must be contiguous");
  const int64_t M = x.shape()[0], K = x.shape()[1], N = qweight.shape()[0];
  PD_CHECK(qweight.shape()[1] == K, op, ": qweight is [", N, ", ", qweight.shape()[1], "], x has K = ", K);
  PD_CHECK(scales.shape()[0] == (N + 127) / 128 && scales.shape()[1] == (K + 127) / 128, op,
           ": scales must be [", (N + 127) / 128, ", ", (K + 127) / 128, "]");
  paddle::Tensor out = paddle::empty({M, N}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  if (M == 0 || N == 0) return {out};
  paddle::Tensor xq = paddle::empty({M, K}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor xs = paddle::empty({M, (K + 127) / 128}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  fdx86::fp8_quantize_rows_avx512(x.data<float>(), M, K, xq.data<float>(), xs.data<float>(), threads);
  fdx86::Fp8LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.xq = xq.data<float>();
  a.xscale = xs.data<float>();
  a.w = qweight.data<uint8_t>();
  a.wscale = scales.data<float>();
  a.out = out.data<float>();
  a.threads = threads;
  fdx86::block_fp8_linear_avx512(a);
  return {out};
}

std::vector<std::vector<int64_t>> Fp8InferShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                const std::vector<int64_t>& s, int threads) {
  return {{x[0], w[0]}};
}

std::vector<paddle::DataType> Fp8InferDtype(const paddle::DataType& x, const paddle::DataType& w,
                                            const paddle::DataType& s) {
  return {paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_block_fp8_linear)
    .Inputs({"X", "QWeight", "Scales"})
    .Outputs({"Out"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(BlockFp8Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(Fp8InferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Fp8InferDtype));
