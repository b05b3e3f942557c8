// Standalone check of the AMX-int8 w8a8 kernel against the AVX-512 VNNI one
// (no paddle): bit-exact outputs over odd shapes, then timings of the 0.3B
// decode step's matmuls. Built and run by run.sh.
//
//   harness check          exits 1 on any mismatch; skips the AMX part (and
//                          says why) where the CPU / OS has no AMX
//   harness bench THREADS  ms per decode step's matmuls, AMX vs VNNI
#include <omp.h>

#include <algorithm>
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

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// fd_x86.linear.pack_weight("w8a8"): int8 [N, K] -> uint8 [N16][K4][16][4]
// holding w ^ 0x80, channels past N and inputs past K are w = 0
std::vector<uint8_t> pack_w8a8(const std::vector<int8_t>& w, int64_t N, int64_t K) {
  const int64_t nb = (N + 15) / 16, k4 = (K + 3) / 4;
  std::vector<uint8_t> p(size_t(nb * k4 * 64), 0x80);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      p[size_t(((n / 16 * k4 + k / 4) * 16 + n % 16) * 4 + k % 4)] = uint8_t(w[size_t(n * K + k)]) ^ 0x80;
  return p;
}

struct Activations {
  std::vector<int8_t> xq;
  std::vector<float> xscale;
  std::vector<int32_t> xsum;
  int64_t ldq = 0;
};

Activations quantize(int64_t M, int64_t K, Rng& rng, int threads) {
  std::vector<float> x(size_t(M * K));
  for (auto& v : x) v = rng.normal();
  if (M >= 3) std::fill(x.begin() + K, x.begin() + 2 * K, 0.0f);  // a zero row
  Activations q;
  q.ldq = round_up(K, 64);
  q.xq.assign(size_t(M * q.ldq), 0);
  q.xscale.resize(size_t(M));
  q.xsum.resize(size_t(M));
  fdx86::quantize_rows_avx512(x.data(), M, K, q.xq.data(), q.ldq, q.xscale.data(), q.xsum.data(), threads);
  return q;
}

fdx86::LinearArgs args(const Activations& q, int64_t M, int64_t N, int64_t K, const uint8_t* w, const float* scales,
                       float* out, int threads) {
  fdx86::LinearArgs a;
  a.M = M;
  a.N = N;
  a.K = K;
  a.xq = q.xq.data();
  a.ldq = q.ldq;
  a.xscale = q.xscale.data();
  a.xsum = q.xsum.data();
  a.w = w;
  a.scales = scales;
  a.out = out;
  a.threads = threads;
  return a;
}

bool amx_usable(std::string* why) {
  if (!fdx86::amx_available()) {
    *why = "this CPU has no AMX-TILE/AMX-INT8 (CPUID 7.0 EDX bits 24/25), or the OS refused the tile data "
           "(arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16)";
    return false;
  }
  return true;
}

int check() {
  const int threads = std::max(1, omp_get_max_threads());
  std::string why;
  const bool amx = amx_usable(&why);
  if (!amx) std::printf("SKIP AMX part: %s; checking the VNNI kernel against a scalar reference only\n", why.c_str());
  struct Shape { int64_t K, N; bool small_m_only; };
  const Shape shapes[] = {{64, 16, false},     {128, 40, false},    {1024, 2560, false}, {2048, 1024, false},
                          {1024, 6144, false}, {3072, 1024, false}, {1024, 103424, true}};
  const int64_t rows[] = {8, 9, 16, 17, 31, 32, 33, 64, 100, 257};
  int failures = 0, cases = 0;
  Rng rng(1234);
  for (const Shape& s : shapes) {
    std::vector<int8_t> w(size_t(s.N * s.K));
    for (auto& v : w) v = int8_t(int(rng.next() % 255) - 127);
    const std::vector<uint8_t> packed = pack_w8a8(w, s.N, s.K);
    std::vector<float> scales(size_t(s.N));
    for (auto& v : scales) v = 0.001f + 0.01f * rng.uniform();
    for (int64_t M : rows) {
      if (s.small_m_only && M != 8 && M != 32) continue;
      const Activations q = quantize(M, s.K, rng, threads);
      std::vector<float> vnni(size_t(M * s.N), -1.0f), tiles(size_t(M * s.N), -2.0f);
      fdx86::w8a8_packed_avx512_vnni(args(q, M, s.N, s.K, packed.data(), scales.data(), vnni.data(), threads));
      // VNNI vs the contract in scalar code, on a sample of outputs
      int64_t bad_ref = 0;
      for (int64_t m = 0; m < M; m += (M > 20 ? 7 : 1)) {
        for (int64_t n = 0; n < s.N; n += (s.N > 2560 ? 97 : 1)) {
          int64_t dot = 0;
          for (int64_t k = 0; k < s.K; ++k) dot += int64_t(w[size_t(n * s.K + k)]) * q.xq[size_t(m * q.ldq + k)];
          const float ref = float(int32_t(dot)) * q.xscale[size_t(m)] * scales[size_t(n)];
          if (std::memcmp(&ref, &vnni[size_t(m * s.N + n)], 4) != 0) ++bad_ref;
        }
      }
      ++cases;
      if (bad_ref) {
        ++failures;
        std::printf("FAIL vnni vs scalar M=%lld K=%lld N=%lld: %lld outputs differ\n", (long long)M, (long long)s.K,
                    (long long)s.N, (long long)bad_ref);
      }
      if (!amx) continue;
      fdx86::w8a8_packed_amx(args(q, M, s.N, s.K, packed.data(), scales.data(), tiles.data(), threads));
      if (std::memcmp(vnni.data(), tiles.data(), vnni.size() * 4) != 0) {
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < vnni.size(); ++i)
          if (std::memcmp(&vnni[i], &tiles[i], 4) != 0) {
            ++bad;
            if (first < 0) first = int64_t(i);
          }
        ++failures;
        std::printf("FAIL amx vs vnni M=%lld K=%lld N=%lld: %lld of %zu outputs differ, first [%lld, %lld]: %g vs %g\n",
                    (long long)M, (long long)s.K, (long long)s.N, (long long)bad, vnni.size(),
                    (long long)(first / s.N), (long long)(first % s.N), vnni[size_t(first)], tiles[size_t(first)]);
      } else {
        std::printf("ok   amx == vnni bit-exact M=%lld K=%lld N=%lld\n", (long long)M, (long long)s.K, (long long)s.N);
      }
    }
  }
  std::printf("%s: %d cases (%s), %d failures\n", failures ? "FAILED" : "PASSED", cases,
              amx ? "amx vs vnni bit-exact + vnni vs scalar" : "vnni vs scalar only", failures);
  return failures ? 1 : 0;
}

// The 0.3B model's decode step: 18 layers of qkv 1024->2560, o 2048->1024,
// up_gate 1024->6144, down 3072->1024, then lm_head 1024->103424; each layer
// its own weights (memory traffic as in the model)
int bench(int threads) {
  std::string why;
  if (!amx_usable(&why)) {
    std::printf("SKIP bench: %s\n", why.c_str());
    return 0;
  }
  struct Lin { int64_t K, N; std::vector<uint8_t> w; std::vector<float> s; };
  std::vector<Lin> lins;
  const int64_t layer[4][2] = {{1024, 2560}, {2048, 1024}, {1024, 6144}, {3072, 1024}};
  Rng rng(7);
  auto add = [&](int64_t K, int64_t N) {
    Lin l{K, N, std::vector<uint8_t>(size_t(round_up(N, 16) * K)), std::vector<float>(size_t(N))};
    uint64_t* p = reinterpret_cast<uint64_t*>(l.w.data());
    for (size_t i = 0; i < l.w.size() / 8; ++i) p[i] = rng.next();  // random packed bytes = packed random weights
    for (auto& v : l.s) v = 0.001f + 0.01f * rng.uniform();
    lins.push_back(std::move(l));
  };
  for (int i = 0; i < 18; ++i)
    for (auto& s : layer) add(s[0], s[1]);
  add(1024, 103424);
  std::vector<float> out(size_t(128 * 103424));
  std::printf("bench: %d threads; ms per decode step's matmuls (18 x [qkv, o, up_gate, down] + lm_head), "
              "median of 15 (lm_head alone in brackets)\n", threads);
  std::printf("%5s %22s %22s %8s\n", "M", "vnni ms", "amx ms", "speedup");
  for (int64_t M : {4, 8, 12, 16, 32, 64, 128}) {
    const Activations q1 = quantize(M, 1024, rng, threads), q2 = quantize(M, 2048, rng, threads),
                      q3 = quantize(M, 3072, rng, threads);
    double med[2], lm[2];
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<double> steps, heads;
      for (int rep = 0; rep < 16; ++rep) {
        double head = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (const Lin& l : lins) {
          const Activations& q = l.K == 1024 ? q1 : (l.K == 2048 ? q2 : q3);
          const fdx86::LinearArgs a = args(q, M, l.N, l.K, l.w.data(), l.s.data(), out.data(), threads);
          const auto h0 = std::chrono::steady_clock::now();
          if (kind == 0) fdx86::w8a8_packed_avx512_vnni(a); else fdx86::w8a8_packed_amx(a);
          if (l.N == 103424) head = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) {  // the first is a warm-up
          steps.push_back(ms);
          heads.push_back(head);
        }
      }
      std::sort(steps.begin(), steps.end());
      std::sort(heads.begin(), heads.end());
      med[kind] = steps[steps.size() / 2];
      lm[kind] = heads[heads.size() / 2];
    }
    char v[64], t[64];
    std::snprintf(v, sizeof v, "%.2f (%.2f)", med[0], lm[0]);
    std::snprintf(t, sizeof t, "%.2f (%.2f)", med[1], lm[1]);
    std::printf("%5lld %22s %22s %7.2fx\n", (long long)M, v, t, med[0] / med[1]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check") return check();
  if (mode == "bench") return bench(argc > 2 ? std::atoi(argv[2]) : omp_get_max_threads());
  std::fprintf(stderr, "usage: %s check | bench THREADS\n", argv[0]);
  return 2;
}
