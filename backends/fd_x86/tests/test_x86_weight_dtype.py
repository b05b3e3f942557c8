"""fd_x86 with 16-bit weights (``--dtype bfloat16|float16``).

Unquantized 16-bit linears run fd_x86.dense16 (weights widened in registers:
the reference's products exactly; bf16 from GEMM_MIN_ROWS rows: a vdpbf16ps
GEMM on x rounded to bf16); norms and unquantized experts fall back op by op
to fd-core's reference (which upcasts each weight where it is used); the
fused decoder layers keep running for quantized linears, their 16-bit norm
weights upcast once into the run's cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fd_x86 import backend

pytest.importorskip("paddle")

import fd_x86.dense16 as dense16  # noqa: E402
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


def _spy_dense16(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of every x dense16 answered (the backend imports it per call)."""
    rows: list[int] = []
    real = dense16.dense16_linear

    def spy(x: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(x, *args, **kwargs)
        if out is not None:
            rows.append(int(np.prod(x.shape[:-1])))
        return out

    monkeypatch.setattr(dense16, "dense16_linear", spy)
    return rows


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("quantization", [None, "wint8"])
def test_16_bit_weights_decode_as_with_fp32_storage(tmp_path, monkeypatch, dtype, quantization):
    # a checkpoint stored in the dtype: fp32 storage holds the very same values.
    # dense16's stream kernel at every M (the GEMM rounds x: see the next test)
    # computes the reference's products exactly, so only fp32 summation differs
    monkeypatch.setattr(dense16, "GEMM_MIN_ROWS", 1 << 30)
    # wint8 in a bf16 model rounds its activations to bf16 (FD_X86_INT8_BF16: the reference's
    # numerics, not fp32 storage's); off here, so both storages take the same kernels
    monkeypatch.setenv("FD_X86_INT8_BF16", "0")
    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=2, dtype=dtype)
    answered: list[int] = []
    real = fused.decoder_layers

    def spy(layers: Any, *args: Any) -> Any:
        out = real(layers, *args)
        if out is not None:
            answered.append(len(layers))
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)
    rows = _spy_dense16(monkeypatch)
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
    if quantization is None and dense16.dense16_enabled():
        assert rows, f"fd_x86.dense16 declined the {dtype} linears"
    assert outs[dtype][0] == outs["float32"][0]
    np.testing.assert_allclose(np.concatenate(outs[dtype][1]), np.concatenate(outs["float32"][1]), atol=1e-5)


def test_bf16_greedy_matches_the_cpu_reference(tmp_path, monkeypatch):
    if not dense16.dense16_enabled():
        pytest.skip("fd_x86.dense16 needs AVX-512 F/BW/VL/DQ")
    monkeypatch.setattr(dense16, "GEMM_MIN_ROWS", 4)  # the prefills (15 rows) run the GEMM, the decodes not
    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=2, dtype="bfloat16")
    rows = _spy_dense16(monkeypatch)
    outs = {}
    for name in ("cpu", "x86"):
        runner = ModelRunner(model, get_backend(name), num_blocks=16, block_size=16, dtype="bfloat16")
        outs[name] = greedy_generate(runner, PROMPTS, 6)
    assert rows and min(rows) < dense16.GEMM_MIN_ROWS <= max(rows), "dense16 ran neither decode nor prefill"
    assert outs["x86"][0] == outs["cpu"][0]
    # the prefill's GEMM rounds activations to bf16 (2^-9 relative per product):
    # logprobs move by ~1e-3 (5e-3 measured), not by a token
    np.testing.assert_allclose(np.concatenate(outs["x86"][1]), np.concatenate(outs["cpu"][1]), atol=2e-2)


def test_auto_keeps_the_checkpoint_dtype_where_dense16_runs(tmp_path):
    from fd_x86.dense16 import dense16_enabled

    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=2)  # bf16 on disk
    runner = ModelRunner(model, get_backend("x86"), num_blocks=8, block_size=16)
    # x86 declares native 16-bit compute (Capabilities.bf16) where its dense16 kernels run
    assert get_backend("x86").capabilities().bf16 == dense16_enabled()
    assert runner.dtype == ("bfloat16" if dense16_enabled() else "float32")
