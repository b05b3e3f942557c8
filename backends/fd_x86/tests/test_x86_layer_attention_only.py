"""The fused decoder layers (``fd_x86_decoder_layers``) on runs that end with
an attention-only layer (a MoE layer's attention half): against the x86 ops
composed and the CPU reference, alone and after a dense layer; the switch
that declines them; the run cache telling a layer from its attention half;
and the ERNIE MoE model, whose MoE layers run their attention half through
it, giving the same tokens and logprobs as with the switch off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.layer as fused  # noqa: E402
from fd_x86.linear import _use_packed  # noqa: E402
from test_x86_layer import (  # noqa: E402
    METHODS,
    _assert_same,
    _layer,
    _reference_tol,
    _run_composed,
    _run_fused,
    _step,
)

from fd_core.ops.decoder import DecoderLayerWeights, compose_decoder_layers  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    if not _use_packed("auto"):
        pytest.skip("no packed kernels here (AVX-512 VNNI, FD_X86_REPACK): the fused layer always declines")
    build.load_ops()


pytestmark = pytest.mark.usefixtures("fused_switches_unset")


@pytest.fixture(scope="module")
def ref_ops() -> Any:
    from fd_core.backends import get_backend

    return get_backend("cpu").ops


def _half(layer: DecoderLayerWeights) -> DecoderLayerWeights:
    return replace(layer, up_gate=None, down=None)


CASES = [pytest.param(method, group, batch, res, id=f"{method}-g{group}-b{batch}-{'res' if res else 'nores'}")
         for method, group in METHODS for batch in (1, 5, 16) for res in (False, True)]


@pytest.mark.parametrize("method,group,batch,with_residual", CASES)
def test_an_attention_only_layer_matches_the_x86_ops_and_the_reference(
    x86_ops: Any, ref_ops: Any, method: str, group: int, batch: int, with_residual: bool
) -> None:
    layer = _half(_layer(method, group))
    step = _step(batch, with_residual, seed=batch * 10 + with_residual + 3)
    got = _run_fused(layer, step)
    _assert_same(got, _run_composed(x86_ops, layer, step), rtol=1e-5, atol=1e-5)
    _assert_same(got, _run_composed(ref_ops, layer, step), **_reference_tol(method))


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_a_dense_layer_then_an_attention_only_one_in_one_call(x86_ops: Any, method: str) -> None:
    first, second = _layer(method), _half(_layer(method, heads=4, kv_heads=2, head_dim=64, interleaved=True))
    second = replace(second, input_norm=second.post_norm, post_norm=second.input_norm)  # not the first's weights
    step = _step(3, True, seed=41)
    caches = [step.caches() for _ in range(2)]
    hidden, residual = step.inputs()
    meta = step.meta()
    got = fused.decoder_layers([first, second], hidden, residual, step.cos_sin, meta,
                               [caches[0][0], caches[1][0]], [caches[0][1], caches[1][1]])
    assert got is not None
    mine = [step.caches() for _ in range(2)]
    want = compose_decoder_layers(x86_ops, [first, second], hidden, residual, step.cos_sin, step.meta(),
                                  [mine[0][0], mine[1][0]], [mine[0][1], mine[1][1]])
    for a, b in zip((*got, *caches[0], *caches[1]), (*want, *mine[0], *mine[1]), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_the_run_cache_tells_a_layer_from_its_attention_half(x86_ops: Any) -> None:
    layer = _layer("wint8")
    step = _step(2, True, seed=43)
    whole = _run_fused(layer, step)
    half = _run_fused(_half(layer), step)
    _assert_same(half, _run_composed(x86_ops, _half(layer), step), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(half[0][1].numpy(), whole[0][1].numpy())  # the same residual stream
    assert not np.allclose(half[0][0].numpy(), whole[0][0].numpy())  # the MLP's input, not its output
    _assert_same(_run_fused(layer, step), whole, rtol=0, atol=0)


def test_declines_when_its_switch_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    step = _step(1, True, seed=45)
    hidden, residual = step.inputs()
    k, v = step.caches()
    monkeypatch.setenv("FD_X86_FUSED_MOE_ATTENTION", "0")
    fused._attention_only_enabled.cache_clear()
    layer = _layer("wint8")
    assert fused.decoder_layers([_half(layer)], hidden, residual, step.cos_sin, step.meta(), [k], [v]) is None
    # dense runs are not affected
    assert fused.decoder_layers([layer], hidden, residual, step.cos_sin, step.meta(), [k], [v]) is not None


def test_an_attention_only_layer_inside_a_run_is_declined() -> None:
    step = _step(1, True, seed=47)
    hidden, residual = step.inputs()
    caches = [step.caches() for _ in range(2)]
    layers = [_half(_layer("wint8")), _layer("wint8")]
    assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), [c[0] for c in caches],
                                [c[1] for c in caches]) is None


@pytest.mark.parametrize("quantization", ["wint8", "wint4"])
def test_the_moe_model_fuses_each_moe_layers_attention_half(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, quantization: str
) -> None:
    """A quantized tiny MoE model on x86 with its MoE blocks kept out of the
    run (``FD_X86_FUSED_MOE_RUN=0``): every decode-only step hands each
    MoE layer's attention half (after the dense layer before it, if any) to
    the fused op, which answers it, and the
    greedy tokens and logprobs equal those with the attention half op by op
    (``FD_X86_FUSED_MOE_ATTENTION=0``): the same kernels."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.quantization.config import parse_quantization
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    monkeypatch.setenv("FD_X86_FUSED_MOE_RUN", "0")  # the split run (the MoE blocks in the run: test_x86_layer_moe_run)
    model = generate_checkpoint(tmp_path / "tiny-moe", "tiny-moe", naming="paddle", seed=6, dtype="float32")
    prompts = [[int(t) for t in np.random.default_rng(8).integers(100, 1000, n)] for n in (3, 11, 25)]
    answered: list[list[bool]] = []
    real = fused.decoder_layers

    def spy(layers: Any, *args: Any) -> Any:
        out = real(layers, *args)
        if out is not None:
            answered.append([layer.attention_only for layer in layers])
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)

    def run() -> tuple[list[list[int]], list[list[float]]]:
        runner = ModelRunner(model, get_backend("x86"), num_blocks=24, block_size=16,
                             quantization=parse_quantization(quantization, "Ernie4_5_MoeForCausalLM"))
        return greedy_generate(runner, prompts, 6)

    tokens, logprobs = run()
    # tiny-moe's layers: dense, MoE, MoE: runs [dense, attention half] and [attention half]
    assert len(answered) >= 10 and answered == [[False, True], [True]] * (len(answered) // 2)
    monkeypatch.setenv("FD_X86_FUSED_MOE_ATTENTION", "0")
    fused._attention_only_enabled.cache_clear()
    answered.clear()
    want_tokens, want_logprobs = run()
    assert [True] not in answered
    assert tokens == want_tokens
    np.testing.assert_array_equal(np.asarray(logprobs), np.asarray(want_logprobs))
