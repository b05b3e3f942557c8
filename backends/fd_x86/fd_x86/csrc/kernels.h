// fd_x86 linear kernels: the ISA-independent interface.
//
// Each kernel lives in a translation unit compiled for one ISA through
// `#pragma GCC target` (kernels_avx512.cc, kernels_avx2.cc), so the library
// builds without -march=native and runs on any x86-64 CPU: the op picks the
// kernel at run time with __builtin_cpu_supports. Kernel TUs include no
// paddle or STL headers, so no inline function compiled for AVX-512 can be
// merged (COMDAT) into code that runs on an older CPU.
//
// Layouts (the fd-core contract, fd_core.quantization):
//   wint8, w8a8: qweight int8 [N, K] (row = output channel), scales fp32 [N]
//   wint4:       qweight uint8 [N, K/2], byte j = in 2j (low nibble) and
//                2j+1 (high nibble), signed 4-bit; scales fp32 [N, G] with
//                group g covering in [g*group_size, (g+1)*group_size)
#pragma once
#include <cstdint>

namespace fdx86 {

struct LinearArgs {
  int64_t M = 0, N = 0, K = 0;  // x [M, K], out [M, N]
  const float* x = nullptr;     // wint8: fp32 activations [M, K] (row stride K)
  // w8a8: per-token quantized activations [M, ldq] (zero padded), their
  // scales [M] and row sums [M] (for the u8 offset compensation)
  const int8_t* xq = nullptr;
  int64_t ldq = 0;
  const float* xscale = nullptr;
  const int32_t* xsum = nullptr;
  // wint4: activations split into even / odd input indices [M, ldh] (zero padded)
  const float* xe = nullptr;
  const float* xo = nullptr;
  int64_t ldh = 0;
  // wint4 / wint8 on bf16 activations: pairs [M, K/2] from wint4_bf16_prepare_avx512 /
  // wint8_bf16_prepare_avx512
  const uint32_t* xb = nullptr;
  const void* w = nullptr;        // qweight
  const float* scales = nullptr;  // [N] or [N, groups]
  int64_t groups = 1;
  int64_t group_size = 0;  // wint4: input features per group (even)
  float* out = nullptr;    // [M, N]
  int threads = 1;
};

// Per-token dynamic int8 quantization for w8a8: s = max|x| / 127 (1 for a
// zero row), xq = clip(rint(x / s), -127, 127), xsum = sum(xq). Writes
// xq [M, ldq] with zeros past K.
void quantize_rows_avx512(const float* x, int64_t M, int64_t K, int8_t* xq, int64_t ldq,
                          float* xscale, int32_t* xsum, int threads);
void quantize_rows_avx2(const float* x, int64_t M, int64_t K, int8_t* xq, int64_t ldq,
                        float* xscale, int32_t* xsum, int threads);

void wint8_avx512(const LinearArgs& a);
void wint4_avx512(const LinearArgs& a);
void w8a8_avx512_vnni(const LinearArgs& a);

// The same on the packed layouts (kernels_avx512.cc): a.w is the packed
// weight; wint4's a.scales are packed [N16][G][16], the others' stay [N].
void wint8_packed_avx512(const LinearArgs& a);
void wint4_packed_avx512(const LinearArgs& a);
void w8a8_packed_avx512_vnni(const LinearArgs& a);

// AMX-int8 (kernels_amx.cc): w8a8 on the same packed weight, the same
// results bit for bit; needs amx_available() and K % 64 == 0 (a.ldq == K).
// Returns false (nothing written) when its row buffer cannot be allocated.
bool w8a8_packed_amx(const LinearArgs& a);
// kernels_cpu.cc (baseline x86-64): CPUID says AMX-TILE + AMX-INT8 (and
// AVX-512 VNNI) and the OS granted this process the tile data state
// (arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16); asked once, cached.
bool amx_available();

// Packed wint4 words against bf16 activations (kernels_int4_bf16.cc; needs
// avx512_bf16, dense16_has_bf16_dot(); K and the group size multiples of 8).
// wint4_bf16_prepare_avx512 rounds x [M, K] to bf16 (RNE) into xb [M, K/2]
// in the kernel's pair order; wint4_words_bf16_avx512 then computes
// out = sum_g scale[n, g] * sum_{k in g} code[n, k] * bf16(x[m, k]), each
// group's products exact and summed in fp32, the groups in ascending order
// (a.xb = xb; a.x unused). vdpbf16ps reads denormals as zero: an activation
// under 2^-126 in magnitude counts as 0.
void wint4_bf16_prepare_avx512(const float* x, int64_t M, int64_t K, uint32_t* xb, int threads);
void wint4_words_bf16_avx512(const LinearArgs& a);

// wint8 against bf16 activations (kernels_int8_bf16.cc; needs avx512_bf16).
// wint8_bf16_prepare_avx512 rounds x [M, K] (K even) to bf16 (RNE) into
// xb [M, K/2] in input order (dword p = bf16(x[2p]) | bf16(x[2p+1]) << 16);
// the kernels then compute out = scale[n] * sum_k q[n, k] * bf16(x[m, k]),
// the products exact and summed in fp32 in one order per (row, channel),
// whatever M or the tile (a.xb = xb; a.x unused; denormal activations read
// as 0, as vdpbf16ps does):
//   wint8_pairs_bf16_avx512: the packed pairs layout (fd_x86.linear's
//     "wint8_pairs"): int8 [N32][K/2][64], per input pair 64 bytes, block b's
//     channel c at 32b + 2c (input 2p) and 32b + 2c + 1; scales [N]; K even.
//   wint8_contract_bf16_avx512: the contract layout int8 [N, K] in place
//     (the MoE experts'); K % 32 == 0.
void wint8_bf16_prepare_avx512(const float* x, int64_t M, int64_t K, uint32_t* xb, int threads);
void wint8_pairs_bf16_avx512(const LinearArgs& a);
void wint8_contract_bf16_avx512(const LinearArgs& a);
// The same kernels converting the codes by byte tables (kernels_int8_bf16_vbmi.cc;
// also needs avx512_vbmi): the two above call them where the CPU has it. The same bits.
void wint8_pairs_bf16_vbmi(const LinearArgs& a);
void wint8_contract_bf16_vbmi(const LinearArgs& a);

// The first index of the largest of x[0, n), a NaN counting as the largest (the first NaN): numpy's
// argmax over float32, the engine's greedy token (x86_ops.cc's greedy_token; kernels_avx512.cc).
int64_t greedy_token_avx512(const float* x, int64_t n);
// A sampled row's weights (x86_sample_op.cc): w[i] = exp(x[i] / temperature - top) in float64, 0 where
// x[i] / temperature - top < cut (or -inf) and where that weight is below min_p. Needs cut >= -700. The
// indices of the nonzero weights go to `nonzero`, ascending; returns how many. `nonzero` needs n + 8 slots.
int64_t sample_weights_avx512(const float* x, int64_t n, double temperature, double top, double min_p, double cut,
                              double* w, int64_t* nonzero);
// The indices i of w[0, n) with lo <= w[i] < hi, ascending, into ids (n + 8 slots); returns how many.
int64_t sample_gather_avx512(const double* w, int64_t n, double lo, double hi, int64_t* ids);

void wint8_avx2(const LinearArgs& a);
void wint4_avx2(const LinearArgs& a);
void w8a8_avx2(const LinearArgs& a);

}  // namespace fdx86

namespace {  // internal linkage: compiled for each includer's ISA, never merged

// The packed int4 word layout (fd_x86/packing.py): 16-channel blocks in groups
// of kWordGroup (the last group may be short), each group's uint32 words
// [K/8][its blocks][16] (word (kb, b, c) = channel 16 b + c's codes of inputs
// 8 kb .. 8 kb + 7). A work item of one group's blocks thus reads one
// sequential stream, not one per block. At one row the hardware prefetcher
// then does better alone, so the kernels prefetch only in tiles of 2+ rows.
// Zen 4, 2 threads, the 0.3B's int4 weights at one row: w4a8's tile read at
// 0.50-0.74x of a plain read with a stream per block and software prefetch,
// at 0.82-0.99x with one stream and none (a microbenchmark); the B=1 decode
// step went 1.24-1.34x faster (README, "One stream per work item"). A tile's blocks
// must lie in one group (items of 4 blocks from a multiple of 4, or of 2
// from a multiple of 2).
constexpr int64_t kWordGroup = 4;

// Where block b's word at kb = 0 is (`first`), and the words between its kb
// and kb + 1 (`stride`); block b + j of the same group is `16 j` words on.
struct WordBlock {
  const uint32_t* first;
  int64_t stride;
};

inline WordBlock word_block(const void* w, int64_t N, int64_t K, int64_t b) {
  const int64_t blocks = (N + 15) / 16, g0 = b - b % kWordGroup;
  const int64_t in_group = blocks - g0 < kWordGroup ? blocks - g0 : kWordGroup;
  return {static_cast<const uint32_t*>(w) + g0 * (K / 8) * 16 + (b - g0) * 16, in_group * 16};
}

}  // namespace

namespace fdx86 {

// ------------------------------------------------------------------------
// Dense linears on 16-bit weights (kernels_dense16.cc; AVX-512 F/BW/VL/DQ,
// the bf16 GEMM also avx512_bf16). The reference's layout, read in place:
//   W bf16 / fp16 [K, N] (row k = input k), x fp32 [M, K] (row stride ldx),
//   out fp32 [M, N] = x @ widen(W) (+ bias fp32 [N]).
// kDense16Stream: W widened in registers, fp32 FMA: the reference's products
//   exactly, fp32 summation order aside. Any M, bf16 and fp16. At one row each
//   thread reads a contiguous run of W's rows into partial sums, added in
//   thread order after.
// kDense16Gemm (bf16 W): vdpbf16ps on x rounded to bf16 (RNE), W packed per
//   thread into [Kc/2][64][2] panels in scratch:
//   |out - ref| <= 2^-9 * sum_k |x_k w_k| + fp32 summation.
// kDense16Amx (bf16 W; kernels_amx_bf16.cc): the same numerics on AMX-BF16
//   tiles (tdpbf16ps), W packed per thread a 64-output panel (all of K) at a
//   time; agrees with kDense16Gemm to fp32 summation order.
// kDense16Auto: for bf16 weights with M >= kDense16GemmMinRows the AMX GEMM
//   where amx_bf16_enabled() (a W of >= kDense16AmxWideElems elements only
//   from kDense16AmxWideRows rows), else the avx512_bf16 GEMM where the CPU has it,
//   else the panel kernel (below: kDense16Panel); otherwise stream or panel by
//   rows and width (dense16_kernel).
// Dense16Args::wtype; kDense16Fp32: an fp32 weight in the same layout, on the stream and panel kernels (no widening)
constexpr int kDense16Bf16 = 0, kDense16Fp16 = 1, kDense16Fp32 = 2;
constexpr int kDense16Auto = 0, kDense16Stream = 1, kDense16Gemm = 2, kDense16Amx = 3;  // Dense16Args::kernel
constexpr int64_t kDense16GemmMinRows = 16;
// kDense16Panel (any wtype): the stream kernel's arithmetic (the same bits at
// 2+ rows) on fp32 panels of W widened per thread, register tiles 6 x 64. The
// auto choice from kDense16PanelMinRows rows where the bf16 GEMM is not taken
// (fp16, bf16 below kDense16GemmMinRows or without avx512_bf16), except
// a 16-bit W wider than kDense16PanelMaxN outputs below kDense16GemmMinRows
// rows (the LM head: the stream kernel). Measured in the 0.3B's decode steps
// (Zen 4, 2 threads, against the stream kernel): session 17 fp32 0.96x at B=2,
// 1.02x at B=8, 1.51x at B=32, bf16 0.93x at B=4, 1.12x at B=8; session 19
// (the same VM on a slow-memory day) fp32 0.78x at B=8, 0.89x at B=12, 1.00x
// at B=16, 1.05x at B=24, bf16 0.79x at B=8, 0.84x at B=12. The panels' packs
// read W in short runs, which such a day serves slowly; from 16 rows.
// An fp32 W stays on the stream kernel at every M (its direct tiles, kernels_dense16.cc;
// session 20: their first version already ran 1.19-1.53x the panels in the 0.3B's fp32
// decode steps at 16-64 rows, the tuned one 1.04-1.13x them at 512-2048 rows alone).
constexpr int kDense16Panel = 4;
constexpr int64_t kDense16PanelMinRows = 16, kDense16PanelMaxN = 8192;
constexpr int64_t kDense16AmxWideRows = 32, kDense16AmxWideElems = int64_t(1) << 26;

struct Dense16Args {
  int64_t M = 0, N = 0, K = 0;
  const float* x = nullptr;  // [M, K], row stride ldx
  int64_t ldx = 0;
  const void* w = nullptr;   // [K, N] bf16 / fp16 / fp32 (wtype), contiguous
  int wtype = kDense16Bf16;
  const float* bias = nullptr;  // [N] or null
  float* out = nullptr;         // [M, N], contiguous
  int threads = 1;              // OpenMP threads (over the inputs at one row, else the outputs)
  int kernel = kDense16Auto;
};

// Callers check the CPU first: AVX-512 F/BW/VL/DQ (kernels_cpu.cc-style
// __builtin_cpu_supports); the GEMM is taken only where avx512_bf16 is present.
void dense16_linear_avx512(const Dense16Args& a);
bool dense16_has_bf16_dot();       // avx512_bf16 on this CPU
int dense16_kernel(const Dense16Args& a);  // the kernel a call would run (kernel resolved)
// AMX-BF16 GEMM; false (nothing written) when its scratch cannot be allocated.
// Only where amx_bf16_available().
bool dense16_gemm_amx(const Dense16Args& a);
// AMX-TILE + AMX-BF16 + AVX-512 BF16 on this CPU and tile data granted by the OS
bool amx_bf16_available();
// amx_bf16_available() and FD_X86_AMX not "0" (read once per process)
bool amx_bf16_enabled();

}  // namespace fdx86
