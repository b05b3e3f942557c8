"""Zero-copy numpy views of CPU paddle tensors, for the few reference ops
whose paddle CPU kernels are slow at moving data (row gathers, broadcasts),
and the work-around for Paddle's per-tensor leak (``plug_tensor_init_leak``).

A kernel written with these computes the same math as its paddle form (the
same fp32 operations in the same order); it only runs faster on CPU, and
every caller keeps the paddle form for other devices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fd_core._paddle import import_paddle

__all__ = ["on_host", "as_array", "as_tensor", "empty_host", "plug_tensor_init_leak"]

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


def empty_host(shape: tuple[int, ...] | list[int]) -> tuple[Any, np.ndarray]:
    """A new fp32 CPU tensor and a numpy view of it, for a kernel that writes its
    result in place: the memory is paddle's own (no numpy buffer handed to paddle)."""
    tensor = paddle.empty(list(shape), dtype="float32", device="cpu")
    return tensor, as_array(tensor)


# paddle.Tensor.__init__'s keyword parameters, in its positional order
_INIT_ORDER = ("value", "place", "persistable", "zero_copy", "name", "stop_gradient")


def plug_tensor_init_leak() -> bool:
    """Stop Paddle 3.x leaking a Python list at every tensor made from data.

    Paddle's C ``Tensor.__init__`` keeps a reference to a new list (the
    keyword names) whenever it is called with a keyword dict, and its Python
    wrapper always passes one; ``paddle.to_tensor`` and
    ``paddle.utils.dlpack.from_dlpack`` go through it. That is 64-160 bytes
    per tensor, never freed: on the CPU backend ~16-18 tensors per request
    (step metadata, rope and attention outputs, the sampler's parameters),
    1.3-2.4 KB per request of linear RSS growth. Positional calls leak
    nothing, and the C init takes its first six parameters (``_INIT_ORDER``)
    positionally with the same meaning, so this wraps ``paddle.Tensor.__init__``
    to pass such keywords by position; every other call goes to paddle's own
    wrapper unchanged. Idempotent; returns whether the wrapper is installed
    (False on a paddle without the C init to call, where nothing changes).
    """
    current = paddle.Tensor.__init__
    if getattr(current, "_fd_plugged", False):
        return True
    c_init = getattr(paddle, "original_init", None)  # paddle/__init__.py keeps the C slot under this name
    if c_init is None:
        return False
    paddle_init = current

    value_types = (np.ndarray, paddle.Tensor, paddle.base.core.DenseTensor)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        start = len(args)
        names = _INIT_ORDER[start : start + len(kwargs)]
        value = args[0] if args else kwargs.get("value")
        if isinstance(value, value_types) and start + len(kwargs) <= len(_INIT_ORDER) \
                and all(n in kwargs for n in names):
            c_init(self, *args, *(kwargs[n] for n in names))
        else:  # paddle's own forms (lists, shapes, device=, data=, dtype/dims)
            paddle_init(self, *args, **kwargs)

    init._fd_plugged = True  # type: ignore[attr-defined]
    paddle.Tensor.__init__ = init
    return True
