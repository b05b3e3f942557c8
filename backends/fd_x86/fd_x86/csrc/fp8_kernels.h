// fd_x86 block-wise fp8 (e4m3) linear kernels (kernels_fp8_avx512.cc: AVX-512
// fp32 FMAs; kernels_fp8_bf16.cc: AVX-512 BF16 + VBMI vdpbf16ps): the
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
// with the e4m3 weights decoded in registers (through fp16: vcvtph2ps) and fp32 FMAs.
void block_fp8_linear_avx512(const Fp8LinearArgs& a);

// The AVX-512 BF16 + VBMI path (kernels_fp8_bf16.cc): activations as the
// bf16 of their e4m3 values (exact), each 64-input chunk stored in the
// decoder's order (its first 32 words inputs {0..7, 16..23, 32..39, 48..55},
// then the rest), rows padded with zeros to Kp = ceil(K / 64) * 64.
struct Fp8Bf16Args {
  int64_t M = 0, N = 0, K = 0;
  const uint16_t* xb = nullptr;    // [M, Kp] bf16 bits of the e4m3-rounded activations, chunk order above
  const float* xscale = nullptr;   // [M, KB]
  const uint8_t* w = nullptr;      // [N, K] e4m3 codes
  const float* wscale = nullptr;   // [NB, KB]
  float* out = nullptr;            // [M, N]
  int threads = 1;
};

// fp8_quantize_rows_avx512's codes and scales, written as Fp8Bf16Args.xb wants them.
void fp8_quantize_rows_bf16(const float* x, int64_t M, int64_t K, uint16_t* xb, float* xscale, int threads);

// The same product as block_fp8_linear_avx512, by vdpbf16ps on weights decoded to bf16 (exact).
void block_fp8_linear_bf16(const Fp8Bf16Args& a);

// Defined in x86_fp8_op.cc (baseline code: it asks the CPU). Whether the bf16
// kernel can run here (AVX-512 F/BW/VL/DQ + BF16 + VBMI).
bool cpu_has_fp8_bf16();

// out [M, N] = x [M, K] (fp32) through the activation quantization and the
// kernel (0: the bf16 one where cpu_has_fp8_bf16, else the FMA one; 1: FMA;
// 2: bf16) with its scratch. Needs AVX-512 F/BW/VL/DQ (the caller checks).
// Shared by fd_x86_block_fp8_linear and the fused decoder layer
// (packed_linear.h's kBlockFp8Method).
void block_fp8_linear_f32(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* wscale, int64_t N,
                          float* out, int threads, int kernel);

}  // namespace fdx86
