"""Decode step at --tensor-parallel-size 2 (one thread per rank) against TP=1 (two
threads), in the same run, on the 0.3B shape (generated weights).

Each configuration is an offline engine (``fd_core.LLM``); B requests of a short
prompt are admitted and prefilled, then the engine steps until they finish; the
median decode step (the engine's own ``last_step.step_seconds``: schedule, forward,
sample) is reported per configuration, with TP=2 / TP=1. The TP=2 engine's rank 0
runs in this process and rank 1 in a worker process; on a host backend they split
the cores (``cores // 2`` threads each). CPU figures on a shared 2-core machine are
noisy: compare ratios within a run.

    python benchmarks/tp_decode.py                                  # cpu backend, fp32, B=1 and 8
    python benchmarks/tp_decode.py --backend x86 --quantization wint8
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core import LLM, SamplingParams  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle"


def checkpoint() -> Path:
    if not (CHECKPOINT / "model.safetensors").is_file():
        print(f"generating {CHECKPOINT} (once)", flush=True)
        generate_checkpoint(CHECKPOINT, "0.3b", naming="paddle")
    return CHECKPOINT


def decode_steps(llm: LLM, batch: int, tokens: int) -> list[float]:
    """Seconds of each pure-decode step of ``batch`` requests generating ``tokens`` each."""
    engine = llm.engine
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", f"request {i}: tell me a story", params)
    out = []
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.core.last_step
        if stats.num_prefill_tokens == 0 and stats.num_decodes:
            out.append(stats.step_seconds)
    return out


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per request")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the generated 0.3B)")
    args = ap.parse_args()
    model = args.model or str(checkpoint())
    print(f"CPU: {cpu_model()}; backend {args.backend}, quantization {args.quantization or 'none'}", flush=True)
    results: dict[tuple[int, int], float] = {}
    for tp in (1, 2):
        llm = LLM(model=model, backend=args.backend, tensor_parallel_size=tp, quantization=args.quantization,
                  max_model_len=512, max_num_seqs=max(args.batch), num_gpu_blocks_override=64)
        try:
            decode_steps(llm, 1, 4)  # warm
            for b in args.batch:
                steps = decode_steps(llm, b, args.tokens)
                results[(tp, b)] = statistics.median(steps)
                print(f"TP={tp} B={b}: median decode step {results[(tp, b)] * 1e3:.2f} ms over {len(steps)} steps",
                      flush=True)
        finally:
            if tp > 1:
                llm.engine.core.runner.close()
        del llm
    for b in args.batch:
        one, two = results[(1, b)], results[(2, b)]
        print(f"B={b}: TP=1 {one * 1e3:.2f} ms, TP=2 {two * 1e3:.2f} ms, TP=2 / TP=1 = {two / one:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
