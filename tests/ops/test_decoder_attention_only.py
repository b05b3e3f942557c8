"""Attention-only decoder layers (a MoE layer's attention half): the
reference composition stops after the post-attention norm, a run may end
with one, misuse is refused by name, and the ERNIE MoE model's MoE layers
run as ``decoder_layers([attention only])`` then their MoE op with the
same logits as the unfused blocks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest

from fd_core.backends import cpu
from fd_core.backends.base import Ops
from fd_core.ops.attention import AttentionMetadata
from fd_core.ops.decoder import (
    DecoderLayerWeights,
    apply_linear,
    compose_decoder_layer,
    self_attention,
)
from fd_core.ops.rope import rope_cos_sin
from fd_core.plugins.manager import make_plugin_manager

D, INTER, H, HKV, DH = 32, 48, 4, 2, 8


def _dense(rng: np.random.Generator) -> DecoderLayerWeights:
    def t(*shape: int) -> paddle.Tensor:
        return paddle.to_tensor(rng.normal(0, shape[0] ** -0.5, shape).astype(np.float32))

    def norm() -> paddle.Tensor:
        return paddle.to_tensor(rng.uniform(0.5, 1.5, D).astype(np.float32))

    return DecoderLayerWeights(
        norm(), norm(), 1e-6, t(D, (H + 2 * HKV) * DH), t(H * DH, D), t(D, 2 * INTER), t(INTER, D), H, HKV, DH,
        DH**-0.5,
    )


def _attention_only(layer: DecoderLayerWeights) -> DecoderLayerWeights:
    return replace(layer, up_gate=None, down=None)


def _step(rng: np.random.Generator) -> tuple:
    meta = AttentionMetadata.build([1, 1], [3, 5], [[0], [1]], 16, 2)
    hidden = paddle.to_tensor(rng.normal(0, 1, (2, D)).astype(np.float32))
    residual = paddle.to_tensor(rng.normal(0, 1, (2, D)).astype(np.float32))
    return hidden, residual, rope_cos_sin(DH, 64, 10000.0), meta


def _caches(n: int) -> list[Any]:
    return [paddle.zeros([32, HKV, DH]) for _ in range(n)]


def _equal(got: tuple, want: tuple) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


@pytest.fixture(scope="module")
def ops() -> Ops:
    return Ops(make_plugin_manager(cpu), "cpu")


@pytest.mark.parametrize("with_residual", [False, True], ids=["first-layer", "residual"])
def test_an_attention_only_layer_returns_the_mlp_input_and_the_stream(ops: Ops, with_residual: bool) -> None:
    rng = np.random.default_rng(0)
    layer = _dense(rng)
    hidden, residual, cos_sin, meta = _step(rng)
    residual = residual if with_residual else None
    k, v = _caches(2)
    x, stream = ops.decoder_layers([_attention_only(layer)], hidden, residual, cos_sin, meta, [k], [v])
    # by hand: norm, attention block, post-attention norm with the residual add
    k2, v2 = _caches(2)
    if residual is None:
        normed, res = ops.rms_norm(hidden, layer.input_norm, layer.eps), hidden
    else:
        normed, res = ops.rms_norm(hidden, layer.input_norm, layer.eps, residual)
    h = self_attention(ops, normed, layer.qkv, layer.o, cos_sin, meta, k2, v2, H, HKV, layer.scale)
    want = ops.rms_norm(h, layer.post_norm, layer.eps, res)
    _equal((x, stream), want)
    _equal((k, v), (k2, v2))  # the new tokens were stored
    # the dense layer is that, then its MLP over x
    k3, v3 = _caches(2)
    dense_h, dense_r = compose_decoder_layer(ops, layer, hidden, residual, cos_sin, meta, k3, v3)
    mlp = apply_linear(ops, ops.silu_and_mul(apply_linear(ops, x, layer.up_gate)), layer.down)
    _equal((dense_h, dense_r), (mlp, stream))


def test_a_run_may_end_with_an_attention_only_layer(ops: Ops) -> None:
    rng = np.random.default_rng(1)
    first, second = _dense(rng), _attention_only(_dense(rng))
    hidden, _, cos_sin, meta = _step(rng)
    caches = _caches(4)
    got = ops.decoder_layers([first, second], hidden, None, cos_sin, meta, caches[0:2], caches[2:4])
    mine = _caches(4)
    h, r = compose_decoder_layer(ops, first, hidden, None, cos_sin, meta, mine[0], mine[2])
    want = compose_decoder_layer(ops, second, h, r, cos_sin, meta, mine[1], mine[3])
    _equal(got, want)
    _equal(tuple(caches), tuple(mine))


def test_an_attention_only_layer_inside_a_run_is_refused(ops: Ops) -> None:
    rng = np.random.default_rng(2)
    layers = [_attention_only(_dense(rng)), _dense(rng)]
    hidden, _, cos_sin, meta = _step(rng)
    caches = _caches(4)
    with pytest.raises(ValueError, match="layer 0 of a run of 2 is attention only"):
        ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:2], caches[2:4])


def test_half_an_mlp_is_refused() -> None:
    layer = replace(_dense(np.random.default_rng(3)), down=None)
    with pytest.raises(ValueError, match="up_gate set, down None"):
        _ = layer.attention_only
    assert not _dense(np.random.default_rng(3)).attention_only


def test_the_content_key_tells_an_attention_only_layer_from_its_dense_one() -> None:
    layer = _dense(np.random.default_rng(4))
    half = _attention_only(layer)
    assert half.key() != layer.key() and half.key() == _attention_only(layer).key()


def _moe_checkpoint(tmp_path: Path) -> Path:
    from fd_core.testing.checkpoints import generate_checkpoint

    return generate_checkpoint(tmp_path / "tiny-moe", "tiny-moe", naming="paddle", seed=5, dtype="float32")


def test_the_moe_model_runs_each_moe_layer_as_attention_then_its_moe_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no plugin that takes MoE runs (the reference alone), every MoE
    layer hands its attention half to ``Ops.decoder_layers``, after the dense
    layers before it in the same call (tiny-moe's layers: dense, MoE, MoE:
    runs ``[dense, attention]`` and ``[attention]``); the greedy tokens and
    logprobs equal those of the unfused blocks (what tensor parallelism
    runs) bit for bit."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.greedy import greedy_generate

    model = _moe_checkpoint(tmp_path)
    prompts = [[int(t) for t in np.random.default_rng(8).integers(100, 1000, n)] for n in (3, 11, 25)]
    runs: list[list[bool]] = []
    real = Ops.decoder_layers

    def spy(self: Ops, layers: list[DecoderLayerWeights], *args: Any) -> Any:
        runs.append([layer.attention_only for layer in layers])
        return real(self, layers, *args)

    monkeypatch.setattr(Ops, "decoder_layers", spy)

    def run(fuse: bool) -> tuple[list[list[int]], list[list[float]]]:
        runner = ModelRunner(model, get_backend("cpu"), num_blocks=24, block_size=16)
        if not fuse:
            runner.model.unfuse_layers()
        return greedy_generate(runner, prompts, 6)

    tokens, logprobs = run(fuse=True)
    layers = ModelRunner(model, get_backend("cpu"), num_blocks=4, block_size=16).model.layers
    assert [layer.is_dense for layer in layers] == [True, False, False]
    assert runs and runs == [[False, True], [True]] * (len(runs) // 2)
    runs.clear()
    want_tokens, want_logprobs = run(fuse=False)
    assert not runs
    assert tokens == want_tokens
    np.testing.assert_array_equal(np.asarray(logprobs), np.asarray(want_logprobs))


def test_the_runs_follow_the_layers_fused_flags(ops: Ops) -> None:
    from fd_core.models.config import config_from_dict
    from fd_core.models.ernie4_5 import Ernie4_5ForCausalLM
    from fd_core.testing.checkpoints import SHAPES

    raw = {**SHAPES["tiny-moe"], "architectures": ["Ernie4_5_MoeForCausalLM"], "num_hidden_layers": 6,
           "moe_layer_start_index": 2, "moe_layer_end_index": 3, "moe_capacity": [8, 8, 8]}
    model = Ernie4_5ForCausalLM(config_from_dict(raw), ops, 64)
    assert [layer.is_dense for layer in model.layers] == [True, True, False, False, True, True]
    assert model._runs == [(0, 3), (3, 4), (4, 6)]
    for layer in model.layers[2:4]:  # the MoE layers block by block: the dense runs stay whole
        layer.fused = False
    assert model._plan_runs() == [(0, 2), (2, 3), (3, 4), (4, 6)]
    model.unfuse_layers()
    assert model._runs == [(i, i + 1) for i in range(6)]
