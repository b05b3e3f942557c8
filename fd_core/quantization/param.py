"""A parameter the loader fills in fp32 and that is stored quantized.

Drop-in for ``fd_core.layers.param.Param``: the loader writes checkpoint
tensors into regions of it (``fill``) exactly as before. Each ``[in, out]``
matrix (for stacked experts ``[E, in, out]``: each expert's) is quantized
the moment its last element arrives and its fp32 buffer is dropped, so at
most the matrices being filled are held in fp32. ``finish`` leaves a
``QuantizedWeight`` in ``data`` (experts stacked on a leading axis).

A row-parallel tensor-parallel rank holds only some input rows of each
matrix; ``fd_core.parallel.tensor_parallel`` then sets ``amax_reduce``: each
matrix's per-output-channel absolute maxima (``[out]``) go through it (the
maximum over the ranks) before the scales are taken, so every rank quantizes
with its whole column's scale, exactly as one device does. (Grouped wint4
keeps its per-group scales local: a rank's groups are whole groups.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.layers.param import Param
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization.weights import quantize_array
from fd_core.quantization.wint import int4_group_size, quantize_int4, quantize_int8

__all__ = ["QuantizedParam"]

paddle = import_paddle()


class QuantizedParam(Param):
    """``shape`` is the float weight's: ``(in, out)``, or ``(E, in, out)``
    for experts stacked on a leading axis."""

    def __init__(self, shape: tuple[int, ...], method: str, group_size: int, name: str = "") -> None:
        super().__init__(shape)
        if len(self.shape) not in (2, 3):
            raise ValueError(f"{name or 'weight'}: only [in, out] or [E, in, out] weights quantize, "
                             f"got shape {list(self.shape)}")
        self.method = method
        self.group_size = group_size
        self.used_group_size = group_size  # after wint4's per-layer fallback
        self.name = name
        self.act_dtype = "float32"  # the model's activation dtype (the loader's --dtype): QuantizedWeight's
        self.in_features, self.out_features = self.shape[-2:]
        self.num_matrices = self.shape[0] if len(self.shape) == 3 else 1
        if method == "wint4" and self.in_features % 2:
            raise ValueError(
                f"{name or 'weight'}: wint4 packs two input channels per byte, but in_features is "
                f"{self.in_features} (odd); use wint8 for this model or mix_quant with wint8 dense layers"
            )
        self._pending: dict[int, tuple[np.ndarray, list[int]]] = {}  # matrix -> (fp32 buffer, [filled])
        self._qweight: np.ndarray | None = None
        self._scales: np.ndarray | None = None
        self._done = 0
        # per-channel absolute maxima [out] -> the maxima over the tensor-parallel ranks
        self.amax_reduce: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def complete(self) -> bool:
        return self.data is not None or self._done == self.num_matrices

    def fill(self, value: np.ndarray, index: tuple[Any, ...] = ()) -> None:
        if len(self.shape) == 3:
            if not index:  # the whole stack at once
                for expert in range(self.num_matrices):
                    self.fill(value[expert], (expert,))
                return
            matrix, index = int(index[0]), index[1:]
        else:
            matrix = 0
        buffer, filled = self._pending.setdefault(
            matrix, (np.zeros((self.in_features, self.out_features), dtype=np.float32), [0]))
        region = buffer[index] if index else buffer
        if region.shape != value.shape:
            if region.size != value.size:
                raise ValueError(f"region {index} has shape {region.shape}, value has {value.shape}")
            value = value.reshape(region.shape)
        region[...] = value
        filled[0] += value.size
        if filled[0] == buffer.size:
            del self._pending[matrix]
            self._store(matrix, buffer)

    def _store(self, matrix: int, weight: np.ndarray) -> None:
        if self.amax_reduce is not None and self._per_channel():
            amax = self.amax_reduce(np.abs(weight).max(axis=0).astype(np.float32))
            qweight, scales, used = _quantize_with_amax(self.method, weight, amax)
        else:
            qweight, scales, used = _quantize_in_slices(self.method, weight, self.group_size)
        if self._qweight is None or self._scales is None:
            self._qweight = np.empty((self.num_matrices, *qweight.shape), dtype=qweight.dtype)
            self._scales = np.empty((self.num_matrices, *scales.shape), dtype=scales.dtype)
            self.used_group_size = used
        self._qweight[matrix] = qweight
        self._scales[matrix] = scales
        self._done += 1

    def _per_channel(self) -> bool:
        """One scale per output channel (what a row-parallel rank must take from the whole column)."""
        if self.method in ("wint8", "w8a8"):
            return True
        return self.method == "wint4" and int4_group_size(self.in_features, self.group_size) == -1

    def finish(self) -> None:
        """Move the quantized matrices to paddle tensors in a ``QuantizedWeight``."""
        if self._done != self.num_matrices or self._qweight is None or self._scales is None:
            raise ValueError(f"parameter {self.name} was only partly filled")
        qweight, scales = self._qweight, self._scales
        if len(self.shape) == 2:
            qweight, scales = qweight[0], scales[0]
        self.data = QuantizedWeight(self.method, paddle.to_tensor(qweight), paddle.to_tensor(scales),
                                    self.in_features, self.out_features, self.used_group_size, self.act_dtype)
        self._qweight = self._scales = None

    def set(self, tensor: Any) -> None:
        """Quantize an existing float tensor or array of this shape (tests,
        tied weights); a 2-D float32 array (or view) is read in place."""
        if tuple(tensor.shape) != self.shape:
            raise ValueError(f"expected shape {list(self.shape)}, got {list(tensor.shape)}")
        array = np.asarray(tensor.numpy() if hasattr(tensor, "numpy") else tensor, dtype=np.float32)
        if array.ndim == 2 and not self._pending and self._done == 0:
            self._store(0, array)
        else:
            self.fill(array)
        self.finish()

    def __repr__(self) -> str:
        return f"QuantizedParam({list(self.shape)}, {self.method})"


_SLICE_ELEMENTS = 1 << 24  # quantize big matrices this many weights at a time
_PER_CHANNEL = ("wint8", "wint4", "w8a8")


def _quantize_in_slices(method: str, weight: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``quantize_array`` over slices of output channels: every method's
    codes and scales are per output channel (or per group within one), so
    the result is the same, with temporaries of one slice instead of the
    whole matrix (a 0.3B LM head is 423 MB in fp32)."""
    in_f, out_f = weight.shape
    step = max(16, _SLICE_ELEMENTS // max(in_f, 1))
    if out_f <= step or method not in _PER_CHANNEL:  # a plugin's method may scale per tensor
        return quantize_array(method, weight, group_size)
    parts = [quantize_array(method, weight[:, lo:lo + step], group_size) for lo in range(0, out_f, step)]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), parts[0][2])


def _quantize_with_amax(method: str, weight: np.ndarray, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-channel ``method`` with the scales of ``amax [out]`` (a row-parallel rank's)."""
    if method == "wint4":
        qweight, scales = quantize_int4(weight, -1, amax[:, None])
    else:
        qweight, scales = quantize_int8(weight, -1, amax)
    return qweight, scales, -1
