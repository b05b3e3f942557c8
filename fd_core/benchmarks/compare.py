"""A same-run baseline: one workload through HF transformers ``generate`` and through fd-serve.

The workload is ``N`` token-id prompts with seeded lengths (input and output
uniform in given ranges) and Poisson arrival offsets (gamma with shape
``burstiness``). Both sides see the same prompts at the same offsets:

- HF baseline (``run_hf``), as a user without a serving engine would run it:
  CPU torch, fp32; a loop that waits for the next arrival, takes every request
  that has arrived (at most ``max_batch``) and runs ONE static, left-padded,
  greedy ``generate`` to the batch's longest output (``min_new_tokens =
  max_new_tokens``, so eos is ignored). A request counts only its own output
  length as output tokens; it completes when ``generate`` returns (the batch
  end), since that is when its caller gets it. TTFT is measured from the
  request's arrival (so it includes waiting for the previous batch, as a
  server's TTFT includes its queue) to the end of the batch's first decoding
  step, timed by a ``StoppingCriteria`` that runs after every step; ITL are the
  step gaps of its own tokens (what a streamer would show).
- fd-core (``run_server``): ``fd-serve`` in a subprocess on the same checkpoint
  (``ServerProcess``), every request sent at its offset over streaming
  ``/v1/completions`` with ``ignore_eos`` and ``max_tokens`` = its output
  length, timed by ``fd_core.benchmarks.serve.send_request``.

``compare_table`` prints both sides' metrics and the fd-core / HF ratios.
Nothing here imports torch or paddle at module level.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.benchmarks.datasets import SampleRequest
from fd_core.benchmarks.metrics import RequestRecord, ServingMetrics
from fd_core.benchmarks.serve import send_request

__all__ = ["ServerProcess", "Workload", "build_workload", "compare_table", "run_hf", "run_server",
           "usable_cores"]

_FIRST_PLAIN_ID = 100  # below this, vocabularies keep their special tokens


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass
class Workload:
    prompts: list[list[int]]  # token ids
    output_lens: list[int]  # tokens to generate per request
    arrivals: list[float]  # seconds after the run starts, non-decreasing; the first is 0

    def __len__(self) -> int:
        return len(self.prompts)


def build_workload(num: int, request_rate: float, vocab_size: int, input_range: tuple[int, int] = (64, 512),
                   output_range: tuple[int, int] = (32, 256), seed: int = 0,
                   burstiness: float = 1.0) -> Workload:
    """``num`` requests; lengths uniform in the (inclusive) ranges; ``inf`` rate sends all at 0."""
    if num < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num}")
    if not request_rate > 0 or not burstiness > 0:
        raise ValueError(f"--request-rate and --burstiness must be > 0, got {request_rate} and {burstiness}")
    for name, (lo, hi) in (("input", input_range), ("output", output_range)):
        if not 1 <= lo <= hi:
            raise ValueError(f"--{name}-len range must satisfy 1 <= MIN <= MAX, got [{lo}, {hi}]")
    if vocab_size <= _FIRST_PLAIN_ID:
        raise ValueError(f"vocab_size must be > {_FIRST_PLAIN_ID}, got {vocab_size}")
    rng = np.random.default_rng(seed)
    inputs = rng.integers(input_range[0], input_range[1] + 1, size=num)
    outputs = rng.integers(output_range[0], output_range[1] + 1, size=num)
    prompts = [rng.integers(_FIRST_PLAIN_ID, vocab_size, size=int(n)).tolist() for n in inputs]
    if math.isfinite(request_rate):
        gaps = rng.gamma(burstiness, 1.0 / (request_rate * burstiness), size=num - 1)
        arrivals = [0.0, *np.cumsum(gaps).tolist()]
    else:
        arrivals = [0.0] * num
    return Workload(prompts, [int(n) for n in outputs], arrivals)


# ------------------------------------------------------------------ HF baseline


def run_hf(model_dir: str | Path, workload: Workload, threads: int | None = None, max_batch: int = 64,
           warmup: bool = True, decode: Callable[[list[int]], str] | None = None,
           log: Callable[[str], None] = print) -> tuple[list[RequestRecord], float, list[dict[str, Any]]]:
    """Run ``workload`` through HF ``generate`` in arrival-driven static batches.

    Returns (records, duration s, one dict per batch: size, padded input length,
    new tokens, seconds). With ``decode``, ``record.generated_text`` is the text
    of the request's own output tokens, for cross-checking against fd-core.
    """
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

    torch.set_num_threads(threads or usable_cores())
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    pad_id = int(model.config.pad_token_id or 0)

    class StepTimes(StoppingCriteria):  # called once per decoding step, after the new token
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def generate(prompts: Sequence[list[int]], new_tokens: int) -> tuple[Any, list[float]]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every prompt ends at the last column
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        timer = StepTimes()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
                                 stopping_criteria=StoppingCriteriaList([timer]), temperature=None,
                                 top_p=None, top_k=None)
        return out[:, width:], timer.times

    if warmup:
        generate([workload.prompts[0][:16]] * 2, 2)
    records: list[RequestRecord] = [RequestRecord() for _ in range(len(workload))]
    batches = []
    t0 = time.perf_counter()
    i = 0
    while i < len(workload):
        wait = t0 + workload.arrivals[i] - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        now = time.perf_counter() - t0
        j = i
        while j < len(workload) and j - i < max_batch and workload.arrivals[j] <= now:
            j += 1
        new_tokens = max(workload.output_lens[i:j])
        start = time.perf_counter()
        tokens, steps = generate(workload.prompts[i:j], new_tokens)
        end = time.perf_counter()
        for k in range(i, j):
            own = workload.output_lens[k]
            arrival = t0 + workload.arrivals[k]
            records[k] = RequestRecord(
                success=True, prompt_len=len(workload.prompts[k]), output_len=own,
                ttft=steps[0] - arrival, itl=np.diff(steps[:own]).tolist(), chunk_tokens=[1] * own,
                latency=end - arrival, start_time=workload.arrivals[k],
                generated_text=decode(tokens[k - i, :own].tolist()) if decode else "")
        batches.append({"size": j - i, "padded_input_len": max(len(p) for p in workload.prompts[i:j]),
                        "new_tokens": new_tokens, "seconds": end - start})
        log(f"  HF batch {len(batches)}: {j - i} request(s), {new_tokens} new tokens, {end - start:.1f} s "
            f"({j}/{len(workload)} done)")
        i = j
    duration = time.perf_counter() - t0
    return records, duration, batches


# ------------------------------------------------------------------ fd-core server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``fd-serve`` in a subprocess on a free port; a context manager that stops it (SIGINT)."""

    def __init__(self, model_dir: str | Path, args: Sequence[str], log_path: str | Path,
                 ready_timeout: float = 600.0) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.args = ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        import httpx

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        code = "import sys; from fd_core.entrypoints.cli import serve_main; sys.exit(serve_main(sys.argv[1:]))"
        self.proc = subprocess.Popen([sys.executable, "-c", code, *self.args], stdout=self._log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._close()
                raise RuntimeError(f"fd-serve exited with {self.proc.returncode} before it was ready; "
                                   f"its log ({self.log_path}):\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self._close()
        raise RuntimeError(f"fd-serve was not ready in {self.ready_timeout:.0f} s; see {self.log_path}")

    def _close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __exit__(self, *exc: Any) -> None:
        self._close()


def completion_payload(model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """Greedy streaming /v1/completions body that runs to ``max_tokens`` and returns token ids."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


async def _drive(url: str, model: str, workload: Workload, timeout: float,
                 warmup: bool) -> tuple[list[RequestRecord], float]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits, trust_env=False) as client:
        def send(k: int) -> Any:
            prompt, out_len = workload.prompts[k], workload.output_lens[k]
            req = SampleRequest(prompt, len(prompt), out_len)
            return send_request(client, url, completion_payload(model, prompt, out_len), {}, req)

        if warmup:
            warm = await send_request(client, url, completion_payload(model, workload.prompts[0][:16], 2), {},
                                      SampleRequest(workload.prompts[0][:16], 16, 2))
            if not warm.success:
                raise ConnectionError(f"the warm-up request to {url} failed: {warm.error}")
        t0 = time.perf_counter()

        async def one(k: int) -> RequestRecord:
            await asyncio.sleep(max(0.0, t0 + workload.arrivals[k] - time.perf_counter()))
            rec = await send(k)
            rec.start_time = workload.arrivals[k]
            return rec

        records = list(await asyncio.gather(*(one(k) for k in range(len(workload)))))
        return records, time.perf_counter() - t0


def run_server(base_url: str, model: str, workload: Workload, timeout: float = 6 * 3600.0,
               warmup: bool = True) -> tuple[list[RequestRecord], float]:
    """Send every request at its arrival offset to a running server; returns (records, duration s)."""
    return asyncio.run(_drive(base_url.rstrip("/") + "/v1/completions", model, workload, timeout, warmup))


# ------------------------------------------------------------------ report

_ROWS = (  # (label, key in ServingMetrics.to_dict(), higher is better)
    ("Successful requests", "completed", True),
    ("Benchmark duration (s)", "duration", False),
    ("Request throughput (req/s)", "request_throughput", True),
    ("Output token throughput (tok/s)", "output_throughput", True),
    ("Total token throughput (tok/s)", "total_token_throughput", True),
    *((f"{stat.capitalize()} {name.upper()} (ms)", f"{stat}_{name}_ms", False)
      for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")),
)


def compare_table(hf: ServingMetrics, fd: ServingMetrics) -> tuple[str, dict[str, float]]:
    """Side-by-side table and the fd-core / HF ratio of every row (key -> ratio)."""
    a, b = hf.to_dict(), fd.to_dict()
    lines = [f"{' HF transformers vs fd-core (same workload) ':=^86}",
             f"{'':<34}{'HF generate':>14}{'fd-core':>14}{'fd-core / HF':>14}  better"]
    ratios: dict[str, float] = {}
    for label, key, higher in _ROWS:
        x, y = float(a[key]), float(b[key])
        ratio = y / x if x else math.inf
        ratios[key] = ratio
        fmt = "{:>14d}" if key == "completed" else "{:>14.2f}"
        lines.append(f"{label:<34}{fmt.format(int(x) if key == 'completed' else x)}"
                     f"{fmt.format(int(y) if key == 'completed' else y)}{ratio:>14.2f}  "
                     f"{'higher' if higher else 'lower'}")
    lines.append("=" * 86)
    return "\n".join(lines), ratios
