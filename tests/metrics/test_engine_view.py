"""engine_view: the gauges are right before the engine publishes and after aborts."""

from __future__ import annotations

import time

from fd_core.engine.client import EngineInfo, EngineStats
from fd_core.metrics.engine_view import engine_view

INFO = EngineInfo("m", 256, 100, 65, 16, "cpu", max_num_seqs=8)  # 64 usable blocks


def busy(at: float) -> EngineStats:
    return EngineStats(num_running=3, num_waiting=2, num_preempted=1, kv_cache_usage=0.5, num_free_blocks=32,
                       num_free_uncached_blocks=20, num_cached_blocks=15, time=at)


def test_before_the_engine_publishes_everything_is_free():
    view = engine_view(EngineStats(), INFO, in_flight=0, last_end=0.0)
    assert (view.num_running, view.num_waiting, view.num_preempted, view.kv_cache_usage) == (0, 0, 0, 0.0)
    assert view.available_blocks == view.free_blocks == 64 and view.available_resource == 1.0
    assert view.available_batch_size == 8 and not view.fresh


def test_a_fresh_snapshot_is_shown_as_it_is():
    now = time.time()
    view = engine_view(busy(now), INFO, in_flight=3, last_end=now - 5)
    assert (view.num_running, view.num_waiting, view.num_preempted) == (3, 2, 1)
    assert (view.available_blocks, view.free_blocks, view.available_resource) == (32, 20, 0.5)
    assert view.available_batch_size == 5 and view.kv_cache_usage == 0.5 and view.fresh


def test_a_snapshot_older_than_the_last_abort_is_not_believed_when_nothing_is_in_flight():
    now = time.time()
    view = engine_view(busy(now - 1), INFO, in_flight=0, last_end=now)
    assert (view.num_running, view.num_waiting, view.kv_cache_usage) == (0, 0, 0.0)
    assert view.available_blocks == 64 and view.free_blocks == 64 - 15  # cached prefixes stay cached
    assert view.available_batch_size == 8 and not view.fresh
    # still in flight, or the engine spoke after the end: the snapshot stands
    assert engine_view(busy(now - 1), INFO, in_flight=1, last_end=now).fresh
    assert engine_view(busy(now + 1), INFO, in_flight=0, last_end=now).fresh


def test_without_engine_info_the_snapshot_is_all_there_is():
    view = engine_view(busy(1.0), None, in_flight=0, last_end=2.0)
    assert view.num_running == 3 and view.available_batch_size == 0 and view.available_resource == 0.0
