"""The reference KV pool in any ``--kv-cache-dtype``: allocate, store rows,
read blocks back as fp32, copy blocks.

A pool is ``[S, Hkv, Dh]`` rows (``S = num_blocks * block_size``, slot
``block_id * block_size + offset``): a paddle tensor of dtype float32,
bfloat16 or float16, or a ``QuantizedKV`` (int8 / fp8 codes ``[S, Hkv, Dh]``
plus fp32 scales ``[S, Hkv]``; ``int8_static`` the same with every written
scale 1, see ``fd_core.ops.kv_dtype``). Attention
reads only the blocks a step needs and dequantizes those, so its math stays
fp32. On CPU the data moves through numpy views of the pool (paddle's CPU
scatter has no 8- or 16-bit kernels); elsewhere through paddle ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.ops._host import as_array, as_tensor
from fd_core.ops.kv_dtype import (
    dequantize,
    dequantize_tensor,
    is_quantized,
    quantize,
    quantize_tensor,
    storage_dtype,
)

__all__ = ["QuantizedKV", "allocate_pool", "copy_rows", "kv_dtype_of", "store_rows", "take_blocks"]

paddle = import_paddle()


@dataclass
class QuantizedKV:
    """One layer's K (or V) pool in an 8-bit dtype."""

    codes: Any  # [S, Hkv, Dh] paddle int8 (int8) or uint8 (fp8 e4m3fn bit patterns)
    scales: Any  # [S, Hkv] paddle fp32: row s, head h holds codes[s, h, :] * scales[s, h]
    kv_dtype: str  # "int8", "fp8" or "int8_static" (scales fixed at 1: fd_core.ops.kv_dtype)

    @property
    def shape(self) -> list[int]:
        return list(self.codes.shape)

    @property
    def place(self) -> Any:
        return self.codes.place

    def is_contiguous(self) -> bool:
        return bool(self.codes.is_contiguous())


_FLOAT_NAMES = {"paddle.float32": "float32", "paddle.bfloat16": "bfloat16", "paddle.float16": "float16"}


def kv_dtype_of(cache: Any) -> str:
    """The KV dtype name of a reference pool."""
    if isinstance(cache, QuantizedKV):
        return cache.kv_dtype
    name = _FLOAT_NAMES.get(str(cache.dtype))
    if name is None:
        raise TypeError(f"not a reference KV pool: a tensor of dtype {cache.dtype}")
    return name


def _zeros(shape: list[int], dtype: str, host: bool) -> Any:
    if not host:
        return paddle.zeros(shape, dtype=dtype)
    # on host whatever the current device is; numpy has no bf16: build fp32, cast there
    np_dtype = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
    return paddle.to_tensor(np.zeros(shape, dtype=np_dtype), place=paddle.CPUPlace()).astype(dtype)


def allocate_pool(rows: int, num_kv_heads: int, head_dim: int, kv_dtype: str, host: bool) -> Any:
    """A zeroed pool of ``rows`` slots (codes 0 and scales 0 when quantized)."""
    shape = [rows, num_kv_heads, head_dim]
    if is_quantized(kv_dtype):
        return QuantizedKV(_zeros(shape, storage_dtype(kv_dtype), host), _zeros(shape[:2], "float32", host),
                           kv_dtype)
    return _zeros(shape, storage_dtype(kv_dtype), host)


def _on_cpu(t: Any) -> bool:
    return bool(t.place.is_cpu_place())


def _host_view(t: Any) -> np.ndarray:
    """A writable numpy view of a CPU tensor (bf16 as its int16 bit patterns)."""
    if t.dtype == paddle.bfloat16:
        t = t.view(paddle.int16)
    return as_array(t)


def _parts(cache: Any) -> tuple[Any, Any]:
    return (cache.codes, cache.scales) if isinstance(cache, QuantizedKV) else (cache, None)


def store_rows(x: Any, cache: Any, slots: Any) -> None:
    """Write ``x [T, Hkv, Dh]`` (any float dtype) into rows ``slots [T]`` of
    ``cache``, rounded / quantized to its dtype."""
    kv_dtype = kv_dtype_of(cache)
    data, scales = _parts(cache)
    if _on_cpu(data):
        rows = as_array(slots.contiguous())
        stored, row_scales = quantize(as_array(x.astype("float32").contiguous()), kv_dtype)
        _host_view(data)[rows] = stored
        if scales is not None:
            as_array(scales)[rows] = row_scales
        return
    stored, row_scales = quantize_tensor(paddle, x, kv_dtype)
    paddle.scatter_(data, slots, stored, overwrite=True)
    if scales is not None:
        paddle.scatter_(scales, slots, row_scales, overwrite=True)


def take_blocks(cache: Any, blocks: np.ndarray, blocks_tensor: Any, block_size: int) -> Any:
    """Blocks ``blocks`` of a non-fp32 pool, dequantized: fp32 ``[Hkv, n, block_size, Dh]``."""
    kv_dtype = kv_dtype_of(cache)
    data, scales = _parts(cache)
    rows, num_kv, head_dim = data.shape
    num_blocks = rows // block_size
    if _on_cpu(data):
        table = _host_view(data).reshape(num_blocks, block_size, num_kv, head_dim)[blocks]
        table_scales = None if scales is None else as_array(scales).reshape(num_blocks, block_size, num_kv)[blocks]
        values = dequantize(table, table_scales, kv_dtype)  # [n, bs, Hkv, Dh]
        return as_tensor(values.transpose(2, 0, 1, 3))
    table = paddle.index_select(data.reshape([num_blocks, block_size, num_kv, head_dim]), blocks_tensor, axis=0)
    if scales is not None:
        scales = paddle.index_select(scales.reshape([num_blocks, block_size, num_kv]), blocks_tensor, axis=0)
    return dequantize_tensor(paddle, table, scales, kv_dtype).transpose([2, 0, 1, 3])


def _copy_tensor_rows(src: Any, dst: Any, src_rows: np.ndarray, dst_rows: np.ndarray) -> None:
    if _on_cpu(src) and _on_cpu(dst):
        _host_view(dst)[dst_rows] = _host_view(src)[src_rows]
        return
    rows = paddle.gather(src, paddle.to_tensor(src_rows, place=src.place))
    if _on_cpu(dst):
        _host_view(dst)[dst_rows] = _host_view(rows.to(dst.place))
        return
    rows = rows.to(dst.place) if rows.place != dst.place else rows
    paddle.scatter_(dst, paddle.to_tensor(dst_rows, place=dst.place), rows, overwrite=True)


def copy_rows(src_cache: Any, dst_cache: Any, src_rows: np.ndarray, dst_rows: np.ndarray) -> None:
    """Copy rows between two pools of the same dtype; scales move with their codes."""
    src_dtype, dst_dtype = kv_dtype_of(src_cache), kv_dtype_of(dst_cache)
    if src_dtype != dst_dtype:
        raise ValueError(f"cannot copy KV blocks from a {src_dtype} pool to a {dst_dtype} pool")
    src_data, src_scales = _parts(src_cache)
    dst_data, dst_scales = _parts(dst_cache)
    _copy_tensor_rows(src_data, dst_data, src_rows, dst_rows)
    if src_scales is not None:
        _copy_tensor_rows(src_scales, dst_scales, src_rows, dst_rows)
