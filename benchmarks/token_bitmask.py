"""Structured output's mask op: fd-core's reference vs fd_x86's native op, same run.

For each batch size B (default 1, 8, 32) and a vocabulary of V tokens
(default 103424, ERNIE-4.5's), applies a random packed bitmask to B rows of
fp32 logits with ``fd_core.ops.token_bitmask.reference_apply_token_bitmask``
and with ``fd_x86.bitmask.apply_token_bitmask`` (checked equal first) and
prints ms per call and the ratio.

    python benchmarks/token_bitmask.py
    python benchmarks/token_bitmask.py --batch 8 --vocab 151936 --iters 100
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def per_call_ms(fn: Callable[..., Any], logits: Any, mask: np.ndarray, rows: list[int], iters: int) -> float:
    for _ in range(3):
        fn(logits, mask, rows)
    start = time.perf_counter()
    for _ in range(iters):
        fn(logits, mask, rows)
    return (time.perf_counter() - start) / iters * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--vocab", type=int, default=103424)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()

    import paddle
    from fd_x86.bitmask import apply_token_bitmask

    from fd_core.backends.cpu import num_threads
    from fd_core.ops.token_bitmask import reference_apply_token_bitmask

    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    print(f"{cpu}; {num_threads()} threads; V={args.vocab}")
    rng = np.random.default_rng(0)
    words = (args.vocab + 31) // 32
    print(f"{'B':>3} {'reference ms':>13} {'fd_x86 ms':>10} {'ratio':>7}")
    for b in args.batch:
        base = rng.standard_normal((b, args.vocab)).astype(np.float32)
        mask = rng.integers(-2**31, 2**31, (b, words), dtype=np.int64).astype(np.int32)
        rows = list(range(b))
        ref, nat = paddle.to_tensor(base.copy()), paddle.to_tensor(base.copy())
        reference_apply_token_bitmask(ref, mask, rows)
        apply_token_bitmask(nat, mask, rows)
        if not np.array_equal(ref.numpy(), nat.numpy()):
            raise SystemExit(f"B={b}: the native op's logits differ from the reference's")
        r = per_call_ms(reference_apply_token_bitmask, ref, mask, rows, args.iters)
        n = per_call_ms(apply_token_bitmask, nat, mask, rows, args.iters)
        print(f"{b:>3} {r:>13.3f} {n:>10.3f} {r / n:>6.1f}x")


if __name__ == "__main__":
    main()
