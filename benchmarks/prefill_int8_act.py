"""Prefill with int8 activations on fd_x86 (opt-in ``FD_X86_PREFILL_INT8_ACT=1``)
against the default fp32-activation prefill and w8a8, in one run.

On the generated ERNIE-4.5-0.3B shape (x86 backend, ``--dtype auto``, float
LM head, prefix caching off), for wint8, ``mix_quant`` all-int4 and w8a8
(``--shape mid-moe``: ``benchmarks/moe_decode.py``'s mid-size MoE with
wint8, wint4 = experts int4 and the rest int8, ``mix_quant`` all-int4 and
w8a8; since session 12 the opt-in covers its int4 experts too, on w4a8's
kernel):

- prefill tok/s of one fresh ``--prefill-len`` (512) token prompt, from
  adding it to its first token; wint8 and int4 each with the switch off
  (default) and on, w8a8 as the baseline of quantized activations; the
  configurations take turns for ``--rounds`` rounds, median reported;
- greedy agreement of the opt-in path with the default path of the same
  method: ``--prompts`` prompts of 64-128 random token ids (so their
  prefill takes the int8 kernels), ``--tokens`` greedy tokens each;
  ``identical`` = sequences equal throughout, ``prefix`` = mean fraction of
  tokens before the first difference.

    python benchmarks/prefill_int8_act.py [--rounds 3] [--prefill-len 512] [--prompts 8] [--tokens 16]
    python benchmarks/prefill_int8_act.py --shape mid-moe
"""

from __future__ import annotations

import argparse
import os
import platform
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

from fd_core import LLM, SamplingParams  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle"
SWITCH = "FD_X86_PREFILL_INT8_ACT"
INT4 = {"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "wint4"}
# shape -> label -> (quantization, switch value); the first word of a label names its default row
SHAPES: dict[str, dict[str, tuple[Any, str]]] = {
    "0.3b": {"wint8": ("wint8", "0"), "wint8 int8-act": ("wint8", "1"), "int4": (INT4, "0"),
             "int4 int8-act": (INT4, "1"), "w8a8": ("w8a8", "0")},
    "mid-moe": {"wint8": ("wint8", "0"), "wint8 int8-act": ("wint8", "1"), "wint4": ("wint4", "0"),
                "wint4 int8-act": ("wint4", "1"), "all-int4": (INT4, "0"), "all-int4 int8-act": (INT4, "1"),
                "w8a8": ("w8a8", "0")},
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def prefill_rate(llm: LLM, length: int, seed: int) -> float:
    engine = llm.engine
    prompt = [int(t) for t in np.random.default_rng(1000 + seed).integers(100, 2000, length)]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    begin = time.perf_counter()
    engine.add_request(f"prefill-{seed}-{time.monotonic_ns()}", {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        engine.step()
    return length / (time.perf_counter() - begin)


def greedy(llm: LLM, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    identical = sum(x == y for x, y in zip(a, b)) / len(a)
    prefixes = []
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
        prefixes.append(n / len(x))
    return identical, float(np.mean(prefixes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.3b")
    args = parser.parse_args()
    if args.shape == "mid-moe":
        from moe_decode import checkpoint

        path = checkpoint()
    else:
        path = CHECKPOINT
        if not (CHECKPOINT / "config.json").is_file():
            print(f"generating {CHECKPOINT} (once)", flush=True)
            generate_checkpoint(CHECKPOINT, "0.3b", naming="paddle")
    configs = SHAPES[args.shape]
    engines: dict[Any, LLM] = {}
    for quant, _ in configs.values():
        key = str(quant)
        if key not in engines:
            engines[key] = LLM(str(path), backend="x86", quantization=quant, max_model_len=1024,
                               max_num_seqs=8, enable_prefix_caching=False)

    def run(label: str, fn: Any) -> Any:
        quant, switch = configs[label]
        os.environ[SWITCH] = switch
        try:
            return fn(engines[str(quant)])
        finally:
            os.environ.pop(SWITCH, None)

    for label in configs:  # first-use costs (weight repacks, allocator)
        run(label, lambda llm: prefill_rate(llm, 64, 0))
    rates: dict[str, list[float]] = {label: [] for label in configs}
    for r in range(args.rounds):
        for label in configs:
            rates[label].append(run(label, lambda llm, r=r: prefill_rate(llm, args.prefill_len, r + 1)))
        print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()), flush=True)
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(100, 2000, int(rng.integers(64, 129)))] for _ in range(args.prompts)]
    tokens = {label: run(label, lambda llm: greedy(llm, prompts, args.tokens)) for label in configs if label != "w8a8"}
    print(f"\n{args.shape}; CPU: {cpu_model()}; {os.cpu_count()} CPUs; prefill of one {args.prefill_len}-token prompt, "
          f"median of {args.rounds} rounds (tok/s, x the default path of the method; x w8a8)")
    w8a8 = statistics.median(rates["w8a8"])
    for label, values in rates.items():
        med = statistics.median(values)
        base = statistics.median(rates[label.split()[0]])
        print(f"  {label:16s} {med:8.1f} tok/s  ({med / base:4.2f}x default, {med / w8a8:4.2f}x w8a8)  "
              f"[{min(values):.0f}-{max(values):.0f}]")
    print(f"greedy agreement with the default path ({args.prompts} prompts of 64-128 ids x {args.tokens} tokens):")
    for method in (label for label in configs if label + " int8-act" in configs):
        identical, prefix = agreement(tokens[method], tokens[method + " int8-act"])
        print(f"  {method:6s} int8-act: identical {identical:.0%}, prefix {prefix:.0%}")


if __name__ == "__main__":
    main()
