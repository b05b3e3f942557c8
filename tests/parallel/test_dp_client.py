"""DataParallelClient's routing and failure rules over stand-in replicas (no engine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from fd_core.engine.client import EngineDeadError, EngineStats
from fd_core.engine.dp_client import DataParallelClient, ReplicaDeadError, _Replicas


class _Process:
    def __init__(self, pid: int) -> None:
        self.pid, self.exitcode = pid, None

    def is_alive(self) -> bool:
        return self.exitcode is None


class _Replica:
    """What DataParallelClient reads of an MPEngineClient."""

    def __init__(self, pid: int, running: int = 0, waiting: int = 0) -> None:
        self.process = _Process(pid)
        self._stats = EngineStats(num_running=running, num_waiting=waiting, time=1.0)
        self.num_in_flight = 0
        self.aborted: list[str] = []
        self.die_mid_request = False

    @property
    def dead(self) -> bool:
        return not self.process.is_alive()

    def stats(self) -> EngineStats:
        return self._stats

    def start(self) -> None:
        pass

    async def generate(self, request_id, prompt, params, arrival_time=None):
        self.num_in_flight += 1
        try:
            if self.die_mid_request:
                self.process.exitcode = -9
                raise EngineDeadError("the engine process died (exit code -9); see its log above")
            yield SimpleNamespace(request_id=request_id, finished=True)
        finally:
            self.num_in_flight -= 1

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _client(*replicas: _Replica) -> DataParallelClient:
    client = DataParallelClient.__new__(DataParallelClient)
    client.replicas = list(replicas)  # type: ignore[arg-type]
    client.process = _Replicas(client.replicas)
    client.served = [0] * len(replicas)
    client._owner, client._reported, client._closing, client._watcher = {}, set(), None, None
    return client


async def _drain(client: DataParallelClient, request_id: str) -> list[object]:
    return [out async for out in client.generate(request_id, "hi", None)]  # type: ignore[arg-type]


def test_requests_go_to_the_least_loaded_replica_then_take_turns():
    busy, idle = _Replica(1, running=3, waiting=2), _Replica(2, running=1)
    assert _client(busy, idle).pick() == 1
    a, b = _Replica(1), _Replica(2)
    client = _client(a, b)
    for i in range(4):
        asyncio.run(_drain(client, f"r{i}"))
    assert client.served == [2, 2]


def test_a_dead_replica_is_skipped_and_none_left_is_an_engine_dead_error():
    a, b = _Replica(1), _Replica(2)
    client = _client(a, b)
    a.process.exitcode = -9
    assert client.pick() == 1 and not client.dead and client.process.is_alive()
    asyncio.run(client.check_health())
    b.process.exitcode = 1
    assert client.dead and not client.process.is_alive() and client.process.exitcode == -9
    with pytest.raises(EngineDeadError, match=r"every data-parallel replica died \(replica 0: exit code -9, "
                                              r"replica 1: exit code 1\)"):
        asyncio.run(client.check_health())


def test_a_replica_that_dies_fails_its_request_naming_it():
    a, b = _Replica(11), _Replica(12)
    a.die_mid_request = True
    client = _client(a, b)
    with pytest.raises(ReplicaDeadError, match=r"data-parallel replica 0 \(engine pid 11\), which held this "
                                               r"request, died: the engine process died \(exit code -9\)"):
        asyncio.run(_drain(client, "x"))
    assert client._reported == {0} and client.pick() == 1


def test_stats_sum_the_live_replicas():
    client = _client(_Replica(1, running=2, waiting=1), _Replica(2, running=1, waiting=4))
    st = client.stats()
    assert (st.num_running, st.num_waiting) == (3, 5)
