// Batch-1 weight streaming of fd_x86's int4 kernels at one row, no paddle:
// the seconds and GB/s of one pass over ~512 MB of weights (far beyond any
// last-level cache) for each kernel whose software-prefetch distance
// session 13 tuned: the packed int4 words with int8 activations (w4a8's
// dense linears and head), the contract-layout w4a8 expert kernel and the
// wint4 LUT expert kernel. run.sh builds it once per distance set (the
// kernels' kPrefetchAhead replaced in copies of their sources) and runs the
// builds in turn, so a CPU other than the one the distances were tuned on
// (Zen 4) can be checked. Weights and activations are random bytes: the
// timing does not depend on their values.
//
//   prefetch_bench THREADS REPEATS [MIB=512]   -> one line per kernel: best and median ms, GB/s
//
// MIB: the weights' size. A few MiB (e.g. 12: inside the last-level cache) times the kernels' arithmetic
// rather than the memory: session 24 read the w4a8 words kernel at 127-136 GB/s and the contract-layout
// expert kernel at 67-70 GB/s so (2 threads, Zen 4).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels.h"
#include "moe_kernels.h"
#include "offline_kernels.h"
#include "prefill_kernels.h"

namespace {

constexpr int64_t kK = 2560, kN = 1536, kGroup = 128;  // ERNIE-4.5-21B's expert width

struct Set {
  std::vector<uint8_t> w;  // count matrices of [N, K/2] int4 codes (any layout: same bytes)
  std::vector<float> scales;
  int64_t count = 0;
};

Set make_set(int64_t bytes) {
  Set s;
  const int64_t per = kN * kK / 2;
  s.count = bytes / per > 0 ? bytes / per : 1;
  s.w.resize(per * s.count);
  s.scales.assign(kN * (kK / kGroup) * s.count, 0.01f);
  std::mt19937 rng(1);
  for (size_t i = 0; i < s.w.size(); i += 4) {
    const uint32_t r = rng();
    std::copy_n(reinterpret_cast<const uint8_t*>(&r), std::min<size_t>(4, s.w.size() - i), s.w.data() + i);
  }
  return s;
}

template <class F>
void time_kernel(const char* name, const Set& s, int repeats, F run) {
  std::vector<double> ms;
  for (int r = 0; r < repeats + 1; ++r) {  // the first pass warms (page faults, TLB)
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < s.count; ++i) run(i);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double bytes = static_cast<double>(s.w.size() + s.scales.size() * 4);
  std::printf("%-28s best %8.2f ms  median %8.2f ms  %6.1f GB/s (best)\n", name, ms.front(), ms[ms.size() / 2],
              bytes / ms.front() / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t mib = argc > 3 ? std::atoll(argv[3]) : 512;
  if (threads < 1 || repeats < 1 || mib < 1) {
    std::fprintf(stderr, "usage: %s THREADS REPEATS [MIB]: each at least 1\n", argv[0]);
    return 2;
  }
  const int64_t G = kK / kGroup, per = kN * kK / 2;
  const Set s = make_set(mib << 20);
  std::vector<float> out(kN), xf(kK, 0.5f), xe(kK);
  std::vector<int8_t> xq(kK, 3), planes(kK);
  std::vector<int32_t> xsum(G, 0);
  float xscale = 0.01f;
  fdx86::LinearArgs a;
  a.M = 1;
  a.N = kN;
  a.K = kK;
  a.groups = G;
  a.group_size = kGroup;
  a.out = out.data();
  a.threads = threads;
  a.xscale = &xscale;
  a.xsum = xsum.data();
  // packed int4 words, int8 activations (prepared order): fd_x86.linear.w4a8_linear's kernel
  a.xq = xq.data();
  a.ldq = kK;
  time_kernel("w4a8 dense (int4 words)", s, repeats, [&](int64_t i) {
    a.w = s.w.data() + i * per;
    a.scales = s.scales.data() + i * kN * G;
    fdx86::wint4_words_vnni_avx512(a);
  });
  // contract layout, int8 activations split by parity: the w4a8 expert kernel
  fdx86::w4a8_split_avx512(xq.data(), 1, kK, kK, kGroup, planes.data(), kK / 2, xsum.data());
  a.xq = planes.data();
  a.ldh = kK / 2;
  time_kernel("w4a8 experts (contract)", s, repeats, [&](int64_t i) {
    a.w = s.w.data() + i * per;
    a.scales = s.scales.data() + i * kN * G;
    fdx86::w4a8_avx512_vnni(a);
  });
  // contract layout, fp32 activations through the 16-entry tables: the wint4 expert kernel
  fdx86::wint4_lut_permute(xf.data(), 1, kK, xe.data());
  a.xe = xe.data();
  a.ldh = kK;
  time_kernel("wint4 experts (LUT)", s, repeats, [&](int64_t i) {
    a.w = s.w.data() + i * per;
    a.scales = s.scales.data() + i * kN * G;
    fdx86::wint4_lut_avx512(a);
  });
  std::printf("(%d threads, %lld matrices of [%lld, %lld] int4 + group-%lld scales, %.0f MB a pass)\n", threads,
              static_cast<long long>(s.count), static_cast<long long>(kN), static_cast<long long>(kK),
              static_cast<long long>(kGroup), (s.w.size() + s.scales.size() * 4) / 1e6);
  return 0;
}
