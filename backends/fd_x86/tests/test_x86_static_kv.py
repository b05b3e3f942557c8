"""fd_x86 over an ``int8_static`` KV pool (FastDeploy's C8, static
per-channel scales: ``fd_core.ops.kv_dtype``): its write op stores the
reference's codes and unit scales bit for bit, its int8 attention reads the
pool like the reference, the fused rotate-and-store declines such a pool,
and a float tiny model whose layers carry static scales (built here, apart
from the quantized experts; the W4A8C8 checkpoint itself runs in
test_x86_offline.py) decodes the reference's greedy tokens, the write and
attention answered natively."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

from fd_core.ops.attention import (  # noqa: E402
    AttentionMetadata,
    reference_allocate_kv_cache,
    reference_decode_attention,
    reference_prefill_attention,
    reference_write_kv_cache,
)
from fd_core.ops.kv_dtype import StaticKVScales  # noqa: E402
from fd_core.ops.rope import rope_cos_sin  # noqa: E402

STATIC = "int8_static"


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


def _prescaled(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """What a static write gets (``x * 127 / S``): ties (k + 0.5, both signs),
    the floats one ulp either side of a tie, values past +-127."""
    x = rng.uniform(-200.0, 200.0, shape).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size // 4
    ties = (rng.integers(-130, 130, n) + 0.5).astype(np.float32)
    flat[:n] = ties
    flat[n:2 * n] = np.nextafter(ties, np.float32(np.inf))
    flat[2 * n:3 * n] = np.nextafter(ties, np.float32(-np.inf))
    return x


@pytest.mark.parametrize("head_dim", [32, 72, 128])
def test_static_write_stores_the_references_codes_and_unit_scales(head_dim: int) -> None:
    num_kv, block_size, tokens = 2, 16, 40
    rng = np.random.default_rng(head_dim)
    k, v = _prescaled(rng, (tokens, num_kv, head_dim)), _prescaled(rng, (tokens, num_kv, head_dim))
    slots = rng.permutation(4 * block_size)[:tokens].astype(np.int64)
    slots[5] = -1  # skipped
    got = reference_allocate_kv_cache(4, block_size, num_kv, head_dim, STATIC)
    want = reference_allocate_kv_cache(4, block_size, num_kv, head_dim, STATIC)
    assert backend.fd_write_kv_cache(k=_t(k), v=_t(v), k_cache=got[0], v_cache=got[1],
                                     slot_mapping=_t(slots)) is True
    reference_write_kv_cache(_t(k), _t(v), want[0], want[1], _t(slots))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.codes.numpy(), w.codes.numpy())
        np.testing.assert_array_equal(g.scales.numpy(), w.scales.numpy())
    kept = slots[slots >= 0]
    assert (got[0].scales.numpy()[kept] == 1.0).all()
    np.testing.assert_array_equal(got[0].codes.numpy()[kept], np.clip(np.rint(k[slots >= 0]), -127, 127))


def test_the_fused_rotate_and_store_declines_a_static_pool() -> None:
    caches = reference_allocate_kv_cache(2, 16, 1, 32, STATIC)
    qkv = _t(np.ones((2, 3 * 32), np.float32))
    assert backend.fd_rope_and_write_kv_cache(
        qkv=qkv, positions=_t(np.array([0, 1])), cos_sin=rope_cos_sin(32, 8, 10000.0), interleaved=True,
        num_heads=1, num_kv_heads=1, k_cache=caches[0], v_cache=caches[1],
        slot_mapping=_t(np.array([0, 1]))) is None


def test_attention_over_a_static_pool_matches_the_reference() -> None:
    rng = np.random.default_rng(7)
    heads, num_kv, head_dim, bs = 8, 2, 64, 16
    query_lens, seq_lens, tables = [1, 1, 9], [30, 5, 40], [[3, 0], [5], [1, 2, 4]]
    caches = reference_allocate_kv_cache(6, bs, num_kv, head_dim, STATIC)
    for r, table in enumerate(tables):
        slots = np.asarray([table[p // bs] * bs + p % bs for p in range(seq_lens[r])], np.int64)
        reference_write_kv_cache(_t(_prescaled(rng, (len(slots), num_kv, head_dim))),
                                 _t(_prescaled(rng, (len(slots), num_kv, head_dim))), *caches, _t(slots))
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, bs, 2)
    q = (rng.standard_normal((sum(query_lens), heads, head_dim)) * 0.02).astype(np.float32)  # S / 127 scaled
    got = backend.fd_decode_attention(q=_t(q[:2]), k_cache=caches[0], v_cache=caches[1], metadata=meta, scale=0.125)
    want = reference_decode_attention(_t(q[:2]), caches[0], caches[1], meta, 0.125)
    assert got is not None
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-3)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, bs, 2)
    got = backend.fd_prefill_attention(q=_t(q[2:]), k=_t(q[2:, :num_kv]), v=_t(q[2:, :num_kv]),
                                       k_cache=caches[0], v_cache=caches[1], metadata=meta, scale=0.125)
    want = reference_prefill_attention(_t(q[2:]), _t(q[2:, :num_kv]), _t(q[2:, :num_kv]), caches[0], caches[1],
                                       meta, 0.125)
    assert got is not None
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-3)


def _static_scales(runner: Any, seed: int) -> None:
    """Give every layer static KV scales: the per-channel max |k| / |v| of
    its qkv projection over random inputs (as a calibration would), times 1.1."""
    rng = np.random.default_rng(seed)
    for layer in runner.model.layers:
        attn = layer.self_attn
        w = attn.qkv_proj.weight.data.numpy().astype(np.float32)
        x = rng.standard_normal((256, w.shape[0])).astype(np.float32)
        proj = np.abs(x @ w)
        q, kv = attn.q_size, attn.kv_size
        s_k, s_v = proj[:, q:q + kv].max(axis=0) * 1.1, proj[:, q + kv:q + 2 * kv].max(axis=0) * 1.1
        attn.kv_scales = StaticKVScales(_t(s_k.astype(np.float32)), _t(s_v.astype(np.float32)))


def test_tiny_model_with_static_scales_same_greedy_tokens_as_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fd_x86.ops

    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    calls: dict[str, int] = {}
    for name in ("decode_attention", "prefill_attention", "write_kv_cache"):
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
        runner = ModelRunner(model, get_backend(name), num_blocks=24, block_size=16, kv_cache_dtype=STATIC)
        _static_scales(runner, 11)
        runs[name], _ = greedy_generate(runner, prompts, 10, chunk_size=8)
        assert all(cache.k.kv_dtype == STATIC for cache in runner.kv_caches)
    assert runs["x86"] == runs["cpu"]
    assert all(calls.get(name) for name in ("decode_attention", "prefill_attention", "write_kv_cache")), calls
