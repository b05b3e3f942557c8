// fd_x86 vision-tower attention (kernels_vision_avx512.cc): the kernel of
// fd_vision_attention (fd_core/plugins/hookspecs.py). The ISA-independent
// interface, as kernels.h (no paddle or STL headers in the kernel TU).
#pragma once
#include <cstdint>

namespace fdx86 {

// out [N, H*Dh] = per frame f (rows cu[f] .. cu[f+1]) and head h:
//   softmax(rot(q) rot(k)^T * scale) v
// with qkv [N, 3*H*Dh] (rows [q | k | v]), rot(x) = [x1*cos - x2*sin, x2*cos + x1*sin]
// for x = [x1 | x2] and cos, sin [N, Dh/2]. Dh even, at most kVisionMaxHeadDim.
// cu [frames + 1] rises from 0 to N. Needs AVX-512 F/BW/VL/DQ. False when its scratch
// (about 3 N*H*Dh floats) cannot be allocated.
constexpr int64_t kVisionMaxHeadDim = 512;

bool vision_attention_avx512(const float* qkv, const float* cos, const float* sin, const int64_t* cu,
                             int64_t frames, int64_t N, int64_t H, int64_t Dh, float scale, float* out,
                             int threads);

}  // namespace fdx86
