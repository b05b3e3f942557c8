"""The TP transform: each rank loads exactly its slice of every split weight, and
sizes that cannot split the model are refused by name. In process, no workers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fd_core._paddle import import_paddle
from fd_core.model_loader.loader import load_model
from fd_core.models.config import load_config
from fd_core.parallel.config import check_tensor_parallel, local_kv_heads, rank_device_id
from fd_core.parallel.tensor_parallel import TensorParallel

paddle = import_paddle()


def _np(t):
    return np.asarray(t.numpy(), dtype=np.float32)


def _cols(full, ranges, axis):
    return np.concatenate([np.take(full, range(a, b), axis=axis) for a, b in ranges], axis=axis)


@pytest.mark.parametrize("shape,naming", [("tiny-dense", "pytorch"), ("tiny-moe", "paddle")])
def test_each_rank_loads_the_slice_of_the_full_weight(checkpoint_factory, cpu_backend, shape, naming):
    model_dir = checkpoint_factory(shape, naming)
    config = load_config(model_dir)
    full = load_model(model_dir, cpu_backend.ops, 64, config)
    full_params = {n: _np(p.data) for n, p in full.parameters().items()}
    world = 2
    h, kv, dh = config.num_heads, config.num_kv_heads, config.head_dim
    for rank in range(world):
        tp = TensorParallel(rank, world)
        shard = load_model(model_dir, cpu_backend.ops, 64, config, transform=tp)
        params = shard.parameters()
        assert set(params) == set(full_params)
        for name, split in tp.splits.items():
            local = _np(params[name].data)
            assert local.shape[split.axis] == split.size
            np.testing.assert_array_equal(local, _cols(full_params[name], split.kept, split.axis), err_msg=name)
        for name, value in full_params.items():  # norms, router: replicated
            if name not in tp.splits:
                np.testing.assert_array_equal(_np(params[name].data), value, err_msg=name)
        qkv = _np(params["layers.0.qkv_proj"].data)
        q = h * dh // world
        kv_local = local_kv_heads(kv, world)
        assert qkv.shape == (config.hidden_size, q + 2 * kv_local * dh)
        # the rank's query heads, then its KV head (one of 2, not replicated at TP=2)
        whole = full_params["layers.0.qkv_proj"]
        np.testing.assert_array_equal(qkv[:, :q], whole[:, rank * q:(rank + 1) * q])
        k0 = h * dh + rank * kv_local * dh
        np.testing.assert_array_equal(qkv[:, q:q + kv_local * dh], whole[:, k0:k0 + kv_local * dh])
        layer = shard.layers[0]
        assert (layer.self_attn.num_heads, layer.self_attn.num_kv_heads) == (h // world, kv_local)
        # the tied LM head is the rank's embedding rows, transposed
        vocab = config.vocab_size // world
        np.testing.assert_array_equal(_np(shard.lm_head.weight.data),
                                      full_params["embed_tokens"][rank * vocab:(rank + 1) * vocab].T)


def test_kv_heads_are_replicated_when_fewer_than_ranks(checkpoint_factory, cpu_backend):
    model_dir = checkpoint_factory("tiny-dense", "pytorch")
    config = load_config(model_dir)  # 4 heads, 2 KV heads
    full = _np(load_model(model_dir, cpu_backend.ops, 64, config).parameters()["layers.0.qkv_proj"].data)
    dh, q_full = config.head_dim, config.num_heads * config.head_dim
    for rank in range(4):
        shard = load_model(model_dir, cpu_backend.ops, 64, config, transform=TensorParallel(rank, 4))
        qkv = _np(shard.parameters()["layers.0.qkv_proj"].data)
        kv_head = rank * 2 // 4  # ranks 0, 1 share KV head 0; ranks 2, 3 KV head 1
        k = q_full + kv_head * dh
        v = k + config.num_kv_heads * dh
        np.testing.assert_array_equal(qkv[:, dh:2 * dh], full[:, k:k + dh])
        np.testing.assert_array_equal(qkv[:, 2 * dh:], full[:, v:v + dh])


def test_a_quantized_rank_quantizes_only_its_slice(checkpoint_factory, cpu_backend):
    from fd_core.quantization.config import parse_quantization

    model_dir = checkpoint_factory("tiny-dense", "pytorch")
    config = load_config(model_dir)
    quant = parse_quantization("wint8", config.architecture)
    tp = TensorParallel(1, 2)
    # one process here: the "other rank" of the load-time scale all-gather is this one again
    tp.bind(SimpleNamespace(all_gather=lambda x, axis: paddle.concat([x, x], axis=axis)))
    shard = load_model(model_dir, cpu_backend.ops, 64, config, quantization=quant, transform=tp)
    w = shard.layers[0].mlp.up_gate_proj.weight.data
    assert (w.in_features, w.out_features) == (config.hidden_size, config.intermediate_size)  # 2 * I / 2
    o = shard.layers[0].self_attn.o_proj.weight.data
    assert (o.in_features, o.out_features) == (config.num_heads * config.head_dim // 2, config.hidden_size)


def test_sizes_that_do_not_divide_the_model_are_refused_by_name(checkpoint_factory):
    config = load_config(checkpoint_factory("tiny-dense", "pytorch"))  # 4 heads, 2 KV heads, I = 128
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 3 does not divide the model's "
                                         r"num_attention_heads \(4\); use one of 1, 2, 4"):
        check_tensor_parallel(config, 3)
    with pytest.raises(ValueError, match="does not divide the model's num_attention_heads"):
        check_tensor_parallel(config, 8)
    check_tensor_parallel(config, 4)  # 2 KV heads replicated over 4 ranks


def test_rank_devices_come_from_the_visible_devices_variable():
    env = {"XPU_VISIBLE_DEVICES": "4,5"}
    assert [rank_device_id("XPU_VISIBLE_DEVICES", env, r, 2) for r in range(2)] == [0, 1]
    assert rank_device_id(None, {}, 1, 2) == 0  # a host backend: the ranks share it
    with pytest.raises(ValueError, match=r"needs 4 devices, but XPU_VISIBLE_DEVICES=4,5 lists 2"):
        rank_device_id("XPU_VISIBLE_DEVICES", env, 0, 4)
