"""The ranks' ``paddle.distributed`` process group, made without paddle's global state.

What works with paddle 3.3.1 (found here, CPU build): ``init_parallel_env()``
makes a global group only when ``PADDLE_DISTRI_BACKEND=gloo`` is set on CPU, and
it is once per process (a second engine in the same process would get the
first one's group, whose peers are gone). So each engine makes its own: a
``TCPStore`` on rank 0's address (rank 0 its server), then the backend's process
group (``gloo`` on CPU; ``nccl`` / ``bkcl`` / ``xccl`` by the backend's
``DeviceInfo.collective_backend``) wrapped in a ``Group`` that
``paddle.distributed.all_reduce(x, group=...)`` takes. Paddle's C++ reads the
rank from ``PADDLE_TRAINER_ID`` (and the world from ``PADDLE_TRAINERS_NUM``),
so those are set first. A peer that dies makes the next collective raise (gloo:
"Connection closed by peer" / TIMEOUT) at once, rather than hang.

A store client that finds no server retries every 3 s, so rank 0 opens its
store first, in a thread (``open_store``; the constructor waits for every rank,
with the GIL released), while the ranks load.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from fd_core._paddle import import_paddle
from fd_core.parallel.config import ParallelConfig

__all__ = ["ProcessGroup", "StoreOpener", "free_port", "init_process_group"]

paddle = import_paddle()


class ProcessGroup:
    """A rank's group and the store it met the others through (kept alive with it)."""

    def __init__(self, group: Any, store: Any, backend: str) -> None:
        self.group = group
        self.store = store
        self.backend = backend


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now on ``host`` (for rank 0's rendezvous store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class StoreOpener:
    """Rank 0's store, opened in a daemon thread: ``result()`` once every rank connected."""

    def __init__(self, config: ParallelConfig, timeout_s: int) -> None:
        from paddle.base import core

        self._box: dict[str, Any] = {}

        def open_() -> None:
            try:
                self._box["store"] = core.TCPStore(config.master_addr, config.master_port, True,
                                                   config.world_size, timeout_s)
            except BaseException as exc:  # reported by result()
                self._box["error"] = exc

        self._thread = threading.Thread(target=open_, name="fd-tp-store", daemon=True)
        self._thread.start()

    def result(self, wait_s: float) -> Any | None:
        """The store; None while ranks are still missing after ``wait_s``."""
        self._thread.join(wait_s)
        if self._thread.is_alive():
            return None
        if "error" in self._box:
            raise RuntimeError(f"the rendezvous failed: {self._box['error']}")
        return self._box["store"]


def init_process_group(config: ParallelConfig, collective_backend: str, device_id: int = 0,
                       store: Any = None) -> ProcessGroup:
    """Meet the other ranks at ``config.master_addr:master_port`` (through ``store``
    when rank 0 opened it already) and make the group; blocks until every rank
    has come, at most ``rendezvous_timeout_s``."""
    from paddle.base import core
    from paddle.distributed.collective import _new_process_group_impl
    from paddle.distributed.communication.group import Group

    rank, world = config.rank, config.world_size
    os.environ["PADDLE_TRAINER_ID"] = str(rank)  # paddle's process group reads these
    os.environ["PADDLE_TRAINERS_NUM"] = str(world)
    if store is None:
        store = core.TCPStore(config.master_addr, config.master_port, rank == 0, world,
                              config.rendezvous_timeout_s)
    if collective_backend != "gloo":  # device collectives bind to the rank's device
        core.CommContextManager.set_device_id(device_id)
    # the group id keys the group's entries in the store and paddle's own tables: the same on
    # every rank of this engine, and not one an earlier engine of this process used
    gid = config.master_port
    name = f"fd_tp_{gid}"
    pg = _new_process_group_impl(collective_backend, store, rank, world, name, None, group_id=gid)
    group = Group(rank, gid, list(range(world)), pg=pg, name=name)
    return ProcessGroup(group, store, collective_backend)
