"""The weights' storage dtype: what ``--dtype`` resolves to.

``--dtype float32|float16|bfloat16`` stores every float weight in that dtype
(a MoE router gate stays fp32: its top-k choice is precision sensitive, and
HF keeps it fp32 too); the reference upcasts a 16-bit weight to fp32 where it
is used, so activations stay fp32 and results stay defined by the reference.

``--dtype auto`` is the checkpoint's dtype when the backend computes in 16
bits natively (``Capabilities.bf16``), else float32: on a CPU backend 16-bit
weights cost an upcast per matmul per step (decode slower, see the README),
so the memory saving is the explicit ``--dtype bfloat16``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from fd_core.model_loader.safetensors_io import FLOAT_NAMES, SafetensorsError, SafetensorsFile

__all__ = ["WEIGHT_DTYPES", "checkpoint_dtype", "resolve_weight_dtype"]

WEIGHT_DTYPES = ("float32", "float16", "bfloat16")


def _files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return []
        return [model_dir / name for name in sorted(names)]
    return sorted(model_dir.glob("*.safetensors"))


def checkpoint_dtype(model_dir: str | Path) -> str:
    """The dtype most of the checkpoint's float elements are stored in (a
    bf16 checkpoint keeps a few fp32 tensors, e.g. the router); float32 when
    the headers cannot be read (the loader then says why)."""
    counts: Counter[str] = Counter()
    for path in _files(Path(model_dir)):
        try:
            reader = SafetensorsFile(path)
        except (SafetensorsError, OSError):
            continue
        for name in reader.keys():
            dtype = FLOAT_NAMES.get(reader.dtype(name))
            if dtype is not None:
                numel = 1
                for dim in reader.shape(name):
                    numel *= int(dim)
                counts[dtype] += numel
    return counts.most_common(1)[0][0] if counts else "float32"


def resolve_weight_dtype(requested: str, checkpoint: str, native_16bit: bool, backend: str = "") -> str:
    """The storage dtype for ``--dtype requested``: the named one, or for
    ``auto`` the ``checkpoint``'s where the backend computes in 16 bits
    (``native_16bit``, its ``Capabilities.bf16``), else float32."""
    if requested == "auto":
        return checkpoint if checkpoint == "float32" or native_16bit else "float32"
    if requested not in WEIGHT_DTYPES:
        raise ValueError(f"--dtype must be auto or one of {', '.join(WEIGHT_DTYPES)}, got {requested!r}"
                         + (f" (backend {backend})" if backend else ""))
    return requested
