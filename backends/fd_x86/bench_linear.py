"""All matmuls of one ERNIE-4.5-0.3B decode step, fp32 paddle vs fd_x86's kernels.

    python backends/fd_x86/bench_linear.py [--rows 1 8 32] [--rounds 7] [--threads N] [--contract] [--distinct]

Per layer (18 layers, hidden 1024): qkv 1024->2560, o 2048->1024,
up_gate 1024->6144, down 3072->1024; then lm_head 1024->103424 (quantized
too here, as in issue 7's targets; the engine keeps it float unless
``lm_head_quant_type`` opts in). Random weights (timing only). The
methods run interleaved round by round, so machine noise hits them alike;
the median of the rounds is printed with the implied tokens/s (rows / step),
for the whole step and for the 18 layers alone. ``--contract`` adds ``<method>-c``: the same ops with
``FD_X86_REPACK=0`` (the kernels on the contract layout, no repacked copy),
for an A/B in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

LAYERS = 18
PER_LAYER = [(1024, 2560), (2048, 1024), (1024, 6144), (3072, 1024)]  # (in, out)
LM_HEAD = (1024, 103424)
METHODS = ("fp32", "wint8", "wint4", "w8a8")


def make_weights(rng: np.random.Generator, copies: int = 1) -> dict:
    """``{(in, out): [per-method weights] * copies}`` (lm_head: one copy)."""
    import paddle

    from fd_core.ops.linear import QuantizedWeight

    weights = {}
    for d_in, d_out in PER_LAYER + [LM_HEAD]:
        weights[d_in, d_out] = []
        for _ in range(copies if (d_in, d_out) != LM_HEAD else 1):
            q8 = paddle.to_tensor(rng.integers(-127, 128, (d_out, d_in), dtype=np.int8))
            s8 = paddle.to_tensor(rng.random(d_out, dtype=np.float32) * 1e-3)
            q4 = paddle.to_tensor(rng.integers(0, 256, (d_out, d_in // 2), dtype=np.uint8))
            s4 = paddle.to_tensor(rng.random((d_out, d_in // 128), dtype=np.float32) * 1e-2)
            weights[d_in, d_out].append({
                "fp32": paddle.to_tensor(rng.standard_normal((d_in, d_out), dtype=np.float32) * 0.02),
                "wint8": QuantizedWeight("wint8", q8, s8, d_in, d_out),
                "w8a8": QuantizedWeight("w8a8", q8, s8, d_in, d_out),
                "wint4": QuantizedWeight("wint4", q4, s4, d_in, d_out, 128),
            })
    return weights


def decode_step(method: str, rows: int, weights: dict, xs: dict, threads: int) -> tuple[float, float]:
    """(seconds for the 18 layers, seconds for lm_head)."""
    import paddle
    from fd_x86.linear import quantized_linear

    base, contract = method.removesuffix("-c"), method.endswith("-c")
    os.environ["FD_X86_REPACK"] = "0" if contract else "1"
    plan = [(shape, LAYERS) for shape in PER_LAYER] + [(LM_HEAD, 1)]
    marks = [time.perf_counter()]
    for (d_in, d_out), times in plan:
        copies = weights[d_in, d_out]
        for t in range(times):
            w = copies[t % len(copies)][base]
            if base == "fp32":
                paddle.matmul(xs[d_in], w)
            else:
                quantized_linear(xs[d_in], w, threads=threads)
        marks.append(time.perf_counter())
    os.environ.pop("FD_X86_REPACK", None)
    return marks[-2] - marks[0], marks[-1] - marks[-2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="default: fd-core's (FD_CPU_NUM_THREADS / cores)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--contract", action="store_true",
                        help="also time the contract-layout kernels (FD_X86_REPACK=0) as <method>-c")
    parser.add_argument("--distinct", action="store_true",
                        help="18 distinct weights per layer shape (a real model's memory traffic: ~255 MB of "
                             "int8 per step); by default the layers share one, which stays in the L3 cache")
    args = parser.parse_args()
    if args.contract:
        args.methods += [f"{m}-c" for m in args.methods if m != "fp32"]

    import paddle
    from fd_x86.build import load_ops
    from fd_x86.cpu import choose_kernels

    from fd_core.backends import cpu

    cpu.fd_set_device(0)  # MKL's AVX2 path on AMD, paddle's threads
    threads = args.threads or cpu.num_threads()
    load_ops()
    rng = np.random.default_rng(0)
    weights = make_weights(rng, LAYERS if args.distinct else 1)
    print(f"kernels: {'; '.join(choose_kernels().summary)}; threads {threads}; "
          f"{'distinct weights per layer' if args.distinct else 'one weight per layer shape (L3-resident)'}")
    print(f"{'rows':>4} {'method':>8} {'ms/step':>9} {'tokens/s':>9} {'no lm_head ms':>14} {'tokens/s':>9}")
    for rows in args.rows:
        xs = {d: paddle.to_tensor(rng.normal(0, 1, (rows, d)).astype(np.float32)) for d in (1024, 2048, 3072)}
        times: dict[str, list[tuple[float, float]]] = {m: [] for m in args.methods}
        for m in args.methods:  # warm up
            decode_step(m, rows, weights, xs, threads)
        for _ in range(args.rounds):
            for m in args.methods:
                times[m].append(decode_step(m, rows, weights, xs, threads))
        for m in args.methods:
            ms = statistics.median(layers + head for layers, head in times[m]) * 1e3
            layers_ms = statistics.median(layers for layers, _ in times[m]) * 1e3
            print(f"{rows:>4} {m:>8} {ms:>9.1f} {rows * 1e3 / ms:>9.1f} {layers_ms:>14.1f} "
                  f"{rows * 1e3 / layers_ms:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
