"""Ops.decoder_layer: a backend's fused answer, else the unfused hooks; the
layer description backends cache on; the model's dense layers route through it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import paddle

from fd_core.backends import cpu
from fd_core.backends.base import Ops
from fd_core.ops.attention import AttentionMetadata
from fd_core.ops.decoder import DecoderLayerWeights, compose_decoder_layer
from fd_core.ops.rope import rope_cos_sin
from fd_core.plugins import hookimpl
from fd_core.plugins.manager import make_plugin_manager

D, INTER, H, HKV, DH = 32, 48, 4, 2, 8


def _layer(rng: np.random.Generator) -> DecoderLayerWeights:
    def t(*shape: int) -> paddle.Tensor:
        return paddle.to_tensor(rng.normal(0, shape[0] ** -0.5, shape).astype(np.float32))

    return DecoderLayerWeights(
        paddle.ones([D]), paddle.ones([D]), 1e-6, t(D, (H + 2 * HKV) * DH), t(H * DH, D), t(D, 2 * INTER), t(INTER, D),
        H, HKV, DH, DH**-0.5,
    )


def _step(rng: np.random.Generator) -> tuple:
    meta = AttentionMetadata.build([1, 1], [3, 5], [[0], [1]], 16, 2)
    k = paddle.zeros([32, HKV, DH])
    v = paddle.zeros([32, HKV, DH])
    hidden = paddle.to_tensor(rng.normal(0, 1, (2, D)).astype(np.float32))
    return hidden, rope_cos_sin(DH, 64, 10000.0), meta, k, v


class _Fused:
    """A backend whose fused layer answers when ``answer`` is set."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.calls = 0

    @hookimpl
    def fd_decoder_layer(self, layer, hidden, residual, cos_sin, metadata, k_cache, v_cache):  # noqa: ANN001, ANN201
        self.calls += 1
        return self.answer


def test_reference_alone_composes_without_asking_the_hook() -> None:
    rng = np.random.default_rng(0)
    ops = Ops(make_plugin_manager(cpu), "cpu")
    assert not ops._fuses_layers
    layer, (hidden, cos_sin, meta, k, v) = _layer(rng), _step(rng)
    got = ops.decoder_layer(layer, hidden, None, cos_sin, meta, k, v)
    k2, v2 = paddle.zeros_like(k), paddle.zeros_like(v)
    want = compose_decoder_layer(ops, layer, hidden, None, cos_sin, meta, k2, v2)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    np.testing.assert_array_equal(k.numpy(), k2.numpy())  # the new tokens were stored
    assert np.abs(k.numpy()).sum() > 0


def test_a_fused_answer_is_used_and_none_falls_back() -> None:
    rng = np.random.default_rng(1)
    layer, (hidden, cos_sin, meta, k, v) = _layer(rng), _step(rng)
    sentinel = (paddle.zeros([2, D]), paddle.ones([2, D]))
    fused = _Fused(sentinel)
    ops = Ops(make_plugin_manager(cpu, fused), "fused")
    assert ops.decoder_layer(layer, hidden, None, cos_sin, meta, k, v) is sentinel
    declining = _Fused(None)
    ops = Ops(make_plugin_manager(cpu, declining), "declining")
    out = ops.decoder_layer(layer, hidden, None, cos_sin, meta, k, v)
    assert declining.calls == 1
    want = compose_decoder_layer(ops, layer, hidden, None, cos_sin, meta, paddle.zeros_like(k), paddle.zeros_like(v))
    for g, w in zip(out, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_replace_gives_a_fresh_backend_cache() -> None:
    layer = _layer(np.random.default_rng(2))
    layer.backend_cache["x"] = 1
    assert replace(layer, eps=1e-5).backend_cache == {}
    assert layer.backend_cache == {"x": 1}


def test_dense_layers_keep_one_description_until_a_weight_is_replaced(tmp_path: Path) -> None:
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.checkpoints import generate_checkpoint

    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=1, dtype="float32")
    runner = ModelRunner(model, get_backend("cpu"), num_blocks=8, block_size=16)
    layer = runner.model.layers[0]
    first = layer.weights()
    assert layer.weights() is first
    layer.mlp.down_proj.weight = SimpleNamespace(data=paddle.zeros_like(first.down))
    second = layer.weights()
    assert second is not first and second.down is layer.mlp.down_proj.weight.data
