// The engine's draw of one token from a row of logits (x86_sample_op.cc), for fd_x86_sample and the
// multi-step run (x86_ops.cc's fd_x86_run_plan_steps), so both give a row's logits the same token.
#pragma once
#include <cstdint>

namespace fdx86 {

// The first index of the row's largest value, a NaN counting as larger than any number (the first NaN wins):
// numpy's argmax over float32, the engine's greedy token. AVX-512 where the CPU has it (11x a plain loop over a
// warm 103424-wide row: 13 against 142 us, Zen 4, a standalone loop) unless FD_X86_SAMPLE_ISA=portable.
int64_t greedy_token(const float* row, int64_t n);

// One token from row[0, n) with fd_core.ops.sampling's "sort" draw at uniform u (temperature 0: greedy_token).
// `threads` > 1 splits the row's weights over two OpenMP threads (call it so from outside a parallel region,
// one row at a time); the token does not depend on it, to the bit.
int64_t sample_row(const float* row, int64_t n, float temperature, int64_t top_k, float top_p, float min_p, float u,
                   int threads);

}  // namespace fdx86
