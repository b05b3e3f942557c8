"""Engine memory does not grow with the number of requests served.

Fast tests: after many requests of every kind the engine's per-request maps
are empty, and no Python object type keeps growing (Paddle's tensor init
leaked one list per tensor made from host data: 2-3 KB per request).
The slow test runs ``fd_core.benchmarks.memory`` over 10,000 requests, in
process and through the engine process, and asserts RSS stays flat.
"""

from __future__ import annotations

import argparse
import collections
import gc
import random

import pytest

from fd_core.benchmarks.memory import build_parser, measure, report, request_plan
from fd_core.engine.core import EngineCoreRequest
from fd_core.engine.engine_process import _EngineLoop
from fd_core.engine.llm_engine import LLMEngine

ENGINE_KWARGS = dict(backend="cpu", max_model_len=256, max_num_seqs=16, num_gpu_blocks_override=256,
                     block_size=16)


@pytest.fixture(scope="module")
def engine(checkpoint_factory):
    return LLMEngine.from_kwargs(str(checkpoint_factory("tiny-dense", "pytorch")), **ENGINE_KWARGS)


def _serve(engine: LLMEngine, start: int, count: int, rng: random.Random, concurrency: int = 8) -> None:
    """``count`` requests of the benchmark's eight kinds, ``concurrency`` in flight."""
    in_flight, started, done = {}, start, 0
    while done < count:
        while len(in_flight) < concurrency and started < start + count:
            plan = request_plan(started, rng)
            engine.add_request(f"m{started}", plan.prompt, plan.params)
            in_flight[f"m{started}"] = plan
            started += 1
        for out in engine.step():
            if in_flight[out.request_id].abort_after_first and not out.finished:
                engine.abort_request(out.request_id)
            elif not out.finished:
                continue
            del in_flight[out.request_id]
            done += 1


def _type_counts() -> collections.Counter:
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def test_no_object_type_grows_with_requests_and_per_request_maps_empty(engine):
    rng = random.Random(0)
    _serve(engine, 0, 160, rng)  # every kind 20 times: caches and pools reach their size
    before = _type_counts()
    _serve(engine, 160, 160, rng)
    after = _type_counts()
    # a leak of one object per tensor shows here as ~2,600; bounded caches filling late (after
    # other tests in this process paddle's weak references once grew by 45) stay far below 100
    grown = {name: after[name] - before[name] for name in after if after[name] - before[name] > 100}
    assert not grown, f"object types that grew over 160 requests: {grown}"
    core, processor = engine.core, engine.processor
    assert not core._states and not core._prompt_logprobs and not core._pending
    assert not processor._parents and not processor._child_to_parent
    assert not core.scheduler.requests and not core.scheduler.running and not core.scheduler.waiting
    assert core.scheduler.make_stats().num_running == 0


class _Socket:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, parts: list[bytes]) -> None:
        self.sent.append(parts)


def test_engine_process_loop_forgets_every_request_owner(engine):
    """Finished, refused, aborted and stop-string-aborted requests all leave
    ``owners`` (request id -> API process) empty."""
    core = engine.core
    loop = _EngineLoop(core, _Socket())
    loop.handle(b"api", ("hello",))
    params = request_plan(0, random.Random(0)).params  # greedy, a few tokens
    requests = [EngineCoreRequest(f"o{i}", [5, 6, 7 + i], params, [2]) for i in range(6)]
    refused = EngineCoreRequest("bad", [10**9], params)  # outside the vocabulary
    loop.handle(b"api", ("add", [*requests, refused]))
    assert set(loop.owners) == {r.request_id for r in requests}
    loop.handle(b"api", ("abort", ["o0"], False))  # client gone
    loop.publish(core.step())
    loop.handle(b"api", ("abort", ["o1"], True))  # a stop string found by the API process
    loop.handle(b"other", ("abort", ["o2"], False))  # not its request: ignored
    while core.has_unfinished_requests():
        loop.publish(core.step())
    loop.handle(b"api", ("abort", ["o3"], True))  # already finished: nothing to do
    assert loop.owners == {}


def _args(engine_kind: str) -> argparse.Namespace:
    return build_parser().parse_args(["--engine", engine_kind, "--requests", "10000", "--warmup", "2000"])


# Measured with fd_core.benchmarks.memory on a 2-core AMD EPYC, 10,000 requests (glibc mmap
# threshold fixed at 1 MiB, the benchmark's default): before the fix 2,012 B/request offline and
# 3,004 in the engine process, linear; after it 79 offline and 133-183 in the engine process, a
# MiB or two of settling (allocator and interpreter pools) in the first half, flat after.
# 400 B/request is 5x below the leak and twice the worst reading after the fix.
SLOW_THRESHOLD = 400.0


@pytest.mark.slow
@pytest.mark.parametrize("engine_kind", ["offline", "mp"])
def test_rss_is_flat_over_10000_requests(engine_kind):
    result = measure(_args(engine_kind))
    print(report(result, SLOW_THRESHOLD))
    assert result.bytes_per_request < SLOW_THRESHOLD, report(result, SLOW_THRESHOLD)
