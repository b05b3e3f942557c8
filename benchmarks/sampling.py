"""The x86 backend's native draw (``fd_sample``: ``csrc/x86_sample_op.cc``) against the reference's numpy draw,
in one process.

1. The op alone: one row of ``--vocab`` logits (normal with std 1: flat, like the generated checkpoints' random
   weights; std 3 and 8: peaked), each sampler setting, the median of ``--repeats`` calls of each side
   (the reference is ``fd_core.ops.sampling``'s float64 host draw, what ``fd_sample`` runs without the
   plugin), and whether the two drew the same tokens.
2. The engine (``--engine``): the checkpoint ``benchmarks/engine_overhead.py`` loads (the mid-size MoE by
   default, x86, one step a schedule), blocks of ``--tokens`` seeded sampled tokens at B=1 after a 128-token
   prompt, ``FD_X86_SAMPLE=0`` (the reference draws) and unset (native) alternating in adjacent pairs; the
   median of the pairs' ratios.

    python benchmarks/sampling.py
    python benchmarks/sampling.py --engine --shapes mid-moe 0.3b
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# (name, temperature, top_k, top_p, min_p)
SETTINGS = [("T=0.8 top_p=0.8 (ERNIE's default)", 0.8, 0, 0.8, 0.0), ("T=1 top_k=20", 1.0, 20, 1.0, 0.0),
            ("T=1 unfiltered", 1.0, 0, 1.0, 0.0), ("T=0.7 min_p=0.05", 0.7, 0, 1.0, 0.05)]


def time_op(vocab: int, scale: float, setting: tuple[str, float, int, float, float], repeats: int,
            seed: int = 0) -> dict[str, Any]:
    """Median ms of a call of each side on one row, and whether they drew the same tokens."""
    import paddle

    from fd_core.backends import get_backend
    from fd_core.ops.sampling import reference_sample

    rng = np.random.default_rng(seed)
    logits = paddle.to_tensor((rng.standard_normal((1, vocab)) * scale).astype(np.float32))
    _, t, k, p, m = setting
    cols = [paddle.to_tensor(np.array([v], dtype)) for v, dtype in
            ((t, np.float32), (k, np.int64), (p, np.float32), (m, np.float32))]
    ops = get_backend("x86").ops
    times: dict[str, list[float]] = {"native": [], "reference": []}
    same = 0
    for i in range(repeats):
        uniforms = paddle.to_tensor(rng.random((1, 16), dtype=np.float32))
        drawn = {}
        for side in ("native", "reference") if i % 2 else ("reference", "native"):
            begin = time.perf_counter()
            if side == "native":
                drawn[side] = ops.sample(logits, *cols, uniforms, "sort")
            else:
                drawn[side] = reference_sample(logits, *cols, uniforms, "sort")
            times[side].append(time.perf_counter() - begin)
        same += int(drawn["native"].numpy()[0] == drawn["reference"].numpy()[0])
    native, reference = (statistics.median(times[s]) * 1e3 for s in ("native", "reference"))
    return {"native_ms": native, "reference_ms": reference, "ratio": reference / native, "same": same,
            "draws": repeats}


def engine_block(llm: Any, tokens: int, native: bool, seed: int, sampling: dict[str, Any]) -> float:
    """tok/s of one block (``multi_step.block``, one step a schedule) with the native draw or the reference's."""
    from multi_step import block

    if native:
        os.environ.pop("FD_X86_SAMPLE", None)
    else:
        os.environ["FD_X86_SAMPLE"] = "0"
    try:
        return block(llm, 1, 1, 128, tokens, seed, sampling)
    finally:
        os.environ.pop("FD_X86_SAMPLE", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=103424)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--engine", action="store_true", help="also the engine A/B (loads a checkpoint)")
    parser.add_argument("--shapes", nargs="+", choices=["mid-moe", "0.3b"], default=["mid-moe"])
    parser.add_argument("--quantization", default='{"quantization": "w4a8", "lm_head_quant_type": "w4a8"}')
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    if args.vocab < 1 or args.repeats < 1 or args.tokens < 1 or args.pairs < 1:
        parser.error("--vocab, --repeats, --tokens and --pairs must be positive")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(f"CPU: {model}")
    print(f"| one row of {args.vocab} logits | setting | reference (numpy) | native | speed | same tokens |")
    print("|---|---|---|---|---|---|")
    for scale in (1.0, 3.0, 8.0):
        for setting in SETTINGS:
            r = time_op(args.vocab, scale, setting, args.repeats)
            print(f"| std {scale:g} | {setting[0]} | {r['reference_ms']:.3f} ms | {r['native_ms']:.3f} ms | "
                  f"{r['ratio']:.1f}x | {r['same']}/{r['draws']} |", flush=True)
    if args.engine:
        from engine_overhead import checkpoint
        from multi_step import paired

        from fd_core import LLM

        quantization = json.loads(args.quantization) if args.quantization.startswith("{") else args.quantization
        sampling = {"temperature": 0.8, "top_p": 0.8, "top_k": 0}
        for name in args.shapes:
            llm = LLM(str(checkpoint(name)), backend="x86", quantization=quantization, dtype="auto",
                      max_model_len=128 + args.tokens + 64, max_num_seqs=1, enable_prefix_caching=False)
            r = paired(functools.partial(engine_block, llm, args.tokens, sampling=sampling), False, True,
                       args.pairs)
            print(f"{name} {args.quantization} B=1 T=0.8 top_p=0.8, one step a schedule: reference draw "
                  f"{r['a']:.1f} tok/s, native {r['b']:.1f} tok/s: {r['ratio']:.3f}x (quartiles {r['p25']:.3f}-"
                  f"{r['p75']:.3f}, {args.pairs} pairs of {args.tokens} tokens)", flush=True)
            del llm
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
