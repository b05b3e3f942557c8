"""Paged attention: metadata, cache write, prefill and decode against dense numpy attention.

Each scenario gives every request a dense K/V history, scatters it over
shuffled cache blocks (filled with garbage first, so reading past a
sequence shows), writes the context in earlier "steps", then runs one step
(decodes first, then prefills) and compares every request's output with
causal attention over its dense history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import paddle
import pytest

from fd_core.ops.attention import AttentionMetadata

from . import numpy_ref as ref


@dataclass
class Req:
    seq_len: int  # tokens in the cache after this step
    query_len: int  # new tokens this step
    share: tuple[int, int] | None = None  # (owner request, leading blocks shared): a prefix hit
    extra_blocks: int = 0  # table entries allocated beyond the sequence


@dataclass
class Scenario:
    name: str
    reqs: list[Req]
    num_decodes: int
    heads: int
    kv_heads: int
    head_dim: int = 16
    block_size: int = 16
    layers: int = 1


SCENARIOS = [
    Scenario("gqa_mixed", [Req(17, 1), Req(32, 1), Req(5, 1), Req(40, 40), Req(50, 10), Req(1, 1)],
             num_decodes=3, heads=8, kv_heads=2),
    Scenario("mha_prefill_only", [Req(16, 16), Req(33, 7), Req(3, 3), Req(48, 1, extra_blocks=2)],
             num_decodes=0, heads=4, kv_heads=4, head_dim=32),
    Scenario("mqa_decode_only", [Req(64, 1), Req(1, 1), Req(130, 1, extra_blocks=1), Req(200, 1)],
             num_decodes=4, heads=4, kv_heads=1, block_size=64),
    Scenario("prefix_hits", [Req(70, 1), Req(60, 28, share=(0, 2)), Req(40, 8, share=(0, 2)),
                             Req(33, 1, share=(0, 2)), Req(16, 16)],
             num_decodes=1, heads=8, kv_heads=2),
    Scenario("block64_mixed", [Req(128, 1), Req(65, 1), Req(200, 100), Req(64, 64, extra_blocks=1),
                               Req(129, 2)],
             num_decodes=2, heads=6, kv_heads=2, block_size=64, head_dim=8),
    Scenario("single_token_prefill", [Req(1, 1)], num_decodes=0, heads=2, kv_heads=1),
    Scenario("two_layers_share_metadata", [Req(20, 1), Req(23, 5)], num_decodes=1, heads=4,
             kv_heads=2, layers=2),
]


def _allocate_tables(reqs: list[Req], block_size: int, rng) -> tuple[list[list[int]], int]:
    own = []
    for r in reqs:
        shared = r.share[1] if r.share else 0
        own.append(math.ceil(r.seq_len / block_size) - shared + r.extra_blocks)
    num_blocks = sum(own) + 3  # a few blocks nobody owns
    pool = [int(b) for b in rng.permutation(num_blocks)]
    tables: list[list[int]] = []
    for r, n in zip(reqs, own):
        prefix = tables[r.share[0]][: r.share[1]] if r.share else []
        tables.append(prefix + [pool.pop() for _ in range(n)])
    return tables, num_blocks


def _expected_slots(query_lens, seq_lens, tables, block_size):
    pos, slots = [], []
    for q, s, table in zip(query_lens, seq_lens, tables):
        for p in range(s - q, s):
            pos.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
    return np.array(pos), np.array(slots)


def _build_checked(query_lens, seq_lens, tables, block_size, num_decodes) -> AttentionMetadata:
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, num_decodes)
    pos, slots = _expected_slots(query_lens, seq_lens, tables, block_size)
    np.testing.assert_array_equal(meta.positions.numpy(), pos)
    np.testing.assert_array_equal(meta.slot_mapping.numpy(), slots)
    assert meta.num_tokens == sum(query_lens) and meta.num_reqs == len(query_lens)
    return meta


def _t(a: np.ndarray):
    return paddle.to_tensor(np.ascontiguousarray(a))


def _run(ops, sc: Scenario, seed: int) -> None:
    rng = np.random.default_rng(seed)
    bs, hkv, dh = sc.block_size, sc.kv_heads, sc.head_dim
    tables, num_blocks = _allocate_tables(sc.reqs, bs, rng)
    scale = 1.0 / math.sqrt(dh)

    layers = []
    for _ in range(sc.layers):
        hist = []
        for r in sc.reqs:
            k, v = rng.normal(size=(2, r.seq_len, hkv, dh)).astype(np.float32)
            if r.share:  # a prefix hit holds the owner's tokens
                owner_k, owner_v = hist[r.share[0]]
                n = r.share[1] * bs
                k[:n], v[:n] = owner_k[:n], owner_v[:n]
            hist.append((k, v))
        k_cache, v_cache = ops.allocate_kv_cache(num_blocks, bs, hkv, dh, "float32")
        garbage = rng.normal(0, 5, size=(2, num_blocks * bs, hkv, dh)).astype(np.float32)
        ops.write_kv_cache(_t(garbage[0]), _t(garbage[1]), k_cache, v_cache,
                           paddle.arange(num_blocks * bs, dtype="int64"))
        layers.append((hist, k_cache, v_cache))

    # earlier steps: each request's context (past any shared prefix), in two chunks
    starts = [r.share[1] * bs if r.share else 0 for r in sc.reqs]
    ends = [r.seq_len - r.query_len for r in sc.reqs]
    for r, s in zip(sc.reqs, starts):
        assert s <= r.seq_len - r.query_len, "a prefix hit must not cover new tokens"
    for step in range(2):
        bounds = [(s + (e - s) // 2 * step, s + (e - s) // 2 if step == 0 else e)
                  for s, e in zip(starts, ends)]
        live = [i for i, (lo, hi) in enumerate(bounds) if hi > lo]
        if not live:
            continue
        meta = _build_checked([bounds[i][1] - bounds[i][0] for i in live], [bounds[i][1] for i in live],
                              [tables[i] for i in live], bs, 0)
        for hist, k_cache, v_cache in layers:
            k = np.concatenate([hist[i][0][bounds[i][0]:bounds[i][1]] for i in live])
            v = np.concatenate([hist[i][1][bounds[i][0]:bounds[i][1]] for i in live])
            ops.write_kv_cache(_t(k), _t(v), k_cache, v_cache, meta.slot_mapping)

    # this step
    qlens = [r.query_len for r in sc.reqs]
    slens = [r.seq_len for r in sc.reqs]
    meta = _build_checked(qlens, slens, tables, bs, sc.num_decodes)
    nd = sc.num_decodes
    for hist, k_cache, v_cache in layers:
        q = rng.normal(size=(sum(qlens), sc.heads, dh)).astype(np.float32)
        k_new = np.concatenate([k[s - ql:] for (k, _), s, ql in zip(hist, slens, qlens)])
        v_new = np.concatenate([v[s - ql:] for (_, v), s, ql in zip(hist, slens, qlens)])
        ops.write_kv_cache(_t(k_new), _t(v_new), k_cache, v_cache, meta.slot_mapping)
        outs = []
        if nd:
            out = ops.decode_attention(_t(q[:nd]), k_cache, v_cache, meta, scale)
            assert out.shape == [nd, sc.heads, dh]
            outs.append(out.numpy())
        if nd < len(sc.reqs):
            out = ops.prefill_attention(_t(q[nd:]), _t(k_new[nd:]), _t(v_new[nd:]), k_cache, v_cache,
                                        meta, scale)
            assert out.shape == [sum(qlens[nd:]), sc.heads, dh]
            outs.append(out.numpy())
        got = np.concatenate(outs)
        start = 0
        for i, ((k, v), ql) in enumerate(zip(hist, qlens)):
            want = ref.causal_attention(q[start:start + ql], k, v, scale)
            np.testing.assert_allclose(got[start:start + ql], want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{sc.name}: request {i}")
            start += ql


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_paged_attention_matches_dense(ops, sc, seed):
    _run(ops, sc, seed)


def test_build_positions_and_slots_by_hand():
    # one decode at position 5 (block 7), a 3-token chunk after 14 cached tokens crossing a block
    meta = AttentionMetadata.build([1, 3], [6, 17], [[7], [2, 9, 4]], block_size=8, num_decodes=1)
    np.testing.assert_array_equal(meta.positions.numpy(), [5, 14, 15, 16])
    np.testing.assert_array_equal(meta.slot_mapping.numpy(), [7 * 8 + 5, 9 * 8 + 6, 9 * 8 + 7, 4 * 8 + 0])
    assert meta.slot_mapping.dtype == paddle.int64 and meta.positions.dtype == paddle.int64


@pytest.mark.parametrize("query_lens,seq_lens,tables,num_decodes,reason", [
    ([5], [4], [[0]], 0, "bad step"),  # query_len > seq_len
    ([0], [4], [[0]], 0, "bad step"),  # a request with no new token
    ([2, 3], [9, 3], [[0, 1], [2]], 1, "one token"),  # a decode with two tokens
    ([1, 1], [9, 3], [[0], [1]], 2, "too short"),  # 9 tokens need two blocks of 8
    ([4], [17], [[0, 1]], 0, "too short"),  # a chunk reaching into a third block
])
def test_build_rejects_bad_steps(query_lens, seq_lens, tables, num_decodes, reason):
    with pytest.raises(ValueError, match=reason):
        AttentionMetadata.build(query_lens, seq_lens, tables, 8, num_decodes)


def test_write_kv_cache_skips_slot_minus_one(ops):
    rng = np.random.default_rng(0)
    k_cache, v_cache = ops.allocate_kv_cache(2, 4, 2, 3, "float32")
    assert k_cache.shape == [8, 2, 3]  # the reference layout, one row per slot
    before_k = rng.normal(size=(8, 2, 3)).astype(np.float32)
    before_v = rng.normal(size=(8, 2, 3)).astype(np.float32)
    ops.write_kv_cache(_t(before_k), _t(before_v), k_cache, v_cache, paddle.arange(8, dtype="int64"))
    k, v = rng.normal(size=(2, 4, 2, 3)).astype(np.float32)
    ops.write_kv_cache(_t(k), _t(v), k_cache, v_cache, paddle.to_tensor([6, -1, 1, -1], dtype="int64"))
    want_k, want_v = before_k.copy(), before_v.copy()
    want_k[6], want_k[1], want_v[6], want_v[1] = k[0], k[2], v[0], v[2]
    np.testing.assert_array_equal(k_cache.numpy(), want_k)
    np.testing.assert_array_equal(v_cache.numpy(), want_v)


def test_write_kv_cache_all_padding_is_a_no_op(ops):
    k_cache, v_cache = ops.allocate_kv_cache(1, 4, 1, 2, "float32")
    ops.write_kv_cache(paddle.ones([2, 1, 2]), paddle.ones([2, 1, 2]), k_cache, v_cache,
                       paddle.to_tensor([-1, -1], dtype="int64"))
    assert not k_cache.numpy().any() and not v_cache.numpy().any()
