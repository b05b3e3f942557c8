"""A server's processes as /proc shows them (Linux): the tree under a pid, who
is still alive, and resident memory.

Orphans are reparented (to pid 1 or a subreaper), so a tree walked after a
kill misses them: record ``descendants`` while the server is whole and check
those pids with ``alive`` afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["alive", "cmdline", "descendants", "rss_bytes", "wait_gone"]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:  # children are listed per thread that forked them
        try:
            out.extend(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(set(out))


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (not ``pid`` itself), children before grandchildren."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop(0))
        out.extend(kids)
        todo.extend(kids)
    return out


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has exited: it counts as gone)."""
    return [pid for pid in pids if _state(pid) not in (None, "Z")]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for ``pids`` to exit; returns those still alive."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid`` in bytes (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
