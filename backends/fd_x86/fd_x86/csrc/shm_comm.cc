// Shared-memory all-reduce and all-gather between the ranks of one host
// (fd_x86/comm.py calls these through ctypes; plain C ABI, no paddle).
//
// Segment: a header (one cache line per rank: its barrier generation, its
// step count and its pid) and then two buffer sets of `world` slots of
// `slot_bytes` each. Every collective step writes into set (steps % 2):
// a rank reaches step k+2's writes only after step k+1's first barrier,
// which every rank passes only after finishing step k's reads, so two sets
// need no third barrier.
//
// all_reduce, per chunk of at most slot_bytes:
//   small (< kSplitBytes): each rank copies its chunk into its slot, barrier,
//     each sums all slots in rank order (one barrier; identical sums everywhere);
//   large: copy, barrier, rank r sums slice r of every slot into slot 0
//     (reduce-scatter), barrier, each copies slot 0 out (all-gather).
// all_gather: copy into the slot, barrier, copy every slot out.
//
// Barrier: a rank stores its new generation in its own line (release) and
// waits until every rank's line holds at least that value: spin with pause,
// then sched_yield, then short sleeps; a rank whose process is gone is
// reported at once, one that does not arrive within the timeout after it.
// Returns 0, or -(1 + kind * world + r) naming rank r and what went wrong:
// kind 0 it did not arrive within the timeout, 1 its process has exited
// (or is a zombie), 2 it gave up (fd_x86_shm_abort), 3 it passed a
// different element count; or kErrArgs (bad arguments or segment). The first
// rank to see a failure records its code in the header; the others, still
// waiting, return that code, so every rank names the same rank and cause.
// GCC 12 warns about its own _mm512_undefined in cvtepu16 and about the
// vector ABI of the target("avx512f") helpers; both are harmless here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

constexpr uint64_t kMagic = 0x6664783836736d31ULL;  // "fdx86sm1"
constexpr int kMaxRanks = 64;
constexpr int64_t kLine = 64;
constexpr int64_t kSplitBytes = 64 * 1024;
constexpr int kErrArgs = -100000;

struct alignas(64) RankLine {
  std::atomic<uint64_t> generation;  // barriers this rank has entered
  uint64_t steps;                    // collective steps done (buffer set = steps % 2)
  int64_t pid;
  int64_t count[2];  // this step's element count, per buffer set
};

struct Header {
  uint64_t magic;
  uint64_t token;  // rank 0's random token: the attaching ranks check it
  int64_t world;
  int64_t slot_bytes;
  std::atomic<int32_t> failure;  // 0, or the first failure's return code
  char pad[kLine - 36];
  RankLine ranks[kMaxRanks];
};

int64_t data_offset() { return (sizeof(Header) + 4095) & ~int64_t{4095}; }

char* slot(Header* h, int64_t set, int64_t r) {
  return reinterpret_cast<char*>(h) + data_offset() + (set * h->world + r) * h->slot_bytes;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum Kind { kTimeout = 0, kExited = 1, kAborted = 2, kMismatch = 3 };

// Records the failure (unless one is recorded) and returns the recorded one.
int fail(Header* h, Kind kind, int64_t r) {
  int32_t expected = 0;
  h->failure.compare_exchange_strong(expected, static_cast<int32_t>(-(1 + kind * h->world + r)),
                                     std::memory_order_acq_rel);
  return h->failure.load(std::memory_order_acquire);
}

// The process is gone, or a zombie its parent has not reaped yet.
bool process_gone(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  const size_t got = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[got] = 0;
  const char* paren = std::strrchr(buf, ')');
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// Waits for every rank to enter barrier `gen`; 0 or a negative code (top comment).
int barrier(Header* h, int rank, double timeout_s) {
  RankLine& mine = h->ranks[rank];
  const uint64_t gen = mine.generation.load(std::memory_order_relaxed) + 1;
  mine.generation.store(gen, std::memory_order_release);
  const int64_t world = h->world;
  for (int64_t r = 0; r < world; ++r) {
    RankLine& other = h->ranks[r];
    if (other.generation.load(std::memory_order_acquire) >= gen) continue;
    for (int i = 0; i < 4000 && other.generation.load(std::memory_order_acquire) < gen; ++i) _mm_pause();
    const double start = now_s();
    double next_check = start + 0.01;  // no syscalls in a short wait
    uint64_t waits = 0;
    while (other.generation.load(std::memory_order_acquire) < gen) {
      if (++waits < 2000) {
        sched_yield();
      } else {
        timespec nap{0, 50000};  // waited long (a slow rank): stop burning the core
        nanosleep(&nap, nullptr);
      }
      const double t = now_s();
      if (t < next_check) continue;
      next_check = t + 0.05;
      // a rank may arrive, finish its last step and exit between two looks:
      // only one that is gone (or late) and has still not arrived is missing
      const bool gone = process_gone(other.pid), late = t - start > timeout_s;
      if ((gone || late) && other.generation.load(std::memory_order_acquire) >= gen) break;
      if (gone) return fail(h, kExited, r);
      if (late) return fail(h, kTimeout, r);
      if (int code = h->failure.load(std::memory_order_acquire)) return code;
    }
  }
  return 0;
}

// After a step's first barrier: 0, or the code naming the first rank whose
// count differs from rank 0's (the same rank on every rank).
int check_counts(Header* h, int64_t set) {
  const int64_t first = h->ranks[0].count[set];
  for (int64_t r = 1; r < h->world; ++r) {
    if (h->ranks[r].count[set] != first) return fail(h, kMismatch, r);
  }
  return 0;
}

// ------------------------------------------------------------ the sums

constexpr int kF32 = 0, kBF16 = 1;

__attribute__((target("avx512f"))) void sum_f32_avx512(const float* const* src, int n_src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 acc = _mm512_loadu_ps(src[0] + i);
    for (int s = 1; s < n_src; ++s) acc = _mm512_add_ps(acc, _mm512_loadu_ps(src[s] + i));
    _mm512_storeu_ps(dst + i, acc);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 acc = _mm512_maskz_loadu_ps(m, src[0] + i);
    for (int s = 1; s < n_src; ++s) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, src[s] + i));
    _mm512_mask_storeu_ps(dst + i, m, acc);
  }
}

void sum_f32_scalar(const float* const* src, int n_src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = src[0][i];
    for (int s = 1; s < n_src; ++s) acc += src[s][i];
    dst[i] = acc;
  }
}

inline float bf16_to_f32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__attribute__((target("avx512f,avx512bw"))) inline __m512 widen(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// bf16: widened to fp32, summed in rank order, rounded once
__attribute__((target("avx512f,avx512bw"))) void sum_bf16_avx512(const uint16_t* const* src, int n_src,
                                                                  uint16_t* dst, int64_t n) {
  const __m512i lsb = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 acc = widen(src[0] + i);
    for (int s = 1; s < n_src; ++s) acc = _mm512_add_ps(acc, widen(src[s] + i));
    const __mmask16 nan = _mm512_cmp_ps_mask(acc, acc, _CMP_UNORD_Q);
    __m512i bits = _mm512_castps_si512(acc);
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(bits, 16),
                                                                                     lsb)));
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, _mm512_set1_epi32(0x400000)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
  }
  for (; i < n; ++i) {
    float acc = bf16_to_f32(src[0][i]);
    for (int s = 1; s < n_src; ++s) acc += bf16_to_f32(src[s][i]);
    dst[i] = f32_to_bf16(acc);
  }
}

void sum_bf16_scalar(const uint16_t* const* src, int n_src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = bf16_to_f32(src[0][i]);
    for (int s = 1; s < n_src; ++s) acc += bf16_to_f32(src[s][i]);
    dst[i] = f32_to_bf16(acc);
  }
}

bool has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}

// dst[i] = sum over s of src[s][i], i in [0, n), for n elements of dtype
void sum(int dtype, char* const* src, int n_src, char* dst, int64_t n) {
  if (dtype == kF32) {
    auto s = reinterpret_cast<const float* const*>(src);
    has_avx512() ? sum_f32_avx512(s, n_src, reinterpret_cast<float*>(dst), n)
                 : sum_f32_scalar(s, n_src, reinterpret_cast<float*>(dst), n);
  } else {
    auto s = reinterpret_cast<const uint16_t* const*>(src);
    has_avx512() ? sum_bf16_avx512(s, n_src, reinterpret_cast<uint16_t*>(dst), n)
                 : sum_bf16_scalar(s, n_src, reinterpret_cast<uint16_t*>(dst), n);
  }
}

Header* checked(void* base, int rank) {
  auto* h = static_cast<Header*>(base);
  if (h == nullptr || h->magic != kMagic || rank < 0 || rank >= h->world) return nullptr;
  return h;
}

}  // namespace

extern "C" {

// Bytes a segment for `world` ranks with `slot_bytes` per slot needs.
int64_t fd_x86_shm_segment_bytes(int64_t world, int64_t slot_bytes) {
  return data_offset() + 2 * world * slot_bytes;
}

int64_t fd_x86_shm_max_ranks() { return kMaxRanks; }

// Rank 0, on a fresh zero-filled segment: write the header.
int fd_x86_shm_init(void* base, int64_t world, int64_t slot_bytes, uint64_t token) {
  if (world < 1 || world > kMaxRanks || slot_bytes < 4096 || slot_bytes % 4096) return kErrArgs;
  auto* h = static_cast<Header*>(base);
  h->token = token;
  h->world = world;
  h->slot_bytes = slot_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return 0;
}

// Every rank, once attached: check the header and record this rank's pid.
// Returns 0, or kErrArgs when the segment is not the one rank 0 made.
int fd_x86_shm_attach(void* base, int rank, int64_t world, int64_t slot_bytes, uint64_t token, int64_t pid) {
  Header* h = checked(base, rank);
  if (h == nullptr || h->token != token || h->world != world || h->slot_bytes != slot_bytes) return kErrArgs;
  h->ranks[rank].pid = pid;
  return 0;
}

// This rank gives up (an error outside the collectives): the others stop
// waiting for it and name it.
void fd_x86_shm_abort(void* base, int rank) {
  Header* h = checked(base, rank);
  if (h != nullptr) fail(h, kAborted, rank);
}

// Sums `n` elements of `data` (dtype 0 fp32, 1 bf16) over the ranks, in place.
int fd_x86_shm_all_reduce(void* base, int rank, void* data, int64_t n, int dtype, double timeout_s) {
  Header* h = checked(base, rank);
  if (h == nullptr || n < 0 || (dtype != kF32 && dtype != kBF16)) return kErrArgs;
  const int64_t item = dtype == kF32 ? 4 : 2, world = h->world;
  const int64_t chunk = h->slot_bytes / item;
  char* out = static_cast<char*>(data);
  char* srcs[kMaxRanks];
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = n - start < chunk ? n - start : chunk;
    const int64_t set = h->ranks[rank].steps++ & 1;
    char* chunk_out = out + start * item;
    std::memcpy(slot(h, set, rank), chunk_out, len * item);
    h->ranks[rank].count[set] = n;
    if (int rc = barrier(h, rank, timeout_s)) return rc;
    if (int rc = check_counts(h, set)) return rc;
    for (int64_t r = 0; r < world; ++r) srcs[r] = slot(h, set, r);
    if (len * item < kSplitBytes || world == 1) {
      sum(dtype, srcs, static_cast<int>(world), chunk_out, len);
      continue;
    }
    // reduce-scatter: slice `rank` (whole cache lines) of every slot into slot 0
    const int64_t per_line = kLine / item;
    const int64_t slice = ((len + world - 1) / world + per_line - 1) / per_line * per_line;
    const int64_t lo = rank * slice < len ? rank * slice : len;
    const int64_t hi = lo + slice < len ? lo + slice : len;
    if (hi > lo) {
      char* parts[kMaxRanks];
      for (int64_t r = 0; r < world; ++r) parts[r] = srcs[r] + lo * item;
      sum(dtype, parts, static_cast<int>(world), srcs[0] + lo * item, hi - lo);
    }
    if (int rc = barrier(h, rank, timeout_s)) return rc;
    std::memcpy(chunk_out, srcs[0], len * item);  // all-gather
  }
  return 0;
}

// out[r * nbytes : (r + 1) * nbytes] = rank r's `data` (nbytes each), any dtype.
int fd_x86_shm_all_gather(void* base, int rank, const void* data, int64_t nbytes, void* out, double timeout_s) {
  Header* h = checked(base, rank);
  if (h == nullptr || nbytes < 0) return kErrArgs;
  const int64_t world = h->world, chunk = h->slot_bytes;
  const char* in = static_cast<const char*>(data);
  char* dst = static_cast<char*>(out);
  for (int64_t start = 0; start < nbytes; start += chunk) {
    const int64_t len = nbytes - start < chunk ? nbytes - start : chunk;
    const int64_t set = h->ranks[rank].steps++ & 1;
    std::memcpy(slot(h, set, rank), in + start, len);
    h->ranks[rank].count[set] = nbytes;
    if (int rc = barrier(h, rank, timeout_s)) return rc;
    if (int rc = check_counts(h, set)) return rc;
    for (int64_t r = 0; r < world; ++r) std::memcpy(dst + r * nbytes + start, slot(h, set, r), len);
  }
  return 0;
}

}  // extern "C"
