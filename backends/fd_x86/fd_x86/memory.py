"""Host memory for the repacked weights: transparent huge pages.

A decode step at a few rows streams every weight once from DRAM, so it is
bound by memory bandwidth, and with 4 KiB pages by the TLB too: on the 2-core
Zen 4 VM a plain read of 361 MB ran at ~23 GB/s from 4 KiB pages and
30-37 GB/s from 2 MiB ones. Linux gives anonymous memory huge pages only
where it is asked to (``/sys/kernel/mm/transparent_hugepage/enabled`` is
usually ``madvise``), and paddle's allocator does not ask.

``HugePageArena`` hands out numpy arrays carved from anonymous mappings
advised ``MADV_HUGEPAGE`` before their first touch, 2 MiB aligned, and
``to_paddle`` turns one into a paddle tensor over the same memory (DLPack,
no copy). A chunk's memory returns to the OS when no array carved from it is
left (weights live as long as their model, so they go together).
``FD_X86_HUGEPAGES=0`` turns the arena off (paddle's allocator then). Where
the kernel has no THP the advice is ignored and the arena is plain memory.

Weights read in place (the stacked MoE experts: a repacked copy would double
the largest part of a MoE model) stay in paddle's memory; ``advise_huge_pages``
advises their whole 2 MiB pages ``MADV_HUGEPAGE`` and asks the kernel to
collapse them now (``MADV_COLLAPSE``, Linux 6.1+; older kernels leave it to
khugepaged), so they are read through huge pages too without a copy of our own.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from typing import Any

import numpy as np

__all__ = ["HugePageArena", "advise_huge_pages", "enabled", "host_tensor"]

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 64 << 20  # arrays above half a chunk get a mapping of their own
_ALIGN = 64  # every array starts on a cache line
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # <asm-generic/mman-common.h>
_ADVISED: set[tuple[int, int]] = set()  # (start, end) ranges already advised in this process


def enabled() -> bool:
    return os.environ.get("FD_X86_HUGEPAGES", "1") != "0"


class HugePageArena:
    """Bump allocator over huge-page-advised anonymous mappings."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: np.ndarray | None = None  # uint8 view of the current chunk
        self._used = 0
        self._lock = threading.Lock()

    @staticmethod
    def _map(nbytes: int) -> np.ndarray:
        """A fresh mapping of at least ``nbytes``, as a 2 MiB-aligned uint8 array."""
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                region.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # no THP in this kernel: plain pages
                pass
        whole = np.frombuffer(region, dtype=np.uint8)
        skip = -whole.ctypes.data % HUGE_PAGE
        return whole[skip:skip + size]

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized C-contiguous array in the arena."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        padded = -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        with self._lock:
            if padded > self.chunk_bytes // 2:
                raw = self._map(padded)[:nbytes]
            else:
                if self._chunk is None or self._used + padded > self._chunk.size:
                    self._chunk, self._used = self._map(self.chunk_bytes), 0
                raw = self._chunk[self._used:self._used + nbytes]
                self._used += padded
        return raw.view(dtype).reshape(shape)

    def copy(self, a: np.ndarray) -> np.ndarray:
        out = self.empty(a.shape, a.dtype)
        out[...] = a
        return out


_ARENA = HugePageArena()


def host_tensor(a: np.ndarray) -> Any:
    """A paddle CPU tensor holding ``a``'s values: in the huge-page arena
    unless ``FD_X86_HUGEPAGES=0`` (then ``paddle.to_tensor``)."""
    import paddle

    if not enabled():
        return paddle.to_tensor(np.ascontiguousarray(a))
    return paddle.utils.dlpack.from_dlpack(_ARENA.copy(a))


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


def advise_huge_pages(tensor: Any) -> tuple[int, bool]:
    """Advise the whole 2 MiB pages inside a CPU tensor's memory ``MADV_HUGEPAGE``
    and collapse them (``MADV_COLLAPSE``); returns (the bytes advised, whether the
    collapse succeeded). (0, False): off, too small, already advised in this
    process, or refused by the kernel. The memory stays as it was: only its page
    size can change, never its contents. A collapse the kernel refuses (before
    Linux 6.1, or memory too fragmented) leaves the advice to khugepaged."""
    if not enabled() or not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0, False
    begin = int(tensor.data_ptr())
    end = begin + int(tensor.numel()) * int(tensor.element_size())
    start, stop = -(-begin // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
    if stop <= start or (start, stop) in _ADVISED:
        return 0, False
    _ADVISED.add((start, stop))
    libc = _libc()
    if libc.madvise(ctypes.c_void_p(start), stop - start, _MADV_HUGEPAGE) != 0:
        return 0, False
    return stop - start, libc.madvise(ctypes.c_void_p(start), stop - start, _MADV_COLLAPSE) == 0
