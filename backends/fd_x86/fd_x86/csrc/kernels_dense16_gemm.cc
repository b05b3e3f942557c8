// The GEMMs of the dense linears (kernels_dense16.cc has the stream kernel and
// the dispatch): the panel kernel (any weight type: the stream kernel's
// arithmetic on fp32 panels) and the bf16 GEMM (vdpbf16ps), one driver.
//
// Compiled for AVX-512 F/BW/VL/DQ by the pragma below; the bf16 GEMM's
// functions alone add avx512bf16 (push_options region), so nothing else in
// this TU can emit a BF16 instruction on a CPU without it. Only called after
// __builtin_cpu_supports says so (kernels_dense16.cc's dispatch).
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "dense16_common.h"

namespace {

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

bool dense16_gemm_panel(const Dense16Args& a) {
  if (a.wtype == kDense16Bf16) return gemm_panel<kBf16>(a);
  if (a.wtype == kDense16Fp16) return gemm_panel<kFp16>(a);
  return gemm_panel<kFp32>(a);
}

bool dense16_gemm_bf16(const Dense16Args& a) { return gemm_bf16(a); }

}  // namespace fdx86
