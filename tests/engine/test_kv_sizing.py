"""Sizing the KV cache: the CPU pool takes what the model needs within the budget."""

from __future__ import annotations

import pytest

from fd_core import envs
from fd_core.config import EngineArgs, kv_cache_blocks

GIB = 1 << 30
MIB = 1 << 20
BLOCK = 2 * MIB  # bytes of one KV block (all layers, K and V)


@pytest.fixture
def kvcache_space(monkeypatch: pytest.MonkeyPatch):
    """Set FD_CPU_KVCACHE_SPACE (None: unset, size to need) for one test."""

    def set_space(value: float | None) -> None:
        monkeypatch.setitem(envs._cache, "FD_CPU_KVCACHE_SPACE", value)

    set_space(None)
    yield set_space
    envs.reset()


def args(**kwargs) -> EngineArgs:
    base = dict(model="m", max_model_len=4096, max_num_seqs=16, block_size=64)
    return EngineArgs(**{**base, **kwargs})


def cpu_blocks(engine_args: EngineArgs, free_bytes: int = 64 * GIB) -> int:
    return kv_cache_blocks(engine_args, BLOCK, "cpu", 128 * GIB, free_bytes)


def test_cpu_pool_holds_max_num_seqs_full_sequences_plus_prefix_headroom(kvcache_space):
    # 4096 / 64 = 64 blocks a sequence, x 16 sequences, +25% for prefix caching, + the null block
    assert cpu_blocks(args()) == 64 * 16 * 5 // 4 + 1
    assert cpu_blocks(args(enable_prefix_caching=False)) == 64 * 16 + 1


def test_a_partial_last_block_counts_as_a_block(kvcache_space):
    assert cpu_blocks(args(max_model_len=100, max_num_seqs=3, enable_prefix_caching=False)) == 2 * 3 + 1


def test_a_tiny_model_does_not_take_gigabytes(kvcache_space):
    blocks = cpu_blocks(args(max_model_len=256, max_num_seqs=4))
    assert blocks * BLOCK < 64 * MIB


def test_the_pool_is_capped_by_utilization_of_free_memory(kvcache_space):
    free = 1 * GIB  # 0.5 GiB budget at utilization 0.5 = 256 blocks, under the 1281 wanted
    assert cpu_blocks(args(gpu_memory_utilization=0.5), free_bytes=free) == 256


def test_an_explicit_fd_cpu_kvcache_space_caps_the_pool(kvcache_space, monkeypatch):
    monkeypatch.setenv("FD_CPU_KVCACHE_SPACE", "0.25")
    envs.reset()
    assert cpu_blocks(args()) == 128  # 0.25 GiB / 2 MiB
    kvcache_space(0.25)  # the same through the cached value
    assert cpu_blocks(args()) == 128
    kvcache_space(100.0)  # a cap above the need does not grow the pool
    assert cpu_blocks(args()) == 64 * 16 * 5 // 4 + 1


def test_a_budget_below_one_full_sequence_names_the_numbers(kvcache_space):
    kvcache_space(0.1)  # 51 blocks; one 4096-token sequence needs 64 + the null block
    with pytest.raises(ValueError) as info:
        cpu_blocks(args())
    message = str(info.value)
    for part in ("FD_CPU_KVCACHE_SPACE 0.1 GiB", "holds 51 blocks of 64 tokens", "2.0 MiB each",
                 "--max-model-len 4096 sequence needs 64 blocks", "lower --max-model-len",
                 "--num-gpu-blocks-override"):
        assert part in message, (part, message)
    kvcache_space(None)
    with pytest.raises(ValueError, match="0.5 of the 0.10 GiB of host memory free after the weights"):
        cpu_blocks(args(), free_bytes=GIB // 10)
    with pytest.raises(ValueError, match="--gpu-memory-utilization 0.3 of 0.10 GiB free"):
        cpu_blocks(args(gpu_memory_utilization=0.3), free_bytes=GIB // 10)


def test_the_cpu_pool_leaves_half_the_host_memory_to_the_rest(kvcache_space):
    # FastDeploy's 0.3B line (--max-model-len 32768 --max-num-seqs 128) wants far more than the host:
    # the pool takes half of what the weights left, never gpu_memory_utilization 0.9 of it
    wanted = args(max_model_len=32768, max_num_seqs=128)
    assert cpu_blocks(wanted, free_bytes=20 * GIB) == 10 * GIB // BLOCK


def test_exactly_one_full_sequence_fits(kvcache_space):
    kvcache_space(65 * BLOCK / GIB)
    assert cpu_blocks(args()) == 65


def test_override_wins_everywhere(kvcache_space):
    kvcache_space(0.001)
    assert cpu_blocks(args(num_gpu_blocks_override=7)) == 7
    assert kv_cache_blocks(args(num_gpu_blocks_override=7), BLOCK, "gpu", GIB, 0) == 7


def test_accelerators_take_utilization_of_total_minus_what_is_in_use(kvcache_space):
    # 80 GiB card, 10 GiB in use (weights): 0.9 * 80 - 10 = 62 GiB, whatever the model needs
    blocks = kv_cache_blocks(args(max_model_len=128, max_num_seqs=1), BLOCK, "gpu", 80 * GIB, 70 * GIB)
    assert blocks == 62 * GIB // BLOCK
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        kv_cache_blocks(args(), BLOCK, "gpu", 80 * GIB, 7 * GIB)


def test_the_cpu_budget_leaves_the_largest_steps_peak_free(kvcache_space):
    # 0.5 of 1 GiB free = 512 MiB, less a 100 MiB step peak = 412 MiB: 206 blocks (256 without it)
    engine_args = args(gpu_memory_utilization=0.5)
    assert kv_cache_blocks(engine_args, BLOCK, "cpu", 128 * GIB, GIB, 100 * MIB) == 206
    # an explicit FD_CPU_KVCACHE_SPACE still caps what is left
    kvcache_space(0.25)
    assert kv_cache_blocks(engine_args, BLOCK, "cpu", 128 * GIB, GIB, 100 * MIB) == 128


def test_the_need_of_max_num_seqs_full_sequences_still_caps_the_pool(kvcache_space):
    # plenty of memory after the peak: the pool is what 16 sequences of 4096 tokens need, no more
    assert kv_cache_blocks(args(), BLOCK, "cpu", 128 * GIB, 64 * GIB, 4 * GIB) == 64 * 16 * 5 // 4 + 1


def test_a_step_peak_that_leaves_too_little_names_it(kvcache_space):
    # 512 MiB - 460 MiB = 26 blocks, under the 64 + 1 one 4096-token sequence needs
    with pytest.raises(ValueError, match="less the 0.45 GiB peak of the largest step") as info:
        kv_cache_blocks(args(), BLOCK, "cpu", 128 * GIB, GIB, 460 * MIB)
    assert "holds 26 blocks" in str(info.value) and "--max-num-batched-tokens" in str(info.value)


def test_accelerators_leave_the_step_peak_free(kvcache_space):
    # 0.9 * 80 - 10 GiB in use - a 2 GiB step peak = 60 GiB
    blocks = kv_cache_blocks(args(max_model_len=128, max_num_seqs=1), BLOCK, "gpu", 80 * GIB, 70 * GIB, 2 * GIB)
    assert blocks == 60 * GIB // BLOCK
    with pytest.raises(ValueError, match="less 10.00 GiB in use and a 62.00 GiB step peak"):
        kv_cache_blocks(args(), BLOCK, "gpu", 80 * GIB, 70 * GIB, 62 * GIB)
