"""CPU cost per decode step of the n-gram and suffix proposers, against a
brute-force scan of the history (the definition of prompt lookup, O(history)
per step), in the same run.

Each simulated request starts with a prompt of ``--prompt`` tokens (a
repetitive one: a paragraph repeated with edits, so matches exist; and a random
one, so most lookups fail) and decodes ``--steps`` steps: per step ``propose(k)``
then ``append`` of 1..k+1 tokens (the accepted drafts plus one, taken from the
continuation of the paragraph). Prints microseconds per step (propose + append)
and the ratio to the brute-force scan; the proposers' cost must not grow with
the history, the scan's does.

    python benchmarks/spec_decode_proposers.py
    python benchmarks/spec_decode_proposers.py --prompt 1000 8000 --steps 300 -k 4
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from dtypes import cpu_model  # noqa: E402

from fd_core.spec_decode import NgramProposer, SuffixProposer  # noqa: E402


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        pattern = tokens[size - n:]
        for start in range(size - n - 1, -1, -1):
            if tokens[start: start + n] == pattern:
                return tokens[start + n: start + n + k]
    return []


def workload(kind: str, length: int, rng: random.Random) -> list[int]:
    if kind == "random":
        return [rng.randrange(100000) for _ in range(length)]
    paragraph = [rng.randrange(100000) for _ in range(200)]
    out: list[int] = []
    while len(out) < length:
        copy = list(paragraph)
        for _ in range(5):  # a few edits per repetition
            copy[rng.randrange(len(copy))] = rng.randrange(100000)
        out.extend(copy)
    return out[:length]


def run(name: str, stream: list[int], prompt: int, steps: int, k: int) -> tuple[float, float]:
    """(microseconds per step, mean drafts accepted per step) for one proposer on one stream."""
    rng = random.Random(1)
    history = stream[:prompt]
    if name == "ngram":
        prop: NgramProposer | SuffixProposer | None = NgramProposer(2, 5)
    elif name == "suffix":
        prop = SuffixProposer(max_depth=64, max_cached_requests=0)
    else:
        prop = None
    if prop is not None:
        prop.add_request("r", history)
    pos, accepted = prompt, 0
    start = time.perf_counter()
    for _ in range(steps):
        drafts = prop.propose("r", k) if prop is not None else brute_force(history, 2, 5, k)
        n = 0
        while n < len(drafts) and pos + n < len(stream) and drafts[n] == stream[pos + n]:
            n += 1
        new = stream[pos: pos + n + 1 + rng.randrange(1)]
        accepted += n
        pos += len(new)
        history.extend(new)
        if prop is not None:
            prop.append("r", new)
    return (time.perf_counter() - start) / steps * 1e6, accepted / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, nargs="+", default=[1000, 8000, 32000])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("-k", type=int, default=4)
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}; k={args.k}, {args.steps} steps per run")
    print(f"{'workload':>10} {'prompt':>7} {'proposer':>8} {'us/step':>9} {'accepted/step':>13} {'scan/this':>9}")
    for kind in ("repetitive", "random"):
        for prompt in args.prompt:
            stream = workload(kind, prompt + args.steps * (args.k + 2), random.Random(prompt))
            base, base_acc = run("scan", stream, prompt, args.steps, args.k)
            for name in ("scan", "ngram", "suffix"):
                us, acc = (base, base_acc) if name == "scan" else run(name, stream, prompt, args.steps, args.k)
                print(f"{kind:>10} {prompt:>7} {name:>8} {us:>9.1f} {acc:>13.2f} {base / us:>9.1f}")


if __name__ == "__main__":
    main()
