"""Decode tokens/s of the 0.3B shape for fp32 (CPU reference) and wint8,
wint4, w8a8 (x86 backend, when installed), in one run.

    python benchmarks/quant_decode.py [--batch 1 8 32] [--rounds 6] [--steps 4] [--prompt-len 128]
                                      [--reference-numerics] [--lm-head float|int8]

Every configuration is loaded at once from the same generated checkpoint
(cached under checkpoints/). For each batch size B, each engine prefills B
prompts; then, round by round, each engine times ``--steps`` decode steps
through the whole engine (scheduler, forward, greedy sampler: what a user
gets). The configurations take turns, so a change in the machine's memory
bandwidth (a shared VM's neighbours) hits them alike. Prints, per batch, the
median tokens/s over all timed steps, the range of the per-round medians, and
the ratio to fp32 on the reference. ``--reference-numerics`` adds the CPU
reference running wint8 (dequantize, then fp32 matmul: slow), measured after
the others, for scale. The LM head stays float (the engine's default, as in
FastDeploy); ``--lm-head int8`` quantizes it too (opt-in
``lm_head_quant_type``: wint8, w8a8 under w8a8), as the figures measured
before the float head became the default did.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fd_core import LLM, SamplingParams
from fd_core.backends import list_backends
from fd_core.testing.checkpoints import generate_checkpoint

CHECKPOINT = Path("checkpoints") / "ernie-4.5-0.3b-paddle"


@dataclass
class Config:
    backend: str
    method: str | None
    llm: LLM
    rates: dict[int, list[float]] = field(default_factory=dict)  # batch -> per-round tok/s
    steps: dict[int, list[float]] = field(default_factory=dict)  # batch -> step seconds

    @property
    def label(self) -> str:
        return f"{self.backend:<7} {self.method or 'fp32':<7}"


def quantization(method: str | None, lm_head: str) -> str | dict[str, str] | None:
    """The ``--quantization`` value for ``method`` with a float or int8 LM head."""
    if method is None or lm_head == "float":
        return method
    return {"quantization": method, "lm_head_quant_type": "w8a8" if method == "w8a8" else "wint8"}


def load(backend: str, method: str | None, max_batch: int, lm_head: str = "float") -> Config:
    llm = LLM(str(CHECKPOINT), backend=backend, quantization=quantization(method, lm_head), max_model_len=1024,
              max_num_seqs=max_batch, num_gpu_blocks_override=40 * max_batch // 8 + 16)
    return Config(backend, method, llm)


def start(config: Config, batch: int, prompt_len: int, max_tokens: int) -> None:
    """Add ``batch`` requests and step until every one has its first token."""
    engine = config.llm.engine
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [int(t) for t in rng.integers(100, 2000, prompt_len)], params)
    scheduler = engine.core.scheduler
    while scheduler.num_waiting or any(r.num_output_tokens == 0 for r in scheduler.running):
        engine.step()
    engine.step()  # warm-up decode step


def timed_steps(config: Config, batch: int, steps: int) -> None:
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        config.llm.engine.step()
        times.append(time.perf_counter() - begin)
    config.steps.setdefault(batch, []).extend(times)
    config.rates.setdefault(batch, []).append(batch / statistics.median(times))


def finish(config: Config) -> None:
    engine = config.llm.engine
    while engine.has_unfinished_requests():
        engine.step()


def rate(config: Config, batch: int) -> float:
    return batch / statistics.median(config.steps[batch])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="decode steps per engine per round")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--reference-numerics", action="store_true",
                        help="also time the CPU reference running wint8 (slow), after the others")
    parser.add_argument("--lm-head", choices=["float", "int8"], default="float",
                        help="float: the engine's default; int8: quantize the LM head too (opt-in)")
    args = parser.parse_args()
    if not (CHECKPOINT / "config.json").is_file():
        generate_checkpoint(CHECKPOINT, "0.3b", naming="paddle")
    usable = {r.name for r in list_backends() if r.availability.usable}
    wanted: list[tuple[str, str | None]] = [("cpu", None)]
    if "x86" in usable:
        wanted += [("x86", "wint8"), ("x86", "wint4"), ("x86", "w8a8")]
    max_batch = max(args.batch)
    configs = [load(backend, method, max_batch, args.lm_head) for backend, method in wanted]
    for config in configs:  # first-use costs (allocator, BLAS, op builds, weight repacks)
        start(config, 2, 16, 4)
        finish(config)
    max_tokens = args.rounds * args.steps + 4
    for batch in args.batch:
        for config in configs:
            start(config, batch, args.prompt_len, max_tokens)
        for _ in range(args.rounds):
            for config in configs:
                timed_steps(config, batch, args.steps)
        for config in configs:
            finish(config)
        print(f"B={batch}: " + "  ".join(f"{c.backend}/{c.method or 'fp32'} {rate(c, batch):.1f}" for c in configs)
              + " tok/s", flush=True)
    if args.reference_numerics:
        for config in configs:
            del config.llm
        gc.collect()
        reference = load("cpu", "wint8", max_batch, args.lm_head)
        start(reference, 2, 16, 4)
        finish(reference)
        for batch in args.batch:
            start(reference, batch, args.prompt_len, args.steps + 4)
            timed_steps(reference, batch, args.steps)
            finish(reference)
        configs.append(reference)

    base = configs[0]
    print(f"\n{args.rounds} rounds x {args.steps} decode steps per configuration and batch, taking turns; "
          "tok/s = B / median step time [range of the per-round medians] (x fp32)")
    print("backend method  " + "".join(f"{'B=' + str(b):<32}" for b in args.batch))
    for config in configs:
        cells = []
        for batch in args.batch:
            rounds = config.rates[batch]
            spread = f"[{min(rounds):.0f}-{max(rounds):.0f}]" if len(rounds) > 1 else ""
            cells.append(f"{rate(config, batch):7.1f} {spread:<11} ({rate(config, batch) / rate(base, batch):4.2f}x)"
                         .ljust(32))
        print(f"{config.label} " + "".join(cells))


if __name__ == "__main__":
    main()
