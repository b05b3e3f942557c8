// The packed linear kernels as the ops call them (x86_linear_op.cc):
// checking a packed weight against its input, and running the kernel of its
// method (w8a8: the per-token activation quantization first, AMX tiles or
// VNNI). Shared by fd_x86_packed_linear and the fused decoder layer
// (x86_ops.cc). Baseline x86-64 code with paddle headers, like the ops.
#pragma once
#include <cstdint>

#include "kernels.h"
#include "paddle/extension.h"

namespace fdx86 {

// Checks `packed` / `scales` (fd_x86.linear.pack_weight's layout for
// method 0 = wint8, 1 = wint4, 2 = w8a8; 3 = wint8 in the contract layout
// [N, K], whose dot-product tiles win from 8 rows; 4 = an unquantized bf16
// and 5 = fp16 weight in the reference's layout [K, N], run by
// dense16_linear_avx512, scales unused) for x [M, K] and n outputs
// (group_size: wint4's, -1 = K) and returns the args; a.out is left unset.
constexpr int kDense16Method = 4;
// Opt-in int8-activation kernels for prefill-sized calls (fd_x86.linear,
// FD_X86_PREFILL_INT8_ACT): the activations quantized per token to int8 as
// w8a8 does, then 6 = packed wint4 words (method 1's weight, word layout
// only) on VNNI with group-wise scales (wint4_words_vnni_avx512), 7 = a
// wint8 weight in the contract layout [N, K] (method 3's) on w8a8's VNNI
// kernel (wint8 and w8a8 share the weight format).
constexpr int kWint4Int8Act = 6, kWint8Int8Act = 7;
// 8 = a block_wise_fp8 weight read in place: uint8 e4m3 codes [N, K], scales
// fp32 [ceil(N/128), ceil(K/128)] (fp8_kernels.h's block_fp8_linear_f32).
constexpr int kBlockFp8Method = 8;
// 9 = packed wint4 words (method 1's weight, word layout only) against the
// activations rounded to bf16 (wint4_words_bf16_avx512; avx512_bf16): for a
// model whose activations are bf16 (fd_x86.linear, FD_X86_INT4_BF16).
constexpr int kWint4Bf16Act = 9;
// 10 = wint8 in the packed pairs layout (fd_x86.linear.pack_weight's
// "wint8_pairs": int8 [N32][K/2][64], K even) against the activations rounded
// to bf16 (wint8_pairs_bf16_avx512; avx512_bf16), at every row count.
constexpr int kWint8Bf16Act = 10;
// 11 = an unquantized fp32 weight in the reference's layout [K, N], read in place by
// dense16_linear_avx512's kernels (scales unused): an fp32 model's linears in the run.
constexpr int kDenseFp32Method = 11;
LinearArgs packed_linear_args(const char* op, const float* x, int64_t M, int64_t K, const paddle::Tensor& packed,
                              const paddle::Tensor& scales, int method, int64_t n, int group_size, int threads);

// out[M, N] = the method's packed kernel on args from packed_linear_args.
void run_packed_linear(LinearArgs a, int method);

}  // namespace fdx86
