"""Decode tokens/s of the 0.3B shape for fp32 (CPU reference) and wint8,
wint4, w8a8 (x86 backend, when installed), in one run.

    python benchmarks/quant_decode.py [--batch 1 8 32] [--steps 8] [--prompt-len 128]

Each configuration loads the same generated checkpoint (cached under
checkpoints/), prefills B prompts, then times decode steps through the engine
(scheduler, forward, sampler: what a user gets). Prints tokens/s per batch
size and the ratio to fp32 on the reference.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import numpy as np

from fd_core import LLM, SamplingParams
from fd_core.backends import list_backends
from fd_core.testing.checkpoints import generate_checkpoint

CHECKPOINT = Path("checkpoints") / "ernie-4.5-0.3b-paddle"


def decode_rate(llm: LLM, batch: int, prompt_len: int, steps: int) -> float:
    engine = llm.engine
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_tokens=steps + 4, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [int(t) for t in rng.integers(100, 2000, prompt_len)], params)
    scheduler = engine.core.scheduler
    while scheduler.num_waiting or any(r.num_output_tokens == 0 for r in scheduler.running):
        engine.step()
    engine.step()  # warm-up decode step
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    while engine.has_unfinished_requests():
        engine.step()
    return batch / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    args = parser.parse_args()
    if not (CHECKPOINT / "config.json").is_file():
        generate_checkpoint(CHECKPOINT, "0.3b", naming="paddle")
    usable = {r.name for r in list_backends() if r.availability.usable}
    configs = [("cpu", None)]
    if "x86" in usable:
        configs += [("x86", "wint8"), ("x86", "wint4"), ("x86", "w8a8")]
    configs += [("cpu", "wint8")]  # the reference numerics, for scale
    rows = []
    for backend, method in configs:
        llm = LLM(str(CHECKPOINT), backend=backend, quantization=method, max_model_len=1024,
                  max_num_seqs=max(args.batch), num_gpu_blocks_override=40 * max(args.batch) // 8 + 16)
        decode_rate(llm, 2, 16, 2)  # throwaway: first-use costs (allocator, BLAS, op builds)
        rates = [decode_rate(llm, b, args.prompt_len, args.steps) for b in args.batch]
        rows.append((backend, method or "fp32", rates))
        print(f"{backend:>4} {method or 'fp32':>6}: " + "  ".join(f"B={b}: {r:7.1f} tok/s" for b, r in zip(args.batch, rates)), flush=True)
        del llm
        gc.collect()
    base = rows[0][2]
    print("\nbackend method  " + "  ".join(f"B={b:<3} tok/s (x fp32)" for b in args.batch))
    for backend, method, rates in rows:
        print(f"{backend:<7} {method:<7} " + "  ".join(f"{r:8.1f} ({r / b0:4.2f}x)      " for r, b0 in zip(rates, base)))


if __name__ == "__main__":
    main()
