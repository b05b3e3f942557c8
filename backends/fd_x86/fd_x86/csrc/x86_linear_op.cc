// Paddle custom operators for fd_x86's quantized linear layers.
//
//   fd_x86_wint8_linear(x, qweight, scales)  x fp32 [M, K], qweight int8 [N, K]
//   fd_x86_wint4_linear(x, qweight, scales)  qweight uint8 [N, K/2], scales [N, G]
//   fd_x86_w8a8_linear(x, qweight, scales)   per-token dynamic int8 activations
//
// All return out fp32 [M, N] and read the inputs' own memory (no copies).
// Attributes: isa (0 = best this CPU has, 1 = AVX2, 2 = AVX-512; asking for
// one the CPU lacks is an error), threads (OpenMP threads over output
// channels), group_size (wint4: input features per scale group; -1 = K).
// This file is compiled for baseline x86-64; the kernels for each ISA live
// in their own translation units (kernels_*.cc).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "fp8_kernels.h"
#include "kernels.h"
#include "packed_linear.h"
#include "prefill_kernels.h"
#include "paddle/extension.h"

namespace {

constexpr int kAuto = 0, kAvx2 = 1, kAvx512 = 2;

using fdx86::cpu_has_avx2;
using fdx86::cpu_has_avx512_vnni;

int resolve_isa(int isa) {
  if (isa == kAuto) {
    if (cpu_has_avx512_vnni()) return kAvx512;
    if (cpu_has_avx2()) return kAvx2;
    PD_THROW("fd_x86: this CPU has neither AVX-512 VNNI nor AVX2+FMA; use fd-core's cpu backend");
  }
  if (isa == kAvx512) {
    PD_CHECK(cpu_has_avx512_vnni(), "fd_x86: isa=2 (AVX-512 VNNI) requested, but this CPU lacks it");
    return isa;
  }
  if (isa == kAvx2) {
    PD_CHECK(cpu_has_avx2(), "fd_x86: isa=1 (AVX2+FMA) requested, but this CPU lacks it");
    return isa;
  }
  PD_THROW("fd_x86: isa must be 0 (auto), 1 (avx2) or 2 (avx512), got ", isa);
}

// w8a8 (packed) with at least this many rows runs on AMX tiles where the
// CPU and OS allow them (fdx86::amx_available) and K % 64 == 0; fewer rows
// stay on the VNNI kernel: measured on a Xeon with AMX (README, "AMX"),
// AMX is ~1.1-1.2x at 8 rows on 2 threads but ~0.9x on 16, >= 1.3x from 12
constexpr int64_t kAmxMinRows = 12;

// AMX for w8a8 unless FD_X86_AMX=0 (read once per process)
bool amx_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("FD_X86_AMX");
    return !(env != nullptr && std::string(env) == "0") && fdx86::amx_available();
  }();
  return on;
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Checks the shared inputs; returns the args with M, N, K, pointers, output.
fdx86::LinearArgs prepare(const char* op, const paddle::Tensor& x, const paddle::Tensor& qweight,
                          const paddle::Tensor& scales, paddle::DataType wtype, int64_t k_per_row,
                          paddle::Tensor* out, int threads) {
  PD_CHECK(x.is_cpu() && qweight.is_cpu() && scales.is_cpu(), op, ": tensors must be on the CPU");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": x must be float32");
  PD_CHECK(x.shape().size() == 2, op, ": x must be 2-D [M, K]");
  PD_CHECK(x.is_contiguous() && qweight.is_contiguous() && scales.is_contiguous(), op,
           ": x, qweight and scales must be contiguous");
  PD_CHECK(qweight.dtype() == wtype, op, ": qweight has the wrong dtype");
  PD_CHECK(qweight.shape().size() == 2, op, ": qweight must be 2-D [N, K']");
  PD_CHECK(scales.dtype() == paddle::DataType::FLOAT32, op, ": scales must be float32");
  fdx86::LinearArgs a;
  a.M = x.shape()[0];
  a.K = x.shape()[1];
  a.N = qweight.shape()[0];
  PD_CHECK(qweight.shape()[1] * k_per_row == a.K, op, ": qweight is [", a.N, ", ", qweight.shape()[1],
           "], which does not match x's K = ", a.K);
  a.x = x.data<float>();
  a.w = qweight.data();
  a.scales = scales.data<float>();
  a.threads = threads < 1 ? 1 : threads;
  *out = paddle::empty({a.M, a.N}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  a.out = out->data<float>();
  return a;
}

}  // namespace

namespace fdx86 {

LinearArgs packed_linear_args(const char* op, const float* x, int64_t M, int64_t K, const paddle::Tensor& packed,
                              const paddle::Tensor& scales, int method, int64_t n, int group_size, int threads) {
  PD_CHECK(packed.is_cpu() && scales.is_cpu(), op, ": the packed weight and scales must be on the CPU");
  PD_CHECK(packed.is_contiguous() && scales.is_contiguous(), op, ": packed and scales must be contiguous");
  PD_CHECK(method >= 0 && method <= kDenseFp32Method, op, ": method must be 0 to ", kDenseFp32Method, ", got ", method);
  LinearArgs a;
  a.M = M;
  a.K = K;
  a.N = n;
  a.x = x;
  a.w = packed.data();
  a.threads = threads < 1 ? 1 : threads;
  if (method == kDense16Method || method == kDense16Method + 1 || method == kDenseFp32Method) {
    // a 16-bit or fp32 dense weight in the reference's layout [K, N], read in place; no scales
    const paddle::DataType want = method == kDense16Method       ? paddle::DataType::BFLOAT16
                                  : method == kDenseFp32Method ? paddle::DataType::FLOAT32
                                                               : paddle::DataType::FLOAT16;
    PD_CHECK(packed.dtype() == want, op, ": method ", method, " takes a ",
             want == paddle::DataType::BFLOAT16 ? "bfloat16" : want == paddle::DataType::FLOAT32 ? "float32" : "float16",
             " weight");
    PD_CHECK(packed.shape().size() == 2 && packed.shape()[0] == K && packed.shape()[1] == n, op,
             ": a dense weight must be [K, N] = [", K, ", ", n, "]");
    PD_CHECK(cpu_has_avx512_vnni(), op, ": the fused kernels need AVX-512 VNNI");
    return a;
  }
  if (method == kBlockFp8Method) {
    PD_CHECK(packed.dtype() == paddle::DataType::UINT8 && packed.numel() == n * K, op,
             ": a block_wise_fp8 weight must be uint8 [N, K] = [", n, ", ", K, "]");
    PD_CHECK(scales.dtype() == paddle::DataType::FLOAT32 && scales.numel() == ((n + 127) / 128) * ((K + 127) / 128),
             op, ": block_wise_fp8 scales must be float32 [", (n + 127) / 128, ", ", (K + 127) / 128, "]");
    PD_CHECK(cpu_has_avx512(), op, ": the fp8 kernels need AVX-512");
    a.scales = scales.data<float>();
    return a;
  }
  PD_CHECK(packed.dtype() == paddle::DataType::INT8 || packed.dtype() == paddle::DataType::UINT8, op,
           ": packed must be int8 / uint8");
  PD_CHECK(scales.dtype() == paddle::DataType::FLOAT32, op, ": scales must be float32");
  PD_CHECK(cpu_has_avx512_vnni(), op, ": the packed kernels need AVX-512 VNNI");
  a.scales = scales.data<float>();
  const int64_t n16 = round_up(a.N, 16);
  int64_t want = round_up(a.N, 32) * a.K;  // wint8: [N32][K][32]
  if (method == kWint4Bf16Act || method == kWint8Bf16Act)
    PD_CHECK(dense16_has_bf16_dot(), op, ": method ", method, " needs avx512_bf16");
  if (method == 1 || method == kWint4Int8Act || method == kWint4Bf16Act) {
    PD_CHECK(a.K % 2 == 0, op, ": wint4 needs an even K");
    a.group_size = group_size <= 0 ? a.K : group_size;
    PD_CHECK(a.group_size % 2 == 0, op, ": group_size must be even, got ", group_size);
    a.groups = (a.K + a.group_size - 1) / a.group_size;
    want = n16 * a.K / 2;
    PD_CHECK(method == 1 || (a.K % 8 == 0 && a.group_size % 8 == 0), op, ": method ", method,
             " needs the word layout (K and group_size multiples of 8), got K = ", a.K, ", group_size = ",
             a.group_size);
    PD_CHECK(scales.numel() == n16 * a.groups, op, ": packed wint4 scales must have ", n16 * a.groups,
             " values, got ", scales.numel());
  } else {
    if (method == 2) want = n16 * round_up(a.K, 4);
    if (method == kWint8Bf16Act) {
      PD_CHECK(packed.dtype() == paddle::DataType::INT8, op, ": a wint8 weight must be int8");
      PD_CHECK(a.K % 2 == 0, op, ": method ", method, " (wint8 pairs) needs an even K, got ", a.K);
    }
    if (method == 3 || method == kWint8Int8Act) {
      PD_CHECK(packed.dtype() == paddle::DataType::INT8, op, ": a wint8 weight must be int8");
      want = a.N * a.K;
    }
    PD_CHECK(scales.numel() == a.N, op, ": scales must have N = ", a.N, " entries");
  }
  PD_CHECK(packed.numel() == want, op, ": packed weight has ", packed.numel(), " bytes, expected ", want,
           " for K = ", a.K, ", N = ", a.N);
  return a;
}

// The calling thread's buffer for the bf16 activation pairs of methods 9 / 10, n dwords: kept
// between calls (a decode step makes ~70 of them), given back when a call needs under a quarter
// of what a long prefill left it holding (over 16 MiB), so one prefill does not pin its size.
static uint32_t* pairs_buffer(size_t n) {
  static thread_local std::vector<uint32_t> xb;
  if (xb.capacity() > (size_t(16) << 20) / sizeof(uint32_t) && n < xb.capacity() / 4) std::vector<uint32_t>().swap(xb);
  xb.resize(n);
  return xb.data();
}

void run_packed_linear(LinearArgs a, int method) {
  if (a.M == 0 || a.N == 0) return;
  if (method == kBlockFp8Method) {
    block_fp8_linear_f32(a.x, a.M, a.K, static_cast<const uint8_t*>(a.w), a.scales, a.N, a.out, a.threads, 0);
    return;
  }
  if (method == kDense16Method || method == kDense16Method + 1 || method == kDenseFp32Method) {
    Dense16Args d;
    d.M = a.M;
    d.N = a.N;
    d.K = a.K;
    d.x = a.x;
    d.ldx = a.K;
    d.w = a.w;
    d.wtype = method == kDense16Method ? kDense16Bf16 : method == kDenseFp32Method ? kDense16Fp32 : kDense16Fp16;
    d.out = a.out;
    d.threads = a.threads;
    dense16_linear_avx512(d);
  } else if (method == 0) {
    wint8_packed_avx512(a);
  } else if (method == 3) {
    wint8_avx512(a);
  } else if (method == 1) {
    wint4_packed_avx512(a);
  } else if (method == kWint4Int8Act) {
    a.ldq = round_up(a.K, 64);
    std::vector<int8_t> xq(a.M * a.ldq);
    std::vector<float> xscale(a.M);
    std::vector<int32_t> xsum(a.M), gsum(a.M * a.groups);
    quantize_rows_avx512(a.x, a.M, a.K, xq.data(), a.ldq, xscale.data(), xsum.data(), a.threads);
    wint4_vnni_prepare_avx512(xq.data(), a.M, a.K, a.ldq, a.group_size, a.groups, gsum.data(), a.threads);
    a.xq = xq.data();
    a.xscale = xscale.data();
    a.xsum = gsum.data();
    wint4_words_vnni_avx512(a);
  } else if (method == kWint4Bf16Act) {
    a.xb = pairs_buffer(a.M * a.K / 2);
    wint4_bf16_prepare_avx512(a.x, a.M, a.K, const_cast<uint32_t*>(a.xb), a.threads);
    wint4_words_bf16_avx512(a);
  } else if (method == kWint8Bf16Act) {
    a.xb = pairs_buffer(a.M * a.K / 2);
    wint8_bf16_prepare_avx512(a.x, a.M, a.K, const_cast<uint32_t*>(a.xb), a.threads);
    wint8_pairs_bf16_avx512(a);
  } else if (method == kWint8Int8Act) {
    a.ldq = round_up(a.K, 64);
    std::vector<int8_t> xq(a.M * a.ldq);
    std::vector<float> xscale(a.M);
    std::vector<int32_t> xsum(a.M);
    quantize_rows_avx512(a.x, a.M, a.K, xq.data(), a.ldq, xscale.data(), xsum.data(), a.threads);
    a.xq = xq.data();
    a.xscale = xscale.data();
    a.xsum = xsum.data();
    w8a8_avx512_vnni(a);
  } else {
    a.ldq = round_up(a.K, 64);
    std::vector<int8_t> xq(a.M * a.ldq);
    std::vector<float> xscale(a.M);
    std::vector<int32_t> xsum(a.M);
    quantize_rows_avx512(a.x, a.M, a.K, xq.data(), a.ldq, xscale.data(), xsum.data(), a.threads);
    a.xq = xq.data();
    a.xscale = xscale.data();
    a.xsum = xsum.data();
    if (!(a.M >= kAmxMinRows && a.K % 64 == 0 && amx_enabled() && w8a8_packed_amx(a))) w8a8_packed_avx512_vnni(a);
  }
}

}  // namespace fdx86


std::vector<paddle::Tensor> Wint8Linear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                        const paddle::Tensor& scales, int isa, int threads) {
  paddle::Tensor out;
  fdx86::LinearArgs a = prepare("fd_x86_wint8_linear", x, qweight, scales, paddle::DataType::INT8, 1, &out, threads);
  PD_CHECK(scales.numel() == a.N, "fd_x86_wint8_linear: scales must have N = ", a.N, " entries");
  if (a.M == 0 || a.N == 0) return {out};
  if (resolve_isa(isa) == kAvx512) fdx86::wint8_avx512(a); else fdx86::wint8_avx2(a);
  return {out};
}

std::vector<paddle::Tensor> Wint4Linear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                        const paddle::Tensor& scales, int isa, int threads, int group_size) {
  paddle::Tensor out;
  PD_CHECK(x.shape().size() == 2 && x.shape()[1] % 2 == 0, "fd_x86_wint4_linear: K must be even");
  fdx86::LinearArgs a = prepare("fd_x86_wint4_linear", x, qweight, scales, paddle::DataType::UINT8, 2, &out, threads);
  a.group_size = group_size <= 0 ? a.K : group_size;
  a.groups = a.N == 0 ? 1 : scales.numel() / a.N;
  PD_CHECK(a.group_size % 2 == 0, "fd_x86_wint4_linear: group_size must be even, got ", group_size);
  PD_CHECK(scales.numel() == a.N * a.groups && a.groups == (a.K + a.group_size - 1) / a.group_size,
           "fd_x86_wint4_linear: scales must be [N, ceil(K / group_size)] = [", a.N, ", ",
           (a.K + a.group_size - 1) / a.group_size, "], got ", scales.numel(), " values");
  if (a.M == 0 || a.N == 0) return {out};
  const int which = resolve_isa(isa);
  // x split into even / odd inputs, zero padded so vector loads may run past K/2
  const int64_t kh = a.K / 2;
  a.ldh = round_up(kh, 16) + 16;
  std::vector<float> xe(a.M * a.ldh, 0.0f), xo(a.M * a.ldh, 0.0f);
  for (int64_t m = 0; m < a.M; ++m) {
    const float* r = a.x + m * a.K;
    for (int64_t j = 0; j < kh; ++j) {
      xe[m * a.ldh + j] = r[2 * j];
      xo[m * a.ldh + j] = r[2 * j + 1];
    }
  }
  a.xe = xe.data();
  a.xo = xo.data();
  if (which == kAvx512) fdx86::wint4_avx512(a); else fdx86::wint4_avx2(a);
  return {out};
}

std::vector<paddle::Tensor> W8A8Linear(const paddle::Tensor& x, const paddle::Tensor& qweight,
                                       const paddle::Tensor& scales, int isa, int threads) {
  paddle::Tensor out;
  fdx86::LinearArgs a = prepare("fd_x86_w8a8_linear", x, qweight, scales, paddle::DataType::INT8, 1, &out, threads);
  PD_CHECK(scales.numel() == a.N, "fd_x86_w8a8_linear: scales must have N = ", a.N, " entries");
  if (a.M == 0 || a.N == 0) return {out};
  const int which = resolve_isa(isa);
  a.ldq = round_up(a.K, 64);
  std::vector<int8_t> xq(a.M * a.ldq);
  std::vector<float> xscale(a.M);
  std::vector<int32_t> xsum(a.M);
  if (which == kAvx512) {
    fdx86::quantize_rows_avx512(a.x, a.M, a.K, xq.data(), a.ldq, xscale.data(), xsum.data(), a.threads);
  } else {
    fdx86::quantize_rows_avx2(a.x, a.M, a.K, xq.data(), a.ldq, xscale.data(), xsum.data(), a.threads);
  }
  a.xq = xq.data();
  a.xscale = xscale.data();
  a.xsum = xsum.data();
  if (which == kAvx512) fdx86::w8a8_avx512_vnni(a); else fdx86::w8a8_avx2(a);
  return {out};
}

// The AVX-512 kernels on a weight packed by fd_x86.linear (see kernels.h):
// method 0 = wint8, 1 = wint4, 2 = w8a8; n = output features; group_size as
// for wint4 (-1 = K). Checks the packed sizes against x's K and n.
std::vector<paddle::Tensor> PackedLinear(const paddle::Tensor& x, const paddle::Tensor& packed,
                                         const paddle::Tensor& scales, int method, int64_t n, int group_size,
                                         int threads) {
  const char* op = "fd_x86_packed_linear";
  PD_CHECK(x.is_cpu(), op, ": x must be on the CPU");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2, op, ": x must be float32 [M, K]");
  PD_CHECK(x.is_contiguous(), op, ": x must be contiguous");
  fdx86::LinearArgs a = fdx86::packed_linear_args(op, x.data<float>(), x.shape()[0], x.shape()[1], packed, scales,
                                                  method, n, group_size, threads);
  paddle::Tensor out = paddle::empty({a.M, a.N}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  a.out = out.data<float>();
  fdx86::run_packed_linear(a, method);
  return {out};
}

std::vector<std::vector<int64_t>> PackedInferShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                   const std::vector<int64_t>& s, int method, int64_t n,
                                                   int group_size, int threads) {
  return {{x[0], n}};
}

std::vector<std::vector<int64_t>> LinearInferShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                   const std::vector<int64_t>& s) {
  return {{x[0], w[0]}};
}

std::vector<paddle::DataType> LinearInferDtype(const paddle::DataType& x, const paddle::DataType& w,
                                               const paddle::DataType& s) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_x86_wint8_linear)
    .Inputs({"X", "QWeight", "Scales"})
    .Outputs({"Out"})
    .Attrs({"isa: int", "threads: int"})
    .SetKernelFn(PD_KERNEL(Wint8Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearInferDtype));

PD_BUILD_OP(fd_x86_wint4_linear)
    .Inputs({"X", "QWeight", "Scales"})
    .Outputs({"Out"})
    .Attrs({"isa: int", "threads: int", "group_size: int"})
    .SetKernelFn(PD_KERNEL(Wint4Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearInferDtype));

PD_BUILD_OP(fd_x86_w8a8_linear)
    .Inputs({"X", "QWeight", "Scales"})
    .Outputs({"Out"})
    .Attrs({"isa: int", "threads: int"})
    .SetKernelFn(PD_KERNEL(W8A8Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearInferDtype));

PD_BUILD_OP(fd_x86_packed_linear)
    .Inputs({"X", "Packed", "Scales"})
    .Outputs({"Out"})
    .Attrs({"method: int", "n: int64_t", "group_size: int", "threads: int"})
    .SetKernelFn(PD_KERNEL(PackedLinear))
    .SetInferShapeFn(PD_INFER_SHAPE(PackedInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearInferDtype));

// ------------------------------------------------------------------------
// fd_x86_dense16_linear(x, w): x fp32 [M, K] @ w bf16 / fp16 [K, N] (the
// reference's layout, read in place) -> out fp32 [M, N]. Attributes: threads
// (OpenMP threads over the outputs), kernel (0 = auto, 1 = stream: exact
// fp32 products, 2 = bf16 GEMM: x rounded to bf16; see kernels.h). Needs
// AVX-512 F/BW/VL/DQ, and avx512_bf16 for kernel 2.


std::vector<paddle::Tensor> Dense16Linear(const paddle::Tensor& x, const paddle::Tensor& w, int threads, int kernel) {
  const char* op = "fd_x86_dense16_linear";
  PD_CHECK(x.is_cpu() && w.is_cpu(), op, ": x and w must be on the CPU");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": x must be float32, got ", x.dtype());
  PD_CHECK(w.dtype() == paddle::DataType::BFLOAT16 || w.dtype() == paddle::DataType::FLOAT16 ||
               w.dtype() == paddle::DataType::FLOAT32,
           op, ": w must be bfloat16, float16 or float32, got ", w.dtype());
  PD_CHECK(x.shape().size() == 2, op, ": x must be 2-D [M, K], got ", x.shape().size(), " dims");
  PD_CHECK(w.shape().size() == 2, op, ": w must be 2-D [K, N], got ", w.shape().size(), " dims");
  PD_CHECK(x.is_contiguous() && w.is_contiguous(), op, ": x and w must be contiguous");
  PD_CHECK(x.shape()[1] == w.shape()[0], op, ": x has K = ", x.shape()[1], " input features, w [K, N] has ",
           w.shape()[0]);
  PD_CHECK(kernel == fdx86::kDense16Auto || kernel == fdx86::kDense16Stream || kernel == fdx86::kDense16Gemm ||
               kernel == fdx86::kDense16Panel,
           op, ": kernel must be 0 (auto), 1 (stream), 2 (bf16 GEMM) or 4 (panel), got ", kernel);
  PD_CHECK(fdx86::cpu_has_avx512(), op, ": needs AVX-512 F/BW/VL/DQ, which this CPU lacks");
  fdx86::Dense16Args a;
  a.M = x.shape()[0];
  a.K = x.shape()[1];
  a.N = w.shape()[1];
  a.x = x.data<float>();
  a.ldx = a.K;
  a.w = w.data();
  a.wtype = w.dtype() == paddle::DataType::BFLOAT16  ? fdx86::kDense16Bf16
            : w.dtype() == paddle::DataType::FLOAT32 ? fdx86::kDense16Fp32
                                                     : fdx86::kDense16Fp16;
  a.threads = threads < 1 ? 1 : threads;
  a.kernel = kernel;
  PD_CHECK(kernel != fdx86::kDense16Gemm || (a.wtype == fdx86::kDense16Bf16 && fdx86::dense16_has_bf16_dot()), op,
           ": kernel 2 (bf16 GEMM) needs bfloat16 weights and a CPU with avx512_bf16");
  paddle::Tensor out = paddle::empty({a.M, a.N}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  a.out = out.data<float>();
  fdx86::dense16_linear_avx512(a);
  return {out};
}

std::vector<std::vector<int64_t>> Dense16InferShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  return {{x[0], w[1]}};
}

std::vector<paddle::DataType> Dense16InferDtype(const paddle::DataType& x, const paddle::DataType& w) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fd_x86_dense16_linear)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"threads: int", "kernel: int"})
    .SetKernelFn(PD_KERNEL(Dense16Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(Dense16InferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Dense16InferDtype));
