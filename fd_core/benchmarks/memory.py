"""Engine memory over many requests: does RSS stay flat?

    python -m fd_core.benchmarks.memory                       # offline engine, 10,000 requests
    python -m fd_core.benchmarks.memory --engine mp           # the server's engine process
    python -m fd_core.benchmarks.memory --model DIR --requests 20000 --trim

Drives thousands of short requests of every kind (greedy, seeded and
unseeded sampling, logprobs, prompt logprobs, stop strings, n=2, penalties
and bad words, aborts after the first token) through the in-process
``LLMEngine`` (``--engine offline``) or through ``MPEngineClient`` and its
engine process (``--engine mp``, what ``fd-serve`` runs). After
``--warmup`` requests it reads VmRSS from /proc (the engine process's in mp
mode) every ``--requests / 20`` requests, prints it at 0/25/50/75/100 %,
and fits a line: the slope is the growth in bytes per request. The verdict
is "flat" when the slope is below ``--threshold`` bytes per request.

glibc's mmap threshold is fixed at ``--mmap-threshold`` (1 MiB) for the run
(``MALLOC_MMAP_THRESHOLD_`` for the engine process). With glibc's default,
dynamic threshold, each time a large block (a big step's logits) is freed
the threshold rises and later large blocks come from the heap, whose
high-water mark then only grows with the rarest largest steps: RSS rises by
a few MiB over the first thousands of requests and then stays, though the
memory in use does not grow. Fixing it makes RSS show what is held.

Without ``--model`` it generates the tiny dense test checkpoint in a
temporary directory. ``--trim`` (offline) calls glibc's ``malloc_trim`` before
each reading, so heap pages that are free but not yet returned to the OS do
not count: growth left with it is memory still held, growth gone with it was
allocator slack. Exit status 1 when the verdict is "growing".
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MemoryResult", "fix_mmap_threshold", "main", "measure", "report", "request_plan", "rss_bytes"]

_WORDS = ("the a cat dog runs fast slow over under hello world paddle engine token cache "
          "model river stone light dark green blue one two three").split()
_NUM_SAMPLES = 20  # readings after warm-up, besides the first


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
_MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"  # the same, read by glibc when a process starts


def fix_mmap_threshold(threshold: int) -> bool:
    """Serve allocations of ``threshold`` bytes or more by mmap from now on (and in
    processes started from here), instead of glibc's dynamic threshold, which rises
    after a large block is freed so that later large blocks grow the heap. Returns
    whether this process took it (False without glibc)."""
    os.environ[_MMAP_ENV] = str(threshold)
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class PlannedRequest:
    prompt: str
    params: Any  # SamplingParams
    abort_after_first: bool = False


def request_plan(index: int, rng: random.Random) -> PlannedRequest:
    """Request ``index`` of the workload: a short prompt and one of eight kinds."""
    from fd_core.sampling.params import SamplingParams

    prompt = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 40)))
    base: dict[str, Any] = {"max_tokens": rng.randint(2, 6), "ignore_eos": True}
    kind = index % 8
    if kind == 0:
        params = SamplingParams(temperature=0, **base)
    elif kind == 1:
        params = SamplingParams(temperature=0.8, top_p=0.9, seed=index, **base)
    elif kind == 2:
        params = SamplingParams(temperature=1.0, top_k=20, logprobs=2, **base)
    elif kind == 3:
        params = SamplingParams(temperature=0.7, stop=["e", "a "], **base)
    elif kind == 4:
        params = SamplingParams(temperature=0.9, n=2, seed=index, **base)
    elif kind == 5:
        params = SamplingParams(temperature=0.5, repetition_penalty=1.2, presence_penalty=0.3,
                                bad_words=["cat"], **base)
    elif kind == 6:
        params = SamplingParams(temperature=0, prompt_logprobs=1, **base)
    else:
        params = SamplingParams(temperature=0.6, **{**base, "max_tokens": 8})
    return PlannedRequest(prompt, params, abort_after_first=kind == 7)


@dataclass
class MemoryResult:
    engine: str  # "offline" or "mp"
    requests: int
    warmup: int
    samples: list[tuple[int, int]] = field(default_factory=list)  # (requests after warm-up, RSS bytes)
    api_samples: list[tuple[int, int]] = field(default_factory=list)  # mp: the client process's RSS
    seconds: float = 0.0

    @staticmethod
    def slope(samples: list[tuple[int, int]]) -> float:
        """Least-squares growth in bytes per request."""
        n = len(samples)
        if n < 2:
            return 0.0
        mx = sum(x for x, _ in samples) / n
        my = sum(y for _, y in samples) / n
        var = sum((x - mx) ** 2 for x, _ in samples)
        return sum((x - mx) * (y - my) for x, y in samples) / var if var else 0.0

    @property
    def bytes_per_request(self) -> float:
        return self.slope(self.samples)


class _Sampler:
    """Reads RSS every ``every`` finished requests after warm-up."""

    def __init__(self, result: MemoryResult, read: Callable[[], int], api: bool, trim: bool) -> None:
        self.result, self.read, self.api, self.trim = result, read, api, trim
        self.every = max(1, result.requests // _NUM_SAMPLES)

    def maybe_sample(self, done: int) -> None:
        measured = done - self.result.warmup
        if measured < 0 or measured % self.every or measured > self.result.requests:
            return
        gc.collect()
        if self.trim:
            _malloc_trim()
        self.result.samples.append((measured, self.read()))
        if self.api:
            self.result.api_samples.append((measured, rss_bytes()))


def _engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(backend=args.backend, max_model_len=256, max_num_seqs=args.concurrency * 2,
                num_gpu_blocks_override=args.num_blocks, block_size=16)


def _run_offline(model: str, args: argparse.Namespace, result: MemoryResult) -> None:
    from fd_core.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model, **_engine_kwargs(args))
    sampler = _Sampler(result, rss_bytes, api=False, trim=args.trim)
    rng = random.Random(args.seed)
    total = result.warmup + result.requests
    started = done = 0
    in_flight: dict[str, PlannedRequest] = {}
    while done < total:
        while len(in_flight) < args.concurrency and started < total:
            plan = request_plan(started, rng)
            rid = f"mem-{started}"
            engine.add_request(rid, plan.prompt, plan.params)
            in_flight[rid] = plan
            started += 1
        for out in engine.step():
            plan = in_flight[out.request_id]
            if plan.abort_after_first and not out.finished:
                engine.abort_request(out.request_id)
            elif not out.finished:
                continue
            del in_flight[out.request_id]
            done += 1
            sampler.maybe_sample(done)


async def _run_mp(model: str, args: argparse.Namespace, result: MemoryResult) -> None:
    from fd_core.config import EngineArgs
    from fd_core.engine.mp_engine import MPEngineClient

    client = MPEngineClient(EngineArgs.from_kwargs(model, **_engine_kwargs(args)))
    pid = client.process.pid
    sampler = _Sampler(result, lambda: rss_bytes(pid), api=True, trim=False)
    rng = random.Random(args.seed)
    plans = [request_plan(i, rng) for i in range(result.warmup + result.requests)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(plans)):
        queue.put_nowait(i)
    done = 0

    async def worker() -> None:
        nonlocal done
        while not queue.empty():
            i = queue.get_nowait()
            plan = plans[i]
            stream = client.generate(f"mem-{i}", plan.prompt, plan.params)
            try:
                async for out in stream:
                    if plan.abort_after_first or out.finished:
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]  # an abort when it broke off early
            done += 1
            sampler.maybe_sample(done)

    try:
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    finally:
        await client.shutdown()


def measure(args: argparse.Namespace) -> MemoryResult:
    """Run the workload described by ``args`` (see ``build_parser``)."""
    result = MemoryResult(args.engine, args.requests, args.warmup)
    saved_env = os.environ.get(_MMAP_ENV)
    if args.mmap_threshold:
        fix_mmap_threshold(args.mmap_threshold)  # this process keeps it; the environment is restored
    try:
        _measure(args, result)
    finally:
        if saved_env is None:
            os.environ.pop(_MMAP_ENV, None)
        else:
            os.environ[_MMAP_ENV] = saved_env
    return result


def _measure(args: argparse.Namespace, result: MemoryResult) -> None:
    with tempfile.TemporaryDirectory(prefix="fd-bench-memory-") as tmp:
        model = args.model
        if model is None:
            from fd_core.testing.checkpoints import generate_checkpoint

            model = str(generate_checkpoint(os.path.join(tmp, "tiny-dense"), "tiny-dense"))
        start = time.perf_counter()
        if args.engine == "offline":
            _run_offline(model, args, result)
        else:
            asyncio.run(_run_mp(model, args, result))
        result.seconds = time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fd_core.benchmarks.memory",
                                description="engine RSS over many short requests")
    p.add_argument("--engine", choices=("offline", "mp"), default="offline",
                   help="the in-process LLMEngine, or the engine process fd-serve runs (default offline)")
    p.add_argument("--model", default=None, help="model directory (default: a generated tiny-dense checkpoint)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--requests", type=int, default=10_000, help="measured requests (default 10000)")
    p.add_argument("--warmup", type=int, default=2_000, help="requests before the first reading (default 2000)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    p.add_argument("--num-blocks", type=int, default=256, help="KV cache blocks of 16 tokens (default 256)")
    p.add_argument("--threshold", type=float, default=400.0,
                   help="bytes per request below which RSS counts as flat (default 400)")
    p.add_argument("--mmap-threshold", type=int, default=1 << 20,
                   help="glibc mmap threshold in bytes for this run (default 1 MiB; 0: glibc's dynamic one)")
    p.add_argument("--trim", action="store_true", help="malloc_trim before each reading (offline only)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _check(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    for name in ("requests", "concurrency", "num_blocks"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.mmap_threshold < 0:
        p.error(f"--warmup and --mmap-threshold must be >= 0, got {args.warmup} and {args.mmap_threshold}")
    if args.trim and args.engine != "offline":
        p.error("--trim works with --engine offline only (the engine process cannot be trimmed from here)")


def report(result: MemoryResult, threshold: float) -> str:
    """The table at 0/25/50/75/100 % and the verdict."""
    lines = [f"engine: {result.engine}; {result.requests} requests after {result.warmup} warm-up "
             f"({result.seconds:.0f} s)"]
    quarter = {round(result.requests * q / 4) for q in range(5)}
    extra = dict(result.api_samples)
    lines.append(f"{'requests':>9}  {'engine RSS MiB':>14}" + (f"  {'API RSS MiB':>15}" if extra else ""))
    for done, rss in result.samples:
        if done in quarter or done == result.samples[-1][0]:
            row = f"{done:>9}  {rss / 2**20:>14.1f}"
            lines.append(row + (f"  {extra[done] / 2**20:>15.1f}" if extra else ""))
    first, last = result.samples[0], result.samples[-1]
    lines.append(f"RSS growth: {result.bytes_per_request:.0f} B/request (least squares over "
                 f"{len(result.samples)} readings); {(last[1] - first[1]) / 2**20:+.1f} MiB first to last")
    if result.api_samples:
        lines.append(f"API process RSS growth: {MemoryResult.slope(result.api_samples):.0f} B/request")
    verdict = "flat" if result.bytes_per_request < threshold else "growing"
    lines.append(f"verdict: {verdict} (threshold {threshold:.0f} B/request)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check(args, p)
    result = measure(args)
    print(report(result, args.threshold))
    return 0 if result.bytes_per_request < args.threshold else 1


if __name__ == "__main__":
    sys.exit(main())
