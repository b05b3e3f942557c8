"""block_wise_fp8 on the x86 backend against wint8, in one run.

    python benchmarks/fp8_linear.py [--rows 1 8 32 128] [--rounds 7] [--threads N]

The decoder matmuls of one ERNIE-4.5-0.3B step (18 layers x qkv 1024->2560,
o 2048->1024, up_gate 1024->6144, down 3072->1024; random weights, timing
only), per method: ``wint8`` (fd_x86's default kernels, packed weight),
``block_wise_fp8`` (fd_x86.fp8: e4m3 decoded in registers; the activation
quantization included) and ``fp8-ref`` (fd-core's reference: dequantize,
then a paddle matmul; rows 1 and 8 only, it is slow). Methods run
interleaved round by round; the median of the rounds is printed, with the
ratio to wint8 in the same run and the CPU model.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = 18
PER_LAYER = [(1024, 2560), (2048, 1024), (1024, 6144), (3072, 1024)]  # (in, out)
METHODS = ("wint8", "block_wise_fp8", "fp8-ref")


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=0, help="0: fd-core's default (FD_CPU_THREADS or cores)")
    args = p.parse_args(argv)
    import paddle
    from fd_x86.linear import quantized_linear

    from fd_core.backends.cpu import num_threads
    from fd_core.quantization import quantize_weight
    from fd_core.quantization.reference import quantized_linear as reference

    threads = args.threads or num_threads()
    rng = np.random.default_rng(0)
    weights = {}
    for d_in, d_out in PER_LAYER:
        w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
        weights[d_in, d_out] = {m: quantize_weight(m, w) for m in ("wint8", "block_wise_fp8")}
    print(f"CPU: {cpu_model()}, threads {threads}; 18 layers x {PER_LAYER}; ms per decoder step (median of "
          f"{args.rounds})")
    print(f"{'rows':>5}" + "".join(f"{m:>16}" for m in METHODS) + f"{'fp8/wint8':>11}")
    for rows in args.rows:
        xs = {d_in: paddle.to_tensor(rng.normal(0, 1, (rows, d_in)).astype(np.float32)) for d_in, _ in PER_LAYER}
        methods = [m for m in METHODS if m != "fp8-ref" or rows <= 8]
        times: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(args.rounds + 1):  # the first round warms up (repacking, page faults)
            for m in methods:
                start = time.perf_counter()
                for _ in range(LAYERS):
                    for (d_in, _d_out), quant in weights.items():
                        q = quant["block_wise_fp8" if m == "fp8-ref" else m]
                        if m == "fp8-ref":
                            reference(xs[d_in], q)
                        else:
                            quantized_linear(xs[d_in], q, threads=threads)
                times[m].append(time.perf_counter() - start)
        med = {m: statistics.median(t[1:]) * 1e3 for m, t in times.items()}
        cells = "".join(f"{med[m]:>16.2f}" if m in med else f"{'-':>16}" for m in METHODS)
        print(f"{rows:>5}{cells}{med['block_wise_fp8'] / med['wint8']:>11.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
