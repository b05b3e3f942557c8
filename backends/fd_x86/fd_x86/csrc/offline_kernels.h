// fd_x86 kernels for the offline-checkpoint expert formats
// (kernels_offline_avx512.cc): FastDeploy's W4A8C8 experts (fd-core's
// ``w4a8_static``) and 2Bits experts (``wint2``), on fd-core's layouts read
// in place (fd_core/quantization/w4a8.py, wint2.py); and fd-core's dynamic
// ``w4a8`` on the contract int4 layout (kernels_w4a8_avx512.cc), which the
// MoE ops run for routed and shared experts. The ISA-independent
// interface, as kernels.h (no paddle or STL headers in the kernel TU).
#pragma once
#include <cstdint>

#include "kernels.h"

namespace fdx86 {

// w4a8_static: x [M, K] fp32 -> int8 codes with the matrix's static
// activation max `amax` exactly as the reference: xq = clip(rint(x * (127 /
// amax)), -127, 127) (one fp32 division, one fp32 product, half to even).
// Written split by parity: row m's even inputs at xq[m * 2 * ldh + k / 2],
// its odd ones at xq[m * 2 * ldh + ldh + k / 2] (ldh >= K / 2, a multiple
// of 64, zero padded), xsum[m] = the row's sum of codes.
void w4a8s_quantize_avx512(const float* x, int64_t M, int64_t K, float amax, int8_t* xq, int64_t ldh,
                           int32_t* xsum);

// out [M, N] = (sum_k xq[m, k] * q[n, k]) * s_w[n] * (amax / 127) on the
// contract int4 layout (a.w uint8 [N, K/2], byte j = inputs 2j (low nibble)
// and 2j + 1, signed); a.scales [N, 2] = (s_w, amax) per channel. The dot
// products are exact in int32 (vpdpbusd on code + 8, minus 8 * xsum).
// a.xq / a.ldh / a.xsum as w4a8s_quantize_avx512 wrote them. AVX-512 VNNI.
void w4a8s_avx512_vnni(const LinearArgs& a);

// wint2: out [M, N] = x [M, K] @ W with W decoded in registers from
// a.w uint8 [K/4, N] and a.scales fp32 [K/64 + 3, N] (group nibbles, then
// super_scales, code_scale, code_zp), each weight as the reference computes
// it (code = floor(byte * code_scale + code_zp + 0.5) in separately rounded
// fp32 steps, q = window - 32); per 64-input group sum_k x * q in fp32, times
// the group scale (nibble * super_scale, the reference's product), summed
// over the groups: the reference's x @ (q * scale) up to fp32 rounding
// order (a single weight, x one-hot, is reproduced bit for bit).
// K % 128 == 0. a.xe = x with input k scaled by 2^-(9 - 3 (k % 4))
// (wint2_scale_rows). AVX-512 F/BW/VL/DQ.
void wint2_avx512(const LinearArgs& a);
void wint2_scale_rows(const float* x, int64_t M, int64_t K, float* xs);

// w4a8 (kernels_w4a8_avx512.cc): int8 codes xq [M, ldq] as
// quantize_rows_avx512 wrote them (the reference's per-token codes) ->
// planes: row m's even inputs at planes[m * 2 * ldh + k / 2], its odd ones
// at planes[m * 2 * ldh + ldh + k / 2] (ldh >= K / 2), gsum [M, G] = each
// group's sum of codes. K and group_size multiples of 128, G = K / group_size.
void w4a8_split_avx512(const int8_t* xq, int64_t M, int64_t K, int64_t ldq, int64_t group_size, int8_t* planes,
                       int64_t ldh, int32_t* gsum);

// out [M, N] = xscale[m] * sum_g scales[n, g] * (sum_{k in g} xq[m, k] * q[n, k])
// on the contract int4 layout (a.w uint8 [N, K/2], signed nibbles, low =
// even input; a.scales fp32 [N, G], a.groups = G, a.group_size: a multiple of
// 128, K = G * group_size). a.xq / a.ldh / a.xsum (= gsum) as
// w4a8_split_avx512 wrote them, a.xscale the tokens' scales. Each group's dot
// product is exact in int32 (vpdpbusd on code + 8, minus 8 * gsum), then
// fp32; every (row, channel) value is summed in one order whatever M, the
// tiles or the channel range (batch invariant). AVX-512 VNNI.
void w4a8_avx512_vnni(const LinearArgs& a);

}  // namespace fdx86
