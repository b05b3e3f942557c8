"""Server-wide metrics over several API processes (--workers N): one scrape sums the
per-request counters of every worker and shows engine numbers once.

Two workers are simulated in this process: each ``Metrics`` is built while
prometheus_client writes to its own file in the shared directory (as a worker
started with PROMETHEUS_MULTIPROC_DIR does, with its own pid).
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from prometheus_client import values
from prometheus_client.parser import text_string_to_metric_families

from fd_core.engine.client import EngineInfo, EngineStats
from fd_core.metrics import METRIC_PREFIX, Metrics, multiprocess

from .test_prometheus import INFO, finished


@pytest.fixture
def shared(monkeypatch, tmp_path):
    monkeypatch.setenv(multiprocess.ENV_NAME, str(tmp_path))  # where prometheus_client puts the files
    monkeypatch.setattr(multiprocess, "_shared_dir", str(tmp_path))  # what enable() sets in a worker
    return tmp_path


def worker(monkeypatch, pid: int, stats: EngineStats, info: EngineInfo = INFO) -> Metrics:
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: pid))
    return Metrics(stats=lambda: stats, info=info)


def samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """(sample name without the prefix, sorted labels) -> value, from one scrape."""
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            key = (s.name.removeprefix(METRIC_PREFIX), tuple(sorted(s.labels.items())))
            assert key not in out, f"{key} shown twice"
            out[key] = s.value
    return out


def test_one_scrape_sums_every_workers_requests_and_shows_engine_numbers_once(monkeypatch, shared):
    stats = EngineStats(num_running=1, num_free_blocks=30, num_free_uncached_blocks=30, prefix_cache_queries=100,
                        prefix_cache_hits=40, num_preemptions=2, time=time.time() + 60)  # after the requests end
    a, b = worker(monkeypatch, 101, stats), worker(monkeypatch, 102, stats)
    for metrics, count in ((a, 2), (b, 3)):
        for i in range(count):
            metrics.request_received()
            out = finished(prompt=4, generated=6)
            out.num_cached_tokens = 16 if metrics is b and i == 0 else 0
            metrics.request_finished(out, max_tokens=8)
    a.render()  # a has followed the engine totals too

    for answering in (a, b):
        seen = samples(answering)
        assert seen["requests_number_total", ()] == 5
        assert seen["request_success_total", (("finished_reason", "length"),)] == 5
        assert seen["prompt_tokens_total", ()] == 20 and seen["generation_tokens_total", ()] == 30
        assert seen["e2e_request_latency_seconds_count", ()] == 5
        assert seen["request_generation_tokens_bucket", (("le", "+Inf"),)] == 5
        assert seen["hit_req_rate", ()] == pytest.approx(1 / 5)
        # engine totals and gauges: once, no pid label
        assert seen["request_preempted_total", ()] == 2
        assert seen["prefix_cache_token_num_total", ()] == 40
        assert seen["num_requests_running", ()] == 1 and seen["max_batch_size", ()] == 4
        assert seen["available_gpu_block_num", ()] == 30
        assert not any(name.startswith("fd_core:") for name, _ in seen)  # hit_req_rate's parts stay inside


def test_the_answering_worker_shows_the_engine_gauges_it_just_refreshed(monkeypatch, shared):
    old = EngineStats(num_running=5, num_free_blocks=10, num_free_uncached_blocks=10, time=time.time())
    new = EngineStats(num_running=1, num_free_blocks=30, num_free_uncached_blocks=30, time=time.time())
    a, b = worker(monkeypatch, 101, old), worker(monkeypatch, 102, new)
    time.sleep(0.01)  # b refreshes below, strictly after a did
    seen = samples(b)
    assert seen["num_requests_running", ()] == 1 and seen["available_gpu_block_num", ()] == 30
    del a


def test_a_scrape_shows_every_series_one_process_shows(monkeypatch, tmp_path):
    info = dataclasses.replace(INFO, max_num_seqs=0)  # max_batch_size never set: still shown, 0
    alone = Metrics(stats=EngineStats, info=info)
    monkeypatch.setenv(multiprocess.ENV_NAME, str(tmp_path))
    monkeypatch.setattr(multiprocess, "_shared_dir", str(tmp_path))
    shared = worker(monkeypatch, 101, EngineStats(), info)
    series = lambda m: {k for k in samples(m) if not k[0].endswith("_created")}  # noqa: E731
    assert series(shared) == series(alone)
    assert samples(shared)["max_batch_size", ()] == 0


def test_without_enable_the_registry_is_this_process_alone():
    metrics = Metrics(info=INFO)
    metrics.request_received()
    metrics.request_finished(finished(), max_tokens=8)
    assert multiprocess.shared_dir() is None
    assert samples(metrics)["requests_number_total", ()] == 1


def test_worker_environment_names_the_directory_only_while_workers_start(monkeypatch, tmp_path):
    monkeypatch.delenv(multiprocess.ENV_NAME, raising=False)
    with multiprocess.worker_environment(str(tmp_path)):
        assert os.environ[multiprocess.ENV_NAME] == str(tmp_path)
    assert multiprocess.ENV_NAME not in os.environ
    monkeypatch.setenv(multiprocess.ENV_NAME, "/elsewhere")
    with multiprocess.worker_environment(str(tmp_path)):
        pass
    assert os.environ[multiprocess.ENV_NAME] == "/elsewhere"


def test_enable_refuses_a_process_not_started_in_multiprocess_mode(monkeypatch, tmp_path):
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    with pytest.raises(RuntimeError, match="PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.enable(str(tmp_path))
    with pytest.raises(RuntimeError, match="does not exist"):
        multiprocess.enable(str(tmp_path / "missing"))
    assert multiprocess.shared_dir() is None


def test_make_shared_dir_is_fresh_and_empty():
    first, second = multiprocess.make_shared_dir(), multiprocess.make_shared_dir()
    try:
        assert first != second and os.listdir(first) == [] == os.listdir(second)
    finally:
        os.rmdir(first)
        os.rmdir(second)
