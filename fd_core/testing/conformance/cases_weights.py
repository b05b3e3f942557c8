"""16-bit weights (``--dtype bfloat16|float16``) end to end on the backend and on the reference.

A backend may compute in bf16/fp16 natively (``Capabilities.bf16``) or answer
None for 16-bit weights and let the reference run those ops (it upcasts each
weight to fp32 where used); either way a checkpoint stored in 16 bits must
load and decode as the reference does. The tiny dense and MoE checkpoints are
generated in the dtype itself and loaded with ``dtype=`` that dtype; greedy
tokens must equal the reference's, logprobs within fp32's tolerance, or the
16-bit tolerance where the backend declares native 16-bit compute.
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
NEW_TOKENS = 10
WEIGHT_DTYPES = ("bfloat16", "float16")
ATOL_FP32_COMPUTE = 2e-3  # the reference's numerics: fp32 math on the 16-bit weights
ATOL_NATIVE_16BIT = 1e-1  # a backend that computes in bf16/fp16 (Capabilities.bf16)


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(23)
    return [[int(t) for t in rng.integers(100, vocab, n)] for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def checkpoints_16bit(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("conformance-16bit")
    return {(shape, dtype): generate_checkpoint(root / f"{shape}-{dtype}", shape, naming="paddle", seed=4,
                                                dtype=dtype)
            for shape in ("tiny-dense", "tiny-moe") for dtype in WEIGHT_DTYPES}


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("dtype", WEIGHT_DTYPES)
def test_16_bit_weights_greedy_tokens_and_logprobs(
    conformance: Harness, checkpoints_16bit: dict[tuple[str, str], Path], shape: str, dtype: str
) -> None:
    model_dir = checkpoints_16bit[shape, dtype]
    with conformance.on_host():
        reference = ModelRunner(model_dir, conformance.reference, num_blocks=32, block_size=16, dtype=dtype)
        prompts = _prompts(reference.config.vocab_size)
        want_tokens, want_logprobs = greedy_generate(reference, prompts, NEW_TOKENS, chunk_size=8)
    runner = ModelRunner(model_dir, conformance.backend, num_blocks=32, block_size=16, dtype=dtype)
    assert runner.dtype == dtype, f"--dtype {dtype} loaded the weights as {runner.dtype}"
    got_tokens, got_logprobs = greedy_generate(runner, prompts, NEW_TOKENS, chunk_size=8)
    for i, prompt in enumerate(prompts):
        assert got_tokens[i] == want_tokens[i], (
            f"model {shape}, {dtype} weights: greedy tokens of the {len(prompt)}-token prompt diverge from "
            f"the reference (backend {conformance.backend.name!r}): got {got_tokens[i]}, want {want_tokens[i]}"
        )
    atol = ATOL_NATIVE_16BIT if conformance.backend.capabilities().bf16 else ATOL_FP32_COMPUTE
    if conformance.override is not None:
        atol = max(atol, conformance.override.atol)
    worst = float(np.abs(np.concatenate(got_logprobs) - np.concatenate(want_logprobs)).max())
    assert worst <= atol, f"model {shape}, {dtype} weights: logprobs differ by up to {worst:.2e} (tolerance {atol:.0e})"
