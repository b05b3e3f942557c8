"""Serving metrics from per-request records, as vLLM's benchmark_serving defines them.

- request throughput = completed requests / duration;
- output token throughput = sum of output tokens of completed requests / duration;
- total token throughput = (input + output tokens of completed requests) / duration;
- TTFT: send time to the first chunk carrying generated content;
- TPOT per request = (E2EL - TTFT) / (output_tokens - 1), only for requests with
  more than one output token;
- ITL: every gap between consecutive content chunks, of all requests pooled (a
  chunk carrying several tokens gives one gap, as in vLLM);
- E2EL: send time to the end of the stream;
- goodput = completed requests meeting every given SLO / duration; a request
  with one output token counts TPOT 0 against the TPOT SLO.

Distributions report mean, median, std and chosen percentiles in ms
(``numpy.percentile``, linear interpolation); an empty one reports zeros.
Failed requests count only in ``failed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Distribution",
    "RequestRecord",
    "ServingMetrics",
    "compute_metrics",
    "distribution",
    "format_serving_table",
    "parse_goodput",
]

GOODPUT_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """What the client saw of one request; times in seconds."""

    success: bool = False
    prompt_len: int = 0  # from the server's usage, else the dataset's count
    output_len: int = 0  # from usage, else a tokenizer count, else content chunks
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between content chunks
    chunk_tokens: list[int] = field(default_factory=list)  # tokens per content chunk (1 if unknown)
    latency: float = 0.0  # E2EL
    start_time: float = 0.0  # since the benchmark started
    generated_text: str = ""
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output_len - 1); None with fewer than two output tokens."""
        if self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)


@dataclass
class Distribution:
    """Summary of one latency metric, in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: dict[float, float]  # percentile -> value


def distribution(seconds: Sequence[float], percentiles: Sequence[float]) -> Distribution:
    """Summarize values given in seconds; all zeros for an empty sequence."""
    values = np.asarray(seconds if len(seconds) else [0.0], dtype=np.float64) * 1000.0
    return Distribution(
        mean=float(values.mean()),
        median=float(np.median(values)),
        std=float(values.std()),
        percentiles={float(p): float(np.percentile(values, p)) for p in percentiles},
    )


@dataclass
class ServingMetrics:
    completed: int
    failed: int
    duration: float  # seconds
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # req/s
    request_goodput: float | None  # req/s meeting all SLOs; None without SLOs
    output_throughput: float  # output tok/s
    total_token_throughput: float  # (input + output) tok/s
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution

    def to_dict(self) -> dict[str, Any]:
        """Flat, vLLM-style keys: ``mean_ttft_ms``, ``p99_itl_ms``, ..."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key in ("ttft", "tpot", "itl", "e2el"):
                out[f"mean_{key}_ms"] = value["mean"]
                out[f"median_{key}_ms"] = value["median"]
                out[f"std_{key}_ms"] = value["std"]
                for p, v in value["percentiles"].items():
                    out[f"p{p:g}_{key}_ms"] = v
            else:
                out[key] = value
        return out


def compute_metrics(
    records: Sequence[RequestRecord],
    duration: float,
    percentiles: Sequence[float] = (90.0, 99.0),
    goodput: Mapping[str, float] | None = None,
) -> ServingMetrics:
    """Aggregate ``records`` over a run of ``duration`` seconds.

    ``goodput`` maps ``ttft``/``tpot``/``e2el`` to SLOs in milliseconds.
    """
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    done = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    tpots = [t for t in (r.tpot for r in done) if t is not None]
    good: float | None = None
    if goodput:
        slo = {k: v / 1000.0 for k, v in goodput.items()}
        num_good = 0
        for r in done:
            value = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.latency}
            num_good += all(value[k] <= limit for k, limit in slo.items())
        good = num_good / duration
    return ServingMetrics(
        completed=len(done),
        failed=len(records) - len(done),
        duration=duration,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(done) / duration,
        request_goodput=good,
        output_throughput=total_out / duration,
        total_token_throughput=(total_in + total_out) / duration,
        ttft=distribution([r.ttft for r in done], percentiles),
        tpot=distribution(tpots, percentiles),
        itl=distribution([gap for r in done for gap in r.itl], percentiles),
        e2el=distribution([r.latency for r in done], percentiles),
    )


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` -> ``{"ttft": 200.0, "tpot": 50.0}`` (ms)."""
    out: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(
                f"--goodput {item!r}: expected NAME:MILLISECONDS with NAME one of "
                f"{', '.join(GOODPUT_METRICS)}, e.g. ttft:500 tpot:50"
            )
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if ms < 0:
            raise ValueError(f"--goodput {item!r}: the SLO must be >= 0 ms")
        out[name] = ms
    return out


def _row(label: str, value: Any) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{label:<40} {text:<10}"


def _rule(title: str, char: str = "-") -> str:
    return f"{title:{char}^50}"


_SECTIONS = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)


def format_serving_table(m: ServingMetrics, extra: Mapping[str, Any] | None = None) -> str:
    """The result table, laid out as vLLM's benchmark_serving prints it."""
    lines = [_rule(" Serving Benchmark Result ", "=")]
    for label, value in (extra or {}).items():
        lines.append(_row(f"{label}:", value))
    lines += [
        _row("Successful requests:", m.completed),
        _row("Failed requests:", m.failed),
        _row("Benchmark duration (s):", m.duration),
        _row("Total input tokens:", m.total_input_tokens),
        _row("Total generated tokens:", m.total_output_tokens),
        _row("Request throughput (req/s):", m.request_throughput),
    ]
    if m.request_goodput is not None:
        lines.append(_row("Request goodput (req/s):", m.request_goodput))
    lines += [
        _row("Output token throughput (tok/s):", m.output_throughput),
        _row("Total Token throughput (tok/s):", m.total_token_throughput),
    ]
    for key, title, short in _SECTIONS:
        d: Distribution = getattr(m, key)
        lines.append(_rule(title))
        lines.append(_row(f"Mean {short} (ms):", d.mean))
        lines.append(_row(f"Median {short} (ms):", d.median))
        lines.append(_row(f"Std {short} (ms):", d.std))
        for p, v in d.percentiles.items():
            lines.append(_row(f"P{p:g} {short} (ms):", v))
    lines.append("=" * 50)
    return "\n".join(lines)
