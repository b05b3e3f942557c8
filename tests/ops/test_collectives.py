"""Communicator: identity at world_size 1; sum / gather / exchange across 2 gloo processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import paddle

WORLD = 2


def test_world_size_one_is_identity(ops):
    comm = ops.communicator(1, 0, None)
    x = paddle.to_tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    np.testing.assert_array_equal(comm.all_reduce(x).numpy(), x.numpy())
    np.testing.assert_array_equal(comm.all_gather(x, 0).numpy(), x.numpy())
    np.testing.assert_array_equal(comm.all_gather(x, -1).numpy(), x.numpy())
    np.testing.assert_array_equal(comm.all_to_all(x).numpy(), x.numpy())


def _rank_data(rank: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    return {"reduce": rng.normal(size=(3, 5)), "gather": rng.normal(size=(2, 3)),
            "a2a": rng.normal(size=(4, 3))}


_WORKER = """
import json, sys
import numpy as np
import paddle
import paddle.distributed as dist
sys.path.insert(0, {tests_dir!r})
from ops.test_collectives import _rank_data
from fd_core.backends import get_backend

backend = get_backend("cpu")
backend.set_device(0)
dist.init_parallel_env()
rank = dist.get_rank()
comm = backend.ops.communicator(dist.get_world_size(), rank, None)
data = {{k: paddle.to_tensor(v.astype(np.float32)) for k, v in _rank_data(rank).items()}}
out = {{
    "reduce": comm.all_reduce(data["reduce"]).numpy().tolist(),
    "gather0": comm.all_gather(data["gather"], 0).numpy().tolist(),
    "gather1": comm.all_gather(data["gather"], -1).numpy().tolist(),
    "a2a": comm.all_to_all(data["a2a"]).numpy().tolist(),
}}
print("RESULT " + json.dumps(out))
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_two_process_gloo_collectives():
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    master, *trainers = _free_ports(WORLD + 1)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in trainers)
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, PADDLE_DISTRI_BACKEND="gloo", PADDLE_TRAINER_ID=str(rank),
                   PADDLE_TRAINERS_NUM=str(WORLD), PADDLE_TRAINER_ENDPOINTS=endpoints,
                   PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{trainers[rank]}",
                   PADDLE_MASTER=f"127.0.0.1:{master}", FD_CPU_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER.format(tests_dir=tests_dir)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    results = []
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=90)
            lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, f"worker failed:\n{output[-3000:]}"
            results.append({k: np.array(v) for k, v in json.loads(lines[-1][7:]).items()})
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()

    data = [{k: v.astype(np.float32) for k, v in _rank_data(r).items()} for r in range(WORLD)]
    reduced = sum(d["reduce"] for d in data)
    gather0 = np.concatenate([d["gather"] for d in data], axis=0)
    gather1 = np.concatenate([d["gather"] for d in data], axis=-1)
    for rank, got in enumerate(results):
        np.testing.assert_allclose(got["reduce"], reduced, rtol=1e-6)
        np.testing.assert_array_equal(got["gather0"], gather0)
        np.testing.assert_array_equal(got["gather1"], gather1)
        # rank r receives chunk r of every rank, in rank order
        want = np.concatenate([np.split(d["a2a"], WORLD)[rank] for d in data])
        np.testing.assert_array_equal(got["a2a"], want, err_msg=f"all_to_all on rank {rank}")

