"""Weight and KV-cache dtypes against fp32, in one run.

For each configuration (``--configs``, default: fp32, bf16 weights, int8 KV,
fp8 KV, bf16 weights + int8 KV) on one backend, the same engine workload:

- decode tok/s at batch ``--batch`` after ``--prompt``-token prompts (steps
  timed with the engine's own step stats, median over ``--rounds`` rounds,
  the configurations interleaved round by round so machine noise hits all);
- resident weight bytes, and the KV pool's bytes per token;
- KV capacity: sequences of ``--max-model-len`` tokens that fit in the same
  ``--kv-gib`` of memory, and its ratio to fp32;
- greedy agreement with fp32 over ``--prompts`` prompts x ``--tokens``
  tokens (the fraction of sequences identical throughout);
- the memory floor: the time to read the configuration's resident weight
  bytes once (numpy sums over a buffer of that size, one thread per core
  fd-core uses, median of several reads, timed in the same run), and the
  decode step's time as a multiple of it ("x read"). At batch 1 a decode
  step must read every weight once, so this is its memory-bound ceiling.

    python benchmarks/dtypes.py                                   # tiny-dense, x86 if usable
    python benchmarks/dtypes.py --shape 0.3b --backend x86 --batch 1
    python benchmarks/dtypes.py --json

Ratios are to fp32 measured in the same run; record the CPU model with every
figure (printed first). Checkpoints are generated (seeded random weights)
under ``checkpoints/``, once.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core import LLM, SamplingParams  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.model_loader.accounting import weight_bytes  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

CONFIGS = {  # name -> LLM keyword arguments
    "fp32": {"dtype": "float32", "kv_cache_dtype": "float32"},
    "bf16-weights": {"dtype": "bfloat16", "kv_cache_dtype": "float32"},
    "int8-kv": {"dtype": "float32", "kv_cache_dtype": "int8"},
    "fp8-kv": {"dtype": "float32", "kv_cache_dtype": "fp8"},
    "bf16+int8-kv": {"dtype": "bfloat16", "kv_cache_dtype": "int8"},
}
BLOCK = 16


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_seconds(nbytes: int, threads: int, repeats: int = 7) -> float:
    """Median time to read ``nbytes`` of memory once with ``threads`` threads:
    fd_x86's ``fd_x86_read_memory`` (512-bit loads, 4 in flight per thread)
    where it runs, else numpy sums (which release the GIL; each thread sums its
    own part; they read ~30% slower than the native probe, so the floor would
    look lower than it is)."""
    native = _native_read(nbytes, threads, repeats)
    if native is not None:
        return native
    import threading

    buf = np.ones(max(1, nbytes // 8), dtype=np.int64)
    parts = np.array_split(buf, max(1, threads))
    times = []
    for _ in range(repeats):
        workers = [threading.Thread(target=part.sum) for part in parts]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _native_read(nbytes: int, threads: int, repeats: int) -> float | None:
    try:
        import paddle
        from fd_x86.build import load_ops
        from fd_x86.dense16 import dense16_enabled

        if not dense16_enabled():  # the probe needs AVX-512
            return None
        op = load_ops().fd_x86_read_memory
    except Exception:
        return None
    buf = paddle.ones([nbytes + 64], dtype="uint8")
    op(buf, threads)  # fault the pages in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        op(buf, threads)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_seconds(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    """Wall time of the decode steps of one batch (the prefill step excluded)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", {"prompt_token_ids": p}, params)
    steps = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    return sum(steps[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny-dense", help="generated checkpoint shape (tiny-dense, 0.3b, ...)")
    ap.add_argument("--model", default=None, help="a checkpoint directory instead of --shape")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16, help="prompts for greedy agreement")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt for agreement")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-gib", type=float, default=4.0, help="memory the capacity column compares in")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown or "fp32" not in names:
        ap.error(f"--configs must name fp32 and only {', '.join(CONFIGS)}; got {args.configs!r}")

    path = Path(args.model) if args.model else ROOT / "checkpoints" / f"bench-{args.shape}"
    if not (path / "config.json").exists():
        generate_checkpoint(path, args.shape)
    rng = np.random.default_rng(0)
    batch = [[int(t) for t in rng.integers(100, 1000, args.prompt)] for _ in range(args.batch)]
    probes = [[int(t) for t in rng.integers(100, 1000, int(n))] for n in rng.integers(8, 32, args.prompts)]
    engines = {}
    for name in names:
        engines[name] = LLM(str(path), backend=args.backend, max_model_len=args.max_model_len,
                            max_num_seqs=max(args.batch, args.prompts), block_size=BLOCK,
                            num_gpu_blocks_override=max(args.batch, args.prompts)
                            * (-(-args.max_model_len // BLOCK)) + 1, **CONFIGS[name])
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            seconds[name].append(decode_seconds(engines[name], batch, args.steps + 1))
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    outputs = {n: [o.outputs[0].token_ids for o in engines[n].generate(
        [{"prompt_token_ids": p} for p in probes], greedy, use_tqdm=False)] for n in names}
    from fd_core.backends.cpu import num_threads

    rows = []
    for name in names:
        runner = engines[name].engine.core.runner
        nbytes = weight_bytes(runner.model)
        step_s = statistics.median(seconds[name]) / args.steps
        read_s = read_seconds(nbytes, num_threads())
        kv_dtype = runner.kv_caches[0].dtype if runner.kv_caches else "float32"
        per_block = ModelRunner.kv_bytes_per_block(runner.config, BLOCK, kv_dtype)
        seq_blocks = -(-args.max_model_len // BLOCK)
        tok_s = args.batch * args.steps / statistics.median(seconds[name])
        rows.append({
            "config": name, "backend": engines[name].engine.core.backend.name, "kv_dtype": kv_dtype,
            "weights_mib": nbytes / (1 << 20),
            "step_ms": step_s * 1e3,
            "weight_read_ms": read_s * 1e3,
            "step_vs_read": step_s / read_s,
            "kv_bytes_per_token": per_block / BLOCK,
            "sequences_in_kv_gib": int(args.kv_gib * (1 << 30) // (per_block * seq_blocks)),
            "decode_tok_s": tok_s,
            "identical": sum(a == b for a, b in zip(outputs[name], outputs["fp32"])) / len(probes),
        })
    base = next(r for r in rows if r["config"] == "fp32")
    for r in rows:
        r["speed_vs_fp32"] = r["decode_tok_s"] / base["decode_tok_s"]
        r["capacity_vs_fp32"] = r["sequences_in_kv_gib"] / max(1, base["sequences_in_kv_gib"])
    header = (f"CPU: {cpu_model()}; shape {args.shape}; batch {args.batch} after {args.prompt}-token prompts; "
              f"median of {args.rounds} interleaved rounds")
    if args.json:
        print(json.dumps({"header": header, "rows": rows}))
        return 0
    print(header)
    print(f"{'config':14} {'backend':8} {'weights MiB':>11} {'KV B/token':>10} {'seqs in ' + str(args.kv_gib) + ' GiB':>14} "
          f"{'x fp32':>6} {'decode tok/s':>12} {'x fp32':>6} {'step ms':>8} {'read ms':>8} {'x read':>6} "
          f"{'greedy = fp32':>13}")
    for r in rows:
        print(f"{r['config']:14} {r['backend']:8} {r['weights_mib']:11.1f} {r['kv_bytes_per_token']:10.0f} "
              f"{r['sequences_in_kv_gib']:14d} {r['capacity_vs_fp32']:6.2f} {r['decode_tok_s']:12.1f} "
              f"{r['speed_vs_fp32']:6.2f} {r['step_ms']:8.1f} {r['weight_read_ms']:8.1f} {r['step_vs_read']:6.2f} "
              f"{r['identical']:13.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
