"""fd_x86 with 16-bit weights (``--dtype bfloat16|float16``).

The native kernels are fp32 / int8: unquantized 16-bit linears, norms and
experts fall back op by op to fd-core's reference (which upcasts each weight
where it is used); the fused decoder layers keep running for quantized
linears, their 16-bit norm weights upcast once into the run's cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fd_x86 import backend

pytest.importorskip("paddle")

import fd_x86.layer as fused  # noqa: E402
from fd_x86.linear import _use_packed  # noqa: E402

from fd_core.backends import get_backend  # noqa: E402
from fd_core.engine.model_runner import ModelRunner  # noqa: E402
from fd_core.quantization import parse_quantization  # noqa: E402
from fd_core.testing.checkpoints import generate_checkpoint  # noqa: E402
from fd_core.testing.greedy import greedy_generate  # noqa: E402

PROMPTS = [[int(t) for t in np.random.default_rng(3).integers(100, 1000, n)] for n in (2, 13)]


@pytest.fixture(scope="module", autouse=True)
def _usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("quantization", [None, "wint8"])
def test_16_bit_weights_decode_as_with_fp32_storage(tmp_path, monkeypatch, dtype, quantization):
    # a checkpoint stored in the dtype: fp32 storage holds the very same values
    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=2, dtype=dtype)
    answered: list[int] = []
    real = fused.decoder_layers

    def spy(layers: Any, *args: Any) -> Any:
        out = real(layers, *args)
        if out is not None:
            answered.append(len(layers))
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)
    outs = {}
    for stored in ("float32", dtype):
        answered.clear()
        quant = parse_quantization(quantization) if quantization else None
        runner = ModelRunner(model, get_backend("x86"), num_blocks=16, block_size=16, quantization=quant,
                             dtype=stored)
        assert runner.dtype == stored
        outs[stored] = greedy_generate(runner, PROMPTS, 6)
        if quantization and _use_packed("auto"):
            assert answered, f"the fused layers declined {stored} weights"
    assert outs[dtype][0] == outs["float32"][0]
    np.testing.assert_allclose(np.concatenate(outs[dtype][1]), np.concatenate(outs["float32"][1]), atol=1e-5)


def test_auto_keeps_fp32_on_x86(tmp_path):
    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=2)  # bf16 on disk
    runner = ModelRunner(model, get_backend("x86"), num_blocks=8, block_size=16)
    assert runner.dtype == "float32"  # x86 declares no native bf16 compute yet (Capabilities.bf16)
