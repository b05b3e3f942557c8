// The offline-checkpoint expert formats (offline_op.h) and a paddle custom
// operator for one such matrix:
//
//   fd_x86_offline_linear(x, qweight, scales)   x fp32 [M, K], a 2-D
//     w4a8_static (method 3) or wint2 (method 4) weight in fd-core's layout
//     -> out fp32 [M, N]
//
// The routed experts reach the same kernels through fd_x86_moe_experts /
// fd_x86_moe_layer (x86_moe_op.cc: method 3 or 4), and the w4a8 experts
// (method 5) w4a8_linear below (kernels_w4a8_avx512.cc). Needs AVX-512 VNNI.
// Baseline x86-64 code with paddle headers, like the other ops.
#include <cstdint>
#include <vector>

#include "cpu_features.h"
#include "kernels.h"
#include "offline_kernels.h"
#include "offline_op.h"
#include "paddle/extension.h"

void fdx86::moe_offline_layout(const char* name, int method, const paddle::Tensor& qweight, size_t dims, int64_t K,
                               int64_t* N, int64_t* row_bytes, int64_t* groups) {
  const char* op = "fd_x86 offline experts";
  PD_CHECK(moe_offline_method(method), op, ": method must be 3 (w4a8_static) or 4 (wint2), got ", method);
  PD_CHECK(qweight.dtype() == paddle::DataType::UINT8, op, ": ", name, " qweight must be uint8");
  PD_CHECK(qweight.shape().size() == dims, op, ": ", name, " qweight must have ", dims, " dims, got ",
           qweight.shape().size());
  const int64_t a = qweight.shape()[dims - 2], b = qweight.shape()[dims - 1];
  if (method == kMoeW4a8Static) {
    PD_CHECK(K % 2 == 0 && b == K / 2, op, ": ", name, " w4a8_static qweight is [.., ", a, ", ", b,
             "], expected [.., N, K / 2 = ", K / 2, "] (K = ", K, ", even)");
    *N = a;
    *row_bytes = K / 2;
    *groups = 2;
  } else {
    PD_CHECK(K % 128 == 0 && a == K / 4, op, ": ", name, " wint2 qweight is [.., ", a, ", ", b,
             "], expected [.., K / 4 = ", K / 4, ", N] (K = ", K, ", a multiple of 128)");
    *N = b;
    *row_bytes = K / 4;
    *groups = K / 64 + 3;
  }
}

void fdx86::offline_linear(int method, const uint8_t* w, const float* scales, const float* x, int64_t M, int64_t N,
                           int64_t K, float* out, int threads, std::vector<int8_t>* xq, std::vector<int32_t>* xsum,
                           std::vector<float>* xs) {
  PD_CHECK(cpu_has_avx512_vnni(), "fd_x86: the w4a8_static / wint2 kernels need AVX-512 VNNI, which this CPU lacks");
  if (M == 0 || N == 0) return;
  LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.x = x;
  a.w = w;
  a.scales = scales;
  a.out = out;
  a.threads = threads < 1 ? 1 : threads;
  if (method == kMoeWint2) {
    xs->resize(M * K);
    wint2_scale_rows(x, M, K, xs->data());
    a.xe = xs->data();
    wint2_avx512(a);
    return;
  }
  a.ldh = (K / 2 + 63) / 64 * 64;
  xq->resize(M * 2 * a.ldh);
  xsum->resize(M);
  w4a8s_quantize_avx512(x, M, K, scales[1], xq->data(), a.ldh, xsum->data());
  a.xq = xq->data();
  a.xsum = xsum->data();
  w4a8s_avx512_vnni(a);
}

void fdx86::w4a8_linear(const uint8_t* w, const float* scales, const float* x, int64_t M, int64_t N, int64_t K,
                        int64_t group_size, float* out, int threads, W4a8Scratch* scratch) {
  PD_CHECK(cpu_has_avx512_vnni(), "fd_x86: the w4a8 expert kernel needs AVX-512 VNNI, which this CPU lacks");
  PD_CHECK(K % 128 == 0 && group_size % 128 == 0 && K % group_size == 0, "fd_x86 w4a8 experts: K (", K,
           ") and group_size (", group_size, ") must be multiples of 128 with group_size dividing K");
  if (M == 0 || N == 0) return;
  threads = threads < 1 ? 1 : threads;
  LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.w = w;
  a.scales = scales;
  a.groups = K / group_size;
  a.group_size = group_size;
  a.out = out;
  a.threads = threads;
  a.ldh = K / 2;
  scratch->codes.resize(M * K);
  scratch->planes.resize(M * K);
  scratch->xscale.resize(M);
  scratch->gsum.resize(M * a.groups);
  scratch->rowsum.resize(M);
  quantize_rows_avx512(x, M, K, scratch->codes.data(), K, scratch->xscale.data(), scratch->rowsum.data(), threads);
  w4a8_split_avx512(scratch->codes.data(), M, K, K, group_size, scratch->planes.data(), a.ldh, scratch->gsum.data());
  a.xq = scratch->planes.data();
  a.xscale = scratch->xscale.data();
  a.xsum = scratch->gsum.data();
  w4a8_avx512_vnni(a);
}

namespace {

std::vector<paddle::Tensor> OfflineLinear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                          const paddle::Tensor& scales, int method, int threads) {
  const char* op = "fd_x86_offline_linear";
  PD_CHECK(x.is_cpu() && qweight.is_cpu() && scales.is_cpu(), op, ": tensors must be on the CPU");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2, op, ": x must be float32 [M, K]");
  PD_CHECK(x.is_contiguous() && qweight.is_contiguous() && scales.is_contiguous(), op,
           ": x, qweight and scales must be contiguous");
  const int64_t M = x.shape()[0], K = x.shape()[1];
  int64_t N = 0, row_bytes = 0, groups = 0;
  fdx86::moe_offline_layout("weight", method, qweight, 2, K, &N, &row_bytes, &groups);
  PD_CHECK(scales.dtype() == paddle::DataType::FLOAT32 && scales.numel() == N * groups, op,
           ": scales must be float32 with ", N * groups, " values, got ", scales.numel());
  paddle::Tensor out = paddle::empty({M, N}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  std::vector<int8_t> xq;
  std::vector<int32_t> xsum;
  std::vector<float> xs;
  fdx86::offline_linear(method, qweight.data<uint8_t>(), scales.data<float>(), x.data<float>(), M, N, K,
                        out.data<float>(), threads, &xq, &xsum, &xs);
  return {out};
}

std::vector<std::vector<int64_t>> OfflineLinearInferShape(const std::vector<int64_t>& x,
                                                          const std::vector<int64_t>& w,
                                                          const std::vector<int64_t>& s, int method, int threads) {
  return {{x[0], method == fdx86::kMoeWint2 ? w[1] : w[0]}};
}

std::vector<paddle::DataType> OfflineLinearInferDtype(const paddle::DataType& x, const paddle::DataType& w,
                                                      const paddle::DataType& s) {
  return {paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(fd_x86_offline_linear)
    .Inputs({"X", "QWeight", "Scales"})
    .Outputs({"Out"})
    .Attrs({"method: int", "threads: int"})
    .SetKernelFn(PD_KERNEL(OfflineLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(OfflineLinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OfflineLinearInferDtype));
