"""Rank 0's side of tensor parallelism: ``ParallelRunner``, a ``ModelRunner`` over N ranks.

``make_runner`` is what the engine core calls, with its ``ModelRunner`` class:
a plain ``ModelRunner`` for one device, else a ``ParallelRunner``, which starts one worker process per rank
1..N-1 (``fd_core.parallel.worker``), loads rank 0's own shard in this process,
waits for every worker to have loaded its shard, then meets them
(``process_group``) and binds the backend's communicator. Every runner call
(``execute``, ``warmup``, ``profile_run``, ``allocate_kv_cache``,
``apply_swaps``) is written once to the workers (``channel``) and then run on
rank 0's own runner, whose logits (all-gathered to the full vocabulary) the
engine samples. Attributes (``config``, ``dtype``, ``kv_caches``, ...) are rank
0's runner's.

A worker that dies, or fails to load, fails the engine with a
``TensorParallelError`` naming the rank and the cause (its traceback, or the
signal that killed it); the other workers are stopped then. ``close()`` (also
run when the runner is garbage-collected or the interpreter exits) stops every
worker. On a host backend (no visible-devices variable: the CPU) the ranks
split the cores: each runs ``cores // N`` threads (``FD_CPU_NUM_THREADS``, when
set, is each rank's count).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from fd_core import envs
from fd_core.backends.base import Backend
from fd_core.models.config import load_config
from fd_core.parallel.channel import ChannelClosed, DriverChannel
from fd_core.parallel.config import ParallelConfig, check_tensor_parallel, rank_device_id
from fd_core.parallel.process_group import ProcessGroup, StoreOpener, free_port, init_process_group
from fd_core.parallel.tensor_parallel import TensorParallel
from fd_core.parallel.worker import WorkerSpec

__all__ = ["ParallelRunner", "TensorParallelError", "make_runner"]

logger = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 1800.0  # a worker that neither loads nor dies in this long fails the engine
STOP_TIMEOUT_S = 10.0  # how long close() waits for a worker before it kills it
_THREADS = "FD_CPU_NUM_THREADS"


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank died or failed: the engine cannot go on."""


def make_runner(runner_cls: type, model_dir: str | Path, backend: Backend, tensor_parallel_size: int = 1,
                **kwargs: Any) -> Any:
    """A ``runner_cls`` (``fd_core.engine.model_runner.ModelRunner``: one device) or a
    ``ParallelRunner`` of them (``tensor_parallel_size`` ranks)."""
    if tensor_parallel_size == 1:
        return runner_cls(model_dir, backend, **kwargs)
    return ParallelRunner(runner_cls, model_dir, backend, tensor_parallel_size, **kwargs)


def _host_threads(world: int) -> int:
    """Threads per rank when the ranks share the host's cores."""
    configured = envs.get(_THREADS)
    if configured is not None:
        return int(configured)
    return max(1, len(os.sched_getaffinity(0)) // world)


class ParallelRunner:
    """``ModelRunner``'s interface over ``world`` tensor-parallel ranks (see the module doc)."""

    def __init__(self, runner_cls: type, model_dir: str | Path, backend: Backend, world: int, **kwargs: Any) -> None:
        check_tensor_parallel(load_config(model_dir), world)  # a size that cannot split fails before any start
        info = backend.info
        self.world = world
        self.config = ParallelConfig(world, 0, "127.0.0.1", free_port())
        self.procs: list[subprocess.Popen[bytes]] = []
        self.channel = DriverChannel(world - 1)
        self._saved_threads: str | None = None
        self._shared_host = info.visible_devices_env is None
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.channel, None)
        try:
            store = StoreOpener(self.config, int(LOAD_TIMEOUT_S))  # listening before any worker comes
            threads = _host_threads(world) if self._shared_host else None
            for rank in range(1, world):
                self.procs.append(self._start(runner_cls, rank, backend, model_dir, kwargs, threads))
            self.channel.close_worker_ends()
            if threads is not None:
                self._use_threads(threads, backend)
            device_id = rank_device_id(info.visible_devices_env, os.environ, 0, world)
            self.tp = TensorParallel(0, world)
            self.runner = runner_cls(model_dir, backend, device_id=device_id, tensor_parallel=self.tp, **kwargs)
            for i in range(world - 1):
                self._wait_ready(i)
            self.channel.unlink()  # every worker has mapped the buffer
            self.group: ProcessGroup = init_process_group(self.config, info.collective_backend, device_id,
                                                          self._wait_store(store))
            self.tp.bind(backend.ops.communicator(world, 0, self.group.group))
        except BaseException as exc:
            failure = self._failure(0.5)
            self.close()
            if failure is not None:
                raise failure from exc
            raise
        logger.info("tensor parallel: %d ranks (workers pid %s), %s collectives%s", world,
                    ", ".join(str(p.pid) for p in self.procs), info.collective_backend,
                    f", {threads} threads each" if threads is not None else "")

    # ------------------------------------------------------------ workers

    def _start(self, runner_cls: type, rank: int, backend: Backend, model_dir: str | Path, kwargs: dict[str, Any],
               threads: int | None) -> subprocess.Popen[bytes]:
        wake_fd, answer_fd = self.channel.worker_fds(rank - 1)
        spec = WorkerSpec(self.config.for_rank(rank), backend.name, runner_cls, str(model_dir), dict(kwargs),
                          self.channel.path, wake_fd, answer_fd,
                          rank_device_id(backend.info.visible_devices_env, os.environ, rank, self.world))
        env = dict(os.environ)
        if threads is not None:
            env[_THREADS] = env["OMP_NUM_THREADS"] = str(threads)
        proc = subprocess.Popen([sys.executable, "-m", "fd_core.parallel.worker"], stdin=subprocess.PIPE,
                                pass_fds=(wake_fd, answer_fd), env=env)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(spec))
        proc.stdin.close()
        return proc

    def _wait_ready(self, i: int) -> None:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while True:
            try:
                self.channel.wait_ready(i, 0.5)
                return
            except TimeoutError:
                if self.procs[i].poll() is not None:
                    raise ChannelClosed(f"rank {i + 1} exited") from None
                if time.monotonic() > deadline:
                    raise TensorParallelError(f"tensor-parallel rank {i + 1} did not load its shard within "
                                              f"{LOAD_TIMEOUT_S:.0f} s") from None
            except RuntimeError as exc:
                raise TensorParallelError(f"tensor-parallel {exc}") from None

    def _wait_store(self, opener: StoreOpener) -> Any:
        """Rank 0's store once every worker connected (they do right after ``R``)."""
        while True:
            store = opener.result(0.5)
            if store is not None:
                return store
            if any(p.poll() is not None for p in self.procs):
                raise ChannelClosed("a worker exited at the rendezvous")

    def _failure(self, wait_s: float) -> TensorParallelError | None:
        """The first worker that is gone (waiting up to ``wait_s`` for one that is dying), as an error."""
        deadline = time.monotonic() + wait_s
        while True:
            for i, proc in enumerate(self.procs):
                code = proc.poll()
                if code is None:
                    continue
                said = self.channel.error_text(i)
                how = (f"exited with code {code}" if code >= 0
                       else f"was killed by signal {-code} ({signal.Signals(-code).name})")
                return TensorParallelError(
                    f"tensor-parallel rank {i + 1} (pid {proc.pid}) {how}"
                    + (f": {said.strip()}" if said else "") + "; the engine cannot continue")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _use_threads(self, threads: int, backend: Backend) -> None:
        """Rank 0 (this process) runs ``threads`` threads until ``close``."""
        self._saved_threads = os.environ.get(_THREADS, "")
        os.environ[_THREADS] = str(threads)
        envs.reset()
        backend.set_device(0)  # re-applies the thread count to paddle

    # ------------------------------------------------------------ runner calls

    def _call(self, method: str, *args: Any) -> Any:
        try:
            self.channel.send((method, args))
            return getattr(self.runner, method)(*args)
        except Exception as exc:
            failure = self._failure(5.0)
            if failure is None:
                raise
            self.close()
            raise failure from exc

    def execute(self, step: Any) -> Any:
        return self._call("execute", step)

    def warmup(self) -> None:
        self._call("warmup")

    def profile_run(self, max_num_batched_tokens: int, max_num_seqs: int, kv_cache_dtype: str | None = None) -> int:
        """Every rank profiles (their collectives pair up); rank 0's peak is returned."""
        return int(self._call("profile_run", max_num_batched_tokens, max_num_seqs, kv_cache_dtype))

    def allocate_kv_cache(self, num_blocks: int, num_host_blocks: int = 0, kv_cache_dtype: str | None = None) -> None:
        self._call("allocate_kv_cache", num_blocks, num_host_blocks, kv_cache_dtype)

    def apply_swaps(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        self._call("apply_swaps", swap_out, swap_in)

    def kv_bytes_per_block(self, config: Any, block_size: int, kv_cache_dtype: str = "float32",
                           num_kv_heads: int | None = None) -> int:
        """Per rank: the KV heads this rank's pools hold."""
        return int(self.runner.kv_bytes_per_block(config, block_size, kv_cache_dtype, self.runner.num_kv_heads))

    def __getattr__(self, name: str) -> Any:
        if name == "runner":  # not built (a failed start)
            raise AttributeError(name)
        return getattr(self.runner, name)

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def close(self) -> None:
        """Stop every worker (its pipe closed; killed after ``STOP_TIMEOUT_S``); idempotent."""
        saved, self._saved_threads = self._saved_threads, None
        self._finalizer.detach()
        _stop(self.procs, self.channel, saved)


def _stop(procs: list[subprocess.Popen[bytes]], channel: DriverChannel, saved_threads: str | None) -> None:
    channel.close()  # a worker waiting for rank 0's next call sees its pipe close and exits
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if saved_threads is not None:
        if saved_threads:
            os.environ[_THREADS] = saved_threads
        else:
            os.environ.pop(_THREADS, None)
        envs.reset()
