"""Ops.decoder_layers: a backend's fused answer, else the unfused hooks layer
by layer; the layer description and its content key; the model's runs of dense
layers route through it; a run that ends with the model's head."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import paddle
import pytest

from fd_core.backends import cpu
from fd_core.backends.base import Ops
from fd_core.layers.mlp import MoE
from fd_core.ops.attention import AttentionMetadata
from fd_core.ops.decoder import (
    DecoderHead,
    DecoderLayerWeights,
    MoELayerWeights,
    compose_decoder_layer,
    compose_decoder_layers,
)
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
    def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches):  # noqa: ANN001, ANN201
        self.calls += 1
        return self.answer


def test_reference_alone_composes_without_asking_the_hook() -> None:
    rng = np.random.default_rng(0)
    ops = Ops(make_plugin_manager(cpu), "cpu")
    assert not ops._fuses_layers
    layer, (hidden, cos_sin, meta, k, v) = _layer(rng), _step(rng)
    got = ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v])
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
    assert ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v]) is sentinel
    declining = _Fused(None)
    ops = Ops(make_plugin_manager(cpu, declining), "declining")
    out = ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v])
    assert declining.calls == 1
    want = compose_decoder_layer(ops, layer, hidden, None, cos_sin, meta, paddle.zeros_like(k), paddle.zeros_like(v))
    for g, w in zip(out, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_a_run_chains_the_layers_each_on_its_own_cache() -> None:
    rng = np.random.default_rng(3)
    layers = [_layer(rng), _layer(rng)]
    hidden, cos_sin, meta, _, _ = _step(rng)
    ops = Ops(make_plugin_manager(cpu), "cpu")
    caches = [paddle.zeros([32, HKV, DH]) for _ in range(4)]
    got = ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:2], caches[2:4])
    mine = [paddle.zeros([32, HKV, DH]) for _ in range(4)]
    h, r = compose_decoder_layer(ops, layers[0], hidden, None, cos_sin, meta, mine[0], mine[2])
    want = compose_decoder_layer(ops, layers[1], h, r, cos_sin, meta, mine[1], mine[3])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    for c, m in zip(caches, mine):
        np.testing.assert_array_equal(c.numpy(), m.numpy())
    assert not np.array_equal(caches[0].numpy(), caches[1].numpy())  # each layer stored its own k
    with pytest.raises(ValueError, match="2 layers with 1 k and 2 v caches"):
        compose_decoder_layers(ops, layers, hidden, None, cos_sin, meta, caches[0:1], caches[2:4])


def test_the_description_carries_no_backend_state() -> None:
    layer = _layer(np.random.default_rng(2))
    assert not hasattr(layer, "backend_cache")
    assert replace(layer, eps=1e-5).key() != layer.key()


def test_dense_layers_describe_their_current_weights(tmp_path: Path) -> None:
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.checkpoints import generate_checkpoint

    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=1, dtype="float32")
    runner = ModelRunner(model, get_backend("cpu"), num_blocks=8, block_size=16)
    layer = runner.model.layers[0]
    first = layer.weights()
    assert layer.weights().key() == first.key()
    layer.mlp.down_proj.weight = SimpleNamespace(data=paddle.zeros_like(first.down))
    second = layer.weights()
    assert second.down is layer.mlp.down_proj.weight.data and second.key() != first.key()


def test_the_model_runs_consecutive_dense_layers_together() -> None:
    from fd_core.models.config import config_from_dict
    from fd_core.models.ernie4_5 import Ernie4_5ForCausalLM
    from fd_core.testing.checkpoints import SHAPES

    ops = Ops(make_plugin_manager(cpu), "cpu")
    raw = {**SHAPES["tiny-dense"], "architectures": ["Ernie4_5ForCausalLM"], "num_hidden_layers": 4}
    dense = Ernie4_5ForCausalLM(config_from_dict(raw), ops, 64)
    assert dense._runs == [(0, 4)]
    raw = {**SHAPES["tiny-moe"], "architectures": ["Ernie4_5_MoeForCausalLM"], "num_hidden_layers": 8,
           "moe_layer_start_index": 2, "moe_layer_end_index": 5, "moe_capacity": [8, 8, 8]}
    model = Ernie4_5ForCausalLM(config_from_dict(raw), ops, 64)
    kinds = [layer.is_dense for layer in model.layers]
    assert kinds == [True, True, False, False, False, False, True, True]
    # no plugin takes MoE runs: a MoE layer's attention half joins the dense run before it
    assert not ops.fuses_moe_runs and model._runs == [(0, 3), (3, 4), (4, 5), (5, 6), (6, 8)]
    assert all(layer.weights().moe is None for layer in model.layers)
    # one does: the MoE layers carry their MoE block, the whole stack is one run
    ops = Ops(make_plugin_manager(cpu, _FusedMoE(None)), "moe")
    assert ops.fuses_moe_runs
    model = Ernie4_5ForCausalLM(config_from_dict(raw), ops, 64)
    assert model._runs == [(0, 8)]
    assert all(layer.weights().moe is not None for layer in model.layers[2:6])
    # a MoE block that runs its own __call__ (expert parallelism) cannot join a run: its layer's
    # attention half ends one, the block runs after it
    for layer in model.layers[3:5]:
        layer.mlp.__class__ = _OwnCallMoE
    model._runs = model._plan_runs()
    assert model._runs == [(0, 4), (4, 5), (5, 8)]
    assert model.layers[3].weights().moe is None and model.layers[3].weights().attention_only


class _OwnCallMoE(MoE):
    def __call__(self, x):  # noqa: ANN001, ANN204
        raise AssertionError("not called here")


def _moe(rng: np.random.Generator, shared: bool = True) -> MoELayerWeights:
    def t(*shape: int) -> paddle.Tensor:
        return paddle.to_tensor(rng.normal(0, shape[-2] ** -0.5, shape).astype(np.float32))

    experts = 4
    return MoELayerWeights(t(D, experts), paddle.to_tensor(rng.normal(0, 0.1, experts).astype(np.float32)), 2,
                           True, 1e-12, t(experts, D, 2 * INTER), t(experts, INTER, D), None,
                           t(D, 2 * INTER) if shared else None, t(INTER, D) if shared else None)


class _FusedMoE(_Fused):
    FD_DECODER_LAYERS_ATTENTION_ONLY = True
    FD_DECODER_LAYERS_MOE = True


def test_a_moe_layer_in_a_run_equals_its_attention_half_then_its_moe_block() -> None:
    rng = np.random.default_rng(5)
    layers = [_layer(rng), replace(_layer(rng), up_gate=None, down=None, moe=_moe(rng)), _layer(rng),
              replace(_layer(rng), up_gate=None, down=None, moe=_moe(rng, shared=False))]
    assert not any(layer.attention_only for layer in layers)
    assert layers[1].attention_half().attention_only and layers[1].attention_half().moe is None
    assert layers[1].key() != layers[1].attention_half().key()
    hidden, cos_sin, meta, _, _ = _step(rng)
    ops = Ops(make_plugin_manager(cpu), "cpu")
    caches = [paddle.zeros([32, HKV, DH]) for _ in range(8)]
    got = ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:4], caches[4:8])
    mine = [paddle.zeros([32, HKV, DH]) for _ in range(8)]
    h, r = hidden, None
    for i, layer in enumerate(layers):
        h, r = compose_decoder_layer(ops, layer.attention_half(), h, r, cos_sin, meta, mine[i], mine[4 + i])
        if layer.moe is not None:
            m = layer.moe
            h = ops.moe_layer(h, m.gate, m.correction_bias, m.top_k, m.renormalize, m.norm_min, m.up_gate_weights,
                              m.down_weights, m.quant, m.shared_up_gate, m.shared_down)
    for g, w in zip(got, (h, r)):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    for c, m in zip(caches, mine):
        np.testing.assert_array_equal(c.numpy(), m.numpy())
    # the reference composition takes the MoE layers too
    again = [paddle.zeros([32, HKV, DH]) for _ in range(8)]
    for g, w in zip(compose_decoder_layers(ops, layers, hidden, None, cos_sin, meta, again[0:4], again[4:8]),
                    (h, r)):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    with pytest.raises(ValueError, match="a MoE layer"):
        _ = replace(layers[0], moe=layers[1].moe).attention_only


def test_moe_runs_go_whole_only_to_plugins_that_declare_them() -> None:
    """A run with MoE layers reaches a fused kernel whole only when its plugin declares
    FD_DECODER_LAYERS_MOE; to the rest it is split at the MoE layers (each piece ends with the
    layer's attention half), the blocks run by Ops.moe_layer between the pieces."""
    rng = np.random.default_rng(6)
    layers = [_layer(rng), replace(_layer(rng), up_gate=None, down=None, moe=_moe(rng)), _layer(rng)]
    hidden, cos_sin, meta, _, _ = _step(rng)
    caches = [paddle.zeros([32, HKV, DH]) for _ in range(6)]
    seen: list[list[DecoderLayerWeights]] = []

    class _Pieces(_Fused):
        FD_DECODER_LAYERS_ATTENTION_ONLY = True

        @hookimpl
        def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches):  # noqa: ANN001, ANN201
            seen.append(layers)
            return None

    ops = Ops(make_plugin_manager(cpu, _Pieces(None)), "pieces")
    ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:3], caches[3:6])
    assert [len(piece) for piece in seen] == [2, 1]
    assert seen[0][1].attention_only and all(layer.moe is None for piece in seen for layer in piece)
    sentinel = (paddle.zeros([2, D]), paddle.ones([2, D]))
    whole = _FusedMoE(sentinel)
    ops = Ops(make_plugin_manager(cpu, whole), "whole")
    assert ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:3], caches[3:6]) is sentinel
    assert whole.calls == 1
    declining = _FusedMoE(None)
    ops = Ops(make_plugin_manager(cpu, declining), "declining")
    ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:3], caches[3:6])
    assert declining.calls == 3  # the whole run, then its two pieces


class _FusedAttentionOnly(_Fused):
    FD_DECODER_LAYERS_ATTENTION_ONLY = True  # declares it takes (or declines) attention-only runs


def test_attention_only_runs_go_only_to_plugins_that_declare_them() -> None:
    """A run ending with a MoE layer's attention half (a contract newer than API_VERSION 1) is
    not handed to a fused kernel that does not declare it knows to decline one: the reference
    composes it; a declaring plugin is asked."""
    rng = np.random.default_rng(2)
    layer, (hidden, cos_sin, meta, k, v) = _layer(rng), _step(rng)
    attention = replace(layer, up_gate=None, down=None)
    sentinel = (paddle.zeros([2, D]), paddle.ones([2, D]))
    older = _Fused(sentinel)
    ops = Ops(make_plugin_manager(cpu, older), "older")
    out = ops.decoder_layers([attention], hidden, None, cos_sin, meta, [k], [v])
    assert out is not sentinel and older.calls == 0
    assert ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v]) is sentinel and older.calls == 1
    newer = _FusedAttentionOnly(sentinel)
    ops = Ops(make_plugin_manager(cpu, newer), "newer")
    assert ops.decoder_layers([attention], hidden, None, cos_sin, meta, [k], [v]) is sentinel and newer.calls == 1


def test_a_moe_run_ending_attention_only_goes_only_to_plugins_that_declare_both() -> None:
    rng = np.random.default_rng(7)
    layers = [replace(_layer(rng), up_gate=None, down=None, moe=_moe(rng)),
              replace(_layer(rng), up_gate=None, down=None)]
    hidden, cos_sin, meta, _, _ = _step(rng)
    caches = [paddle.zeros([32, HKV, DH]) for _ in range(4)]
    seen: list[list[str]] = []

    class _MoEOnly(_Fused):
        FD_DECODER_LAYERS_MOE = True  # but not FD_DECODER_LAYERS_ATTENTION_ONLY

        @hookimpl
        def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches):  # noqa: ANN001, ANN201
            seen.append(["moe" if layer.moe is not None else "half" if layer.attention_only else "dense"
                         for layer in layers])
            return None

    ops = Ops(make_plugin_manager(cpu, _MoEOnly(None)), "moe-only")
    ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:2], caches[2:4])
    assert ["moe", "half"] not in seen
    seen.clear()
    ops.decoder_layers(layers[:1], hidden, None, cos_sin, meta, caches[0:1], caches[2:3])
    assert seen == [["moe"]]


def _head(rng: np.random.Generator, vocab: int = 40) -> DecoderHead:
    return DecoderHead(paddle.to_tensor(rng.uniform(0.5, 1.5, D).astype(np.float32)), 1e-6,
                       paddle.to_tensor(rng.normal(0, D**-0.5, (D, vocab)).astype(np.float32)))


class _FusedHead(_Fused):
    """Takes runs that end with the head (and MoE runs, to test the pair of flags)."""

    FD_DECODER_LAYERS_HEAD = True
    FD_DECODER_LAYERS_MOE = True

    def __init__(self, answer: object) -> None:
        super().__init__(answer)
        self.heads: list[object] = []

    @hookimpl
    def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches, head):  # noqa: ANN001, ANN201
        self.calls += 1
        self.heads.append(head)
        return self.answer


def test_a_run_with_the_head_equals_the_run_then_the_head() -> None:
    """Ops composes a run with a head as the run, then the final norm and the LM head (its own hooks);
    a run that ends attention only cannot take the head."""
    rng = np.random.default_rng(11)
    layers = [_layer(rng), replace(_layer(rng), up_gate=None, down=None, moe=_moe(rng))]
    hidden, cos_sin, meta, _, _ = _step(rng)
    head = _head(rng)
    ops = Ops(make_plugin_manager(cpu), "cpu")
    caches = [paddle.zeros([32, HKV, DH]) for _ in range(4)]
    logits = ops.decoder_layers(layers, hidden, None, cos_sin, meta, caches[0:2], caches[2:4], head)
    mine = [paddle.zeros([32, HKV, DH]) for _ in range(4)]
    h, r = ops.decoder_layers(layers, hidden, None, cos_sin, meta, mine[0:2], mine[2:4])
    x, _ = ops.rms_norm(h, head.norm, head.eps, r)
    np.testing.assert_array_equal(logits.numpy(), ops.linear(x, head.weight).numpy())
    assert logits.shape == [2, 40]
    for c, m in zip(caches, mine):
        np.testing.assert_array_equal(c.numpy(), m.numpy())
    assert head.key() == DecoderHead(head.norm, head.eps, head.weight).key() != _head(rng).key()
    with pytest.raises(ValueError, match="attention only cannot end with the head"):
        ops.decoder_layers([replace(layers[0], up_gate=None, down=None)], hidden, None, cos_sin, meta, caches[0:1],
                           caches[2:3], head)


def test_runs_with_the_head_go_only_to_plugins_that_declare_them() -> None:
    """A plugin that does not declare FD_DECODER_LAYERS_HEAD never sees a head (it is asked for the
    run alone, then Ops runs the head's hooks); a declaring one gets it and its logits are the
    answer; when it declines, the run without the head is asked again, then the head composed."""
    rng = np.random.default_rng(12)
    layer, (hidden, cos_sin, meta, k, v) = _layer(rng), _step(rng)
    head = _head(rng)
    pair = (paddle.zeros([2, D]), paddle.ones([2, D]))
    older = _Fused(pair)
    ops = Ops(make_plugin_manager(cpu, older), "older")
    assert not ops.fuses_heads
    logits = ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v], head)
    assert older.calls == 1 and logits.shape == [2, 40]
    np.testing.assert_array_equal(logits.numpy(), head.run(ops, *pair).numpy())
    sentinel = paddle.full([2, 40], 7.0)
    newer = _FusedHead(sentinel)
    ops = Ops(make_plugin_manager(cpu, newer), "newer")
    assert ops.fuses_heads
    assert ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v], head) is sentinel
    assert newer.heads == [head]
    newer.heads.clear()
    assert ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v]) is sentinel  # no head: None passed
    assert newer.heads == [None]
    # a MoE run with the head: to plugins declaring both flags
    moe_layers = [layer, replace(_layer(rng), up_gate=None, down=None, moe=_moe(rng))]
    caches = [paddle.zeros([32, HKV, DH]) for _ in range(4)]
    newer.heads.clear()
    assert ops.decoder_layers(moe_layers, hidden, None, cos_sin, meta, caches[0:2], caches[2:4], head) is sentinel
    assert newer.heads == [head]
    declining = _FusedHead(None)
    ops = Ops(make_plugin_manager(cpu, declining), "declining")
    logits = ops.decoder_layers([layer], hidden, None, cos_sin, meta, [k], [v], head)
    assert declining.heads == [head, None] and logits.shape == [2, 40]


def _spied_runner(model: Path, plugin: object) -> Any:
    """A CPU ModelRunner of ``model`` whose layers, norm and head call their ops through ``plugin`` and the reference."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner

    runner = ModelRunner(model, get_backend("cpu"), num_blocks=8, block_size=16)
    ops = Ops(make_plugin_manager(cpu, plugin), "spy")
    for holder in (runner.model, runner.model.norm, runner.model.lm_head, *runner.model.layers):
        holder.ops = ops
    runner.model._runs = runner.model._plan_runs()
    return runner


def test_ernie_decode_steps_hand_the_head_to_the_run(tmp_path: Path) -> None:
    """With a plugin that takes heads, a decode-only step of the ERNIE model ends its last run with the
    head (one call after the embedding); a step that wants fewer rows than it runs keeps the head apart;
    the logits are those of the run then the head."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner, StepInput
    from fd_core.testing.checkpoints import generate_checkpoint

    model = generate_checkpoint(tmp_path / "m", "tiny-moe", naming="paddle", seed=3, dtype="float32")
    seen: list[object] = []

    class _Spy:
        FD_DECODER_LAYERS_HEAD = True
        FD_DECODER_LAYERS_MOE = True

        @hookimpl
        def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches, head):  # noqa: ANN001, ANN201
            seen.append(head)
            return None

    def decode(runner: ModelRunner) -> tuple[object, object]:
        prefill = runner.execute(StepInput([[5, 6, 7], [8]], [3, 1], [[1], [2]], 0))
        return prefill, runner.execute(StepInput([[9], [10]], [4, 2], [[1], [2]], 2))

    want = decode(ModelRunner(model, get_backend("cpu"), num_blocks=8, block_size=16))
    got = decode(_spied_runner(model, _Spy()))
    # the prefill keeps the head apart; the decode step hands it over, and (declined) asks for the run alone
    assert len(seen) == 3 and seen[0] is None and isinstance(seen[1], DecoderHead) and seen[2] is None
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_ernie_decode_steps_start_the_run_at_the_embedding(tmp_path: Path) -> None:
    """With a plugin that takes embeddings (and heads), a decode-only step of a model that is one run hands
    it a DecoderEmbedding (the table and the step's ids); declined, Ops takes the rows and asks again with
    them, and the logits are unchanged. A plugin with the head flag alone, or an embed_ids replaced on the
    instance (tensor parallelism's sharded one), never sees one."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner, StepInput
    from fd_core.ops.decoder import DecoderEmbedding
    from fd_core.testing.checkpoints import generate_checkpoint

    model = generate_checkpoint(tmp_path / "m", "tiny-moe", naming="paddle", seed=3, dtype="float32")
    seen: list[str] = []

    class _HeadOnly:
        FD_DECODER_LAYERS_HEAD = True
        FD_DECODER_LAYERS_MOE = True

        @hookimpl
        def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches, head):  # noqa: ANN001, ANN201
            seen.append(type(hidden).__name__)
            if isinstance(hidden, DecoderEmbedding):
                np.testing.assert_array_equal(hidden.ids.numpy(), [9, 10])
            return None

    class _Embedding(_HeadOnly):
        FD_DECODER_LAYERS_EMBEDDING = True

    def decode(runner: ModelRunner) -> object:
        runner.execute(StepInput([[5, 6, 7], [8]], [3, 1], [[1], [2]], 0))
        return runner.execute(StepInput([[9], [10]], [4, 2], [[1], [2]], 2))

    want = decode(ModelRunner(model, get_backend("cpu"), num_blocks=8, block_size=16))
    got = decode(_spied_runner(model, _Embedding()))
    # prefill: the run alone; decode: from the embedding, then (declined) from its rows, then the run alone
    assert seen == ["Tensor", "DecoderEmbedding", "Tensor", "Tensor"]
    np.testing.assert_array_equal(got.numpy(), want.numpy())  # type: ignore[attr-defined]
    seen.clear()
    decode(_spied_runner(model, _HeadOnly()))
    assert "DecoderEmbedding" not in seen
    seen.clear()
    runner = _spied_runner(model, _Embedding())
    table = runner.model.embed_tokens
    runner.model.embed_ids = lambda ids: paddle.gather(table.data, ids)  # replaced on the instance
    np.testing.assert_array_equal(decode(runner).numpy(), want.numpy())  # type: ignore[attr-defined]
    assert "DecoderEmbedding" not in seen
