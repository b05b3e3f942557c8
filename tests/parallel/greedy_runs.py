"""Shared by the tensor-parallel tests: the same greedy requests through ``LLM`` at a TP size,
with each token's logprob, and the workers closed afterwards."""

from __future__ import annotations

from typing import Any

from fd_core import LLM, SamplingParams

PROMPTS = ["hello world", "the quick brown fox jumps over", "a"]
PARAMS = SamplingParams(max_tokens=8, temperature=0, logprobs=1)


def greedy_run(model: Any, tp: int, **kwargs: Any) -> list[tuple[list[int], list[float]]]:
    """``(token ids, their logprobs)`` per prompt of ``PROMPTS`` at ``--tensor-parallel-size tp``."""
    llm = LLM(model=str(model), backend=kwargs.pop("backend", "cpu"), tensor_parallel_size=tp,
              max_model_len=256, **kwargs)
    try:
        outs = llm.generate(PROMPTS, PARAMS)
    finally:
        if tp > 1:
            llm.engine.core.runner.close()
    return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]
