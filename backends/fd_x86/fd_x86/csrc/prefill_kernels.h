// fd_x86 opt-in prefill kernels (kernels_prefill_avx512.cc): weight-only
// int4 weights against per-token int8 activations on AVX-512 VNNI. The
// ISA-independent interface, as kernels.h (no paddle or STL headers in the
// kernel TU).
#pragma once
#include <cstdint>

#include "kernels.h"

namespace fdx86 {

// Per-token int8 activations for wint4_words_vnni_avx512: xq [M, ldq] from
// quantize_rows_* (ldq >= K, K % 8 == 0) is permuted in place within every
// 8 inputs to [x0 x2 x4 x6 | x1 x3 x5 x7] (the order of the low / high
// nibbles of a packed word) and gsum [M, G] receives each group's sum of
// codes (group_size % 8 == 0).
void wint4_vnni_prepare_avx512(int8_t* xq, int64_t M, int64_t K, int64_t ldq, int64_t group_size, int64_t groups,
                               int32_t* gsum, int threads);

// out [M, N] = xscale[m] * sum_g scale[n, g] * sum_{k in g} code[n, k] * xq[m, k]
// on the packed wint4 word layout (fd_x86.linear.pack_weight: uint32
// [N16][K/8][16], scales [N16][G][16]). Each group's dot product is exact in
// int32 (vpdpbusd on code + 8 as the unsigned operand, minus 8 * gsum); the
// groups accumulate in fp32 in ascending order. a.xq / a.ldq / a.xscale as
// prepared above, a.xsum = gsum [M, G].
void wint4_words_vnni_avx512(const LinearArgs& a);

}  // namespace fdx86
