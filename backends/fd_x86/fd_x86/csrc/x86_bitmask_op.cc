// Paddle custom operator for structured output's token mask (fd_apply_token_bitmask):
//
//   fd_x86_apply_token_bitmask(logits, bitmask, rows)   in place (logits)
//
// logits [N, V] fp32, bitmask [M, W] int32, rows [M] int64, all contiguous CPU
// tensors. Bit j (little-endian) of word w of bitmask row k allows token
// 32 w + j of logits row rows[k]; every other token of that row, and every
// column past 32 W, becomes -inf. Rows not named are untouched. On AVX-512
// each 16 tokens take one masked store of -inf (the forbidden lanes only: the
// logits are never read); elsewhere a plain loop. Rows are split over threads.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_features.h"
#include "paddle/extension.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void mask_row_scalar(float* row, const int32_t* words, int64_t vocab, int64_t nwords) {
  const int64_t covered = std::min<int64_t>(vocab, nwords * 32);
  for (int64_t t = 0; t < covered; ++t)
    if (!((static_cast<uint32_t>(words[t >> 5]) >> (t & 31)) & 1u)) row[t] = kNegInf;
  for (int64_t t = covered; t < vocab; ++t) row[t] = kNegInf;
}

__attribute__((target("avx512f,avx512bw"))) void mask_row_avx512(float* row, const int32_t* words, int64_t vocab,
                                                                  int64_t nwords) {
  const __m512 neg = _mm512_set1_ps(kNegInf);
  const int64_t covered = std::min<int64_t>(vocab, nwords * 32);
  const int64_t full = covered / 16;  // whole 16-token groups inside the mask and the row
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(words);  // little-endian: group g = bits 16g..16g+15
  for (int64_t g = 0; g < full; ++g) {
    const __mmask16 forbid = static_cast<__mmask16>(~halves[g]);
    if (forbid) _mm512_mask_storeu_ps(row + 16 * g, forbid, neg);
  }
  for (int64_t t = full * 16; t < covered; ++t)
    if (!((static_cast<uint32_t>(words[t >> 5]) >> (t & 31)) & 1u)) row[t] = kNegInf;
  for (int64_t t = covered; t < vocab; ++t) row[t] = kNegInf;
}

void ApplyTokenBitmask(paddle::Tensor& logits, const paddle::Tensor& bitmask, const paddle::Tensor& rows,
                       int threads) {
  const char* op = "fd_x86_apply_token_bitmask";
  PD_CHECK(logits.is_cpu() && logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2, op,
           ": logits must be a 2-D float32 CPU tensor");
  PD_CHECK(bitmask.is_cpu() && bitmask.dtype() == paddle::DataType::INT32 && bitmask.shape().size() == 2, op,
           ": bitmask must be a 2-D int32 CPU tensor");
  PD_CHECK(rows.is_cpu() && rows.dtype() == paddle::DataType::INT64 && rows.shape().size() == 1, op,
           ": rows must be a 1-D int64 CPU tensor");
  const int64_t n = logits.shape()[0], vocab = logits.shape()[1];
  const int64_t m = bitmask.shape()[0], nwords = bitmask.shape()[1];
  PD_CHECK(rows.shape()[0] == m, op, ": bitmask has ", m, " rows but ", rows.shape()[0], " logits rows were named");
  const int64_t* idx = rows.data<int64_t>();
  for (int64_t k = 0; k < m; ++k) PD_CHECK(idx[k] >= 0 && idx[k] < n, op, ": row ", idx[k], " is outside [0, ", n, ")");
  PD_CHECK(logits.is_contiguous() && bitmask.is_contiguous() && rows.is_contiguous(), op,
           ": logits, bitmask and rows must be contiguous");
  float* data = logits.data<float>();
  const int32_t* bits = bitmask.data<int32_t>();
  const bool wide = fdx86::cpu_has_avx512();
  const int team = (threads > 1 && m > 1 && m * vocab >= (1 << 16)) ? static_cast<int>(std::min<int64_t>(threads, m)) : 1;
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t k = 0; k < m; ++k) {
    float* row = data + idx[k] * vocab;
    if (wide)
      mask_row_avx512(row, bits + k * nwords, vocab, nwords);
    else
      mask_row_scalar(row, bits + k * nwords, vocab, nwords);
  }
}

}  // namespace

PD_BUILD_OP(fd_x86_apply_token_bitmask)
    .Inputs({"Logits", "Bitmask", "Rows"})
    .Outputs({"LogitsOut"})
    .Attrs({"threads: int"})
    .SetInplaceMap({{"Logits", "LogitsOut"}})
    .SetKernelFn(PD_KERNEL(ApplyTokenBitmask));
