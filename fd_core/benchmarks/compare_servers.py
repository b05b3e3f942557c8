"""``fd-bench compare``: one request stream through several OpenAI-compatible servers.

    fd-bench compare --base-url http://127.0.0.1:8180 --label fd-core \\
        --base-url http://127.0.0.1:8081 --label llama.cpp \\
        --num-prompts 32 --random-input-range 128:512 --random-output-range 64:128 \\
        --request-rate 2 --random-vocab-size 100000 --save-result

Every server gets the same requests: the same prompts as token-id lists in
``/v1/completions``' ``prompt`` field (no BOS is added to an id list by fd-serve,
vLLM or llama-server), the same ``max_tokens`` with ``ignore_eos`` so every
output runs to its length, greedy, sent at the same seeded arrival offsets
(``serve.arrival_times``). Servers run one after the other, never at once, so
each has the machine to itself. A short probe request first checks that a
server takes token ids; one that answers 4xx gets the detokenized text instead
only with ``--text-fallback`` (and ``--tokenizer``), and the report says which
form each server got. The ratio table gives each server's figures and each
one's ratio to the first (``B/A``). The HTTP client, timing and metrics are
``serve.py``'s and ``metrics.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from fd_core.benchmarks.datasets import SampleRequest, add_dataset_args, sample_requests
from fd_core.benchmarks.metrics import (
    RequestRecord,
    ServingMetrics,
    compute_metrics,
    format_serving_table,
    parse_goodput,
)
from fd_core.benchmarks.serve import (
    add_traffic_args,
    arrival_times,
    auth_headers,
    drive_server,
    first_model,
    http_client,
    request_body,
    request_details,
    send_request,
    validate_traffic_args,
)

__all__ = ["ServerRun", "add_compare_args", "ratio_table", "run_compare"]

COMPLETIONS = "/v1/completions"
TOKEN_IDS, TEXT = "token_ids", "text"
# fields that make the stream what it is: --extra-body may not change them
_STREAM_FIELDS = ("prompt", "max_tokens", "ignore_eos", "temperature", "stream", "model")

ROWS = (  # (label, key of ServingMetrics.to_dict(), higher is better)
    ("Successful requests", "completed", True),
    ("Output token throughput (tok/s)", "output_throughput", True),
    ("Request throughput (req/s)", "request_throughput", True),
    ("Median TTFT (ms)", "median_ttft_ms", False),
    ("P99 TTFT (ms)", "p99_ttft_ms", False),
    ("Median TPOT (ms)", "median_tpot_ms", False),
    ("Median ITL (ms)", "median_itl_ms", False),
    ("Median E2EL (ms)", "median_e2el_ms", False),
)


@dataclass
class ServerRun:
    label: str
    base_url: str
    model: str = ""
    prompt_form: str = TOKEN_IDS
    records: list[RequestRecord] = field(default_factory=list)
    duration: float = 0.0
    sent_sha256: str = ""  # digest of (token ids, max_tokens) of every measured request, in order


def add_compare_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--base-url", action="append", default=[], metavar="URL",
      help="a server root; give it once per server (at least two); the first is A in B/A")
    a("--label", action="append", default=[], help="a name per --base-url, in order (default A, B, ...)")
    a("--model", action="append", default=[],
      help="the 'model' field: once for all servers or once per --base-url "
           "(default: each server's first of GET /v1/models)")
    a("--text-fallback", action="store_true",
      help="a server that refuses token-id prompts gets the prompts detokenized by --tokenizer")
    add_traffic_args(p)
    add_dataset_args(p)
    p.set_defaults(ignore_eos=True)  # every output runs to its max_tokens on every server


def _check_args(args: argparse.Namespace) -> list[str]:
    """Validated labels, one per server."""
    validate_traffic_args(args)
    urls = args.base_url
    if len(urls) < 2:
        raise ValueError(f"--base-url must be given at least twice (one per server), got {len(urls)}")
    labels = args.label or [chr(ord("A") + i) if i < 26 else f"S{i}" for i in range(len(urls))]
    if len(labels) != len(urls):
        raise ValueError(f"--label must be given once per --base-url: {len(labels)} label(s) "
                         f"for {len(urls)} server(s)")
    if len(set(labels)) != len(labels):
        raise ValueError(f"--label values must differ, got {labels}")
    if len(args.model) not in (0, 1, len(urls)):
        raise ValueError(f"--model must be given once for all servers or once per --base-url, "
                         f"got {len(args.model)} for {len(urls)} server(s)")
    if args.text_fallback and not args.tokenizer:
        raise ValueError("--text-fallback needs --tokenizer MODEL_DIR to detokenize the prompts")
    clash = sorted(set(args.extra_body or {}) & set(_STREAM_FIELDS))
    if clash:
        raise ValueError(f"--extra-body may not set {', '.join(clash)}: compare sends the same "
                         "value of those to every server")
    return list(labels)


def _token_requests(args: argparse.Namespace, tokenizer: Any) -> list[SampleRequest]:
    requests = sample_requests(args, tokenizer, keep_ids=True)
    out = []
    for req in requests:
        if isinstance(req.prompt, str):  # sharegpt: the text, encoded once, is the stream
            if tokenizer is None:
                raise ValueError("compare sends token ids: --dataset-name sharegpt needs --tokenizer")
            ids = list(tokenizer.encode(req.prompt))
            req = SampleRequest(ids, len(ids), req.output_len)
        out.append(req)
    return out


def _ids(req: SampleRequest) -> list[int]:
    if isinstance(req.prompt, str):  # _token_requests made every prompt an id list
        raise TypeError("compare's requests carry token ids, got a text prompt")
    return list(req.prompt)


def _digest(pairs: list[tuple[list[int], int]]) -> str:
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()


async def _probe_form(args: argparse.Namespace, run: ServerRun, model: str | None, req: SampleRequest,
                      tokenizer: Any) -> tuple[str, str]:
    """(model, prompt form) the server takes: a short greedy request with token ids first."""
    headers = auth_headers(args)
    url = run.base_url + COMPLETIONS
    probe = SampleRequest(_ids(req)[:8], min(len(req.prompt), 8), 2)
    async with http_client(args.request_timeout) as client:
        model = model or await first_model(client, run.base_url, headers)
        rec = await send_request(client, url, request_body(args, model, probe, COMPLETIONS), headers, probe)
        if rec.success:
            return model, TOKEN_IDS
        if not rec.error.startswith(("HTTP 400", "HTTP 422")):  # 401/404: key or model, not the prompt
            raise ConnectionError(f"{run.label} ({url}): the probe request failed: {rec.error}; "
                                  "check --model and --api-key")
        if not args.text_fallback:
            raise ConnectionError(f"{run.label} ({url}) refused a token-id prompt: {rec.error}; pass "
                                  "--text-fallback --tokenizer MODEL_DIR to send it detokenized text")
        text = replace(probe, prompt=tokenizer.decode(probe.prompt))
        rec = await send_request(client, url, request_body(args, model, text, COMPLETIONS), headers, text)
        if not rec.success:
            raise ConnectionError(f"{run.label} ({url}) refused the text prompt too: {rec.error}")
        return model, TEXT


async def _run_one(args: argparse.Namespace, run: ServerRun, model: str | None,
                   requests: list[SampleRequest], arrivals: list[float], tokenizer: Any) -> None:
    run.model, run.prompt_form = await _probe_form(args, run, model, requests[0], tokenizer)
    if run.prompt_form == TEXT:
        sent = [replace(r, prompt=tokenizer.decode(r.prompt)) for r in requests]
    else:
        sent = requests
    index = {id(r): i for i, r in enumerate(sent)}
    seen: list[tuple[list[int], int] | None] = [None] * len(sent)

    def body(model_id: str, req: SampleRequest) -> dict[str, Any]:
        i = index[id(req)]
        payload = request_body(args, model_id, req, COMPLETIONS)
        seen[i] = (_ids(requests[i]), int(payload["max_tokens"]))  # the ids behind what went out
        return payload

    _, run.records, run.duration = await drive_server(
        args, sent, run.base_url, model=run.model, endpoint=COMPLETIONS, body=body, arrivals=arrivals)
    run.sent_sha256 = _digest([s for s in seen if s is not None])


def ratio_table(runs: list[ServerRun], metrics: list[ServingMetrics]) -> tuple[str, dict[str, dict[str, float]]]:
    """Each server's figures and its ratio to the first server's; returns (table, label -> key -> ratio)."""
    rows = [m.to_dict() for m in metrics]
    base = runs[0].label
    heads = [r.label for r in runs] + [f"{r.label}/{base}" for r in runs[1:]]
    width = max(12, *(len(h) + 2 for h in heads))
    lines = [f"{'':<34}" + "".join(f"{h:>{width}}" for h in heads) + "  better"]
    ratios: dict[str, dict[str, float]] = {r.label: {} for r in runs[1:]}
    for label, key, higher in ROWS:
        values = [float(row.get(key, 0.0)) for row in rows]
        cells = [f"{int(v):>{width}d}" if key == "completed" else f"{v:>{width}.2f}" for v in values]
        for run, v in zip(runs[1:], values[1:]):
            ratio = v / values[0] if values[0] else math.inf
            ratios[run.label][key] = ratio
            cells.append(f"{ratio:>{width}.2f}")
        lines.append(f"{label:<34}" + "".join(cells) + f"  {'higher' if higher else 'lower'}")
    rule = "=" * len(lines[0])
    title = f" {' vs '.join(r.label for r in runs)} (same requests, one server at a time) "
    return "\n".join([f"{title:=^{len(rule)}}", *lines, rule]), ratios


def arrival_note(requests: list[SampleRequest], arrivals: list[float], runs: list[ServerRun],
                 metrics: list[ServingMetrics]) -> tuple[str, dict[str, Any]]:
    """What the arrival schedule alone allows: the last request goes out at ``arrivals[-1]`` (its
    scheduled time), so no server finishes sooner and output throughput is at most
    ``sum(output_len) / arrivals[-1]``. Per server: its throughput as a fraction of that bound, and
    its drain time (the run's duration minus the last arrival) against its median end-to-end
    latency: a server that kept up with the arrivals drains in about one request's latency, one
    with a backlog takes much longer. Even a server with spare capacity stays below the bound by
    that tail, so when both servers keep up the throughput ratio measures their tail latencies."""
    last = float(arrivals[-1]) if arrivals else 0.0
    if last <= 0:
        return "arrivals: every request sent at once (the servers' capacity is what is compared)", {}
    total = sum(r.output_len for r in requests)
    bound = total / last
    servers = {run.label: {"share": m.output_throughput / bound if bound else 0.0,
                           "drain_s": max(0.0, m.duration - last), "median_e2el_s": m.e2el.median / 1e3}
               for run, m in zip(runs, metrics)}
    cells = "; ".join(f"{label}: {v['share']:.2f} of it, drained {v['drain_s']:.1f} s after the last arrival "
                      f"(median E2EL {v['median_e2el_s']:.1f} s)" for label, v in servers.items())
    note = (f"arrivals: last request scheduled at {last:.1f} s, so output throughput is at most {bound:.1f} tok/s "
            f"on this stream; {cells}. Drain near one E2EL: the server kept up with the arrivals (compare "
            "capacity with --request-rate inf); much longer: it had a backlog")
    return note, {"last_arrival_s": last, "bound_tok_s": bound, "servers": servers}


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Drive every server with the same stream; prints the tables, returns the result."""
    labels = _check_args(args)
    percentiles = sorted({*(float(p) for p in str(args.percentiles).split(",") if p.strip()), 99.0})
    goodput = parse_goodput(args.goodput)
    tokenizer = None
    if args.tokenizer:
        from fd_core.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(args.tokenizer)
    requests = _token_requests(args, tokenizer)
    arrivals = arrival_times(len(requests), args.request_rate, args.burstiness, args.seed)
    stream_sha = _digest([(_ids(r), r.output_len) for r in requests])
    models = args.model * len(labels) if len(args.model) == 1 else args.model or [None] * len(labels)
    runs = [ServerRun(label, url.rstrip("/")) for label, url in zip(labels, args.base_url)]
    metrics = []
    print(f"{len(requests)} requests, rate {args.request_rate}/s, burstiness {args.burstiness}, "
          f"max concurrency {args.max_concurrency}; request stream sha256 {stream_sha[:16]}")
    for run, model in zip(runs, models):
        print(f"--- {run.label}: {run.base_url}")
        asyncio.run(_run_one(args, run, model, requests, arrivals, tokenizer))
        m = compute_metrics(run.records, run.duration, percentiles, goodput)
        metrics.append(m)
        print(format_serving_table(m, {"Server": run.label, "Prompt form": run.prompt_form}))
        short = sum(r.success and r.output_len != q.output_len for r, q in zip(run.records, requests))
        if short:
            print(f"warning: {run.label}: {short} completed request(s) did not run to max_tokens "
                  "(the server may not honour ignore_eos); output lengths differ between servers")
        errors = sorted({r.error for r in run.records if not r.success})
        if errors:
            print(f"{run.label}: {m.failed} request(s) failed; first error: {errors[0]}")
    table, ratios = ratio_table(runs, metrics)
    print(table)
    note, bound = arrival_note(requests, arrivals, runs, metrics)
    print(note)
    same = all(r.sent_sha256 == stream_sha for r in runs)
    print("every server got the identical request stream" if same else
          "warning: the request streams differ between servers")
    forms = ", ".join(f"{r.label}: {r.prompt_form}" for r in runs)
    print(f"prompt form sent: {forms}")
    config = {k: v for k, v in vars(args).items() if k != "func"}
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "kind": "compare",
        "config": config,
        "stream_sha256": stream_sha,
        "arrivals": arrivals,
        "servers": [{
            "label": run.label, "base_url": run.base_url, "model_id": run.model,
            "prompt_form": run.prompt_form, "sent_sha256": run.sent_sha256,
            "summary": m.to_dict(), "requests": request_details(requests, run.records),
        } for run, m in zip(runs, metrics)],
        "ratios": ratios,
        "arrival_bound": bound,
    }
