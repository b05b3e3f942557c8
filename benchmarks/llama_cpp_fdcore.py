"""fd-core's side of ``benchmarks/llama_cpp.py``: the same measurements through the engine.

Decode steps are timed as ``benchmarks/quant_decode.py`` times them (its
``start`` / ``timed_steps`` / ``finish``: B requests of ``prompt_len``
random token ids are prefilled, one warm-up decode step, then ``steps``
timed ``engine.step()`` calls: scheduler, forward and greedy sampler, what a
user gets); a round's tok/s is the tokens those steps made (B x steps, or up
to ``--num-scheduler-steps`` times that with multi-step decoding) over
their total time, as llama-batched-bench counts (a median step would hide the slow steps a busy
machine gives and llama.cpp's mean does not). Prefill is the wall
time of the steps that take one fresh ``prefill_len``-token prompt to its
first token (prefix caching off, so every round really prefills). A row's
``env`` (e.g. ``FD_X86_PREFILL_INT8_ACT=1``, an fd_x86 switch read on every
call) is set around each of its measurements only, so rows with and without
it share the process.

A row's engine may be loaded afresh for each round (``reload``): an engine's
B=1 step moves by up to ~30% with where its weights land in memory (the
same script in fresh loads: 0.61 to 0.94 ms a mid-size MoE step), while
llama.cpp reads the page cache's pages of its file, the same memory every
round; with a fresh load per round the median covers several placements.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from quant_decode import Config, finish, start, timed_steps

__all__ = ["FdRow", "environ", "greedy_tokens", "load", "measure_decode", "measure_prefill", "reload"]


@dataclass
class FdRow:
    """One fd-core configuration, loaded once and measured every round."""

    label: str  # "fd-core x86 wint8"
    config: Config  # quant_decode's engine holder: its step helpers take it
    decode: dict[int, list[float]] = field(default_factory=dict)  # batch -> tok/s per round
    prefill: list[float] = field(default_factory=list)  # tok/s per round
    env: dict[str, str] = field(default_factory=dict)  # set around this row's measurements
    source: tuple[Any, ...] = ()  # load()'s arguments after the label, for reload()


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` in ``os.environ`` inside the block, the previous values after."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update(env)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load(label: str, checkpoint: Path, backend: str, engine_kwargs: dict[str, Any], max_batch: int,
         max_len: int, env: dict[str, str] | None = None) -> FdRow:
    """An in-process engine for ``checkpoint`` on ``backend`` with ``engine_kwargs`` (quantization, dtype);
    ``env`` set around its measurements."""
    row = FdRow(label, _engine(checkpoint, backend, engine_kwargs, max_batch, max_len), env=dict(env or {}),
                source=(checkpoint, backend, engine_kwargs, max_batch, max_len))
    _warm_up(row)
    return row


def reload(row: FdRow) -> None:
    """``row``'s engine freed and loaded again as ``load`` made it (its measurements kept)."""
    import gc

    del row.config.llm
    gc.collect()
    row.config = _engine(*row.source)
    _warm_up(row)


def _engine(checkpoint: Path, backend: str, engine_kwargs: dict[str, Any], max_batch: int, max_len: int) -> Config:
    from fd_core import LLM

    blocks_per_seq = -(-(max_len + 16) // 64) + 1  # block_size 64 (the default)
    llm = LLM(str(checkpoint), backend=backend, max_model_len=max_len, max_num_seqs=max_batch,
              max_num_batched_tokens=max(2048, max_len), num_gpu_blocks_override=max_batch * blocks_per_seq + 16,
              enable_prefix_caching=False, **engine_kwargs)
    return Config(backend, str(engine_kwargs.get("quantization")), llm)


def _warm_up(row: FdRow) -> None:
    with environ(row.env):
        start(row.config, 2, 16, 4)  # first-use costs: allocator, op builds, weight repacks
        finish(row.config)


def measure_decode(row: FdRow, batches: Sequence[int], prompt_len: int, steps: int) -> None:
    """One round: decode tok/s at each batch size, appended to ``row.decode``."""
    with environ(row.env):
        _measure_decode(row, batches, prompt_len, steps)


def _measure_decode(row: FdRow, batches: Sequence[int], prompt_len: int, steps: int) -> None:
    engine = row.config.llm.engine
    per_step = engine.core.scheduler_config.num_scheduler_steps  # tokens a request gets from one engine step
    for batch in batches:
        start(row.config, batch, prompt_len, (steps + 2) * per_step + 4)
        running = list(engine.core.scheduler.running)
        before = sum(r.num_output_tokens for r in running)
        timed_steps(row.config, batch, steps)
        made = sum(r.num_output_tokens for r in running) - before  # none finishes within the timed steps
        finish(row.config)
        times = row.config.steps[batch][-steps:]
        row.decode.setdefault(batch, []).append(made / sum(times))


def measure_prefill(row: FdRow, prefill_len: int, seed: int) -> None:
    """One round: tok/s of prefilling one fresh ``prefill_len``-token prompt, appended to ``row.prefill``."""
    from fd_core import SamplingParams

    engine = row.config.llm.engine
    prompt = [int(t) for t in np.random.default_rng(1000 + seed).integers(100, 2000, prefill_len)]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    with environ(row.env):
        begin = time.perf_counter()
        engine.add_request(f"prefill-{seed}-{time.monotonic_ns()}", {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            engine.step()
        row.prefill.append(prefill_len / (time.perf_counter() - begin))


def greedy_tokens(row: FdRow, prompts: Sequence[Sequence[int]], tokens: int) -> list[list[int]]:
    """``tokens`` greedy token ids after each token-id prompt."""
    from fd_core import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    with environ(row.env):
        outs = row.config.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
