"""Decode-step latency of the CPU backend against the matmul-only ceiling.

Builds a ``ModelRunner`` on ``--backend`` (default ``auto``: what fd-serve
picks, fd_x86 when installed, else the CPU reference) over a random-weight checkpoint of
the ERNIE-4.5-0.3B shape (generated once under ``checkpoints/``), prefills B
prompts of ``--prompt-len`` tokens, then times decode steps at each batch
size. In the same run it times the "matmul-only ceiling": just the matmuls of
one decode step (qkv, o, up_gate, down per layer, and the LM head) on random
weights of the same shapes, ``x [B, in] @ W [in, out]`` in paddle. It prints
step ms, ceiling ms, their ratio, a breakdown of the step by op family (from
timers around every backend op) and the sampler's time.

    python benchmarks/decode_step.py                 # B = 1, 8, 32, backend auto (x86 when installed)
    python benchmarks/decode_step.py --backend cpu   # the reference backend
    python benchmarks/decode_step.py --batch 8 --steps 20 --no-breakdown
    python benchmarks/decode_step.py --quantization wint8  # ratio to the same fp32 ceiling
    python benchmarks/decode_step.py --ops bound pluggy unfused  # op dispatch variants, same run
    python benchmarks/decode_step.py --dispatch-overhead   # us per op call, pluggy vs bound

``--ops`` builds one runner per variant on the same checkpoint and alternates
their timed runs: ``bound`` (the default ``Ops``: hooks resolved once),
``pluggy`` (``Ops(bind=False)``: pluggy dispatch on every call), ``unfused``
(bound, never asking ``fd_decoder_layers``: the model's layers op by op) and
``unfused-pluggy``.

Timings on a shared machine are noisy: every number is the median of
``--repeats`` runs of ``--steps`` steps, and step and ceiling runs alternate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fd_core._paddle import import_paddle  # noqa: E402
from fd_core.backends.base import Ops  # noqa: E402
from fd_core.backends.registry import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner, StepInput  # noqa: E402
from fd_core.ops import attention as attention_ops  # noqa: E402
from fd_core.plugins import hookimpl  # noqa: E402
from fd_core.plugins.manager import make_plugin_manager  # noqa: E402
from fd_core.quantization import parse_quantization  # noqa: E402
from fd_core.sampling.params import SamplingParams  # noqa: E402
from fd_core.sampling.sampler import Sampler, SamplingState  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402

paddle = import_paddle()

CHECKPOINT = ROOT / "checkpoints" / "ernie-4.5-0.3b-paddle"
BLOCK_SIZE = 64
# --ops name -> Ops keyword arguments
OPS_VARIANTS: dict[str, dict[str, bool]] = {
    "bound": {}, "pluggy": {"bind": False}, "unfused": {"fuse_layers": False},
    "unfused-pluggy": {"bind": False, "fuse_layers": False},
}


def checkpoint() -> Path:
    if not (CHECKPOINT / "model.safetensors").is_file():
        print(f"generating {CHECKPOINT} (once)", flush=True)
        generate_checkpoint(CHECKPOINT, "0.3b", naming="paddle")
    return CHECKPOINT


class Batch:
    """B requests with contiguous block tables; prefilled, then decoding."""

    def __init__(self, runner: ModelRunner, batch: int, prompt_len: int, max_len: int, first_block: int,
                 rng: np.random.Generator) -> None:
        blocks = -(-max_len // BLOCK_SIZE)
        self.runner = runner
        self.tables = [list(range(first_block + i * blocks, first_block + (i + 1) * blocks)) for i in range(batch)]
        self.prompts = rng.integers(0, runner.config.vocab_size, size=(batch, prompt_len)).tolist()
        self.seq_lens = [prompt_len] * batch
        self.rng = rng

    def prefill(self, chunk: int = 8) -> float:
        start = time.perf_counter()
        for lo in range(0, len(self.prompts), chunk):
            hi = min(lo + chunk, len(self.prompts))
            self.runner.execute(StepInput(self.prompts[lo:hi], self.seq_lens[lo:hi], self.tables[lo:hi], 0))
        return time.perf_counter() - start

    def decode_step(self, seq_lens: list[int]) -> Any:
        ids = self.rng.integers(0, self.runner.config.vocab_size, size=len(seq_lens)).tolist()
        return self.runner.execute(StepInput([[t] for t in ids], seq_lens, self.tables, len(seq_lens)))

    def time_decode(self, steps: int) -> float:
        """Mean ms of ``steps`` decode steps; the context restarts at the prompt
        length each call, so every call sees the same lengths."""
        start = time.perf_counter()
        for s in range(steps):
            self.decode_step([n + 1 + s for n in self.seq_lens])
        return (time.perf_counter() - start) / steps * 1e3


class MatmulCeiling:
    """Just the matmuls of one decode step, on random weights of the model's shapes."""

    def __init__(self, config: Any) -> None:
        c = config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = [(c.hidden_size, q + 2 * kv), (q, c.hidden_size), (c.hidden_size, 2 * c.intermediate_size),
                  (c.intermediate_size, c.hidden_size)]
        self.layers = [[paddle.randn(list(s)) * 0.02 for s in shapes] for _ in range(c.num_layers)]
        self.lm_head = paddle.randn([c.hidden_size, c.vocab_size]) * 0.02
        self.hidden = c.hidden_size

    def time(self, batch: int, steps: int) -> float:
        xs = {n: paddle.randn([batch, n]) for n in {w.shape[0] for w in self.layers[0]}}
        start = time.perf_counter()
        for _ in range(steps):
            for w in self.layers:
                for weight in w:
                    paddle.matmul(xs[weight.shape[0]], weight)
            paddle.matmul(xs[self.hidden], self.lm_head)
        return (time.perf_counter() - start) / steps * 1e3


class OpTimers:
    """Wraps every op of ``ops`` (and the metadata build) with a timer."""

    FAMILIES = {
        "rms_norm": "norms/rope/act", "rotary_embedding": "norms/rope/act", "silu_and_mul": "norms/rope/act",
        "write_kv_cache": "attention", "decode_attention": "attention", "prefill_attention": "attention",
    }

    def __init__(self, ops: Any, vocab_size: int) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.calls = 0  # op calls seen (the ops above, not the ops they call inside)
        self.ops = ops
        self.vocab_size = vocab_size
        self._saved: dict[str, Any] = {}
        self._build = attention_ops.AttentionMetadata.build

    def _wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.calls += 1
            family = self.FAMILIES.get(name, name)
            if name == "linear":
                weight = args[1] if len(args) > 1 else kwargs.get("weight")
                quant = args[3] if len(args) > 3 else kwargs.get("quant")
                out_features = weight.shape[-1] if weight is not None else getattr(quant, "out_features", None)
                family = "lm_head" if out_features == self.vocab_size else "matmuls"
            self.totals[family] += time.perf_counter() - start
            return out
        return timed

    def __enter__(self) -> OpTimers:
        for name in [*self.FAMILIES, "linear"]:
            self._saved[name] = getattr(self.ops, name)
            setattr(self.ops, name, self._wrap(name, self._saved[name]))
        build = self._build
        timers = self

        def timed_build(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = build(*args, **kwargs)
            timers.totals["host metadata"] += time.perf_counter() - start
            return out
        attention_ops.AttentionMetadata.build = timed_build  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in self._saved:
            delattr(self.ops, name)  # back to the class's method
        attention_ops.AttentionMetadata.build = self._build  # type: ignore[method-assign]


class _StubReference:
    """A reference that answers ``fd_silu_and_mul`` with its input: no kernel, only dispatch."""

    @hookimpl(trylast=True)
    def fd_silu_and_mul(self, x: Any) -> Any:
        return x


class _DecliningBackend:
    @hookimpl
    def fd_silu_and_mul(self, x: Any) -> Any:
        return None


def dispatch_overhead(calls: int, repeats: int) -> None:
    """us per ``ops.silu_and_mul`` call on stub plugins, pluggy vs bound: the
    reference alone, and a backend that declines in front of it."""
    for label, plugins in (("reference alone", [_StubReference()]),
                           ("backend declines, reference answers", [_StubReference(), _DecliningBackend()])):
        pm = make_plugin_manager(*plugins)
        row = []
        for bind in (False, True):
            op: Any = Ops(pm, "stub", bind=bind).silu_and_mul
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(calls):
                    op(calls)  # any non-None stands in for a tensor
                times.append((time.perf_counter() - start) / calls * 1e6)
            row.append(statistics.median(times))
        print(f"{label:38s}: pluggy {row[0]:.3f} us/call, bound {row[1]:.3f} us/call "
              f"({row[0] - row[1]:.3f} us saved per call)", flush=True)


def time_sampler(runner: ModelRunner, logits: Any, params: SamplingParams, repeats: int) -> float:
    sampler = Sampler(runner.ops, runner.config.vocab_size, method="sort")
    states = [SamplingState.create(params.replace(seed=i)) for i in range(logits.shape[0])]
    sampler.sample(logits, states)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler.sample(logits, states)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="decode steps per timed run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--no-sampler", action="store_true")
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument("--backend", default="auto", help="cpu, x86, ... or auto (default)")
    parser.add_argument("--quantization", default=None, help="wint8, wint4, w8a8 or FastDeploy's JSON form")
    parser.add_argument("--ops", nargs="+", default=["bound"], choices=list(OPS_VARIANTS),
                        help="op dispatch variants to time side by side (default: bound)")
    parser.add_argument("--dispatch-overhead", action="store_true",
                        help="only time 100k calls of a stub op, pluggy vs bound, and exit")
    args = parser.parse_args()
    if args.dispatch_overhead:
        dispatch_overhead(100_000, args.repeats)
        return

    backend = get_backend(args.backend)
    quantization = parse_quantization(args.quantization)
    max_len = args.prompt_len + args.steps + 2
    blocks_per_req = -(-max_len // BLOCK_SIZE)
    num_blocks = 1 + blocks_per_req * sum(args.batch)
    runners = {}
    for variant in args.ops:
        start = time.perf_counter()
        backend.ops = Ops(backend.pm, backend.name, **OPS_VARIANTS[variant])  # the runner takes backend.ops
        runners[variant] = ModelRunner(checkpoint(), backend, num_blocks=num_blocks, block_size=BLOCK_SIZE,
                                       max_model_len=4096, quantization=quantization)
        runners[variant].warmup()
        print(f"backend {backend.name}, {quantization.describe() if quantization else 'fp32'}, ops {variant}; "
              f"loaded in {time.perf_counter() - start:.1f} s; paddle threads: "
              f"{paddle.base.core.get_num_threads() if hasattr(paddle.base.core, 'get_num_threads') else '?'}",
              flush=True)
    runner = runners[args.ops[0]]
    ceiling = None if args.no_ceiling else MatmulCeiling(runner.config)
    rows = []
    first_block = 1
    for batch in args.batch:
        # the same prompts and decode tokens for every variant
        batches = {v: Batch(r, batch, args.prompt_len, max_len, first_block, np.random.default_rng(batch))
                   for v, r in runners.items()}
        first_block += blocks_per_req * batch
        prefill_s = {v: b.prefill() for v, b in batches.items()}
        for b in batches.values():
            b.time_decode(2)  # warm-up
        steps: dict[str, list[float]] = {v: [] for v in batches}
        ceils = []
        for _ in range(args.repeats):
            for v, b in batches.items():
                steps[v].append(b.time_decode(args.steps))
            if ceiling is not None:
                ceils.append(ceiling.time(batch, args.steps))
        ceil_ms = statistics.median(ceils) if ceils else float("nan")
        first_ms = statistics.median(steps[args.ops[0]])
        for v in batches:
            step_ms = statistics.median(steps[v])
            print(f"B={batch:3d} {v:>14s}: prefill {batch}x{args.prompt_len} {prefill_s[v] * 1e3:8.1f} ms "
                  f"({batch * args.prompt_len / prefill_s[v]:6.0f} tok/s) | decode step {step_ms:7.1f} ms "
                  f"(min {min(steps[v]):.1f}) | ceiling {ceil_ms:7.1f} ms (min {min(ceils) if ceils else 0:.1f}) "
                  f"| ratio {step_ms / ceil_ms:.2f} | vs {args.ops[0]} {step_ms / first_ms:.3f}", flush=True)
            rows.append({"batch": batch, "ops": v, "step": step_ms, "ceiling": ceil_ms})
        reqs = batches[args.ops[0]]
        line: dict[str, Any] = {}
        if not args.no_breakdown:
            for v, b in batches.items():
                with OpTimers(b.runner.ops, b.runner.config.vocab_size) as timers:
                    start = time.perf_counter()
                    for _ in range(args.repeats):
                        b.time_decode(args.steps)
                    total = (time.perf_counter() - start) * 1e3
                n = args.repeats * args.steps
                parts = {k: t * 1e3 / n for k, t in sorted(timers.totals.items())}
                parts["other (glue, embed, runner)"] = total / n - sum(parts.values())
                print(f"       {v} breakdown ms/step ({timers.calls // n} op calls/step): "
                      + ", ".join(f"{k} {t:.1f}" for k, t in parts.items()), flush=True)
        if not args.no_sampler:
            logits = reqs.decode_step([n + 1 for n in reqs.seq_lens])
            for label, params in (("greedy", SamplingParams(temperature=0.0)),
                                  ("top_p=0.9", SamplingParams(temperature=0.8, top_p=0.9)),
                                  ("top_k=50", SamplingParams(temperature=0.8, top_k=50)),
                                  ("top_k=50,top_p=0.9", SamplingParams(temperature=0.8, top_k=50, top_p=0.9))):
                line[label] = time_sampler(reqs.runner, logits, params, args.repeats)
            print("       sampler ms: " + ", ".join(f"{k} {t:.1f}" for k, t in line.items()), flush=True)
    print(f"\n  B | {'ops':>14s} | step ms | ceiling ms | ratio")
    for row in rows:
        print(f"{row['batch']:3d} | {row['ops']:>14s} | {row['step']:7.1f} | {row['ceiling']:10.1f} "
              f"| {row['step'] / row['ceiling']:.2f}")

if __name__ == "__main__":
    main()
