// AVX-512 BF16 + VBMI kernels for block-wise fp8 (fp8_kernels.h). Compiled
// for that ISA by the pragma below and only called after
// __builtin_cpu_supports says so (x86_fp8_op.cc).
//
// Every e4m3 value (subnormals and +-448 included) is exactly a normal bf16
// (4 significant bits, exponents 2^-9 .. 2^8), and so is every activation
// after its e4m3 rounding; their products are exact in fp32 (>= 2^-18, no
// denormals for vdpbf16ps to flush). So vdpbf16ps sums e4m3 x e4m3 products
// exactly, 32 per instruction, with fp32 accumulation: equal to the
// reference up to fp32 summation order.
//
// Weight decode, 64 codes at a time: two vpermi2b lookups of the code's low
// 7 bits (the magnitude) in 128-entry tables give the low and high byte of
// the magnitude's bf16, a vpternlog puts the code's sign bit into the high
// byte, and vpunpck{l,h}bw interleave the bytes into two vectors of 32 bf16.
// The unpacks work per 128-bit lane, so vector A holds codes
// {0..7, 16..23, 32..39, 48..55} of the 64 and B the others; the activations
// are stored in that order (kPermA / kPermB), so pairs line up.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#ifdef _OPENMP
#include <omp.h>
#endif

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx2,fma")

#include "fp8_kernels.h"

namespace {

constexpr int64_t kBlock = 128;
constexpr int64_t kChunk = 64;               // codes per decode: two vectors of 32 bf16
constexpr float kE4m3Max = 448.0f;
// Up to this many rows the weights are decoded in registers per row tile; above,
// a work item's channels are decoded once into a buffer that kRows x
// kChannels tiles (16 accumulators: vdpbf16ps's latency wants that many) read.
// Measured on Zen 4 against decoding in registers for 4-row tiles: equal at 4-6
// rows, 1.0-1.2x faster at 8 and up.
constexpr int64_t kRegisterRows = 2;
constexpr int kRows = 4;
constexpr int64_t kChannels = 4;             // output channels per work item (one 128-block: one weight scale)
static_assert(kBlock % kChannels == 0, "an item's channels share a 128-block");
// The hardware prefetcher follows the weight rows poorly from DRAM (in
// registers kChannels rows are read side by side): prefetching this far
// ahead made a 64 MB call 1.4x faster at B = 1 and 1.1x at B = 8 (Zen 4, one
// thread); fetching the next work item during the tiles from the buffer, 1.5x more at B = 8.
constexpr int64_t kPrefetch = 256;
constexpr int64_t kBlockBytes = 128 * 1024;  // activation rows per row block: about this many bytes (L2)

inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

inline __mmask64 mask64(int64_t n) {
  return n >= 64 ? ~(__mmask64)0 : n <= 0 ? (__mmask64)0 : (((__mmask64)1 << n) - 1);
}

// bf16 bits of e4m3 magnitude code c (0..127), split into low and high bytes
struct Tables {
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t hi[128];
  Tables() {
    for (int c = 0; c < 128; ++c) {
      const int e = c >> 3, m = c & 7;
      const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(8.0f + m, e - 10);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t b16 = c == 127 ? 0x7FC0 : static_cast<uint16_t>(bits >> 16);  // 0x7F: NaN, never produced
      lo[c] = static_cast<uint8_t>(b16 & 0xFF);
      hi[c] = static_cast<uint8_t>(b16 >> 8);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

struct Decoder {
  __m512i lo0, lo1, hi0, hi1, sign;
  Decoder() {
    const Tables& t = tables();
    lo0 = _mm512_load_si512(t.lo);
    lo1 = _mm512_load_si512(t.lo + 64);
    hi0 = _mm512_load_si512(t.hi);
    hi1 = _mm512_load_si512(t.hi + 64);
    sign = _mm512_set1_epi8(static_cast<char>(0x80));
  }
  // the codes at p that mk selects (the rest read as code 0 = 0.0) -> A, B (32 bf16 each)
  inline void decode(const uint8_t* p, __mmask64 mk, __m512i* a, __m512i* b) const {
    // a masked load only for a tail: byte-masked loads are slower (Zen 4: 1.4x the whole B = 1 call)
    const __m512i codes = mk == ~(__mmask64)0 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(mk, p);
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);
    __m512i hi = _mm512_permutex2var_epi8(hi0, codes, hi1);
    hi = _mm512_ternarylogic_epi32(hi, codes, sign, 0xF8);  // hi | (codes & 0x80)
    *a = _mm512_unpacklo_epi8(lo, hi);
    *b = _mm512_unpackhi_epi8(lo, hi);
  }
};

inline __m512 dot(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }

// round |a| <= 448 to the e4m3 grid, nearest even (as kernels_fp8_avx512.cc)
inline __m512 round_e4m3(__m512 v) {
  const __m512 a = _mm512_abs_ps(v);
  const __m512 e = _mm512_max_ps(_mm512_getexp_ps(a), _mm512_set1_ps(-6.0f));
  const __m512 step_exp = _mm512_sub_ps(e, _mm512_set1_ps(3.0f));
  const __m512 q = _mm512_scalef_ps(a, _mm512_sub_ps(_mm512_setzero_ps(), step_exp));
  const __m512 r = _mm512_scalef_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), step_exp);
  return _mm512_or_ps(r, _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
}

struct Plan {
  const fdx86::Fp8Bf16Args& a;
  int64_t KB, Kp;  // groups of 128; K rounded up to 64 (the activation row stride)
};

// MB rows from m against NB channels from n. wbuf: nullptr (decode the codes
// here) or the NB channels already decoded ([NB][Kp] bf16 in A/B order).
// Per 128-group: fp32 partial dot products (P chains each), then scaled by
// the group's two scales into the totals.
template <int MB, int NB, int P>
void tile(const Plan& p, int64_t m, int64_t n, const uint16_t* wbuf) {
  const fdx86::Fp8Bf16Args& a = p.a;
  const Decoder dec;  // its tables in registers
  const uint8_t* wrow[NB];
  const uint16_t* brow[NB];
  for (int j = 0; j < NB; ++j) {
    wrow[j] = a.w + (n + j) * a.K;
    brow[j] = wbuf != nullptr ? wbuf + j * p.Kp : nullptr;
  }
  const uint16_t* xrow[MB];
  for (int i = 0; i < MB; ++i) xrow[i] = a.xb + (m + i) * p.Kp;
  // from the buffer: fetch the next item's codes meanwhile (the decode of
  // them then finds them in cache; memory and arithmetic overlap)
  const uint8_t* next = wbuf != nullptr && n + 2 * NB <= a.N ? a.w + (n + NB) * a.K : nullptr;
  // totals in memory (L1): touched once per group, they leave the registers to the partials
  alignas(64) float total[MB][NB][16];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) _mm512_store_ps(total[i][j], _mm512_setzero_ps());
  for (int64_t g = 0; g < p.KB; ++g) {
    __m512 part[MB][NB][P];
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j)
        for (int q = 0; q < P; ++q) part[i][j][q] = _mm512_setzero_ps();
    const int64_t k1 = g * kBlock + kBlock < a.K ? g * kBlock + kBlock : a.K;
    for (int64_t k = g * kBlock; k < k1; k += kChunk) {
      const __mmask64 mk = mask64(a.K - k);
      __m512i xa[MB], xb[MB];
      for (int i = 0; i < MB; ++i) {
        xa[i] = _mm512_loadu_si512(xrow[i] + k);
        xb[i] = _mm512_loadu_si512(xrow[i] + k + 32);
      }
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {  // one channel's 64 weights at a time: few registers live
        __m512i wa, wb;
        if (wbuf != nullptr) {
          if (next != nullptr) _mm_prefetch(reinterpret_cast<const char*>(next + j * a.K + k), _MM_HINT_T1);
          wa = _mm512_loadu_si512(brow[j] + k);
          wb = _mm512_loadu_si512(brow[j] + k + 32);
        } else {
          _mm_prefetch(reinterpret_cast<const char*>(wrow[j] + k + kPrefetch), _MM_HINT_T0);
          dec.decode(wrow[j] + k, mk, &wa, &wb);
        }
        for (int i = 0; i < MB; ++i) {
          part[i][j][0] = dot(part[i][j][0], wa, xa[i]);
          part[i][j][P - 1] = dot(part[i][j][P - 1], wb, xb[i]);
        }
      }
    }
    const float ws = a.wscale[(n / kBlock) * p.KB + g];  // the NB channels share a 128-block (n % NB == 0)
    for (int i = 0; i < MB; ++i) {
      const __m512 s = _mm512_set1_ps(a.xscale[(m + i) * p.KB + g] * ws);
      for (int j = 0; j < NB; ++j) {
        const __m512 sum = P == 2 ? _mm512_add_ps(part[i][j][0], part[i][j][P - 1]) : part[i][j][0];
        _mm512_store_ps(total[i][j], _mm512_fmadd_ps(sum, s, _mm512_load_ps(total[i][j])));
      }
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) a.out[(m + i) * a.N + n + j] = _mm512_reduce_add_ps(_mm512_load_ps(total[i][j]));
}

// rows [m0, m1) against channels n .. n + NB - 1 (buf already decoded, or nullptr)
template <int NB>
void rows(const Plan& p, int64_t m0, int64_t m1, int64_t n, const uint16_t* buf) {
  if (buf == nullptr) {  // few rows: decode per tile
    int64_t m = m0;
    for (; m + 2 <= m1; m += 2) tile<2, NB, 1>(p, m, n, nullptr);
    if (m < m1) tile<1, NB, 2>(p, m, n, nullptr);
    return;
  }
  int64_t m = m0;
  for (; m + kRows <= m1; m += kRows) tile<kRows, NB, 1>(p, m, n, buf);
  for (; m + 2 <= m1; m += 2) tile<2, NB, 1>(p, m, n, buf);
  if (m < m1) tile<1, NB, 2>(p, m, n, buf);
}

template <int NB>
void decode_channels(const Plan& p, const Decoder& dec, int64_t n, uint16_t* buf) {
  for (int j = 0; j < NB; ++j)
    for (int64_t k = 0; k < p.Kp; k += kChunk) {
      __m512i va, vb;
      _mm_prefetch(reinterpret_cast<const char*>(p.a.w + (n + j) * p.a.K + k + kPrefetch), _MM_HINT_T0);
      dec.decode(p.a.w + (n + j) * p.a.K + k, mask64(p.a.K - k), &va, &vb);
      _mm512_storeu_si512(buf + j * p.Kp + k, va);
      _mm512_storeu_si512(buf + j * p.Kp + k + 32, vb);
    }
}

// the work item's channels [n, n + kChannels) (fewer at the end) for rows [m0, m1)
void item(const Plan& p, const Decoder& dec, int64_t m0, int64_t m1, int64_t n, uint16_t* buf) {
  const bool full = n + kChannels <= p.a.N;
  if (buf != nullptr) {
    if (full) {
      decode_channels<kChannels>(p, dec, n, buf);
      rows<kChannels>(p, m0, m1, n, buf);
    } else {
      for (int64_t c = n; c < p.a.N; ++c) {
        decode_channels<1>(p, dec, c, buf);
        rows<1>(p, m0, m1, c, buf);
      }
    }
  } else if (full) {
    rows<kChannels>(p, m0, m1, n, nullptr);
  } else {
    for (int64_t c = n; c < p.a.N; ++c) rows<1>(p, m0, m1, c, nullptr);
  }
}

}  // namespace

namespace fdx86 {

void fp8_quantize_rows_bf16(const float* x, int64_t M, int64_t K, uint16_t* xb, float* xscale, int threads) {
  const int64_t KB = (K + kBlock - 1) / kBlock, Kp = (K + kChunk - 1) / kChunk * kChunk;
  // word p of A is code 16 * (p / 8) + p % 8 of the 64; of B, that + 8 (Decoder's unpack order)
  alignas(64) int16_t perm_a[32], perm_b[32];
  for (int q = 0; q < 32; ++q) {
    perm_a[q] = static_cast<int16_t>(16 * (q / 8) + q % 8);
    perm_b[q] = static_cast<int16_t>(16 * (q / 8) + q % 8 + 8);
  }
  const __m512i ia = _mm512_load_si512(perm_a), ib = _mm512_load_si512(perm_b);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    for (int64_t g = 0; g < KB; ++g) {
      const int64_t k0 = g * kBlock, k1 = k0 + kBlock < K ? k0 + kBlock : K;
      __m512 amax = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16)
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask16(k1 - k), xr + k)));
      const float s = std::fmax(_mm512_reduce_max_ps(amax), 1e-10f) / kE4m3Max;
      xscale[m * KB + g] = s;
      const __m512 vs = _mm512_set1_ps(s), lim = _mm512_set1_ps(kE4m3Max), nlim = _mm512_set1_ps(-kE4m3Max);
      for (int64_t k = k0; k < k0 + kBlock && k < Kp; k += kChunk) {
        __m256i h[4];
        for (int q = 0; q < 4; ++q) {
          __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mask16(k1 - k - 16 * q), xr + k + 16 * q), vs);
          v = _mm512_min_ps(_mm512_max_ps(v, nlim), lim);
          h[q] = (__m256i)_mm512_cvtneps_pbh(round_e4m3(v));  // exact: 4 significant bits
        }
        const __m512i n0 = _mm512_inserti64x4(_mm512_castsi256_si512(h[0]), h[1], 1);
        const __m512i n1 = _mm512_inserti64x4(_mm512_castsi256_si512(h[2]), h[3], 1);
        _mm512_storeu_si512(xb + m * Kp + k, _mm512_permutex2var_epi16(n0, ia, n1));
        _mm512_storeu_si512(xb + m * Kp + k + 32, _mm512_permutex2var_epi16(n0, ib, n1));
      }
    }
  }
}

void block_fp8_linear_bf16(const Fp8Bf16Args& a) {
  const Plan p{a, (a.K + kBlock - 1) / kBlock, (a.K + kChunk - 1) / kChunk * kChunk};
  const int64_t items = (a.N + kChannels - 1) / kChannels;
  const bool decode_once = a.M > kRegisterRows;
  // rows per block: the block's activations stay in L2 while a thread's items pass over them
  int64_t block_rows = a.M <= kRows ? a.M : kBlockBytes / (p.Kp * 2) / kRows * kRows;
  if (block_rows < kRows) block_rows = kRows;
  const bool parallel = a.threads > 1 && items > 1 && a.M * a.N * a.K >= (1 << 18);
#pragma omp parallel num_threads(a.threads) if (parallel)
  {
    const Decoder dec;
    uint16_t* buf = decode_once ? static_cast<uint16_t*>(std::aligned_alloc(64, kChannels * p.Kp * 2)) : nullptr;
    int64_t lo = 0, hi = items;
#ifdef _OPENMP
    if (parallel) {  // a contiguous range per thread, so each keeps its row block in cache over its items
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      lo = items * t / nt;
      hi = items * (t + 1) / nt;
    }
#endif
    for (int64_t m0 = 0; m0 < a.M; m0 += block_rows) {
      const int64_t m1 = m0 + block_rows < a.M ? m0 + block_rows : a.M;
      for (int64_t it = lo; it < hi; ++it) item(p, dec, m0, m1, it * kChannels, buf);
    }
    std::free(buf);
  }
}

}  // namespace fdx86
