"""Where a batch-1 decode step of the offline engine goes, around the model forward.

Loads the engines ``benchmarks/llama_cpp.py`` measures for fd-core (through
``llama_cpp_fdcore.load``: the generated checkpoints under
``checkpoints/llama-cpp``, prefix caching off), prefills B requests of
``--prompt-len`` tokens, then times ``--steps`` ``LLMEngine.step()`` calls
per round, as ``llama_cpp_fdcore.measure_decode`` does (tok/s = B x steps /
their total time). In the same run, alternating with those rounds, it times
the same steps with timers around each part of the step:

- ``schedule``: ``Scheduler.schedule`` (token budget, KV block allocation);
- ``prepare``: ``ModelRunner.execute`` before the forward (attention
  metadata, token ids and logits rows to tensors);
- ``forward``: the model's ``forward`` (embedding, layers, norm, LM head);
- ``sample``: ``Sampler.sample`` (greedy: the argmax);
- ``update``: ``Scheduler.update_from_output`` (append tokens, stop checks);
- ``output``: ``OutputProcessor.process`` (detokenize, stop strings);
- ``core rest``: the rest of ``EngineCore.step`` (step input, rows, outputs);
- on fd_x86, the forward split into ``kernels`` (the native ops' calls) and
  ``model Python`` (the rest: the model's and the backend's Python around them).

The timers cost a little themselves (a few us per part): the "engine" row
(step minus forward) is an upper bound.

``--stub-kernels`` times the same steps with fd_x86's run op replaced by its
first answer for each shape (``StubbedRun``; the greedy tokens then repeat):
what the engine's Python costs alone, with no kernel streaming the weights
through the caches between steps. The same Python runs ~2x slower in the
real step, after the kernels (see the README's "Engine cost around the
forward"), so the two rows bound its share of a step from both sides. ``--cprofile`` prints the top
functions of one round under cProfile instead.

    python benchmarks/engine_overhead.py                      # mid-moe wint4 and 0.3b wint8, B = 1 8
    python benchmarks/engine_overhead.py --shapes mid-moe --batch 1 --rounds 5
    python benchmarks/engine_overhead.py --cprofile --shapes mid-moe --batch 1
    python benchmarks/engine_overhead.py --stub-kernels --shapes mid-moe 0.3b --batch 1
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import llama_cpp_fdcore as fdc  # noqa: E402
from llama_cpp_shapes import MID_MOE  # noqa: E402
from quant_decode import finish, start  # noqa: E402

# --shapes name -> (checkpoint dir under checkpoints/llama-cpp, generator shape, seed, overrides, LLM kwargs)
SHAPES: dict[str, tuple[str, str, int, dict[str, Any], dict[str, Any]]] = {
    "mid-moe": ("mid-moe", "tiny-moe", 3, MID_MOE, {"quantization": "wint4", "dtype": "auto"}),
    "0.3b": ("0.3b", "0.3b", 0, {}, {"quantization": "wint8", "dtype": "auto"}),
}
PARTS = ("schedule", "prepare", "forward", "sample", "update", "output")


class StubbedRun:
    """While entered, ``module.<name>`` (fd_x86's ``fd_x86_run_plan_step``) answers every call with what the
    real op answered to the first call of the same hidden-state shape: the engine's steps run whole (schedule,
    inputs, the model's and the backend's Python, sampling, outputs) without the kernels."""

    def __init__(self, module: Any, name: str = "fd_x86_run_plan_step") -> None:
        self.module, self.name = module, name
        self.real: Callable[..., Any] = getattr(module, name)
        self.answers: dict[tuple[int, ...], Any] = {}

    def __call__(self, *args: Any) -> Any:
        key = tuple(args[0].shape)
        if key not in self.answers:
            self.answers[key] = self.real(*args)
        return self.answers[key]

    def __enter__(self) -> StubbedRun:
        setattr(self.module, self.name, self)
        return self

    def __exit__(self, *exc: Any) -> None:
        setattr(self.module, self.name, self.real)


class Timers:
    """Wraps the parts of one engine's step with perf_counter timers (instance attributes only)."""

    def __init__(self, engine: Any) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.engine = engine
        core = engine.core
        runner = core.runner
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, name, what its __dict__ held or None)
        self._wrap(core.scheduler, "schedule", "schedule")
        self._wrap(core.scheduler, "update_from_output", "update")
        self._wrap(core.sampler, "sample", "sample")
        self._wrap(engine.processor, "process", "output")
        self._wrap(runner, "execute", "execute")
        self._wrap(runner.model, "forward", "forward")
        try:  # the native kernels' own time, when the backend is fd_x86
            from fd_x86.build import load_ops
        except ImportError:
            return
        module = load_ops()
        for name in [n for n in vars(module) if n.startswith("fd_x86_") and callable(getattr(module, n))]:
            self._wrap(module, name, "kernels")

    def _wrap(self, owner: Any, name: str, part: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)
        seconds = self.seconds

        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - begin

        self._saved.append((owner, name, vars(owner).get(name)))
        object.__setattr__(owner, name, timed)

    def remove(self) -> None:
        for owner, name, held in reversed(self._saved):
            if held is None:
                object.__delattr__(owner, name)
            else:
                object.__setattr__(owner, name, held)

    def breakdown(self, step_seconds: float) -> dict[str, float]:
        """Seconds per part (prepare = execute - forward; core rest = step - the others)."""
        s = dict(self.seconds)
        parts = {p: s.get(p, 0.0) for p in PARTS}
        parts["prepare"] = s.get("execute", 0.0) - parts["forward"]
        parts["core rest"] = step_seconds - sum(parts.values())
        if "kernels" in s:  # forward = native kernels + the model's Python around them
            parts["  kernels"] = s["kernels"]
            parts["  model Python"] = parts["forward"] - s["kernels"]
        return parts


def timed_round(row: fdc.FdRow, batch: int, prompt_len: int, steps: int, timers: bool) -> tuple[float, dict]:
    """One round: (seconds of ``steps`` engine steps, per-part seconds when ``timers``)."""
    engine = row.config.llm.engine
    start(row.config, batch, prompt_len, steps + 4)
    wrap = Timers(engine) if timers else None
    total = 0.0
    for _ in range(steps):
        begin = time.perf_counter()
        engine.step()
        total += time.perf_counter() - begin
    parts = wrap.breakdown(total) if wrap is not None else {}
    if wrap is not None:
        wrap.remove()
    finish(row.config)
    return total, parts


def checkpoint(name: str) -> Path:
    directory, generator, seed, overrides, _ = SHAPES[name]
    path = ROOT / "checkpoints" / "llama-cpp" / directory
    if not (path / "config.json").is_file():
        from fd_core.testing.checkpoints import generate_checkpoint

        print(f"generating {path} ({generator}, PyTorch naming)", flush=True)
        generate_checkpoint(path, generator, naming="pytorch", seed=seed, **overrides)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["mid-moe", "0.3b"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed per round")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--backend", default="x86")
    parser.add_argument("--cprofile", action="store_true", help="one round under cProfile, top functions")
    parser.add_argument("--stub-kernels", action="store_true",
                        help="fd_x86's run op answers from its first call per shape (StubbedRun): the engine alone")
    parser.add_argument("--quantization", default=None,
                        help="the engine's quantization (a method name or a JSON object); default per shape: "
                        + ", ".join(f"{n} {v[4]['quantization']}" for n, v in sorted(SHAPES.items())))
    args = parser.parse_args()
    if args.stub_kernels and args.backend != "x86":
        parser.error(f"--stub-kernels replaces fd_x86's run op; it needs --backend x86, got {args.backend!r}")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(f"CPU: {model}")
    max_len = args.prompt_len + args.steps + 64
    for name in args.shapes:
        kwargs = dict(SHAPES[name][4])
        if args.quantization is not None:
            kwargs["quantization"] = args.quantization
        row = fdc.load(name, checkpoint(name), args.backend, kwargs, max(args.batch), max_len)
        stub: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if args.stub_kernels:
            from fd_x86.build import load_ops

            stub = StubbedRun(load_ops())
        with stub:
            measure(row, name, kwargs, args)
        del row.config.llm
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


def measure(row: fdc.FdRow, name: str, kwargs: dict[str, Any], args: argparse.Namespace) -> None:
    """``row``'s rounds at each ``--batch``, printed (``--cprofile``: the profile instead)."""
    stubbed = " (kernels stubbed)" if args.stub_kernels else ""
    for batch in args.batch:
        if args.cprofile:
            profile = cProfile.Profile()
            profile.runcall(timed_round, row, batch, args.prompt_len, args.steps, False)
            print(f"\n{name} B={batch}: cProfile of {args.steps} steps (prefill and finish included)")
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)
            continue
        plain: list[float] = []
        parts: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.rounds):  # plain and timed rounds alternate
            plain.append(timed_round(row, batch, args.prompt_len, args.steps, False)[0])
            total, split = timed_round(row, batch, args.prompt_len, args.steps, True)
            parts["step (timed)"].append(total)
            for part, seconds in split.items():
                parts[part].append(seconds)
        ms = 1e3 / args.steps
        step = statistics.median(plain) * ms
        print(f"\n{name} {kwargs['quantization']} B={batch}{stubbed}: {batch * 1e3 / step:.1f} tok/s, "
              f"{step:.3f} ms/step (median of {args.rounds} rounds of {args.steps} steps; "
              f"fastest round {min(plain) * ms:.3f} ms)")
        forward = statistics.median(parts["forward"]) * ms
        for part, values in parts.items():
            print(f"  {part:<13} {statistics.median(values) * ms:7.3f} ms")
        print(f"  engine (timed step - forward) {statistics.median(parts['step (timed)']) * ms - forward:.3f} ms")


if __name__ == "__main__":
    main()
