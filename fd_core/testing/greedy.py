"""A minimal greedy driver for the model runner, for tests and the demo.

It is not the engine: blocks are handed out up front and every request runs
in every step. It exists to check the runner (batched vs alone, chunked vs
whole prefill) against the HF oracle before the scheduler drives it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["greedy_generate"]


def greedy_generate(
    runner: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    chunk_size: int | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy-decode every prompt together; returns (tokens, their logprobs).

    ``chunk_size`` cuts each prefill into chunks of at most that many tokens,
    one chunk per step, mixed with other requests' decodes.
    """
    bs = runner.block_size
    tables, next_block = [], 0
    for prompt in prompts:
        need = -(-(len(prompt) + max_new_tokens) // bs)
        tables.append(list(range(next_block, next_block + need)))
        next_block += need
    if next_block > runner.num_blocks:
        raise ValueError(f"need {next_block} KV blocks, runner has {runner.num_blocks}")
    done_prefill = [0] * len(prompts)  # prompt tokens already in the cache
    outputs: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    while any(len(o) < max_new_tokens for o in outputs):
        decodes = [i for i, p in enumerate(prompts)
                   if done_prefill[i] == len(p) and len(outputs[i]) < max_new_tokens]
        prefills = [i for i, p in enumerate(prompts) if done_prefill[i] < len(p)]
        order, token_ids, seq_lens, needs = [], [], [], []
        for i in decodes:
            order.append(i)
            token_ids.append([outputs[i][-1]])
            seq_lens.append(len(prompts[i]) + len(outputs[i]))
            needs.append(True)
        for i in prefills:
            start = done_prefill[i]
            end = len(prompts[i]) if chunk_size is None else min(len(prompts[i]), start + chunk_size)
            order.append(i)
            token_ids.append(prompts[i][start:end])
            seq_lens.append(end)
            needs.append(end == len(prompts[i]))
            done_prefill[i] = end
        from fd_core.engine.model_runner import StepInput

        step = StepInput(token_ids, seq_lens, [tables[i] for i in order], len(decodes), needs)
        logits = runner.execute(step)
        if logits is None:
            continue
        logits = logits.numpy().astype(np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        row = 0
        for i, need in zip(order, needs):
            if need:
                token = int(np.argmax(logits[row]))
                outputs[i].append(token)
                logprobs[i].append(float(logp[row, token]))
                row += 1
    return outputs, logprobs
