"""The MTP drafter's draft logits against an independent numpy forward of ERNIE's
MTP block, read from the raw safetensors bytes (the real correctness test:
verification hides drafter bugs). The drafts are checked at every step of a
generation, for k = 1 and k = 2 (the second draft runs the block on its own
output), with oracle drafts forcing accepted positions into the block's KV sync."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fd_core import LLM, SamplingParams
from fd_core.engine.model_runner import ModelRunner, StepInput

NEW = 10


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of one file as fp32 (bf16 widened bit by bit), parsed by hand."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8: 8 + n])
    data = raw[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        a, b = entry["data_offsets"]
        buf = data[a:b]
        if entry["dtype"] == "BF16":
            bits = np.frombuffer(buf, "<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(buf, {"F32": "<f4", "F16": "<f2"}[entry["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(entry["shape"]).astype(np.float64)
    return out


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """Interleaved rotary embedding (pairs 2i, 2i+1), as HF's ERNIE 4.5: x [T, heads, d]."""
    d = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, d, 2) / d)  # [T, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def _mtp_reference(w: dict[str, np.ndarray], cfg: dict, hidden: np.ndarray, next_ids: list[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..T-1 of the block (causal), PyTorch naming: logits [T, V], normed output [T, H]."""
    eps, heads, kvh, d = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    emb = w["model.embed_tokens.weight"]
    p = "model.mtp_block.0."
    z = np.concatenate([_rms(emb[next_ids], w["model.mtp_emb_norm.0.weight"], eps),
                        _rms(hidden, w["model.mtp_hidden_norm.0.weight"], eps)], axis=-1)
    g = z @ w["model.mtp_linear_proj.0.weight"].T
    t = len(next_ids)
    x = _rms(g, w[p + "input_layernorm.weight"], eps)
    pos = np.arange(t, dtype=np.float64)
    q = _rope((x @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, d), pos, cfg["rope_theta"])
    k = _rope((x @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kvh, d), pos, cfg["rope_theta"])
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kvh, d)
    attn = np.empty((t, heads, d))
    mask = np.tril(np.ones((t, t), bool))
    for h in range(heads):
        kv = h // (heads // kvh)
        s = q[:, h] @ k[:, kv].T / np.sqrt(d)
        s = np.where(mask, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        attn[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
    r = g + attn.reshape(t, heads * d) @ w[p + "self_attn.o_proj.weight"].T
    x = _rms(r, w[p + "post_attention_layernorm.weight"], eps)
    gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    out = r + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    normed = _rms(out, w["model.norm.weight"], eps)
    return normed @ emb.T, normed  # tied LM head


def _target_hidden(model_dir: Path, tokens: list[int], cpu_backend) -> np.ndarray:
    """The target's final-normed hidden states over ``tokens`` (one prefill)."""
    runner = ModelRunner(model_dir, cpu_backend, num_blocks=16, block_size=16, dtype="float32")
    runner.model.keep_hidden = True
    blocks = list(range(1, (len(tokens) + 15) // 16 + 1))
    runner.execute(StepInput([tokens], [len(tokens)], [blocks], 0, [True]))
    return runner.model.last_hidden.numpy().astype(np.float64)


@pytest.mark.parametrize("oracle", [False, True], ids=["own-drafts", "oracle-drafts"])
@pytest.mark.parametrize("k", [1, 2])
def test_draft_logits_equal_numpy_reference(checkpoint_factory, cpu_backend, k, oracle):
    model_dir = checkpoint_factory("tiny-dense", "pytorch", num_nextn_predict_layers=1)
    cfg = json.loads((model_dir / "config.json").read_text())
    weights = _read_safetensors(model_dir / "model.safetensors")
    prompt = [int(t) for t in np.random.default_rng(3).integers(100, 2000, 21)]
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    base = dict(backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16, dtype="float32")
    expected = LLM(str(model_dir), **base).generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(str(model_dir), speculative_config={"method": "mtp", "num_speculative_tokens": k}, **base)
    core = llm.engine.core
    drafter = core.spec.proposer
    drafter.record_logits = True
    if oracle:  # the true continuation as drafts: accepted, so the sync covers several positions
        own = drafter.propose

        def propose(rid: str, n: int) -> list[int]:
            own(rid, n)
            done = core.scheduler.requests[rid].num_output_tokens
            return list(expected[done: done + n])

        drafter.propose = propose
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert out == expected
    if oracle:
        assert core.spec.stats.num_accepted_tokens > 0
    seq = prompt + out
    hidden = _target_hidden(model_dir, seq[:-1], cpu_backend)
    ref_logits, ref_normed = _mtp_reference(weights, cfg, hidden, seq[1:])
    (recorded,) = drafter.recorded.values()
    assert len(recorded) >= 3
    chained = 0
    for i, (pos, step, row) in enumerate(recorded):
        if step == 0:  # from the verified positions: the target's hidden states and tokens
            np.testing.assert_allclose(row, ref_logits[pos], atol=2e-3, rtol=0)
            continue
        # the block on its own output at pos - 1 (after the final norm) and the draft it made there
        prev_pos, prev_step, prev_row = recorded[i - 1]
        assert (prev_pos, prev_step) == (pos - 1, 0)
        h = np.concatenate([hidden[:pos], ref_normed[prev_pos: prev_pos + 1]])
        logits, _ = _mtp_reference(weights, cfg, h, seq[1: pos + 1] + [int(prev_row.argmax())])
        np.testing.assert_allclose(row, logits[pos], atol=2e-3, rtol=0)
        chained += 1
    assert chained > 0 if k == 2 else chained == 0


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
def test_paddle_and_pytorch_namings_draft_alike(checkpoint_factory, shape):
    """The same seed in both namings is the same model, MTP block included (Paddle's fused
    qkv / up_gate and [in, out] layouts, the MoE block's experts): the drafter's logits agree."""
    prompt = [int(t) for t in np.random.default_rng(4).integers(100, 2000, 19)]
    params = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)
    recorded = []
    for naming in ("pytorch", "paddle"):
        model_dir = checkpoint_factory(shape, naming, num_nextn_predict_layers=1)
        llm = LLM(str(model_dir), backend="cpu", max_model_len=256, num_gpu_blocks_override=64, block_size=16,
                  dtype="float32", speculative_config={"method": "mtp", "num_speculative_tokens": 2})
        llm.engine.core.spec.proposer.record_logits = True
        llm.generate([prompt], params, use_tqdm=False)
        (rows,) = llm.engine.core.spec.proposer.recorded.values()
        recorded.append(rows)
    assert len(recorded[0]) == len(recorded[1]) >= 3
    for (pos_a, step_a, a), (pos_b, step_b, b) in zip(*recorded):
        assert (pos_a, step_a) == (pos_b, step_b)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
