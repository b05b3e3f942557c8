"""Decode step with --enable-expert-parallel (TP=2 + EP) against TP=2 and TP=1, in the same
run, on the mid-size MoE shape (``benchmarks/moe_decode.py``'s generated checkpoint).

Each configuration is an offline engine (``fd_core.LLM``), built afresh in each of
``--repeats`` alternating rounds, where it prefills B requests and decodes them; the
median pure-decode step (the engine's ``last_step.step_seconds``) over the rounds is
reported, with each configuration's ratio to TP=1. TP=2 runs one thread per rank, TP=1 two
threads (the ranks split the cores). TP splits every expert's intermediate dim over
the ranks; EP keeps experts whole, half of them per rank, and the router runs on both
ranks; both combine with one all-reduce per MoE layer. CPU figures on a shared 2-core
machine are noisy: compare ratios within a run.

    python benchmarks/ep_decode.py                                   # x86 backend, wint8, B=1 and 8
    python benchmarks/ep_decode.py --backend cpu --quantization none
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from moe_decode import checkpoint  # noqa: E402
from tp_decode import cpu_model, decode_steps  # noqa: E402

from fd_core import LLM  # noqa: E402

CONFIGS = [("TP=1", 1, False), ("TP=2", 2, False), ("TP=2+EP", 2, True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="x86")
    ap.add_argument("--quantization", default="wint8", help="none for the checkpoint's float weights")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per request")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds over the engines")
    args = ap.parse_args()
    quant = None if args.quantization == "none" else args.quantization
    model = str(checkpoint())
    print(f"CPU: {cpu_model()}; backend {args.backend}, quantization {quant or 'none'}, mid MoE", flush=True)
    steps: dict[tuple[str, int], list[float]] = {(name, b): [] for name, _, _ in CONFIGS for b in args.batch}
    # one engine at a time (a TP engine sets this process's thread count until it closes);
    # rounds alternate the configurations, so load from elsewhere falls on all of them
    for _ in range(args.repeats):
        for name, tp, ep in CONFIGS:
            llm = LLM(model=model, backend=args.backend, tensor_parallel_size=tp, enable_expert_parallel=ep,
                      quantization=quant, max_model_len=512, max_num_seqs=max(args.batch),
                      num_gpu_blocks_override=64)
            try:
                decode_steps(llm, 1, 4)  # warm
                for b in args.batch:
                    steps[(name, b)].extend(decode_steps(llm, b, args.tokens))
            finally:
                if tp > 1:
                    llm.engine.core.runner.close()
            del llm
    results = {key: statistics.median(values) for key, values in steps.items()}
    for (name, b), value in results.items():
        print(f"{name} B={b}: median decode step {value * 1e3:.2f} ms over {len(steps[(name, b)])} steps")
    for b in args.batch:
        base = results[("TP=1", b)]
        print(f"B={b}: " + ", ".join(f"{name} {results[(name, b)] * 1e3:.2f} ms ({results[(name, b)] / base:.2f}x)"
                                    for name, _, _ in CONFIGS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
