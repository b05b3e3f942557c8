// Standalone check of the bf16 dense GEMMs (no paddle): the AMX-BF16 GEMM
// (kernels_amx_bf16.cc) and the avx512_bf16 vdpbf16ps GEMM
// (kernels_dense16.cc) against a double-precision product of the same bf16
// operands (x rounded to bf16 RNE, W bf16), over odd shapes; then timings of
// the 0.3B prefill matmuls. Built and run by run.sh.
//
//   dense16_amx check          exits 1 on any error beyond the bound; each
//                              kernel the CPU lacks is skipped, saying why
//   dense16_amx bench THREADS  ms per call, AMX vs vdpbf16ps vs stream
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"

namespace {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
  float normal() {
    float u = uniform() + 1e-7f, v = uniform();
    return std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
  }
};

uint16_t to_bf16(float f) {  // RNE, as vcvtneps2bf16 for finite values
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

double from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Case {
  int64_t M, N, K;
  std::vector<float> x, bias;
  std::vector<uint16_t> w;
};

Case make_case(int64_t M, int64_t N, int64_t K, bool bias, uint64_t seed) {
  Rng rng(seed);
  Case c{M, N, K, std::vector<float>(size_t(M * K)), {}, std::vector<uint16_t>(size_t(K * N))};
  for (float& v : c.x) v = rng.normal();
  for (uint16_t& v : c.w) v = to_bf16(0.05f * rng.normal());
  if (bias) {
    c.bias.resize(size_t(N));
    for (float& v : c.bias) v = rng.normal();
  }
  return c;
}

std::vector<float> run(const Case& c, int kernel, int threads) {
  std::vector<float> out(size_t(c.M * c.N), std::nanf(""));
  fdx86::Dense16Args a;
  a.M = c.M;
  a.N = c.N;
  a.K = c.K;
  a.x = c.x.data();
  a.ldx = c.K;
  a.w = c.w.data();
  a.wtype = fdx86::kDense16Bf16;
  a.bias = c.bias.empty() ? nullptr : c.bias.data();
  a.out = out.data();
  a.threads = threads;
  a.kernel = kernel;
  fdx86::dense16_linear_avx512(a);
  return out;
}

// max over outputs of |out - ref| / bound, bound = 2 K 2^-24 sum_k |x_k w_k| + 1e-30
double worst(const Case& c, const std::vector<float>& out) {
  double w = 0;
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double ref = c.bias.empty() ? 0.0 : c.bias[size_t(n)], mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = from_bf16(to_bf16(c.x[size_t(m * c.K + k)])) * from_bf16(c.w[size_t(k * c.N + n)]);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = out[size_t(m * c.N + n)];
      if (!std::isfinite(got)) return INFINITY;
      const double bound = 2.0 * double(c.K) * std::ldexp(1.0, -24) * mag + 1e-30;
      w = std::fmax(w, std::fabs(got - ref) / bound);
    }
  return w;
}

int check() {
  const bool amx = fdx86::amx_bf16_available(), dot = fdx86::dense16_has_bf16_dot();
  if (!amx) std::printf("AMX-BF16: skipped (no AMX-TILE/AMX-BF16/AVX512-BF16 on this CPU or the OS denies tile data)\n");
  if (!dot) std::printf("vdpbf16ps GEMM: skipped (no avx512_bf16)\n");
  const int64_t Ms[] = {16, 17, 31, 32, 33, 64, 100};
  const int64_t NKs[][2] = {{16, 32}, {64, 64}, {100, 31}, {130, 1031}, {1280, 1024}, {1024, 3072}};
  int bad = 0, cases = 0;
  uint64_t seed = 1;
  for (int64_t M : Ms)
    for (const auto& nk : NKs)
      for (int threads : {1, 4}) {
        const Case c = make_case(M, nk[0], nk[1], seed % 2 == 0, seed);
        ++seed;
        for (int kernel : {fdx86::kDense16Amx, fdx86::kDense16Gemm}) {
          if ((kernel == fdx86::kDense16Amx && !amx) || (kernel == fdx86::kDense16Gemm && !dot)) continue;
          const double w = worst(c, run(c, kernel, threads));
          ++cases;
          if (!(w <= 1.0)) {
            ++bad;
            std::printf("FAIL %s M=%lld N=%lld K=%lld threads=%d: error %.3g x the bound\n",
                        kernel == fdx86::kDense16Amx ? "amx" : "gemm", (long long)M, (long long)c.N,
                        (long long)c.K, threads, w);
          }
        }
      }
  std::printf("dense16 bf16 GEMMs: %d cases, %d beyond the bound\n", cases, bad);
  if (amx) {
    fdx86::Dense16Args a;
    a.M = 64;
    a.wtype = fdx86::kDense16Bf16;
    std::printf("auto kernel at M=64: %s\n", fdx86::dense16_kernel(a) == fdx86::kDense16Amx ? "amx" : "not amx");
  }
  return bad == 0 ? 0 : 1;
}

double ms_per_call(const Case& c, int kernel, int threads, int reps) {
  run(c, kernel, threads);  // warm: scratch, page faults
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) run(c, kernel, threads);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

int bench(int threads) {
  const bool amx = fdx86::amx_bf16_available(), dot = fdx86::dense16_has_bf16_dot();
  // the 0.3B's prefill matmuls (512 rows): qkv, o, up_gate, down; then up_gate, down and the LM head at
  // the row counts around the GEMMs' threshold
  const int64_t shapes[][3] = {{512, 1280, 1024}, {512, 1024, 1024}, {512, 6144, 1024}, {512, 1024, 3072},
                               {16, 6144, 1024}, {24, 6144, 1024}, {32, 6144, 1024}, {64, 6144, 1024},
                               {16, 1024, 3072}, {32, 1024, 3072}, {64, 1024, 3072},
                               {16, 103424, 1024}, {32, 103424, 1024}, {64, 103424, 1024}};
  std::printf("threads %d (bf16 W, fp32 x; ms per call)\n", threads);
  for (const auto& s : shapes) {
    const Case c = make_case(s[0], s[1], s[2], false, 7);
    const double st = ms_per_call(c, fdx86::kDense16Stream, threads, 3);
    const double gm = dot ? ms_per_call(c, fdx86::kDense16Gemm, threads, 5) : NAN;
    const double am = amx ? ms_per_call(c, fdx86::kDense16Amx, threads, 5) : NAN;
    const double gflop = 2.0 * double(s[0] * s[1] * s[2]) * 1e-6;
    std::printf("M=%4lld N=%6lld K=%4lld  stream %8.2f  vdpbf16ps %8.2f  amx %8.2f  amx/vdpbf16ps %.2fx  amx %.0f GFLOP/s\n",
                (long long)s[0], (long long)s[1], (long long)s[2], st, gm, am, gm / am, gflop / am);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check") return check();
  if (mode == "bench") return bench(argc > 2 ? std::atoi(argv[2]) : 2);
  std::fprintf(stderr, "usage: dense16_amx check | bench THREADS\n");
  return 2;
}
