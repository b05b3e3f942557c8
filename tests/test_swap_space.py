"""--swap-space beyond what the host can spare is clamped with a warning, never a crash."""

from __future__ import annotations

import logging

from fd_core.config import GIB, EngineArgs, host_swap_blocks


def test_swap_space_within_the_host_is_taken_as_asked():
    assert host_swap_blocks(1.0, GIB // 64, available_bytes=16 * GIB) == 64
    assert host_swap_blocks(0.0, 1 << 20, available_bytes=16 * GIB) == 0


def test_swap_space_50_on_a_small_host_is_clamped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="fd_core.config"):
        blocks = host_swap_blocks(50.0, 1 << 20, available_bytes=8 * GIB, reserved_bytes=2 * GIB)
    assert blocks == 3 * 1024  # half of the 6 GiB left after the KV pool, in 1 MiB blocks
    (record,) = caplog.records
    assert "--swap-space 50 GiB" in record.getMessage() and "8.00 GiB available" in record.getMessage()


def test_unknown_host_memory_does_not_clamp():
    assert host_swap_blocks(2.0, GIB, available_bytes=0) == 2


def test_swap_space_without_prefix_caching_allocates_nothing(checkpoint_factory, caplog):
    from fd_core.engine.core import EngineCore

    args = EngineArgs.from_kwargs(str(checkpoint_factory("tiny-dense")), backend="cpu", max_model_len=64,
                                  num_gpu_blocks_override=16, block_size=16, swap_space=0.01,
                                  enable_prefix_caching=False)
    with caplog.at_level(logging.INFO, logger="fd_core.engine.core"):
        core = EngineCore(args)
    assert core.cache_config.num_host_blocks == 0 and core.runner.host_caches == []
    assert any("--swap-space 0.01 has no effect with prefix caching off" in r.getMessage() for r in caplog.records)
    with_caching = EngineCore(EngineArgs.from_kwargs(
        str(checkpoint_factory("tiny-dense")), backend="cpu", max_model_len=64, num_gpu_blocks_override=16,
        block_size=16, swap_space=0.01))
    assert with_caching.cache_config.num_host_blocks > 0
