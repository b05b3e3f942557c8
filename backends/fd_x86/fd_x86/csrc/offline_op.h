// The offline-checkpoint expert formats as the MoE ops and the linear op
// call them (x86_offline_op.cc): fd-core's w4a8_static and wint2 layouts
// checked and addressed, and their kernels (offline_kernels.h) run with the
// activation preparation they need. Baseline x86-64 code with paddle headers.
#pragma once
#include <cstdint>
#include <vector>

#include "paddle/extension.h"

namespace fdx86 {

// fd_x86_moe_experts' / fd_x86_moe_layer's ``method`` codes past wint8 (0),
// wint4 (1) and w8a8 (2).
constexpr int kMoeW4a8Static = 3, kMoeWint2 = 4;

inline bool moe_offline_method(int method) { return method == kMoeW4a8Static || method == kMoeWint2; }

// A stacked (dims 3, [E, ...]) or single (dims 2) weight of an offline
// `method` for K inputs: checks qweight's dtype and shape and sets N (output
// channels), the bytes per expert over N (``row_bytes``: an expert is
// N * row_bytes bytes) and the scales per expert over N (``groups``).
//   w4a8_static: qweight uint8 [.., N, K/2], scales [.., N, 2]
//   wint2:       qweight uint8 [.., K/4, N], scales [.., K/64 + 3, N]
void moe_offline_layout(const char* name, int method, const paddle::Tensor& qweight, size_t dims, int64_t K,
                        int64_t* N, int64_t* row_bytes, int64_t* groups);

// out [M, N] = x [M, K] @ one matrix of `method` (w: its bytes, scales: its
// scales, as moe_offline_layout addresses them). xq / xsum (w4a8_static),
// xs (wint2): scratch reused across calls. Needs AVX-512 VNNI (checked).
void offline_linear(int method, const uint8_t* w, const float* scales, const float* x, int64_t M, int64_t N,
                    int64_t K, float* out, int threads, std::vector<int8_t>* xq, std::vector<int32_t>* xsum,
                    std::vector<float>* xs);

}  // namespace fdx86
