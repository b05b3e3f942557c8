"""A real fd-serve in a subprocess, for the tests that drive it over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_server_args(model: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--backend", "cpu", "--max-model-len", "2048", "--max-num-seqs", "16",
            "--num-gpu-blocks-override", "512", "--block-size", "16", "--served-model-name", "tiny", *extra]


class Server:
    def __init__(self, args: list[str], log: Path, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.log_path = log
        self.log = open(log, "w")
        cmd = [sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--host", "127.0.0.1",
               "--port", str(self.port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "FD_LOG_DIR": str(log.parent / "fd-log")}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"server not ready in {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def engine_pid(self) -> int:
        for pid in children(self.proc.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline and _is_engine(pid):
                return pid
        raise AssertionError(f"no engine process among {children(self.proc.pid)}")

    def descendants(self) -> list[int]:
        out, todo = [], [self.proc.pid]
        while todo:
            kids = children(todo.pop())
            out.extend(kids)
            todo.extend(kids)
        return out

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running after {timeout} s:\n{self.output()}") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _is_engine(pid: int) -> bool:
    """The engine process maps paddle; API workers and the resource tracker do not."""
    try:
        return "paddle" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


def wait_gone(pids: list[int], timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not reached within {timeout} s")


def gauge(server: Server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def sse_events(lines: list[str]) -> list[dict | str]:
    """The ``data:`` payloads of an SSE body: dicts, and "[DONE]"."""
    out: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
