"""Content keys: what a backend keys its derived weight data on.

A backend that derives data from weights (a repacked copy, a widened norm,
the argument lists of a fused op) must notice when a weight changes, whether
the model assigns a new tensor or writes into the old one. Object identity
misses the second and, once an object is freed, can match a new one at the
same ``id``. A content key names the memory and its state instead:
``(data pointer, shape, strides, dtype, paddle's in-place version)`` (a
transposed view shares its tensor's pointer and, when square, its shape). A cache entry
that keeps its key's tensors alive keeps their memory from being reused, so
an equal key means the same bytes unless they were written without paddle
counting the write: its in-place ops (``add_``, ``assign(..., output=)``)
bump the version, ``set_value``, ``copy_`` and writes through a numpy view
do not. Weights are not written after loading; code that rewrites one in
place must use a counted write or assign a new tensor. KV pools are written in place every step by design, so their key
(``version=False``) names only the memory.

A key costs ~0.15 us per tensor; a decode step of the 0.3B model computes ~200.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

__all__ = ["tensor_key", "weight_key"]


def tensor_key(t: Any, version: bool = True) -> Hashable:
    """The content key of one tensor (None -> None). ``version=False`` leaves
    out the in-place version (for buffers written in place by design)."""
    if t is None:
        return None
    codes = getattr(t, "codes", None)  # an 8-bit KV pool: its codes and scales
    if codes is not None:
        return (tensor_key(codes, version), tensor_key(t.scales, version))
    return (t.data_ptr(), tuple(t.shape), tuple(t.strides), t.dtype, t._inplace_version() if version else 0)


def weight_key(w: Any) -> Hashable:
    """A linear weight's key: a tensor's, or a ``QuantizedWeight``'s method,
    group size, features, activation dtype and the keys of its codes and scales."""
    qweight = getattr(w, "qweight", None)
    if qweight is None:
        return tensor_key(w)
    return (w.method, w.group_size, w.in_features, w.out_features, getattr(w, "act_dtype", "float32"),
            tensor_key(qweight), tensor_key(w.scales))
