"""Rank 0's side of tensor parallelism: ``ParallelRunner``, a ``ModelRunner`` over N ranks.

``make_runner`` is what the engine core calls, with its ``ModelRunner`` class:
a plain ``ModelRunner`` for one device, else a ``ParallelRunner``, which starts one worker process per rank
1..N-1 (``fd_core.parallel.worker``), meets them (``process_group``; a rank that
does not come within ``FD_TP_RENDEZVOUS_TIMEOUT`` is named), binds the backend's
communicator, loads rank 0's own shard in this process (a quantized
row-parallel weight takes its whole column's scales through it), and waits for
every worker to have loaded its shard. With ``--ips`` (``multinode``) the ranks
of the other hosts connect to this one and get their messages over TCP. Every runner call
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
from fd_core.errors import UnsupportedFeatureError
from fd_core.models.config import load_config
from fd_core.parallel.channel import ChannelClosed, DriverChannel
from fd_core.parallel.config import ParallelConfig, check_tensor_parallel, rank_device_id
from fd_core.parallel.expert_parallel import check_expert_parallel, parallel_transform
from fd_core.parallel.multinode import StepListener, node_layout
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
                enable_expert_parallel: bool = False, **kwargs: Any) -> Any:
    """A ``runner_cls`` (``fd_core.engine.model_runner.ModelRunner``: one device) or a
    ``ParallelRunner`` of them (``tensor_parallel_size`` ranks; with
    ``enable_expert_parallel`` the routed experts partitioned over them)."""
    if enable_expert_parallel:
        check_expert_parallel(load_config(model_dir), tensor_parallel_size)  # before any worker starts
    if tensor_parallel_size > 1:
        _check_quantization_splits(kwargs.get("quantization"), load_config(model_dir), tensor_parallel_size)
    if tensor_parallel_size == 1:
        ips = kwargs.pop("ips", None)
        if ips:
            node_layout(ips, 1)  # one rank: --ips may list this host only
        return runner_cls(model_dir, backend, **kwargs)
    return ParallelRunner(runner_cls, model_dir, backend, tensor_parallel_size,
                          enable_expert_parallel=enable_expert_parallel, **kwargs)


# methods whose scales are per block / per group of a rank's slice, not reduced over the ranks
# (wint8, wint4 and w8a8 are: see TensorParallel.shard_targets)
_TP_UNREDUCED = ("block_wise_fp8", "w4a8", "w4afp8")


def _check_quantization_splits(quantization: Any, config: Any, world: int) -> None:
    """Refuse a quantization method whose scales tensor parallelism would split unlike one
    device (a rank's fp8 blocks / w4a8 groups are not reduced over the ranks). An offline-
    quantized checkpoint's stored scales are sliced, never recomputed per rank
    (``fd_core.model_loader.offline``): it passes."""
    if quantization is None or getattr(quantization, "offline", None) is not None:
        return
    q = quantization.for_architecture(config.architecture)
    methods = {q.dense_method, q.moe_method} if config.is_moe else {q.dense_method}
    bad = sorted(m for m in methods if m in _TP_UNREDUCED)
    if bad:
        raise UnsupportedFeatureError(
            f"--tensor-parallel-size {world} with --quantization {'/'.join(bad)}: each rank would quantize its "
            "slice with its own block/group scales, unlike one device; use wint8, wint4 or w8a8 with tensor "
            "parallelism, or --tensor-parallel-size 1")


def _host_threads(world: int) -> int:
    """Threads per rank when the ranks share the host's cores."""
    configured = envs.get(_THREADS)
    if configured is not None:
        return int(configured)
    return max(1, len(os.sched_getaffinity(0)) // world)


def _w8a8_experts_whole(config: Any, world: int, quantization: Any) -> bool:
    """w8a8 routed experts run whole on one rank each (as ``--enable-expert-parallel``) rather
    than split along their intermediate dim: the MoE kernel quantizes the down projection's
    input per token over the rank's slice, so split experts would not match one device."""
    if quantization is None or not config.is_moe:
        return False
    if quantization.for_architecture(config.architecture).moe_method != "w8a8":
        return False
    if config.num_experts % world:
        logger.warning("w8a8 routed experts split over %d ranks: their activation scales are per rank, so the "
                       "output differs slightly from one device (%d experts do not divide over the ranks)",
                       world, config.num_experts)
        return False
    logger.info("w8a8 routed experts: each rank runs %d whole experts (as --enable-expert-parallel)",
                config.num_experts // world)
    return True


class ParallelRunner:
    """``ModelRunner``'s interface over ``world`` tensor-parallel ranks (see the module doc)."""

    def __init__(self, runner_cls: type, model_dir: str | Path, backend: Backend, world: int,
                 enable_expert_parallel: bool = False, **kwargs: Any) -> None:
        model_config = load_config(model_dir)
        check_tensor_parallel(model_config, world)  # a size that cannot split fails before any start
        enable_expert_parallel = enable_expert_parallel or _w8a8_experts_whole(model_config, world,
                                                                               kwargs.get("quantization"))
        info = backend.info
        self.world = world
        ips = kwargs.pop("ips", None)
        self.layout = node_layout(ips, world) if ips else None  # --ips: several hosts (multinode)
        if self.layout is not None and self.layout.node_rank != 0:
            raise ValueError(f"--ips {','.join(self.layout.ips)}: this host is node {self.layout.node_rank}, not "
                             "the master (the first one); the engine runs on the master. Here run fd-serve with the "
                             "same flags (it runs this host's ranks and no server)")
        local = self.layout.per_node if self.layout is not None else world  # ranks on this host
        self.local = local
        rank_device_id(info.visible_devices_env, os.environ, 0, local)  # too few devices: fails before any start
        master = ((self.layout.master_addr, self.layout.master_port) if self.layout is not None
                  else ("127.0.0.1", free_port()))
        self.config = ParallelConfig(world, 0, master[0], master[1],
                                     rendezvous_timeout_s=int(envs.get("FD_TP_RENDEZVOUS_TIMEOUT")),
                                     enable_expert_parallel=enable_expert_parallel)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.channel = DriverChannel(local - 1)
        self._saved_threads: str | None = None
        self._shared_host = info.visible_devices_env is None
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.channel, None)
        try:
            # listening before any worker comes; its own timeout a little after ours (_wait_store)
            store = StoreOpener(self.config, self.config.rendezvous_timeout_s + 5)
            threads = _host_threads(local) if self._shared_host else None
            for rank in range(1, local):
                self.procs.append(self._start(runner_cls, rank, backend, model_dir, kwargs, threads))
            self.channel.close_worker_ends()
            if local < world:  # the other hosts' ranks connect, each gets its spec
                self._accept_remote(runner_cls, backend, model_dir, kwargs)
            if threads is not None:
                self._use_threads(threads, backend)
            device_id = rank_device_id(info.visible_devices_env, os.environ, 0, local)
            self.tp: TensorParallel = parallel_transform(self.config)
            # meet first: a quantized row-parallel weight loads with its whole column's scales
            self.group: ProcessGroup = init_process_group(self.config, info.collective_backend, device_id,
                                                          self._wait_store(store))
            self.tp.bind(backend.ops.communicator(world, 0, self.group.group))
            self.runner = runner_cls(model_dir, backend, device_id=device_id, tensor_parallel=self.tp, **kwargs)
            for i in range(world - 1):
                self._wait_ready(i)
            self.channel.unlink()  # every worker has mapped the buffer
        except BaseException as exc:
            failure = None if isinstance(exc, TensorParallelError) else self._failure(0.5)
            self.close()
            if failure is not None:
                raise failure from exc
            raise
        logger.info("tensor parallel: %d ranks (workers pid %s), %s collectives%s", world,
                    ", ".join(str(p.pid) for p in self.procs), info.collective_backend,
                    f", {threads} threads each" if threads is not None else "")

    # ------------------------------------------------------------ workers

    def _accept_remote(self, runner_cls: type, backend: Backend, model_dir: str | Path,
                       kwargs: dict[str, Any]) -> None:
        assert self.layout is not None
        listener = StepListener(self.layout)
        try:
            socks = listener.accept(
                lambda rank: WorkerSpec(self.config.for_rank(rank), backend.name, runner_cls, str(model_dir),
                                        dict(kwargs), None, -1, -1, 0),
                self.config.rendezvous_timeout_s)
        except TimeoutError as exc:
            raise TensorParallelError(f"{exc}; the engine cannot continue") from None
        finally:
            listener.close()
        for rank in sorted(socks):
            self.channel.add_remote(socks[rank])

    def _start(self, runner_cls: type, rank: int, backend: Backend, model_dir: str | Path, kwargs: dict[str, Any],
               threads: int | None) -> subprocess.Popen[bytes]:
        wake_fd, answer_fd = self.channel.worker_fds(rank - 1)
        spec = WorkerSpec(self.config.for_rank(rank), backend.name, runner_cls, str(model_dir), dict(kwargs),
                          self.channel.path, wake_fd, answer_fd,
                          rank_device_id(backend.info.visible_devices_env, os.environ, rank, self.local))
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
                if i < len(self.procs) and self.procs[i].poll() is not None:
                    raise ChannelClosed(f"rank {i + 1} exited") from None
                if time.monotonic() > deadline:
                    raise TensorParallelError(f"tensor-parallel rank {i + 1} did not load its shard within "
                                              f"{LOAD_TIMEOUT_S:.0f} s") from None
            except RuntimeError as exc:
                raise TensorParallelError(f"tensor-parallel {exc}") from None

    def _wait_store(self, opener: StoreOpener) -> Any:
        """Rank 0's store once every rank connected; a rank missing after the rendezvous
        timeout (``FD_TP_RENDEZVOUS_TIMEOUT``) fails the engine, named with what it did."""
        deadline = time.monotonic() + self.config.rendezvous_timeout_s
        while True:
            try:
                store = opener.result(0.5)
            except RuntimeError as exc:  # the store's own timeout (a little after ours)
                raise self._rendezvous_error(str(exc)) from None
            if store is not None:
                return store
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise ChannelClosed(f"rank {i + 1} exited at the rendezvous")
                self.channel.poll(i)
            for i in self.channel.remote:
                self.channel.poll(i)
            if time.monotonic() > deadline:
                raise self._rendezvous_error("")

    def _rendezvous_error(self, detail: str) -> TensorParallelError:
        cfg = self.config
        local = range(1, len(self.procs) + 1)
        missing = [r for r in local if r - 1 not in self.channel.arrived]
        what = (f"rank {', '.join(map(str, missing))} never reached it (still starting, or hung)" if missing
                else f"ranks {len(self.procs) + 1}..{cfg.world_size - 1} (other hosts) did not all connect"
                if cfg.world_size > len(self.procs) + 1 else "not every rank connected")
        return TensorParallelError(
            f"tensor-parallel rendezvous at {cfg.master_addr}:{cfg.master_port} timed out after "
            f"{cfg.rendezvous_timeout_s} s: {what}{f' ({detail})' if detail else ''}; the engine cannot continue "
            "(FD_TP_RENDEZVOUS_TIMEOUT sets the limit)")

    def _failure(self, wait_s: float) -> TensorParallelError | None:
        """The first worker that is gone (waiting up to ``wait_s`` for one that is dying), as an error."""
        deadline = time.monotonic() + wait_s
        while True:
            for i, proc in enumerate(self.procs):
                code = proc.poll()
                if code is None:
                    said = self.channel.error_text(i)  # failed, still exiting
                    if said:
                        return TensorParallelError(f"tensor-parallel rank {i + 1} (pid {proc.pid}) failed: "
                                                   f"{said.strip()}; the engine cannot continue")
                    continue
                said = self.channel.error_text(i)
                how = (f"exited with code {code}" if code >= 0
                       else f"was killed by signal {-code} ({signal.Signals(-code).name})")
                return TensorParallelError(
                    f"tensor-parallel rank {i + 1} (pid {proc.pid}) {how}"
                    + (f": {said.strip()}" if said else "") + "; the engine cannot continue")
            for i in self.channel.remote:
                said = self.channel.error_text(i)
                if said is not None or self.channel.gone(i):
                    host = self.layout.ips[self.layout.node_of(i + 1)] if self.layout is not None else "?"
                    return TensorParallelError(
                        f"tensor-parallel rank {i + 1} (on {host}) "
                        + (f"failed: {said.strip()}" if said else "closed its connection (its process or host is gone)")
                        + "; the engine cannot continue")
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

    def execute_steps(self, step: Any, steps: int, sampling: Any = None) -> None:
        """None: the engine core runs multi-step decoding one ``execute`` at a time, which every rank takes
        part in (rank 0's model alone must not run steps whose collectives the others never join)."""
        return None

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
