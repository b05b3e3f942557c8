// The sampler's per-row arguments as fd_x86_sample and fd_x86_run_plan_steps take them (x86_sample_op.cc).
#pragma once
#include <cstdint>

#include "paddle/extension.h"

namespace fdx86 {

// Refuses (PD_CHECK, naming `op` and the argument) anything but contiguous host tensors of `rows` values:
// temperature, top_p and min_p fp32, top_k int64.
void check_sampling_rows(const char* op, int64_t rows, const paddle::Tensor& temperature, const paddle::Tensor& top_k,
                         const paddle::Tensor& top_p, const paddle::Tensor& min_p);

}  // namespace fdx86
