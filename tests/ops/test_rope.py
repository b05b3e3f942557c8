"""rotary_embedding: interleaved (ERNIE 4.5) and NeoX pairs, at ragged positions."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
import torch
from transformers import Ernie4_5Config
from transformers.models.ernie4_5 import modeling_ernie4_5 as hf_ernie

from fd_core.ops.rope import rope_cos_sin

from . import numpy_ref as ref

MAX_POS = 512


def _ragged_positions(rng: np.random.Generator) -> np.ndarray:
    # a step's tokens: a prefill chunk after context, decodes far apart, a fresh prompt
    chunks = [np.arange(37, 37 + rng.integers(3, 9)), [int(rng.integers(0, MAX_POS))],
              np.arange(0, rng.integers(2, 6)), [MAX_POS - 1], [int(rng.integers(0, MAX_POS))]]
    positions = np.concatenate([np.asarray(c, dtype=np.int64) for c in chunks])
    return positions[rng.permutation(len(positions))]


def _qk(rng, tokens, heads, kv_heads, head_dim):
    q = rng.normal(size=(tokens, heads, head_dim)).astype(np.float32)
    k = rng.normal(size=(tokens, kv_heads, head_dim)).astype(np.float32)
    return q, k


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rope_cos_sin_table(theta, head_dim):
    table = rope_cos_sin(head_dim, MAX_POS, theta).numpy()
    assert table.shape == (MAX_POS, head_dim) and table.dtype == np.float32
    # fp32 angles drift by ~pos * eps; the table is computed in fp32 like HF
    np.testing.assert_allclose(table, ref.rope_table(head_dim, MAX_POS, theta), atol=1e-4)


@pytest.mark.parametrize("head_dim,theta", [(16, 500000.0), (128, 10000.0)])
def test_rope_cos_sin_matches_hf_ernie4_5_table(head_dim, theta):
    config = Ernie4_5Config(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                            rope_theta=theta, max_position_embeddings=MAX_POS)
    positions = torch.tensor([[0, 1, 7, 300, MAX_POS - 1]])
    # fp32 angles: the two tables differ by a few ulp of the angle at large positions
    cos, sin = hf_ernie.Ernie4_5RotaryEmbedding(config)(torch.zeros(1), positions)  # [1, 5, Dh]
    half = head_dim // 2
    table = rope_cos_sin(head_dim, MAX_POS, theta).numpy()[positions[0].numpy()]
    np.testing.assert_allclose(table[:, :half], cos[0, :, :half].numpy(), atol=5e-5)
    np.testing.assert_allclose(table[:, half:], sin[0, :, :half].numpy(), atol=5e-5)


def test_rope_cos_sin_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even head_dim"):
        rope_cos_sin(7, 16, 10000.0)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("seed,heads,kv_heads,head_dim", [(0, 4, 2, 8), (1, 8, 1, 32), (2, 3, 3, 64)])
def test_rotary_embedding_matches_numpy(ops, interleaved, seed, heads, kv_heads, head_dim):
    rng = np.random.default_rng(seed)
    positions = _ragged_positions(rng)
    q, k = _qk(rng, len(positions), heads, kv_heads, head_dim)
    table = rope_cos_sin(head_dim, MAX_POS, 10000.0)
    table_np = table.numpy()
    q_out, k_out = ops.rotary_embedding(
        paddle.to_tensor(q), paddle.to_tensor(k), paddle.to_tensor(positions), table, interleaved
    )
    np.testing.assert_allclose(q_out.numpy(), ref.rotary_embedding(q, positions, table_np, interleaved),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k_out.numpy(), ref.rotary_embedding(k, positions, table_np, interleaved),
                               rtol=1e-5, atol=1e-5)


def test_interleaved_and_neox_differ(ops):
    # guards against a kernel that ignores the flag
    rng = np.random.default_rng(7)
    positions = np.array([3, 11], dtype=np.int64)
    q, k = _qk(rng, 2, 2, 2, 16)
    table = rope_cos_sin(16, 32, 10000.0)
    args = (paddle.to_tensor(q), paddle.to_tensor(k), paddle.to_tensor(positions), table)
    inter, _ = ops.rotary_embedding(*args, True)
    neox, _ = ops.rotary_embedding(*args, False)
    assert np.abs(inter.numpy() - neox.numpy()).max() > 0.1


def test_position_zero_is_identity(ops):
    rng = np.random.default_rng(3)
    q, k = _qk(rng, 3, 2, 1, 16)
    table = rope_cos_sin(16, 8, 10000.0)
    for interleaved in (True, False):
        q_out, k_out = ops.rotary_embedding(paddle.to_tensor(q), paddle.to_tensor(k),
                                            paddle.zeros([3], dtype="int64"), table, interleaved)
        np.testing.assert_allclose(q_out.numpy(), q, atol=1e-7)
        np.testing.assert_allclose(k_out.numpy(), k, atol=1e-7)


@pytest.mark.parametrize("seed,heads,kv_heads,head_dim", [(0, 4, 2, 16), (1, 16, 2, 128), (2, 2, 1, 64)])
def test_interleaved_matches_hf_ernie4_5(ops, seed, heads, kv_heads, head_dim):
    rng = np.random.default_rng(seed)
    positions = _ragged_positions(rng)
    q, k = _qk(rng, len(positions), heads, kv_heads, head_dim)
    table = rope_cos_sin(head_dim, MAX_POS, 500000.0)
    q_out, k_out = ops.rotary_embedding(
        paddle.to_tensor(q), paddle.to_tensor(k), paddle.to_tensor(positions), table, True
    )
    # HF wants cos/sin [.., Dh] = cat(freqs, freqs) and q [B, H, S, Dh]
    half = head_dim // 2
    rows = torch.from_numpy(table.numpy()[positions])
    cos = torch.cat([rows[:, :half], rows[:, :half]], dim=-1)[None]  # [1, T, Dh]
    sin = torch.cat([rows[:, half:], rows[:, half:]], dim=-1)[None]
    hf_q, hf_k = hf_ernie.apply_rotary_pos_emb(
        torch.from_numpy(q).transpose(0, 1)[None], torch.from_numpy(k).transpose(0, 1)[None], cos, sin
    )
    np.testing.assert_allclose(q_out.numpy(), hf_q[0].transpose(0, 1).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k_out.numpy(), hf_k[0].transpose(0, 1).numpy(), rtol=1e-5, atol=1e-5)
