"""A request's KV blocks out of and into the paged pool, as bytes.

The pool's layout is the backend's own, so blocks move through the
backend's ops: ``allocate_kv_cache(location="host")`` makes a host staging
pool of exactly the blocks sent, ``copy_kv_blocks`` fills it from the device
pool (export) or empties it into the device pool (import). Only the staging
pool's host memory is read or written here: a paddle tensor (float32 /
bfloat16 / float16; bf16 as its 16-bit patterns) or an 8-bit pool's codes and
fp32 scales (``fd_core.ops.kv_storage.QuantizedKV``). A backend whose host
pool is something else must bring its own transport (``fd_kv_transport``).

Called by ``fd_core.disagg.prefill`` (export) and ``fd_core.disagg.decode``
(import), on the engine's thread, between steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.disagg.wire import ModelFingerprint
from fd_core.ops.kv_dtype import is_quantized, storage_dtype

__all__ = ["export_blocks", "fingerprint_of", "frame_sizes", "import_blocks", "parts_per_pool"]

paddle = import_paddle()


def fingerprint_of(core: Any) -> ModelFingerprint:
    """The model fingerprint of an ``EngineCore``."""
    runner, config = core.runner, core.model_config
    return ModelFingerprint(
        architecture=str(config.architecture), num_layers=int(config.num_layers),
        num_kv_heads=int(runner.num_kv_heads), head_dim=int(config.head_dim),
        block_size=int(core.cache_config.block_size), kv_dtype=str(runner.kv_cache_dtype),
        vocab_size=int(config.vocab_size),
    )


def parts_per_pool(kv_dtype: str) -> int:
    """Frames per layer per K/V: codes, and scales for an 8-bit KV dtype."""
    return 2 if is_quantized(kv_dtype) else 1


def frame_sizes(fp: ModelFingerprint, num_blocks: int) -> list[int]:
    """Bytes of each KV frame of ``num_blocks`` blocks: for each layer, K then V, each codes (then scales).
    Their sum is num_layers * 2 * blocks * block_size * kv_heads * (head_dim * itemsize [+ 4 for scales])."""
    rows = num_blocks * fp.block_size * fp.num_kv_heads
    itemsize = np.dtype("int16" if storage_dtype(fp.kv_dtype) == "bfloat16" else storage_dtype(fp.kv_dtype)).itemsize
    parts = [rows * fp.head_dim * itemsize] + ([rows * 4] if is_quantized(fp.kv_dtype) else [])
    return parts * (2 * fp.num_layers)


def _host_parts(pool: Any) -> list[np.ndarray]:
    """Writable numpy views of a host staging pool's parts."""
    tensors = [pool.codes, pool.scales] if hasattr(pool, "codes") else [pool]
    views = []
    for t in tensors:
        if not t.place.is_cpu_place():
            raise TypeError(f"the backend's host KV pool lives on {t.place}, not in host memory; "
                            "its backend must bring a transport (fd_kv_transport)")
        if t.dtype == paddle.bfloat16:
            t = t.view(paddle.int16)
        views.append(np.from_dlpack(t))
    return views


def _staging(core: Any, num_blocks: int) -> tuple[Any, Any]:
    runner = core.runner
    return runner.ops.allocate_kv_cache(num_blocks, runner.block_size, runner.num_kv_heads,
                                        runner.config.head_dim, runner.kv_cache_dtype, location="host")


def export_blocks(core: Any, block_ids: list[int]) -> list[bytes]:
    """The KV of ``block_ids`` (device pool) as frames, in ``frame_sizes`` order."""
    if not block_ids:
        return []
    runner = core.runner
    stage_k, stage_v = _staging(core, len(block_ids))
    order = list(range(len(block_ids)))
    frames: list[bytes] = []
    for cache in runner.kv_caches:
        for src, stage in ((cache.k, stage_k), (cache.v, stage_v)):
            runner.ops.copy_kv_blocks(src, stage, list(block_ids), order, runner.block_size)
            frames.extend(part.tobytes() for part in _host_parts(stage))
    return frames


def import_blocks(core: Any, block_ids: list[int], frames: list[bytes]) -> None:
    """Write ``frames`` (``export_blocks`` of the same number of blocks, checked
    by the caller) into ``block_ids`` of the device pool."""
    if not block_ids:
        return
    runner = core.runner
    stage_k, stage_v = _staging(core, len(block_ids))
    order = list(range(len(block_ids)))
    it = iter(frames)
    for cache in runner.kv_caches:
        for dst, stage in ((cache.k, stage_k), (cache.v, stage_v)):
            for part in _host_parts(stage):
                part.reshape(-1).view(np.uint8)[:] = np.frombuffer(next(it), dtype=np.uint8)
            runner.ops.copy_kv_blocks(stage, dst, order, list(block_ids), runner.block_size)
