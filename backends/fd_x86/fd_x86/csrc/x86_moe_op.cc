// Paddle custom operators for fd_x86's mixture-of-experts decode path.
//
//   fd_x86_moe_experts(x, topk_ids, topk_weights, up_qweight, up_scales, down_qweight, down_scales)
//     x fp32 [T, D]; topk_ids int64 [T, k]; topk_weights fp32 [T, k]; the
//     stacked expert weights in the fd-core contract layout, read in place:
//       wint8 / w8a8: qweight int8 [E, N, K], scales fp32 [E, N]
//       wint4 / w4a8: qweight uint8 [E, N, K/2], scales fp32 [E, N, G]
//       w4a8_static / wint2 (offline checkpoints): offline_op.h's layouts
//     (up_gate: N = 2I, K = D, rows [gate | up]; down: N = D, K = I)
//     -> out fp32 [T, D] = sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t).
//     Tokens are grouped by expert (ascending expert id, then t * k + j, the
//     reference's order), so each selected expert's weights are read once per
//     call; each expert's two linears run the per-ISA contract-layout kernels
//     (kernels.h), threads split over each linear's output channels. Attributes:
//     method (0 wint8, 1 wint4, 2 w8a8, 3 w4a8_static, 4 wint2, 5 w4a8, 6 wint4 on bf16 activations,
//     7 wint8 on bf16 activations),
//     up_group / down_group (wint4's and w4a8's group size, -1 = K), isa (0 auto, 1 AVX2, 2 AVX-512), threads.
//     6 (a model whose activations are bf16) runs wint4_lut_bf16_avx512 on avx512_bf16 CPUs where K
//     and the group are multiples of 128 and the group divides K, and wint4's kernels (fp32
//     activations) elsewhere. 7 likewise runs wint8_contract_bf16_avx512 where K % 32 == 0, and
//     wint8's kernels elsewhere. Under the opt-in int8-activation prefill (int8_act_rows) both
//     take their int8-activation kernels instead (w4a8's, w8a8's).
//     w4a8 (wint4's layout, per-token int8 activations; AVX-512 VNNI, K and
//     the group multiples of 128) runs w4a8_linear (offline_op.h) at any isa.
//
//   fd_x86_moe_experts_shared(..., shared_up_qweight, shared_up_scales, shared_down_qweight, shared_down_scales)
//     the same plus the layer's shared expert: 2-D weights (qweight [N, K'],
//     scales [N] or [N, G]; attributes shared_method, its own as wint4
//     experts keep the rest wint8, shared_up_group / shared_down_group),
//     run on all T tokens at once and added after the routed sum (out = routed + down_s(silu(gate_s x) * up_s x), the
//     reference's order), so a MoE layer is one call instead of ~4 more ops.
//
//   fd_x86_moe_select(router_logits, bias) -> (topk_weights fp32 [T, k], topk_ids int64 [T, k])
//     probs = softmax(logits); experts chosen by probs + bias (has_bias), in
//     descending score (lower id first on ties), weighted by probs; with
//     renormalize divided by max(sum of the k weights, norm_min).
//
// Baseline x86-64 code with paddle headers, like x86_linear_op.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

#include <omp.h>

#include "cpu_features.h"
#include "kernels.h"
#include "moe_kernels.h"
#include "moe_op.h"
#include "offline_op.h"
#include "ops_kernels.h"
#include "paddle/extension.h"

namespace {

constexpr int kWint8 = 0, kWint4 = 1, kW8a8 = 2, kW4a8 = fdx86::kMoeW4a8, kWint4Bf16 = fdx86::kMoeWint4Bf16,
              kWint8Bf16 = fdx86::kMoeWint8Bf16;

// the methods whose weights are the contract layouts (wint4's for w4a8 and wint4 on bf16, wint8's for wint8 on
// bf16), shared experts included
bool contract_method(int m) {
  return m == kWint8 || m == kWint4 || m == kW8a8 || m == kW4a8 || m == kWint4Bf16 || m == kWint8Bf16;
}

}  // namespace

bool fdx86::moe_use_avx512(int isa) {
  if (isa == 2) {
    PD_CHECK(fdx86::cpu_has_avx512_vnni(), "fd_x86_moe_experts: isa=2 (AVX-512 VNNI) requested, but this CPU lacks it");
    return true;
  }
  if (isa == 1) {
    PD_CHECK(fdx86::cpu_has_avx2(), "fd_x86_moe_experts: isa=1 (AVX2+FMA) requested, but this CPU lacks it");
    return false;
  }
  PD_CHECK(isa == 0, "fd_x86_moe_experts: isa must be 0 (auto), 1 (avx2) or 2 (avx512), got ", isa);
  if (fdx86::cpu_has_avx512_vnni()) return true;
  PD_CHECK(fdx86::cpu_has_avx2(), "fd_x86_moe_experts: this CPU has neither AVX-512 VNNI nor AVX2+FMA");
  return false;
}

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One stacked quantized weight: its shape checked, an expert's slice addressed.
struct Stacked {
  const uint8_t* w = nullptr;
  const float* scales = nullptr;
  int64_t E = 0, N = 0, K = 0, groups = 1, group_size = 0, row_bytes = 0;

  // single: a 2-D [N, K'] weight (the shared expert) read as one expert
  Stacked(const char* name, const paddle::Tensor& qweight, const paddle::Tensor& s, int method, int64_t K_,
          int group, bool single = false) {
    const char* op = "fd_x86_moe_experts";
    PD_CHECK(qweight.is_cpu() && s.is_cpu(), op, ": ", name, " must be on the CPU");
    PD_CHECK(qweight.is_contiguous() && s.is_contiguous(), op, ": ", name, " qweight and scales must be contiguous");
    const size_t dims = single ? 2 : 3;
    PD_CHECK(qweight.shape().size() == dims, op, ": ", name, " qweight must be ", single ? "2-D [N, K']" : "3-D [E, N, K']",
             ", got ", qweight.shape().size(), " dims");
    if (fdx86::moe_offline_method(method)) {  // w4a8_static / wint2: their own layouts (x86_offline_op.cc)
      E = single ? 1 : qweight.shape()[0];
      K = K_;
      fdx86::moe_offline_layout(name, method, qweight, dims, K, &N, &row_bytes, &groups);
      PD_CHECK(s.dtype() == paddle::DataType::FLOAT32 && s.numel() == E * N * groups, op, ": ", name,
               " scales must be float32 with E * ", groups, " * N = ", E * N * groups, " values, got ", s.numel());
      w = static_cast<const uint8_t*>(qweight.data());
      scales = s.data<float>();
      return;
    }
    const bool int4 = method == kWint4 || method == kW4a8 || method == kWint4Bf16;  // wint4's layout
    PD_CHECK(qweight.dtype() == (int4 ? paddle::DataType::UINT8 : paddle::DataType::INT8), op, ": ", name,
             " qweight must be ", int4 ? "uint8" : "int8");
    PD_CHECK(s.dtype() == paddle::DataType::FLOAT32, op, ": ", name, " scales must be float32");
    E = single ? 1 : qweight.shape()[0];
    N = qweight.shape()[dims - 2];
    K = K_;
    row_bytes = int4 ? K / 2 : K;
    PD_CHECK(qweight.shape()[dims - 1] == row_bytes, op, ": ", name, " qweight has ", qweight.shape()[dims - 1],
             " bytes per row (N = ", N, "), expected ", row_bytes, " for K = ", K);
    if (int4) {
      PD_CHECK(K % 2 == 0, op, ": ", name, " int4 codes (wint4 / w4a8) need an even K, got ", K);
      group_size = group <= 0 ? K : group;
      PD_CHECK(group_size % 2 == 0, op, ": ", name, " group_size must be even, got ", group);
      groups = (K + group_size - 1) / group_size;
    }
    if (method == kW4a8) {  // the kernel's int8 planes: whole 64-byte blocks per group
      PD_CHECK(K % 128 == 0 && group_size % 128 == 0 && K % group_size == 0, op, ": ", name, " w4a8 needs K (", K,
               ") and the group size (", group_size, ") multiples of 128, the group dividing K");
    }
    PD_CHECK(s.numel() == E * N * groups, op, ": ", name, " scales must have E * N * groups = ", E * N * groups,
             " values, got ", s.numel());
    w = static_cast<const uint8_t*>(qweight.data());
    scales = s.data<float>();
  }
};

// Per-call buffers, reused across the experts of the call.
struct Scratch {
  std::vector<float> xe, xo;
  std::vector<uint32_t> xb;  // wint4 / wint8 on bf16: the activation pairs
  std::vector<int8_t> xq;
  std::vector<float> xscale;
  std::vector<int32_t> xsum;
  bool int8_act = false;  // wint8 / wint4 linears take int8 activations (the opt-in prefill path)
  fdx86::W4a8Scratch w4a8;
};

// out [M, N] = x [M, K] @ expert e's weight of `s`, with `method`'s kernel.
void expert_linear(const Stacked& s, int64_t e, const float* x, int64_t M, float* out, int method, bool avx512,
                   int threads, Scratch* scratch) {
  fdx86::LinearArgs a;
  a.M = M;
  a.N = s.N;
  a.K = s.K;
  a.x = x;
  a.w = s.w + e * s.N * s.row_bytes;
  a.scales = s.scales + e * s.N * s.groups;
  a.out = out;
  a.threads = threads;
  if ((method == kWint4 || method == kWint4Bf16) && avx512 && scratch->int8_act && s.K % 128 == 0 &&
      s.group_size % 128 == 0 && s.K % s.group_size == 0 && fdx86::cpu_has_avx512_vnni()) {
    method = kW4a8;  // opt-in: int8 activations on the same weight (w4a8 stores wint4's layout)
  }
  if (method == kWint4Bf16) {
    if (avx512 && s.K % fdx86::kWint4LutBlock == 0 && s.group_size % fdx86::kWint4LutBlock == 0 &&
        s.K % s.group_size == 0 && fdx86::dense16_has_bf16_dot()) {
      a.groups = s.groups;
      a.group_size = s.group_size;
      scratch->xb.resize(M * s.K / 2);
      fdx86::wint4_lut_bf16_prepare_avx512(x, M, s.K, scratch->xb.data());
      a.xb = scratch->xb.data();
      fdx86::wint4_lut_bf16_avx512(a);
      return;
    }
    method = kWint4;  // no bf16 kernel for this weight or CPU: wint4's, on the fp32 activations
  }
  if (method == kW4a8) {  // x86_offline_op.cc: per-token int8 activations, VNNI
    fdx86::w4a8_linear(static_cast<const uint8_t*>(a.w), a.scales, x, M, s.N, s.K, s.group_size, out, threads,
                       &scratch->w4a8);
    return;
  }
  if (fdx86::moe_offline_method(method)) {  // w4a8_static / wint2 (x86_offline_op.cc)
    fdx86::offline_linear(method, static_cast<const uint8_t*>(a.w), a.scales, x, M, s.N, s.K, out, threads,
                          &scratch->xq, &scratch->xsum, &scratch->xe);
    return;
  }
  if ((method == kWint8 || method == kWint8Bf16) && avx512 && scratch->int8_act) {
    method = kW8a8;  // opt-in: int8 activations on the same weight (wint8 and w8a8 share the format)
  }
  if (method == kWint8Bf16) {
    if (avx512 && s.K % 32 == 0 && fdx86::dense16_has_bf16_dot()) {
      scratch->xb.resize(M * s.K / 2);
      fdx86::wint8_bf16_prepare_avx512(x, M, s.K, scratch->xb.data(), threads);
      a.xb = scratch->xb.data();
      fdx86::wint8_contract_bf16_avx512(a);
      return;
    }
    method = kWint8;  // no bf16 kernel for this weight or CPU: wint8's, on the fp32 activations
  }
  if (method == kWint8) {
    if (avx512) fdx86::wint8_avx512(a); else fdx86::wint8_avx2(a);
  } else if (method == kWint4) {
    a.groups = s.groups;
    a.group_size = s.group_size;
    if (avx512 && s.K % fdx86::kWint4LutBlock == 0 && s.group_size % fdx86::kWint4LutBlock == 0) {
      scratch->xe.resize(M * s.K);
      fdx86::wint4_lut_permute(x, M, s.K, scratch->xe.data());
      a.xe = scratch->xe.data();
      a.ldh = s.K;
      fdx86::wint4_lut_avx512(a);
      return;
    }
    // x split into even / odd inputs, zero padded so vector loads may run past K/2
    const int64_t kh = s.K / 2;
    a.ldh = round_up(kh, 16) + 16;
    scratch->xe.assign(M * a.ldh, 0.0f);
    scratch->xo.assign(M * a.ldh, 0.0f);
    for (int64_t m = 0; m < M; ++m) {
      const float* r = x + m * s.K;
      float* e_row = scratch->xe.data() + m * a.ldh;
      float* o_row = scratch->xo.data() + m * a.ldh;
      for (int64_t j = 0; j < kh; ++j) {
        e_row[j] = r[2 * j];
        o_row[j] = r[2 * j + 1];
      }
    }
    a.xe = scratch->xe.data();
    a.xo = scratch->xo.data();
    if (avx512) fdx86::wint4_avx512(a); else fdx86::wint4_avx2(a);
  } else {
    a.ldq = round_up(s.K, 64);
    scratch->xq.assign(M * a.ldq, 0);
    scratch->xscale.resize(M);
    scratch->xsum.resize(M);
    if (avx512) {
      fdx86::quantize_rows_avx512(x, M, s.K, scratch->xq.data(), a.ldq, scratch->xscale.data(),
                                  scratch->xsum.data(), threads);
    } else {
      fdx86::quantize_rows_avx2(x, M, s.K, scratch->xq.data(), a.ldq, scratch->xscale.data(), scratch->xsum.data(),
                                threads);
    }
    a.xq = scratch->xq.data();
    a.xscale = scratch->xscale.data();
    a.xsum = scratch->xsum.data();
    if (avx512) fdx86::w8a8_avx512_vnni(a); else fdx86::w8a8_avx2(a);
  }
}

// Rows [n0, n1) of expert e's weight in `s`, as a one-expert weight of n1 - n0 outputs.
Stacked channel_rows(const Stacked& s, int64_t e, int64_t n0, int64_t n1) {
  Stacked r = s;
  r.E = 1;
  r.N = n1 - n0;
  r.w = s.w + (e * s.N + n0) * s.row_bytes;
  r.scales = s.scales + (e * s.N + n0) * s.groups;
  return r;
}

// A decode step's few tokens (T <= kFewTokens) take moe_few_tokens where
// every linear is wint8 / wint4 / w8a8 / w4a8 (w4a8: each channel alone,
// whatever the slice) and the widths are multiples of 4
// (each slice then holds whole 4-channel register tiles, so a channel is
// summed as in the per-expert loop).
constexpr int64_t kFewTokens = 16;

bool few_tokens_fit(int method, int64_t I, int64_t D, const Stacked* sh_up, int sh_method) {
  const auto plain = contract_method;
  // FD_X86_MOE_FEW_TOKENS=0: the per-expert loop at every T (A/B comparisons; read per call)
  const char* off = std::getenv("FD_X86_MOE_FEW_TOKENS");
  if (off != nullptr && off[0] == '0' && off[1] == '\0') return false;
  return plain(method) && I % 4 == 0 && D % 4 == 0 &&
         (sh_up == nullptr || (plain(sh_method) && (sh_up->N / 2) % 4 == 0));
}

// out [T, D] (zeroed) for a few tokens: the routed experts (slots grouped
// by expert: `order`, expert e's at start[e] .. start[e + 1]) and the shared
// expert in ONE parallel region, each thread on its own slice of every
// linear's output channels: the gate and up rows of a slice of I and their
// silu, a barrier, then the down rows and the weighted combine on a slice
// of D. The per-expert loop of moe_forward opens a region per linear (about
// ten per MoE layer at T = 1), and the down projections (K = I: below the
// kernels' parallel threshold at a few rows) ran on one thread. Slices are
// multiples of 32 channels (the kernels' work items); every channel's value
// and the combine's order are the per-expert loop's: the same bits.
void moe_few_tokens(const float* x, int64_t T, const int64_t* order, const int64_t* start,
                    const float* tw, int64_t k, const Stacked& up, const Stacked& down, int method,
                    const Stacked* sh_up, const Stacked* sh_down, int sh_method, bool avx512, int threads,
                    float* out) {
  const int64_t D = down.N, I = up.N / 2, Is = sh_up != nullptr ? sh_up->N / 2 : 0, E = up.E;
  // act: silu(gate) * up per grouped slot [T k, I], then the shared expert's [T, Is];
  // y: the down outputs per grouped slot [T k, D], then the shared expert's [T, D]
  std::vector<float> act(T * k * I + T * Is), y((T * k + T) * D);
  float* sh_act = act.data() + T * k * I;
  float* sh_y = y.data() + T * k * D;
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const auto slice = [&](int64_t n, int64_t* lo, int64_t* hi) {
      const int64_t units = (n + 31) / 32;
      *lo = std::min(n, units * t / nt * 32);
      *hi = std::min(n, units * (t + 1) / nt * 32);
    };
    Scratch scratch;
    std::vector<float> rows, gate, upv, pair, part;
    // gate and up rows [i0, i1) of expert e of `s` (width I') for x's m rows -> acts [m, I'] at i0
    const auto gated = [&](const Stacked& s, int64_t e, int64_t width, const float* xs, int64_t m, int meth,
                           float* acts) {
      int64_t i0, i1;
      slice(width, &i0, &i1);
      if (i1 <= i0) return;
      const int64_t L = i1 - i0;
      gate.resize(m * L);
      upv.resize(m * L);
      pair.resize(2 * L);
      expert_linear(channel_rows(s, e, i0, i1), 0, xs, m, gate.data(), meth, avx512, 1, &scratch);
      expert_linear(channel_rows(s, e, width + i0, width + i1), 0, xs, m, upv.data(), meth, avx512, 1, &scratch);
      for (int64_t r = 0; r < m; ++r) {
        std::copy_n(gate.data() + r * L, L, pair.data());
        std::copy_n(upv.data() + r * L, L, pair.data() + L);
        fdx86::silu_and_mul_avx2(pair.data(), acts + r * width + i0, 1, L, 1);
      }
    };
    // down rows [d0, d1) of expert e of `s` for the m rows of acts -> ys [m, D] at d0
    const auto downed = [&](const Stacked& s, int64_t e, const float* acts, int64_t m, int meth, int64_t d0,
                            int64_t d1, float* ys) {
      const int64_t L = d1 - d0;
      part.resize(m * L);
      expert_linear(channel_rows(s, e, d0, d1), 0, acts, m, part.data(), meth, avx512, 1, &scratch);
      for (int64_t r = 0; r < m; ++r) std::copy_n(part.data() + r * L, L, ys + r * D + d0);
    };
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = start[e + 1] - start[e];
      if (m == 0) continue;
      rows.resize(m * D);
      for (int64_t r = 0; r < m; ++r) std::copy_n(x + (order[start[e] + r] / k) * D, D, rows.data() + r * D);
      gated(up, e, I, rows.data(), m, method, act.data() + start[e] * I);
    }
    if (sh_up != nullptr) gated(*sh_up, 0, Is, x, T, sh_method, sh_act);
#pragma omp barrier
    int64_t d0, d1;
    slice(D, &d0, &d1);
    if (d1 > d0) {
      for (int64_t e = 0; e < E; ++e) {
        const int64_t m = start[e + 1] - start[e];
        if (m > 0) downed(down, e, act.data() + start[e] * I, m, method, d0, d1, y.data() + start[e] * D);
      }
      if (sh_down != nullptr) downed(*sh_down, 0, sh_act, T, sh_method, d0, d1, sh_y);
      // the combine of the per-expert loop: grouped slots in order, then the shared expert
      for (int64_t s = 0; s < T * k; ++s) {
        const int64_t slot = order[s];
        const float w = tw[slot];
        float* dst = out + (slot / k) * D;
        const float* src = y.data() + s * D;
        for (int64_t d = d0; d < d1; ++d) dst[d] += src[d] * w;
      }
      if (sh_up != nullptr)
        for (int64_t r = 0; r < T; ++r)
          for (int64_t d = d0; d < d1; ++d) out[r * D + d] += sh_y[r * D + d];
    }
  }
}

}  // namespace

namespace {

// The experts' (and the shared expert's) checks for inputs of width D, and their views.
struct Experts {
  std::unique_ptr<Stacked> up, down, sh_up, sh_down;
};

Experts checked_experts(int64_t D, const paddle::Tensor& up_qweight, const paddle::Tensor& up_scales,
                        const paddle::Tensor& down_qweight, const paddle::Tensor& down_scales, int method,
                        int up_group, int down_group, const fdx86::MoeSharedArgs* shared) {
  const char* op = "fd_x86_moe_experts";
  PD_CHECK(contract_method(method) || fdx86::moe_offline_method(method), op,
           ": method must be 0 (wint8), 1 (wint4), 2 (w8a8), 3 (w4a8_static), 4 (wint2), 5 (w4a8), 6 (wint4, bf16 "
           "activations) or 7 (wint8, bf16 activations), got ", method);
  // checked here, not only in the kernels' callers: the few-token path runs them inside an OpenMP
  // region, which an exception cannot leave (the process would abort instead of raising)
  PD_CHECK(!(method == kW4a8 || (shared != nullptr && shared->method == kW4a8) || fdx86::moe_offline_method(method)) ||
               fdx86::cpu_has_avx512_vnni(),
           op, ": the w4a8 / w4a8_static / wint2 expert kernels need AVX-512 VNNI, which this CPU lacks");
  Experts ex;
  ex.up = std::make_unique<Stacked>("up_gate", up_qweight, up_scales, method, D, up_group);
  const Stacked& up = *ex.up;
  PD_CHECK(up.N % 2 == 0, op, ": up_gate has an odd number of outputs (", up.N, "), expected 2 * I");
  ex.down = std::make_unique<Stacked>("down", down_qweight, down_scales, method, up.N / 2, down_group);
  const Stacked& down = *ex.down;
  PD_CHECK(down.E == up.E && down.N == D, op, ": down qweight is [", down.E, ", ", down.N, ", ...], expected [", up.E,
           ", ", D, ", ...]");
  // the shared expert: one more "expert" of every token, weight 1, added after the routed sum
  if (shared != nullptr) {
    ex.sh_up = std::make_unique<Stacked>("shared up_gate", *shared->up_qweight, *shared->up_scales, shared->method, D,
                                         shared->up_group, true);
    PD_CHECK(ex.sh_up->N % 2 == 0, op, ": shared up_gate has an odd number of outputs (", ex.sh_up->N,
             "), expected 2 * I");
    ex.sh_down = std::make_unique<Stacked>("shared down", *shared->down_qweight, *shared->down_scales, shared->method,
                                           ex.sh_up->N / 2, shared->down_group, true);
    PD_CHECK(ex.sh_down->N == D, op, ": shared down has ", ex.sh_down->N, " outputs, expected D = ", D);
  }
  return ex;
}

}  // namespace

void fdx86::moe_experts_check(int64_t D, const paddle::Tensor& up_qweight, const paddle::Tensor& up_scales,
                              const paddle::Tensor& down_qweight, const paddle::Tensor& down_scales, int method,
                              int up_group, int down_group, const MoeSharedArgs* shared) {
  checked_experts(D, up_qweight, up_scales, down_qweight, down_scales, method, up_group, down_group, shared);
}

paddle::Tensor fdx86::moe_forward(const paddle::Tensor& x, const int64_t* ids, const float* tw, int64_t k,
                                  const paddle::Tensor& up_qweight, const paddle::Tensor& up_scales,
                                  const paddle::Tensor& down_qweight, const paddle::Tensor& down_scales, int method,
                                  int up_group, int down_group, int isa, int threads, const MoeSharedArgs* shared,
                                  int64_t int8_act_rows) {
  const char* op = "fd_x86_moe_experts";
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 && x.shape().size() == 2 && x.is_contiguous(), op,
           ": x must be contiguous float32 [T, D] on the CPU");
  const int64_t T = x.shape()[0], D = x.shape()[1];
  const bool avx512 = moe_use_avx512(isa);
  const Experts ex = checked_experts(D, up_qweight, up_scales, down_qweight, down_scales, method, up_group,
                                     down_group, shared);
  const Stacked &up = *ex.up, &down = *ex.down;
  const Stacked* sh_up = ex.sh_up.get();
  const Stacked* sh_down = ex.sh_down.get();
  const int64_t I = up.N / 2, E = up.E;
  threads = threads < 1 ? 1 : threads;

  paddle::Tensor out = paddle::empty({T, D}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* od = out.data<float>();
  std::fill_n(od, T * D, 0.0f);
  if (T == 0) return out;
  std::vector<float> rows, h, act;
  Scratch scratch;
  scratch.int8_act = int8_act_rows > 0 && T >= int8_act_rows;
  const float* xd = x.data<float>();
  if (k == 0 && shared == nullptr) return out;
  // slots grouped by expert, stable: ascending expert, then slot t * k + j
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    PD_CHECK(ids[i] >= 0 && ids[i] < E, op, ": topk_ids holds expert ", ids[i], ", outside [0, ", E, ")");
    ++start[ids[i] + 1];
  }
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<int64_t> order(T * k);
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < T * k; ++i) order[fill[ids[i]]++] = i;
  }
  if (T <= kFewTokens && !scratch.int8_act && few_tokens_fit(method, I, D, sh_up, shared ? shared->method : 0)) {
    moe_few_tokens(xd, T, order.data(), start.data(), tw, k, up, down, method, sh_up, sh_down,
                   shared ? shared->method : 0, avx512, threads, od);
    return out;
  }
  // Expert after expert, each linear's output channels split over the
  // threads. (Threads over the experts instead, each expert's kernels on one
  // thread, measured 1.2-1.7x slower on the 2-core Zen 4 VM at T = 1 and 8:
  // the kernels' own parallel regions, nested and serialised, cost more.)
  std::vector<float> y(T * k * D);  // expert outputs per grouped slot
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue;
    const int64_t* slots = order.data() + start[e];
    rows.resize(m * D);
    h.resize(m * 2 * I);
    act.resize(m * I);
    for (int64_t r = 0; r < m; ++r) std::copy_n(xd + (slots[r] / k) * D, D, rows.data() + r * D);
    expert_linear(up, e, rows.data(), m, h.data(), method, avx512, threads, &scratch);
    fdx86::silu_and_mul_avx2(h.data(), act.data(), m, I, threads);  // silu(gate) * up, gate = h[:, :I]
    expert_linear(down, e, act.data(), m, y.data() + start[e] * D, method, avx512, threads, &scratch);
  }
  // the weighted combine in the reference's order (grouped slots, ascending expert)
  for (int64_t s = 0; s < T * k; ++s) {
    const int64_t slot = order[s];
    const float w = tw[slot];
    float* dst = od + (slot / k) * D;
    const float* src = y.data() + s * D;
    for (int64_t d = 0; d < D; ++d) dst[d] += src[d] * w;
  }
  if (shared != nullptr) {
    const int64_t Is = sh_up->N / 2;
    h.resize(T * 2 * Is);
    act.resize(T * Is);
    y.resize(T * D);
    expert_linear(*sh_up, 0, xd, T, h.data(), shared->method, avx512, threads, &scratch);
    fdx86::silu_and_mul_avx2(h.data(), act.data(), T, Is, threads);
    expert_linear(*sh_down, 0, act.data(), T, y.data(), shared->method, avx512, threads, &scratch);
    for (int64_t i = 0; i < T * D; ++i) od[i] += y[i];
  }
  return out;
}

namespace {

// topk_ids / topk_weights as the ops take them: contiguous [T, k] for x [T, D]
void check_routing(const paddle::Tensor& x, const paddle::Tensor& topk_ids, const paddle::Tensor& topk_weights) {
  const char* op = "fd_x86_moe_experts";
  PD_CHECK(topk_ids.is_cpu() && topk_weights.is_cpu(), op, ": the routing must be on the CPU");
  PD_CHECK(topk_ids.dtype() == paddle::DataType::INT64 && topk_ids.shape().size() == 2 && topk_ids.is_contiguous(),
           op, ": topk_ids must be contiguous int64 [T, k]");
  PD_CHECK(topk_weights.dtype() == paddle::DataType::FLOAT32 && topk_weights.shape() == topk_ids.shape() &&
               topk_weights.is_contiguous(),
           op, ": topk_weights must be contiguous float32 of topk_ids' shape [T, k]");
  PD_CHECK(x.shape().size() == 2 && topk_ids.shape()[0] == x.shape()[0], op, ": topk_ids has ", topk_ids.shape()[0],
           " rows, x ", x.shape().size() == 2 ? x.shape()[0] : -1);
}

}  // namespace

std::vector<paddle::Tensor> MoeExperts(const paddle::Tensor& x, const paddle::Tensor& topk_ids,
                                       const paddle::Tensor& topk_weights, const paddle::Tensor& up_qweight,
                                       const paddle::Tensor& up_scales, const paddle::Tensor& down_qweight,
                                       const paddle::Tensor& down_scales, int method, int up_group, int down_group,
                                       int isa, int threads) {
  check_routing(x, topk_ids, topk_weights);
  return {fdx86::moe_forward(x, topk_ids.data<int64_t>(), topk_weights.data<float>(), topk_ids.shape()[1], up_qweight,
                             up_scales, down_qweight, down_scales, method, up_group, down_group, isa, threads,
                             nullptr)};
}

std::vector<paddle::Tensor> MoeExpertsShared(
    const paddle::Tensor& x, const paddle::Tensor& topk_ids, const paddle::Tensor& topk_weights,
    const paddle::Tensor& up_qweight, const paddle::Tensor& up_scales, const paddle::Tensor& down_qweight,
    const paddle::Tensor& down_scales, const paddle::Tensor& shared_up_qweight, const paddle::Tensor& shared_up_scales,
    const paddle::Tensor& shared_down_qweight, const paddle::Tensor& shared_down_scales, int method, int up_group,
    int down_group, int shared_method, int shared_up_group, int shared_down_group, int isa, int threads) {
  PD_CHECK(contract_method(shared_method),
           "fd_x86_moe_experts_shared: shared_method must be 0 (wint8), 1 (wint4), 2 (w8a8), 5 (w4a8), 6 (wint4, bf16 "
           "activations) or 7 (wint8, bf16 activations), got ",
           shared_method);
  fdx86::MoeSharedArgs shared;
  shared.method = shared_method;
  shared.up_qweight = &shared_up_qweight;
  shared.up_scales = &shared_up_scales;
  shared.down_qweight = &shared_down_qweight;
  shared.down_scales = &shared_down_scales;
  shared.up_group = shared_up_group;
  shared.down_group = shared_down_group;
  check_routing(x, topk_ids, topk_weights);
  return {fdx86::moe_forward(x, topk_ids.data<int64_t>(), topk_weights.data<float>(), topk_ids.shape()[1], up_qweight,
                             up_scales, down_qweight, down_scales, method, up_group, down_group, isa, threads,
                             &shared)};
}

void fdx86::moe_route_row(const float* row, int64_t E, const float* b, int top_k, bool renormalize, float norm_min,
                          float* w, int64_t* id, float* probs, float* score, int64_t* idx) {
  const float mx = *std::max_element(row, row + E);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(row[e] - mx);
  for (int64_t e = 0; e < E; ++e) {
    probs[e] /= sum;
    score[e] = b ? probs[e] + b[e] : probs[e];
  }
  std::iota(idx, idx + E, 0);
  std::partial_sort(idx, idx + top_k, idx + E, [&](int64_t p, int64_t q) {
    return score[p] > score[q] || (score[p] == score[q] && p < q);
  });
  float total = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    id[j] = idx[j];
    total += w[j] = probs[idx[j]];
  }
  if (renormalize) {
    const float denom = std::max(total, norm_min);
    for (int j = 0; j < top_k; ++j) w[j] /= denom;
  }
}

std::vector<paddle::Tensor> MoeSelect(const paddle::Tensor& logits, const paddle::Tensor& bias, int top_k,
                                      bool has_bias, bool renormalize, float norm_min) {
  const char* op = "fd_x86_moe_select";
  PD_CHECK(logits.is_cpu() && logits.dtype() == paddle::DataType::FLOAT32 && logits.shape().size() == 2 &&
               logits.is_contiguous(),
           op, ": router_logits must be contiguous float32 [T, E] on the CPU");
  const int64_t T = logits.shape()[0], E = logits.shape()[1];
  PD_CHECK(top_k >= 1 && top_k <= E, op, ": top_k must be in [1, E = ", E, "], got ", top_k);
  const float* b = nullptr;
  if (has_bias) {
    PD_CHECK(bias.is_cpu() && bias.dtype() == paddle::DataType::FLOAT32 && bias.numel() == E && bias.is_contiguous(),
             op, ": correction_bias must be contiguous float32 with E = ", E, " values");
    b = bias.data<float>();
  }
  paddle::Tensor weights = paddle::empty({T, top_k}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  paddle::Tensor ids = paddle::empty({T, top_k}, paddle::DataType::INT64, paddle::CPUPlace());
  const float* l = logits.data<float>();
  float* w = weights.data<float>();
  int64_t* id = ids.data<int64_t>();
  std::vector<float> probs(E), score(E);
  std::vector<int64_t> idx(E);
  for (int64_t t = 0; t < T; ++t)
    fdx86::moe_route_row(l + t * E, E, b, top_k, renormalize, norm_min, w + t * top_k, id + t * top_k, probs.data(),
                         score.data(), idx.data());
  return {weights, ids};
}

std::vector<std::vector<int64_t>> MoeExpertsInferShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>& ids, const std::vector<int64_t>& tw,
    const std::vector<int64_t>& uq, const std::vector<int64_t>& us, const std::vector<int64_t>& dq,
    const std::vector<int64_t>& ds, int method, int up_group, int down_group, int isa, int threads) {
  return {x};
}

std::vector<paddle::DataType> MoeExpertsInferDtype(const paddle::DataType& x, const paddle::DataType& ids,
                                                   const paddle::DataType& tw, const paddle::DataType& uq,
                                                   const paddle::DataType& us, const paddle::DataType& dq,
                                                   const paddle::DataType& ds) {
  return {paddle::DataType::FLOAT32};
}

std::vector<std::vector<int64_t>> MoeExpertsSharedInferShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>& ids, const std::vector<int64_t>& tw,
    const std::vector<int64_t>& uq, const std::vector<int64_t>& us, const std::vector<int64_t>& dq,
    const std::vector<int64_t>& ds, const std::vector<int64_t>& suq, const std::vector<int64_t>& sus,
    const std::vector<int64_t>& sdq, const std::vector<int64_t>& sds, int method, int up_group, int down_group,
    int shared_method, int shared_up_group, int shared_down_group, int isa, int threads) {
  return {x};
}

std::vector<paddle::DataType> MoeExpertsSharedInferDtype(
    const paddle::DataType& x, const paddle::DataType& ids, const paddle::DataType& tw, const paddle::DataType& uq,
    const paddle::DataType& us, const paddle::DataType& dq, const paddle::DataType& ds, const paddle::DataType& suq,
    const paddle::DataType& sus, const paddle::DataType& sdq, const paddle::DataType& sds) {
  return {paddle::DataType::FLOAT32};
}

std::vector<std::vector<int64_t>> MoeSelectInferShape(const std::vector<int64_t>& logits,
                                                      const std::vector<int64_t>& bias, int top_k, bool has_bias,
                                                      bool renormalize, float norm_min) {
  return {{logits[0], top_k}, {logits[0], top_k}};
}

std::vector<paddle::DataType> MoeSelectInferDtype(const paddle::DataType& logits, const paddle::DataType& bias) {
  return {paddle::DataType::FLOAT32, paddle::DataType::INT64};
}

PD_BUILD_OP(fd_x86_moe_experts)
    .Inputs({"X", "TopkIds", "TopkWeights", "UpQWeight", "UpScales", "DownQWeight", "DownScales"})
    .Outputs({"Out"})
    .Attrs({"method: int", "up_group: int", "down_group: int", "isa: int", "threads: int"})
    .SetKernelFn(PD_KERNEL(MoeExperts))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsInferDtype));

PD_BUILD_OP(fd_x86_moe_experts_shared)
    .Inputs({"X", "TopkIds", "TopkWeights", "UpQWeight", "UpScales", "DownQWeight", "DownScales", "SharedUpQWeight",
             "SharedUpScales", "SharedDownQWeight", "SharedDownScales"})
    .Outputs({"Out"})
    .Attrs({"method: int", "up_group: int", "down_group: int", "shared_method: int", "shared_up_group: int",
            "shared_down_group: int", "isa: int", "threads: int"})
    .SetKernelFn(PD_KERNEL(MoeExpertsShared))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsSharedInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsSharedInferDtype));

PD_BUILD_OP(fd_x86_moe_select)
    .Inputs({"RouterLogits", "Bias"})
    .Outputs({"TopkWeights", "TopkIds"})
    .Attrs({"top_k: int", "has_bias: bool", "renormalize: bool", "norm_min: float"})
    .SetKernelFn(PD_KERNEL(MoeSelect))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeSelectInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeSelectInferDtype));
