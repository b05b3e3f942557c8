"""Prometheus metrics of the serving layer, named as FastDeploy names them.

Owns the ``Metrics`` class: its own ``CollectorRegistry`` (never the global
one, so several apps can live in one process), engine gauges refreshed from
``EngineStats`` at scrape time through ``engine_view`` (which corrects a
snapshot the API process knows to be stale: before the engine's first one,
right after aborts), and per-request histograms/counters recorded when a
request ends. With several API processes (``--workers N``),
``multiprocess`` makes one scrape server-wide (prometheus_client's
multiprocess mode over a per-run directory). May import only
prometheus_client and fd_core.engine's plain-data modules (client stats,
outputs): no paddle, no numpy.
"""

from fd_core.metrics.prometheus import METRIC_PREFIX, Metrics

__all__ = ["METRIC_PREFIX", "Metrics"]
