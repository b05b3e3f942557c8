"""The worker process of ranks 1..N-1: ``python -m fd_core.parallel.worker``.

Started by ``fd_core.parallel.driver.ParallelRunner`` (rank 0) with its spec
pickled on stdin and two inherited pipes (``fd_core.parallel.channel``). It
loads its shard (the engine's ``ModelRunner`` with this rank's ``TensorParallel``), says
ready, meets the other ranks (``process_group``), then repeats what rank 0
broadcasts: ``(method, args)`` on its own runner (``execute``, ``warmup``,
``allocate_kv_cache``, ``apply_swaps``, ``profile_run``), its results dropped
(rank 0 samples). It exits when rank 0's pipe closes (rank
0 is gone: it closed the pipe or died), or on an error, which it sends to rank 0 first; it is also killed
with its parent (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any

from fd_core.parallel.channel import ChannelClosed, WorkerChannel
from fd_core.parallel.config import ParallelConfig

__all__ = ["WorkerSpec", "main"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, pickled by rank 0 onto the worker's stdin."""

    config: ParallelConfig
    backend: str  # the backend's name (``--backend`` resolved)
    runner_cls: type  # the engine's ModelRunner (pickled by name)
    model_dir: str
    runner_kwargs: dict[str, Any]  # ModelRunner's keyword arguments, as rank 0 passed them
    channel_path: str | None  # None: a rank on another host (its socket carries the messages)
    wake_fd: int
    answer_fd: int
    device_id: int


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the closed wake pipe still ends the worker
        pass


def serve(spec: WorkerSpec) -> int:
    """Load, meet the ranks, then run rank 0's calls until told to stop; the exit code."""
    from fd_core.backends import get_backend
    from fd_core.parallel.expert_parallel import parallel_transform
    from fd_core.parallel.process_group import init_process_group

    cfg = spec.config
    channel = WorkerChannel(spec.channel_path, spec.wake_fd, spec.answer_fd)
    try:
        backend = get_backend(spec.backend)
        backend.set_device(spec.device_id)
        tp = parallel_transform(cfg)
        # meet first: loading a quantized row-parallel weight takes the whole column's scales
        # (a collective per matrix, QuantizedParam.amax_reduce)
        channel.reached_rendezvous()
        group = init_process_group(cfg, backend.info.collective_backend, spec.device_id)
        tp.bind(backend.ops.communicator(cfg.world_size, cfg.rank, group.group))
        runner = spec.runner_cls(spec.model_dir, backend, device_id=spec.device_id, tensor_parallel=tp,
                                 **spec.runner_kwargs)
        channel.ready()
    except BaseException:
        channel.error(f"rank {cfg.rank} failed to start: {traceback.format_exc()}")
        return 1
    while True:
        try:
            method, args = channel.receive()
        except ChannelClosed:
            return 0  # rank 0 is gone
        try:
            getattr(runner, method)(*args)
        except BaseException:
            channel.error(f"rank {cfg.rank} failed in {method}: {traceback.format_exc()}")
            return 1


def _connect(argv: list[str]) -> tuple[WorkerSpec, Any]:
    """A rank on another host (``--ips``; started by ``multinode.run_node`` with
    ``--connect host:port --rank r --device-id d``): its spec from the master, over its socket."""
    import argparse
    from dataclasses import replace

    from fd_core import envs
    from fd_core.parallel.multinode import connect_to_master

    parser = argparse.ArgumentParser(prog="python -m fd_core.parallel.worker")
    parser.add_argument("--connect", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--device-id", type=int, default=0)
    ns = parser.parse_args(argv)
    host, _, port = ns.connect.rpartition(":")
    sock, spec = connect_to_master(host, int(port), ns.rank, float(envs.get("FD_TP_RENDEZVOUS_TIMEOUT")))
    return replace(spec, channel_path=None, wake_fd=sock.fileno(), answer_fd=sock.fileno(),
                   device_id=ns.device_id), sock


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    sock = None
    if argv:
        try:
            spec, sock = _connect(argv)
        except (OSError, ValueError) as exc:
            print(f"fd_core.parallel.worker: {exc}", file=sys.stderr)
            return 1
    else:
        spec = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s %(levelname)s [tp rank {spec.config.rank}] %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl+C reaches rank 0, which stops the workers
    code = serve(spec)
    if code:  # its error is sent: exit now, not after the process group's teardown (which may wait on peers)
        logging.shutdown()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
