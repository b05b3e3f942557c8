"""fd_x86's shared-memory communicator (fd_x86.comm) across 2 and 3 gloo processes.

Each case starts one ``comm_worker.py`` per rank (a real paddle.distributed
gloo group on 127.0.0.1) and checks what the ranks wrote: all_reduce equal to
numpy's sum in rank order (fp32 bit for bit, bf16 rounded once), all_gather
equal to numpy's concatenation, sizes above the segment's slot, no segment
left in /dev/shm, and a rank that stalls or dies named in the others' error.
Each case starts 2-3 paddle processes (~5-15 s); the default run keeps three
(2 ranks, a stalled rank, a dead rank of 3), the rest are marked slow.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("paddle")
from fd_x86 import build  # noqa: E402
from fd_x86.comm import PREFIX, SHM_DIR, enabled, shm_communicator  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from comm_worker import REDUCE_SIZES, rank_data  # noqa: E402

pytestmark = pytest.mark.skipif(build.compiler() is None and not build.is_built(),
                                reason="fd_x86's ops need a C++ compiler to build")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _run(scenario: str, world: int, tmp_path: Path, **extra_env: str) -> list[dict[str, np.ndarray]]:
    master, *trainers = _free_ports(world + 1)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in trainers)
    procs = []
    for rank in range(world):
        env = dict(os.environ, PADDLE_DISTRI_BACKEND="gloo", PADDLE_TRAINER_ID=str(rank),
                   PADDLE_TRAINERS_NUM=str(world), PADDLE_TRAINER_ENDPOINTS=endpoints,
                   PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{trainers[rank]}", PADDLE_MASTER=f"127.0.0.1:{master}",
                   FD_CPU_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra_env)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "comm_worker.py"), scenario,
                                       str(tmp_path / f"rank{rank}.npz")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [f"rank {r} exited {p.returncode}:\n{out[-3000:]}" for r, (p, out) in enumerate(zip(procs, outputs))
              if p.returncode != 0]
    assert not failed, "\n".join(failed)
    results = []
    for rank in range(world):
        path = tmp_path / f"rank{rank}.npz"
        results.append(dict(np.load(path)) if path.exists() else {})
    pids = {int(r["pid"]) for r in results if "pid" in r}
    leftovers = [p.name for p in SHM_DIR.glob(f"{PREFIX}*") if int(p.name[len(PREFIX):].split("_")[0]) in pids]
    assert not leftovers, f"segments left in {SHM_DIR}: {leftovers}"
    return results


def _sum_in_rank_order(parts: list[np.ndarray]) -> np.ndarray:
    total = parts[0].copy()
    for part in parts[1:]:
        total = total + part
    return total


def _bf16(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 (round to nearest even) -> fp32, as paddle's cast does."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_collectives_match_numpy(world: int, tmp_path: Path) -> None:
    results = _run("collectives", world, tmp_path)
    for rank, got in enumerate(results):
        for n in REDUCE_SIZES:
            parts = [rank_data(r, n) for r in range(world)]
            want = _sum_in_rank_order(parts)
            np.testing.assert_array_equal(got[f"reduce_shm_{n}"], want, err_msg=f"rank {rank} n={n}")
            np.testing.assert_array_equal(got[f"reduce_small_{n}"], want, err_msg=f"rank {rank} n={n} chunked")
            np.testing.assert_allclose(got[f"reduce_gloo_{n}"], want, rtol=1e-5, atol=1e-6)
            bf16_want = _bf16(_sum_in_rank_order([_bf16(p) for p in parts]))
            np.testing.assert_array_equal(got[f"reduce_bf16_{n}"], bf16_want, err_msg=f"bf16 rank {rank} n={n}")
        grids = [rank_data(r, 30).reshape(2, 3, 5) for r in range(world)]
        for axis in (0, 1, -1):
            np.testing.assert_array_equal(got[f"gather_{axis}"], np.concatenate(grids, axis=axis))
        np.testing.assert_array_equal(got["gather_big"], np.concatenate([rank_data(r, 5000) for r in range(world)]))
        np.testing.assert_array_equal(got["gather_int64"], np.concatenate([np.arange(7) + 100 * r
                                                                           for r in range(world)]))
        a2a = [rank_data(r, 4 * world).reshape(2 * world, 2) for r in range(world)]
        np.testing.assert_array_equal(got["a2a"], np.concatenate([np.split(a, world)[rank] for a in a2a]))
        want_repeat = sum(sum(float(r + step) for r in range(world)) for step in range(200))
        np.testing.assert_array_equal(got["repeat"], np.full(64, want_repeat, dtype=np.float32))
    # right after the rendezvous every rank saw both segments' names gone from /dev/shm
    assert all(int(got["leaked"]) == 0 for got in results)


@pytest.mark.parametrize(("scenario", "world", "words"), [
    ("stalls", 2, "did not arrive within 1 s"),
    ("dies", 3, "has exited"),
    pytest.param("aborts", 2, "gave up", marks=pytest.mark.slow),
    pytest.param("mismatch", 2, "passed a tensor of another size", marks=pytest.mark.slow),
])
def test_a_missing_rank_is_named(scenario: str, world: int, words: str, tmp_path: Path) -> None:
    results = _run(scenario, world, tmp_path)
    culprit = world - 1
    for rank in range(culprit):
        error = str(results[rank]["error"])
        assert int(results[rank]["culprit"]) == culprit
        assert f"rank {culprit}" in error and words in error, error
        assert f"on rank {rank} of {world}" in error
        assert str(results[rank]["again"]) == error


def test_switched_off_and_single_rank_answer_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shm_communicator(1, 0, None) is None
    with pytest.raises(ValueError, match="slot_bytes=5000: expected a positive multiple of 4096"):
        shm_communicator(2, 0, None, slot_bytes=5000)  # refused on every rank, before any collective
    monkeypatch.setenv("FD_X86_SHM_COMM", "0")
    assert not enabled()
    assert shm_communicator(2, 0, None) is None  # before any collective: no group needed


@pytest.mark.slow
def test_switched_off_runs_gloo(tmp_path: Path) -> None:
    """With FD_X86_SHM_COMM=0 the x86 backend's communicator is fd-core's gloo one."""
    results = _run("gloo_only", 2, tmp_path, FD_X86_SHM_COMM="0")
    for rank, got in enumerate(results):
        parts = [rank_data(r, 1000) for r in range(2)]
        np.testing.assert_allclose(got["reduce"], parts[0] + parts[1], rtol=1e-6)
        assert str(got["type"]) == "Communicator", rank
