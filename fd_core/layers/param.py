"""Parameters: shaped slots that the checkpoint loader fills piece by piece.

A parameter is stored in its ``dtype``: ``float32``, ``float16`` or
``bfloat16``. On the host, before it becomes a paddle tensor, a bf16 buffer
is numpy ``uint16`` holding the bits (numpy has no bf16; paddle reads a
``uint16`` array as bf16). ``cast_host`` converts between these host forms,
rounding to nearest even when narrowing, as torch and paddle do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["FLOAT_DTYPES", "Param", "cast_host", "host_dtype"]

paddle = import_paddle()

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_HOST: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16),
}


def host_dtype(dtype: str) -> np.dtype:
    """The numpy dtype holding a ``dtype`` tensor on the host (bf16: its bits as uint16)."""
    if dtype not in _HOST:
        raise ValueError(f"unsupported parameter dtype {dtype!r}; expected one of {FLOAT_DTYPES}")
    return _HOST[dtype]


def _bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fp32_to_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(values)
    if nan.any():  # rounding could carry a NaN's payload into the exponent: keep it a quiet NaN
        rounded[nan] = 0x7FC0
    return rounded.astype(np.uint16)


def cast_host(array: np.ndarray, src: str, dst: str) -> np.ndarray:
    """``array`` (host form of ``src``) in the host form of ``dst``; the same
    array when the two agree. Narrowing rounds to nearest even; values beyond
    fp16's range become inf (the loader checks for that)."""
    if src == dst:
        return array
    if src not in _HOST:  # integer checkpoint tensors: numeric cast
        wide = np.asarray(array, dtype=np.float32)
    else:
        wide = _bf16_to_fp32(array) if src == "bfloat16" else np.asarray(array, dtype=np.float32)
    if dst == "bfloat16":
        return _fp32_to_bf16(wide)
    with np.errstate(over="ignore"):  # fp16 overflow is inf; the loader refuses it by name
        return wide.astype(host_dtype(dst), copy=False)


class Param:
    """A weight of known shape. The loader writes checkpoint tensors into
    regions of a host buffer (``fill``), then ``finish`` moves it to a paddle
    tensor (``data``) and drops the buffer, one parameter at a time.

    ``dtype`` is the storage dtype; the loader sets it for the whole model
    before filling (``--dtype``) unless ``pinned`` (kept fp32 whatever the
    model's dtype, e.g. a MoE router, whose top-k choice is precision sensitive)."""

    def __init__(self, shape: tuple[int, ...] | list[int], dtype: str = "float32", pinned: bool = False) -> None:
        self.shape = tuple(int(s) for s in shape)
        host_dtype(dtype)
        self.dtype = dtype
        self.pinned = pinned
        self.data: Any = None  # paddle tensor once loaded
        self._buffer: np.ndarray | None = None
        self._filled = 0

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))

    @property
    def complete(self) -> bool:
        return self.data is not None or self._filled == self.numel

    def fill(self, value: np.ndarray, index: tuple[Any, ...] = ()) -> None:
        """Copy ``value`` (already in ``host_dtype(self.dtype)``) into
        ``buffer[index]`` (the whole param when empty), reshaping when only
        the shape differs (a ``[1, E]`` bias into ``[E]``)."""
        if self._buffer is None:
            self._buffer = np.zeros(self.shape, dtype=host_dtype(self.dtype))
        region = self._buffer[index] if index else self._buffer
        if region.shape != value.shape:
            if region.size != value.size:
                raise ValueError(f"region {index} has shape {region.shape}, value has {value.shape}")
            value = value.reshape(region.shape)
        region[...] = value
        self._filled += value.size

    def finish(self) -> None:
        """Move the filled buffer to a paddle tensor of ``dtype``."""
        if self._buffer is None:
            raise ValueError("parameter was never filled")
        self.data = paddle.to_tensor(self._buffer, dtype=self.dtype)
        self._buffer = None

    def set(self, tensor: Any) -> None:
        """Use an existing paddle tensor (tests, tied weights)."""
        if tuple(tensor.shape) != self.shape:
            raise ValueError(f"expected shape {self.shape}, got {list(tensor.shape)}")
        self.data = tensor
        self._filled = self.numel

    def __repr__(self) -> str:
        return f"Param({list(self.shape)}, {self.dtype})"
