"""Content keys (fd_core.ops.content_key) and the layer description's key."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from fd_core.ops.content_key import tensor_key, weight_key  # noqa: E402
from fd_core.ops.decoder import DecoderLayerWeights  # noqa: E402
from fd_core.ops.kv_storage import allocate_pool  # noqa: E402
from fd_core.quantization import quantize_weight  # noqa: E402


def _t(*shape: int, seed: int = 0) -> object:
    return paddle.to_tensor(np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32))


def test_a_tensor_key_follows_memory_shape_dtype_and_counted_writes() -> None:
    t = _t(4, 8)
    key = tensor_key(t)
    assert tensor_key(t) == key
    assert tensor_key(t.clone()) != key  # other memory, same values
    assert tensor_key(t.reshape([8, 4])) != key
    paddle.assign(t * 2, output=t)  # an in-place write paddle counts
    assert tensor_key(t) != key
    assert tensor_key(t, version=False) == tensor_key(t, version=False)
    assert tensor_key(None) is None


def test_an_8_bit_kv_pool_is_keyed_by_its_codes_and_scales() -> None:
    pool = allocate_pool(16, 2, 8, "int8", host=True)
    key = tensor_key(pool, version=False)
    assert key == (tensor_key(pool.codes, version=False), tensor_key(pool.scales, version=False))


def test_a_quantized_weight_key_names_method_group_and_both_tensors() -> None:
    w = np.random.default_rng(1).normal(0, 0.1, (64, 32)).astype(np.float32)
    q8, q4 = quantize_weight("wint8", w), quantize_weight("wint4", w, 32)
    assert weight_key(q8) == weight_key(q8)
    assert weight_key(q8) != weight_key(q4)
    q8.scales = q8.scales.clone()
    assert weight_key(q8)[-1] != weight_key(quantize_weight("wint8", w))[-1]
    bf16 = quantize_weight("wint4", w, 32)
    bf16.act_dtype = "bfloat16"  # the kernels may round activations to it: another run
    assert weight_key(bf16)[:4] == weight_key(q4)[:4] and weight_key(bf16)[4:5] != weight_key(q4)[4:5]


def test_the_layer_key_changes_with_any_part_and_not_with_the_object() -> None:
    layer = DecoderLayerWeights(_t(16), _t(16), 1e-6, _t(16, 48), _t(16, 16), _t(16, 64), _t(32, 16),
                                num_heads=2, num_kv_heads=1, head_dim=8, scale=8**-0.5)
    key = layer.key()
    assert replace(layer).key() == key  # a new object over the same tensors: same key
    assert layer.plain
    with_norms = replace(layer, q_norm=_t(8), k_norm=_t(8, seed=1))
    assert not with_norms.plain and with_norms.key() != key
    assert replace(layer, interleaved_rope=False).key() != key
    assert replace(layer, down=_t(32, 16)).key() != key
