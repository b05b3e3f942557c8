"""KV-cache dtypes: quantize/dequantize bounds, the pool's storage and block
copies, and paged attention over a bf16 / fp16 / int8 / fp8 cache against
the fp32 cache and against exact attention over the dequantized values."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_core.backends import get_backend
from fd_core.ops import kv_dtype as kd
from fd_core.ops.attention import (
    AttentionMetadata,
    reference_allocate_kv_cache,
    reference_copy_kv_blocks,
    reference_decode_attention,
    reference_prefill_attention,
    reference_write_kv_cache,
)
from fd_core.ops.kv_storage import QuantizedKV, kv_dtype_of

LOW = ("bfloat16", "float16", "int8", "fp8")
# bound on |dequantize(quantize(x)) - x|: (relative to |x|, relative to the row's absmax,
# absolute): half a unit in the last place; fp16 subnormals (|x| < 2**-14) round to 2**-24
# steps, fp8 subnormals to 2**-9 steps of the row's scale (absmax / 448)
BOUNDS = {"bfloat16": (2.0**-8, 0.0, 0.0), "float16": (2.0**-11, 0.0, 2.0**-25), "int8": (0.0, 0.5 / 127, 0.0),
          "fp8": (2.0**-4, 2.0**-10 / 448, 0.0)}
# attention output over the low-precision cache vs the fp32 cache, max abs error
# (outputs are O(1): averages of N(0, 1) values)
ATTENTION_TOL = {"bfloat16": 2e-2, "float16": 3e-3, "int8": 3e-2, "fp8": 1.5e-1}


def _rows(seed: int = 0, shape: tuple[int, ...] = (64, 4, 32)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # rows of very different magnitudes: each gets its own scale
    return (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 50.0], shape[:-1])[..., None]).astype(np.float32)


@pytest.mark.parametrize("kv_dtype", LOW)
def test_round_trip_error_is_bounded(kv_dtype):
    x = _rows()
    stored, scales = kd.quantize(x, kv_dtype)
    back = kd.dequantize(stored, scales, kv_dtype)
    rel, of_absmax, floor = BOUNDS[kv_dtype]
    absmax = np.abs(x).max(axis=-1, keepdims=True)
    assert (np.abs(back - x) <= rel * np.abs(x) + of_absmax * absmax * 1.0001 + floor + 1e-30).all()
    if kd.is_quantized(kv_dtype):
        assert scales is not None and scales.shape == x.shape[:-1] and scales.dtype == np.float32
        # the row's absmax is stored exactly (code +-QMAX times the scale)
        assert np.allclose(np.abs(back).max(axis=-1), absmax[..., 0], rtol=1e-6)


@pytest.mark.parametrize("kv_dtype", ("int8", "fp8"))
def test_zero_rows_quantize_to_zero(kv_dtype):
    stored, scales = kd.quantize(np.zeros((3, 2, 8), np.float32), kv_dtype)
    assert (scales == 0).all() and (kd.dequantize(stored, scales, kv_dtype) == 0).all()


def test_fp8_codes_decode_to_paddles_float8_e4m3fn_cast():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-4, 3, 4000),
                        [0.0, 448.0, -448.0, 2.0**-9, 3 * 2.0**-10, 240.0, 232.0]]).astype(np.float32)
    ours = kd.decode_fp8_e4m3(kd.encode_fp8_e4m3(x))
    theirs = paddle.to_tensor(x).astype("float8_e4m3fn").astype("float32").numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("kv_dtype", kd.KV_DTYPES)
def test_paddle_path_matches_numpy_path(kv_dtype):
    x = _rows(2, (16, 2, 16))
    want = kd.dequantize(*kd.quantize(x, kv_dtype), kv_dtype)
    stored, scales = kd.quantize_tensor(paddle, paddle.to_tensor(x), kv_dtype)
    np.testing.assert_array_equal(kd.dequantize_tensor(paddle, stored, scales, kv_dtype).numpy(), want)


def test_bytes_per_token_head_counts_scales():
    assert [kd.bytes_per_token_head(d, 128) for d in kd.KV_DTYPES] == [512, 256, 256, 132, 132, 132]
    assert kd.bytes_per_token_head("int8", 16) == 20
    with pytest.raises(ValueError, match="got 'int4'"):
        kd.bytes_per_token_head("int4", 16)


def _read_rows(cache, num_blocks: int, block_size: int) -> np.ndarray:
    """Every row of a pool, dequantized, as attention reads them: ``[S, Hkv, Dh]``."""
    from fd_core.ops.kv_storage import take_blocks

    blocks = np.arange(num_blocks, dtype=np.int64)
    if kv_dtype_of(cache) == "float32":
        return cache.numpy()
    got = take_blocks(cache, blocks, paddle.to_tensor(blocks), block_size).numpy()  # [Hkv, n, bs, Dh]
    return got.transpose(1, 2, 0, 3).reshape(num_blocks * block_size, *got.shape[::3])


@pytest.mark.parametrize("location", ("device", "host"))
@pytest.mark.parametrize("kv_dtype", kd.KV_DTYPES)
def test_pool_layout_and_write(kv_dtype, location):
    k_cache, v_cache = reference_allocate_kv_cache(4, 8, 2, 16, kv_dtype, location)
    assert kv_dtype_of(k_cache) == kv_dtype
    if kd.is_quantized(kv_dtype):
        assert isinstance(k_cache, QuantizedKV)
        assert k_cache.codes.shape == [32, 2, 16] and k_cache.codes.dtype == getattr(paddle, kd.storage_dtype(kv_dtype))
        assert k_cache.scales.shape == [32, 2] and k_cache.scales.dtype == paddle.float32
    else:
        assert k_cache.shape == [32, 2, 16] and k_cache.dtype == getattr(paddle, kv_dtype)
    k, v = _rows(3, (5, 2, 16)), _rows(4, (5, 2, 16))
    slots = paddle.to_tensor(np.array([9, 0, 31, -1, 17], dtype=np.int64))  # -1: not stored
    reference_write_kv_cache(paddle.to_tensor(k), paddle.to_tensor(v), k_cache, v_cache, slots)
    got = _read_rows(k_cache, 4, 8)
    want = kd.dequantize(*kd.quantize(k, kv_dtype), kv_dtype)
    for row, slot in enumerate([9, 0, 31, -1, 17]):
        if slot >= 0:
            np.testing.assert_array_equal(got[slot], want[row])
    assert (got[1:9] == 0).all()  # untouched slots stay zero


def _step_scenario(kv_dtype: str, seed: int = 5):
    """Two prefills then one mixed step (2 decodes, 1 prefill chunk) over a
    cache in ``kv_dtype``; returns the step's decode and prefill outputs and
    the K/V history each request's keys come from."""
    rng = np.random.default_rng(seed)
    heads, kv_heads, dh, bs = 8, 2, 32, 16
    k_cache, v_cache = reference_allocate_kv_cache(12, bs, kv_heads, dh, kv_dtype)
    tables = [[3, 7, 1], [2, 9], [5, 4, 11]]
    context = [37, 20, 10]  # already cached before the step
    hist_k = [rng.standard_normal((40, kv_heads, dh)).astype(np.float32) for _ in tables]
    hist_v = [rng.standard_normal((40, kv_heads, dh)).astype(np.float32) for _ in tables]
    for table, n, hk, hv in zip(tables, context, hist_k, hist_v):
        pre = AttentionMetadata.build([n], [n], [table], bs, 0)
        reference_write_kv_cache(paddle.to_tensor(hk[:n]), paddle.to_tensor(hv[:n]), k_cache, v_cache,
                                 pre.slot_mapping)
    qlens = [1, 1, 6]
    meta = AttentionMetadata.build(qlens, [c + q for c, q in zip(context, qlens)], tables, bs, 2)
    new_k = np.concatenate([hk[c : c + q] for hk, c, q in zip(hist_k, context, qlens)])
    new_v = np.concatenate([hv[c : c + q] for hv, c, q in zip(hist_v, context, qlens)])
    q = paddle.to_tensor(rng.standard_normal((sum(qlens), heads, dh)).astype(np.float32))
    reference_write_kv_cache(paddle.to_tensor(new_k), paddle.to_tensor(new_v), k_cache, v_cache, meta.slot_mapping)
    scale = dh**-0.5
    decode = reference_decode_attention(q[:2], k_cache, v_cache, meta, scale).numpy()
    prefill = reference_prefill_attention(q[2:], paddle.to_tensor(new_k[2:]), paddle.to_tensor(new_v[2:]),
                                          k_cache, v_cache, meta, scale).numpy()
    return np.concatenate([decode, prefill]), q.numpy(), hist_k, hist_v, context, qlens, scale


def _dense_attention(q, hist_k, hist_v, context, qlens, scale, kv_dtype):
    """Causal attention in float64 over each request's dequantized history."""
    outs = []
    row = 0
    for hk, hv, c, n in zip(hist_k, hist_v, context, qlens):
        k = kd.dequantize(*kd.quantize(hk[: c + n], kv_dtype), kv_dtype).astype(np.float64)
        v = kd.dequantize(*kd.quantize(hv[: c + n], kv_dtype), kv_dtype).astype(np.float64)
        group = q.shape[1] // k.shape[1]
        for i in range(n):
            qi = q[row + i].astype(np.float64)  # [H, Dh]
            length = c + i + 1
            kk = np.repeat(k[:length], group, axis=1)  # [L, H, Dh]
            vv = np.repeat(v[:length], group, axis=1)
            s = np.einsum("hd,lhd->hl", qi, kk) * scale
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            outs.append(np.einsum("hl,lhd->hd", p, vv))
        row += n
    return np.stack(outs)


@pytest.mark.parametrize("kv_dtype", kd.KV_DTYPES)
def test_attention_is_exact_attention_over_the_dequantized_cache(kv_dtype):
    out, q, hist_k, hist_v, context, qlens, scale = _step_scenario(kv_dtype)
    want = _dense_attention(q, hist_k, hist_v, context, qlens, scale, kv_dtype)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("kv_dtype", LOW)
def test_attention_close_to_fp32_cache(kv_dtype):
    exact = _step_scenario("float32")[0]
    out = _step_scenario(kv_dtype)[0]
    err = np.abs(out - exact).max()
    assert err <= ATTENTION_TOL[kv_dtype], f"{kv_dtype}: max |out - fp32| = {err:.3g}"
    assert err > 0  # it really is stored in lower precision


@pytest.mark.parametrize("kv_dtype", kd.KV_DTYPES)
def test_blocks_swap_out_and_back_with_their_scales(kv_dtype):
    k_cache, v_cache = reference_allocate_kv_cache(6, 4, 2, 8, kv_dtype)
    host_k, host_v = reference_allocate_kv_cache(3, 4, 2, 8, kv_dtype, "host")
    x = _rows(6, (24, 2, 8))
    slots = paddle.arange(24, dtype="int64")
    reference_write_kv_cache(paddle.to_tensor(x), paddle.to_tensor(-x), k_cache, v_cache, slots)
    want = kd.dequantize(*kd.quantize(x, kv_dtype), kv_dtype)
    reference_copy_kv_blocks(k_cache, host_k, [1, 4], [2, 0], 4)  # device -> host
    reference_copy_kv_blocks(host_k, k_cache, [2, 0], [5, 3], 4)  # host -> other device blocks
    got = _read_rows(k_cache, 6, 4)
    np.testing.assert_array_equal(got[20:24], want[4:8])  # block 1 -> host 2 -> block 5
    np.testing.assert_array_equal(got[12:16], want[16:20])  # block 4 -> host 0 -> block 3
    np.testing.assert_array_equal(got[:12], want[:12])


def test_copy_between_pools_of_different_dtypes_is_refused():
    a, _ = reference_allocate_kv_cache(2, 4, 1, 8, "int8")
    b, _ = reference_allocate_kv_cache(2, 4, 1, 8, "fp8", "host")
    with pytest.raises(ValueError, match="from a int8 pool to a fp8 pool"):
        reference_copy_kv_blocks(a, b, [1], [1], 4)


@pytest.mark.parametrize("kv_dtype", LOW)
def test_every_backend_declaring_a_kv_dtype_runs_it(kv_dtype):
    """The built-in backends that declare a KV dtype run the attention ops on
    it through ``Ops`` (fd_x86's native ops on AVX-512: the same stored values,
    fp32 math in another order, so equal to 1e-5 of the output's scale)."""
    for name in ("cpu", "x86"):
        try:
            backend = get_backend(name)
        except Exception as exc:  # fd_x86 not installed here
            pytest.skip(f"backend {name}: {exc}")
        assert kv_dtype in backend.capabilities().kv_cache_dtypes
        ops = backend.ops
        k_cache, v_cache = ops.allocate_kv_cache(4, 16, 2, 32, kv_dtype)
        x = _rows(7, (20, 2, 32))
        meta = AttentionMetadata.build([20], [20], [[1, 2]], 16, 0)
        ops.write_kv_cache(paddle.to_tensor(x), paddle.to_tensor(x), k_cache, v_cache, meta.slot_mapping)
        q = paddle.to_tensor(_rows(8, (20, 8, 32)))
        out = ops.prefill_attention(q, paddle.to_tensor(x), paddle.to_tensor(x), k_cache, v_cache, meta, 0.2)
        ref = reference_prefill_attention(q, paddle.to_tensor(x), paddle.to_tensor(x), k_cache, v_cache, meta, 0.2)
        want = ref.numpy()
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
