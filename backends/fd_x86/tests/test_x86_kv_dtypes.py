"""fd_x86's KV ops over bf16 / fp16 / int8 / fp8 pools against fd-core's
reference: the stored bits (both write ops) are identical, attention over the
same pool agrees to fp32 rounding, and a tiny model decodes the same greedy
tokens with each ``kv_cache_dtype``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build
from paged_tables import shuffled_tables

paddle = pytest.importorskip("paddle")

from fd_core.ops.attention import (  # noqa: E402
    AttentionMetadata,
    reference_allocate_kv_cache,
    reference_decode_attention,
    reference_prefill_attention,
    reference_write_kv_cache,
)
from fd_core.ops.kv_dtype import _FP8_POSITIVE  # noqa: E402
from fd_core.ops.kv_storage import QuantizedKV  # noqa: E402
from fd_core.ops.rope import rope_cos_sin  # noqa: E402

LOW = ("bfloat16", "float16", "int8", "fp8")


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    from fd_x86.ops import _avx512

    if not _avx512():
        pytest.skip("the non-fp32 KV kernels need AVX-512 F/BW/VL/DQ")
    build.load_ops()


def _t(a: np.ndarray) -> Any:
    return paddle.to_tensor(a)


def _native(out: Any) -> np.ndarray:
    """A hook's answer as numpy; None (the reference would run) fails the test."""
    assert out is not None, "fd_x86 declined: the reference would answer"
    return np.asarray(out.numpy())


def _bits(cache: Any) -> list[np.ndarray]:
    """A pool's stored bit patterns (codes and scales for int8 / fp8)."""
    if isinstance(cache, QuantizedKV):
        return [cache.codes.numpy().view(np.uint8), cache.scales.numpy().view(np.uint32)]
    if cache.dtype == paddle.bfloat16:
        return [cache.view(paddle.int16).numpy()]
    return [cache.numpy().view(np.uint8)]


def _hard_rows(kv_dtype: str, tokens: int, num_kv: int, head_dim: int, seed: int) -> np.ndarray:
    """Rows ``[tokens, Hkv, Dh]`` of mixed magnitudes plus the cases rounding
    gets wrong: a zero row, exact ties of the target format, large values,
    fp16 subnormals and overflow, every fp8 midpoint."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, num_kv, head_dim)) * rng.choice([1e-6, 1e-3, 1.0, 50.0, 3e4],
                                                                     (tokens, num_kv))[..., None]
    x = x.astype(np.float32)
    x[0] = 0.0
    ties = x[1].reshape(-1)
    if kv_dtype == "bfloat16":  # low 16 bits exactly 0x8000: halfway between two bf16 values
        ties.view(np.uint32)[:] = (ties.view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    elif kv_dtype == "float16":
        ties[:] = rng.choice([2049.0, 1 + 2.0**-11, 3 * 2.0**-25, 6e-8, 7e4, -7e4, 65519.0, 65520.0], ties.size)
    elif kv_dtype == "int8":  # absmax 127: scale 1, so k + 0.5 is a tie
        ties[:] = rng.integers(-126, 127, ties.size) + 0.5
        ties[0] = 127.0
    else:  # absmax 448: scale 1; midpoints between adjacent e4m3 values
        mids = (_FP8_POSITIVE[1:] + _FP8_POSITIVE[:-1]) / 2
        ties[:] = rng.choice(mids, ties.size) * rng.choice([-1.0, 1.0], ties.size)
        ties[0] = 448.0
    x[2] = (rng.standard_normal((num_kv, head_dim)) * 1e30).astype(np.float32)
    return x


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # fp16 -> inf, as stored
@pytest.mark.parametrize("kv_dtype", LOW)
@pytest.mark.parametrize("head_dim", [32, 72, 128])
def test_write_kv_cache_stores_the_references_bits(kv_dtype: str, head_dim: int) -> None:
    num_kv, block_size, tokens = 2, 16, 40
    x = _hard_rows(kv_dtype, tokens, num_kv, head_dim, head_dim)
    slots = np.random.default_rng(1).permutation(4 * block_size)[:tokens].astype(np.int64)
    slots[5] = -1  # skipped
    got = reference_allocate_kv_cache(4, block_size, num_kv, head_dim, kv_dtype)
    want = reference_allocate_kv_cache(4, block_size, num_kv, head_dim, kv_dtype)
    assert backend.fd_write_kv_cache(k=_t(x), v=_t(-x[::-1].copy()), k_cache=got[0], v_cache=got[1],
                                     slot_mapping=_t(slots)) is True
    reference_write_kv_cache(_t(x), _t(-x[::-1].copy()), want[0], want[1], _t(slots))
    for g, w in zip(got, want):
        for a, b in zip(_bits(g), _bits(w)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("kv_dtype", LOW)
def test_fused_rope_and_write_stores_the_references_bits(kv_dtype: str) -> None:
    heads, num_kv, head_dim, tokens = 4, 2, 64, 24
    rng = np.random.default_rng(3)
    rows = _hard_rows(kv_dtype, tokens, 2 * num_kv, head_dim, 4)  # k and v rows, rotated only in k
    qkv = np.concatenate([rng.standard_normal((tokens, heads * head_dim)).astype(np.float32),
                          rows.reshape(tokens, -1)], axis=1)
    positions = rng.integers(0, 100, tokens).astype(np.int64)
    slots = rng.permutation(64)[:tokens].astype(np.int64)
    cos_sin = rope_cos_sin(head_dim, 128, 10000.0)
    got = reference_allocate_kv_cache(4, 16, num_kv, head_dim, kv_dtype)
    out = backend.fd_rope_and_write_kv_cache(
        qkv=_t(qkv), positions=_t(positions), cos_sin=cos_sin, interleaved=True, num_heads=heads,
        num_kv_heads=num_kv, k_cache=got[0], v_cache=got[1], slot_mapping=_t(slots))
    assert out is not None
    _, k, v = out
    np.testing.assert_array_equal(v.numpy(), rows[:, num_kv:])  # v passes through unrounded
    want = reference_allocate_kv_cache(4, 16, num_kv, head_dim, kv_dtype)
    reference_write_kv_cache(k, v, want[0], want[1], _t(slots))
    for g, w in zip(got, want):
        for a, b in zip(_bits(g), _bits(w)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_quantized_write_rounds_every_value_like_the_reference(kv_dtype: str) -> None:
    """Rows whose absmax makes the scale exactly 1, so each other value is
    coded as itself: a dense sweep of magnitudes, every tie and the floats
    one ulp either side of it."""
    qmax = 127.0 if kv_dtype == "int8" else 448.0
    rng = np.random.default_rng(11)
    ties = np.arange(-126, 127) + 0.5 if kv_dtype == "int8" else (_FP8_POSITIVE[1:] + _FP8_POSITIVE[:-1]) / 2
    ties = ties.astype(np.float32)
    sweep = np.exp2(rng.uniform(-14, np.log2(qmax), 20000)).astype(np.float32)
    values = np.concatenate([ties, np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(qmax)), sweep])
    values = values * rng.choice(np.array([-1, 1], np.float32), values.size)
    rows = -(-values.size // 127)
    x = np.zeros((rows, 1, 128), np.float32)
    x[:, 0, 0] = qmax
    x[:, 0, 1:] = np.pad(values, (0, rows * 127 - values.size)).reshape(rows, 127)
    slots = _t(np.arange(rows, dtype=np.int64))
    got = reference_allocate_kv_cache(-(-rows // 16), 16, 1, 128, kv_dtype)
    want = reference_allocate_kv_cache(-(-rows // 16), 16, 1, 128, kv_dtype)
    assert backend.fd_write_kv_cache(k=_t(x), v=_t(x), k_cache=got[0], v_cache=got[1], slot_mapping=slots)
    reference_write_kv_cache(_t(x), _t(x), want[0], want[1], slots)
    for a, b in zip(_bits(got[0]), _bits(want[0])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_every_code_reads_as_the_reference_dequantizes_it(kv_dtype: str) -> None:
    """Pools holding every code the writes produce (fp8: all but the NaN
    patterns 0x7F / 0xFF, subnormals included), attended with one-hot
    queries: each output is one dequantized row."""
    rng = np.random.default_rng(12)
    codes = np.arange(-127, 128) if kv_dtype == "int8" else np.setdiff1d(np.arange(256), [0x7F, 0xFF])
    codes = rng.permutation(np.resize(codes, 16 * 32))
    np_dtype = np.int8 if kv_dtype == "int8" else np.uint8
    pool = codes.astype(np_dtype).reshape(16, 1, 32)
    scales = rng.choice([0.5, 1.0, 3.0], (16, 1)).astype(np.float32)
    k_cache = QuantizedKV(_t(np.zeros_like(pool)), _t(np.zeros((16, 1), np.float32)), kv_dtype)
    v_cache = QuantizedKV(_t(pool), _t(scales), kv_dtype)
    meta = AttentionMetadata.build([1], [16], [[0]], 16, 1)
    q = _t(rng.standard_normal((1, 1, 32)).astype(np.float32))
    # K all zero: uniform weights, the output is the mean of the dequantized V rows
    got = backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=1.0)
    want = reference_decode_attention(q, k_cache, v_cache, meta, 1.0)
    np.testing.assert_allclose(_native(got), want.numpy(), rtol=1e-6, atol=1e-6)
    # as keys: the scores against every code weight distinct value rows
    values = rng.permutation(pool.reshape(-1)).reshape(pool.shape)
    qmax = 127.0 if kv_dtype == "int8" else 448.0
    k_cache, v_cache = v_cache, QuantizedKV(_t(values), _t(np.full((16, 1), 1 / qmax, np.float32)), kv_dtype)
    q = _t((rng.standard_normal((1, 1, 32)) * 1e-3).astype(np.float32))
    got = backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=1.0)
    want = reference_decode_attention(q, k_cache, v_cache, meta, 1.0)
    np.testing.assert_allclose(_native(got), want.numpy(), rtol=1e-5, atol=1e-5)


def _filled_pools(kv_dtype: str, num_blocks: int, block_size: int, num_kv: int, head_dim: int,
                  seed: int) -> tuple[Any, Any]:
    """Pools of ``kv_dtype`` with every slot written by the reference."""
    rng = np.random.default_rng(seed)
    shape = (num_blocks * block_size, num_kv, head_dim)
    k_cache, v_cache = reference_allocate_kv_cache(num_blocks, block_size, num_kv, head_dim, kv_dtype)
    scale = rng.choice([0.1, 1.0, 3.0], shape[:2])[..., None]  # rows of different scales
    k = (rng.standard_normal(shape) * scale).astype(np.float32)
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    reference_write_kv_cache(_t(k), _t(v), k_cache, v_cache, paddle.arange(shape[0], dtype="int64"))
    return k_cache, v_cache


CASES = [  # decodes, prefills, heads, kv_heads, head_dim, block_size, max_len
    (3, 0, 4, 2, 32, 16, 70),     # GQA 2
    (5, 2, 4, 4, 64, 16, 90),     # H = Hkv, prefills after decodes
    (2, 1, 16, 2, 128, 64, 200),  # the 0.3B shape, blocks past the 64-token chunk
    (1, 3, 8, 2, 128, 32, 150),
]


@pytest.mark.parametrize("kv_dtype", LOW)
@pytest.mark.parametrize("decodes,prefills,heads,kv_heads,head_dim,block_size,max_len", CASES)
def test_attention_matches_the_reference_over_the_same_pool(
    kv_dtype: str, decodes: int, prefills: int, heads: int, kv_heads: int, head_dim: int, block_size: int,
    max_len: int,
) -> None:
    rng = np.random.default_rng(decodes * 7 + heads)
    seq_lens = [int(n) for n in rng.integers(1, max_len + 1, decodes + prefills)]
    seq_lens[0] = max_len
    num_blocks, tables = shuffled_tables(rng, seq_lens, block_size)  # spare blocks: holes in the pool
    qlens = [1] * decodes + [int(rng.integers(1, n + 1)) for n in seq_lens[decodes:]]
    meta = AttentionMetadata.build(qlens, seq_lens, tables, block_size, decodes)
    k_cache, v_cache = _filled_pools(kv_dtype, num_blocks, block_size, kv_heads, head_dim, 5)
    q = _t(rng.standard_normal((sum(qlens), heads, head_dim)).astype(np.float32))
    scale = head_dim**-0.5
    got = backend.fd_decode_attention(q=q[:decodes], k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=scale)
    want = reference_decode_attention(q[:decodes], k_cache, v_cache, meta, scale)
    np.testing.assert_allclose(_native(got), want.numpy(), rtol=1e-5, atol=1e-5)
    if prefills:
        none: Any = None  # k, v: the op reads them from the cache they were written to
        got = backend.fd_prefill_attention(q=q[decodes:], k=none, v=none, k_cache=k_cache, v_cache=v_cache,
                                           metadata=meta, scale=scale)
        want = reference_prefill_attention(q[decodes:], None, None, k_cache, v_cache, meta, scale)
        np.testing.assert_allclose(_native(got), want.numpy(), rtol=1e-5, atol=1e-5)


def test_threads_do_not_change_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    import fd_x86.ops

    rng = np.random.default_rng(9)
    seq_lens = [300, 257, 190, 64, 5, 280, 120, 33]
    num_blocks, tables = shuffled_tables(rng, seq_lens, 64)
    meta = AttentionMetadata.build([1] * 8, seq_lens, tables, 64, 8)
    k_cache, v_cache = _filled_pools("int8", num_blocks, 64, 2, 128, 2)
    q = _t(rng.standard_normal((8, 16, 128)).astype(np.float32))
    outs = []
    for threads in (1, 2):
        monkeypatch.setattr(fd_x86.ops, "num_threads", lambda n=threads: n)
        meta.workspace.clear()
        outs.append(_native(backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta,
                                                        scale=0.09)))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("kv_dtype", LOW)
def test_without_avx512_the_reference_answers(kv_dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fd_x86.ops

    monkeypatch.setattr(fd_x86.ops, "_AVX512", [False])
    k_cache, v_cache = reference_allocate_kv_cache(2, 16, 1, 32, kv_dtype)
    x = _t(np.ones((2, 1, 32), np.float32))
    assert backend.fd_write_kv_cache(k=x, v=x, k_cache=k_cache, v_cache=v_cache,
                                     slot_mapping=_t(np.array([1, 2], np.int64))) is None
    meta = AttentionMetadata.build([1], [3], [[1]], 16, 1)
    assert backend.fd_decode_attention(q=_t(np.ones((1, 2, 32), np.float32)), k_cache=k_cache, v_cache=v_cache,
                                       metadata=meta, scale=1.0) is None
    fp32 = reference_allocate_kv_cache(2, 16, 1, 32, "float32")
    assert backend.fd_decode_attention(q=_t(np.ones((1, 2, 32), np.float32)), k_cache=fp32[0], v_cache=fp32[1],
                                       metadata=meta, scale=1.0) is not None


@pytest.mark.parametrize("k_dtype,v_dtype", [("bfloat16", "float16"), ("int8", "fp8"), ("float32", "int8")])
def test_a_pool_of_another_dtype_than_its_pair_is_left_to_the_reference(k_dtype: str, v_dtype: str) -> None:
    k_cache, _ = reference_allocate_kv_cache(2, 16, 1, 32, k_dtype)
    _, v_cache = reference_allocate_kv_cache(2, 16, 1, 32, v_dtype)
    x = _t(np.ones((1, 1, 32), np.float32))
    assert backend.fd_write_kv_cache(k=x, v=x, k_cache=k_cache, v_cache=v_cache,
                                     slot_mapping=_t(np.array([1], np.int64))) is None


@pytest.mark.parametrize("kv_dtype", LOW)
def test_tiny_model_same_greedy_tokens_as_the_reference(
    kv_dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fd_x86.ops

    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    calls: dict[str, int] = {}
    for name in ("decode_attention", "prefill_attention", "rope_and_write_kv_cache"):
        real = getattr(fd_x86.ops, name)

        def counted(*args, _real=real, _name=name):  # type: ignore[no-untyped-def]
            out = _real(*args)
            calls[_name] = calls.get(_name, 0) + (out is not None)
            return out

        monkeypatch.setattr(fd_x86.ops, name, counted)
    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=5, dtype="float32")
    rng = np.random.default_rng(4)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (3, 18, 40)]
    runs = {}
    for name in ("cpu", "x86"):
        runner = ModelRunner(model, get_backend(name), num_blocks=24, block_size=16, kv_cache_dtype=kv_dtype)
        runs[name], _ = greedy_generate(runner, prompts, 10, chunk_size=8)
    assert runs["x86"] == runs["cpu"]
    assert all(calls.get(name) for name in ("decode_attention", "prefill_attention", "rope_and_write_kv_cache")), calls
