"""All-reduce and all-gather between the ranks of one host through shared memory.

``fd_x86.backend.fd_communicator`` calls ``shm_communicator`` once per worker
process, after ``paddle.distributed`` is initialised; every rank of the group
must call it (it meets the others through the group). It answers a
``ShmCommunicator``, or None (fd-core's gloo ``Communicator`` then runs) with
one rank, with ``FD_X86_SHM_COMM=0``, when the ranks are on several hosts, or
when any rank cannot load the native ops or map the segment.

Rendezvous, through the group's own collectives: every rank gathers
(host id, ops ready, pid, random token); rank 0 creates
``/dev/shm/fd_x86_comm_<pid>_<token>``, the others map it, and once all have
said so rank 0 unlinks it: the memory lives while a rank maps it, and no name
is left behind when a rank dies later. (A name whose creator died before the
unlink is swept by the next rank 0 on this host.)

The collectives run in ``csrc/shm_comm.cc`` (through ctypes; the same library
as the other ops): fp32 and bf16 all-reduce in place, all-gather of any dtype,
in chunks of ``slot_bytes``. A rank that does not arrive within
``FD_X86_SHM_COMM_TIMEOUT`` seconds (default 300), or whose process exits,
makes the others raise ``ShmCommError`` naming it; the communicator is then
broken and every later call raises the same error. all_to_all, GPU tensors,
0-d tensors and other dtypes go through gloo (the inherited methods).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import mmap
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.ops.collectives import Communicator

__all__ = ["DEFAULT_SLOT_BYTES", "PREFIX", "ShmCommError", "ShmCommunicator", "enabled", "shm_communicator"]

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "fd_x86_comm_"
DEFAULT_SLOT_BYTES = 4 << 20  # per rank and buffer set: 16 MiB of /dev/shm for 2 ranks
DEFAULT_TIMEOUT_S = 300.0
_ERR_ARGS = -100000
_REDUCE_DTYPES = {"paddle.float32": 0, "paddle.bfloat16": 1}


class ShmCommError(RuntimeError):
    """A collective failed; ``culprit`` is the rank that caused it."""

    def __init__(self, message: str, culprit: int | None) -> None:
        super().__init__(message)
        self.culprit = culprit


def enabled() -> bool:
    """False with ``FD_X86_SHM_COMM=0`` (every rank reads the same environment)."""
    return os.environ.get("FD_X86_SHM_COMM", "1").strip() != "0"


def timeout_from_env() -> float:
    """``FD_X86_SHM_COMM_TIMEOUT`` in seconds (> 0), default 300."""
    raw = os.environ.get("FD_X86_SHM_COMM_TIMEOUT")
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"FD_X86_SHM_COMM_TIMEOUT={raw!r}: expected a number of seconds above 0")
    return value


@functools.lru_cache(maxsize=1)
def _native() -> ctypes.CDLL:
    """The ops library's C functions (``csrc/shm_comm.cc``); builds the ops on first use."""
    from fd_x86.build import NAME, build_dir, load_ops

    load_ops()  # built (once) and loaded; ctypes reuses the loaded library
    lib = ctypes.CDLL(str(build_dir() / NAME / f"{NAME}.so"))
    i64, vp, dbl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
    lib.fd_x86_shm_segment_bytes.argtypes, lib.fd_x86_shm_segment_bytes.restype = [i64, i64], i64
    lib.fd_x86_shm_max_ranks.argtypes, lib.fd_x86_shm_max_ranks.restype = [], i64
    lib.fd_x86_shm_init.argtypes = [vp, i64, i64, ctypes.c_uint64]
    lib.fd_x86_shm_attach.argtypes = [vp, ctypes.c_int, i64, i64, ctypes.c_uint64, i64]
    lib.fd_x86_shm_abort.argtypes, lib.fd_x86_shm_abort.restype = [vp, ctypes.c_int], None
    lib.fd_x86_shm_all_reduce.argtypes = [vp, ctypes.c_int, vp, i64, ctypes.c_int, dbl]
    lib.fd_x86_shm_all_gather.argtypes = [vp, ctypes.c_int, vp, i64, vp, dbl]
    return lib


def _native_or_none() -> ctypes.CDLL | None:
    try:
        return _native()
    except Exception as exc:  # a build error on this rank: the group falls back together
        logger.warning("fd_x86: shared-memory communicator unavailable (%s: %s)", type(exc).__name__, exc)
        return None


class _Segment:
    """One mapping of a segment file under /dev/shm (unlinked by rank 0 once all mapped it)."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                raise OSError(f"{path} has {os.fstat(fd).st_size} bytes, expected {size}")
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        self._anchor: Any = ctypes.c_char.from_buffer(self._map)
        self.address = ctypes.addressof(self._anchor)

    def close(self) -> None:
        if self._anchor is not None:
            self._anchor = None
            self.address = 0
            self._map.close()


def _host_id() -> int:
    """The same number on every process of this host (boot id and host name)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    digest = hashlib.sha256(f"{boot}/{socket.gethostname()}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def _gather_ints(values: list[int], group: Any) -> np.ndarray:
    """``[ranks, len(values)]``: every rank's ``values`` in group rank order (gloo)."""
    import paddle
    import paddle.distributed as dist

    parts: list[Any] = []
    dist.all_gather(parts, paddle.to_tensor(np.asarray(values, dtype=np.int64)), group=group)
    return np.stack([p.numpy() for p in parts])


def _sweep_stale() -> None:
    """Unlink segments whose creator died before unlinking them."""
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        try:
            os.kill(int(path.name[len(PREFIX):].split("_")[0]), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except (ValueError, OSError):
            continue


def shm_communicator(world_size: int, rank: int, group: Any = None, *, slot_bytes: int = DEFAULT_SLOT_BYTES,
                     timeout_s: float | None = None) -> ShmCommunicator | None:
    """Collective: the group's shared-memory communicator, or None on every
    rank alike (module docstring). ``slot_bytes`` (a multiple of 4096) is the
    chunk each rank moves per step."""
    if world_size <= 1 or not enabled():
        return None
    if slot_bytes < 4096 or slot_bytes % 4096:  # checked on every rank, before any collective
        raise ValueError(f"slot_bytes={slot_bytes}: expected a positive multiple of 4096")
    timeout = timeout_from_env() if timeout_s is None else timeout_s
    lib = _native_or_none()
    if lib is not None and world_size > lib.fd_x86_shm_max_ranks():
        lib = None
    infos = _gather_ints([_host_id(), lib is not None, os.getpid(), secrets.randbits(62)], group)
    if len(infos) != world_size:
        raise ValueError(f"world_size={world_size} but the group has {len(infos)} ranks")
    if lib is None or not infos[:, 1].all() or len(set(infos[:, 0].tolist())) > 1:
        logger.info("fd_x86: all-reduce / all-gather through gloo (%s)",
                    "ranks on several hosts" if infos[:, 1].all() else "a rank has no native ops")
        return None
    name = f"{PREFIX}{infos[0, 2]}_{infos[0, 3]:x}"
    size = int(lib.fd_x86_shm_segment_bytes(world_size, slot_bytes))
    segment: _Segment | None = None
    try:
        if rank == 0:
            _sweep_stale()
            segment = _open(name, size, create=True)
            if segment is not None:
                rc = lib.fd_x86_shm_init(segment.address, world_size, slot_bytes, int(infos[0, 3]))
                assert rc == 0, f"fd_x86_shm_init refused world {world_size}, slot {slot_bytes}"
        created = _gather_ints([segment is not None], group)[0, 0]
        if rank != 0 and created:
            segment = _open(name, size, create=False)
        if segment is not None and lib.fd_x86_shm_attach(segment.address, rank, world_size, slot_bytes,
                                                         int(infos[0, 3]), os.getpid()) != 0:
            segment.close()
            segment = None
        attached = _gather_ints([segment is not None], group)[:, 0]
    finally:
        if rank == 0:
            (SHM_DIR / name).unlink(missing_ok=True)
    if not attached.all():
        logger.warning("fd_x86: ranks %s could not map the shared-memory segment; collectives go through gloo",
                       np.flatnonzero(attached == 0).tolist())
        if segment is not None:
            segment.close()
        return None
    assert segment is not None
    comm = ShmCommunicator(world_size, rank, group, segment, lib, timeout, infos[:, 2].tolist())
    comm.segment_name = name
    return comm


def _open(name: str, size: int, create: bool) -> _Segment | None:
    try:
        return _Segment(name, size, create)
    except OSError as exc:
        logger.warning("fd_x86: cannot %s %s: %s", "create" if create else "map", SHM_DIR / name, exc)
        return None


class ShmCommunicator(Communicator):
    """fd-core's ``Communicator`` with all_reduce / all_gather through shared
    memory; made by ``shm_communicator``, one per worker process."""

    def __init__(self, world_size: int, rank: int, group: Any, segment: _Segment, lib: ctypes.CDLL,
                 timeout_s: float, pids: list[int]) -> None:
        super().__init__(world_size, rank, group)
        self._segment, self._lib, self.timeout_s, self._pids = segment, lib, timeout_s, pids
        self._error: ShmCommError | None = None
        self.segment_name = ""  # the /dev/shm name it had (unlinked once every rank mapped it)

    def all_reduce(self, x: Any) -> Any:
        """Sum over ranks, in place when ``x`` is a contiguous fp32 / bf16 CPU tensor."""
        code = _REDUCE_DTYPES.get(str(x.dtype))
        if code is None or not x.shape or not x.place.is_cpu_place():
            return super().all_reduce(x)
        if not x.is_contiguous():
            x = x.contiguous()
        self._check(self._lib.fd_x86_shm_all_reduce(self._address(), self.rank, x.data_ptr(), math.prod(x.shape),
                                                    code, self.timeout_s), "all_reduce", x)
        return x

    def all_gather(self, x: Any, axis: int = -1) -> Any:
        """Every rank's ``x`` concatenated along ``axis`` in rank order (CPU tensors)."""
        if not x.shape or not x.place.is_cpu_place():
            return super().all_gather(x, axis)
        import paddle

        if not x.is_contiguous():
            x = x.contiguous()
        out = paddle.empty([self.world_size, *x.shape], dtype=x.dtype)
        nbytes = math.prod(x.shape) * x.element_size()
        self._check(self._lib.fd_x86_shm_all_gather(self._address(), self.rank, x.data_ptr(), nbytes,
                                                    out.data_ptr(), self.timeout_s), "all_gather", x)
        axis = axis % len(x.shape)
        if axis == 0:
            return out.reshape([self.world_size * x.shape[0], *x.shape[1:]])
        return paddle.concat([out[r] for r in range(self.world_size)], axis=axis)

    def abort(self) -> None:
        """Tell the other ranks this one will not come (an error here): their
        waiting collectives raise ``ShmCommError`` naming this rank."""
        if self._segment.address:
            self._lib.fd_x86_shm_abort(self._segment.address, self.rank)

    def close(self) -> None:
        """Unmap the segment; later calls raise."""
        self._segment.close()

    def _address(self) -> int:
        if self._error is not None:
            raise self._error
        if not self._segment.address:
            raise RuntimeError(f"rank {self.rank}: the shared-memory communicator is closed")
        return self._segment.address

    def _check(self, rc: int, op: str, x: Any) -> None:
        if rc == 0:
            return
        what = f"fd_x86 shared-memory {op} of {list(x.shape)} {x.dtype} on rank {self.rank} of {self.world_size}"
        if rc == _ERR_ARGS:
            raise RuntimeError(f"{what}: the native op refused its arguments (a bug)")
        kind, culprit = divmod(-rc - 1, self.world_size)
        reason = {
            0: f"rank {culprit} (pid {self._pids[culprit]}) did not arrive within {self.timeout_s:g} s "
               "(FD_X86_SHM_COMM_TIMEOUT)",
            1: f"rank {culprit}'s process (pid {self._pids[culprit]}) has exited",
            2: f"rank {culprit} gave up (an error on that rank)",
            3: f"rank {culprit} passed a tensor of another size (every rank must pass the same shape)",
        }.get(kind, f"native error code {rc}")
        self._error = ShmCommError(f"{what} failed: {reason}; the group cannot go on", culprit)
        raise self._error
