"""Metrics: every FastDeploy metric is exported with its type; engine totals become
counters; API-side ends keep the gauges right."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fd_core.engine.client import EngineInfo, EngineStats
from fd_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from fd_core.metrics import METRIC_PREFIX, Metrics

# FastDeploy's docs/online_serving/metrics.md: name -> type
FASTDEPLOY_METRICS = {
    "requests_number": "counter", "request_success_total": "counter", "request_preempted_total": "counter",
    "num_requests_enqueued": "gauge", "num_requests_waiting": "gauge", "num_requests_running": "gauge",
    "num_requests_preempted": "gauge",
    "time_to_first_token_seconds": "histogram", "time_per_output_token_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram", "request_inference_time_seconds": "histogram",
    "request_queue_time_seconds": "histogram", "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "prompt_tokens_total": "counter", "generation_tokens_total": "counter",
    "request_prompt_tokens": "histogram", "request_token_ratio": "histogram",
    "request_generation_tokens": "histogram", "request_params_max_tokens": "histogram",
    "available_batch_size": "gauge", "batch_size": "gauge", "max_batch_size": "gauge",
    "cache_config_info": "gauge", "hit_req_rate": "gauge", "hit_token_rate": "gauge",
    "cpu_hit_token_rate": "gauge", "gpu_hit_token_rate": "gauge",
    "prefix_cache_token_num": "counter", "prefix_gpu_cache_token_num": "counter",
    "prefix_cpu_cache_token_num": "counter", "prefix_storage_cache_token_num": "counter",
    "available_gpu_block_num": "gauge", "free_gpu_block_num": "gauge", "max_gpu_block_num": "gauge",
    "available_gpu_resource": "gauge", "gpu_cache_usage_perc": "gauge", "send_cache_failed_num": "counter",
}

INFO = EngineInfo("m", 256, 100, 33, 16, "cpu", max_num_seqs=4, num_host_blocks=10)  # 32 usable


def families(metrics: Metrics) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def value(metrics: Metrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == METRIC_PREFIX + name:
                return float(sample.value)
    raise KeyError(name)


def finished(prompt: int = 4, generated: int = 6, aborted: bool = False) -> RequestOutput:
    now = time.time()
    m = RequestMetrics(now - 2.0, first_scheduled_time=now - 1.5, first_token_time=now - 1.0,
                       last_token_time=now, finished_time=now)
    out = CompletionOutput(0, "x", list(range(generated)), finish_reason=None if aborted else "length")
    return RequestOutput("r", None, list(range(prompt)), [out], not aborted, m)


@pytest.mark.parametrize("name,kind", sorted(FASTDEPLOY_METRICS.items()))
def test_every_fastdeploy_metric_is_exported_with_its_type(name, kind):
    family = families(Metrics(info=INFO)).get(METRIC_PREFIX + name.removesuffix("_total")
                                               if kind == "counter" else METRIC_PREFIX + name)
    assert family is not None, name
    assert family.type == kind


def test_gauges_before_any_request_come_from_the_engine_info():
    metrics = Metrics(stats=EngineStats, info=INFO)  # the engine has published nothing yet
    assert value(metrics, "max_batch_size") == 4 and value(metrics, "available_batch_size") == 4
    assert value(metrics, "batch_size") == 0 and value(metrics, "num_requests_running") == 0
    assert value(metrics, "available_gpu_block_num") == 32 and value(metrics, "free_gpu_block_num") == 32
    assert value(metrics, "max_gpu_block_num") == 33 and value(metrics, "available_gpu_resource") == 1.0


def test_engine_totals_become_counters_split_by_tier():
    stats = EngineStats(prefix_cache_queries=100, prefix_cache_hits=40, prefix_cache_host_hits=10,
                        num_preemptions=2, time=time.time())
    metrics = Metrics(stats=lambda: stats, info=INFO)
    assert value(metrics, "hit_token_rate") == pytest.approx(0.4)
    assert value(metrics, "gpu_hit_token_rate") == pytest.approx(0.3)
    assert value(metrics, "cpu_hit_token_rate") == pytest.approx(0.1)
    stats.prefix_cache_hits, stats.prefix_cache_host_hits, stats.num_preemptions = 60, 15, 3
    assert value(metrics, "prefix_cache_token_num_total") == 60
    assert value(metrics, "prefix_gpu_cache_token_num_total") == 45
    assert value(metrics, "prefix_cpu_cache_token_num_total") == 15
    assert value(metrics, "request_preempted_total") == 3
    assert value(metrics, "prefix_storage_cache_token_num_total") == 0


def test_a_stale_busy_snapshot_is_corrected_once_every_request_has_ended():
    stats = EngineStats(num_running=2, num_waiting=1, kv_cache_usage=0.5, num_free_blocks=16,
                        num_free_uncached_blocks=16, time=time.time())
    metrics = Metrics(stats=lambda: stats, info=INFO)
    metrics.request_received()
    metrics.request_received()
    assert value(metrics, "num_requests_running") == 2 and value(metrics, "available_gpu_block_num") == 16
    metrics.request_finished(finished(aborted=True), 8, aborted=True)
    assert value(metrics, "num_requests_running") == 2  # one still in flight: believe the engine
    metrics.request_finished(None, 8, aborted=True)  # ended before any output
    assert value(metrics, "num_requests_running") == 0 and value(metrics, "num_requests_waiting") == 0
    assert value(metrics, "available_gpu_block_num") == 32 and value(metrics, "gpu_cache_usage_perc") == 0
    assert value(metrics, "batch_size") == 0 and value(metrics, "available_batch_size") == 4


def test_request_token_ratio_is_output_tokens_per_second_of_finished_requests():
    metrics = Metrics(info=INFO)
    metrics.request_received()
    metrics.request_finished(finished(generated=6), 8)  # 6 tokens in 1.5 s since first scheduled
    assert value(metrics, "request_token_ratio_count") == 1
    assert value(metrics, "request_token_ratio_sum") == pytest.approx(4.0, rel=0.05)
    metrics.request_received()
    metrics.request_finished(finished(aborted=True), 8, aborted=True)
    assert value(metrics, "request_token_ratio_count") == 1


def test_a_request_counts_once_in_request_success_whatever_its_samples_did():
    metrics = Metrics(info=INFO)
    out = finished()
    out.outputs = [CompletionOutput(0, "a", [1], finish_reason="stop"),
                   CompletionOutput(1, "b", [1, 2], finish_reason="length")]  # n=2, ending differently
    metrics.request_finished(out, 8)
    metrics.request_finished(finished(), 8)
    samples = {s.labels.get("finished_reason"): s.value
               for f in text_string_to_metric_families(metrics.render().decode())
               if f.name == METRIC_PREFIX + "request_success" for s in f.samples if s.name.endswith("_total")}
    assert samples == {"length": 2.0}  # the sum over the label is FastDeploy's counter: 2 requests
