"""``fd-bench throughput`` and ``fd-bench latency``: the engine in process, no HTTP.

throughput: ``--num-prompts`` random prompts of ``--input-len`` tokens, each
generating ``--output-len`` tokens (ignore_eos), through ``LLM.generate``;
reports requests/s, output tokens/s and total tokens/s over the wall time.

latency: ``--num-iters`` batches of ``--batch-size`` prompts, driven with
``engine.add_request`` / ``engine.step()`` so every step is timed. The prefill
phase is every step up to the last one that schedules prompt tokens (with
chunked prefill it can take several steps and carry decodes); decode steps are
the steps after it. Step times are wall times of ``engine.step()`` (engine core
step plus detokenization); the core's own ``StepStats`` (step, forward, sample
seconds) are saved alongside. Each iteration and warm-up uses fresh prompts, so
the prefix cache never serves a measured prompt.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

import numpy as np

from fd_core.benchmarks.datasets import TokenSource
from fd_core.benchmarks.metrics import distribution

__all__ = ["add_latency_args", "add_throughput_args", "run_latency", "run_throughput"]

_ENGINE_FLAGS = {  # flag -> (type, help); passed to LLM(...) only when given
    "backend": (str, "auto, cpu, cuda, ... (default: auto)"),
    "max_num_seqs": (int, "requests in one batch"),
    "max_model_len": (int, "longest prompt + output"),
    "max_num_batched_tokens": (int, "token budget of one step"),
    "num_gpu_blocks_override": (int, "KV cache blocks, instead of sizing from memory"),
    "block_size": (int, "tokens per KV cache block"),
    "gpu_memory_utilization": (float, "fraction of device memory to use"),
    "quantization": (str, "wint8, wint4, w8a8 (or FastDeploy's JSON form)"),
    "dtype": (str, "weights' dtype: auto, bfloat16, float16, float32"),
    "kv_cache_dtype": (str, "KV cache dtype: auto, float32, bfloat16, float16, int8, fp8"),
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory (or hub id in the local cache)")
    g = p.add_argument_group("engine")
    for name, (kind, text) in _ENGINE_FLAGS.items():
        g.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text)
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        g.add_argument("--" + name.replace("_", "-"), type=_bool, nargs="?", const=True, default=None)
    p.add_argument("--seed", type=int, default=0, help="prompt draws")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="engine steps run on throwaway prompts before measuring")


def add_throughput_args(p: argparse.ArgumentParser) -> None:
    _add_engine_args(p)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--disable-tqdm", action="store_true")


def add_latency_args(p: argparse.ArgumentParser) -> None:
    _add_engine_args(p)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--percentiles", default="50,90,99")


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")


def _make_llm(args: argparse.Namespace) -> Any:
    from fd_core import LLM

    names = list(_ENGINE_FLAGS) + ["enable_prefix_caching", "enable_chunked_prefill"]
    kwargs = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    return LLM(args.model, **kwargs)


class _Prompts:
    """Fresh random token-id prompts that the model's vocabulary accepts."""

    def __init__(self, llm: Any, seed: int) -> None:
        self.source = TokenSource(np.random.default_rng(seed), llm.tokenizer)
        vocab = llm.engine.core.model_config.vocab_size
        self.source.ids = self.source.ids[self.source.ids < vocab]

    def batch(self, n: int, length: int) -> list[list[int]]:
        return [self.source.draw(length) for _ in range(n)]


def _params(args: argparse.Namespace, max_tokens: int) -> Any:
    from fd_core import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=args.temperature)


def _warmup(llm: Any, args: argparse.Namespace, prompts: _Prompts, batch: int) -> None:
    """Run ``--warmup-steps`` steps on throwaway prompts, then drop them."""
    if args.warmup_steps == 0:
        return
    engine = llm.engine
    ids = [f"warmup-{i}" for i in range(batch)]
    for rid, ids_ in zip(ids, prompts.batch(batch, args.input_len)):
        engine.add_request(rid, ids_, _params(args, args.output_len))
    for _ in range(args.warmup_steps):
        engine.step()
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # hand back the aborts' outputs so no measured step carries them


def _header(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    return {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "kind": kind,
            "config": {k: v for k, v in vars(args).items() if k != "func"}}


def _table(title: str, rows: list[tuple[str, Any]]) -> str:
    lines = [f"{title:=^50}"]
    for label, value in rows:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label + ':':<40} {text:<10}")
    return "\n".join(lines + ["=" * 50])


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Generate for every prompt at once; prints and returns the throughput."""
    _positive(args, "input_len", "output_len", "num_prompts")
    llm = _make_llm(args)
    prompts = _Prompts(llm, args.seed)
    _warmup(llm, args, prompts, min(args.num_prompts, llm.engine.args.max_num_seqs))
    batch = prompts.batch(args.num_prompts, args.input_len)
    start = time.perf_counter()
    outputs = llm.generate(batch, _params(args, args.output_len), use_tqdm=not args.disable_tqdm)
    elapsed = time.perf_counter() - start
    num_in = sum(len(o.prompt_token_ids) for o in outputs)
    num_out = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    summary = {
        "elapsed_time": elapsed, "num_requests": len(outputs),
        "total_input_tokens": num_in, "total_output_tokens": num_out,
        "requests_per_second": len(outputs) / elapsed,
        "output_tokens_per_second": num_out / elapsed,
        "tokens_per_second": (num_in + num_out) / elapsed,
    }
    print(_table(" Offline Throughput Result ", [
        ("Requests", len(outputs)), ("Input / output tokens per request",
                                     f"{args.input_len} / {args.output_len}"),
        ("Elapsed time (s)", elapsed), ("Request throughput (req/s)", summary["requests_per_second"]),
        ("Output token throughput (tok/s)", summary["output_tokens_per_second"]),
        ("Total token throughput (tok/s)", summary["tokens_per_second"]),
    ]))
    return {**_header(args, "throughput"), "summary": summary}


def _one_batch(llm: Any, args: argparse.Namespace, batch: list[list[int]], tag: str) -> list[dict]:
    """Run one batch to completion; one record per engine step."""
    engine = llm.engine
    ids = [f"{tag}-{i}" for i in range(len(batch))]
    for rid, prompt in zip(ids, batch):
        engine.add_request(rid, prompt, _params(args, args.output_len))
    pending = set(ids)
    steps = []
    while pending:
        t0 = time.perf_counter()
        outputs = engine.step()
        wall = time.perf_counter() - t0
        s = engine.core.last_step
        steps.append({"wall": wall, "step": s.step_seconds, "forward": s.forward_seconds,
                      "sample": s.sample_seconds, "num_decodes": s.num_decodes,
                      "num_prefill_tokens": s.num_prefill_tokens})
        pending -= {o.request_id for o in outputs if o.finished}
        if not engine.has_unfinished_requests() and pending:
            raise RuntimeError("the engine has no work left but the batch did not finish")
    return steps


def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    """Time ``--num-iters`` batches step by step; prints and returns prefill/decode timings."""
    _positive(args, "input_len", "output_len", "batch_size", "num_iters")
    percentiles = [float(p) for p in str(args.percentiles).split(",") if p.strip()]
    llm = _make_llm(args)
    prompts = _Prompts(llm, args.seed)
    _warmup(llm, args, prompts, args.batch_size)
    iters = []
    for it in range(args.num_iters):
        start = time.perf_counter()
        steps = _one_batch(llm, args, prompts.batch(args.batch_size, args.input_len), f"lat{it}")
        e2e = time.perf_counter() - start
        last_prefill = max(i for i, s in enumerate(steps) if s["num_prefill_tokens"] > 0)
        iters.append({"e2e": e2e, "prefill": sum(s["wall"] for s in steps[: last_prefill + 1]),
                      "num_prefill_steps": last_prefill + 1, "steps": steps,
                      "decode": [s for s in steps[last_prefill + 1 :] if s["num_decodes"] > 0]})
    decode = [s for it in iters for s in it["decode"]]
    decode_time = sum(s["wall"] for s in decode)
    decode_tokens = sum(s["num_decodes"] for s in decode)
    step = distribution([s["wall"] for s in decode], percentiles)
    summary = {
        "mean_e2e_latency_s": float(np.mean([it["e2e"] for it in iters])),
        "mean_prefill_ms": float(np.mean([it["prefill"] for it in iters])) * 1000,
        "mean_prefill_steps": float(np.mean([it["num_prefill_steps"] for it in iters])),
        "num_decode_steps": len(decode),
        "mean_decode_step_ms": step.mean,
        "median_decode_step_ms": step.median,
        "std_decode_step_ms": step.std,
        **{f"p{p:g}_decode_step_ms": v for p, v in step.percentiles.items()},
        "mean_decode_forward_ms": float(np.mean([s["forward"] for s in decode] or [0.0])) * 1000,
        "mean_decode_core_step_ms": float(np.mean([s["step"] for s in decode] or [0.0])) * 1000,
        "decode_tokens_per_second": decode_tokens / decode_time if decode_time > 0 else 0.0,
    }
    rows: list[tuple[str, Any]] = [
        ("Batch size / input len / output len", f"{args.batch_size} / {args.input_len} / {args.output_len}"),
        ("Iterations", args.num_iters),
        ("Mean end-to-end latency (s)", summary["mean_e2e_latency_s"]),
        ("Mean prefill time (ms)", summary["mean_prefill_ms"]),
        ("Mean prefill steps", summary["mean_prefill_steps"]),
        ("Decode steps", len(decode)),
        ("Mean decode step (ms)", step.mean),
    ]
    rows += [(f"P{p:g} decode step (ms)", v) for p, v in step.percentiles.items()]
    rows += [("Mean decode forward (ms)", summary["mean_decode_forward_ms"]),
             ("Decode throughput (tok/s)", summary["decode_tokens_per_second"])]
    print(_table(" Offline Latency Result ", rows))
    return {**_header(args, "latency"), "summary": summary,
            "iterations": [{k: v for k, v in it.items() if k != "decode"} for it in iters]}
