"""What the engine gauges show at a scrape: ``engine_view(stats, info, ...)``.

Pure Python, so the rules are tested without prometheus. The engine sends
``EngineStats`` with its outputs, after aborts and while idle; between two
snapshots the API process knows things the last snapshot cannot:

- before the engine has published anything (``stats.time == 0``) the engine
  is idle: nothing running, every usable block free (from ``EngineInfo``);
- when no request of this API process is in flight and the snapshot is
  older than the last request that ended here, that request's abort has not
  been reported yet: the engine is idle too (its cached prefixes stay).

With several API processes sharing an engine (``--workers``) the second rule
can show idle for the moment between another worker's request arriving and
the engine's next snapshot; the engine publishes after every step, so that
moment is one step long.
"""

from __future__ import annotations

from dataclasses import dataclass

from fd_core.engine.client import EngineInfo, EngineStats

__all__ = ["EngineView", "engine_view"]


@dataclass(frozen=True)
class EngineView:
    """The numbers behind every engine gauge (FastDeploy's meanings)."""

    num_running: int  # num_requests_running, batch_size
    num_waiting: int  # num_requests_waiting (preempted ones included)
    num_preempted: int  # num_requests_preempted
    num_enqueued: int  # num_requests_enqueued
    available_batch_size: int  # max_num_seqs - running (0 when max_num_seqs is unknown)
    kv_cache_usage: float  # gpu_cache_usage_perc, in [0, 1]
    available_blocks: int  # available_gpu_block_num: free, cached free ones included
    free_blocks: int  # free_gpu_block_num: free and holding no cached prefix
    available_resource: float  # available_gpu_resource: available / usable blocks
    fresh: bool  # False when the view was derived, not read from the snapshot


def engine_view(stats: EngineStats, info: EngineInfo | None, in_flight: int, last_end: float) -> EngineView:
    """The gauges' values from the latest snapshot and the API process's own state:
    ``in_flight`` generation requests of this process not ended yet, ``last_end``
    the time.time() the latest of them ended (0: none yet)."""
    usable = max(0, info.num_kv_blocks - 1) if info is not None else 0
    max_seqs = info.max_num_seqs if info is not None else 0
    never = stats.time == 0.0
    stale = in_flight == 0 and stats.time < last_end
    if info is not None and (never or stale):
        cached = 0 if never else min(stats.num_cached_blocks, usable)
        return EngineView(
            num_running=0, num_waiting=0, num_preempted=0, num_enqueued=0,
            available_batch_size=max_seqs, kv_cache_usage=0.0, available_blocks=usable,
            free_blocks=usable - cached, available_resource=1.0 if usable else 0.0, fresh=False,
        )
    return EngineView(
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_preempted=stats.num_preempted,
        num_enqueued=stats.num_enqueued,
        available_batch_size=max(0, max_seqs - stats.num_running),
        kv_cache_usage=stats.kv_cache_usage,
        available_blocks=stats.num_free_blocks,
        free_blocks=stats.num_free_uncached_blocks,
        available_resource=stats.num_free_blocks / usable if usable else 0.0,
        fresh=True,
    )
