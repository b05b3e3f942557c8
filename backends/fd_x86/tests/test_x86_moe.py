"""Quantized routed experts on the native kernels (fd_x86.moe): the hook's
routing, and a tiny MoE model end to end against the reference numerics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.moe  # noqa: E402

from fd_core.backends import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.quantization.config import parse_quantization  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    build.load_ops()


def test_unquantized_experts_are_left_to_the_reference() -> None:
    x = paddle.ones([2, 8])
    assert backend.fd_moe_experts(x, None, None, None, None, None) is None


@pytest.mark.parametrize("method", ["wint4", "w8a8"])
def test_tiny_moe_model_quantized_matches_the_reference_numerics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Greedy decoding of the tiny MoE model with ``method`` (wint4: experts
    wint4, the rest wint8, FastDeploy's rule): the x86 experts answer every
    MoE call, and tokens and logprobs follow the reference's numerics."""
    answered = []
    real = fd_x86.moe.moe_experts

    def counted(*args):  # type: ignore[no-untyped-def]
        out = real(*args)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(fd_x86.moe, "moe_experts", counted)
    model = generate_checkpoint(tmp_path / "moe", "tiny-moe", naming="paddle", seed=7, dtype="float32")
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (4, 21)]

    def run(name: str) -> tuple[list[list[int]], list[list[float]]]:
        quantization = parse_quantization(method, "Ernie4_5_MoeForCausalLM")
        runner = ModelRunner(model, get_backend(name), num_blocks=24, block_size=16, quantization=quantization)
        return greedy_generate(runner, prompts, 8, chunk_size=8)

    want_tokens, want_logprobs = run("cpu")
    got_tokens, got_logprobs = run("x86")
    assert answered and all(answered)
    assert got_tokens == want_tokens
    worst = max(abs(g - w) for gs, ws in zip(got_logprobs, want_logprobs) for g, w in zip(gs, ws))
    assert worst < 1e-3, worst
