"""llama.cpp's side of ``benchmarks/llama_cpp.py``: decode, prefill and greedy tokens of one GGUF.

- decode tok/s at each batch size: ``llama-batched-bench`` (prompts not
  shared: B sequences of ``prompt_len`` tokens each, then ``decode_tokens``
  steps; ``speed_tg`` = B x decode tokens / decode time), JSONL output;
- prefill tok/s of one prompt: ``llama-bench -p N -n 0`` (``avg_ts``);
- greedy tokens: ``llama-server`` ``/completion`` with token-id prompts,
  ``temperature`` 0 and ``top_k`` 1, ``ignore_eos``, no prompt cache;
- sampled decode tok/s at B=1 (``benchmarks/llama_cpp_sampled.py``): ``llama-server`` ``/completion``,
  temperature then top-p, the server's ``timings.predicted_per_second``.

Every tool runs with ``-t threads`` and its defaults otherwise (flash
attention ``auto``, batch 2048, micro-batch 512): what a user gets.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from llama_cpp_build import LlamaCpp

__all__ = ["batched_decode", "greedy_tokens", "parse_batched_jsonl", "parse_bench_json", "prefill", "sampled_decode",
           "server"]


def parse_batched_jsonl(text: str) -> dict[int, float]:
    """``llama-batched-bench --output-format jsonl`` stdout -> {parallel sequences: decode tok/s}.

    Rows are found anywhere in the text: a log line may share stdout with them.
    """
    rates: dict[int, float] = {}
    for row in map(json.loads, re.findall(r'\{[^{}]*"speed_tg"[^{}]*\}', text)):
        rates.setdefault(int(row["pl"]), float(row["speed_tg"]))  # the first row of a repeated B
    if not rates:
        raise ValueError(f"no JSONL rows with speed_tg in llama-batched-bench output: {text[-500:]!r}")
    return rates


def parse_bench_json(text: str) -> float:
    """``llama-bench -o json`` stdout (one prompt test) -> its mean tok/s."""
    start = text.find("[")
    if start < 0:
        raise ValueError(f"no JSON array in llama-bench output: {text[-500:]!r}")
    rows = json.loads(text[start:])
    if not rows:
        raise ValueError("llama-bench printed an empty result list")
    return float(rows[0]["avg_ts"])


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {done.returncode}): {' '.join(cmd)}\n"
                           f"{done.stderr[-2000:]}")
    return done


def batched_decode(llama: LlamaCpp, gguf: Path, batches: Sequence[int], prompt_len: int, decode_tokens: int,
                   threads: int, attempts: int = 2) -> dict[int, float]:
    """Decode tok/s at each batch size after ``prompt_len``-token prompts (one llama-batched-bench run).

    The tool prints its rows through llama.cpp's asynchronous logger, which
    now and then loses the last line at exit (seen here about one run in
    seven); a last B=1 case that nobody reads takes that risk, and a run that
    still misses a row is repeated once.
    """
    ctx = max(batches) * (prompt_len + decode_tokens)
    ctx = -(-ctx // 256) * 256
    npl = [*batches, 1]
    cmd = [str(llama.tool("llama-batched-bench")), "-m", str(gguf), "-t", str(threads), "-c", str(ctx),
           "-b", "2048", "-ub", "512", "-npp", str(prompt_len), "-ntg", str(decode_tokens),
           "-npl", ",".join(str(b) for b in npl), "--output-format", "jsonl"]
    for _ in range(attempts):
        out = _run(cmd)
        rates = parse_batched_jsonl(out.stdout)
        missing = sorted(set(batches) - set(rates))
        if not missing:
            return {b: rates[b] for b in batches}
    raise RuntimeError(f"llama-batched-bench gave no row for B={missing} of {gguf.name} in {attempts} runs:\n"
                       f"stdout: {out.stdout[-1500:]}\nstderr: {out.stderr[-1500:]}")


def prefill(llama: LlamaCpp, gguf: Path, prompt_len: int, threads: int, repetitions: int = 2) -> float:
    """Prefill tok/s of one ``prompt_len``-token prompt (llama-bench, mean of ``repetitions``)."""
    out = _run([str(llama.tool("llama-bench")), "-m", str(gguf), "-t", str(threads), "-p", str(prompt_len),
                "-n", "0", "-r", str(repetitions), "-o", "json"])
    return parse_bench_json(out.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, object], timeout: float) -> dict[str, object]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@contextlib.contextmanager
def server(llama: LlamaCpp, gguf: Path, threads: int, ctx: int, log: Path, timeout: float = 300.0) -> Iterator[str]:
    """A llama-server of ``gguf`` (one slot), ready: yields its base URL; stopped on exit."""
    port = _free_port()
    cmd = [str(llama.tool("llama-server")), "-m", str(gguf), "-t", str(threads), "-c", str(ctx), "-np", "1",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({proc.returncode}) before it was ready; log {log}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server not ready after {timeout:.0f} s; log {log}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def greedy_tokens(llama: LlamaCpp, gguf: Path, prompts: Sequence[Sequence[int]], tokens: int, threads: int,
                  log: Path, timeout: float = 300.0) -> list[list[int]]:
    """``tokens`` greedy token ids after each token-id prompt, from a llama-server of ``gguf``."""
    ctx = max(len(p) for p in prompts) + tokens + 64
    with server(llama, gguf, threads, ctx, log, timeout) as base:
        outs = []
        for prompt in prompts:
            body = {"prompt": [int(t) for t in prompt], "n_predict": tokens, "temperature": 0.0, "top_k": 1,
                    "ignore_eos": True, "cache_prompt": False, "return_tokens": True}
            reply = _post(f"{base}/completion", body, timeout)
            outs.append([int(t) for t in reply["tokens"]])  # type: ignore[attr-defined]
        return outs


# llama.cpp's sampler chain for a sampled request like fd-core's (temperature, then top-p, then the draw): every
# other sampler of its default chain off (top_k 0, min_p 0, typical_p 1, no penalties; DRY and XTC are off by
# default)
SAMPLED_BODY = {"top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "samplers": ["temperature", "top_p"]}


def sampled_decode(llama: LlamaCpp, gguf: Path, prompts: Sequence[Sequence[int]], tokens: int, threads: int,
                   temperature: float, top_p: float, log: Path, timeout: float = 300.0) -> list[float]:
    """Decode tok/s of one sampled request after each token-id prompt (llama-server's own
    ``timings.predicted_per_second``: the generation phase, no HTTP), one server for all."""
    ctx = max(len(p) for p in prompts) + tokens + 64
    with server(llama, gguf, threads, ctx, log, timeout) as base:
        rates = []
        for seed, prompt in enumerate(prompts):
            body = {"prompt": [int(t) for t in prompt], "n_predict": tokens, "temperature": temperature,
                    "top_p": top_p, "seed": seed, "ignore_eos": True, "cache_prompt": False, **SAMPLED_BODY}
            reply = _post(f"{base}/completion", body, timeout)
            timings = reply["timings"]  # type: ignore[index]
            if int(timings["predicted_n"]) != tokens:  # type: ignore[index]
                raise RuntimeError(f"llama-server predicted {timings['predicted_n']} tokens, asked {tokens}")  # type: ignore[index]
            rates.append(float(timings["predicted_per_second"]))  # type: ignore[index]
        return rates
