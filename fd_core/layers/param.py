"""Parameters: shaped slots that the checkpoint loader fills piece by piece."""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["Param"]

paddle = import_paddle()


class Param:
    """A weight of known shape. The loader writes checkpoint tensors into
    regions of a host buffer (``fill``), then ``finish`` moves it to a paddle
    tensor (``data``) and drops the buffer, one parameter at a time."""

    def __init__(self, shape: tuple[int, ...] | list[int], dtype: str = "float32") -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
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
        """Copy ``value`` into ``buffer[index]`` (the whole param when empty),
        reshaping when only the shape differs (a ``[1, E]`` bias into ``[E]``)."""
        if self._buffer is None:
            self._buffer = np.zeros(self.shape, dtype=np.float32)
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
        self.data = paddle.to_tensor(self._buffer.astype(self.dtype, copy=False))
        self._buffer = None

    def set(self, tensor: Any) -> None:
        """Use an existing paddle tensor (tests, tied weights)."""
        if tuple(tensor.shape) != self.shape:
            raise ValueError(f"expected shape {self.shape}, got {list(tensor.shape)}")
        self.data = tensor
        self._filled = self.numel

    def __repr__(self) -> str:
        return f"Param({list(self.shape)}, {self.dtype})"
