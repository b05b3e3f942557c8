"""One rank of test_x86_comm.py: ``python comm_worker.py <scenario> <out.npz>``.

The gloo group comes from the PADDLE_* variables the test sets; the worker
writes its results to ``<out.npz>`` (arrays, plus ``error`` / ``culprit``
for the failure scenarios) and exits 0.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import paddle
import paddle.distributed as dist
from fd_x86.comm import SHM_DIR, ShmCommError, ShmCommunicator, shm_communicator

from fd_core.backends import get_backend
from fd_core.ops.collectives import Communicator

REDUCE_SIZES = (1, 17, 1000, 4099, 40_001)  # 40_001 fp32: 160 kB, above the 8 kB slot and the split size
SMALL_SLOT = 8192


def rank_data(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 * rank + n).normal(size=n).astype(np.float32)


def collectives(rank: int, world: int, out: dict[str, np.ndarray]) -> None:
    comm = get_backend("x86").ops.communicator(world, rank, None)
    assert isinstance(comm, ShmCommunicator), type(comm)
    small = shm_communicator(world, rank, None, slot_bytes=SMALL_SLOT)
    assert small is not None
    dist.barrier()  # rank 0 unlinks after the rendezvous's last gather: let it get there
    # both segments were unlinked once all ranks mapped them
    out["leaked"] = np.array(sum((SHM_DIR / c.segment_name).exists() for c in (comm, small)))
    gloo = Communicator(world, rank, None)
    for n in REDUCE_SIZES:
        for name, c in (("shm", comm), ("small", small), ("gloo", gloo)):
            x = paddle.to_tensor(rank_data(rank, n))
            out[f"reduce_{name}_{n}"] = c.all_reduce(x).numpy()
        x = paddle.to_tensor(rank_data(rank, n)).astype("bfloat16")
        out[f"reduce_bf16_{n}"] = small.all_reduce(x).astype("float32").numpy()
    grid = paddle.to_tensor(rank_data(rank, 2 * 3 * 5).reshape(2, 3, 5))
    for axis in (0, 1, -1):
        out[f"gather_{axis}"] = small.all_gather(grid, axis).numpy()
    big = paddle.to_tensor(rank_data(rank, 5000))  # 20 kB per rank: three 8 kB chunks
    out["gather_big"] = small.all_gather(big, 0).numpy()
    out["gather_int64"] = small.all_gather(paddle.arange(7, dtype="int64") + 100 * rank, 0).numpy()
    out["a2a"] = small.all_to_all(paddle.to_tensor(rank_data(rank, 4 * world).reshape(2 * world, 2))).numpy()
    # many small calls in a row: the two buffer sets alternate without a third barrier
    acc = paddle.zeros([64], dtype="float32")
    for step in range(200):
        acc = acc + comm.all_reduce(paddle.full([64], float(rank + step), dtype="float32"))
    out["repeat"] = acc.numpy()


def failure(scenario: str, rank: int, world: int, out: dict[str, np.ndarray]) -> None:
    """The last rank stalls, dies, gives up or passes another size at the second call."""
    comm = shm_communicator(world, rank, None, slot_bytes=SMALL_SLOT, timeout_s=1.0)
    assert comm is not None
    comm.all_reduce(paddle.ones([8]))  # everyone arrives once
    size = 8
    if rank == world - 1:
        if scenario == "dies":
            os._exit(0)
        if scenario == "stalls":
            time.sleep(4.0)  # never arrives at the next one
            return
        if scenario == "aborts":
            comm.abort()
            return
        size = 9  # "mismatch"
    try:
        comm.all_reduce(paddle.ones([size]))
    except ShmCommError as exc:
        out["error"], out["culprit"] = np.array(str(exc)), np.array(exc.culprit)
        try:  # the communicator stays broken, with the same error
            comm.all_gather(paddle.ones([8]), 0)
        except ShmCommError as again:
            out["again"] = np.array(str(again))


def main() -> None:
    scenario, path = sys.argv[1], sys.argv[2]
    get_backend("x86").set_device(0)
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, np.ndarray] = {"pid": np.array(os.getpid())}
    if scenario == "collectives":
        collectives(rank, world, out)
    elif scenario == "gloo_only":  # FD_X86_SHM_COMM=0
        comm = get_backend("x86").ops.communicator(world, rank, None)
        out["type"] = np.array(type(comm).__name__)
        out["reduce"] = comm.all_reduce(paddle.to_tensor(rank_data(rank, 1000))).numpy()
    else:
        failure(scenario, rank, world, out)
    np.savez(path, **out)  # type: ignore[arg-type]
    sys.stdout.flush()
    os._exit(0)  # skip gloo's teardown, which waits for ranks that are gone


if __name__ == "__main__":
    main()
