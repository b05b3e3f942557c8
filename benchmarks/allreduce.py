"""All-reduce latency and bandwidth between 2 ranks on this host: fd_x86's
shared-memory communicator (``fd_x86.comm``) against gloo, in the same run.

Starts ``--ranks`` processes (a paddle.distributed gloo group on 127.0.0.1,
one thread each); every rank builds both communicators and, per size, times
``--repeats`` loops of all_reduce on an fp32 tensor through each, the two
alternating; rank 0 prints the median time per call, the bandwidth
(bytes / time, as nccl-tests' "algbw"), gloo / shm, and the best loop of
each (on a busy machine the median carries the other processes' load). Sizes run from 4 KB to
64 MB; the 0.3B's own tensors are among them (hidden 1024 fp32: 4 KB per
decode token; a 512-token prefill's 2 MB) and its vocab-parallel LM head's
all_gather of B=1 logits (103424 / 2 fp32 per rank) is timed too.

    python benchmarks/allreduce.py                  # 2 ranks, 4 KB .. 64 MB
    python benchmarks/allreduce.py --max-mb 4 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from dtypes import cpu_model  # noqa: E402

VOCAB_03B = 103424


def _iterations(nbytes: int) -> int:
    return max(5, min(2000, (32 << 20) // nbytes))  # ~32 MB moved per timed loop


def _time_loop(fn: Any, x: Any, iters: int, barrier: Any) -> float:
    barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn(x)
    return (time.perf_counter() - start) / iters


def _row(op: str, nbytes: int, times: dict[str, list[float]]) -> dict[str, Any]:
    return {"op": op, "bytes": nbytes, **{k: statistics.median(v) for k, v in times.items()},
            **{f"{k}_best": min(v) for k, v in times.items()}}


def worker(args: argparse.Namespace) -> None:
    import paddle
    import paddle.distributed as dist
    from fd_x86.comm import shm_communicator

    from fd_core.ops.collectives import Communicator

    paddle.set_device("cpu")
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    shm = shm_communicator(world, rank, None)
    if shm is None:
        raise SystemExit("fd_x86's shared-memory communicator is not available here (FD_X86_SHM_COMM=0?)")
    gloo = Communicator(world, rank, None)

    def barrier() -> None:
        gloo.all_reduce(paddle.zeros([1]))

    sizes = [4 << 10 << (2 * i) for i in range(20) if (4 << 10 << (2 * i)) <= args.max_mb << 20]
    rows = []
    for nbytes in sizes:
        x = paddle.ones([nbytes // 4], dtype="float32")
        iters = _iterations(nbytes)
        times: dict[str, list[float]] = {"shm": [], "gloo": []}
        for comm in (shm, gloo):  # warm up: page faults, buffers
            _time_loop(comm.all_reduce, x, 2, barrier)
        for _ in range(args.repeats):
            for name, comm in (("shm", shm), ("gloo", gloo)):
                times[name].append(_time_loop(comm.all_reduce, x, iters, barrier))
        rows.append(_row("all_reduce", nbytes, times))
    # the 0.3B's vocab-parallel LM head: B=1 logits, half the vocab per rank
    logits = paddle.ones([1, VOCAB_03B // world], dtype="float32")
    times = {"shm": [], "gloo": []}
    for _ in range(args.repeats):
        for name, comm in (("shm", shm), ("gloo", gloo)):
            times[name].append(_time_loop(lambda t, c=comm: c.all_gather(t, -1), logits, 200, barrier))
    rows.append(_row("all_gather", VOCAB_03B * 4, times))
    if rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)
    os._exit(0)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _label(op: str, nbytes: int) -> str:
    notes = {4 << 10: "0.3B decode, 1 token", 64 << 10: "0.3B decode, 16 tokens",
             2 << 20: "0.3B prefill, 512 tokens"}
    if op == "all_gather":
        return "0.3B LM head logits, B=1"
    return notes.get(nbytes, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--max-mb", type=int, default=64, help="largest size in MB (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed loops per size and communicator")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    master, *trainers = _free_ports(args.ranks + 1)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in trainers)
    procs = []
    for rank in range(args.ranks):
        env = dict(os.environ, PADDLE_DISTRI_BACKEND="gloo", PADDLE_TRAINER_ID=str(rank),
                   PADDLE_TRAINERS_NUM=str(args.ranks), PADDLE_TRAINER_ENDPOINTS=endpoints,
                   PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{trainers[rank]}", PADDLE_MASTER=f"127.0.0.1:{master}",
                   OMP_NUM_THREADS="1", FD_CPU_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--max-mb", str(args.max_mb),
                                       "--repeats", str(args.repeats)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate()[0] for proc in procs]
    lines = [line for line in outputs[0].splitlines() if line.startswith("ROWS ")]
    if not lines or any(proc.returncode for proc in procs):
        raise SystemExit("a rank failed:\n" + "\n".join(out[-3000:] for out in outputs))
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; {args.ranks} ranks, 1 thread each; fp32; "
          f"median (and best) of {args.repeats} loops per size")
    print(f"{'op':<11}{'size':>9}{'shm us':>11}{'gloo us':>11}{'shm GB/s':>10}{'gloo GB/s':>11}"
          f"{'gloo/shm':>10}{'best shm':>10}{'best gloo':>11}  note")
    for row in json.loads(lines[0][5:]):
        size = row["bytes"]
        shown = f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"
        print(f"{row['op']:<11}{shown:>9}{row['shm'] * 1e6:>11.1f}{row['gloo'] * 1e6:>11.1f}"
              f"{size / row['shm'] / 1e9:>10.2f}{size / row['gloo'] / 1e9:>11.2f}"
              f"{row['gloo'] / row['shm']:>9.1f}x{row['shm_best'] * 1e6:>10.1f}{row['gloo_best'] * 1e6:>11.1f}"
              f"  {_label(row['op'], size)}")


if __name__ == "__main__":
    main()
