"""Paged attention: allocate_kv_cache, write_kv_cache, prefill_attention and
decode_attention, as one model step uses them; and the optional fused
rope_and_write_kv_cache against rotary_embedding + write_kv_cache.

Each case is one step of a mixed batch (decodes first, then prefill chunks,
some after cached context), with ragged lengths, partly filled last blocks,
shuffled block ids and padding rows (slot -1) in the cache write. Context
from earlier steps is written first through the backend's own
``write_kv_cache``. Only attention outputs are compared: the cache layout is
the backend's own.

Every KV-cache dtype the backend declares is a case (the reference's cache
stays fp32). K/V values are exact in the declared dtype, so a correct cache
gives the reference's attention to fp32 rounding: for int8 / fp8, integer /
e4m3 codes times a power of two, with each (token, head) row's absmax the
dtype's largest code, so the per-row scale (``fd_core.ops.kv_dtype``) is that
power of two. Only the fused rotate-and-store case stores rotated values an
8-bit cache cannot hold exactly; it is compared with ``QUANTIZED_KV_TOL``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from fd_core.ops.attention import AttentionMetadata
from fd_core.ops.kv_dtype import decode_fp8_e4m3
from fd_core.ops.rope import rope_cos_sin
from fd_core.testing.conformance import STATE_KEY
from fd_core.testing.conformance.harness import FLOAT_DTYPES, Harness, Tolerance, case_rng

PADDING_ROWS = 3  # extra rows with slot -1 in the step's cache write
QUANTIZED_KV = ("int8", "fp8")
# attention over an 8-bit cache of inexact values against the fp32 reference: outputs are
# O(1); int8 rounds to 1/254 of a row's absmax, e4m3 to 1/16 of each value
QUANTIZED_KV_TOL = {"int8": Tolerance(rtol=5e-2, atol=5e-2), "fp8": Tolerance(rtol=2e-1, atol=2e-1)}


@dataclass(frozen=True)
class Step:
    """One step's batch: decode requests, then prefill chunks."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    decode_lens: tuple[int, ...]  # cached tokens per decode request, the new one included
    prefills: tuple[tuple[int, int], ...]  # (cached context, new tokens) per prefill request

    @property
    def query_lens(self) -> list[int]:
        return [1] * len(self.decode_lens) + [new for _, new in self.prefills]

    @property
    def seq_lens(self) -> list[int]:
        return list(self.decode_lens) + [ctx + new for ctx, new in self.prefills]


STEPS = [
    Step("decode-gqa", 8, 2, 128, 16, (1, 17, 40, 64, 3), ()),
    Step("prefill-ragged-mha", 4, 4, 64, 16, (), ((0, 1), (0, 37), (0, 16))),
    Step("mixed-chunked-mqa", 8, 1, 64, 64, (5, 70, 129), ((0, 37), (100, 20), (63, 1))),
    Step("mixed-gqa-bs64", 16, 2, 128, 64, (200, 64), ((128, 37), (5, 64))),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kv_dtype" in metafunc.fixturenames:
        state = metafunc.config.stash[STATE_KEY]
        listed = state.backend.capabilities().kv_cache_dtypes if state.backend else ()
        dtypes = [d for d in listed if d in FLOAT_DTYPES + QUANTIZED_KV] or [state.dtype]
        metafunc.parametrize("kv_dtype", dtypes)


def _block_tables(step: Step, rng: np.random.Generator) -> tuple[int, list[list[int]]]:
    """Shuffled block ids; the pool's last block ends a request whose last block
    is full, so a write to row -1 (a padding slot taken literally) corrupts it."""
    bs = step.block_size
    needed = [-(-seq // bs) for seq in step.seq_lens]
    num_blocks = sum(needed) + 3
    ids = [int(i) for i in rng.permutation(num_blocks)[: sum(needed)]]
    full = [i for i, seq in enumerate(step.seq_lens) if seq % bs == 0]
    if full:
        target = sum(needed[: full[0] + 1]) - 1
        last = num_blocks - 1
        if last in ids:
            ids[ids.index(last)] = ids[target]
        ids[target] = last
    tables, start = [], 0
    for n in needed:
        tables.append(ids[start : start + n])
        start += n
    return num_blocks, tables


def _context(step: Step, tables: list[list[int]], rng: np.random.Generator) -> np.ndarray:
    """Cache slots of the tokens cached before this step, in shuffled order."""
    bs = step.block_size
    slots = [
        tables[r][pos // bs] * bs + pos % bs
        for r, (seq, new) in enumerate(zip(step.seq_lens, step.query_lens))
        for pos in range(seq - new)
    ]
    return rng.permutation(np.asarray(slots, dtype=np.int64))


@dataclass
class Swap:
    """Blocks written under ``old`` ids, swapped out to the host tier and back
    in under the step's ids, before the step: exercises ``copy_kv_blocks``."""

    old: list[int]  # device block ids the context is first written to (disjoint from the new)
    new: list[int]  # the block ids of the step's tables, same order
    host: list[int]  # host-tier block ids used in between


def _run_step(
    fd: Harness, on_reference: bool, step: Step, num_blocks: int, tables: list[list[int]],
    data: dict[str, np.ndarray], kv_dtype: str, swap: Swap | None = None,
    fused: bool | None = None,
) -> tuple[Any, ...]:
    """Allocate, write the context (and maybe swap it out and back in), write
    the step (with padding rows), attend. Returns (decoded, prefilled, (q, k, v)).

    With ``fused`` (the rope layout: True interleaved, False neox) the step's
    tokens are stored by ``rope_and_write_kv_cache`` from a fused qkv; the
    reference splits, rotates and writes with its unfused kernels.

    Inputs are in the compute dtype, as a model gives them; the backend's
    cache is ``kv_dtype``, the reference's fp32."""
    call = fd.call_reference if on_reference else fd.call
    put = fd.host if on_reference else fd.device
    cache_dtype = "float32" if on_reference else kv_dtype
    where: contextlib.AbstractContextManager[None] = (
        fd.on_host() if on_reference else contextlib.nullcontext()
    )
    num_decodes, bs = len(step.decode_lens), step.block_size
    with where:
        meta = AttentionMetadata.build(step.query_lens, step.seq_lens, tables, bs, num_decodes)
    shape = {"block_size": bs, "num_kv_heads": step.kv_heads, "head_dim": step.head_dim,
             "dtype": cache_dtype}
    pool = num_blocks if swap is None else num_blocks + len(swap.old)
    k_cache, v_cache = call("allocate_kv_cache", num_blocks=pool, location="device", **shape)
    caches = {"k_cache": k_cache, "v_cache": v_cache}
    ctx_slots = data["ctx_slots"]
    if swap is not None:
        old_of = dict(zip(swap.new, swap.old))
        ctx_slots = np.asarray([old_of[s // bs] * bs + s % bs for s in ctx_slots], dtype=np.int64)
    if len(ctx_slots):
        call("write_kv_cache", k=put(data["ctx_k"]), v=put(data["ctx_v"]),
             slot_mapping=put(ctx_slots), **caches)
    if swap is not None:
        host_k, host_v = call("allocate_kv_cache", num_blocks=len(swap.host), location="host",
                              **shape)
        for device_cache, host_cache in ((k_cache, host_k), (v_cache, host_v)):
            call("copy_kv_blocks", src_cache=device_cache, dst_cache=host_cache,
                 src_blocks=swap.old, dst_blocks=swap.host, block_size=bs)
            call("copy_kv_blocks", src_cache=host_cache, dst_cache=device_cache,
                 src_blocks=swap.host, dst_blocks=swap.new, block_size=bs)
    if fused is None:
        call("write_kv_cache", k=put(data["k_pad"]), v=put(data["v_pad"]),
             slot_mapping=put(data["slots_pad"]), **caches)
        q, k, v = put(data["q"]), put(data["k_pad"]), put(data["v_pad"])
    else:
        q, k, v = _store_fused(fd, on_reference, step, data, fused, caches)
    scale = step.head_dim**-0.5
    real = sum(step.query_lens)
    decoded = prefilled = None
    if num_decodes:
        decoded = call("decode_attention", q=q[:num_decodes], metadata=meta, scale=scale, **caches)
    if step.prefills:
        new = slice(num_decodes, real)
        prefilled = call("prefill_attention", q=q[new], k=k[new], v=v[new], metadata=meta, scale=scale,
                         **caches)
    return decoded, prefilled, (q, k, v)


def _store_fused(fd: Harness, on_reference: bool, step: Step, data: dict[str, np.ndarray],
                 interleaved: bool, caches: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The step's q/k/v (padding rows included) rotated, k/v stored: the
    backend through ``rope_and_write_kv_cache``, the reference unfused."""
    tokens = len(data["k_pad"])
    if on_reference:
        put = fd.host
        q, k, v = (data[name].reshape(tokens, -1, step.head_dim) for name in ("q_pad", "k_pad", "v_pad"))
        q, k = fd.call_reference("rotary_embedding", q=put(q), k=put(k), cos_sin=put(data["cos_sin"]),
                                 positions=put(data["positions_pad"]), interleaved=interleaved)
        v = put(v)
        fd.call_reference("write_kv_cache", k=k, v=v, slot_mapping=put(data["slots_pad"]), **caches)
        return q, k, v
    qkv = np.concatenate([data[name].reshape(tokens, -1) for name in ("q_pad", "k_pad", "v_pad")], axis=1)
    return fd.call_fused(  # type: ignore[no-any-return]
        "rope_and_write_kv_cache", qkv=fd.device(qkv), cos_sin=fd.device(data["cos_sin"], "float32"),
        positions=fd.device(data["positions_pad"]), slot_mapping=fd.device(data["slots_pad"]),
        interleaved=interleaved, num_heads=step.heads, num_kv_heads=step.kv_heads, **caches,
    )


def _exact_8bit(rng: np.random.Generator, shape: tuple[int, ...], kv_dtype: str) -> np.ndarray:
    """Values an 8-bit cache holds exactly (and fp16 / bf16 too): codes times
    a power of two, each row's absmax the largest code (the scale is then
    exactly that power of two)."""
    if kv_dtype == "int8":
        codes, top, unit = rng.integers(-127, 128, shape).astype(np.float32), 127.0, 2.0**-6
    else:
        codes, top, unit = decode_fp8_e4m3(rng.integers(0, 256, shape).astype(np.uint8)), 448.0, 2.0**-8
        codes = np.where(np.isfinite(codes), codes, 0.0).astype(np.float32)
    where = rng.integers(0, shape[-1], shape[:-1])[..., None]
    np.put_along_axis(codes, where, rng.choice([-top, top], shape[:-1])[..., None], axis=-1)
    return (codes * unit).astype(np.float32)


def _step_data(fd: Harness, step: Step, tables: list[list[int]], kv_dtype: str,
               rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Queries, context and new K/V (values exact in both dtypes), and slots."""
    tokens = sum(step.query_lens)

    def kv(rows: int) -> np.ndarray:
        if kv_dtype in QUANTIZED_KV:
            return _exact_8bit(rng, (rows, step.kv_heads, step.head_dim), kv_dtype)
        values = rng.normal(0, 1, (rows, step.kv_heads, step.head_dim))
        return fd.rounded(fd.rounded(values), kv_dtype)

    ctx_slots = _context(step, tables, rng)
    with fd.on_host():
        meta = AttentionMetadata.build(step.query_lens, step.seq_lens, tables, step.block_size,
                                       len(step.decode_lens))
    return {
        "q": fd.rounded(rng.normal(0, 1, (tokens, step.heads, step.head_dim))),
        "ctx_slots": ctx_slots,
        "ctx_k": kv(len(ctx_slots)),
        "ctx_v": kv(len(ctx_slots)),
        "k_pad": kv(tokens + PADDING_ROWS),
        "v_pad": kv(tokens + PADDING_ROWS),
        "slots_pad": np.concatenate([meta.slot_mapping.numpy(),
                                     np.full(PADDING_ROWS, -1, dtype=np.int64)]),
    }


def _describe(fd: Harness, step: Step, kv_dtype: str) -> str:
    return (f"{step.name}: H={step.heads} Hkv={step.kv_heads} Dh={step.head_dim} "
            f"block={step.block_size} query_lens={step.query_lens} seq_lens={step.seq_lens} "
            f"dtype={fd.dtype} kv={kv_dtype}")


def _compare(fd: Harness, step: Step, case: str, got: tuple[Any, ...], want: tuple[Any, ...],
             kv_dtype: str, tol: Tolerance | None = None) -> None:
    tol = tol or fd.tol(fd.dtype, kv_dtype)
    if step.decode_lens:
        fd.assert_close("decode_attention", case, got[0], want[0], tol)
    if step.prefills:
        fd.assert_close("prefill_attention", case, got[1], want[1], tol)


@pytest.mark.parametrize("step", STEPS, ids=[s.name for s in STEPS])
def test_paged_attention_step(conformance: Harness, step: Step, kv_dtype: str) -> None:
    fd = conformance
    rng = case_rng("attention", step.name, kv_dtype)
    num_blocks, tables = _block_tables(step, rng)
    data = _step_data(fd, step, tables, kv_dtype, rng)
    got = _run_step(fd, False, step, num_blocks, tables, data, kv_dtype)
    want = _run_step(fd, True, step, num_blocks, tables, data, kv_dtype)
    _compare(fd, step, _describe(fd, step, kv_dtype), got, want, kv_dtype)


@pytest.mark.parametrize("step", [STEPS[0], STEPS[2]], ids=[STEPS[0].name, STEPS[2].name])
def test_swapped_blocks_attend_the_same(conformance: Harness, step: Step, kv_dtype: str) -> None:
    """Context swapped out to the host tier and back in under other block ids
    (``copy_kv_blocks`` both ways) gives the same attention as never swapped."""
    fd = conformance
    rng = case_rng("swap", step.name, kv_dtype)
    num_blocks, tables = _block_tables(step, rng)
    data = _step_data(fd, step, tables, kv_dtype, rng)
    new = [block for table in tables for block in table]
    old = [num_blocks + int(i) for i in rng.permutation(len(new))]  # never read by the step
    swap = Swap(old=old, new=new, host=[int(i) for i in rng.permutation(len(new))])
    got = _run_step(fd, False, step, num_blocks, tables, data, kv_dtype, swap)
    want = _run_step(fd, True, step, num_blocks, tables, data, kv_dtype)
    _compare(fd, step, _describe(fd, step, kv_dtype) + " after swap-out/swap-in", got, want,
             kv_dtype)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("step", STEPS, ids=[s.name for s in STEPS])
def test_rope_and_write_kv_cache_step(conformance: Harness, step: Step, kv_dtype: str, interleaved: bool) -> None:
    """The fused split-rotate-store (the backend's, or the unfused hooks it
    falls back to) equals the reference's rotary + write: same q/k/v and the
    same attention over what it stored."""
    fd = conformance
    rng = case_rng("fused-qkv", step.name, kv_dtype, interleaved)
    num_blocks, tables = _block_tables(step, rng)
    data = _step_data(fd, step, tables, kv_dtype, rng)
    tokens = len(data["k_pad"])
    data["q_pad"] = np.concatenate([data["q"], fd.rounded(rng.normal(0, 1, (PADDING_ROWS, step.heads, step.head_dim)))])
    max_pos = max(step.seq_lens) + 8
    with fd.on_host():
        data["cos_sin"] = rope_cos_sin(step.head_dim, max_pos, 10000.0).numpy()
        meta = AttentionMetadata.build(step.query_lens, step.seq_lens, tables, step.block_size,
                                       len(step.decode_lens))
    data["positions_pad"] = np.concatenate([meta.positions.numpy(), np.zeros(PADDING_ROWS, dtype=np.int64)])
    got = _run_step(fd, False, step, num_blocks, tables, data, kv_dtype, fused=interleaved)
    want = _run_step(fd, True, step, num_blocks, tables, data, kv_dtype, fused=interleaved)
    case = _describe(fd, step, kv_dtype) + f" interleaved={interleaved} qkv rows={tokens}"
    for name, g, w in zip(("q", "k", "v"), got[2], want[2]):
        fd.assert_close("rope_and_write_kv_cache", f"{case} ({name})", g, w, fd.tol())
    stored_tol = QUANTIZED_KV_TOL.get(kv_dtype) if fd.override is None else None  # rotated k: not exact
    _compare(fd, step, case + " (attention over the stored k/v)", got, want, kv_dtype,
             stored_tol.looser(fd.tol(fd.dtype)) if stored_tol else None)
