"""The int8_static KV cache (FastDeploy's C8: static per-channel scales):
its write against a numpy / pure-Python oracle of FastDeploy's
``QuantToC8`` (``rint`` half to even of ``x * 127 / S``, clipped to +-127),
and attention over it, folded around the int8 kernels
(``fd_core.ops.decoder.self_attention``), against an independent numpy
attention over the dequantized values ``code * S / 127``."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.errors import UnsupportedFeatureError
from fd_core.ops import kv_dtype as kd
from fd_core.ops.attention import AttentionMetadata, reference_allocate_kv_cache
from fd_core.ops.decoder import DecoderLayerWeights, compose_decoder_layer, self_attention
from fd_core.ops.kv_storage import QuantizedKV, store_rows, take_blocks
from fd_core.ops.rope import rope_cos_sin
from fd_core.quantization.config import QuantizationConfig, resolve_kv_cache_dtype
from fd_core.quantization.offline import read_offline

W4A8C8 = {"quantization_config": {"quantization": "mix_quant", "dense_quant_type": "wint8",
                                  "moe_quant_type": "w4a8", "kv_cache_quant_type": "int8", "is_quantized": True}}


def oracle_codes(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """FastDeploy's static C8 write, one element at a time in Python:
    ``round(float32(x * float32(127 / S)))`` (Python's round: half to even),
    clipped to [-127, 127]."""
    quant = (np.float32(127.0) / s.astype(np.float32)).astype(np.float32)
    flat_x, flat_q = x.reshape(-1, s.size), np.broadcast_to(quant.reshape(1, -1), (x.size // s.size, s.size))
    out = np.empty(flat_x.shape, dtype=np.int64)
    for idx in np.ndindex(flat_x.shape):
        value = float(np.float32(flat_x[idx]) * flat_q[idx])
        out[idx] = max(-127, min(127, round(value)))
    return out.reshape(x.shape)


def test_static_codes_round_half_to_even_and_saturate():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 127.4, 300.0, -1e9, 0.49999997],
                 dtype=np.float32).reshape(1, 1, -1)
    codes, scales = kd.quantize(x, "int8_static")
    assert codes.tolist() == [[[0, 2, 2, 0, -2, -2, 126, -126, 127, 127, -127, 0]]]
    assert codes.dtype == np.int8 and (scales == 1).all() and scales.shape == (1, 1)
    paddle_codes, paddle_scales = kd.quantize_tensor(paddle, paddle.to_tensor(x), "int8_static")
    np.testing.assert_array_equal(paddle_codes.numpy(), codes)
    assert (paddle_scales.numpy() == 1).all()


def test_static_write_equals_the_oracle():
    rng = np.random.default_rng(0)
    heads, dim = 2, 8
    s = rng.uniform(0.5, 3.0, heads * dim).astype(np.float32)
    k = (rng.standard_normal((20, heads, dim)) * 1.5).astype(np.float32)  # some beyond S: clipped
    k[0, 0, :4] = np.array([0.5, 1.5, -2.5, 3.5], np.float32) * s[:4] / 127  # near-ties
    scales = kd.StaticKVScales(paddle.to_tensor(s), paddle.to_tensor(s))
    scaled, _ = kd.static_quantize_input(paddle.to_tensor(k), paddle.to_tensor(k), scales)
    codes, _ = kd.quantize(scaled.numpy(), "int8_static")
    np.testing.assert_array_equal(codes, oracle_codes(k, s))
    assert (np.abs(codes) == 127).any()  # the clip is exercised


def test_pool_stores_codes_with_unit_scales():
    k_cache, _ = reference_allocate_kv_cache(4, 4, 2, 8, "int8_static")
    assert isinstance(k_cache, QuantizedKV) and k_cache.kv_dtype == "int8_static"
    assert kd.bytes_per_token_head("int8_static", 8) == 8 + 4
    x = np.arange(-24, 24, dtype=np.float32).reshape(3, 2, 8) * 3.3
    store_rows(paddle.to_tensor(x), k_cache, paddle.to_tensor([5, 0, 9]))
    np.testing.assert_array_equal(k_cache.codes.numpy()[[5, 0, 9]], np.clip(np.rint(x), -127, 127))
    assert (k_cache.scales.numpy()[[5, 0, 9]] == 1).all() and (k_cache.scales.numpy()[1] == 0).all()
    back = take_blocks(k_cache, np.array([1, 0]), paddle.to_tensor([1, 0]), 4).numpy()  # [Hkv, n, bs, Dh]
    np.testing.assert_array_equal(back[:, 0, 1], np.clip(np.rint(x[0]), -127, 127))


# ---------------------------------------------------------------- attention


def numpy_attention(q, k_codes, v_codes, s_k, s_v, seq_lens, query_lens, scale):
    """Causal attention per request over ``code * S / 127`` (float64):
    ``q [T, H, Dh]``, codes ``[N, Hkv, Dh]`` of the requests' tokens in order."""
    heads, kv_heads, dim = q.shape[1], k_codes.shape[1], q.shape[2]
    k = k_codes * (s_k.reshape(kv_heads, dim) / 127.0)
    v = v_codes * (s_v.reshape(kv_heads, dim) / 127.0)
    out, t0, c0 = np.zeros(q.shape), 0, 0
    for seq, new in zip(seq_lens, query_lens):
        for i in range(new):
            pos = seq - new + i
            for h in range(heads):
                g = h // (heads // kv_heads)
                logits = k[c0:c0 + pos + 1, g] @ q[t0 + i, h] * scale
                p = np.exp(logits - logits.max())
                out[t0 + i, h] = (p / p.sum()) @ v[c0:c0 + pos + 1, g]
        t0, c0 = t0 + new, c0 + seq
    return out


def test_self_attention_over_the_static_cache_matches_numpy(ops):
    """Two steps (prefill chunks, then decodes + a chunk after cached context)
    through ``self_attention``; the cache's codes are the oracle's and the
    outputs the numpy attention over ``code * S / 127``."""
    rng = np.random.default_rng(1)
    heads, kv_heads, dim, hidden, bs = 4, 2, 16, 32, 4
    s_k = rng.uniform(1.0, 4.0, kv_heads * dim).astype(np.float32)
    s_v = rng.uniform(1.0, 4.0, kv_heads * dim).astype(np.float32)
    scales = kd.StaticKVScales(paddle.to_tensor(s_k), paddle.to_tensor(s_v))
    identity_o = paddle.eye(heads * dim)  # the output projection: leaves attention's output
    k_cache, v_cache = reference_allocate_kv_cache(16, bs, kv_heads, dim, "int8_static")
    cos_sin = rope_cos_sin(dim, 64, 10000.0)
    tables = [[3, 7, 1, 9], [2, 0, 5, 11]]
    qkv_w = paddle.to_tensor(rng.standard_normal((hidden, (heads + 2 * kv_heads) * dim)).astype(np.float32) * 0.4)
    history: dict[int, list[np.ndarray]] = {0: [], 1: []}  # per request: [k, v] rows written, in order
    for query_lens, seq_lens, num_decodes in (([6, 3], [6, 3], 0), ([1, 5], [7, 8], 1)):
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, bs, num_decodes)
        x = paddle.to_tensor(rng.standard_normal((sum(query_lens), hidden)).astype(np.float32))
        got = self_attention(ops, x, qkv_w, identity_o, cos_sin, meta, k_cache, v_cache, heads, kv_heads,
                             dim**-0.5, kv_scales=scales).numpy().reshape(-1, heads, dim)
        q, k, v = paddle.split(paddle.matmul(x, qkv_w), [heads * dim, kv_heads * dim, kv_heads * dim], axis=-1)
        q, k = ops.rotary_embedding(q.reshape([-1, heads, dim]), k.reshape([-1, kv_heads, dim]),
                                    meta.positions, cos_sin, True)
        k, v, q = k.numpy(), v.numpy().reshape(-1, kv_heads, dim), q.numpy()
        starts = np.cumsum([0] + query_lens)
        for r in range(2):
            history[r].append(np.stack([k[starts[r]:starts[r + 1]], v[starts[r]:starts[r + 1]]]))
        codes = {r: np.concatenate(history[r], axis=1) for r in range(2)}  # [2, seq, Hkv, Dh]
        k_codes = np.concatenate([oracle_codes(codes[r][0], s_k) for r in range(2)])
        v_codes = np.concatenate([oracle_codes(codes[r][1], s_v) for r in range(2)])
        want = numpy_attention(q, k_codes, v_codes, s_k, s_v, seq_lens, query_lens, dim**-0.5)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    slots = [tables[0][p // bs] * bs + p % bs for p in range(7)]
    np.testing.assert_array_equal(k_cache.codes.numpy()[slots], oracle_codes(np.concatenate(history[0], 1)[0], s_k))


def test_a_static_pool_without_scales_and_scales_on_a_dynamic_pool_are_refused(ops):
    meta = AttentionMetadata.build([2], [2], [[0]], 4, 0)
    x, w, o = paddle.ones([2, 8]), paddle.ones([8, 24]), paddle.eye(8)
    cos_sin = rope_cos_sin(8, 8, 10000.0)
    static = reference_allocate_kv_cache(2, 4, 1, 8, "int8_static")
    with pytest.raises(ValueError, match="int8_static KV cache needs the layer's static per-channel KV scales"):
        self_attention(ops, x, w, o, cos_sin, meta, *static, 1, 1, 1.0)
    scales = kd.StaticKVScales(paddle.ones([8]), paddle.ones([8]))
    dynamic = reference_allocate_kv_cache(2, 4, 1, 8, "int8")
    with pytest.raises(ValueError, match="static per-channel KV scales but its KV cache is int8"):
        self_attention(ops, x, w, o, cos_sin, meta, *dynamic, 1, 1, 1.0, kv_scales=scales)
    bad = kd.StaticKVScales(paddle.ones([8]), paddle.to_tensor([1.0] * 7 + [float("nan")]), layer=3)
    with pytest.raises(ValueError, match=r"layer 3's cachev_matmul.activation_scale has a value that is not > 0"):
        self_attention(ops, x, w, o, cos_sin, meta, *static, 1, 1, 1.0, kv_scales=bad)


def test_a_layer_with_static_scales_is_not_plain_and_keys_them(ops):
    rng = np.random.default_rng(2)

    def t(*shape):
        return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))

    layer = DecoderLayerWeights(t(16), t(16), 1e-6, t(16, 32), t(16, 16), t(16, 64), t(32, 16), 2, 1, 8, 0.35)
    with_scales = DecoderLayerWeights(**{**layer.__dict__, "kv_scales": kd.StaticKVScales(t(8).abs(), t(8).abs())})
    assert layer.plain and not with_scales.plain and layer.key() != with_scales.key()
    meta = AttentionMetadata.build([3], [3], [[1]], 4, 0)
    caches = reference_allocate_kv_cache(2, 4, 1, 8, "int8_static")
    hidden, _ = compose_decoder_layer(ops, with_scales, t(3, 16), None, rope_cos_sin(8, 8, 10000.0), meta, *caches)
    assert np.isfinite(hidden.numpy()).all() and (caches[0].scales.numpy()[4:7] == 1).all()


# ------------------------------------------------------------ selection


def test_an_offline_checkpoint_with_static_scales_selects_int8_static():
    offline = read_offline(W4A8C8)
    config = QuantizationConfig("mix_quant", "wint8", "w4a8_static", -1, True, None, "int8", offline=offline)
    declared = ("float32", "int8", "int8_static")
    assert resolve_kv_cache_dtype("auto", config, "cpu", declared) == "int8_static"
    assert resolve_kv_cache_dtype("int8", config, "cpu", declared) == "int8_static"  # the checkpoint's int8
    with pytest.raises(ValueError, match="disagree"):
        resolve_kv_cache_dtype("fp8", config, "cpu", declared + ("fp8",))
    with pytest.raises(UnsupportedFeatureError, match="declares the int8_static KV cache .*backend 'gpu-x' has float32, int8"):
        resolve_kv_cache_dtype("auto", config, "gpu-x", ("float32", "int8"))
    with pytest.raises(ValueError, match="int8_static needs an offline checkpoint with static per-channel"):
        resolve_kv_cache_dtype("int8_static", '{"kv_cache_quant_type": "int8"}', "cpu", declared)
    # FastDeploy's online form has no scales: dynamic int8, as before
    assert resolve_kv_cache_dtype("auto", '{"kv_cache_quant_type": "int8"}', "cpu", declared) == "int8"
