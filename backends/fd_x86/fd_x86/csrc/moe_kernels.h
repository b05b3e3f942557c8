// fd_x86 MoE expert kernels (kernels_moe_avx512.cc): the ISA-independent
// interface, as kernels.h (no paddle or STL headers in the kernel TU).
#pragma once
#include "kernels.h"

namespace fdx86 {

// wint4 on the contract layout (qweight uint8 [N, K/2], scales [N, G]) for
// few rows, with a 16-entry lookup table per (channel, group): one 64-byte
// load brings a channel's 128 codes as 16 uint32 lanes (lane l = inputs
// 8l .. 8l+7 of the block, input 8l+t in bits 4t..4t+3); vpermps turns the
// low 4 bits of every lane into code * scale (the table is the 16 code
// values times the group's scale: the reference's dequantized weight, exact),
// then a 4-bit shift brings the next input. Per 16 weights: a shift, a
// vpermps and an FMA per row, against the contract kernel's ~15 per 32.
// Needs K % kWint4LutBlock == 0 and group_size % kWint4LutBlock == 0, and
// a.xe = x permuted per block of 128 inputs: xe[m][128b + 16t + l] =
// x[m][128b + 8l + t] (wint4_lut_permute), a.ldh = K.
constexpr int64_t kWint4LutBlock = 128;
void wint4_lut_permute(const float* x, int64_t M, int64_t K, float* xp);
void wint4_lut_avx512(const LinearArgs& a);

// The same weights against the activations rounded to bf16 (kernels_int4_bf16.cc;
// avx512_bf16): a.xb [M, K/2] from wint4_lut_bf16_prepare_avx512 (per block of
// 128 inputs, dword 16t + l = bf16(x[8l+t]) | bf16(x[8l+t+4]) << 16, t < 4);
// the unscaled codes times them on vdpbf16ps, each group's products summed in
// fp32 and then scaled (the groups in ascending order, each a sum of 16 lanes at
// the end). Same K / group_size requirements as wint4_lut_avx512.
void wint4_lut_bf16_prepare_avx512(const float* x, int64_t M, int64_t K, uint32_t* xb);
void wint4_lut_bf16_avx512(const LinearArgs& a);

// Router logits: out [T, E] = x [T, D] @ gate [D, E] in fp32, each logit
// summed over d in ascending order (one FMA chain per 16 experts); threads
// over tokens when the call is large.
void router_logits_avx512(const float* x, int64_t T, int64_t D, const float* gate, int64_t E, float* out,
                          int threads);

}  // namespace fdx86
