"""Soak a running fd-serve: mixed traffic for a while, then check that nothing was lost.

    python -m fd_core.testing.soak --url http://127.0.0.1:8000 --seconds 1800 --pid <fd-serve pid>

Traffic (``soak_requests``): ``--clients`` loops of chat and completions,
streaming or not, n > 1, several prompts, logprobs, prompt_logprobs, stop
strings, seeded and greedy sampling; some streams are closed by the client
mid-generation; a share of hostile requests (wrong types, lists beyond the
limits, lone surrogates, over-long prompts, unknown fields, oversized bodies)
that must get a 4xx; ``--slow-uploads`` connections that send part of a body
and stall (closing, or waiting for the server's 408) or trickle a whole body
in; /health and /metrics polled throughout.

Two phases: warm-up, then the measured run. After each the traffic stops and
the server must come back to idle (running and waiting gauges 0, KV cache
usage 0); the resident memory of the server's processes (``--pid`` and its
tree) is sampled every 10 s; over the measured run each process may grow by
at most ``--rss-growth-mib`` (medians of the first and last quarter of the
samples), and the set of processes must not change.

Every request ends in exactly one outcome: answered as it must be, a
disconnect the soak caused, or a problem (a 5xx, a wrong status, a transport
error or timeout we did not cause, an answer without finish_reason or with
missing logprobs, a greedy answer that differs from an earlier one). The
report lists the problems; exit code 0 when there are none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from fd_core.testing import process_tree
from fd_core.testing.soak_client import GoodClient, raw_request, slow_upload
from fd_core.testing.soak_requests import HOSTILE_NAMES, hostile_request, random_job

__all__ = ["SoakConfig", "SoakReport", "idle_gauges", "main", "run_soak"]

IDLE_GAUGES = ("fastdeploy:num_requests_running", "fastdeploy:num_requests_waiting",
               "fastdeploy:gpu_cache_usage_perc")
MIB = 1 << 20
RSS_EVERY = 10  # seconds between the timeline's RSS samples


@dataclass
class SoakConfig:
    url: str
    seconds: float
    clients: int = 8
    model: str = "tiny"
    seed: int = 0
    max_model_len: int = 2048
    max_body_bytes: int | None = None  # None: the server's, from /config-info
    body_timeout: float = 30.0  # the server's request-body timeout: stalled uploads wait this long for a 408
    hostile_rate: float = 0.15
    disconnect_rate: float = 0.15
    slow_uploads: int = 4  # connections uploading slowly at any time
    warmup: float | None = None  # None: a fifth of ``seconds``, at most 300 s
    settle: float = 60.0  # seconds the server has to come back to idle after traffic stops
    request_timeout: float = 300.0  # a request not answered by then is lost
    pid: int | None = None  # the server's main process: RSS of it and its tree
    rss_growth_mib: float = 32.0


@dataclass
class SoakReport:
    outcomes: Counter[str] = field(default_factory=Counter)  # "<kind> <outcome>" -> count
    problems: list[str] = field(default_factory=list)
    idle: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> gauge -> value
    rss: dict[str, dict[int, int]] = field(default_factory=dict)  # phase -> pid -> bytes
    commands: dict[int, str] = field(default_factory=dict)  # pid -> cmdline
    requests: dict[str, int] = field(default_factory=dict)  # phase -> requests finished in it
    # every RSS_EVERY s under traffic: (phase, seconds since start, requests finished, pid -> RSS)
    timeline: list[tuple[str, float, int, dict[int, int]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def rss_growth(self) -> dict[int, int]:
        """pid -> bytes grown under the measured traffic: the median of the last quarter of
        its samples less the median of the first quarter (medians: RSS swings by tens of MiB
        from one sample to the next as allocators take and keep memory; a leak moves the
        whole band). With too few samples: the idle point at the end less the one after warm-up."""
        samples = [rss for phase, _, _, rss in self.timeline if phase == "end"]
        if len(samples) >= 8:
            k = len(samples) // 4
            first, last = samples[:k], samples[-k:]
            return {pid: int(statistics.median(s[pid] for s in last) - statistics.median(s[pid] for s in first))
                    for pid in first[0] if all(pid in s for s in first + last)}
        warm, end = self.rss.get("warm", {}), self.rss.get("end", {})
        return {pid: end[pid] - warm[pid] for pid in warm if pid in end}

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems[:200], "problem_count": len(self.problems),
                "outcomes": dict(sorted(self.outcomes.items())), "idle": self.idle, "requests": self.requests,
                "rss_mib": {phase: {str(p): round(b / MIB, 1) for p, b in v.items()} for phase, v in self.rss.items()},
                "rss_growth_mib": {str(p): round(b / MIB, 2) for p, b in self.rss_growth().items()},
                "commands": {str(p): c[:120] for p, c in self.commands.items()},
                "timeline_mib": [(phase, round(t), n, {str(p): round(b / MIB, 1) for p, b in rss.items()})
                                 for phase, t, n, rss in self.timeline]}


def idle_gauges(metrics_text: str) -> dict[str, float]:
    """The idle gauges' values in a /metrics page (missing ones are absent)."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        if series in IDLE_GAUGES:
            out[series] = float(value)
    return out


class _Soak:
    def __init__(self, cfg: SoakConfig, http: httpx.AsyncClient, max_body: int) -> None:
        self.cfg = cfg
        self.http = http
        self.max_body = max_body
        self.report = SoakReport()
        self.rng = random.Random(cfg.seed)
        self.good = GoodClient(http, cfg.url, cfg.request_timeout, self._outcome, self._problem)
        self.stop_at = 0.0
        self.finished = 0
        self.started = time.monotonic()
        self.phase_name = ""

    def _outcome(self, kind: str, outcome: str) -> None:
        self.report.outcomes[f"{kind} {outcome}"] += 1
        self.finished += 1

    def _problem(self, kind: str, message: str) -> None:
        self.report.outcomes[f"{kind} problem"] += 1
        self.report.problems.append(f"{kind}: {message}")
        self.finished += 1

    async def phase(self, name: str, seconds: float) -> None:
        """Traffic for ``seconds``, then wait for every request to end and the server to idle."""
        self.stop_at = time.monotonic() + seconds
        self.phase_name = name
        start = self.finished
        loops = [self._client(i) for i in range(self.cfg.clients)]
        loops += [self._uploader(i) for i in range(self.cfg.slow_uploads)]
        tasks = [asyncio.create_task(c) for c in loops]
        poller = asyncio.create_task(self._poll())
        # every request has request_timeout; a stalled upload body_timeout and a margin
        _, pending = await asyncio.wait(tasks, timeout=seconds + self.cfg.request_timeout + self.cfg.body_timeout + 60)
        for t in pending:
            t.cancel()
            self._problem("driver", f"a client loop was still running {self.cfg.request_timeout:g} s after {name}")
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                self._problem("driver", f"a client loop failed: {t.exception()!r}")
        poller.cancel()
        self.report.requests[name] = self.finished - start
        await self._settle(name)

    async def _client(self, index: int) -> None:
        rng = random.Random(self.rng.random())
        while time.monotonic() < self.stop_at:
            if rng.random() < self.cfg.hostile_rate:
                await self._hostile(rng.choice(HOSTILE_NAMES))
            else:
                await self.good.run(random_job(rng, self.cfg.model, self.cfg.disconnect_rate))

    async def _hostile(self, name: str) -> None:
        path, body, headers = hostile_request(name, self.cfg.model, self.cfg.max_model_len, self.max_body)
        try:
            status, text = await raw_request(self.cfg.url, path, body, headers, timeout=self.cfg.request_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            self._problem("hostile", f"{name}: no answer ({exc!r})")
            return
        if 400 <= status < 500:
            self._outcome("hostile", str(status))
        else:
            self._problem("hostile", f"{name}: HTTP {status} (a 4xx was due): {text[:300]!r}")

    async def _uploader(self, index: int) -> None:
        rng = random.Random(self.rng.random())
        while time.monotonic() < self.stop_at:
            # waiting for the 408 only while the phase lasts long enough for it
            may_wait = self.stop_at - time.monotonic() > self.cfg.body_timeout + 15
            mode = rng.choice(("close", "close", "trickle") + (("timeout",) if may_wait else ()))
            outcome = await slow_upload(self.cfg.url, self.cfg.model, mode, rng, self.cfg.body_timeout)
            if outcome.startswith("problem"):
                self._problem(f"upload-{mode}", outcome)
            else:
                self._outcome(f"upload-{mode}", outcome)

    async def _poll(self) -> None:
        tick = 0
        while True:
            path = "/metrics" if tick % 5 == 0 else "/health"
            tick += 1
            try:
                resp = await self.http.get(self.cfg.url + path, timeout=30)
            except httpx.HTTPError as exc:
                self._problem("poll", f"GET {path}: {exc!r}")
            else:
                if resp.status_code != 200:
                    self._problem("poll", f"GET {path}: HTTP {resp.status_code}")
                else:
                    self.report.outcomes[f"poll {path}"] += 1
            if self.cfg.pid is not None and tick % RSS_EVERY == 0:
                pids = [self.cfg.pid, *process_tree.descendants(self.cfg.pid)]
                rss = {p: b for p in pids if (b := process_tree.rss_bytes(p)) is not None}
                self.report.timeline.append((self.phase_name, time.monotonic() - self.started, self.finished, rss))
            await asyncio.sleep(1.0)

    async def _settle(self, phase: str) -> None:
        deadline = time.monotonic() + self.cfg.settle
        gauges: dict[str, float] = {}
        while True:
            try:
                gauges = idle_gauges((await self.http.get(self.cfg.url + "/metrics", timeout=30)).text)
            except httpx.HTTPError as exc:
                gauges = {"error": 1.0}
                self._problem("settle", f"/metrics after {phase}: {exc!r}")
            if all(gauges.get(g) == 0 for g in IDLE_GAUGES) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        self.report.idle[phase] = gauges
        if not all(gauges.get(g) == 0 for g in IDLE_GAUGES):
            self.report.problems.append(f"settle: not idle {self.cfg.settle:g} s after {phase}: {gauges}")
        if self.cfg.pid is not None:
            pids = [self.cfg.pid, *process_tree.descendants(self.cfg.pid)]
            self.report.rss[phase] = {p: b for p in pids if (b := process_tree.rss_bytes(p)) is not None}
            self.report.commands.update({p: process_tree.cmdline(p) for p in pids})

    def check_rss(self) -> None:
        limit = self.cfg.rss_growth_mib * MIB
        for pid, grown in self.report.rss_growth().items():
            if grown > limit:
                self.report.problems.append(
                    f"rss: pid {pid} ({self.report.commands.get(pid, '')[:80]}) grew {grown / MIB:.1f} MiB "
                    f"over {self.report.requests.get('end', 0)} requests (limit {self.cfg.rss_growth_mib:g} MiB)")
        if self.cfg.pid is not None and set(self.report.rss.get("warm", {})) != set(self.report.rss.get("end", {})):
            self.report.problems.append(f"rss: the server's processes changed during the soak: "
                                        f"{sorted(self.report.rss.get('warm', {}))} -> "
                                        f"{sorted(self.report.rss.get('end', {}))}")


async def _max_body_bytes(http: httpx.AsyncClient, url: str) -> int:
    """The server's --max-request-body-bytes, from /config-info (its documented default,
    16 MiB + 64 bytes per --max-model-len token, when unset there): read as any client would."""
    info = (await http.get(url + "/config-info", timeout=30)).json()
    args = info.get("server_args", {})
    value = args.get("max_request_body_bytes")
    if value:
        return int(value)
    max_len = info.get("engine_args", {}).get("max_model_len") or args.get("max_model_len") or 2048
    return (16 << 20) + 64 * int(max_len)


async def run_soak(cfg: SoakConfig) -> SoakReport:
    """Soak the server at ``cfg.url``; returns the report (``report.ok``: no problem found)."""
    limits = httpx.Limits(max_connections=cfg.clients * 2 + 8, max_keepalive_connections=cfg.clients)
    async with httpx.AsyncClient(limits=limits, timeout=cfg.request_timeout) as http:
        max_body = cfg.max_body_bytes or await _max_body_bytes(http, cfg.url)
        soak = _Soak(cfg, http, max_body)
        warmup = cfg.warmup if cfg.warmup is not None else min(300.0, cfg.seconds / 5)
        await soak.phase("warm", warmup)
        await soak.phase("end", max(1.0, cfg.seconds - warmup))
        soak.check_rss()
        return soak.report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fd_core.testing.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--seconds", type=float, default=1800.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--model", default="tiny", help="a served model name")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=2048, help="the server's (for over-long prompts)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="the server's (default: from /config-info)")
    p.add_argument("--body-timeout", type=float, default=30.0, help="the server's request-body timeout")
    p.add_argument("--slow-uploads", type=int, default=4)
    p.add_argument("--warmup", type=float, default=None)
    p.add_argument("--pid", type=int, default=None, help="fd-serve's pid: check the RSS of its process tree")
    p.add_argument("--rss-growth-mib", type=float, default=32.0)
    ns = p.parse_args(argv)
    for name in ("seconds", "clients", "max_model_len", "body_timeout", "rss_growth_mib"):
        if getattr(ns, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(ns, name)}")
    cfg = SoakConfig(url=ns.url.rstrip("/"), seconds=ns.seconds, clients=ns.clients, model=ns.model, seed=ns.seed,
                     max_model_len=ns.max_model_len, max_body_bytes=ns.max_body_bytes, body_timeout=ns.body_timeout,
                     slow_uploads=ns.slow_uploads, warmup=ns.warmup, pid=ns.pid, rss_growth_mib=ns.rss_growth_mib)
    report = asyncio.run(run_soak(cfg))
    print(json.dumps(report.as_dict(), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
