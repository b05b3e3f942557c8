"""The engine client one API process of ``fd-serve --workers N`` serves with.

``fd_core.entrypoints.workers`` calls ``worker_client`` in each API worker.
Under ``--scheduler-name local`` that is the worker's own engine client.
Under ``global`` each worker is an instance of its own in Redis, named
``<host>:<port>-w<i>``: a request's results must come back to the process
that holds its HTTP connection, so each worker has its own queue and results
list. The engine is shared, so each worker runs at most its share of the
engine's ``--max-num-seqs`` (divided by N, rounded up) at once; together they
fill it as one process would, and an idle worker steals from a busy one as
any instance does. (One API process, ``fd-serve`` without ``--workers``,
is wrapped by ``fd_core.entrypoints.serve`` directly, named ``<host>:<port>``.)
"""

from __future__ import annotations

import socket
from typing import Any

from fd_core.cluster.config import scheduler_config_from
from fd_core.engine.client import EngineClient

__all__ = ["instance_url", "worker_client", "worker_instance_name"]


def instance_url(host: str | None, port: int) -> str:
    """The HTTP address an instance advertises in its heartbeat: ``--host``, or this machine's
    name when it listens on every interface."""
    name = host if host and host not in ("0.0.0.0", "::") else socket.gethostname()
    return f"http://{name}:{port}"


def worker_instance_name(port: int, worker: int) -> str:
    """The default name in Redis of API worker ``worker`` of the server on ``port``."""
    return f"{socket.gethostname()}:{port}-w{worker}"


def worker_client(inner: EngineClient, ns: Any, worker: int) -> EngineClient:
    """``inner`` itself, or under ``--scheduler-name global`` a ``GlobalSchedulerClient``
    of its own for API worker ``worker`` of ``ns.workers`` (flags checked already)."""
    config = scheduler_config_from(ns)
    if config is None:
        return inner
    from fd_core.cluster.client import GlobalSchedulerClient

    workers = max(1, int(getattr(ns, "workers", 1) or 1))
    capacity = -(-(inner.info.max_num_seqs or 8) // workers)
    return GlobalSchedulerClient(inner, config, default_name=worker_instance_name(ns.port, worker),
                                 capacity=capacity, url=instance_url(getattr(ns, "host", None), ns.port))
