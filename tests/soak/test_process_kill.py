"""SIGKILL any one process of fd-serve (the main/API process, one API worker, the
engine) while streams are in flight: within seconds no process of that server is
left, and every client got an answer or an error, none hangs.

A server's processes are found twice: the tree under the main process recorded
while it is whole (an orphan is reparented, so a later walk would miss it), and
every process on the machine whose environment carries this server's own
FD_LOG_DIR (which each child inherits, orphaned or not).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from fd_core.testing import process_tree
from tests.entrypoints.server_process import Server, gauge, tiny_server_args, wait_for

STREAMS = 6
LONG = 1900  # tokens: the streams are still running when the kill comes
GONE_SECONDS = {"api": 5.0, "engine": 10.0, "worker": 30.0}  # worker: the others drain (5 s) first
HANG_SECONDS = 60.0  # a client still waiting this long after the kill hangs


class Stream(threading.Thread):
    """One streaming chat on its own connection; ``result`` says how it ended."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.worker: str | None = None  # x-fd-worker of the answer
        self.started = threading.Event()  # the first event arrived
        self.result = ""  # complete / error-event / http-<status> / cut (transport error)
        self.start()

    def run(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_tokens": LONG, "ignore_eos": True}
        finished = error = False
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=HANG_SECONDS * 2,
                              headers={"Connection": "close"}) as resp:
                self.worker = resp.headers.get("x-fd-worker")
                if resp.status_code != 200:
                    self.result = f"http-{resp.status_code}"
                    return
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    self.started.set()
                    chunk = json.loads(line[6:])
                    error = error or "error" in chunk
                    finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
            self.result = "error-event" if error else "complete" if finished else "cut"
        except httpx.HTTPError as exc:
            self.result = f"cut ({type(exc).__name__})"
        finally:
            self.started.set()


def _server_processes(marker: str) -> list[int]:
    """Every live process whose environment holds ``marker`` (FD_LOG_DIR=...)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return process_tree.alive(found)


def _worker_pids(srv: Server) -> list[int]:
    """API worker pids in the order of their index (the main process logs them)."""
    match = re.search(r"with \d+ API workers \(pids ([\d, ]+)\)", srv.output())
    assert match, srv.output()
    return [int(p) for p in match.group(1).split(", ")]


@pytest.fixture(scope="module")
def model(checkpoint_factory):
    return checkpoint_factory("tiny-dense", "pytorch")


CASES = [(1, "api"), (1, "engine"),
         pytest.param(2, "api", marks=pytest.mark.slow), pytest.param(2, "worker", marks=pytest.mark.slow),
         pytest.param(2, "engine", marks=pytest.mark.slow)]


@pytest.mark.parametrize("workers,victim", CASES)
def test_killing_one_process_leaves_none_behind(model, tmp_path, workers, victim):
    srv = Server(tiny_server_args(model, "--workers", str(workers), "--timeout-graceful-shutdown", "5"),
                 tmp_path / "server.log")
    marker = f"FD_LOG_DIR={tmp_path / 'fd-log'}"
    try:
        srv.wait_ready()
        tree = [srv.proc.pid, *process_tree.descendants(srv.proc.pid)]
        assert sorted(_server_processes(marker)) == sorted(tree)  # the marker finds exactly the tree
        streams = [Stream(srv.url) for _ in range(STREAMS)]
        for s in streams:
            assert s.started.wait(HANG_SECONDS), "a stream never started"
        assert all(not s.result for s in streams), [s.result for s in streams]  # all still in flight
        wait_for(lambda: gauge(srv, "fastdeploy:num_requests_running") == STREAMS, what="streams running")
        if victim == "api":
            pid = srv.proc.pid
        elif victim == "engine":
            pid = srv.engine_pid()
        else:
            pid = _worker_pids(srv)[int(streams[0].worker or 0)]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        left = process_tree.wait_gone(tree, GONE_SECONDS[victim])
        assert left == [], f"left running {GONE_SECONDS[victim]:g} s after killing {victim} {pid}: " \
                           f"{[(p, process_tree.cmdline(p)) for p in left]}\n{srv.output()[-3000:]}"
        assert _server_processes(marker) == []
        for s in streams:
            s.join(max(0.0, killed_at + HANG_SECONDS - time.monotonic()))
        assert not any(s.is_alive() for s in streams), "a client hangs after the kill"
        results = [s.result for s in streams]
        if victim == "worker":  # its clients are cut; the other worker's drained theirs (5 s, then an error)
            mine = [s.result for s in streams if s.worker == streams[0].worker]
            others = [s.result for s in streams if s.worker != streams[0].worker]
            assert all(r.startswith("cut") for r in mine), results
            assert all(r in ("complete", "error-event") for r in others), results
        else:  # nobody can finish a 1900-token answer: each got an error event or a cut connection
            assert all(r == "error-event" or r.startswith("cut") for r in results), results
        if victim != "api":
            assert srv.proc.wait(timeout=5) == 1, srv.output()[-3000:]
    finally:
        srv.stop()
        for pid in _server_processes(marker):  # never leave one behind for the next test
            os.kill(pid, signal.SIGKILL)
