// Paddle custom operator for block-wise fp8 linear layers:
//
//   fd_x86_block_fp8_linear(x, qweight, scales)   x fp32 [M, K],
//     qweight uint8 [N, K] (e4m3 codes), scales fp32 [ceil(N/128), ceil(K/128)]
//
// Returns out fp32 [M, N]: activations quantized per token and group of 128
// as fd_core.quantization.block_fp8 does, then the block-scaled product
// (fp8_kernels.h). Needs AVX-512 (F/BW/VL/DQ). Attr kernel: 0 picks the
// vdpbf16ps kernel where the CPU has AVX-512 BF16 and VBMI, else the fp32
// FMA one; 1 forces the FMA kernel, 2 the bf16 one (tests, benchmarks).
// Compiled for baseline x86-64.
#include <cstdint>
#include <vector>

#include "cpu_features.h"
#include "fp8_kernels.h"
#include "paddle/extension.h"

namespace fdx86 {

bool cpu_has_fp8_bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
  }();
  return has;
}

void block_fp8_linear_f32(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* wscale, int64_t N,
                          float* out, int threads, int kernel) {
  if (M == 0 || N == 0) return;
  const int64_t KB = (K + 127) / 128;
  std::vector<float> xs(M * KB);
  if (kernel == 2 || (kernel == 0 && cpu_has_fp8_bf16())) {
    std::vector<uint16_t> xb(M * ((K + 63) / 64 * 64));
    fp8_quantize_rows_bf16(x, M, K, xb.data(), xs.data(), threads);
    Fp8Bf16Args a;
    a.M = M;
    a.N = N;
    a.K = K;
    a.xb = xb.data();
    a.xscale = xs.data();
    a.w = w;
    a.wscale = wscale;
    a.out = out;
    a.threads = threads;
    block_fp8_linear_bf16(a);
    return;
  }
  std::vector<float> xq(M * K);
  fp8_quantize_rows_avx512(x, M, K, xq.data(), xs.data(), threads);
  Fp8LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.xq = xq.data();
  a.xscale = xs.data();
  a.w = w;
  a.wscale = wscale;
  a.out = out;
  a.threads = threads;
  block_fp8_linear_avx512(a);
}

}  // namespace fdx86

namespace {

std::vector<paddle::Tensor> BlockFp8Linear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                           const paddle::Tensor& scales, int threads, int kernel) {
  const char* op = "fd_x86_block_fp8_linear";
  PD_CHECK(fdx86::cpu_has_avx512(), op, ": needs AVX-512 (F/BW/VL/DQ), which this CPU lacks");
  PD_CHECK(kernel >= 0 && kernel <= 2, op, ": kernel must be 0 (auto), 1 (fp32 FMA) or 2 (bf16), got ", kernel);
  PD_CHECK(kernel != 2 || fdx86::cpu_has_fp8_bf16(), op, ": kernel 2 needs AVX-512 BF16 and VBMI, which this CPU lacks");
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
  fdx86::block_fp8_linear_f32(x.data<float>(), M, K, qweight.data<uint8_t>(), scales.data<float>(), N,
                              out.data<float>(), threads, kernel);
  return {out};
}

std::vector<std::vector<int64_t>> Fp8InferShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                const std::vector<int64_t>& s, int threads,
                                                int kernel) {
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
    .Attrs({"threads: int", "kernel: int"})
    .SetKernelFn(PD_KERNEL(BlockFp8Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(Fp8InferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Fp8InferDtype));
