// The sampler's draw on x86 (fd_sample's "sort" method; fd_x86/sampling.py) and the argmax of greedy rows:
//
//   fd_x86_sample(logits [B, V] fp32, temperature [B] fp32, top_k [B] int64, top_p [B] fp32, min_p [B] fp32,
//                 uniforms [B, R] fp32) -> tokens [B] int64
//
// The distribution is fd_core.ops.sampling's (_host_sample): a row with temperature 0 takes the argmax (the
// first maximum, the first NaN: numpy's); otherwise, in float64, z = logits / T, weights w = exp(z - max z)
// (the most likely token weighs 1), min-p zeroes w < min_p, top-k keeps the k largest (equal weights: the lower
// ids first), top-p the shortest prefix of the weights sorted descending (equal weights by id) whose mass
// reaches top_p of the kept total (the token that crosses it kept), and the token is the inverse CDF of that
// prefix at uniforms[:, 0]. A row without a finite maximum (a NaN, +inf, all -inf) takes the argmax.
//
// Where the reference sorts the row (numpy, ~0.4-12 ms over a 103424-wide row), this sorts only what the draw
// looks at. The weights are bucketed by their leading bits (exponent and 4 mantissa bits: a bucket spans a
// factor of at most 2^(1/16)), which orders the buckets; each bucket's count and sum give the cumulative mass at the
// bucket boundaries, and only the buckets holding the top-k boundary, the top-p cut and the draw are gathered
// and sorted. Weights below exp(-46) (~1e-20 of the largest) are dropped: their whole mass, even over a
// million tokens, is far below the 2^-24 by which a float32 uniform stays under 1, so no draw could reach
// them. Sums run in another order than numpy's, so a token can differ from the reference only where the
// uniform lies within rounding (~1e-16) of a CDF step; in one process the same logits always draw the same
// token, which is what multi-step decoding (fd_x86_run_plan_steps) relies on.
#include "sample_kernels.h"
#include "sample_op.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpu_features.h"
#include "kernels.h"
#include "paddle/extension.h"

namespace fdx86 {

// AVX-512 where the CPU has it; FD_X86_SAMPLE_ISA=portable forces the plain loops (the code a CPU without
// AVX-512 runs: tests, comparisons), read on each call.
static bool sample_avx512() {
  const char* isa = std::getenv("FD_X86_SAMPLE_ISA");
  return cpu_has_avx512() && !(isa != nullptr && std::strcmp(isa, "portable") == 0);
}

int64_t greedy_token(const float* row, int64_t n) {
  if (sample_avx512()) return greedy_token_avx512(row, n);
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] != row[i]) return i;
  }
  int64_t where = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[where]) where = i;
  }
  return where;
}

namespace {

constexpr double kCut = -46.0;        // log-weights below this are dropped (exp(-46) ~ 1.05e-20)
constexpr int kBits = 4;              // mantissa bits in a weight's bucket: 16 buckets an octave
constexpr int kShift = 52 - kBits;    // a weight's bucket: its bits >> kShift (sign 0, exponent, kBits bits)
constexpr uint64_t kKeyLo = 955u << kBits;  // keys at or below 2^-68's (below exp(-46), and 0): bucket 0
constexpr int kBuckets = (1024u << kBits) - kKeyLo;  // up to 1.0's octave
constexpr int kCopies = 4;            // histogram copies, so consecutive tokens do not wait on one sum

using Item = std::pair<double, int64_t>;  // (weight, token id)

struct Row {
  std::vector<double> w;
  std::vector<int64_t> count;  // [copies][kBuckets] while counting, then [kBuckets]
  std::vector<double> sum;
  std::vector<int64_t> offset;  // a gathered bucket's first item, -1 before
  std::vector<Item> items, spare;
  std::vector<int64_t> ids, nonzero;
  int parts = 1, threads = 1;  // the row's slices (of `slice` tokens) and the threads that scan them
  bool avx512 = false;          // the row's weights were made by the AVX-512 kernel: gather with it too
  int64_t slice = 0;

  static int bucket(double x) {  // 0 for 0 (and anything below 2^-67)
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const uint64_t key = bits >> kShift;
    return key > kKeyLo ? static_cast<int>(key - kKeyLo) : 0;
  }

  static double floor_of(int b) {
    const uint64_t bits = (static_cast<uint64_t>(b) + kKeyLo) << kShift;
    double x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }

  // One bucket's items, gathered in ascending id order, into the sampling order: weight descending, equal
  // weights by id. Their bits share everything above the low kShift bits, so a stable LSD radix sort of those
  // bits' complement, 8 bits a pass (a pass skipped where every item has the same byte), orders them; short
  // runs take std::sort.
  void order(Item* a, int64_t n) {
    if (n < 64) {
      std::sort(a, a + n, [](const Item& x, const Item& y) {
        return x.first > y.first || (x.first == y.first && x.second < y.second);
      });
      return;
    }
    spare.resize(n);
    Item *from = a, *to = spare.data();
    const auto digit = [](const Item& x, int shift) {
      uint64_t bits;
      std::memcpy(&bits, &x.first, sizeof bits);
      return static_cast<unsigned>((~bits >> shift) & 0xFF);
    };
    for (int shift = 0; shift < kShift; shift += 8) {
      int64_t count[257] = {0};
      for (int64_t i = 0; i < n; ++i) ++count[digit(from[i], shift) + 1];
      if (count[digit(from[0], shift) + 1] == n) continue;  // one byte value: the order stands
      for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
      for (int64_t i = 0; i < n; ++i) to[count[digit(from[i], shift)]++] = from[i];
      std::swap(from, to);
    }
    if (from != a) std::copy(from, from + n, a);
  }

  // bucket b's tokens in the sampling order (weight descending, equal weights by id), once. Each slice of the
  // row is scanned by the thread that wrote its weights (`threads` > 1), so none is read from another core.
  const Item* gather(int b) {
    if (offset[b] < 0) {
      const double lo = floor_of(b), hi = floor_of(b + 1);
      const int64_t start = static_cast<int64_t>(items.size()), n = static_cast<int64_t>(w.size());
      ids.resize(n + 8 * parts);
      int64_t found[2] = {0, 0};
#pragma omp parallel for num_threads(std::min(parts, threads)) schedule(static, 1) if (parts > 1 && threads > 1)
      for (int part = 0; part < parts; ++part) {
        const int64_t first = std::min(n, part * slice), last = std::min(n, first + slice);
        int64_t* out = ids.data() + first + 8 * part;
        if (avx512) {
          found[part] = sample_gather_avx512(w.data() + first, last - first, lo, hi, out);
        } else {
          for (int64_t i = first; i < last; ++i) {
            if (w[i] >= lo && w[i] < hi) out[found[part]++] = i - first;
          }
        }
      }
      for (int part = 0; part < parts; ++part) {
        const int64_t first = std::min(n, part * slice);
        const int64_t* in = ids.data() + first + 8 * part;
        for (int64_t j = 0; j < found[part]; ++j) items.emplace_back(w[first + in[j]], first + in[j]);
      }
      order(items.data() + start, static_cast<int64_t>(items.size()) - start);
      offset[b] = start;
    }
    return items.data() + offset[b];
  }
};

int64_t draw(Row& r, int copies, int64_t top_k, double top_p, double u) {
  for (int c = 1; c < copies; ++c) {
    for (int b = 0; b < kBuckets; ++b) {
      r.count[b] += r.count[c * kBuckets + b];
      r.sum[b] += r.sum[c * kBuckets + b];
    }
  }
  r.count.resize(kBuckets);
  r.sum.resize(kBuckets);
  int64_t kept = 0;
  for (int b = 0; b < kBuckets; ++b) kept += r.count[b];
  if (kept == 0) return -1;  // min_p above 1 dropped every weight: the caller takes the argmax
  // top-k: the buckets above the k-th token whole, its bucket cut to the tokens that precede it
  int lowest = 0;
  if (top_k > 0 && top_k < kept) {
    int64_t above = 0;
    for (int b = kBuckets - 1; b >= 0; --b) {
      if (above + r.count[b] < top_k) {
        above += r.count[b];
        continue;
      }
      const Item* items = r.gather(b);
      r.count[b] = top_k - above;
      double s = 0.0;
      for (int64_t i = 0; i < r.count[b]; ++i) s += items[i].first;
      r.sum[b] = s;
      lowest = b;
      break;
    }
  }
  double total = 0.0;
  int top = -1;
  for (int b = kBuckets - 1; b >= lowest; --b) {
    total += r.sum[b];
    if (top < 0 && r.count[b] > 0) top = b;
  }
  // The CDF: a bucket's tokens in order, each the mass before the bucket plus the bucket's weights so far,
  // its last token the mass before plus the bucket's sum (so gathering a bucket never moves a later one).
  // The prefix the draw picks from ends at token `end_i` of bucket `end_b`; `mass` is its CDF.
  int end_b = -1;
  int64_t end_i = 0;
  double mass = total;
  if (top_p < 1.0) {
    const double cut = top_p * total;
    double prev = 0.0;  // the CDF before the next token
    for (int b = kBuckets - 1; b >= lowest && prev < cut; --b) {
      if (r.count[b] == 0) continue;
      if (r.offset[b] < 0 && prev + r.sum[b] < cut) {  // every token of it lies before the cut
        end_b = b;
        end_i = r.count[b] - 1;
        prev += r.sum[b];
        continue;
      }
      const Item* items = r.gather(b);
      const double base = prev;
      double acc = base;
      for (int64_t i = 0; i < r.count[b] && prev < cut; ++i) {
        acc += items[i].first;
        end_b = b;
        end_i = i;
        prev = i == r.count[b] - 1 ? base + r.sum[b] : acc;
      }
    }
    if (end_b < 0) {  // a cut of 0: the most likely token alone
      end_b = top;
      end_i = 0;
      prev = r.count[top] == 1 ? r.sum[top] : r.gather(top)[0].first;
    }
    mass = prev;
  } else {
    for (int b = lowest; b < kBuckets; ++b) {
      if (r.count[b] > 0) {
        end_b = b;
        end_i = r.count[b] - 1;
        break;
      }
    }
  }
  const double target = u * mass;
  double prev = 0.0;
  for (int b = kBuckets - 1; b >= end_b; --b) {
    if (r.count[b] == 0) continue;
    const int64_t last = b == end_b ? end_i : r.count[b] - 1;
    if (b != end_b && r.offset[b] < 0 && prev + r.sum[b] <= target) {  // the draw lies past it
      prev += r.sum[b];
      continue;
    }
    const Item* items = r.gather(b);
    double acc = prev;
    for (int64_t i = 0; i <= last; ++i) {
      acc += items[i].first;
      const double cdf = i == r.count[b] - 1 ? prev + r.sum[b] : acc;
      if (cdf > target) return items[i].second;
    }
    if (b == end_b) return items[last].second;  // u * mass rounded onto the prefix's end: its last token
    prev += r.sum[b];
  }
  return r.gather(end_b)[end_i].second;
}

}  // namespace

int64_t sample_row(const float* x, int64_t n, float temperature, int64_t top_k, float top_p, float min_p, float u,
                   int threads) {
  const int64_t first = greedy_token(x, n);
  if (!(temperature > 0.0f) || !std::isfinite(x[first])) return first;  // greedy, or no finite maximum
  thread_local Row mine;
  Row& r = mine;  // this thread's: inside the parallel region below, `mine` would name each thread's own
  // min_p: 0 or NaN is off (the reference filters only for min_p > 0)
  const double t = temperature, top = static_cast<double>(x[first]) / t, mp = min_p > 0.0f ? min_p : 0.0;
  // The weights and their buckets, in two halves of the row (one a thread where there are two; one part below
  // 4096 tokens): each half's nonzero weights counted into its own kCopies histograms (copies by position, so
  // runs of one bucket do not wait on one sum). The halves do not depend on the thread count, so neither do
  // the sums' roundings nor the token: a row draws the same alone, in a batch, or in a multi-step run.
  const int parts = n >= 4096 ? 2 : 1;
  const int64_t slice = ((n + parts - 1) / parts + 7) / 8 * 8;
  r.parts = parts;
  r.threads = threads;
  r.slice = slice;
  r.w.resize(n);
  r.nonzero.resize(n + 8 * parts);
  r.count.assign(static_cast<size_t>(parts) * kCopies * kBuckets, 0);
  r.sum.assign(static_cast<size_t>(parts) * kCopies * kBuckets, 0.0);
  const bool avx512 = sample_avx512();
  r.avx512 = avx512;
#pragma omp parallel for num_threads(std::min(parts, threads)) schedule(static, 1) if (parts > 1 && threads > 1)
  for (int part = 0; part < parts; ++part) {
    const int64_t lo = std::min(n, part * slice), hi = std::min(n, lo + slice);
    int64_t* nonzero = r.nonzero.data() + lo + 8 * part;  // indices from lo
    int64_t live = 0;
    if (avx512) {
      live = sample_weights_avx512(x + lo, hi - lo, t, top, mp, kCut, r.w.data() + lo, nonzero);
    } else {
      for (int64_t i = lo; i < hi; ++i) {
        const double d = static_cast<double>(x[i]) / t - top;
        const double e = d >= kCut ? std::exp(d) : 0.0;
        r.w[i] = e >= mp ? e : 0.0;
        if (r.w[i] > 0.0) nonzero[live++] = i - lo;
      }
    }
    int64_t* count = r.count.data() + static_cast<size_t>(part) * kCopies * kBuckets;
    double* sum = r.sum.data() + static_cast<size_t>(part) * kCopies * kBuckets;
    const double* w = r.w.data() + lo;
    for (int64_t j = 0; j < live; ++j) {
      const double v = w[nonzero[j]];
      const int b = (j & (kCopies - 1)) * kBuckets + Row::bucket(v);
      ++count[b];
      sum[b] += v;
    }
  }
  r.offset.assign(kBuckets, -1);
  r.items.clear();
  const int64_t token = draw(r, parts * kCopies, top_k, top_p, u);
  return token >= 0 ? token : first;
}

void check_sampling_rows(const char* op, int64_t rows, const paddle::Tensor& temperature, const paddle::Tensor& top_k,
                         const paddle::Tensor& top_p, const paddle::Tensor& min_p) {
  const std::pair<const paddle::Tensor*, const char*> args[] = {
      {&temperature, "temperature"}, {&top_k, "top_k"}, {&top_p, "top_p"}, {&min_p, "min_p"}};
  for (const auto& [x, name] : args) {
    const auto dtype = x == &top_k ? paddle::DataType::INT64 : paddle::DataType::FLOAT32;
    PD_CHECK(x->is_cpu() && x->dtype() == dtype && x->numel() == rows && x->is_contiguous(), op, ": ", name,
             " must be a contiguous host tensor of ", rows, " ", dtype == paddle::DataType::INT64 ? "int64" : "fp32",
             " values");
  }
}

}  // namespace fdx86

namespace {

std::vector<paddle::Tensor> Sample(const paddle::Tensor& logits, const paddle::Tensor& temperature,
                                   const paddle::Tensor& top_k, const paddle::Tensor& top_p,
                                   const paddle::Tensor& min_p, const paddle::Tensor& uniforms, int threads) {
  const char* op = "fd_x86_sample";
  PD_CHECK(logits.is_cpu() && logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2 &&
               logits.is_contiguous(),
           op, ": logits must be a contiguous [B, V] fp32 host tensor");
  const int64_t B = logits.shape()[0], V = logits.shape()[1];
  PD_CHECK(V >= 1, op, ": logits have no columns");
  fdx86::check_sampling_rows(op, B, temperature, top_k, top_p, min_p);
  PD_CHECK(uniforms.is_cpu() && uniforms.dtype() == paddle::DataType::FLOAT32 && uniforms.shape().size() == 2 &&
               uniforms.shape()[0] == B && uniforms.shape()[1] >= 1 && uniforms.is_contiguous(),
           op, ": uniforms must be a contiguous [B, R >= 1] fp32 host tensor");
  paddle::Tensor out = paddle::empty({B}, paddle::DataType::INT64, paddle::CPUPlace());
  const float *x = logits.data<float>(), *t = temperature.data<float>(), *p = top_p.data<float>();
  const float *m = min_p.data<float>(), *u = uniforms.data<float>();
  const int64_t* k = top_k.data<int64_t>();
  const int64_t R = uniforms.shape()[1];
  int64_t* tokens = out.data<int64_t>();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (B > 1 && threads > 1)
  for (int64_t i = 0; i < B; ++i) {
    tokens[i] = fdx86::sample_row(x + i * V, V, t[i], k[i], p[i], m[i], u[i * R], B == 1 ? threads : 1);
  }
  return {out};
}

}  // namespace

PD_BUILD_OP(fd_x86_sample)
    .Inputs({"Logits", "Temperature", "TopK", "TopP", "MinP", "Uniforms"})
    .Outputs({"Tokens"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(Sample));
