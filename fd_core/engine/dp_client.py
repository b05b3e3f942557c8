"""``DataParallelClient``: ``--data-parallel-size N`` engine replicas behind one API server.

Built by ``fd_core.entrypoints.serve`` in place of one ``MPEngineClient``; the
API server sees one ``EngineClient`` and knows nothing of the replicas. Each
replica is a whole engine core process (``MPEngineClient(args)`` with
``data_parallel_size=1``), with its own scheduler, KV cache and, with
``--tensor-parallel-size``, its own worker ranks. The replicas start one after
another; on a host backend (the CPU: no visible-devices variable) each runs
``cores // (N * tp)`` threads per rank, on a device backend replica ``i`` gets
devices ``[i*tp, (i+1)*tp)`` of the visible-devices list.

Routing: a new request goes to the live replica with the least load, its
running + waiting requests as its latest stats say or the requests this client
has in flight there, whichever is larger (stats lag a step behind); ties go to
the replica that has been given the fewest requests, so an idle server takes
turns. Aborts go to the replica that holds the request, and its stream comes
from there only.

A replica that dies fails its own requests (``EngineDeadError`` naming the
replica and its exit code) and is logged once at ERROR; new requests go to the
others. When none is left, ``check_health`` raises and ``dead`` is true, so the
server answers 503 and exits 1 (``fd_core.entrypoints.lifecycle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fd_core.config import EngineArgs
from fd_core.engine.client import EngineClient, EngineDeadError, EngineStats, admit
from fd_core.engine.mp_engine import MPEngineClient
from fd_core.engine.outputs import RequestOutput
from fd_core.sampling.params import SamplingParams

__all__ = ["DataParallelClient", "ReplicaDeadError"]

logger = logging.getLogger(__name__)

WATCH_SECONDS = 0.5  # how often the replicas' liveness is checked for the log line
_THREADS = "FD_CPU_NUM_THREADS"


class ReplicaDeadError(EngineDeadError):
    """The data-parallel replica that held a request died."""


class _Replicas:
    """``process`` of the whole: alive while any replica is (``lifecycle`` reads it)."""

    def __init__(self, clients: list[MPEngineClient]) -> None:
        self._clients = clients

    def is_alive(self) -> bool:
        return any(c.process.is_alive() for c in self._clients)

    @property
    def exitcode(self) -> int | None:
        codes = [c.process.exitcode for c in self._clients]
        return None if self.is_alive() else next((c for c in codes if c), codes[0])

    @property
    def pid(self) -> int:
        return int(self._clients[0].process.pid or 0)


class DataParallelClient(EngineClient):
    """One ``EngineClient`` over ``args.data_parallel_size`` engine processes (module doc)."""

    def __init__(self, args: EngineArgs, startup_timeout: float = 900.0) -> None:
        size = args.data_parallel_size
        if size < 2:
            raise ValueError(f"DataParallelClient needs data_parallel_size >= 2, got {size}")
        one = dataclasses.replace(args, data_parallel_size=1)
        self.replicas: list[MPEngineClient] = []
        try:
            for i in range(size):
                with _replica_environment(args, i, size):
                    self.replicas.append(MPEngineClient(one, startup_timeout))
                logger.info("data-parallel replica %d of %d: engine pid %s", i, size, self.replicas[i].process.pid)
        except BaseException:
            self.close()
            raise
        first = self.replicas[0]
        self.tokenizer = first.tokenizer
        # the replicas' capacity as one engine's (one null block), matching the summed ``stats``
        self.info = dataclasses.replace(
            first.info, max_num_seqs=sum(r.info.max_num_seqs for r in self.replicas),
            num_kv_blocks=sum(r.info.num_kv_blocks - 1 for r in self.replicas) + 1,
            num_host_blocks=sum(r.info.num_host_blocks for r in self.replicas))
        self.process = _Replicas(self.replicas)
        self.served = [0] * size  # requests routed to each replica
        self._owner: dict[str, int] = {}  # request id -> the replica index that holds it
        self._reported: set[int] = set()  # replicas whose death was logged
        self._closing: BaseException | None = None
        self._watcher: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            self._report_dead()
            await asyncio.sleep(WATCH_SECONDS)

    def _report_dead(self) -> None:
        for i, replica in enumerate(self.replicas):
            if i not in self._reported and replica.dead:
                self._reported.add(i)
                left = len(self.replicas) - len(self._reported)
                logger.error("data-parallel replica %d (engine pid %s) died (exit code %s); its requests failed; "
                             "%d of %d replicas serve on", i, replica.process.pid, replica.process.exitcode,
                             left, len(self.replicas))

    @property
    def dead(self) -> bool:
        return all(r.dead for r in self.replicas)

    async def check_health(self) -> None:
        if self.dead:
            codes = ", ".join(f"replica {i}: exit code {r.process.exitcode}" for i, r in enumerate(self.replicas))
            raise EngineDeadError(f"every data-parallel replica died ({codes}); see the engine log above")

    def stats(self) -> EngineStats:
        """The replicas' stats summed (usage: the mean; time: the latest)."""
        live = [r.stats() for r in self.replicas if not r.dead] or [EngineStats()]
        total = EngineStats()
        for field in dataclasses.fields(EngineStats):
            values = [getattr(s, field.name) for s in live]
            if field.name == "kv_cache_usage":
                setattr(total, field.name, sum(values) / len(values))
            elif field.name == "time":
                setattr(total, field.name, max(values))
            else:
                setattr(total, field.name, sum(values))
        return total

    @property
    def num_in_flight(self) -> int:
        return sum(r.num_in_flight for r in self.replicas)

    async def shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await asyncio.gather(*(r.shutdown() for r in self.replicas), return_exceptions=True)

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    @staticmethod
    def new_request_id(prefix: str = "req") -> str:
        return MPEngineClient.new_request_id(prefix)

    # ------------------------------------------------------------ requests

    def _load(self, i: int) -> int:
        replica = self.replicas[i]
        st = replica.stats()
        return max(replica.num_in_flight, st.num_running + st.num_waiting + st.num_enqueued)

    def pick(self) -> int:
        """The live replica a new request goes to (least loaded; then fewest given; then lowest index)."""
        live = [i for i, r in enumerate(self.replicas) if not r.dead]
        if not live:
            raise EngineDeadError("every data-parallel replica died; the server cannot serve")
        return min(live, key=lambda i: (self._load(i), self.served[i], i))

    async def generate(
        self, request_id: str, prompt: str | list[int] | dict[str, Any], params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        await admit(self, request_id, self._owner, self._closing)
        i = self.pick()
        replica = self.replicas[i]
        self._owner[request_id] = i
        self.served[i] += 1
        logger.debug("request %s -> data-parallel replica %d", request_id, i)
        try:
            async for out in replica.generate(request_id, prompt, params, arrival_time):
                if out.finished:
                    logger.info("data-parallel replica %d (engine pid %s) finished request %s", i,
                                replica.process.pid, request_id)
                yield out
        except EngineDeadError as exc:
            if exc is self._closing:
                raise
            self._report_dead()
            raise ReplicaDeadError(f"data-parallel replica {i} (engine pid {replica.process.pid}), which held this "
                                   f"request, died: {exc}") from None
        finally:
            self._owner.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        i = self._owner.get(request_id)
        if i is not None:
            await self.replicas[i].abort(request_id)

    async def abort_all(self, error: BaseException) -> int:
        self._closing = error
        counts = await asyncio.gather(*(r.abort_all(error) for r in self.replicas))
        return int(sum(counts))


@contextlib.contextmanager
def _replica_environment(args: EngineArgs, index: int, size: int) -> Iterator[None]:
    """The environment replica ``index`` starts with (spawned processes copy ``os.environ``):
    its share of the host's cores, or its devices from the backend's visible-devices list."""
    from fd_core.backends import get_backend

    tp = args.tensor_parallel_size
    variable = get_backend(args.backend).info.visible_devices_env
    saved = dict(os.environ)
    try:
        if variable is None:
            if os.environ.get(_THREADS) is None:  # set: each rank's count already
                os.environ[_THREADS] = str(max(1, len(os.sched_getaffinity(0)) // (size * tp)))
        else:
            visible = [d for d in os.environ.get(variable, "").split(",") if d.strip()]
            if len(visible) < size * tp:
                raise ValueError(f"--data-parallel-size {size} x --tensor-parallel-size {tp} needs {size * tp} "
                                 f"devices, but {variable}={os.environ.get(variable, '')} lists {len(visible)}")
            os.environ[variable] = ",".join(visible[index * tp:(index + 1) * tp])
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
