"""``fd-bench serve``: load an OpenAI-compatible server over streaming HTTP.

Works against fd-serve, vLLM, FastDeploy or anything speaking the OpenAI
streaming protocol. Requests go out open loop at ``--request-rate`` (gamma
inter-arrival times with shape ``--burstiness``: 1 is Poisson, as in vLLM;
``inf`` sends all at once), at most ``--max-concurrency`` in flight when given.

Per request the client asks for ``stream_options.include_usage`` and
``continuous_usage_stats``: with usage on every chunk, the tokens a chunk
carries are the growth of ``completion_tokens``; a server that ignores
``continuous_usage_stats`` gets one token counted per content chunk (a usage
that first comes on the finish chunk, as llama-server sends it, is the total,
not that chunk's tokens). Output
tokens are the final usage's ``completion_tokens``, else the ``--tokenizer``
count of the text, else the content-chunk count. Prompt tokens are usage's
``prompt_tokens``, else the dataset's count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import numpy as np

from fd_core.benchmarks.datasets import SampleRequest, add_dataset_args, sample_requests
from fd_core.benchmarks.metrics import (
    RequestRecord,
    compute_metrics,
    format_serving_table,
    parse_goodput,
)

__all__ = ["add_serve_args", "add_traffic_args", "arrival_times", "auth_headers", "drive_server", "first_model",
           "http_client", "request_body", "request_details", "run_requests", "run_serve", "send_request",
           "validate_traffic_args"]

CHAT = "/v1/chat/completions"


def add_traffic_args(p: argparse.ArgumentParser) -> None:
    """Arrival process, request options and reporting: shared by ``serve`` and ``compare``."""
    a = p.add_argument
    a("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    a("--request-rate", type=float, default=math.inf, help="requests/s; inf sends all at once")
    a("--burstiness", type=float, default=1.0, help="gamma shape of inter-arrival times; 1 = Poisson")
    a("--max-concurrency", type=int, default=None, help="most requests in flight")
    a("--temperature", type=float, default=0.0)
    a("--extra-body", type=json.loads, default=None, help="JSON object merged into every request")
    a("--no-continuous-usage", action="store_true",
      help="do not ask for usage on every chunk (for servers that reject the field)")
    a("--num-warmups", type=int, default=0,
      help="send the first N prompts once, unmeasured, before the run")
    a("--request-timeout", type=float, default=6 * 3600.0, help="seconds per request")
    a("--percentiles", default="90,99", help="comma-separated percentiles to report")
    a("--goodput", nargs="+", default=None, metavar="NAME:MS",
      help="SLOs for goodput: ttft:MS tpot:MS e2el:MS")
    a("--disable-tqdm", action="store_true")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--base-url", help="server root, e.g. http://127.0.0.1:8000 (default: from --host/--port)")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--endpoint", default="/v1/completions", help=f"/v1/completions or {CHAT}")
    a("--model", help="the 'model' field (default: the first of GET /v1/models)")
    a("--ignore-eos", action="store_true", help="send ignore_eos so every request runs to max_tokens")
    add_traffic_args(p)
    add_dataset_args(p)


def _chunk_text(chunk: dict[str, Any], chat: bool) -> str | None:
    """Generated text of a chunk; None for a chunk without choices (usage only)."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    if not chat:
        return choices[0].get("text") or ""
    delta = choices[0].get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


async def send_request(client: Any, url: str, payload: dict[str, Any], headers: dict[str, str],
                       req: SampleRequest, tokenizer: Any = None) -> RequestRecord:
    """POST one streaming request and time its chunks; never raises for a failed request."""
    chat = url.rstrip("/").endswith(CHAT)
    rec = RequestRecord(prompt_len=req.prompt_len or 0)
    parts: list[str] = []
    completion_tokens: int | None = None
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                rec.error = f"HTTP {resp.status_code}: {body[:500]}"
                return rec
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if chunk.get("error"):
                    rec.error = f"error in stream: {json.dumps(chunk['error'])[:500]}"
                    return rec
                new_tokens = None
                usage = chunk.get("usage") or {}
                if usage.get("prompt_tokens") is not None:
                    rec.prompt_len = int(usage["prompt_tokens"])
                if usage.get("completion_tokens") is not None:
                    # usage first seen after content (llama-server: on the finish chunk, with
                    # choices) is the total, not this chunk's tokens
                    if completion_tokens is not None or not parts:
                        new_tokens = int(usage["completion_tokens"]) - (completion_tokens or 0)
                    completion_tokens = int(usage["completion_tokens"])
                text = _chunk_text(chunk, chat)
                if text is None or not (text or new_tokens):
                    continue  # usage-only, role-only or empty finish chunk
                if not parts:
                    rec.ttft = now - start
                else:
                    rec.itl.append(now - last)
                last = now
                parts.append(text)
                rec.chunk_tokens.append(1 if new_tokens is None else new_tokens)
        rec.latency = time.perf_counter() - start
    except Exception as exc:  # network errors, bad JSON: the request failed, the run goes on
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    rec.generated_text = "".join(parts)
    if not parts:
        rec.error = "the stream carried no generated tokens"
        return rec
    if completion_tokens is not None:
        rec.output_len = completion_tokens
    elif tokenizer is not None:
        rec.output_len = len(tokenizer.encode(rec.generated_text))
    else:
        rec.output_len = sum(rec.chunk_tokens)
    rec.success = True
    return rec


def arrival_times(num: int, request_rate: float = math.inf, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Seconds after the start at which each of ``num`` requests goes out; the first at 0.

    Gamma inter-arrival gaps of shape ``burstiness`` and mean ``1 / request_rate``
    (Poisson for shape 1); all at 0 for an infinite rate. Seeded, so two runs
    with the same seed send on the same schedule.
    """
    if not math.isfinite(request_rate) or num < 2:
        return [0.0] * num
    rng = np.random.default_rng(seed + 1)  # arrivals: independent of the prompts' draws
    gaps = rng.gamma(burstiness, 1.0 / (request_rate * burstiness), size=num - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


async def run_requests(requests: list[SampleRequest],
                       send: Callable[[SampleRequest], Awaitable[RequestRecord]],
                       request_rate: float = math.inf, burstiness: float = 1.0,
                       max_concurrency: int | None = None, seed: int = 0,
                       disable_tqdm: bool = True,
                       arrivals: list[float] | None = None) -> tuple[list[RequestRecord], float]:
    """Send ``requests`` at the given arrival process; returns (records, duration s).

    ``arrivals`` (seconds after the start, one per request) replaces the
    schedule that ``arrival_times`` would draw from the rate, burstiness and seed.
    """
    from tqdm import tqdm

    if arrivals is None:
        arrivals = arrival_times(len(requests), request_rate, burstiness, seed)
    if len(arrivals) != len(requests):
        raise ValueError(f"{len(arrivals)} arrival times for {len(requests)} requests")
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(requests), disable=disable_tqdm, dynamic_ncols=True)
    t0 = time.perf_counter()

    async def one(req: SampleRequest) -> RequestRecord:
        if semaphore is None:
            started, rec = time.perf_counter(), await send(req)
        else:
            async with semaphore:
                started, rec = time.perf_counter(), await send(req)
        rec.start_time = started - t0
        bar.update(1)
        return rec

    tasks = []
    for req, at in zip(requests, arrivals):
        # sleep to the absolute offset: the schedule does not drift with the loop's own cost
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        tasks.append(asyncio.create_task(one(req)))
    records = list(await asyncio.gather(*tasks))
    duration = time.perf_counter() - t0
    bar.close()
    return records, duration


def validate_traffic_args(args: argparse.Namespace) -> None:
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate must be > 0 (inf for all at once), got {args.request_rate}")
    if not args.burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {args.burstiness}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        raise ValueError(f"--extra-body must be a JSON object, got {args.extra_body!r}")


def request_body(args: argparse.Namespace, model: str, req: SampleRequest,
                 endpoint: str | None = None) -> dict[str, Any]:
    """The streaming request for ``req`` under the traffic flags (``endpoint``: default ``args``')."""
    endpoint = endpoint or args.endpoint
    body: dict[str, Any] = {"model": model, "max_tokens": req.output_len, "stream": True,
                            "temperature": args.temperature,
                            "stream_options": {"include_usage": True}}
    if not args.no_continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    if getattr(args, "ignore_eos", False):
        body["ignore_eos"] = True
    if endpoint.rstrip("/").endswith(CHAT):
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    body.update(args.extra_body or {})
    return body


async def first_model(client: Any, base_url: str, headers: dict[str, str]) -> str:
    try:
        resp = await client.get(f"{base_url}/v1/models", headers=headers)
    except Exception as exc:
        raise ConnectionError(f"cannot reach {base_url}: {exc}; start the server or pass "
                              "--base-url / --host / --port") from None
    if resp.status_code != 200:
        raise ConnectionError(f"GET {base_url}/v1/models answered {resp.status_code}: "
                              f"{resp.text[:300]}; pass --model (and --api-key if needed)")
    data = resp.json().get("data") or []
    if not data:
        raise ConnectionError(f"GET {base_url}/v1/models lists no model; pass --model")
    return str(data[0]["id"])


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def http_client(timeout: float) -> Any:
    """An httpx.AsyncClient without a connection cap or proxies (a benchmark talks to the server)."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits, trust_env=False)


async def drive_server(args: argparse.Namespace, requests: list[SampleRequest], base_url: str,
                       tokenizer: Any = None, model: str | None = None, endpoint: str | None = None,
                       body: Callable[[str, SampleRequest], dict[str, Any]] | None = None,
                       arrivals: list[float] | None = None) -> tuple[str, list[RequestRecord], float]:
    """Warm-ups, then ``requests`` at the traffic flags' arrival process; (model, records, s).

    ``body(model, req)`` builds each request (default: ``request_body`` of the flags).
    """
    headers = auth_headers(args)
    url = base_url + (endpoint or args.endpoint)
    async with http_client(args.request_timeout) as client:
        model = model or args.model or await first_model(client, base_url, headers)
        make = body or (lambda m, r: request_body(args, m, r, endpoint))

        async def send(req: SampleRequest) -> RequestRecord:
            return await send_request(client, url, make(model, req), headers, req, tokenizer)

        for req in requests[: args.num_warmups]:
            warm = await send(req)
            if not warm.success:
                raise ConnectionError(f"the warm-up request to {url} failed: {warm.error}; "
                                      "check --endpoint, --model and --api-key")
        records, duration = await run_requests(
            requests, send, args.request_rate, args.burstiness, args.max_concurrency, args.seed,
            args.disable_tqdm, arrivals)
    return model, records, duration


def request_details(requests: list[SampleRequest], records: list[RequestRecord]) -> dict[str, list]:
    """Per-request columns of a result JSON."""
    return {
        "success": [r.success for r in records],
        "input_lens": [r.prompt_len for r in records],
        "max_tokens": [req.output_len for req in requests],
        "output_lens": [r.output_len for r in records],
        "ttfts": [r.ttft for r in records],
        "tpots": [r.tpot for r in records],
        "itls": [r.itl for r in records],
        "chunk_tokens": [r.chunk_tokens for r in records],
        "e2els": [r.latency for r in records],
        "start_times": [r.start_time for r in records],
        "generated_texts": [r.generated_text for r in records],
        "errors": [r.error for r in records],
    }


def run_serve(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark the parsed flags describe; prints the table, returns the result."""
    validate_traffic_args(args)
    percentiles = [float(p) for p in str(args.percentiles).split(",") if p.strip()]
    goodput = parse_goodput(args.goodput)
    tokenizer = None
    if not args.tokenizer and args.model and any(
            os.path.isfile(os.path.join(args.model, name)) for name in ("tokenizer.model", "tokenizer.json")):
        args.tokenizer = args.model  # --model names a local checkpoint: use its tokenizer, as vLLM does
    if args.tokenizer:
        from fd_core.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(args.tokenizer)
    requests = sample_requests(args, tokenizer)
    if args.endpoint.rstrip("/").endswith(CHAT) and not isinstance(requests[0].prompt, str):
        raise ValueError(f"{CHAT} needs text prompts: pass --tokenizer MODEL_DIR to render "
                         "random prompts as text")
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    print(f"Traffic request rate: {args.request_rate}, burstiness {args.burstiness}, "
          f"max concurrency {args.max_concurrency}")
    model, records, duration = asyncio.run(drive_server(args, requests, base_url, tokenizer))
    metrics = compute_metrics(records, duration, percentiles, goodput)
    print(format_serving_table(metrics))
    errors = sorted({r.error for r in records if not r.success})
    if errors:
        print(f"{metrics.failed} request(s) failed; first error: {errors[0]}")
    config = {k: v for k, v in vars(args).items() if k != "func"}
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "kind": "serve",
        "base_url": base_url,
        "model_id": model,
        "config": config,
        "summary": metrics.to_dict(),
        "requests": request_details(requests, records),
    }
