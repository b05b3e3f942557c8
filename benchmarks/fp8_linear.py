"""block_wise_fp8 on the x86 backend against wint8 and w8a8, in one run.

    python benchmarks/fp8_linear.py [--rows 1 8 32 512] [--rounds 5] [--threads N] [--reference-rows 1]
                                    [--decode-batch 1 8] [--decode-rounds 5]

The decoder matmuls of one ERNIE-4.5-0.3B step (18 layers x qkv 1024->2560,
o 2048->1024, up_gate 1024->6144, down 3072->1024; random weights, timing
only; each layer its own copy, so a step streams the weights from DRAM as a
real one does; ``--shared-layers``: one copy, cache-resident) at each row
count (1, 8, 32: decode batches; 512: a prefill chunk),
per variant: ``wint8`` and ``w8a8`` (fd_x86's default kernels, packed
weights), ``w4a8`` (fd_x86.linear.w4a8_linear: packed int4 words x per-token
int8 activations on VNNI; its ratio to wint8 is the last column), ``fp8-fma`` (fd_x86.fp8's fp32-FMA kernel, the one CPUs without
AVX-512 BF16 + VBMI get), ``fp8-bf16`` (its vdpbf16ps kernel, where the CPU
has it), both with the activation quantization included, and ``fp8-ref``
(fd-core's reference: dequantize, then a paddle matmul; only at
``--reference-rows``: it is slow). Variants run interleaved round by
round; the median of the rounds is printed with ratios in the same run,
the CPU model and the load average.

``--decode-batch`` then times whole decode steps of the 0.3B through the
engine (``LLM`` on the x86 backend, the generated checkpoint under
``checkpoints/``, as ``quant_decode.py``): wint8 against block_wise_fp8 in
the fused decoder layers and, op by op, with each fp8 kernel (one fp8
engine, switched between turns), taking turns round by round; tok/s = B /
median step time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = 18
PER_LAYER = [(1024, 2560), (2048, 1024), (1024, 6144), (3072, 1024)]  # (in, out)
VARIANTS = ("wint8", "w8a8", "w4a8", "fp8-fma", "fp8-bf16", "fp8-ref")


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def runners(threads: int) -> dict[str, Callable[[Any, Any], Any]]:
    """variant -> fn(x, quant of the variant's method)."""
    from fd_x86.fp8 import block_fp8_linear, selected_kernel
    from fd_x86.linear import quantized_linear, w4a8_linear

    from fd_core.quantization.reference import quantized_linear as reference

    out: dict[str, Callable[[Any, Any], Any]] = {
        "wint8": lambda x, q: quantized_linear(x, q, threads=threads),
        "w8a8": lambda x, q: quantized_linear(x, q, threads=threads),
        "w4a8": lambda x, q: w4a8_linear(x, q, threads),  # int4 words x int8 activations (VNNI)
        "fp8-fma": lambda x, q: block_fp8_linear(x, q, threads, kernel="fma"),
        "fp8-ref": lambda x, q: reference(x, q),
    }
    if selected_kernel() == "bf16":
        out["fp8-bf16"] = lambda x, q: block_fp8_linear(x, q, threads, kernel="bf16")
    return out


def decode_steps(batches: list[int], rounds: int, steps: int, prompt_len: int = 128) -> None:
    """tok/s of wint8 and block_wise_fp8 decode steps, taking turns: fp8 with
    the fused decoder layers (fd_x86.layer; the kernel ``auto`` picks) and,
    op by op (FD_X86_FUSED_LAYER=0), with each kernel forced."""
    import functools

    import fd_x86.fp8 as fp8
    import fd_x86.layer as layer

    from fd_core import LLM, SamplingParams
    from fd_core.testing.checkpoints import generate_checkpoint

    checkpoint = Path("checkpoints") / "ernie-4.5-0.3b-paddle"
    if not (checkpoint / "config.json").is_file():
        generate_checkpoint(checkpoint, "0.3b", naming="paddle")
    native, top = fp8.block_fp8_linear, max(batches)
    llms = {m: LLM(str(checkpoint), backend="x86", quantization=m, max_model_len=1024, max_num_seqs=top,
                   num_gpu_blocks_override=40 * top // 8 + 16) for m in ("wint8", "block_wise_fp8")}
    kernels = ["fma", "bf16"] if fp8.selected_kernel() == "bf16" else ["fma"]
    # (name, method, forced fp8 kernel, fused decoder layers)
    variants: list[tuple[str, str, str | None, bool]] = [("wint8", "wint8", None, True),
                                                         ("fp8", "block_wise_fp8", None, True)]
    variants += [(f"fp8-{k}-unfused", "block_wise_fp8", k, False) for k in kernels]
    times: dict[tuple[str, int], list[float]] = {}

    def admit(method: str, batch: int, count: int) -> None:
        engine = llms[method].engine
        params = SamplingParams(max_tokens=count, temperature=0, ignore_eos=True)
        rng = np.random.default_rng(batch)
        for i in range(batch):
            engine.add_request(f"b{batch}-{i}", [int(t) for t in rng.integers(100, 2000, prompt_len)], params)
        while engine.core.scheduler.num_waiting or any(r.num_output_tokens == 0 for r in engine.core.scheduler.running):
            engine.step()

    def configure(kernel: str | None, fused: bool) -> None:
        fp8.block_fp8_linear = native if kernel is None else functools.partial(native, kernel=kernel)
        os.environ["FD_X86_FUSED_LAYER"] = "1" if fused else "0"
        layer._enabled.cache_clear()

    try:
        for batch in [2] + batches:  # the first pass warms up (repacking, page faults)
            for method in llms:
                admit(method, batch, (rounds * steps + 2) * len(variants) + 4)
            for _ in range(rounds if batch in batches else 1):
                for name, method, kernel, fused in variants:
                    configure(kernel, fused)
                    for _ in range(steps):
                        start = time.perf_counter()
                        llms[method].engine.step()
                        times.setdefault((name, batch), []).append(time.perf_counter() - start)
            configure(None, True)
            for llm in llms.values():
                while llm.engine.has_unfinished_requests():
                    llm.engine.step()
    finally:
        configure(None, True)
        os.environ.pop("FD_X86_FUSED_LAYER", None)
        layer._enabled.cache_clear()
    print(f"\ndecode steps of the 0.3B (x86 backend, {rounds} rounds x {steps} steps, taking turns), tok/s; "
          f"load average {os.getloadavg()[0]:.2f}")
    for batch in batches:
        rate = {name: batch / statistics.median(times[name, batch]) for name, _, _, _ in variants}
        cells = "  ".join(f"{name} {r:.1f}" for name, r in rate.items())
        ratios = "  ".join(f"{name}/wint8 {r / rate['wint8']:.2f}" for name, r in rate.items() if name != "wint8")
        print(f"B={batch}: {cells}   ({ratios})", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 512])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="0: fd-core's default (FD_CPU_THREADS or cores)")
    p.add_argument("--reference-rows", type=int, nargs="*", default=[1], help="row counts that also time fp8-ref")
    p.add_argument("--shared-layers", dest="distinct_layers", action="store_false",
                   help="one weight per shape for all 18 layers (cache-resident: kernel speed, not DRAM)")
    p.add_argument("--decode-batch", type=int, nargs="*", default=[], help="also time 0.3B decode steps at these B")
    p.add_argument("--decode-rounds", type=int, default=5)
    p.add_argument("--decode-steps", type=int, default=3, help="decode steps per variant per round")
    args = p.parse_args(argv)
    import paddle

    from fd_core.backends.cpu import num_threads
    from fd_core.quantization import quantize_weight

    threads = args.threads or num_threads()
    run = runners(threads)
    method = {v: "block_wise_fp8" if v.startswith("fp8") else v for v in VARIANTS}
    rng = np.random.default_rng(0)
    weights = []  # [(in, {method: weight})], a distinct copy per layer: streamed from DRAM as in a real step
    for d_in, d_out in PER_LAYER:
        w = rng.normal(0, d_in**-0.5, (d_in, d_out)).astype(np.float32)
        quants = {m: quantize_weight(m, w) for m in ("wint8", "w8a8", "w4a8", "block_wise_fp8")}
        for _ in range(LAYERS if args.distinct_layers else 1):
            weights.append((d_in, {m: dataclasses.replace(q, qweight=q.qweight.clone(), scales=q.scales.clone())
                                   for m, q in quants.items()}))
    repeat = 1 if args.distinct_layers else LAYERS
    print(f"CPU: {cpu_model()}, threads {threads}, load average {os.getloadavg()[0]:.2f} (start); "
          f"18 layers x {PER_LAYER} ({'distinct' if args.distinct_layers else 'shared'} weights); "
          f"ms per step (median of {args.rounds})")
    cols = [v for v in VARIANTS if v in run]
    print(f"{'rows':>5}" + "".join(f"{v:>11}" for v in cols) + "".join(
        f"{r:>15}" for r in ("fma/wint8", "bf16/wint8", "bf16/w8a8", "fma/bf16", "w4a8/wint8")))
    for rows in args.rows:
        xs = {d_in: paddle.to_tensor(rng.normal(0, 1, (rows, d_in)).astype(np.float32)) for d_in, _ in PER_LAYER}
        variants = [v for v in cols if v != "fp8-ref" or rows in args.reference_rows]
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds + 1):  # the first round warms up (repacking, page faults)
            for v in variants:
                start = time.perf_counter()
                for _ in range(repeat):
                    for d_in, quant in weights:
                        run[v](xs[d_in], quant[method[v]])
                times[v].append(time.perf_counter() - start)
        med = {v: statistics.median(t[1:]) * 1e3 for v, t in times.items()}
        cells = "".join(f"{med[v]:>11.2f}" if v in med else f"{'-':>11}" for v in cols)
        bf16 = med.get("fp8-bf16", float("nan"))
        ratios = (med["fp8-fma"] / med["wint8"], bf16 / med["wint8"], bf16 / med["w8a8"], med["fp8-fma"] / bf16,
                  med["w4a8"] / med["wint8"])
        print(f"{rows:>5}{cells}" + "".join(f"{r:>15.2f}" for r in ratios), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} (end)")
    if args.decode_batch:
        decode_steps(args.decode_batch, args.decode_rounds, args.decode_steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
