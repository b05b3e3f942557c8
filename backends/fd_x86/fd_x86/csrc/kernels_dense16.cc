// Dense linears on unquantized weights (bf16 / fp16 / fp32) in the
// reference's layout: W [K, N] (row k = input k, contiguous over the N
// outputs), x fp32 [M, K], out fp32 [M, N]. No repacked copy of W is kept:
// each call reads W once, in its own dtype.
//
// Three kernels:
//   stream: W widened to fp32 in registers (bf16: << 16; fp16: vcvtph2ps;
//           fp32 as it is), fp32 FMA with broadcast x: the reference's
//           operands (the widened weight is exact) in fp32 arithmetic, so
//           results match it up to fp32 summation order. Any M; the choice at
//           one row (each thread then reads a contiguous run of W's rows into
//           partial sums) and for a wide 16-bit W (the LM head) at few rows.
//   panel:  the stream kernel's arithmetic, bit for bit at 2+ rows, on W
//           widened into fp32 panels per thread and read by register tiles of
//           6 rows x 64 outputs: the choice for more rows where the bf16 GEMM
//           is not taken (fp32 and fp16 weights, bf16 below its threshold).
//   bf16 GEMM (avx512_bf16): per 64-output tile and chunk of kGemmKc inputs,
//           W is packed into thread-local scratch in vdpbf16ps's
//           pair-interleaved layout [Kc/2][64][2] and reused by every row of
//           x; x is rounded to bf16 (RNE) once per call. Products of two
//           bf16s are exact in fp32, so the only extra error is x's rounding:
//           |out - ref| <= 2^-9 * sum_k |x_k w_k| (+ fp32 summation).
//
// Compiled for AVX-512 F/BW/VL/DQ by the pragma below; the bf16 GEMM's
// functions alone add avx512bf16 (push_options region), so nothing else in
// this TU can emit a BF16 instruction on a CPU without it. Only called after
// __builtin_cpu_supports says so (x86_linear_op.cc).
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "kernels.h"

namespace {

using fdx86::Dense16Args;

constexpr int kBf16 = 0, kFp16 = 1, kFp32 = 2;  // Dense16Args::wtype (kernels.h)

// a weight element of each type
template <int WT>
struct Elem {
  using T = uint16_t;
};
template <>
struct Elem<kFp32> {
  using T = float;
};
// Register tiles. Stream: 3 rows x 8 blocks of 16 outputs (256 B of W per
// row: 4 lines, so the row streams stay long); GEMM: 6 rows x 4 blocks.
constexpr int kStreamBlocks = 8, kStreamRows = 3;
constexpr int kGemmBlocks = 4, kGemmRows = 6;
constexpr int64_t kGemmCols = 16 * kGemmBlocks;
// The GEMM packs kGemmSuper 64-output panels at once (1 KB runs of each row
// of W, 128 KB of panels: L2), then runs every row of x on each
constexpr int64_t kGemmSuper = 8;
constexpr int64_t kPackAhead = 8;    // rows of W the GEMM's pack prefetches ahead
constexpr int64_t kGemmKc = 128;     // inputs per packed panel: 64 pairs x 64 outputs x 4 B = 16 KB (L1)
constexpr int64_t kPanelWords = kGemmKc / 2 * 64;  // one packed panel, in bf16 pairs
// Below this many multiply-adds a call runs on one thread (waking the team costs more)
constexpr int64_t kMinParallelMacs = int64_t(1) << 20;
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

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u); }

// The maskz forms with every lane on: GCC 12 warns (-Wmaybe-uninitialized)
// about the unmasked intrinsics' undefined pass-through operand.
constexpr __mmask16 kAll = 0xFFFF;
inline __m512i zext16(__m256i h) { return _mm512_maskz_cvtepu16_epi32(kAll, h); }  // u16 -> u32 lanes
inline __m512i high16(__m512i v) { return _mm512_maskz_slli_epi32(kAll, v, 16); }   // lane << 16

// 16 weights from p (masked: the lanes past the mask are 0) as fp32
template <int WT>
inline __m512 widen16(const typename Elem<WT>::T* p, __mmask16 mk) {
  if constexpr (WT == kFp32) {
    return _mm512_maskz_loadu_ps(mk, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    if constexpr (WT == kBf16) return _mm512_castsi512_ps(high16(zext16(h)));
    else return _mm512_maskz_cvtph_ps(kAll, h);
  }
}

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

// out[m .. m+MB, n .. n+16NB) (+)= x[m.., k0..k1) @ W[k0..k1, n..]; `last`
// masks the tile's last block at N
template <int WT, int MB, int NB>
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
      for (int j = 0; j < kStreamBlocks; j += kLineBlocks)  // one 64-byte line at a time
        _mm_prefetch(reinterpret_cast<const char*>(pf + (k - c.k0) * N + 16 * j), _MM_HINT_T0);
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

template <int WT, int NB, int R>
inline void stream_rows_tail(const Dense16Args& a, int64_t m, int64_t rest, int64_t n, __mmask16 last,
                             const Chunk& c) {
  if constexpr (R > 0) {
    if (rest == R) stream_tile<WT, R, NB>(a, m, n, last, c);
    else stream_rows_tail<WT, NB, R - 1>(a, m, rest, n, last, c);
  }
}

template <int WT, int NB>
inline void stream_rows(const Dense16Args& a, int64_t n, __mmask16 last, const Chunk& c) {
  int64_t m = 0;
  for (; m + kStreamRows <= a.M; m += kStreamRows) stream_tile<WT, kStreamRows, NB>(a, m, n, last, c);
  if (m < a.M) stream_rows_tail<WT, NB, kStreamRows - 1>(a, m, a.M - m, n, last, c);
}

template <int WT, int NB>
inline void stream_blocks(const Dense16Args& a, int64_t nb, int64_t n, __mmask16 last, const Chunk& c) {
  if constexpr (NB > 0) {
    if (nb == NB) stream_rows<WT, NB>(a, n, last, c);
    else stream_blocks<WT, NB - 1>(a, nb, n, last, c);
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
      stream_blocks<WT, kStreamBlocks>(a, nb, b * 16, last, c);
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
// too); the partials are then added in thread order. 0.94x of a plain read
// there, 1.65x the chunked walk (fp32, the 0.3B's linears and head).
// Summation order: k in order within a thread's run, then the runs in order.
constexpr int64_t kSplitPrefetch = 8192;
constexpr int kMaxSplitThreads = 64;

// out[n] = sum over rows [k0, k1) of x[k] * W[k, n] (k in order), every n.
// Masked loads and stores throughout: the same loop with plain ones read 0.8x
// as fast here (79 GB/s machine, 2 threads; equal at 45 GB/s), unexplained.
template <int WT>
void split_rows(const Dense16Args& a, int64_t k0, int64_t k1, float* out) {
  using E = typename Elem<WT>::T;
  const int64_t N = a.N;
  for (int64_t k = k0; k < k1; ++k) {
    const E* row = static_cast<const E*>(a.w) + k * N;
    const __m512 xv = _mm512_set1_ps(a.x[k]);
    const bool first = k == k0;
    for (int64_t n = 0; n < N; n += 16) {
      const __mmask16 mk = mask16(N - n);
      const __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, out + n);
      _mm_prefetch(reinterpret_cast<const char*>(row + n) + kSplitPrefetch, _MM_HINT_T0);
      _mm512_mask_storeu_ps(out + n, mk, _mm512_fmadd_ps(xv, widen16<WT>(row + n, mk), acc));
    }
  }
}

// Scratch kept by the calling host thread, grown as needed and freed when the
// thread ends; null when it cannot be allocated
struct Scratch {
  void* p = nullptr;
  int64_t bytes = 0;
  ~Scratch() { std::free(p); }
  void* get(int64_t want) {
    want = (want + 63) / 64 * 64;
    if (want > bytes) {
      std::free(p);
      bytes = 0;
      p = std::aligned_alloc(64, want);
      if (p != nullptr) bytes = want;
    }
    return p;
  }
};

// One row; false (nothing written) when scratch cannot be allocated. K is cut
// into `threads` runs (the count asked, not the team OpenMP gives: a smaller
// team, e.g. inside another parallel region, takes several runs a thread), so
// an output's bits depend on the thread setting only: run r's partial sum (run
// 0 in `out`, the others in the caller's scratch), then the runs in order.
template <int WT>
bool split(const Dense16Args& a) {
  int64_t runs = a.threads < 1 ? 1 : a.threads;
  if (a.N * a.K < kMinParallelMacs) runs = 1;
  runs = min64(min64(runs, a.K), kMaxSplitThreads);
  const int64_t ld = (a.N + 15) / 16 * 16;  // a partial's stride: 64-byte aligned rows
  static thread_local Scratch scratch;
  float* parts = runs > 1 ? static_cast<float*>(scratch.get(sizeof(float) * (runs - 1) * ld)) : nullptr;
  if (runs > 1 && parts == nullptr) return false;
  const int64_t blocks = (a.N + 15) / 16;
#pragma omp parallel num_threads(runs) if (runs > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    for (int64_t r = t; r < runs; r += nt)
      split_rows<WT>(a, a.K * r / runs, a.K * (r + 1) / runs, r == 0 ? a.out : parts + (r - 1) * ld);
#pragma omp barrier
    // the partials, in run order, and the bias: this thread's share of the outputs
    for (int64_t b = blocks * t / nt; b < blocks * (t + 1) / nt; ++b) {
      const int64_t n = 16 * b;
      const __mmask16 mk = mask16(a.N - n);
      __m512 s = _mm512_maskz_loadu_ps(mk, a.out + n);
      for (int64_t u = 1; u < runs; ++u) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mk, parts + (u - 1) * ld + n));
      if (a.bias != nullptr) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mk, a.bias + n));
      _mm512_mask_storeu_ps(a.out + n, mk, s);
    }
  }
  return true;
}

template <int WT>
void stream(const Dense16Args& a) {
  if (a.M == 1 && a.K > 0 && split<WT>(a)) return;
  const int64_t blocks = (a.N + 15) / 16;
  int64_t threads = a.threads < 1 ? 1 : a.threads;
  if (a.M * a.N * a.K < kMinParallelMacs) threads = 1;
  threads = min64(threads, blocks);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t t = 0; t < threads; ++t) stream_range<WT>(a, blocks * t / threads, blocks * (t + 1) / threads);
}

// ------------------------------------------------------------------- GEMMs
// Both GEMMs (the panel kernel below, any weight type; the bf16 GEMM after)
// walk W alike (gemm_drive): each thread a range of 64-output tiles (or, with
// fewer tiles than threads, a range of rows); chunk of G::kKc inputs by chunk, each
// across the thread's tiles, kGemmSuper panels packed at a time into the
// thread's scratch. Row by row across the panels, so each row of W is read as
// one run of up to 2 KB; the next pack's rows are prefetched meanwhile (the
// runs are too short for the hardware prefetchers); every row of x then runs
// on each panel in register tiles of kGemmRows x 64 outputs, accumulating
// through `out` between chunks.

// This thread's kGemmSuper panels (128 KB), allocated on its first GEMM and
// kept: an allocation this size per call would be mmap'd and faulted in again
// each time. Null when it cannot be allocated.
constexpr int64_t kPanelBytes = 16 * 1024;  // one panel: L1
void* thread_panels() {
  static thread_local Scratch panels;
  return panels.get(kPanelBytes * kGemmSuper);
}

// The GEMMs' team: threads split the 64-output tiles, or, with fewer tiles than
// threads (a narrow W: the MoE router), the rows where there is one a thread
int gemm_threads(const Dense16Args& a) {
  const int64_t tiles = (a.N + kGemmCols - 1) / kGemmCols, threads = a.threads < 1 ? 1 : a.threads;
  if (a.M * a.N * a.K < kMinParallelMacs) return 1;
  return static_cast<int>(tiles >= threads || a.M >= threads ? threads : tiles);
}

// G: W (a weight element), P (a panel element), kKc (inputs per chunk),
// kPanelElems, k_end(a) (K padded to G's step), pack(...) and rows(...)
// (rows [m0, m1) of x on one panel). False when scratch cannot be allocated.
template <class G>
bool gemm_drive(const Dense16Args& a, const G& g, int threads) {
  using W = typename G::W;
  static_assert(sizeof(typename G::P) * G::kPanelElems == kPanelBytes, "a panel is kPanelBytes");
  const int64_t tiles = (a.N + kGemmCols - 1) / kGemmCols, kend = g.k_end(a);
  int failed = 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) reduction(| : failed)
  for (int64_t t = 0; t < threads; ++t) {
    auto* mine = static_cast<typename G::P*>(thread_panels());
    if (mine == nullptr) {
      failed = 1;
      continue;
    }
    // this thread's tiles and rows: a share of the tiles and every row, or every tile and a share of the rows
    const bool by_rows = tiles < threads;
    const int64_t t0 = by_rows ? 0 : tiles * t / threads, t1 = by_rows ? tiles : tiles * (t + 1) / threads;
    const int64_t m0 = by_rows ? a.M * t / threads : 0, m1 = by_rows ? a.M * (t + 1) / threads : a.M;
    const W* w = static_cast<const W*>(a.w);
    for (int64_t k0 = 0; k0 < kend; k0 += G::kKc) {
      const int64_t k1 = min64(k0 + G::kKc, a.K);
      const bool first = k0 == 0, final = k0 + G::kKc >= kend;
      for (int64_t st = t0; st < t1; st += kGemmSuper) {
        const int64_t nt = min64(kGemmSuper, t1 - st);
        // the next pack: the next super-tile of these rows, else the next chunk's first
        const W* next = st + nt < t1 ? w + k0 * a.N + (st + nt) * kGemmCols
                                     : (k1 < a.K ? w + k1 * a.N + t0 * kGemmCols : nullptr);
        const int64_t next_rows = st + nt < t1 ? k1 - k0 : min64(G::kKc, a.K - k1);
        G::pack(a, k0, k1, st * kGemmCols, nt, mine, next, next_rows);
        for (int64_t tt = 0; tt < nt; ++tt)
          g.rows(a, m0, m1, mine + tt * G::kPanelElems, k0, (st + tt) * kGemmCols, first, final);
      }
    }
  }
  return failed == 0;
}

// A register tile's accumulators: 0 on a call's first chunk, else out's
template <int MB>
inline void tile_begin(const Dense16Args& a, __m512 (&acc)[MB][kGemmBlocks], __mmask16 (&mk)[kGemmBlocks], int64_t m,
                       int64_t n, bool first) {
#pragma GCC unroll 4
  for (int j = 0; j < kGemmBlocks; ++j) mk[j] = n + 16 * j >= a.N ? (__mmask16)0 : mask16(a.N - n - 16 * j);
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < kGemmBlocks; ++j)
      acc[i][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[j], a.out + (m + i) * a.N + n + 16 * j);
}

// ... stored to out, with the bias after the call's last chunk
template <int MB>
inline void tile_end(const Dense16Args& a, __m512 (&acc)[MB][kGemmBlocks], const __mmask16 (&mk)[kGemmBlocks],
                     int64_t m, int64_t n, bool final) {
#pragma GCC unroll 4
  for (int j = 0; j < kGemmBlocks; ++j) {
    const __m512 b = final && a.bias != nullptr ? _mm512_maskz_loadu_ps(mk[j], a.bias + n + 16 * j) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MB; ++i)
      _mm512_mask_storeu_ps(a.out + (m + i) * a.N + n + 16 * j, mk[j], final ? _mm512_add_ps(acc[i][j], b) : acc[i][j]);
  }
}

// Rows [m0, m1) of x on one panel: tiles of kGemmRows rows, then one of the rest (Tile<MB>::run)
template <template <int> class Tile, int R, class... Args>
inline void run_rest(const Dense16Args& a, int64_t m, int64_t rest, Args... args) {
  if constexpr (R > 0) {
    if (rest == R) Tile<R>::run(a, m, args...);
    else run_rest<Tile, R - 1>(a, m, rest, args...);
  }
}

template <template <int> class Tile, class... Args>
inline void run_rows(const Dense16Args& a, int64_t m0, int64_t m1, Args... args) {
  int64_t m = m0;
  for (; m + kGemmRows <= m1; m += kGemmRows) Tile<kGemmRows>::run(a, m, args...);
  if (m < m1) run_rest<Tile, kGemmRows - 1>(a, m, m1 - m, args...);
}

// The panel GEMM (kDense16Panel; any weight type, from kDense16PanelMinRows
// rows): the stream kernel's arithmetic exactly (W widened to fp32, each
// output's FMAs over k in order through `out` between chunks: the same bits as
// the stream kernel at 2+ rows), on [kPanelKc][64] fp32 panels: W[k0 .. k0 +
// kPanelKc, n .. n + 64) widened as it is copied (zeros past N). Alone, on
// the 0.3B's fp32 linears (Zen 4, 2 threads, W from DRAM): 1.0-1.4x the stream
// kernel at 2-8 rows, 1.5x at 32, 1.8x from 64 rows (~0.98 of the FMA peak);
// in the model's decode steps it lost below 8 rows (kernels.h).
constexpr int64_t kPanelKc = kPanelBytes / (sizeof(float) * kGemmCols);  // 64 inputs

template <int MB>
struct PanelTile {
  __attribute__((noinline)) static void run(const Dense16Args& a, int64_t m, const float* panel, int64_t kc,
                                            int64_t k0, int64_t n, bool first, bool final) {
    __m512 acc[MB][kGemmBlocks];
    __mmask16 mk[kGemmBlocks];
    tile_begin<MB>(a, acc, mk, m, n, first);
    const float* x = a.x + m * a.ldx + k0;
    for (int64_t k = 0; k < kc; ++k) {
      __m512 wv[kGemmBlocks];
#pragma GCC unroll 4
      for (int j = 0; j < kGemmBlocks; ++j) wv[j] = _mm512_load_ps(panel + k * kGemmCols + 16 * j);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        const __m512 xv = _mm512_set1_ps(x[i * a.ldx + k]);
#pragma GCC unroll 4
        for (int j = 0; j < kGemmBlocks; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
    tile_end<MB>(a, acc, mk, m, n, final);
  }
};

template <int WT>
struct GemmPanel {
  using W = typename Elem<WT>::T;
  using P = float;
  static constexpr int64_t kKc = kPanelKc, kPanelElems = kPanelKc * kGemmCols;
  int64_t k_end(const Dense16Args& a) const { return a.K; }
  // `tiles` panels of W[k0 .. k1, n ..): panel t holds row k's outputs n + 64t .. at (k - k0) * 64
  __attribute__((noinline)) static void pack(const Dense16Args& a, int64_t k0, int64_t k1, int64_t n, int64_t tiles,
                                             float* panels, const W* next, int64_t next_rows) {
    const W* w = static_cast<const W*>(a.w);
    const int64_t cols = tiles * kGemmCols;
    for (int64_t k = k0; k < k1; ++k) {
      const W* row = w + k * a.N + n;
      // the row kPackAhead rows on, past k1 the next pack's
      const int64_t i = k - k0 + kPackAhead;
      const W* r = i < k1 - k0 ? row + kPackAhead * a.N
                               : (next != nullptr && i - (k1 - k0) < next_rows ? next + (i - (k1 - k0)) * a.N : nullptr);
      if (r != nullptr)
        for (int64_t c = 0; c < cols; c += 64 / sizeof(W)) _mm_prefetch(reinterpret_cast<const char*>(r + c), _MM_HINT_T0);
      float* dst = panels + (k - k0) * kGemmCols;
      for (int64_t col = 0; col < cols; col += 16) {
        const __mmask16 mk = n + col >= a.N ? (__mmask16)0 : mask16(a.N - n - col);
        _mm512_store_ps(dst + col / kGemmCols * kPanelElems + col % kGemmCols, widen16<WT>(row + col, mk));
      }
    }
  }
  void rows(const Dense16Args& a, int64_t m0, int64_t m1, const float* panel, int64_t k0, int64_t n, bool first,
            bool final) const {
    run_rows<PanelTile>(a, m0, m1, panel, min64(kKc, a.K - k0), k0, n, first, final);
  }
};

template <int WT>
bool gemm_panel(const Dense16Args& a) { return gemm_drive(a, GemmPanel<WT>{}, gemm_threads(a)); }

}  // namespace

// ---------------------------------------------------------------- bf16 GEMM
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")

namespace {

// x fp32 [M, K] -> bf16 (RNE) [M, kp] as uint16, zero padded past K
__attribute__((noinline)) void round_rows_bf16(const Dense16Args& a, uint16_t* xb, int64_t kp, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && a.M * a.K >= (1 << 16))
  for (int64_t m = 0; m < a.M; ++m) {
    const float* r = a.x + m * a.ldx;
    for (int64_t k = 0; k < kp; k += 16) {
      const __mmask16 mk = mask16(a.K - k);
      const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r + k));
      _mm256_mask_storeu_epi16(xb + m * kp + k, mask16(kp - k), v);
    }
  }
}

// Packs `tiles` panels of W[k0 .. k1, n .. n + 64 * tiles): panel t is
// [pairs][64][2] with pair p, output c holding (W[k0+2p, n+64t+c],
// W[k0+2p+1, n+64t+c]); zeros past K and N. Row by row across the tiles, so
// each row of W is read as one run of 128 * tiles bytes. `next` (or null):
// where the next pack call's rows start (next_rows of them), prefetched into
// L2 meanwhile: the runs are too short for the hardware prefetchers.
__attribute__((noinline)) void pack_panels_bf16(const Dense16Args& a, int64_t k0, int64_t k1, int64_t n,
                                                 int64_t tiles, uint32_t* panels, const uint16_t* next,
                                                 int64_t next_rows) {
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  const int64_t cols = tiles * kGemmCols;
  for (int64_t k = k0; k < k1; k += 2) {
    const bool odd = k + 1 < k1;
    const uint16_t* r0 = w + k * a.N + n;
    const uint16_t* r1 = odd ? r0 + a.N : r0;
    // the rows kPackAhead rows on, past k1 the next pack's
#pragma GCC unroll 2
    for (int64_t i = k - k0 + kPackAhead; i < k - k0 + kPackAhead + 2; ++i) {
      const uint16_t* r = i < k1 - k0 ? r0 + (i - (k - k0)) * a.N
                                      : (next != nullptr && i - (k1 - k0) < next_rows ? next + (i - (k1 - k0)) * a.N
                                                                                      : nullptr);
      if (r != nullptr)
        for (int64_t c = 0; c < cols; c += 32)  // one 64-byte line
          _mm_prefetch(reinterpret_cast<const char*>(r + c), _MM_HINT_T0);
    }
    // 32 outputs at a time: vpermt2w interleaves the two rows' 32 weights
    // into 16 pairs per half
    const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                            38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    uint32_t* dst = panels + (k - k0) / 2 * kGemmCols;
    for (int64_t col = 0; col < cols; col += 32) {
      const __mmask32 mk = n + col >= a.N ? 0 : mask32(a.N - n - col);
      const __m512i w0 = _mm512_maskz_loadu_epi16(mk, r0 + col);
      const __m512i w1 = odd ? _mm512_maskz_loadu_epi16(mk, r1 + col) : _mm512_setzero_si512();
      uint32_t* d = dst + col / kGemmCols * kPanelWords + col % kGemmCols;
      _mm512_storeu_si512(d, _mm512_permutex2var_epi16(w0, lo_idx, w1));
      _mm512_storeu_si512(d + 16, _mm512_permutex2var_epi16(w0, hi_idx, w1));
    }
  }
}

template <int MB>
struct Bf16Tile {
  __attribute__((noinline)) static void run(const Dense16Args& a, int64_t m, const uint16_t* xb, int64_t kp,
                                            const uint32_t* panel, int64_t pairs, int64_t k0, int64_t n, bool first,
                                            bool final) {
    __m512 acc[MB][kGemmBlocks];
    __mmask16 mk[kGemmBlocks];
    tile_begin<MB>(a, acc, mk, m, n, first);
    const uint16_t* x = xb + m * kp + k0;
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh wv[kGemmBlocks];
#pragma GCC unroll 4
      for (int j = 0; j < kGemmBlocks; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(panel + p * kGemmCols + 16 * j);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        uint32_t pair;
        __builtin_memcpy(&pair, x + i * kp + 2 * p, 4);
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
        for (int j = 0; j < kGemmBlocks; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
      }
    }
    tile_end<MB>(a, acc, mk, m, n, final);
  }
};

struct GemmBf16 {
  using W = uint16_t;
  using P = uint32_t;
  static constexpr int64_t kKc = kGemmKc, kPanelElems = kPanelWords;
  const uint16_t* xb;  // x rounded to bf16, [M, kp]
  int64_t kp;          // K, even
  int64_t k_end(const Dense16Args&) const { return kp; }
  static void pack(const Dense16Args& a, int64_t k0, int64_t k1, int64_t n, int64_t tiles, uint32_t* panels,
                   const uint16_t* next, int64_t next_rows) {
    pack_panels_bf16(a, k0, k1, n, tiles, panels, next, next_rows);
  }
  void rows(const Dense16Args& a, int64_t m0, int64_t m1, const uint32_t* panel, int64_t k0, int64_t n, bool first,
            bool final) const {
    run_rows<Bf16Tile>(a, m0, m1, xb, kp, panel, (min64(k0 + kGemmKc, kp) - k0) / 2, k0, n, first, final);
  }
};

// Returns false when scratch cannot be allocated: the caller then runs the
// stream kernel, which rewrites every output
bool gemm_bf16(const Dense16Args& a) {
  const int64_t kp = (a.K + 1) / 2 * 2;
  const int threads = gemm_threads(a);
  uint16_t* xb = static_cast<uint16_t*>(std::malloc(sizeof(uint16_t) * a.M * kp + 64));
  if (xb == nullptr) return false;
  round_rows_bf16(a, xb, kp, threads);
  const bool done = gemm_drive(a, GemmBf16{xb, kp}, threads);
  std::free(xb);
  return done;
}

}  // namespace

#pragma GCC pop_options

namespace fdx86 {

bool dense16_has_bf16_dot() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

int dense16_kernel(const Dense16Args& a) {
  if (a.kernel != kDense16Auto) return a.kernel;
  if (a.M < kDense16PanelMinRows) return kDense16Stream;
  // a wide 16-bit W (the LM head) below kDense16GemmMinRows rows: the stream kernel's chunks read its rows in
  // runs of tens of KB, the panels' packs in 1-2 KB runs, which the memory serves slower
  if (a.wtype != kDense16Fp32 && a.M < kDense16GemmMinRows && a.N > kDense16PanelMaxN) return kDense16Stream;
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
  if ((kernel == kDense16Gemm || kernel == kDense16Amx) && bf16 && dense16_has_bf16_dot() && gemm_bf16(a)) return;
  if (kernel == kDense16Panel && a.K > 0) {
    const bool done = a.wtype == kDense16Bf16 ? gemm_panel<kBf16>(a)
                      : a.wtype == kDense16Fp16 ? gemm_panel<kFp16>(a) : gemm_panel<kFp32>(a);
    if (done) return;
  }
  if (a.wtype == kDense16Bf16) stream<kBf16>(a);
  else if (a.wtype == kDense16Fp16) stream<kFp16>(a);
  else stream<kFp32>(a);
}

}  // namespace fdx86
