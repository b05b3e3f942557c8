// Replays the weight reads of one batch-1 decode step of an ERNIE 4.5 model (dense or MoE) with no arithmetic:
// per layer the attention's qkv and o weights, then the dense MLP's gate/up and down, or the MoE layer's router,
// top-k routed experts (drawn at random each step, among `experts`) and shared experts, then the head. Each
// weight is one parallel region of `threads` threads (each its static share of the rows), as fd_x86's kernels
// split them; 512-bit loads, the kernels' software prefetch 8 KiB ahead into L2, weights in 2 MiB pages. Prints
// per round the step's bytes, ms and GB/s, and a contiguous read of as many bytes in the same buffer.
//
//   read_pattern HIDDEN LAYERS FIRST_MOE INTER MOE_INTER EXPERTS TOP_K SHARED HEADS KV_HEADS HEAD_DIM VOCAB
//                BYTES_PER_WEIGHT [THREADS=2] [ROUNDS=5] [STEPS=8] [PLACED=EXPERTS] [EXPERT_BYTES] [HEAD_BYTES]
// (FIRST_MOE: the first MoE layer; >= LAYERS for a dense model. BYTES_PER_WEIGHT: codes and scales, e.g.
// 0.53125 for int4 with an fp32 scale per 128 weights, 1.0039 for int8 with fp32 per-channel scales at K=1024.
// PLACED: experts laid out per layer, the top-k drawn among them: fewer than EXPERTS keeps the buffer small
// beside a loaded model; a step reads the same bytes either way. EXPERT_BYTES / HEAD_BYTES: bytes a weight
// of the routed experts / of the head where they differ from the other linears' (FastDeploy's wint4 rule:
// experts int4, the attention, dense and shared-expert linears int8, the head bf16).)
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

struct Weight {
  size_t offset, bytes;
};

__m512i read(const char* p, size_t n, __m512i acc) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    _mm_prefetch(p + i + 8192, _MM_HINT_T1);
    acc = _mm512_add_epi32(acc, _mm512_load_si512(p + i));
  }
  return acc;
}

size_t lines(double bytes) { return (static_cast<size_t>(bytes) + 63) / 64 * 64; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 14) {
    std::fprintf(stderr, "usage: %s HIDDEN LAYERS FIRST_MOE INTER MOE_INTER EXPERTS TOP_K SHARED HEADS KV_HEADS "
                 "HEAD_DIM VOCAB BYTES_PER_WEIGHT [THREADS] [ROUNDS] [STEPS] [PLACED] [EXPERT_BYTES] [HEAD_BYTES]\n",
                 argv[0]);
    return 2;
  }
  const size_t D = atol(argv[1]), L = atol(argv[2]), first_moe = atol(argv[3]), I = atol(argv[4]),
               Im = atol(argv[5]), E = atol(argv[6]), K = atol(argv[7]), S = atol(argv[8]), H = atol(argv[9]),
               KVH = atol(argv[10]), HD = atol(argv[11]), V = atol(argv[12]);
  const double bpw = atof(argv[13]);
  const int threads = argc > 14 ? atoi(argv[14]) : 2, rounds = argc > 15 ? atoi(argv[15]) : 5,
            steps = argc > 16 ? atoi(argv[16]) : 8;
  const long placed_arg = argc > 17 ? atol(argv[17]) : long(E);
  if (threads < 1 || rounds < 1 || steps < 1 || placed_arg < 1 || bpw <= 0) {
    std::fprintf(stderr, "THREADS, ROUNDS, STEPS and PLACED must be >= 1 and BYTES_PER_WEIGHT > 0\n");
    return 2;
  }
  const size_t placed = std::max(K, std::min(E, size_t(placed_arg)));
  const double expert_bpw = argc > 18 ? atof(argv[18]) : bpw, head_bpw = argc > 19 ? atof(argv[19]) : bpw;
  // the model's weights, laid out one after another as a loader would place them
  size_t at = 0;
  auto place = [&](double bytes) { Weight w{at, lines(bytes)}; at += w.bytes; return w; };
  struct Layer {
    Weight qkv, o, up, down, router, sh_up, sh_down;
    std::vector<Weight> e_up, e_down;
  };
  std::vector<Layer> layers(L);
  for (size_t l = 0; l < L; ++l) {
    Layer& y = layers[l];
    y.qkv = place(double(D) * (H + 2 * KVH) * HD * bpw);
    y.o = place(double(H) * HD * D * bpw);
    if (l < first_moe) {
      y.up = place(2.0 * D * I * bpw);
      y.down = place(double(I) * D * bpw);
    } else {
      y.router = place(double(D) * E * 4);  // fp32
      for (size_t e = 0; e < placed; ++e) y.e_up.push_back(place(2.0 * D * Im * expert_bpw));
      for (size_t e = 0; e < placed; ++e) y.e_down.push_back(place(double(Im) * D * expert_bpw));
      if (S) {
        y.sh_up = place(2.0 * D * Im * S * bpw);
        y.sh_down = place(double(Im) * S * D * bpw);
      }
    }
  }
  const Weight head = place(double(V) * D * head_bpw);
  const size_t huge = size_t(2) << 20, total = (at + huge - 1) / huge * huge;
  char* raw = static_cast<char*>(mmap(nullptr, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (raw == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  char* buf = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~uintptr_t(huge - 1));
  madvise(buf, total, MADV_HUGEPAGE);
  for (size_t i = 0; i < total; i += 4096) buf[i] = 1;
  std::mt19937 rng(0);
  long long sink = 0;  // the loads' sum, printed: nothing is optimized away
  auto region = [&](const std::vector<Weight>& ws) {  // one parallel region: each thread its share of each weight
#pragma omp parallel num_threads(threads)
    {
      const size_t t = omp_get_thread_num(), n = omp_get_num_threads();
      __m512i acc = _mm512_setzero_si512();
      for (const Weight& w : ws) {
        const size_t rows = w.bytes / 64, lo = rows * t / n * 64, hi = rows * (t + 1) / n * 64;
        acc = read(buf + w.offset + lo, hi - lo, acc);
      }
      const int part = _mm512_reduce_add_epi32(acc);
#pragma omp atomic
      sink += part;
    }
  };
  size_t step_bytes = 0;
  auto step = [&]() {
    step_bytes = 0;
    auto go = [&](std::vector<Weight> ws) {
      for (const Weight& w : ws) step_bytes += w.bytes;
      region(ws);
    };
    for (size_t l = 0; l < L; ++l) {
      const Layer& y = layers[l];
      go({y.qkv});
      go({y.o});
      if (l < first_moe) {
        go({y.up});
        go({y.down});
      } else {
        go({y.router});
        std::vector<size_t> ids(placed);
        for (size_t e = 0; e < placed; ++e) ids[e] = e;
        std::shuffle(ids.begin(), ids.end(), rng);
        std::sort(ids.begin(), ids.begin() + K);
        std::vector<Weight> up, down;
        for (size_t j = 0; j < K; ++j) up.push_back(y.e_up[ids[j]]), down.push_back(y.e_down[ids[j]]);
        if (S) up.push_back(y.sh_up), down.push_back(y.sh_down);
        go(up);
        go(down);
      }
    }
    go({head});
  };
  step();  // warm: the pages and the threads
  std::printf("weights %.2f GB in 2 MiB pages, %d threads\n", at / 1e9, threads);
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    const Weight flat{0, step_bytes / 64 * 64};
    auto t1 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) region({flat});
    const double flat_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() / steps;
    std::printf("round %d: step bytes %.3f MB, %.3f ms (%.1f GB/s); contiguous read %.3f ms (%.1f GB/s)\n", r,
                step_bytes / 1e6, ms, step_bytes / ms / 1e6, flat_ms, step_bytes / flat_ms / 1e6);
    std::fflush(stdout);
  }
  std::printf("(checksum %lld)\n", sink);
  return 0;
}
