"""The profiling step that sizes the KV cache: the largest steps the scheduler
can issue, and the peak memory they take.

The engine runs these steps once at start-up, after the weights are loaded and
before the KV pool exists (on a one-block pool: every block table points at
the null block 0), and subtracts their peak from the pool's budget, so a
max-size step cannot push the device, or on CPU the host, over. This module
imports no tensor library; the runner executes the steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["HostPeak", "ProfileStep", "largest_steps", "measure_peak_bytes"]

logger = logging.getLogger(__name__)


# (token_ids, seq_lens, block_tables, num_decodes), as StepInput takes them
ProfileStep = tuple[list[list[int]], list[int], list[list[int]], int]


class _MemorySource(Protocol):
    def memory(self, device_id: int = 0) -> Any: ...


def largest_steps(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                  block_size: int) -> list[ProfileStep]:
    """The two steps of largest footprint, as ``(token_ids, seq_lens, block_tables, num_decodes)``.

    1. A prefill of ``max_num_batched_tokens`` tokens (at most ``max_num_seqs``
       requests of at most ``max_model_len`` tokens each), every request ending
       at ``max_model_len``: the most activation rows and the longest attention
       context a chunk can see.
    2. A decode of ``min(max_num_seqs, max_num_batched_tokens)`` rows, each over
       ``max_model_len`` cached tokens: the most logits rows and the widest
       decode attention (the reference gathers the whole context per layer).

    Token id 0 throughout; every block table entry is block 0, so the steps
    run on a one-block pool and write only the null block.
    """
    table = [0] * -(-max_model_len // block_size)
    tokens: list[list[int]] = []
    seq_lens: list[int] = []
    left = max_num_batched_tokens
    while left > 0 and len(tokens) < max_num_seqs:
        q = min(left, max_model_len)
        tokens.append([0] * q)
        seq_lens.append(max_model_len)
        left -= q
    prefill: ProfileStep = (tokens, seq_lens, [table] * len(tokens), 0)
    rows = min(max_num_seqs, max_num_batched_tokens)
    decode: ProfileStep = ([[0]] * rows, [max_model_len] * rows, [table] * rows, rows)
    return [prefill, decode]


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


class HostPeak:
    """Peak resident memory of this process across a span, from /proc (Linux).

    ``start()`` resets the high-water mark (writing "5" to
    /proc/self/clear_refs) and reads VmRSS; ``peak_bytes()`` is VmHWM minus
    that reading. Where the reset is refused, the peak falls back to the
    growth of VmRSS, which misses memory freed before the end of the span."""

    def __init__(self) -> None:
        self._start_kib = 0
        self._reset = False

    def start(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset = True
        except OSError as e:
            logger.debug("cannot reset VmHWM (%s): the profiling peak is the growth of VmRSS", e)
            self._reset = False
        self._start_kib = _proc_status_kib("VmRSS")

    def peak_bytes(self) -> int:
        end = _proc_status_kib("VmHWM" if self._reset else "VmRSS")
        return max(0, end - self._start_kib) * 1024


def measure_peak_bytes(run: Callable[[], None], device_type: str, backend: _MemorySource,
                       device_id: int = 0) -> int:
    """Bytes ``run`` took at its peak beyond what was in use when it started.

    On CPU: the process's resident high-water mark (``HostPeak``). On an
    accelerator: the drop of the backend's free memory across ``run``; the
    caching allocators keep what a step reserved, so the drop is its peak
    (a backend whose allocator returns memory eagerly would need a peak
    query, see ``fd_device_memory``)."""
    if device_type == "cpu":
        host = HostPeak()
        host.start()
        run()
        return host.peak_bytes()
    before = backend.memory(device_id).free_bytes
    run()
    after = backend.memory(device_id).free_bytes
    return max(0, int(before) - int(after))
