"""The profiling warm-up: the largest steps run before the KV pool exists, their
peak memory is measured and left free, and nothing they wrote reaches a request."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.config import EngineArgs
from fd_core.engine import core as core_module
from fd_core.engine import model_runner as runner_module
from fd_core.engine.core import EngineCore
from fd_core.engine.memory_profile import HostPeak, largest_steps, measure_peak_bytes
from fd_core.engine.model_runner import ModelRunner
from fd_core.plugins.types import MemoryInfo

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def dense(checkpoint_factory):
    return checkpoint_factory("tiny-dense")


def test_the_prefill_step_fills_the_token_budget_at_full_context():
    tokens, seq_lens, tables, num_decodes = largest_steps(2048, 32, 512, 16)[0]
    assert [len(t) for t in tokens] == [512] * 4 and num_decodes == 0
    assert seq_lens == [512] * 4  # every chunk ends at max_model_len: the longest context
    assert all(table == [0] * 32 for table in tables)  # all on the null block


def test_the_steps_stay_within_max_num_seqs_and_max_model_len():
    prefill, decode = largest_steps(2048, 3, 500, 64)
    assert [len(t) for t in prefill[0]] == [500, 500, 500]  # 3 sequences cannot take 2048 tokens
    assert all(len(table) == 8 for table in prefill[2])  # ceil(500 / 64)
    tokens, seq_lens, _, num_decodes = decode
    assert tokens == [[0]] * 3 and seq_lens == [500] * 3 and num_decodes == 3
    assert [len(t) for t in largest_steps(100, 8, 64, 16)[0][0]] == [64, 36]
    assert largest_steps(4, 8, 64, 16)[1][3] == 4  # a decode row is a batched token too


def test_host_peak_sees_memory_freed_before_the_span_ends():
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("this kernel does not let a process reset its VmHWM")
    peak = HostPeak()
    peak.start()
    block = np.ones(64 * MIB // 8)  # touched: resident
    del block
    assert peak.peak_bytes() >= 60 * MIB


class _Draining:
    """A device whose free memory drops by ``step_bytes`` once ``run`` ran (a caching allocator)."""

    def __init__(self, step_bytes: int) -> None:
        self.free, self.step_bytes = 10 * GIB, step_bytes

    def memory(self, device_id: int = 0) -> MemoryInfo:
        return MemoryInfo(total_bytes=16 * GIB, free_bytes=self.free)

    def run(self) -> None:
        self.free -= self.step_bytes


def test_an_accelerator_peak_is_the_drop_of_free_memory():
    device = _Draining(300 * MIB)
    assert measure_peak_bytes(device.run, "gpu", device) == 300 * MIB


class FakeDevice:
    """The CPU backend dressed as a ``device_type`` device of ``total`` bytes with ``free``
    free after the weights, less what a test marks ``reserved``."""

    def __init__(self, real: Any, total: int, free: int, device_type: str = "gpu") -> None:
        self._real, self.total, self.free, self.device_type = real, total, free, device_type
        self.reserved = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @property
    def info(self) -> Any:
        return dataclasses.replace(self._real.info, device_type=self.device_type)

    def memory(self, device_id: int = 0) -> MemoryInfo:
        return MemoryInfo(total_bytes=self.total, free_bytes=self.free - self.reserved)


@pytest.fixture
def events(monkeypatch):
    """Record ("execute" | "allocate", num_blocks) in order."""
    log: list[tuple[str, int]] = []
    execute, allocate = ModelRunner.execute, ModelRunner.allocate_kv_cache

    def traced_execute(self, step):
        log.append(("execute", self.num_blocks))
        return execute(self, step)

    def traced_allocate(self, num_blocks, *a, **k):
        log.append(("allocate", num_blocks))
        return allocate(self, num_blocks, *a, **k)

    monkeypatch.setattr(ModelRunner, "execute", traced_execute)
    monkeypatch.setattr(ModelRunner, "allocate_kv_cache", traced_allocate)
    return log


def _args(model, **kw) -> EngineArgs:
    base = dict(model=str(model), backend="cpu", max_model_len=256, max_num_seqs=4, block_size=16)
    return EngineArgs(**{**base, **kw})


def test_the_pool_is_sized_after_the_profiling_step(dense, cpu_backend, monkeypatch, events):
    step_bytes = 300 * MIB
    fake = FakeDevice(cpu_backend, total=16 * GIB, free=12 * GIB)
    monkeypatch.setattr(core_module, "get_backend", lambda name: fake)
    execute = ModelRunner.execute

    def reserving(self, step):  # the step's activations stay reserved in the allocator
        fake.reserved = step_bytes
        return execute(self, step)

    monkeypatch.setattr(ModelRunner, "execute", reserving)
    core = EngineCore(_args(dense, gpu_memory_utilization=0.5))
    per_block = ModelRunner.kv_bytes_per_block(core.model_config, 16)
    # 0.5 of 16 GiB, less the 4 GiB the weights hold, less the step's 300 MiB
    assert core.cache_config.num_blocks == (8 * GIB - 4 * GIB - step_bytes) // per_block
    assert events[0] == ("allocate", 1)  # the profiling pool: the null block only
    assert {e for e in events[1:-1]} == {("execute", 1)}  # every profiling step ran on it
    assert events[-1] == ("allocate", core.cache_config.num_blocks)  # then the real pool
    assert core.runner.num_blocks == core.cache_config.num_blocks


def test_cpu_start_up_does_not_profile(dense, monkeypatch, events):
    """The CPU pool is sized by need under half the free host memory: no profiling step
    (it would cost the 0.3B demo 11-25 s of start-up); the warm-up runs on the real pool."""
    def refuse(*a, **k):
        raise AssertionError("profiled on the CPU backend")

    monkeypatch.setattr(ModelRunner, "profile_run", refuse)
    core = EngineCore(_args(dense))
    assert events[0] == ("allocate", core.cache_config.num_blocks)
    assert {e for e in events[1:]} == {("execute", core.cache_config.num_blocks)}


def test_the_cpu_budget_subtracts_the_measured_peak(dense, cpu_backend, monkeypatch):
    monkeypatch.setattr(core_module, "profiles_steps", lambda device_type: True)  # profiling forced on
    step_bytes = 4 * MIB + MIB // 2
    fake = FakeDevice(cpu_backend, total=GIB, free=10 * MIB, device_type="cpu")
    monkeypatch.setattr(core_module, "get_backend", lambda name: fake)

    def fixed_peak(run, device_type, backend, device_id=0):
        run()
        return step_bytes

    monkeypatch.setattr(runner_module, "measure_peak_bytes", fixed_peak)
    core = EngineCore(_args(dense, enable_prefix_caching=False))
    per_block = ModelRunner.kv_bytes_per_block(core.model_config, 16)  # 8 KiB
    # half of the 10 MiB free after the weights, less the 4.5 MiB peak: 64 blocks, under the
    # 4 x 16 + 1 wanted (without the peak the budget would hold 640)
    assert core.cache_config.num_blocks == (5 * MIB - step_bytes) // per_block == 64
    core = EngineCore(_args(dense, enable_prefix_caching=False, max_num_seqs=1))
    # one 256-token sequence + the null block: the need caps the pool below the budget
    assert core.cache_config.num_blocks == 256 // 16 + 1


def test_an_override_skips_profiling(dense, monkeypatch, events):
    def refuse(*a, **k):
        raise AssertionError("profiled despite --num-gpu-blocks-override")

    monkeypatch.setattr(ModelRunner, "profile_run", refuse)
    core = EngineCore(_args(dense, num_gpu_blocks_override=40))
    assert core.cache_config.num_blocks == 40
    assert events[0] == ("allocate", 40)  # the warm-up ran on the real pool's null block
    assert {e for e in events[1:]} == {("execute", 40)}


def test_profiling_leaves_no_pool_behind(dense, cpu_backend):
    runner = ModelRunner(dense, cpu_backend, block_size=16, max_model_len=128)
    assert runner.profile_run(512, 4) >= 0
    assert runner.kv_caches == [] and runner.num_blocks == 0


def test_requests_after_profiling_match_an_unprofiled_engine(dense, monkeypatch):
    monkeypatch.setattr(core_module, "profiles_steps", lambda device_type: True)  # the CPU engine profiles too
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 2048, n)] for n in (1, 15, 16, 17, 90, 200)]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outputs = {}
    for name, extra in (("profiled", {}), ("override", dict(num_gpu_blocks_override=128))):
        llm = LLM(str(dense), backend="cpu", max_model_len=256, max_num_seqs=4, block_size=16, **extra)
        outputs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    assert all(len(ids) == 10 for ids in outputs["profiled"])
    assert outputs["profiled"] == outputs["override"]
