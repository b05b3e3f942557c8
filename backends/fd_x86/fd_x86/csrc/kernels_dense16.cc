// Dense linears on unquantized weights (bf16 / fp16 / fp32) in the
// reference's layout: W [K, N] (row k = input k, contiguous over the N
// outputs), x fp32 [M, K], out fp32 [M, N]. No repacked copy of W is kept:
// each call reads W once, in its own dtype.
//
// Three kernels (stream here, with the one-row split and the dispatch; panel and
// the bf16 GEMM in kernels_dense16_gemm.cc, one driver):
//   stream: W widened to fp32 in registers (bf16: << 16; fp16: vcvtph2ps;
//           fp32 as it is), fp32 FMA with broadcast x: the reference's
//           operands (the widened weight is exact) in fp32 arithmetic, so
//           results match it up to fp32 summation order. Any M; the choice at
//           1-4 rows (each thread then reads a contiguous run of W's rows into
//           partial sums), for a wide 16-bit W (the LM head) at few rows, and
//           for an fp32 W at every M (from 5 rows its own direct tiles, 8 rows
//           x 48 outputs, which read W in place).
//   panel:  the stream kernel's arithmetic, bit for bit at 2+ rows, on W
//           widened into fp32 panels per thread and read by register tiles of
//           6 rows x 64 outputs: the choice for more rows where the bf16 GEMM
//           is not taken (fp16 weights, bf16 below its threshold).
//   bf16 GEMM (avx512_bf16): per 64-output tile and chunk of kGemmKc inputs,
//           W is packed into thread-local scratch in vdpbf16ps's
//           pair-interleaved layout [Kc/2][64][2] and reused by every row of
//           x; x is rounded to bf16 (RNE) once per call. Products of two
//           bf16s are exact in fp32, so the only extra error is x's rounding:
//           |out - ref| <= 2^-9 * sum_k |x_k w_k| (+ fp32 summation).
//
// Compiled for AVX-512 F/BW/VL/DQ by the pragma below. Only called after
// __builtin_cpu_supports says so (x86_linear_op.cc).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "dense16_common.h"

namespace {

// The stream kernel walks W in chunks of a few rows: inside a chunk it
// sweeps the thread's outputs tile by tile, so each of the chunk's rows is read
// as one sequential stream (a whole-K column tile would read 256 B per row at
// a stride of 2N bytes: a new DRAM page, and TLB entry, per row for the LM
// head). The accumulators go through `out` once per chunk, so more rows of x
// (one register tile's worth and up) take longer chunks. Software prefetch
// reads the W of the tile that many tiles later (kStreamRows rows or fewer:
// 8 tiles = 2 KB ahead along each row, into the next chunk's rows at a
// chunk's end); the hardware prefetchers alone left half the bandwidth unused.
// Measured on Zen 4 (W [1024, 3072] and [1024, 103424] from DRAM, 1 thread):
// 1 row: chunks of 4 / 8 tiles ahead at 29-31 GB/s (16 / 4: 27-28, no
// software prefetch: 13-19); 8 rows: 4 / 8 runs at half the FMA rate of 16 / 4.
constexpr int64_t kStreamKcFew = 4, kPrefetchTilesFew = 8;    // M <= kStreamRows
constexpr int64_t kStreamKcMany = 16, kPrefetchTilesMany = 4;  // more rows

// ------------------------------------------------------------------ stream
// A pass over rows [k0, k1) of W (a chunk); pf: where the tile some tiles
// ahead in the walk (chunk by chunk, each across the thread's outputs) reads
// its first row, pf_rows rows of it (pf null: none).
struct Chunk {
  int64_t k0, k1;
  bool first, final;  // start from 0 (else from out); add the bias and finish
  const void* pf;      // a weight element's address (Elem<WT>::T)
  int64_t pf_rows;
};

// The tiles' shapes and prefetch: the 16-bit stream tiles (3 rows x 8 blocks, into L1) and fp32's direct
// ones (below)
struct StreamTiles {
  static constexpr int kRows = kStreamRows, kBlocks = kStreamBlocks;
  static constexpr _mm_hint kHint = _MM_HINT_T0;
};

// out[m .. m+MB, n .. n+16NB) (+)= x[m.., k0..k1) @ W[k0..k1, n..]; `last`
// masks the tile's last block at N; the first row tile prefetches T::kBlocks
// blocks of each row of c.pf (the others read the same W from cache)
template <int WT, int MB, int NB, class T>
inline void stream_tile(const Dense16Args& a, int64_t m, int64_t n, __mmask16 last, const Chunk& c) {
  using E = typename Elem<WT>::T;
  constexpr int kLineBlocks = 64 / (16 * sizeof(E));  // 16-output blocks per 64-byte line
  const int64_t N = a.N;
  const E* w = static_cast<const E*>(a.w) + n;
  const float* x = a.x + m * a.ldx;
  __m512 acc[MB][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j)
      acc[i][j] = c.first ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(j == NB - 1 ? last : kAll, a.out + (m + i) * N + n + 16 * j);
  const E* pf = m == 0 ? static_cast<const E*>(c.pf) : nullptr;  // the other row tiles read the same W
  for (int64_t k = c.k0; k < c.k1; ++k) {
    const E* row = w + k * N;
    if (pf != nullptr && k - c.k0 < c.pf_rows) {
#pragma GCC unroll 8
      for (int j = 0; j < T::kBlocks; j += kLineBlocks)  // one 64-byte line at a time
        _mm_prefetch(reinterpret_cast<const char*>(pf + (k - c.k0) * N + 16 * j), T::kHint);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m512 wv = widen16<WT>(row + 16 * j, j == NB - 1 ? last : kAll);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * a.ldx + k]), wv, acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const __mmask16 mk = j == NB - 1 ? last : kAll;
    const __m512 b = c.final && a.bias != nullptr ? _mm512_maskz_loadu_ps(mk, a.bias + n + 16 * j) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i)
      _mm512_mask_storeu_ps(a.out + (m + i) * N + n + 16 * j, mk, c.final ? _mm512_add_ps(acc[i][j], b) : acc[i][j]);
  }
}

template <int WT, int NB, int R, class T>
inline void stream_rows_tail(const Dense16Args& a, int64_t m, int64_t rest, int64_t n, __mmask16 last,
                             const Chunk& c) {
  if constexpr (R > 0) {
    if (rest == R) stream_tile<WT, R, NB, T>(a, m, n, last, c);
    else stream_rows_tail<WT, NB, R - 1, T>(a, m, rest, n, last, c);
  }
}

// Every row tile of x on the output tile at n
template <int WT, int NB, class T>
inline void stream_rows(const Dense16Args& a, int64_t n, __mmask16 last, const Chunk& c) {
  int64_t m = 0;
  for (; m + T::kRows <= a.M; m += T::kRows) stream_tile<WT, T::kRows, NB, T>(a, m, n, last, c);
  if (m < a.M) stream_rows_tail<WT, NB, T::kRows - 1, T>(a, m, a.M - m, n, last, c);
}

// The output tile at n of nb (<= NB) blocks
template <int WT, int NB, class T>
inline void stream_blocks(const Dense16Args& a, int64_t nb, int64_t n, __mmask16 last, const Chunk& c) {
  if constexpr (NB > 0) {
    if (nb == NB) stream_rows<WT, NB, T>(a, n, last, c);
    else stream_blocks<WT, NB - 1, T>(a, nb, n, last, c);
  }
}

// One thread's outputs: 16-output blocks [b0, b1)
template <int WT>
void stream_range(const Dense16Args& a, int64_t b0, int64_t b1) {
  if (a.K == 0) {  // x @ W of an empty K: zeros (+ bias)
    for (int64_t m = 0; m < a.M; ++m)
      for (int64_t n = b0 * 16; n < min64(b1 * 16, a.N); ++n) a.out[m * a.N + n] = a.bias ? a.bias[n] : 0.0f;
    return;
  }
  const bool few = a.M <= kStreamRows;
  const int64_t kc = few ? kStreamKcFew : kStreamKcMany, pt = few ? kPrefetchTilesFew : kPrefetchTilesMany;
  const int64_t tiles = (b1 - b0 + kStreamBlocks - 1) / kStreamBlocks;  // per chunk
  const int64_t chunks = (a.K + kc - 1) / kc;
  for (int64_t ci = 0; ci < chunks; ++ci) {
    Chunk c;
    c.k0 = ci * kc;
    c.k1 = min64(c.k0 + kc, a.K);
    c.first = ci == 0;
    c.final = c.k1 == a.K;
    for (int64_t t = 0; t < tiles; ++t) {
      // the tile pt ahead in this walk, maybe in a later chunk
      const int64_t ahead = ci * tiles + t + pt, pci = ahead / tiles;
      c.pf = nullptr;
      if (pci < chunks) {
        const int64_t pk0 = pci * kc;
        c.pf = static_cast<const typename Elem<WT>::T*>(a.w) + pk0 * a.N + (b0 + ahead % tiles * kStreamBlocks) * 16;
        c.pf_rows = min64(kc, a.K - pk0);
      }
      const int64_t b = b0 + t * kStreamBlocks, nb = min64(kStreamBlocks, b1 - b);
      const __mmask16 last = mask16(a.N - (b + nb - 1) * 16);
      stream_blocks<WT, kStreamBlocks, StreamTiles>(a, nb, b * 16, last, c);
    }
  }
}

// ------------------------------------------------------------ direct (fp32)
// An fp32 W needs no widening, so from kFewMaxRows + 1 rows the stream kernel
// takes it with register tiles of up to kDirectRows rows x kDirectBlocks
// blocks (24 accumulators; stream_tile with DirectTiles), reading W where it lies: once per 8 rows of x
// (the 3 x 8 stream tile read it once per 3 rows; the panels copied it first).
// The walk is the stream kernel's, per N slab: for each chunk of kDirectKc rows
// of W, the slab's output tiles in order, each with every row tile of x, so
// each of the chunk's rows is read as one sequential run across the slab. The
// tile kDirectAheadTiles later is prefetched into L2 (T1): into L1 (T0), a
// chunk's 128 rows x 3 lines ahead evicted each other before use, and chunks
// of 16 rows were then faster at 8 rows. The accumulators go through `out` once
// per chunk; a slab holds kDirectSlabFloats outputs of every row (L2: the LM
// head's N would not fit). Summation order as the stream and panel kernels'
// (each output's FMAs over k in order from 0): the same bits.
// The 0.3B's fp32 decode step (Zen 4, 2 threads, same process), first against
// what ran before (the 3 x 8 stream tiles below 16 rows, the panels from 16),
// these tiles with T0 prefetch one tile ahead and 16-row chunks at one row
// tile: B=8 1.20x, B=24 1.53x, B=32 1.35x, B=64 1.25x; then this (T1, two tiles,
// 128-row chunks) against that: B=8 1.34x, B=16 1.32x, B=32 1.16x. Steps:
// T1 alone 1.02x at B=8, 1.28x at B=16, 1.20x at B=32; then 128-row chunks
// against 16 at B=8 1.65x; then two tiles ahead against one 1.07x at B=8
// (four: 0.96x). Tried: one tile over all of K (no chunks), x packed per tile
// ([K][8]): no gain.
constexpr int kDirectRows = 8, kDirectBlocks = 3;
constexpr int64_t kDirectKc = 128, kDirectAheadTiles = 2, kDirectSlabFloats = 64 * 1024;

struct DirectTiles {
  static constexpr int kRows = kDirectRows, kBlocks = kDirectBlocks;
  static constexpr _mm_hint kHint = _MM_HINT_T1;
};

// One thread's outputs: 16-output blocks [b0, b1) of an fp32 W (K > 0)
void direct_range(const Dense16Args& a, int64_t b0, int64_t b1) {
  const int64_t slab = std::max<int64_t>(1, kDirectSlabFloats / (16 * a.M * kDirectBlocks)) * kDirectBlocks;  // blocks
  const float* w = static_cast<const float*>(a.w);
  for (int64_t s0 = b0; s0 < b1; s0 += slab) {
    const int64_t s1 = min64(s0 + slab, b1);
    for (int64_t k0 = 0; k0 < a.K; k0 += kDirectKc) {
      const int64_t k1 = min64(k0 + kDirectKc, a.K);
      for (int64_t b = s0; b < s1; b += kDirectBlocks) {
        const int64_t nb = min64(kDirectBlocks, s1 - b), ahead = b + kDirectAheadTiles * kDirectBlocks;
        const Chunk c{k0, k1, k0 == 0, k1 == a.K, ahead < s1 ? w + k0 * a.N + ahead * 16 : nullptr, k1 - k0};
        stream_blocks<kFp32, kDirectBlocks, DirectTiles>(a, nb, b * 16, mask16(a.N - (b + nb - 1) * 16), c);
      }
    }
  }
}

// ----------------------------------------------------------------- one row
// At one row (a decode step at batch 1) the kernel is W's read alone, and the
// chunked walk above, a few rows at a time in 512-byte pieces split over the
// threads by output, read at ~0.6x of the machine's bandwidth (Zen 4, 2
// threads). Here each thread takes a contiguous run of W's rows (inputs) whole:
// one sequential stream per thread, prefetched kSplitPrefetch bytes ahead
// (the VM's hardware prefetchers alone read it at a quarter of the bandwidth),
// into its own partial sums of all N outputs (L1 / L2: the LM head's 400 KB
// too); the partials are then added in run order (split, below). 0.95x of a
// plain read there, 1.65x the chunked walk (fp32, the 0.3B's linears and head).
// Summation order: k in order within a run, then the runs in order.
constexpr int64_t kSplitPrefetch = 8192;  // into L2 (T1): see tiling.h's RunPrefetch
constexpr int kMaxSplitThreads = 64;

// out[n] = sum over rows [k0, k1) of x[k] * W[k, n] (k in order), every n.
// Masked loads and stores throughout: the same loop with plain ones read 0.8x
// as fast here (79 GB/s machine, 2 threads; equal at 45 GB/s), unexplained.
// A pass takes R rows of W at once (R streams), each 16-output block's partial
// loaded and stored once for all R: the FMAs still run k in order, so the
// bits are those of one row per pass. R rows of 16 bytes a column
// (kSplitPassBytes: 8 bf16 / fp16 rows, 4 fp32): with one row per pass the
// partials' L1/L2 traffic was 4x (bf16: 8x) the weight's bytes. The 0.3B's B=1
// step (Zen 4, 2 threads, same process, against one row a pass): wint8 with
// its bf16 head 1.18x, all-int4 1.29x, w8a8 1.15x, bf16 1.10x, fp32 1.13x;
// 16 bf16 rows ran at 0.83x of 8, 8 fp32 rows at 0.99x of 4. Each row's
// prefetch runs kSplitPrefetch bytes ahead, past its end into the row R on
// (the same stream's next pass): before session 20 it ran into the next row,
// read by the same pass, and each pass started R - 1 rows cold (a [1024, 3072]
// fp32 row is 12 KB). B=1 step, same process: fp32 1.08x, bf16 1.05x; 4 or
// 16 KB ahead: within 1%.
constexpr int kSplitPassBytes = 16;
template <int WT, int R>
inline void split_pass(const Dense16Args& a, int64_t k, bool first, float* out) {
  using E = typename Elem<WT>::T;
  const int64_t N = a.N;
  const E* row[R];
  __m512 xv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    row[r] = static_cast<const E*>(a.w) + (k + r) * N;
    xv[r] = _mm512_set1_ps(a.x[k + r]);
  }
  // a row's prefetches run on into the row that follows it in the next pass (R rows on), not into the
  // next row of this pass, which is read already
  const int64_t ahead = kSplitPrefetch / int64_t(sizeof(E)), wrap = (R - 1) * N;  // elements
  for (int64_t n = 0; n < N; n += 16) {
    const __mmask16 mk = mask16(N - n);
    __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, out + n);
    const int64_t pf = n + ahead < N ? n + ahead : n + ahead + wrap;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(row[r] + pf), _MM_HINT_T1);
      acc = _mm512_fmadd_ps(xv[r], widen16<WT>(row[r] + n, mk), acc);
    }
    _mm512_mask_storeu_ps(out + n, mk, acc);
  }
}

template <int WT>
void split_rows(const Dense16Args& a, int64_t k0, int64_t k1, float* out) {
  constexpr int R = kSplitPassBytes / int(sizeof(typename Elem<WT>::T));
  int64_t k = k0;
  for (; k + R <= k1; k += R) split_pass<WT, R>(a, k, k == k0, out);
  for (; k < k1; ++k) split_pass<WT, 1>(a, k, k == k0, out);
}

// A few rows (2 .. kFewMaxRows): the one-row split widened. Each
// thread sums a contiguous run of W's rows, R rows a pass as above, into its own
// partials of every row of x, N in slabs of kFewSlabFloats partials (L2), and the
// runs are added in order. The stream kernel's chunks read W a few rows at a
// time in 512-byte pieces, which this VM serves at a fraction of its bandwidth.
// Summation order as the one-row split's: k in order within a run, then the runs.
// The 0.3B's decode step (Zen 4, 2 threads, same process, against the stream
// kernel): fp32 B=2 1.16x, B=3 1.14x, B=4 1.41x, B=6 0.96x, B=8 0.67x; bf16
// B=2 1.58x, B=4 1.08x, B=8 0.85x: every row's partial goes through L1/L2
// once a pass, which from ~6 rows costs more than the stream's walk.
constexpr int64_t kFewSlabFloats = 64 * 1024, kFewMaxRows = 4;

template <int WT, int R>
inline void few_pass(const Dense16Args& a, int64_t k, int64_t n0, int64_t n1, bool first, float* part, int64_t ld) {
  using E = typename Elem<WT>::T;
  const E* row[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) row[r] = static_cast<const E*>(a.w) + (k + r) * a.N;
  for (int64_t n = n0; n < n1; n += 16) {
    const __mmask16 mk = mask16(n1 - n);
    __m512 w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(row[r] + n) + kSplitPrefetch, _MM_HINT_T1);
      w[r] = widen16<WT>(row[r] + n, mk);
    }
    for (int64_t m = 0; m < a.M; ++m) {
      float* o = part + m * ld + n;
      const float* xm = a.x + m * a.ldx + k;
      __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, o);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc = _mm512_fmadd_ps(_mm512_set1_ps(xm[r]), w[r], acc);
      _mm512_mask_storeu_ps(o, mk, acc);
    }
  }
}

template <int WT>
void few_rows(const Dense16Args& a, int64_t k0, int64_t k1, float* part, int64_t ld) {
  constexpr int R = kSplitPassBytes / int(sizeof(typename Elem<WT>::T));
  const int64_t fit = kFewSlabFloats / a.M / 16 * 16, slab = fit > 16 ? fit : 16;
  for (int64_t n0 = 0; n0 < a.N; n0 += slab) {
    const int64_t n1 = min64(n0 + slab, a.N);
    int64_t k = k0;
    for (; k + R <= k1; k += R) few_pass<WT, R>(a, k, n0, n1, k == k0, part, ld);
    for (; k < k1; ++k) few_pass<WT, 1>(a, k, n0, n1, k == k0, part, ld);
  }
}

// 1 .. kFewMaxRows rows; false (nothing written) when scratch cannot be
// allocated. K is cut into `threads` runs (the count asked, not the team
// OpenMP gives: a smaller team, e.g. inside another parallel region, takes
// several runs a thread), so an output's bits depend on the thread setting
// only: run r's partials (run 0 in `out`, the others in the caller's scratch),
// then the runs in order. One row takes split_rows (all N a pass, x in
// registers), more take few_rows (N in slabs).
template <int WT>
bool split(const Dense16Args& a) {
  int64_t runs = a.threads < 1 ? 1 : a.threads;
  if (a.M * a.N * a.K < kMinParallelMacs) runs = 1;
  runs = min64(min64(runs, a.K), kMaxSplitThreads);
  const int64_t ld = (a.N + 15) / 16 * 16;
  static thread_local Scratch scratch;
  float* parts = runs > 1 ? static_cast<float*>(scratch.get(sizeof(float) * (runs - 1) * a.M * ld)) : nullptr;
  if (runs > 1 && parts == nullptr) return false;
  const int64_t blocks = (a.N + 15) / 16;
#pragma omp parallel num_threads(runs) if (runs > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    for (int64_t r = t; r < runs; r += nt) {
      const int64_t k0 = a.K * r / runs, k1 = a.K * (r + 1) / runs;
      float* part = r == 0 ? a.out : parts + (r - 1) * a.M * ld;
      if (a.M == 1) split_rows<WT>(a, k0, k1, part);
      else few_rows<WT>(a, k0, k1, part, r == 0 ? a.N : ld);
    }
#pragma omp barrier
    for (int64_t i = blocks * a.M * t / nt; i < blocks * a.M * (t + 1) / nt; ++i) {
      const int64_t m = i / blocks, n = 16 * (i % blocks);
      const __mmask16 mk = mask16(a.N - n);
      float* o = a.out + m * a.N + n;
      __m512 s = _mm512_maskz_loadu_ps(mk, o);
      for (int64_t u = 1; u < runs; ++u)
        s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mk, parts + ((u - 1) * a.M + m) * ld + n));
      if (a.bias != nullptr) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mk, a.bias + n));
      _mm512_mask_storeu_ps(o, mk, s);
    }
  }
  return true;
}

template <int WT>
void stream(const Dense16Args& a) {
  if (a.M >= 1 && a.M <= kFewMaxRows && a.K > 0 && split<WT>(a)) return;
  const int64_t blocks = (a.N + 15) / 16;
  int64_t threads = a.threads < 1 ? 1 : a.threads;
  if (a.M * a.N * a.K < kMinParallelMacs) threads = 1;
  threads = min64(threads, blocks);
  if constexpr (WT == kFp32) {
    if (a.K > 0) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
      for (int64_t t = 0; t < threads; ++t) direct_range(a, blocks * t / threads, blocks * (t + 1) / threads);
      return;
    }
  }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t t = 0; t < threads; ++t) stream_range<WT>(a, blocks * t / threads, blocks * (t + 1) / threads);
}

}  // namespace

namespace fdx86 {

bool dense16_has_bf16_dot() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

int dense16_kernel(const Dense16Args& a) {
  if (a.kernel != kDense16Auto) return a.kernel;
  if (a.M < kDense16PanelMinRows || a.wtype == kDense16Fp32) return kDense16Stream;  // fp32: its direct tiles
  // a wide 16-bit W (the LM head) below kDense16GemmMinRows rows: the stream kernel's chunks read its rows in
  // runs of tens of KB, the panels' packs in 1-2 KB runs, which the memory serves slower
  if (a.M < kDense16GemmMinRows && a.N > kDense16PanelMaxN) return kDense16Stream;
  if (a.wtype != kDense16Bf16 || a.M < kDense16GemmMinRows) return kDense16Panel;
  // AMX-BF16 from kDense16GemmMinRows rows, except a wide matrix (the LM head) below
  // kDense16AmxWideRows: the per-call packing of W is then not amortised (measured on a
  // Xeon with AMX, [1024, 103424] at 16 rows: 0.90x vdpbf16ps on 2 threads; 1.31x at 32)
  if (amx_bf16_enabled() && (a.M >= kDense16AmxWideRows || a.N * a.K < kDense16AmxWideElems)) return kDense16Amx;
  return dense16_has_bf16_dot() ? kDense16Gemm : kDense16Panel;
}

void dense16_linear_avx512(const Dense16Args& a) {
  if (a.M <= 0 || a.N <= 0) return;
  // the GEMMs answer false (nothing written) when their scratch cannot be allocated; the stream
  // kernel then rewrites every output
  const int kernel = dense16_kernel(a);
  const bool bf16 = a.wtype == kDense16Bf16 && a.K > 0;
  if (kernel == kDense16Amx && bf16 && amx_bf16_available() && dense16_gemm_amx(a)) return;
  if ((kernel == kDense16Gemm || kernel == kDense16Amx) && bf16 && dense16_has_bf16_dot() && dense16_gemm_bf16(a)) return;
  if (kernel == kDense16Panel && a.K > 0 && dense16_gemm_panel(a)) return;
  if (a.wtype == kDense16Bf16) stream<kBf16>(a);
  else if (a.wtype == kDense16Fp16) stream<kFp16>(a);
  else stream<kFp32>(a);
}

}  // namespace fdx86
