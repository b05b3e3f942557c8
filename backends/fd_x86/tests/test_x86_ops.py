"""The native decode ops (fd_x86.ops) against fd-core's reference kernels, the
hooks that route to them, their fallbacks, and a tiny model end to end."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from fd_x86 import backend, build
from paged_tables import shuffled_tables

paddle = pytest.importorskip("paddle")

from fd_core.ops.activation import reference_silu_and_mul  # noqa: E402
from fd_core.ops.attention import (  # noqa: E402
    AttentionMetadata,
    reference_decode_attention,
    reference_prefill_attention,
    reference_write_kv_cache,
)
from fd_core.ops.norm import reference_rms_norm  # noqa: E402
from fd_core.ops.rope import reference_rotary_embedding, rope_cos_sin  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    build.load_ops()  # builds once per key (~30-60 s), then cached in ~/.cache/fd_x86


def _t(a: np.ndarray) -> object:
    return paddle.to_tensor(a)


def _noncontiguous(a: np.ndarray) -> object:
    """``a`` as a strided (non-contiguous) paddle view."""
    wide = paddle.to_tensor(np.concatenate([a, np.zeros_like(a)], axis=-1))
    view = wide[..., : a.shape[-1]]
    assert not view.is_contiguous()
    return view


@pytest.mark.parametrize("shape", [(1, 1024), (5, 37), (13, 1000), (3, 4, 24), (64, 2048)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(shape: tuple[int, ...], with_residual: bool) -> None:
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(0, 2, shape).astype(np.float32)
    w = rng.normal(1, 0.1, shape[-1]).astype(np.float32)
    r = rng.normal(0, 1, shape).astype(np.float32) if with_residual else None
    got = backend.fd_rms_norm(x=_t(x), weight=_t(w), eps=1e-6, residual=None if r is None else _t(r))
    want = reference_rms_norm(_t(x), _t(w), 1e-6, None if r is None else _t(r))
    if r is None:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())  # x + residual, exact


def test_rms_norm_takes_strided_input_and_leaves_inputs_alone() -> None:
    rng = np.random.default_rng(1)
    x, r = rng.normal(0, 1, (4, 40)).astype(np.float32), rng.normal(0, 1, (4, 40)).astype(np.float32)
    w = np.ones(40, np.float32)
    xt, rt = _noncontiguous(x), _t(r)
    normed, total = backend.fd_rms_norm(x=xt, weight=_t(w), eps=1e-5, residual=rt)
    want_normed, want_total = reference_rms_norm(_t(x), _t(w), 1e-5, _t(r))
    np.testing.assert_allclose(normed.numpy(), want_normed.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(total.numpy(), want_total.numpy())
    np.testing.assert_array_equal(xt.numpy(), x)
    np.testing.assert_array_equal(rt.numpy(), r)


@pytest.mark.parametrize("shape", [(1, 6144), (3, 74), (40, 3000), (2, 3, 18)])
def test_silu_and_mul_matches_reference(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(shape[-1])
    x = rng.normal(0, 3, shape).astype(np.float32)
    x.reshape(-1)[:4] = [-100.0, 100.0, -88.5, 0.0]  # exp's clamps
    got = backend.fd_silu_and_mul(x=_t(x))
    want = reference_silu_and_mul(_t(x))
    assert list(got.shape) == list(want.shape)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(1, 16, 2, 128), (7, 5, 5, 6), (300, 4, 1, 64)])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_rotary_embedding_matches_reference(
    tokens: int, heads: int, kv_heads: int, head_dim: int, interleaved: bool, strided: bool
) -> None:
    rng = np.random.default_rng(tokens)
    q = rng.normal(0, 1, (tokens, heads, head_dim)).astype(np.float32)
    k = rng.normal(0, 1, (tokens, kv_heads, head_dim)).astype(np.float32)
    positions = _t(rng.integers(0, 2048, tokens).astype(np.int64))
    cos_sin = rope_cos_sin(head_dim, 2048, 500000.0)
    as_input = _noncontiguous if strided else _t
    qt, kt = as_input(q), as_input(k)
    got_q, got_k = backend.fd_rotary_embedding(q=qt, k=kt, positions=positions, cos_sin=cos_sin,
                                               interleaved=interleaved)
    want_q, want_k = reference_rotary_embedding(_t(q), _t(k), positions, cos_sin, interleaved)
    np.testing.assert_allclose(got_q.numpy(), want_q.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_k.numpy(), want_k.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(qt.numpy(), q)  # the inputs are not rotated in place


def test_rotary_embedding_rejects_positions_past_the_table() -> None:
    q, k = paddle.ones([2, 2, 8]), paddle.ones([2, 1, 8])
    with pytest.raises(Exception, match="outside the table"):
        backend.fd_rotary_embedding(q=q, k=k, positions=_t(np.array([0, 16], np.int64)),
                                    cos_sin=rope_cos_sin(8, 16, 10000.0), interleaved=True)


@pytest.mark.parametrize("tokens", [1, 13, 64])
def test_write_kv_cache_matches_reference_and_skips_slot_minus_one(tokens: int) -> None:
    rng = np.random.default_rng(tokens)
    rows, kv_heads, head_dim = 8 * 16, 2, 24
    k = rng.normal(0, 1, (tokens, kv_heads, head_dim)).astype(np.float32)
    v = rng.normal(0, 1, (tokens, kv_heads, head_dim)).astype(np.float32)
    slots = rng.permutation(rows)[:tokens].astype(np.int64)
    slots[::3] = -1
    start = rng.normal(0, 1, (rows, kv_heads, head_dim)).astype(np.float32)
    k_cache, v_cache = _t(start), _t(start * 2)
    assert backend.fd_write_kv_cache(k=_t(k), v=_t(v), k_cache=k_cache, v_cache=v_cache,
                                     slot_mapping=_t(slots)) is True
    want_k, want_v = _t(start), _t(start * 2)
    reference_write_kv_cache(_t(k), _t(v), want_k, want_v, _t(slots))
    np.testing.assert_array_equal(k_cache.numpy(), want_k.numpy())
    np.testing.assert_array_equal(v_cache.numpy(), want_v.numpy())


def test_write_kv_cache_rejects_a_slot_past_the_cache() -> None:
    cache = paddle.zeros([32, 1, 8])
    with pytest.raises(Exception, match="past the cache"):
        backend.fd_write_kv_cache(k=paddle.ones([1, 1, 8]), v=paddle.ones([1, 1, 8]), k_cache=cache,
                                  v_cache=paddle.zeros([32, 1, 8]), slot_mapping=_t(np.array([32], np.int64)))


def _decode_case(batch: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_len: int,
                 seed: int, prefills: int = 0, max_chunk: int = 5) -> tuple:
    """Caches filled with random rows, shuffled block tables, partially
    filled last blocks; ``prefills`` requests after the ``batch`` decodes,
    each a chunk of up to ``max_chunk`` new tokens after cached context."""
    rng = np.random.default_rng(seed)
    seq_lens = rng.integers(1, max_len + 1, batch + prefills)
    seq_lens[0] = max_len
    num_blocks, tables = shuffled_tables(rng, [int(n) for n in seq_lens], block_size)
    qlens = [1] * batch + [int(rng.integers(1, min(max_chunk, int(n)) + 1)) for n in seq_lens[batch:]]
    if prefills:
        qlens[-1] = int(seq_lens[-1])  # a whole prompt, no cached context
    meta = AttentionMetadata.build(qlens, [int(n) for n in seq_lens], tables, block_size, batch)
    shape = (num_blocks * block_size, kv_heads, head_dim)
    k_cache = _t(rng.normal(0, 1, shape).astype(np.float32))
    v_cache = _t(rng.normal(0, 1, shape).astype(np.float32))
    q = _t(rng.normal(0, 1, (batch, heads, head_dim)).astype(np.float32))
    return q, k_cache, v_cache, meta


def _has_avx512() -> bool:
    from fd_x86.cpu import cpu_features

    return cpu_features().has("avx512f", "avx512bw", "avx512vl", "avx512dq")


@pytest.fixture(params=["avx2", "avx512"])
def attention_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs an attention test with each kernel (x86_ops.cc reads
    FD_X86_ATTENTION_ISA on every call; unset, it picks the best)."""
    if request.param == "avx512" and not _has_avx512():
        pytest.skip("this CPU lacks AVX-512 F/BW/VL/DQ")
    monkeypatch.setenv("FD_X86_ATTENTION_ISA", request.param)
    return str(request.param)


@pytest.mark.parametrize("batch,heads,kv_heads,head_dim,block_size,max_len", [
    (1, 16, 2, 128, 64, 130),   # the 0.3B shape: G = 8
    (5, 8, 2, 64, 16, 77),      # G = 4
    (37, 3, 3, 8, 16, 40),      # G = 1, odd batch and head count
    (8, 16, 2, 128, 64, 260),
    (3, 4, 1, 32, 128, 300),    # blocks larger than the 64-token chunk
    (4, 16, 2, 80, 64, 200),    # Dh = 80: not a power of two
    (3, 8, 1, 24, 16, 100),     # Dh = 24: a half vector past the last 16
    (6, 14, 2, 72, 32, 150),    # G = 7: an odd number of rows per kv head
    (33, 16, 2, 128, 64, 97),   # more items than one pass of threads; lengths not multiples of 8
])
def test_decode_attention_matches_reference(
    batch: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_len: int, attention_isa: str
) -> None:
    q, k_cache, v_cache, meta = _decode_case(batch, heads, kv_heads, head_dim, block_size, max_len, batch)
    scale = head_dim**-0.5
    got = backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=scale)
    assert "x86.decode" in meta.workspace  # the tables, for the next layers
    want = reference_decode_attention(q, k_cache, v_cache, meta, scale)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5)
    again = backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=scale)
    np.testing.assert_array_equal(again.numpy(), got.numpy())


def test_decode_attention_long_context_with_prefills_in_the_step(attention_isa: str) -> None:
    q, k_cache, v_cache, meta = _decode_case(3, 8, 1, 128, 64, 1500, 5, prefills=2)
    got = backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=0.3)
    want = reference_decode_attention(q, k_cache, v_cache, meta, 0.3)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5)


def test_decode_attention_large_scores_stay_finite(attention_isa: str) -> None:
    q, k_cache, v_cache, meta = _decode_case(2, 4, 2, 16, 16, 50, 9)
    got = backend.fd_decode_attention(q=q * 40, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=1.0)
    want = reference_decode_attention(q * 40, k_cache, v_cache, meta, 1.0)
    assert np.isfinite(got.numpy()).all()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_decode_attention_rejects_a_block_outside_the_cache() -> None:
    q, k_cache, v_cache, _ = _decode_case(1, 2, 1, 8, 16, 20, 2)
    rows = k_cache.shape[0]
    meta = AttentionMetadata.build([1], [20], [[0, rows // 16]], 16, 1)
    with pytest.raises(Exception, match="names block"):
        backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=1.0)


@pytest.mark.parametrize("decodes,prefills,heads,kv_heads,head_dim,block_size,max_len,max_chunk", [
    (0, 1, 16, 2, 128, 64, 130, 130),  # one whole prompt, the 0.3B shape
    (2, 3, 8, 2, 64, 16, 77, 40),      # G = 4, chunks after cached context, decodes first
    (0, 7, 3, 3, 8, 16, 40, 40),       # G = 1, odd head count
    (1, 2, 4, 1, 32, 128, 300, 300),   # blocks larger than the 64-token chunk
    (0, 2, 16, 2, 80, 64, 200, 90),    # Dh = 80
    (1, 3, 12, 4, 72, 16, 70, 33),     # G = 3, Dh = 72
    (0, 2, 7, 1, 48, 16, 70, 70),      # G = 7: tiles of 4 tokens = 28 rows
])
def test_prefill_attention_matches_reference(
    decodes: int, prefills: int, heads: int, kv_heads: int, head_dim: int, block_size: int, max_len: int,
    max_chunk: int, attention_isa: str,
) -> None:
    _, k_cache, v_cache, meta = _decode_case(decodes, heads, kv_heads, head_dim, block_size, max_len,
                                             prefills + 10 * decodes, prefills, max_chunk)
    rng = np.random.default_rng(prefills)
    tokens = int(meta.query_lens[decodes:].sum())
    q = _t(rng.normal(0, 1, (tokens, heads, head_dim)).astype(np.float32))
    kv = _t(rng.normal(0, 1, (tokens, kv_heads, head_dim)).astype(np.float32))  # unused: read from the cache
    scale = head_dim**-0.5
    got = backend.fd_prefill_attention(q=q, k=kv, v=kv, k_cache=k_cache, v_cache=v_cache, metadata=meta,
                                       scale=scale)
    assert "x86.prefill" in meta.workspace
    want = reference_prefill_attention(q, kv, kv, k_cache, v_cache, meta, scale)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5)


def test_prefill_attention_long_prompt_after_long_context(attention_isa: str) -> None:
    rng = np.random.default_rng(0)
    order = [int(b) for b in rng.permutation(48)]  # blocks of 64
    meta = AttentionMetadata.build([1, 300], [1400, 1300], [order[:22], order[22:43]], 64, 1)
    k_cache, v_cache = (_t(rng.normal(0, 1, (48 * 64, 2, 64)).astype(np.float32)) for _ in range(2))
    q = _t(rng.normal(0, 1, (300, 8, 64)).astype(np.float32))
    got = backend.fd_prefill_attention(q=q, k=None, v=None, k_cache=k_cache, v_cache=v_cache, metadata=meta,
                                       scale=0.125)
    want = reference_prefill_attention(q, None, None, k_cache, v_cache, meta, 0.125)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5)


def test_attention_kernels_agree_and_threads_do_not_change_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _has_avx512():
        pytest.skip("this CPU lacks AVX-512 F/BW/VL/DQ")
    from fd_x86.build import load_ops

    q, k_cache, v_cache, meta = _decode_case(32, 16, 2, 128, 64, 1000, 11)
    tables = _t(np.ascontiguousarray(meta.block_tables[:32], dtype=np.int64))
    lens = _t(np.ascontiguousarray(meta.seq_lens[:32], dtype=np.int64))
    got = {}
    for isa in ("avx2", "avx512"):
        monkeypatch.setenv("FD_X86_ATTENTION_ISA", isa)
        for threads in (1, 2):
            got[isa, threads] = load_ops().fd_x86_decode_attention(q, k_cache, v_cache, tables, lens, 64, 0.09,
                                                                   threads).numpy()
    np.testing.assert_array_equal(got["avx2", 1], got["avx2", 2])
    np.testing.assert_array_equal(got["avx512", 1], got["avx512", 2])
    np.testing.assert_allclose(got["avx512", 1], got["avx2", 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qlens,seq_lens", [
    ([4], [150]),             # one tile: split by kv head across threads
    ([40, 3, 1], [170, 3, 90]),  # many tiles: each thread a range of whole tiles
])
def test_prefill_attention_threads_do_not_change_the_answer(
    qlens: list[int], seq_lens: list[int], attention_isa: str
) -> None:
    from fd_x86.build import load_ops

    rng = np.random.default_rng(len(qlens))
    bs, need = 64, [(n + 63) // 64 for n in seq_lens]
    order = [int(b) for b in rng.permutation(sum(need) + 2)]
    tables, used = [], 0
    for n in need:
        tables.append(order[used:used + n])
        used += n
    meta = AttentionMetadata.build(qlens, seq_lens, tables, bs, 0)
    k_cache, v_cache = (_t(rng.normal(0, 1, ((sum(need) + 2) * bs, 2, 128)).astype(np.float32)) for _ in range(2))
    q = _t(rng.normal(0, 1, (sum(qlens), 16, 128)).astype(np.float32))
    width = max(need)
    tab = _t(np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int64))
    lens = _t(np.array(seq_lens, dtype=np.int64))
    ql = _t(np.array(qlens, dtype=np.int64))
    got = [load_ops().fd_x86_prefill_attention(q, k_cache, v_cache, tab, lens, ql, bs, 0.088, threads).numpy()
           for threads in (1, 2)]
    np.testing.assert_array_equal(got[0], got[1])
    want = reference_prefill_attention(q, None, None, k_cache, v_cache, meta, 0.088)
    np.testing.assert_allclose(got[0], want.numpy(), rtol=2e-5, atol=2e-5)


def test_hooks_leave_other_dtypes_and_shapes_to_the_reference() -> None:
    x64 = paddle.ones([2, 8], dtype="float64")
    assert backend.fd_rms_norm(x=x64, weight=paddle.ones([8], dtype="float64"), eps=1e-6, residual=None) is None
    assert backend.fd_silu_and_mul(x=x64) is None
    assert backend.fd_silu_and_mul(x=paddle.ones([2, 7])) is None  # odd last axis
    q, k_cache, v_cache, meta = _decode_case(1, 2, 1, 12, 16, 20, 3)  # Dh not a multiple of 8
    assert backend.fd_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, metadata=meta, scale=1.0) is None
    half = paddle.ones([2, 1, 8], dtype="float16")
    assert backend.fd_write_kv_cache(k=half, v=half, k_cache=half, v_cache=half,
                                     slot_mapping=_t(np.array([0, 1], np.int64))) is None


def test_build_failure_is_logged_once_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import fd_x86.ops

    def fail() -> None:
        raise build.BuildError("no compiler here")

    monkeypatch.setattr(fd_x86.ops, "load_ops", fail)
    monkeypatch.setattr(backend, "_build_failed", [])
    x = paddle.ones([2, 16])
    with caplog.at_level(logging.WARNING, logger="fd_x86.backend"):
        for _ in range(2):
            assert backend.fd_rms_norm(x=x, weight=paddle.ones([16]), eps=1e-6, residual=None) is None
            assert backend.fd_silu_and_mul(x=x) is None
    assert [r.message for r in caplog.records].count(
        "fd_x86: no compiler here; the native ops fall back to fd-core's reference") == 1


def test_tiny_model_same_greedy_tokens_as_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fd_x86.ops

    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    calls: dict[str, int] = {}
    for name in fd_x86.ops.__all__:  # count the native answers
        real = getattr(fd_x86.ops, name)

        def counted(*args, _real=real, _name=name):  # type: ignore[no-untyped-def]
            out = _real(*args)
            calls[_name] = calls.get(_name, 0) + (out is not None)
            return out

        monkeypatch.setattr(fd_x86.ops, name, counted)
    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=5, dtype="float32")
    rng = np.random.default_rng(4)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (3, 18, 40)]
    want, _ = greedy_generate(ModelRunner(model, get_backend("cpu"), num_blocks=24, block_size=16),
                              prompts, 10, chunk_size=8)
    got, _ = greedy_generate(ModelRunner(model, get_backend("x86"), num_blocks=24, block_size=16),
                             prompts, 10, chunk_size=8)
    assert got == want
    # the model stores k/v through the fused op; the unfused rotary / write are its fallback
    unfused = {"rotary_embedding", "write_kv_cache"}
    assert {name for name, n in calls.items() if n} == set(fd_x86.ops.__all__) - unfused, calls
