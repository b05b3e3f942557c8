"""The engine in its own process: stats stay fresh without a step, several
clients share one engine, and the engine follows its parent."""

from __future__ import annotations

import asyncio
import time

import pytest

from fd_core.config import EngineArgs
from fd_core.engine.mp_engine import MPEngineClient
from fd_core.sampling.params import SamplingParams


@pytest.fixture(scope="module")
def engine_args(checkpoint_factory):
    model = checkpoint_factory("tiny-dense", "pytorch")
    return EngineArgs.from_kwargs(str(model), backend="cpu", max_model_len=512, max_num_seqs=4,
                                  num_gpu_blocks_override=64, block_size=16)


async def _until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        await asyncio.sleep(0.02)


def test_stats_are_fresh_before_the_first_request_and_after_an_abort_while_idle(engine_args):
    async def run() -> None:
        client = MPEngineClient(engine_args)
        try:
            client.start()
            await _until(lambda: client.stats().num_free_blocks > 0, "stats before the first request")
            idle_free = client.stats().num_free_blocks
            params = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)
            stream = client.generate("r1", "hello there", params)
            for _ in range(3):
                await stream.__anext__()
            assert client.stats().num_running == 1
            assert client.stats().num_free_blocks < idle_free
            await stream.aclose()  # the engine aborts it and has nothing left to step
            await _until(lambda: client.stats().num_running == 0, "num_running after the abort")
            assert client.stats().num_free_blocks == idle_free
        finally:
            await client.shutdown()
        assert not client.process.is_alive()

    asyncio.run(run())


def test_two_clients_share_one_engine_and_get_only_their_outputs(engine_args):
    async def run() -> None:
        owner = MPEngineClient(engine_args)
        guest = MPEngineClient(engine_args, endpoint=owner.endpoint, process=owner.process)
        try:
            params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0)

            async def collect(client: MPEngineClient, rid: str, prompt: str) -> list[int]:
                last = None
                async for out in client.generate(rid, prompt, params):
                    last = out
                assert last is not None and last.finished
                return last.outputs[0].token_ids

            a, b = await asyncio.gather(collect(owner, "same-id", "hello"), collect(guest, "other", "hello"))
            assert a == b and len(a) == 6
            # both see the engine's stats, though only one of them sent the last request
            await _until(lambda: guest.stats().num_free_blocks == owner.stats().num_free_blocks > 0,
                         "stats reach every client")
            await guest.shutdown()  # an attached client leaves the engine running
            assert owner.process.is_alive()
            assert len(await collect(owner, "again", "hi")) == 6
        finally:
            await owner.shutdown()
        assert not owner.process.is_alive()

    asyncio.run(run())


def test_a_failure_while_receiving_outputs_fails_the_waiters_instead_of_hanging(engine_args):
    from fd_core.engine.client import EngineDeadError

    async def run() -> None:
        client = MPEngineClient(engine_args)
        try:
            def broken(outputs):
                raise RuntimeError("bug in output processing")

            client.frontend.processor.process = broken  # type: ignore[method-assign]
            stream = client.generate("r1", "hello there", SamplingParams(max_tokens=4, temperature=0))
            with pytest.raises(EngineDeadError, match="stopped receiving engine outputs: RuntimeError"):
                await asyncio.wait_for(stream.__anext__(), 60)
            assert client.dead  # so the server exits instead of serving nothing
        finally:
            await client.shutdown()

    asyncio.run(run())


def test_a_request_id_refused_for_one_client_leaves_the_other_clients_request_alone(engine_args):
    from fd_core.engine.client import RequestError

    async def run() -> None:
        owner = MPEngineClient(engine_args)
        guest = MPEngineClient(engine_args, endpoint=owner.endpoint, process=owner.process)
        try:
            long = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0)
            first = owner.generate("same", "hello", long)
            await first.__anext__()  # admitted and running in the engine
            with pytest.raises(RequestError, match="already in use"):
                async for _ in guest.generate("same", "hello", long):  # the same id from another worker
                    pass
            async def rest() -> object:
                last = None
                async for out in first:  # ...must not end the owner's request
                    last = out
                return last

            last = await asyncio.wait_for(rest(), 60)  # before the fix it never finished
            assert last is not None and last.finished and len(last.outputs[0].token_ids) == 40
        finally:
            await guest.shutdown()
            await owner.shutdown()

    asyncio.run(run())
