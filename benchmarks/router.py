"""fd-router's policies on skewed request sizes: least loaded (and power of two) against round
robin, in the same run, over the same request schedule.

The instances are simulated engines (FastAPI apps, each in its own uvicorn
process): one serves at most ``--slots`` requests at a time, each taking
``max_tokens * --tpot-ms`` milliseconds, and queues the rest; its ``/load``
reports running and waiting as fd-serve's does. This measures the routing
policy, not the engine: the sizes are skewed (``--long-share`` of the
requests ask for ``--long-tokens`` tokens, the rest ``--short-tokens``), so
round robin piles short requests behind long ones while a load-aware policy
goes around them. Requests arrive as a seeded Poisson process at ``--rate``
per second. Printed per policy: mean, p50, p99 end-to-end latency and the
makespan, with each policy's ratio to round robin.

    python benchmarks/router.py
    python benchmarks/router.py --instances 4 --requests 300 --rate 20
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import socket
import statistics
import subprocess
import time
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request

from fd_core.router.app import build_app
from fd_core.router.config import RouterConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(kind: str, port: int, kwargs: dict[str, Any]) -> None:
    """Process target: a simulated engine or the router, on ``port`` until terminated."""
    app = simulated_engine(**kwargs) if kind == "engine" else build_app(RouterConfig(**kwargs))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


class _Process:
    """One server in its own process (its own GIL: the policies are compared, not thread contention)."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(kind, self.port, kwargs),
                                                                 daemon=True)
        self.proc.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or not self.proc.is_alive():
                    raise RuntimeError(f"{kind} did not start on port {self.port}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.join(timeout=10)


def simulated_engine(slots: int, tpot_ms: float) -> FastAPI:
    app = FastAPI()
    state = {"running": 0, "waiting": 0}
    gate: dict[str, asyncio.Semaphore] = {}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/load")
    async def load() -> dict[str, Any]:
        return {"role": "mixed", **state, "free_blocks": 0, "total_blocks": 0, "pd_addr": None}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        sem = gate.setdefault("sem", asyncio.Semaphore(slots))
        state["waiting"] += 1
        async with sem:
            state["waiting"] -= 1
            state["running"] += 1
            try:
                await asyncio.sleep(body["max_tokens"] * tpot_ms / 1000)
            finally:
                state["running"] -= 1
        return {"choices": [{"text": ""}]}

    return app


async def _drive(url: str, schedule: list[tuple[float, int]]) -> tuple[list[float], float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
        start = time.perf_counter()

        async def one(at: float, tokens: int) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
            t0 = time.perf_counter()
            resp = await client.post(url + "/v1/completions", json={"prompt": "p", "max_tokens": tokens})
            resp.raise_for_status()
            latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(at, tokens) for at, tokens in schedule))
        return latencies, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--slots", type=int, default=4, help="requests one simulated engine runs at once")
    p.add_argument("--tpot-ms", type=float, default=10.0)
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--rate", type=float, default=16.0, help="Poisson arrivals per second")
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--long-tokens", type=int, default=400)
    p.add_argument("--long-share", type=float, default=0.1)
    p.add_argument("--policies", nargs="+", default=["round_robin", "request_num", "power_of_two"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    rng = random.Random(args.seed)
    at, schedule = 0.0, []
    for _ in range(args.requests):
        at += rng.expovariate(args.rate)
        schedule.append((at, args.long_tokens if rng.random() < args.long_share else args.short_tokens))
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    print(f"{cpu}\n{args.instances} simulated instances x {args.slots} slots, {args.tpot_ms} ms/token; "
          f"{args.requests} requests at {args.rate}/s, {args.long_share:.0%} of {args.long_tokens} tokens, "
          f"the rest {args.short_tokens}")
    results: dict[str, tuple[float, float, float, float]] = {}
    for policy in args.policies:
        engines = [_Process("engine", slots=args.slots, tpot_ms=args.tpot_ms) for _ in range(args.instances)]
        router = _Process("router", instances=tuple(e.url for e in engines), policy=policy,
                          load_poll_interval_secs=0.1, health_check_interval_secs=5)
        try:
            time.sleep(0.3)  # the first /load poll
            lat, span = asyncio.run(_drive(router.url, schedule))
        finally:
            router.stop()
            for e in engines:
                e.stop()
        lat.sort()
        results[policy] = (statistics.mean(lat), lat[len(lat) // 2], lat[int(0.99 * (len(lat) - 1))], span)
    base = results.get("round_robin")
    print(f"{'policy':<14}{'mean s':>9}{'p50 s':>9}{'p99 s':>9}{'makespan':>10}  vs round_robin (mean, p99)")
    for policy, (mean, p50, p99, span) in results.items():
        ratio = f"  {mean / base[0]:.2f}x, {p99 / base[2]:.2f}x" if base else ""
        print(f"{policy:<14}{mean:9.3f}{p50:9.3f}{p99:9.3f}{span:10.2f}{ratio}")


if __name__ == "__main__":
    main()
