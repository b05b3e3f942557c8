"""Zero-copy numpy views of CPU paddle tensors, for the few reference ops
whose paddle CPU kernels are slow at moving data (row gathers, broadcasts).

A kernel written with these computes the same math as its paddle form (the
same fp32 operations in the same order); it only runs faster on CPU, and
every caller keeps the paddle form for other devices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["on_host", "as_array", "as_tensor"]

paddle = import_paddle()


def on_host(*tensors: Any) -> bool:
    """True when every tensor is fp32 in CPU memory (numpy can view it)."""
    return all(t.place.is_cpu_place() and t.dtype == paddle.float32 for t in tensors)


def as_array(tensor: Any) -> np.ndarray:
    """A numpy view (no copy) of a CPU tensor; writes go to the tensor."""
    return np.from_dlpack(tensor)


def as_tensor(array: np.ndarray) -> Any:
    """A paddle tensor sharing ``array``'s memory (made contiguous first)."""
    return paddle.utils.dlpack.from_dlpack(np.ascontiguousarray(array))
