"""Serving metrics on hand-made request records (vLLM benchmark_serving definitions)."""

from __future__ import annotations

import pytest

from fd_core.benchmarks.metrics import (
    RequestRecord,
    compute_metrics,
    distribution,
    format_serving_table,
    parse_goodput,
)


def _records() -> list[RequestRecord]:
    return [
        # tpot = (0.5 - 0.1) / (5 - 1) = 0.1
        RequestRecord(True, prompt_len=10, output_len=5, ttft=0.1, latency=0.5, itl=[0.1] * 4),
        # one output token: no TPOT sample (counts as 0 for goodput)
        RequestRecord(True, prompt_len=20, output_len=1, ttft=0.2, latency=0.2),
        # tpot = (0.9 - 0.3) / (3 - 1) = 0.3
        RequestRecord(True, prompt_len=30, output_len=3, ttft=0.3, latency=0.9, itl=[0.3, 0.3]),
        RequestRecord(False, prompt_len=40, output_len=0, error="HTTP 500"),
    ]


def test_counts_and_throughputs_use_completed_requests_only():
    m = compute_metrics(_records(), duration=2.0)
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (60, 9)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(4.5)
    assert m.total_token_throughput == pytest.approx(34.5)
    assert m.request_goodput is None


def test_distributions_in_milliseconds():
    m = compute_metrics(_records(), duration=2.0, percentiles=(90, 99))
    assert m.ttft.mean == pytest.approx(200.0)
    assert m.ttft.median == pytest.approx(200.0)
    assert m.ttft.std == pytest.approx((20000 / 3) ** 0.5)
    # linear interpolation over [100, 200, 300]
    assert m.ttft.percentiles == pytest.approx({90.0: 280.0, 99.0: 298.0})
    assert m.tpot.mean == pytest.approx(200.0)  # (100 + 300) / 2: the 1-token request has none
    assert m.itl.mean == pytest.approx(1000.0 / 6)  # pooled gaps: 4 x 100, 2 x 300
    assert m.itl.median == pytest.approx(100.0)
    assert m.e2el.mean == pytest.approx(1600.0 / 3)


def test_tpot_per_request():
    assert _records()[0].tpot == pytest.approx(0.1)
    assert _records()[1].tpot is None


def test_goodput_counts_requests_meeting_every_slo():
    m = compute_metrics(_records(), 2.0, goodput={"ttft": 250, "tpot": 150})
    assert m.request_goodput == pytest.approx(2 / 2.0)  # the third misses TTFT
    m = compute_metrics(_records(), 2.0, goodput={"e2el": 400})
    assert m.request_goodput == pytest.approx(1 / 2.0)  # only the 0.2 s request
    m = compute_metrics(_records(), 2.0, goodput={"tpot": 0})
    assert m.request_goodput == pytest.approx(1 / 2.0)  # 1-token request: tpot 0


def test_all_failed_gives_zeros_not_errors():
    m = compute_metrics([RequestRecord(False, error="boom")] * 3, 1.0)
    assert (m.completed, m.failed, m.request_throughput) == (0, 3, 0.0)
    assert m.ttft.mean == 0.0 and m.itl.percentiles[99.0] == 0.0


def test_flat_dict_and_table():
    m = compute_metrics(_records(), 2.0, goodput={"ttft": 250})
    flat = m.to_dict()
    assert flat["p99_ttft_ms"] == pytest.approx(298.0)
    assert flat["median_itl_ms"] == pytest.approx(100.0)
    assert flat["request_goodput"] == pytest.approx(1.0)
    table = format_serving_table(m)
    assert table.startswith("============ Serving Benchmark Result ============\n")
    assert "Successful requests:                     3" in table
    assert "P90 TTFT (ms):" in table and "Request goodput (req/s):" in table


def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50.5"]) == {"ttft": 500.0, "tpot": 50.5}
    assert parse_goodput(None) == {}
    for bad in ("latency:5", "ttft", "ttft:fast", "e2el:-1"):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput([bad])


def test_distribution_empty_and_bad_duration():
    assert distribution([], [50]).percentiles == {50.0: 0.0}
    with pytest.raises(ValueError, match="duration"):
        compute_metrics([], 0.0)
