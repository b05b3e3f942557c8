"""Multi-step decoding against one step a schedule, in one engine (``--num-scheduler-steps``).

Loads the engines ``benchmarks/engine_overhead.py`` loads (the generated checkpoints under
``checkpoints/llama-cpp``: the mid-size MoE, the 0.3B; x86 backend, prefix caching off) with the
larger of the two step counts, then alternates blocks: the scheduler's ``num_scheduler_steps`` set
to A or to B (``dataclasses.replace`` of its config; the requests may multi-step either way), B
requests of ``--prompt-len`` random token ids prefilled, then ``--tokens`` greedy tokens each timed
(decode tok/s = B x tokens / that time), greedy, or sampled with ``--temperature`` / ``--top-p`` /
``--top-k`` (seeded). The two settings alternate in adjacent pairs, in both orders; the figure is the
median of the pairs' ratios (same process, same weights: placement does not enter), with its quartiles.

    python benchmarks/multi_step.py                                   # mid-moe w4a8 + w4a8 head, B=1, 1 vs 8
    python benchmarks/multi_step.py --shapes mid-moe 0.3b --quantization wint8 --steps 1 16
    python benchmarks/multi_step.py --batch 8 --pairs 6
    python benchmarks/multi_step.py --temperature 0.8 --top-p 0.8    # ERNIE's default sampling
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_overhead import checkpoint  # noqa: E402

DEFAULT_QUANTIZATION = '{"quantization": "w4a8", "lm_head_quant_type": "w4a8"}'


def block(llm: Any, steps: int, batch: int, prompt_len: int, tokens: int, seed: int,
          sampling: dict[str, Any] | None = None) -> float:
    """tok/s of ``tokens`` tokens for ``batch`` fresh requests with ``steps`` steps a schedule: greedy, or drawn
    with ``sampling`` (SamplingParams fields: temperature, top_p, top_k; seeded)."""
    from fd_core import SamplingParams

    engine = llm.engine
    scheduler = engine.core.scheduler
    scheduler.config = dataclasses.replace(scheduler.config, num_scheduler_steps=steps)
    rng = np.random.default_rng(seed)
    draw = dict(sampling, seed=seed) if sampling else {"temperature": 0}
    params = SamplingParams(max_tokens=tokens + 1, ignore_eos=True, **draw)
    for i in range(batch):
        engine.add_request(f"ms-{seed}-{steps}-{i}-{time.monotonic_ns()}",
                           [int(t) for t in rng.integers(100, 2000, prompt_len)], params)
    while scheduler.num_waiting or any(r.num_output_tokens == 0 for r in scheduler.running):
        engine.step()  # the prefills, to every request's first token
    begin = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return batch * tokens / (time.perf_counter() - begin)


def paired(run: Callable[[Any, int], float], a: Any, b: Any, pairs: int) -> dict[str, Any]:
    """``run(setting, seed)`` (tok/s) for settings A and B: two warm-up blocks each, then ``pairs`` pairs of
    blocks, A and B adjacent, alternating which goes first; B's speed over A's per pair, the median and
    quartiles of those ratios, and each setting's median tok/s."""
    for i in range(2):  # warm-up
        run(a, i)
        run(b, i)
    rates_a, rates_b, ratios = [], [], []
    for i in range(pairs):
        got = {}
        for setting in ((a, b) if i % 2 else (b, a)):
            got[setting] = run(setting, 100 + i)
        rates_a.append(got[a])
        rates_b.append(got[b])
        ratios.append(got[b] / got[a])
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"a": statistics.median(rates_a), "b": statistics.median(rates_b), "ratio": statistics.median(ratios),
            "p25": quartiles[0], "p75": quartiles[2]}


def compare(llm: Any, a: int, b: int, args: argparse.Namespace) -> dict[str, Any]:
    """Step counts A and B in pairs of blocks (``paired``)."""
    sampling = sampling_args(args)
    return paired(lambda steps, seed: block(llm, steps, args.batch, args.prompt_len, args.tokens, seed, sampling),
                  a, b, args.pairs)


def sampling_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The timed requests' draw: None (greedy) unless ``--temperature`` is above 0."""
    temperature = getattr(args, "temperature", 0.0)
    if not temperature:
        return None
    return {"temperature": temperature, "top_p": getattr(args, "top_p", 1.0), "top_k": getattr(args, "top_k", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=["mid-moe", "0.3b"], default=["mid-moe"])
    parser.add_argument("--quantization", default=DEFAULT_QUANTIZATION,
                        help="a method name or a JSON object (default: w4a8 with a w4a8 LM head)")
    parser.add_argument("--steps", type=int, nargs=2, default=[1, 8], metavar=("A", "B"),
                        help="the two --num-scheduler-steps compared (default 1 8)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64, help="tokens timed per request and block")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--backend", default="x86")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampled requests (default: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    args = parser.parse_args()
    if min(args.steps) < 1 or args.batch < 1 or args.tokens < 1 or args.pairs < 1:
        parser.error("--steps, --batch, --tokens and --pairs must be positive")
    if args.temperature < 0 or (not args.temperature and (args.top_p != 1.0 or args.top_k != 0)):
        parser.error(f"--top-p {args.top_p} / --top-k {args.top_k} need --temperature above 0 (sampled requests); "
                     f"got --temperature {args.temperature}")
    if args.steps[0] == args.steps[1]:
        parser.error(f"--steps compares two different step counts, got {args.steps[0]} twice")
    quantization = json.loads(args.quantization) if args.quantization.startswith("{") else args.quantization
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(f"CPU: {model}")
    from fd_core import LLM

    a, b = args.steps
    for name in args.shapes:
        llm = LLM(str(checkpoint(name)), backend=args.backend, quantization=quantization, dtype="auto",
                  max_model_len=args.prompt_len + args.tokens + 2 * max(a, b) + 64, max_num_seqs=args.batch,
                  num_scheduler_steps=max(a, b), enable_prefix_caching=False)
        r = compare(llm, a, b, args)
        draw = "greedy" if not args.temperature else f"T={args.temperature} top_p={args.top_p} top_k={args.top_k}"
        print(f"{name} {args.quantization} {draw} B={args.batch}: {a} step(s) {r['a']:.1f} tok/s, {b} step(s) "
              f"{r['b']:.1f} tok/s; {b} against {a}: {r['ratio']:.3f}x (quartiles {r['p25']:.3f}-{r['p75']:.3f}, "
              f"{args.pairs} pairs of {args.tokens} tokens)", flush=True)
        del llm
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
