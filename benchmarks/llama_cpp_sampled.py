"""Sampled decoding at batch 1 against llama.cpp, in one run: what a single user of ERNIE's default
``generation_config.json`` (temperature 0.8, top_p 0.8) gets from each side.

``benchmarks/llama_cpp.py`` times greedy decoding (llama.cpp's llama-batched-bench does not sample at all).
Here both sides draw every token: one request at a time, ``--tokens`` tokens after a ``--prompt-len``-token
prompt of random token ids, ``ignore_eos``, temperature then top-p then the draw (llama.cpp: its other default
samplers off; its own timing of the generation phase, ``timings.predicted_per_second``; fd-core: the engine,
seeded, from the first token to the last, with ``--num-scheduler-steps`` of each ``--steps`` value). Rounds
interleave the sides; each cell is the median over the rounds' requests. The files are those
``benchmarks/llama_cpp.py`` makes under ``--work-dir`` (made here when missing: the same code).

    python benchmarks/llama_cpp_sampled.py                     # mid-moe and 0.3b, 1 and 8 steps
    python benchmarks/llama_cpp_sampled.py --shapes mid-moe --rows "w4a8 + w4a8 head" wint8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llama_cpp_shapes import SHAPES  # noqa: E402

DEFAULT_ROWS = ["wint8 + int8 head", "w4a8 + w4a8 head", "wint8", "w4a8"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=["0.3b", "mid-moe"], default=["mid-moe", "0.3b"])
    p.add_argument("--rows", nargs="+", default=DEFAULT_ROWS,
                   help="fd-core rows (names from llama_cpp_shapes; a shape measures those it has)")
    p.add_argument("--steps", type=int, nargs="+", default=[1, 8], help="fd-core --num-scheduler-steps values")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--requests", type=int, default=3, help="requests a side and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work-dir", type=Path, default=ROOT / "checkpoints" / "llama-cpp")
    p.add_argument("--llama-cpp", type=Path, default=None)
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    for name in ("tokens", "prompt_len", "requests", "rounds", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.steps) < 1 or not 0 < args.temperature or not 0 < args.top_p <= 1:
        p.error("--steps must be >= 1, --temperature > 0 and --top-p in (0, 1]")
    configs = {c.name: c for name in args.shapes for c in SHAPES[name].fd_configs}
    unknown = [r for r in args.rows if r not in configs]
    if unknown:
        p.error(f"--rows {unknown[0]!r} is no row of {' or '.join(args.shapes)}; expected one of "
                f"{sorted(configs)}")
    switched = [r for r in args.rows if configs[r].env]
    if switched:  # their switches change prefill only; this script times decoding
        p.error(f"--rows {switched[0]!r} is a prefill switch's row ({configs[switched[0]].env}); this script times "
                "decoding: name the row without it")
    return args


def fd_rates(llm: Any, steps: int, args: argparse.Namespace, seed: int) -> list[float]:
    """tok/s of each of ``--requests`` sampled requests, one at a time (``benchmarks/multi_step.block``)."""
    from multi_step import block

    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": 0}
    return [block(llm, steps, 1, args.prompt_len, args.tokens, seed + i, sampling) for i in range(args.requests)]


def run_shape(name: str, args: argparse.Namespace, llama: Any) -> dict[str, Any]:
    import llama_cpp_runs as lcr
    import numpy as np
    from llama_cpp_build import convert, quantize

    from fd_core import LLM
    from fd_core.testing.checkpoints import generate_checkpoint

    shape = SHAPES[name]
    ckpt = args.work_dir / name
    if not (ckpt / "config.json").is_file():
        generate_checkpoint(ckpt, shape.generator, naming="pytorch", seed=shape.seed, **shape.overrides)
    f32 = convert(llama, ckpt, args.work_dir / f"{name}-f32.gguf")
    ggufs = {q: quantize(llama, f32, q, args.threads) for q in ("q8_0", "q4_0")}
    configs = [c for c in shape.fd_configs if c.name in args.rows]
    rng = np.random.default_rng(11)
    llama_rates: dict[str, list[float]] = {q: [] for q in ggufs}
    fd: dict[tuple[str, int], list[float]] = {}
    engines = {}
    for config in configs:
        print(f"loading fd-core x86 {config.name}", flush=True)
        engines[config.name] = LLM(str(ckpt), backend="x86", dtype="auto", max_num_seqs=1,
                                   enable_prefix_caching=False, num_scheduler_steps=max(args.steps),
                                   max_model_len=args.prompt_len + args.tokens + 2 * max(args.steps) + 64,
                                   **config.engine_kwargs)
    for r in range(args.rounds):
        for config in configs:
            for steps in args.steps:
                rates = fd_rates(engines[config.name], steps, args, 1000 * r)
                fd.setdefault((config.name, steps), []).extend(rates)
                print(f"  round {r + 1} fd-core {config.name}, {steps} step(s): "
                      + " ".join(f"{x:.1f}" for x in rates), flush=True)
        prompts = [[int(t) for t in rng.integers(100, 2000, args.prompt_len)] for _ in range(args.requests)]
        for q, path in ggufs.items():
            rates = lcr.sampled_decode(llama, path, prompts, args.tokens, args.threads, args.temperature, args.top_p,
                                       args.work_dir / f"{name}-{q}.sampled.log")
            llama_rates[q].extend(rates)
            print(f"  round {r + 1} llama.cpp {q}: " + " ".join(f"{x:.1f}" for x in rates), flush=True)
    engines.clear()
    return {"llama": {q: statistics.median(v) for q, v in llama_rates.items()},
            "fd": [{"label": c.name, "pair": c.pair,
                    "steps": {s: statistics.median(fd[(c.name, s)]) for s in args.steps}} for c in configs]}


def format_table(name: str, result: dict[str, Any], steps: Sequence[int], args: argparse.Namespace) -> str:
    head = [f"{name}, B=1, T={args.temperature:g} top_p={args.top_p:g}, decode tok/s",
            *(f"--num-scheduler-steps {s}" for s in steps)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q, rate in result["llama"].items():
        lines.append(f"| llama.cpp {q} | {rate:.1f} |" + " |" * (len(steps) - 1))
    for row in result["fd"]:
        base = result["llama"][row["pair"]]
        cells = [f"{row['steps'][s]:.1f} ({row['steps'][s] / base:.2f}x {row['pair']})" for s in steps]
        lines.append(f"| fd-core x86 {row['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["FD_CPU_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from llama_cpp import machine
    from llama_cpp_build import DEFAULT_CACHE, find_or_build

    llama = find_or_build(args.cache or DEFAULT_CACHE, args.llama_cpp, "0.3.36", 2)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results = {name: run_shape(name, args, llama) for name in args.shapes}
    info = machine(args.threads)
    print(f"\nCPU: {info['cpu']} ({' '.join(info['isa'])}); {args.threads} threads on both sides; read bandwidth "
          f"{info['read_gb_s']:.1f} GB/s; load average at the end {' '.join(f'{x:.2f}' for x in info['loadavg'])}")
    print(f"llama.cpp: {llama.origin}, commit {llama.commit()}; {args.tokens} tokens after {args.prompt_len}-token "
          f"prompts, {args.requests} requests x {args.rounds} rounds a cell (median)\n")
    for name, result in results.items():
        print(format_table(name, result, args.steps, args) + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
