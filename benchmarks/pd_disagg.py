"""Prefill/decode disaggregation: 1 prefill + 1 decode instance against two
mixed instances on the same total cores, under one Poisson load, in one run.

Per mode it starts two fd-serve instances of one generated checkpoint (CPU
backend, ``FD_CPU_NUM_THREADS`` threads each, 1 by default, so both modes use
the same cores):

- ``mixed x2``: two ``--splitwise-role mixed`` instances, requests alternating
  between them (round robin, as a router without load information would);
- ``1P1D``: ``--splitwise-role prefill --engine-worker-queue-port P`` and
  ``--splitwise-role decode --innode-prefill-ports P``; every request to the
  decode instance (FastDeploy's single-machine lines).

The same requests (random token prompts, ``--prompt-len`` +-50%) go out at the
same Poisson arrival times in both modes, streaming, greedy, ``ignore_eos``.
It prints TTFT (mean, p50, p90), TPOT, output-token and request throughput
and, for 1P1D, the KV transfer per request (bytes, ms from task sent to KV
written less the prefill side's own queue and compute, from
``usage.kv_transfer_bytes`` / ``kv_transfer_ms``); then the
1P1D / mixed ratios, and the CPU model.

    python benchmarks/pd_disagg.py                               # tiny shape, 32 requests at 4/s
    python benchmarks/pd_disagg.py --shape 0.3b --requests 24 --rate 1 --prompt-len 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str, flags: list[str], log: Path, threads: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
           "--model", model, "--backend", "cpu", "--served-model-name", "m", "--disable-log-requests",
           "--max-model-len", "2048", "--max-num-seqs", "32", "--block-size", "64", *flags]
    env = {**os.environ, "FD_CPU_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "FD_LOG_DIR": str(log.parent / "fd-log")}
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT), port


def wait_ready(instances: list[tuple[subprocess.Popen, int]], logdir: Path) -> None:
    for proc, port in instances:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                sys.exit(f"an instance exited with {proc.returncode}; see {logdir}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"an instance did not come up in 600 s; see {logdir}")
            time.sleep(0.3)


def stop(instances: list[tuple[subprocess.Popen, int]]) -> None:
    for proc, _ in instances:
        proc.terminate()
    for proc, _ in instances:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


async def one(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int, delay: float,
              t0: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = None
    usage: dict = {}
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {await r.aread()!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    first = first or end
    n = int(usage.get("completion_tokens", max_tokens))
    return {"ttft": first - sent, "tpot": (end - first) / max(n - 1, 1), "end": end, "tokens": n,
            "kv_bytes": usage.get("kv_transfer_bytes", 0), "kv_ms": usage.get("kv_transfer_ms", 0.0)}


async def load(urls: list[str], prompts: list[list[int]], delays: list[float], max_tokens: int) -> tuple[list, float]:
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        jobs = [one(client, urls[i % len(urls)], p, max_tokens, d, t0) for i, (p, d) in enumerate(zip(prompts, delays))]
        results = await asyncio.gather(*jobs)
    return results, max(r["end"] for r in results) - t0


def summary(name: str, results: list[dict], wall: float) -> dict:
    ttft = np.array([r["ttft"] for r in results]) * 1000
    out = {"mode": name, "ttft_mean_ms": ttft.mean(), "ttft_p50_ms": np.percentile(ttft, 50),
           "ttft_p90_ms": np.percentile(ttft, 90), "tpot_mean_ms": 1000 * np.mean([r["tpot"] for r in results]),
           "output_tok_s": sum(r["tokens"] for r in results) / wall, "req_s": len(results) / wall, "wall_s": wall,
           "kv_bytes_per_req": np.mean([r["kv_bytes"] for r in results]),
           "kv_ms_mean": np.mean([r["kv_ms"] for r in results])}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tiny-dense", help="generated checkpoint shape (tiny-dense, 0.3b, ...)")
    p.add_argument("--model", default=None, help="a checkpoint directory instead of a generated one")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--rate", type=float, default=4.0, help="Poisson request rate, requests/s")
    p.add_argument("--prompt-len", type=int, default=384)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="FD_CPU_NUM_THREADS of each instance")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds per mode, in ABBA order (the machine's other load spreads over both); "
                        "figures are the median over rounds")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fd-pd-bench-"))
    model = args.model
    if model is None:
        from fd_core.testing.checkpoints import generate_checkpoint

        model = str(generate_checkpoint(work / "ckpt", args.shape))
    from fd_core.models.config import load_config

    vocab = load_config(model).vocab_size
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(max(1, args.prompt_len // 2), args.prompt_len * 3 // 2 + 1, args.requests)
    prompts = [[int(t) for t in rng.integers(100, vocab - 1, n)] for n in lengths]
    delays = np.cumsum(rng.exponential(1 / args.rate, args.requests)).tolist()

    runs: dict[str, list[dict]] = {"mixed x2": [], "1P1D": []}
    order = [m for r in range(args.rounds) for m in (("mixed x2", "1P1D") if r % 2 == 0 else ("1P1D", "mixed x2"))]
    for name in order:
        if name == "mixed x2":
            instances = [start(model, [], work / f"mixed{i}.log", args.threads) for i in range(2)]
            urls = [f"http://127.0.0.1:{port}" for _, port in instances]
        else:
            queue_port = free_port()
            prefill = start(model, ["--splitwise-role", "prefill", "--engine-worker-queue-port", str(queue_port)],
                            work / "prefill.log", args.threads)
            decode = start(model, ["--splitwise-role", "decode", "--innode-prefill-ports", str(queue_port)],
                           work / "decode.log", args.threads)
            instances = [prefill, decode]
            urls = [f"http://127.0.0.1:{decode[1]}"]
        try:
            wait_ready(instances, work)
            asyncio.run(load(urls, prompts[:2], [0.0, 0.0], 2))  # warm every path once
            results, wall = asyncio.run(load(urls, prompts, delays, args.max_tokens))
        finally:
            stop(instances)
        runs[name].append(summary(name, results, wall))
    rows: list[dict[str, Any]] = [{"mode": name, **{k: float(np.median([r[k] for r in rs])) for k in rs[0] if k != "mode"}}
            for name, rs in runs.items()]

    shutil.rmtree(work, ignore_errors=True)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"CPU: {cpu}; {os.cpu_count()} cores visible; {args.threads} thread(s) per instance")
    print(f"checkpoint: {args.model or args.shape}; {args.rounds} round(s) per mode; {args.requests} requests, "
          f"Poisson {args.rate}/s, prompts "
          f"{lengths.min()}-{lengths.max()} tokens (mean {lengths.mean():.0f}), {args.max_tokens} output tokens")
    keys = ["ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "tpot_mean_ms", "output_tok_s", "req_s", "wall_s",
            "kv_bytes_per_req", "kv_ms_mean"]
    print(f"{'':>18}" + "".join(f"{r['mode']:>14}" for r in rows) + f"{'1P1D/mixed':>14}")
    for k in keys:
        a, b = rows[0][k], rows[1][k]
        ratio = f"{b / a:14.2f}" if a else f"{'-':>14}"
        print(f"{k:>18}" + "".join(f"{r[k]:14.2f}" for r in rows) + ratio)


if __name__ == "__main__":
    main()
