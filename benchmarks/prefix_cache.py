"""TTFT of prefix-cache hits against the cold request, through the real server.

Starts ``fd-serve --backend cpu`` with prefix caching on, warms it with one
short unrelated request, then sends, one at a time (so no queueing blurs the
numbers): a request of a ``--prefix-len``-token shared system prompt plus its
own ``--question-len``-token question (cold: nothing cached), then
``--num-hits`` requests of the same system prompt with other questions (hits),
then one more request with a different system prompt (cold again: a control
that the first cold TTFT was not a warm-up artifact). Every request streams
``--output-len`` tokens with ignore_eos over /v1/completions with token-id
prompts; TTFT is send to first token; cached tokens come from the server's
usage (``prompt_tokens_details.cached_tokens``).

    python benchmarks/prefix_cache.py                      # 2k-token prefix, 8 hits
    python benchmarks/prefix_cache.py --prefix-len 1024 --num-hits 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core.benchmarks.cli import save_result  # noqa: E402
from fd_core.benchmarks.compare import ServerProcess, completion_payload  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-pt"


def timed_request(client: Any, url: str, model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """Stream one completion; returns ttft_ms, e2e_ms, output tokens and cached prompt tokens."""
    start = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with client.stream("POST", url, json=completion_payload(model, prompt, max_tokens)) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.read().decode()[:500]}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices") or []
            if ttft is None and choices and (choices[0].get("text") or choices[0].get("completion_token_ids")):
                ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("the stream carried no generated tokens")
    return {"ttft_ms": ttft * 1e3, "e2e_ms": (time.perf_counter() - start) * 1e3,
            "output_tokens": usage.get("completion_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint directory (default: the 0.3B shape under checkpoints/)")
    p.add_argument("--prefix-len", type=int, default=2048, help="shared system prompt tokens")
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--num-hits", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve-args", default="", help="extra fd-serve flags, one string")
    p.add_argument("--result-dir", default="benchmarks/results")
    args = p.parse_args()
    if args.model:
        model = Path(args.model)
    else:
        model = CHECKPOINT
        if not (model / "model.safetensors").is_file():
            from fd_core.testing.checkpoints import generate_checkpoint

            generate_checkpoint(model, "0.3b", naming="pytorch")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(args.seed)

    def draw(n: int) -> list[int]:
        return rng.integers(100, vocab, size=n).tolist()

    system, other_system = draw(args.prefix_len), draw(args.prefix_len)
    plan = [("cold", system + draw(args.question_len))]
    plan += [(f"hit {i + 1}", system + draw(args.question_len)) for i in range(args.num_hits)]
    plan.append(("cold again (other system prompt)", other_system + draw(args.question_len)))
    max_len = args.prefix_len + args.question_len + args.output_len
    serve_args = ["--backend", "cpu", "--enable-prefix-caching", "--max-model-len", str(max(max_len, 1024)),
                  "--max-num-seqs", "8", "--num-gpu-blocks-override", str(4 * -(-max_len // 64) + 2),
                  "--disable-log-requests", *args.serve_args.split()]
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    log = ROOT / args.result_dir / f"prefix-cache-serve-{date}.log"
    print(f"fd-serve {' '.join(serve_args)} (log: {log})", flush=True)
    import httpx

    rows = []
    with ServerProcess(model, serve_args, log) as server, \
            httpx.Client(timeout=600, trust_env=False) as client:
        url = server.url + "/v1/completions"
        timed_request(client, url, str(model), draw(16), 2)  # warm-up, shares nothing with the plan
        for label, prompt in plan:
            row = {"request": label, "prompt_tokens": len(prompt),
                   **timed_request(client, url, str(model), prompt, args.output_len)}
            print(f"  {label:<34} prompt {len(prompt):5d}, cached {row['cached_tokens']!s:>5}: "
                  f"TTFT {row['ttft_ms']:8.1f} ms, E2E {row['e2e_ms']:8.1f} ms", flush=True)
            rows.append(row)
    cold = rows[0]["ttft_ms"]
    hits = [r["ttft_ms"] for r in rows[1:-1]]
    summary = {"cold_ttft_ms": cold, "median_hit_ttft_ms": statistics.median(hits), "max_hit_ttft_ms": max(hits),
               "median_hit_over_cold": statistics.median(hits) / cold, "max_hit_over_cold": max(hits) / cold,
               "cold_again_ttft_ms": rows[-1]["ttft_ms"]}
    print(f"prefix {args.prefix_len} tokens: cold TTFT {cold:.1f} ms; hits: median "
          f"{summary['median_hit_ttft_ms']:.1f} ms ({summary['median_hit_over_cold']:.1%} of cold), worst "
          f"{summary['max_hit_ttft_ms']:.1f} ms ({summary['max_hit_over_cold']:.1%}); cold again "
          f"{summary['cold_again_ttft_ms']:.1f} ms")
    path = save_result({"date": date, "kind": "prefix-cache", "config": vars(args) | {"model": str(model)},
                        "serve_args": serve_args, "summary": summary, "requests": rows},
                       str(ROOT / args.result_dir), f"prefix-cache-{date}.json")
    print(f"result written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
