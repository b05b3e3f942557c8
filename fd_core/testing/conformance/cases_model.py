"""A tiny model end to end on the backend and on the reference: greedy
tokens equal, logprobs close.

Generated tiny ERNIE 4.5 checkpoints (dense, and MoE with a shared expert and
a selection-only correction bias) run through the paged model runner on the
backend under test and on the CPU reference: a batch of prompts of different
lengths, prefill in chunks mixed with decodes, greedy continuations compared
token for token and their logprobs within the tolerance of the compute dtype
(looser than per-op tolerances: errors compound over layers and steps).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fd_core.engine.model_runner import ModelRunner
from fd_core.testing.checkpoints import generate_checkpoint
from fd_core.testing.conformance.harness import Harness
from fd_core.testing.greedy import greedy_generate

PROMPT_LENS = (1, 7, 19, 40)
NEW_TOKENS = 12
LOGPROB_ATOL = {"float32": 2e-3, "float16": 5e-2, "bfloat16": 1e-1}


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(17)
    return [[int(t) for t in rng.integers(100, vocab, n)] for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("conformance-models")
    return {shape: generate_checkpoint(root / shape, shape, naming="paddle", seed=3, dtype="float32")
            for shape in ("tiny-dense", "tiny-moe")}


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("chunk", [None, 8])
def test_tiny_model_greedy_tokens_and_logprobs(
    conformance: Harness, checkpoints: dict[str, Path], shape: str, chunk: int | None
) -> None:
    model_dir = checkpoints[shape]
    with conformance.on_host():
        reference = ModelRunner(model_dir, conformance.reference, num_blocks=32, block_size=16)
        prompts = _prompts(reference.config.vocab_size)
        want_tokens, want_logprobs = greedy_generate(reference, prompts, NEW_TOKENS, chunk_size=chunk)
    runner = ModelRunner(model_dir, conformance.backend, num_blocks=32, block_size=16)
    got_tokens, got_logprobs = greedy_generate(runner, prompts, NEW_TOKENS, chunk_size=chunk)
    for i, prompt in enumerate(prompts):
        assert got_tokens[i] == want_tokens[i], (
            f"model {shape}: greedy tokens of the {len(prompt)}-token prompt diverge from the "
            f"reference (backend {conformance.backend.name!r}): got {got_tokens[i]}, want {want_tokens[i]}"
        )
    atol = LOGPROB_ATOL.get(conformance.dtype, 1e-1)
    if conformance.override is not None:
        atol = max(atol, conformance.override.atol)
    got, want = np.concatenate(got_logprobs), np.concatenate(want_logprobs)
    worst = float(np.abs(got - want).max())
    assert worst <= atol, f"model {shape}: logprobs differ by up to {worst:.2e} (tolerance {atol:.0e})"
