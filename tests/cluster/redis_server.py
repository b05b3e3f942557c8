"""A real ``redis-server`` on a free loopback port in a temp dir, for the cluster tests.

It runs with an append-only file fsynced on every write (as a deployment
that must not lose acknowledged requests would), so ``restart()`` keeps the
data; ``restart(wipe=True)`` starts it empty, as a server without persistence.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "REDIS_SERVER"]

REDIS_SERVER = shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        assert REDIS_SERVER is not None
        self.dir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
               "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no",
               "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"redis-server did not start on port {self.port}: "
                             f"{(self.dir / 'redis.log').read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis-server flushes its append-only file and exits
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, down_seconds: float = 0.0, wipe: bool = False) -> None:
        self.stop()
        if wipe:
            shutil.rmtree(self.dir / "appendonlydir", ignore_errors=True)
            for f in self.dir.glob("*.aof"):
                f.unlink()
        time.sleep(down_seconds)
        self.start()
