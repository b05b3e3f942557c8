"""A memory-mapped safetensors reader yielding numpy arrays.

The format is an 8-byte little-endian header length, a JSON header of
``name -> {dtype, shape, data_offsets}``, then the raw data. Reading through
``np.memmap`` touches only the bytes of the tensor asked for, so loading
holds one tensor at a time, and bf16 (which numpy lacks) is widened to fp32
by shifting its bits (``get``), or kept as its bits for bf16 storage (``get_raw``).
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

__all__ = ["FLOAT_NAMES", "SafetensorsFile", "SafetensorsError"]

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "F8_E4M3": np.uint8,  # e4m3 as its bit patterns (offline FP8 checkpoints)
}
FLOAT_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # safetensors -> paddle dtype


class SafetensorsError(ValueError):
    """The file is not a readable safetensors file."""


class SafetensorsFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SafetensorsError(f"{self.path}: not a readable safetensors file ({exc})") from None
        self.metadata = header.pop("__metadata__", {})
        self.header: dict[str, dict] = header
        self._data_start = 8 + header_len
        self._mmap: np.memmap | None = None

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> str:
        return str(self.header[name]["dtype"])

    def float_dtype(self, name: str) -> str | None:
        """``float32`` / ``float16`` / ``bfloat16`` for a tensor stored so, else None."""
        return FLOAT_NAMES.get(self.dtype(name))

    def get(self, name: str) -> np.ndarray:
        """The tensor as a numpy array: fp32 for bf16/fp16, else its own dtype."""
        array = self.get_raw(name)
        if self.dtype(name) == "BF16":
            return (array.astype(np.uint32) << 16).view(np.float32)
        if self.dtype(name) == "F16":
            return array.astype(np.float32)
        return array

    def get_raw(self, name: str) -> np.ndarray:
        """The tensor as stored, without a copy (a read-only view of the
        mapping): bf16 as its bits in uint16."""
        entry = self.header[name]
        dtype = entry["dtype"]
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has unsupported dtype {dtype}")
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        start, end = entry["data_offsets"]
        raw = self._mmap[self._data_start + start : self._data_start + end]
        return np.asarray(raw.view(_DTYPES[dtype]).reshape(entry["shape"]))

    def release(self, name: str) -> None:
        """Drop the mapped pages of tensor ``name`` from this process's resident set
        (``madvise(MADV_DONTNEED)``; they stay in the page cache, and a later read
        maps them again): the loader calls it once a tensor is placed, so a
        multi-GB shard never sits in RssFile as a whole while it is read."""
        mapping = getattr(self._mmap, "_mmap", None)
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if mapping is None or advice is None:
            return
        start, end = self.header[name]["data_offsets"]
        lo = (self._data_start + start) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = min(len(mapping), -(-(self._data_start + end) // mmap.PAGESIZE) * mmap.PAGESIZE)
        if hi > lo:
            mapping.madvise(advice, lo, hi - lo)

    def close(self) -> None:
        self._mmap = None
