// fd_x86 block-wise fp8 (e4m3) linear kernels (kernels_fp8_avx512.cc): the
// ISA-independent interface, as kernels.h (no paddle or STL headers in the
// kernel TU).
//
// Layout (fd_core.quantization.block_fp8, FastDeploy's block_wise_fp8):
//   qweight uint8 [N, K]: e4m3fn bit patterns, a row per output channel;
//   scales fp32 [ceil(N/128), ceil(K/128)]: one per 128 x 128 block.
#pragma once
#include <cstdint>

namespace fdx86 {

struct Fp8LinearArgs {
  int64_t M = 0, N = 0, K = 0;
  const float* xq = nullptr;       // [M, K]: e4m3-rounded activations (values, unscaled)
  const float* xscale = nullptr;   // [M, KB]: their per-token-group scales
  const uint8_t* w = nullptr;      // [N, K] e4m3 codes
  const float* wscale = nullptr;   // [NB, KB]
  float* out = nullptr;            // [M, N]
  int threads = 1;
};

// FastDeploy's per_token_quant: per row and group of 128 inputs,
// s = max(max|x|, 1e-10) / 448, xq = e4m3_rne(clip(x / s, -448, 448)).
// Writes xq [M, K] (as float values) and xscale [M, ceil(K/128)].
void fp8_quantize_rows_avx512(const float* x, int64_t M, int64_t K, float* xq, float* xscale, int threads);

// out[m, n] = sum_g (sum_{k in g} xq[m, k] * e4m3(w[n, k])) * xscale[m, g] * wscale[n / 128, g]
// with the e4m3 weights decoded in registers (through fp16: vcvtph2ps).
void block_fp8_linear_avx512(const Fp8LinearArgs& a);

}  // namespace fdx86
