"""Server-wide /metrics with several API processes (``--workers N``), on
prometheus_client's multiprocess mode.

Who does what:
- the main process makes one fresh directory per run (``make_shared_dir``),
  starts the workers inside ``worker_environment(path)`` (prometheus_client
  takes ``PROMETHEUS_MULTIPROC_DIR`` from the environment a process starts
  with: every metric the worker creates then keeps its value in an mmap'd
  file there, one file per process and kind), and removes the directory once
  they have exited;
- each worker is also given the path as an argument and calls ``enable(path)``
  before building its app, so ``Metrics`` renders through ``ServerWide``;
- a scrape, answered by any one worker: per-request counters and histograms
  are summed over the workers' files; engine gauges are the same in every
  worker and stored with ``multiprocess_mode="mostrecent"``, so the one that
  answers (it refreshes them right before) is shown once; engine totals that
  ``Metrics`` turns into counters are the answering worker's own (each worker
  follows the same totals: summing would count them once per worker);
  ``hit_req_rate`` is recomputed from the summed request counts.

``--workers 1`` never calls ``enable``: one process, one private registry.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Iterable, Iterator

from prometheus_client import values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import CollectorRegistry

__all__ = ["ENV_NAME", "ServerWide", "enable", "make_shared_dir", "shared_dir", "worker_environment"]

ENV_NAME = "PROMETHEUS_MULTIPROC_DIR"  # the name prometheus_client reads at import

_shared_dir: str | None = None  # set by ``enable`` in an API worker


def make_shared_dir() -> str:
    """A fresh, empty directory for one run's metric files (the caller removes it):
    a directory left from an earlier run would add that run's counts."""
    return tempfile.mkdtemp(prefix="fd-metrics-")


@contextlib.contextmanager
def worker_environment(path: str) -> Iterator[None]:
    """Processes started inside this block (spawned: they copy ``os.environ``)
    keep their metrics in ``path``; the calling process's environment is restored after."""
    previous = os.environ.get(ENV_NAME)  # restored, not configuration
    os.environ[ENV_NAME] = path
    try:
        yield
    finally:
        if previous is None:
            del os.environ[ENV_NAME]
        else:
            os.environ[ENV_NAME] = previous


def enable(path: str) -> None:
    """Make every ``Metrics`` built later in this process server-wide over ``path``;
    raises RuntimeError if prometheus_client did not start in multiprocess mode
    (the process was not started inside ``worker_environment``)."""
    global _shared_dir
    if not os.path.isdir(path):
        raise RuntimeError(f"metrics directory {path!r} does not exist; the main process makes it per run")
    if values.ValueClass is values.MutexValue:
        raise RuntimeError(f"prometheus_client keeps this process's metrics in memory, not in {path!r}: "
                           f"start the process with {ENV_NAME}={path} in its environment")
    _shared_dir = path


def shared_dir() -> str | None:
    """The directory ``enable`` was given in this process (None: single-process metrics)."""
    return _shared_dir


class ServerWide:
    """The families of ``local`` (this process's ``Metrics`` registry, in its
    order), their values merged from every process's files in ``path``.

    ``own``: families shown with this process's values (engine totals).
    ``ratio``: (family, numerator, denominator): a gauge recomputed from two
    summed counters that are not in ``local`` (kept out of the output).
    """

    def __init__(self, local: CollectorRegistry, path: str, own: Iterable[str],
                 ratio: tuple[str, str, str]) -> None:
        self.local = local
        self.path = path
        self.own = frozenset(own)
        self.ratio = ratio

    def collect(self) -> Iterable[Metric]:
        files = glob.glob(os.path.join(self.path, "*.db"))
        merged = {m.name: m for m in MultiProcessCollector.merge(files, accumulate=True)}
        name, numerator, denominator = self.ratio
        for family in self.local.collect():
            if family.name in self.own:
                yield family
            elif family.name == name:
                total = _single(merged.get(denominator))
                yield GaugeMetricFamily(family.name, family.documentation,
                                        _single(merged.get(numerator)) / total if total else 0.0)
            else:
                shared = merged.get(family.name)
                # no sample: a labelled family with no child yet, or a "mostrecent" gauge never set
                # (prometheus_client leaves those out; this process shows its 0)
                yield shared if shared is not None and shared.samples else family


def _single(family: Metric | None) -> float:
    """The value of an unlabelled counter family (0 when absent)."""
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples if s.name.endswith("_total"))
