// The loop nest shared by every kernel TU; included *after* the TU's
// `#pragma GCC target`, so it is compiled for that ISA. Internal linkage
// only (anonymous namespace): see kernels.h.
//
// Work split: OpenMP over chunks of kOutChunk output channels (each thread
// streams its own rows of W, read from memory once per kRowChunk rows of x);
// inside a chunk, register tiles of MB rows of x x NB output channels, with
// the dot products running along K (W's rows are contiguous in K).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels.h"

namespace {

// The contract layouts' tiles (the MoE experts' weights, read in place) take
// NB adjacent channels: NB rows of W, one run. RunPrefetch fetches that run in
// address order, `ahead` bytes in front, one line per next() (a call per
// 64-byte line loaded). Each kernel used to prefetch per row (NB streams a row
// apart, each row ahead or the next tile's rows at the same k); the same
// lines in address order made B=1 MoE decode steps 1.03-1.55x faster (Zen 4,
// 2 threads, same process; each kernel's figures beside its distance; B=8
// 0.98-1.07x). Into L2 (T1) since session 20, as every weight stream's software
// prefetch in fd_x86 (kernels_dense16.cc, packed_drive.h, kernels_avx512.cc,
// kernels_int8_bf16.cc): L1's few miss buffers and 32 KB were held by lines
// fetched thousands of bytes early. All sites at once against T0, the
// 0.3B's decode step (Zen 4, 2 threads, same process): B=1 fp32 1.04x, bf16
// 1.08x, wint8 (bf16 head) 1.08x, w8a8 + w8a8 head 1.12x, all-int4 1.04x,
// w4a8 + w4a8 head 0.99x; mid-size MoE w4a8 + head B=1 1.02x, wint4 1.00x,
// w8a8 B=8 1.08x; 0.3B wint8 B=8 0.98x (the packed, int8 and int4 sites each
// alone there: 1.00x).
struct RunPrefetch {
  const char* p;
  RunPrefetch(const void* run, int64_t ahead) : p(static_cast<const char*>(run) + ahead) {}
  void next() {
    _mm_prefetch(p, _MM_HINT_T1);
    p += 64;
  }
};
// The int8 contract kernels' distance (kernels_avx512.cc, kernels_int8_bf16.cc); the int4 ones keep their own
// kPrefetchAhead (8 KiB too), which benchmarks/x86_prefetch/run.sh varies.
constexpr int64_t kContractPrefetch = 8192;

constexpr int64_t kOutChunk = 32;  // output channels per parallel work item
constexpr int64_t kRowChunk = 64;  // rows of x per pass over a chunk of W
// Below this many multiply-adds a call runs on one thread: waking the team
// costs more than it saves (and much more when the cores are oversubscribed).
constexpr int64_t kMinParallelMacs = int64_t(1) << 20;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <class Kern, int NB>
inline void run_rows(const fdx86::LinearArgs& a, int64_t m0, int64_t m1, int64_t n) {
  int64_t m = m0;
  for (; m + Kern::kMaxRows <= m1; m += Kern::kMaxRows) Kern::template tile<Kern::kMaxRows, NB>(a, m, n);
  const int64_t rest = m1 - m;
  if (rest == 1) Kern::template tile<1, NB>(a, m, n);
  if constexpr (Kern::kMaxRows > 2) {
    if (rest == 2) Kern::template tile<2, NB>(a, m, n);
  }
  if constexpr (Kern::kMaxRows > 3) {
    if (rest == 3) Kern::template tile<3, NB>(a, m, n);
  }
}

template <class Kern>
void drive(const fdx86::LinearArgs& a) {
  const int64_t chunks = (a.N + kOutChunk - 1) / kOutChunk;
  const bool parallel = a.threads > 1 && chunks > 1 && a.M * a.N * a.K >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(a.threads) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n0 = c * kOutChunk, n1 = min64(n0 + kOutChunk, a.N);
    for (int64_t m0 = 0; m0 < a.M; m0 += kRowChunk) {
      const int64_t m1 = min64(m0 + kRowChunk, a.M);
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) run_rows<Kern, 4>(a, m0, m1, n);
      for (; n < n1; ++n) run_rows<Kern, 1>(a, m0, m1, n);
    }
  }
}

}  // namespace
