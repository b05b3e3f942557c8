"""The static per-channel int8 KV cache (``int8_static``, FastDeploy's C8:
``fd_core.ops.kv_dtype``), for a backend that declares it (skipped otherwise).

- ``write_kv_cache`` into an ``int8_static`` pool then paged attention: the
  values written are what ``self_attention`` gives it (``x * 127 / S``),
  with exact ``.5`` ties and values past +-127, so the pool must hold
  ``clip(rint(x), -127, 127)`` (half to even) with scale 1. The reference
  attends over an fp32 cache holding those codes, computed in numpy here:
  a dynamic write, half-away rounding or a missing clip shows in the output.
- ``decoder_layers`` with a layer's static KV scales over ``int8_static``
  pools (the backend's fused kernel, or the composition when it declines)
  against the reference's ``compose_decoder_layers``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest

from fd_core.ops.attention import AttentionMetadata
from fd_core.ops.decoder import compose_decoder_layers
from fd_core.ops.kv_dtype import StaticKVScales
from fd_core.ops.rope import rope_cos_sin
from fd_core.testing.conformance.cases_attention import (
    STEPS,
    Step,
    _block_tables,
    _compare,
    _context,
    _run_step,
)
from fd_core.testing.conformance.cases_layer import (
    HIDDEN,
    KV_TOLERANCE,
    LAYER_STEPS,
    LAYER_TOLERANCE,
    _layer,
    _weights,
)
from fd_core.testing.conformance.harness import Harness, case_rng

STATIC = "int8_static"
PADDING_ROWS = 3


@pytest.fixture
def static_kv(conformance: Harness) -> Harness:
    if STATIC not in conformance.backend.capabilities().kv_cache_dtypes:
        pytest.skip(f"the backend does not declare an {STATIC} KV cache")
    return conformance


def _prescaled(fd: Harness, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values as a static write gets them: mostly within +-127, a quarter exact
    halves (ties), some past the clip; exact in the compute dtype."""
    values = rng.uniform(-140.0, 140.0, shape)
    halves = rng.random(shape) < 0.25
    values = np.where(halves, np.floor(values) + 0.5, values)
    return fd.rounded(values.astype(np.float32))


def _codes(x: np.ndarray) -> np.ndarray:
    """The static write's oracle: round half to even, clip to +-127."""
    return np.clip(np.rint(x), -127, 127).astype(np.float32)


@pytest.mark.parametrize("step", STEPS, ids=[s.name for s in STEPS])
def test_static_write_and_attention(static_kv: Harness, step: Step) -> None:
    fd = static_kv
    rng = case_rng("static-kv", step.name)
    num_blocks, tables = _block_tables(step, rng)
    ctx_slots = _context(step, tables, rng)
    tokens = sum(step.query_lens)
    shape = (step.kv_heads, step.head_dim)
    with fd.on_host():
        meta = AttentionMetadata.build(step.query_lens, step.seq_lens, tables, step.block_size, len(step.decode_lens))
    raw = {"ctx_k": _prescaled(fd, rng, (len(ctx_slots), *shape)), "ctx_v": _prescaled(fd, rng, (len(ctx_slots), *shape)),
           "k_pad": _prescaled(fd, rng, (tokens + PADDING_ROWS, *shape)),
           "v_pad": _prescaled(fd, rng, (tokens + PADDING_ROWS, *shape))}
    # q as self_attention scales it (S / 127, S ~ 1..4): logits O(1) over codes O(100)
    q = fd.rounded(rng.normal(0, 1, (tokens, step.heads, step.head_dim)) * rng.uniform(1, 4, step.head_dim) / 127)
    common = {"q": q, "ctx_slots": ctx_slots,
              "slots_pad": np.concatenate([meta.slot_mapping.numpy(), np.full(PADDING_ROWS, -1, dtype=np.int64)])}
    got = _run_step(fd, False, step, num_blocks, tables, {**common, **raw}, STATIC)
    want = _run_step(fd, True, step, num_blocks, tables, {**common, **{n: _codes(x) for n, x in raw.items()}}, STATIC)
    case = (f"{step.name}: H={step.heads} Hkv={step.kv_heads} Dh={step.head_dim} block={step.block_size} "
            f"query_lens={step.query_lens} seq_lens={step.seq_lens} dtype={fd.dtype} kv={STATIC}")
    _compare(fd, step, case, got, want, "float32", fd.tol())


@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers_with_static_kv_scales(static_kv: Harness, step: Step) -> None:
    fd = static_kv
    rng = case_rng("static-kv-layers", step.name)
    num_blocks, tables = _block_tables(step, rng)
    ctx_slots = _context(step, tables, rng)
    tokens = sum(step.query_lens)
    channels = step.kv_heads * step.head_dim
    with fd.on_host():
        cos_sin = rope_cos_sin(step.head_dim, max(step.seq_lens) + 8, 10000.0).numpy()
    scales = [(rng.uniform(0.5, 3.0, channels).astype(np.float32), rng.uniform(0.5, 3.0, channels).astype(np.float32))
              for _ in range(2)]
    ctx_shape = (len(ctx_slots), step.kv_heads, step.head_dim)
    weights = [_weights(rng, step) for _ in range(2)]
    ctx = [(_prescaled(fd, rng, ctx_shape), _prescaled(fd, rng, ctx_shape)) for _ in range(2)]
    hidden = fd.rounded(rng.normal(0, 1, (tokens, HIDDEN)))
    residual = fd.rounded(rng.normal(0, 1, (tokens, HIDDEN)))
    outputs = []
    for on_reference in (False, True):
        call = fd.call_reference if on_reference else fd.call
        put = fd.host if on_reference else fd.device
        where: contextlib.AbstractContextManager[None] = fd.on_host() if on_reference else contextlib.nullcontext()
        with where:
            meta = AttentionMetadata.build(step.query_lens, step.seq_lens, tables, step.block_size,
                                           len(step.decode_lens))
            layers, k_caches, v_caches = [], [], []
            for w, (ck, cv), (sk, sv) in zip(weights, ctx, scales):
                k_cache, v_cache = call("allocate_kv_cache", num_blocks=num_blocks, block_size=step.block_size,
                                        num_kv_heads=step.kv_heads, head_dim=step.head_dim, dtype=STATIC,
                                        location="device")
                if len(ctx_slots):
                    call("write_kv_cache", k=put(ck), v=put(cv), k_cache=k_cache, v_cache=v_cache,
                         slot_mapping=put(ctx_slots))
                kv = StaticKVScales(put(sk).astype("float32"), put(sv).astype("float32"))
                layers.append(replace(_layer(fd, on_reference, step, "none", w), kv_scales=kv))
                k_caches.append(k_cache)
                v_caches.append(v_cache)
            args = {"layers": layers, "hidden": put(hidden), "residual": put(residual), "cos_sin": put(cos_sin),
                    "metadata": meta, "k_caches": k_caches, "v_caches": v_caches}
            if on_reference:
                outputs.append(compose_decoder_layers(fd.reference.ops, **args))
            else:
                outputs.append(fd.call_fused("decoder_layers", **args))
    got, want = outputs
    tol = fd.tol().looser(LAYER_TOLERANCE).looser(KV_TOLERANCE["int8"]) if fd.override is None else fd.override
    case = (f"{step.name}: layers=2 static KV scales D={HIDDEN} H={step.heads} Hkv={step.kv_heads} "
            f"Dh={step.head_dim} query_lens={step.query_lens} seq_lens={step.seq_lens} dtype={fd.dtype}")
    fd.assert_close("decoder_layers", case + " (hidden)", got[0], want[0], tol)
    fd.assert_close("decoder_layers", case + " (residual)", got[1], want[1], tol)

