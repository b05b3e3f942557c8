"""Decode tok/s with and without speculative decoding (n-gram, suffix, MTP), same run.

The generated ERNIE-4.5-0.3B (random weights, Paddle naming) on the x86 backend
at wint8, greedy, B=1 and B=8. Each configuration is its own ``LLM`` (loaded
once); rounds interleave the configurations so machine noise hits them alike.
A round adds B requests, runs the first step (prefill and first token) untimed,
then times the steps until every request finished: decode tok/s = tokens emitted
after the first / that time. Workloads:

- ``repetitive``: prompts of a short random pattern repeated (the prompt-lookup
  case: the continuation is found in the context);
- ``generic``: random token prompts (no repetition in the prompt; what the
  random-weights model repeats of its own output is all a proposer can find).

Acceptance rate = accepted / drafted tokens, from the engine's counters. With
random weights the acceptance is whatever the model's greedy continuation
repeats; it is reported, not tuned. MTP drafts with the checkpoint's MTP block
(random weights too: its acceptance is near zero, and is reported as measured);
with ``mtp`` among the methods every configuration, the baseline included, loads
the same checkpoint with an MTP block (``CHECKPOINT_MTP``: the same seed, so the
same target). Greedy outputs are checked equal to the
baseline's (speculation must not change a token).

    python benchmarks/spec_decode.py                         # k=4, B=1 and 8, 3 rounds
    python benchmarks/spec_decode.py --k 2 --batch 1 --rounds 5 --tokens 128
    python benchmarks/spec_decode.py --methods mtp --k 1 --batch 1 8
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core import LLM, SamplingParams  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle"
CHECKPOINT_MTP = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle-mtp"  # + the MTP block (num_nextn_predict_layers 1)


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


VOCAB = 50000  # prompt token ids are drawn below this (set from the model in main)


def prompts(workload: str, batch: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batch):
        if workload == "repetitive":
            pattern = [int(t) for t in rng.integers(100, VOCAB, int(rng.integers(8, 24)))]
            out.append((pattern * (length // len(pattern) + 1))[:length])
        else:
            out.append([int(t) for t in rng.integers(100, VOCAB, length)])
    return out


def run_round(llm: LLM, batch: list[list[int]], tokens: int, tag: str) -> tuple[float, int, list[list[int]]]:
    """(decode seconds, tokens emitted after the first step, outputs by request)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(len(batch))]
    for rid, prompt in zip(ids, batch):
        engine.add_request(rid, prompt, params)
    outputs: dict[str, list[int]] = {rid: [] for rid in ids}

    def collect(outs: list) -> int:
        n = 0
        for o in outs:
            outputs[o.request_id] = list(o.outputs[0].token_ids)
            n += 1
        return n

    while any(not outputs[r] for r in ids):  # prefills (and first tokens), untimed
        collect(engine.step())
    first = sum(len(v) for v in outputs.values())
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        collect(engine.step())
    seconds = time.perf_counter() - start
    if any(len(v) != tokens for v in outputs.values()):
        raise RuntimeError(f"{tag}: expected {tokens} tokens per request, got {[len(v) for v in outputs.values()]}")
    return seconds, sum(len(v) for v in outputs.values()) - first, [outputs[r] for r in ids]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="x86")
    ap.add_argument("--quantization", default="wint8", help="a --quantization method, or none")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--methods", default="ngram,suffix,mtp")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--workloads", default="repetitive,generic")
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per request")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the generated 0.3B)")
    args = ap.parse_args()
    mtp = "mtp" in args.methods.split(",")
    model = Path(args.model) if args.model else CHECKPOINT_MTP if mtp else CHECKPOINT
    if not (model / "config.json").is_file():
        generate_checkpoint(model, "0.3b", naming="paddle", **({"num_nextn_predict_layers": 1} if mtp else {}))
    from fd_core.backends.cpu import num_threads
    from fd_core.models.config import load_config

    global VOCAB
    VOCAB = min(VOCAB, load_config(model).vocab_size)

    print(f"CPU: {cpu_model()}; {num_threads()} threads; backend {args.backend}; {args.quantization}; "
          f"k={args.k}; {args.tokens} tokens after a {args.prompt_len}-token prompt; {args.rounds} rounds",
          flush=True)
    configs: dict[str, dict | None] = {"baseline": None}
    for m in args.methods.split(","):
        configs[m] = {"method": m, "num_speculative_tokens": args.k}
    quantization = None if args.quantization == "none" else args.quantization
    common = dict(backend=args.backend, quantization=quantization, max_model_len=1024,
                  max_num_seqs=max(args.batch), num_gpu_blocks_override=256, block_size=64)
    llms = {name: LLM(str(model), speculative_config=spec, **common) for name, spec in configs.items()}
    for name, llm in llms.items():  # first-use costs
        run_round(llm, prompts("generic", 1, 16, 99), 8, f"warm-{name}")
    print(f"{'workload':<11} {'B':>2} {'config':<9} {'tok/s':>8} {'x base':>7} {'accept':>7} "
          f"{'tok/step':>8} {'same':>5}")
    for workload in args.workloads.split(","):
        for b in args.batch:
            secs: dict[str, list[float]] = {n: [] for n in llms}
            counts: dict[str, int] = {n: 0 for n in llms}
            base_out: dict[int, list[list[int]]] = {}
            same: dict[str, bool] = {n: True for n in llms}
            before = {n: _spec_totals(llm) for n, llm in llms.items()}
            for r in range(args.rounds):
                batch = prompts(workload, b, args.prompt_len, seed=1000 * r + b)
                for name, llm in llms.items():
                    s, n, outs = run_round(llm, batch, args.tokens, f"{workload}-{b}-{r}-{name}")
                    secs[name].append(s)
                    counts[name] = n
                    if name == "baseline":
                        base_out[r] = outs
                    elif outs != base_out[r]:
                        same[name] = False
                        i = next(i for i, (a, o) in enumerate(zip(base_out[r], outs)) if a != o)
                        at = next(j for j, (x, y) in enumerate(zip(base_out[r][i], outs[i])) if x != y)
                        print(f"  {name} round {r}: request {i} differs from token {at} on", flush=True)
            base_rate = counts["baseline"] / statistics.median(secs["baseline"])
            for name, llm in llms.items():
                rate = counts[name] / statistics.median(secs[name])
                drafted, accepted, emitted, steps = (a - c for a, c in zip(_spec_totals(llm), before[name]))
                accept = f"{accepted / drafted:.2f}" if drafted else "-"
                per_step = f"{emitted / steps:.2f}" if steps else "1.00"
                print(f"{workload:<11} {b:>2} {name:<9} {rate:8.1f} {rate / base_rate:7.2f} {accept:>7} "
                      f"{per_step:>8} {'yes' if same[name] else 'NO':>5}", flush=True)
    return 0


def _spec_totals(llm: LLM) -> tuple[int, int, int, int]:
    spec = llm.engine.core.spec
    if spec is None:
        return 0, 0, 0, 0
    st = spec.stats
    return st.num_draft_tokens, st.num_accepted_tokens, st.num_emitted_tokens, st.num_verify_steps


if __name__ == "__main__":
    raise SystemExit(main())
