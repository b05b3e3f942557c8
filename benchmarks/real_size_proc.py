"""A child process watched for memory: ``benchmarks/real_size.py``'s peak-RSS probe.

``Watched`` starts a command and samples its ``/proc/<pid>/status`` every
``interval`` seconds on a thread: the peaks of ``RssAnon`` (heap: what a
loader allocates) and ``RssFile`` (file-backed pages it maps: safetensors
or GGUF files read through mmap) separately, and the kernel's own
``VmHWM`` (peak total RSS, exact, not sampled). ``mark()`` snapshots the
current figures (the resident size once a load is over) and ``reset_peaks()``
starts the peaks afresh. Both sides of the benchmark go through it, each
in its own process, so one side's memory never shows in the other's figures.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MemSample", "Watched", "parse_status"]

_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")


def parse_status(text: str) -> dict[str, int]:
    """``/proc/<pid>/status`` text -> {key: bytes} for VmRSS, RssAnon, RssFile, RssShmem, VmHWM (those present)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _KEYS:
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024
    return out


@dataclass
class MemSample:
    """Figures in bytes; ``peak_*`` are maxima over the samples since the last reset."""

    rss_anon: int = 0
    rss_file: int = 0
    hwm: int = 0  # the kernel's VmHWM: peak RssAnon + RssFile + RssShmem over the process's life
    peak_anon: int = 0
    peak_file: int = 0
    peak_total: int = 0  # peak of the sampled RssAnon + RssFile
    samples: int = 0

    def as_gib(self) -> dict[str, float]:
        return {k: round(v / (1 << 30), 3) for k, v in vars(self).items() if k != "samples"}


@dataclass
class Watched:
    """``cmd`` running with stdout+stderr to ``log``, its memory sampled every ``interval`` seconds."""

    cmd: Sequence[str]
    log: Path
    interval: float = 0.05
    env: dict[str, str] | None = None
    mem: MemSample = field(default_factory=MemSample)
    started: float = 0.0

    def __post_init__(self) -> None:
        self._out = self.log.open("w")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(list(self.cmd), stdout=self._out, stderr=subprocess.STDOUT, env=self.env)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, int] | None:
        try:
            return parse_status(Path(f"/proc/{self.proc.pid}/status").read_text())
        except (OSError, ProcessLookupError):
            return None

    def _sample_loop(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        status = self._read()
        if not status or "RssAnon" not in status:
            return
        with self._lock:
            m = self.mem
            m.rss_anon, m.rss_file, m.hwm = status["RssAnon"], status.get("RssFile", 0), status.get("VmHWM", 0)
            m.peak_anon = max(m.peak_anon, m.rss_anon)
            m.peak_file = max(m.peak_file, m.rss_file)
            m.peak_total = max(m.peak_total, m.rss_anon + m.rss_file)
            m.samples += 1

    def mark(self) -> MemSample:
        """The figures now (a fresh sample), peaks included."""
        self.sample()
        with self._lock:
            return MemSample(**vars(self.mem))

    def reset_peaks(self) -> None:
        with self._lock:
            self.mem = MemSample()

    def log_text(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._stop.set()
            self._out.flush()

    def stop(self) -> None:
        """Terminate the process (kill after 30 s) and stop sampling."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stop.set()
        self._out.close()
