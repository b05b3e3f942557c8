"""The fused decoder layers (fd_x86.layer / ``fd_x86_decoder_layers``) against
the unfused composition of the same kernels and the CPU reference, one layer
and runs of several, when they decline, their input checks, and their
routing through ``Ops.decoder_layers``."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build
from paged_tables import shuffled_tables

paddle = pytest.importorskip("paddle")

import fd_x86.layer as fused  # noqa: E402
from fd_x86.linear import WINT8_PACKED_MAX_ROWS, _use_packed  # noqa: E402

import fd_core.ops.decoder as decoder  # noqa: E402
from fd_core.ops.attention import AttentionMetadata  # noqa: E402
from fd_core.ops.decoder import DecoderLayerWeights, compose_decoder_layer, compose_decoder_layers  # noqa: E402
from fd_core.ops.rope import rope_cos_sin  # noqa: E402
from fd_core.quantization import quantize_weight  # noqa: E402

HIDDEN, INTER, BLOCK = 256, 512, 16
MAX_POS = 512
# (method, wint4 group size): group 128 and per channel
METHODS = [("wint8", 128), ("wint4", 128), ("wint4", -1), ("w8a8", 128), ("w4a8", 128)]


@pytest.fixture(scope="module", autouse=True)
def usable() -> None:
    availability = backend.fd_device_availability()
    if not availability.usable:
        pytest.skip(f"x86 backend unusable here: {availability.reason}")
    if not _use_packed("auto"):
        pytest.skip("no packed kernels here (AVX-512 VNNI, FD_X86_REPACK): the fused layer always declines")
    build.load_ops()


pytestmark = pytest.mark.usefixtures("fused_switches_unset")


@pytest.fixture(scope="module")
def ref_ops() -> Any:
    from fd_core.backends import get_backend

    return get_backend("cpu").ops


def _t(a: np.ndarray) -> Any:
    return paddle.to_tensor(a)


def _fused1(layer: DecoderLayerWeights, hidden: Any, residual: Any, cos_sin: Any, meta: Any, k_cache: Any,
            v_cache: Any) -> Any:
    """The fused op on a run of one layer."""
    return fused.decoder_layers([layer], hidden, residual, cos_sin, meta, [k_cache], [v_cache])


_LAYERS: dict[tuple, DecoderLayerWeights] = {}


def _layer(method: str | None, group: int = 128, heads: int = 4, kv_heads: int = 2, head_dim: int = 64,
           interleaved: bool = True) -> DecoderLayerWeights:
    """Random layer weights, quantized with ``method`` (None: fp32); cached
    so the weights are packed once per module."""
    key = (method, group, heads, kv_heads, head_dim, interleaved)
    if key in _LAYERS:
        return _LAYERS[key]
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))

    def weight(d_in: int, d_out: int) -> Any:
        w = (rng.normal(0, 1, (d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
        return _t(w) if method is None else quantize_weight(method, w, group)

    layer = DecoderLayerWeights(
        input_norm=_t(rng.normal(1, 0.1, HIDDEN).astype(np.float32)),
        post_norm=_t(rng.normal(1, 0.1, HIDDEN).astype(np.float32)),
        eps=1e-6,
        qkv=weight(HIDDEN, (heads + 2 * kv_heads) * head_dim),
        o=weight(heads * head_dim, HIDDEN),
        up_gate=weight(HIDDEN, 2 * INTER),
        down=weight(INTER, HIDDEN),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, scale=head_dim**-0.5,
        interleaved_rope=interleaved,
    )
    _LAYERS[key] = layer
    return layer


@dataclass
class Step:
    """One step's inputs; ``meta()`` and ``caches()`` give fresh copies so
    each run starts from the same cache contents."""

    query_lens: list[int]
    seq_lens: list[int]
    tables: list[list[int]]
    num_decodes: int
    k_start: np.ndarray
    v_start: np.ndarray
    hidden: np.ndarray
    residual: np.ndarray | None
    cos_sin: Any

    def meta(self) -> AttentionMetadata:
        return AttentionMetadata.build(self.query_lens, self.seq_lens, self.tables, BLOCK, self.num_decodes)

    def caches(self) -> tuple[Any, Any]:
        return _t(self.k_start.copy()), _t(self.v_start.copy())

    def inputs(self) -> tuple[Any, Any | None]:
        return _t(self.hidden), None if self.residual is None else _t(self.residual)


def _step(batch: int, with_residual: bool, seed: int, kv_heads: int = 2, head_dim: int = 64, prefills: int = 0,
          max_len: int = 120) -> Step:
    """``batch`` decodes over random cached context (shuffled block ids,
    partly filled last blocks), then ``prefills`` chunks of a few tokens."""
    rng = np.random.default_rng(seed)
    n = batch + prefills
    seq_lens = [int(s) for s in rng.integers(1, max_len + 1, n)]
    seq_lens[0] = max_len
    query_lens = [1] * batch + [int(rng.integers(1, min(4, s) + 1)) for s in seq_lens[batch:]]
    num_blocks, tables = shuffled_tables(rng, seq_lens, BLOCK)
    shape = (num_blocks * BLOCK, kv_heads, head_dim)
    rows = sum(query_lens)
    return Step(
        query_lens, seq_lens, tables, batch,
        rng.normal(0, 1, shape).astype(np.float32), rng.normal(0, 1, shape).astype(np.float32),
        rng.normal(0, 1, (rows, HIDDEN)).astype(np.float32),
        rng.normal(0, 1, (rows, HIDDEN)).astype(np.float32) if with_residual else None,
        rope_cos_sin(head_dim, MAX_POS, 10000.0),
    )


def _run_fused(layer: DecoderLayerWeights, step: Step) -> tuple[Any, Any, Any]:
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    out = _fused1(layer, hidden, residual, step.cos_sin, step.meta(), k_cache, v_cache)
    assert out is not None, "the fused layer declined a step it should answer"
    np.testing.assert_array_equal(hidden.numpy(), step.hidden)  # inputs left alone
    if residual is not None:
        np.testing.assert_array_equal(residual.numpy(), step.residual)
    return out, k_cache, v_cache


def _run_composed(ops: Any, layer: DecoderLayerWeights, step: Step) -> tuple[Any, Any, Any]:
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    out = compose_decoder_layer(ops, layer, hidden, residual, step.cos_sin, step.meta(), k_cache, v_cache)
    return out, k_cache, v_cache


def _assert_same(got: tuple, want: tuple, rtol: float, atol: float, mean_atol: float | None = None) -> None:
    """hidden, residual and both caches close; with ``mean_atol`` also their
    mean absolute differences below it."""
    (hidden, residual), k_cache, v_cache = got
    (want_hidden, want_residual), want_k, want_v = want
    assert list(hidden.shape) == list(want_hidden.shape) and list(residual.shape) == list(want_residual.shape)
    for name, a, b in [("hidden", hidden, want_hidden), ("residual", residual, want_residual),
                       ("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)]:
        a, b = a.numpy(), b.numpy()
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
        if mean_atol is not None:
            assert float(np.abs(a - b).mean()) <= mean_atol, f"{name}: mean |difference| {np.abs(a - b).mean()}"


# Against the CPU reference. wint8 / wint4 dequantize the same codes, so only
# fp32 rounding differs. w8a8 quantizes each linear's input per token: a
# (w4a8 likewise) 1-ulp difference in the fp32 norm (x86's vs the reference's) can move one
# activation across a rounding tie (seen: x / s = -21.5 vs -21.499998), one
# int8 step, and that one row then drifts by up to ~3e-2 through the later
# quantized linears; the kernels agree bit for bit on equal inputs.
def _reference_tol(method: str) -> dict[str, float]:
    if method in ("w8a8", "w4a8"):
        return {"rtol": 5e-2, "atol": 5e-2, "mean_atol": 1e-2}
    return {"rtol": 2e-3, "atol": 2e-3}


def _cases() -> list[Any]:
    cases = []
    for method, group in METHODS:
        batches = [1, 3, 7, 16]  # wint8 at 16: the contract layout's kernel
        for batch in batches:
            for with_residual in (False, True):
                ident = f"{method}{'' if method != 'wint4' else ('-g' + str(group))}-b{batch}-" \
                        f"{'res' if with_residual else 'nores'}"
                cases.append(pytest.param(method, group, batch, with_residual, id=ident))
    return cases


@pytest.mark.parametrize("method,group,batch,with_residual", _cases())
def test_fused_layer_matches_composition_of_x86_ops(
    x86_ops: Any, method: str, group: int, batch: int, with_residual: bool
) -> None:
    layer = _layer(method, group)
    step = _step(batch, with_residual, seed=batch * 10 + with_residual)
    got = _run_fused(layer, step)
    _assert_same(got, _run_composed(x86_ops, layer, step), rtol=1e-5, atol=1e-5)
    # the new tokens' k/v were stored (the slots changed from the random start)
    slots = step.meta().slot_mapping.numpy()
    assert not np.allclose(got[1].numpy()[slots], step.k_start[slots])
    assert not np.allclose(got[2].numpy()[slots], step.v_start[slots])
    # ... and nothing else was
    others = np.setdiff1d(np.arange(step.k_start.shape[0]), slots)
    np.testing.assert_array_equal(got[1].numpy()[others], step.k_start[others])
    np.testing.assert_array_equal(got[2].numpy()[others], step.v_start[others])


@pytest.mark.parametrize("method,group,batch,with_residual", _cases())
def test_fused_layer_matches_reference_composition(
    ref_ops: Any, method: str, group: int, batch: int, with_residual: bool
) -> None:
    layer = _layer(method, group)
    step = _step(batch, with_residual, seed=batch * 10 + with_residual + 1)
    _assert_same(_run_fused(layer, step), _run_composed(ref_ops, layer, step), **_reference_tol(method))


@pytest.mark.parametrize("heads,kv_heads,head_dim,interleaved", [
    (4, 2, 128, True),   # Dh = 128
    (4, 4, 64, False),   # MHA, neox-style rotary
    (8, 1, 32, True),    # G = 8
])
@pytest.mark.parametrize("method", ["wint4", "w8a8"])
def test_fused_layer_other_head_shapes(
    x86_ops: Any, ref_ops: Any, method: str, heads: int, kv_heads: int, head_dim: int, interleaved: bool
) -> None:
    layer = _layer(method, 128, heads, kv_heads, head_dim, interleaved)
    step = _step(5, True, seed=heads + head_dim, kv_heads=kv_heads, head_dim=head_dim)
    got = _run_fused(layer, step)
    _assert_same(got, _run_composed(x86_ops, layer, step), rtol=1e-5, atol=1e-5)
    _assert_same(got, _run_composed(ref_ops, layer, step), **_reference_tol(method))


def test_fused_layer_takes_strided_hidden_and_residual(x86_ops: Any) -> None:
    layer = _layer("wint4", 128)
    step = _step(3, True, seed=99)
    wide_h = _t(np.concatenate([step.hidden, np.zeros_like(step.hidden)], axis=1))[:, :HIDDEN]
    wide_r = _t(np.concatenate([step.residual, np.zeros_like(step.residual)], axis=1))[:, :HIDDEN]
    assert not wide_h.is_contiguous() and not wide_r.is_contiguous()
    k_cache, v_cache = step.caches()
    out = _fused1(layer, wide_h, wide_r, step.cos_sin, step.meta(), k_cache, v_cache)
    assert out is not None
    _assert_same((out, k_cache, v_cache), _run_composed(x86_ops, layer, step), rtol=1e-5, atol=1e-5)


def test_fused_layer_with_a_different_method_per_linear(x86_ops: Any, ref_ops: Any) -> None:
    wint8, wint4, wint4_channel, w8a8 = _layer("wint8"), _layer("wint4"), _layer("wint4", -1), _layer("w8a8")
    layer = replace(wint8, qkv=wint8.qkv, o=wint4.o, up_gate=wint4_channel.up_gate, down=w8a8.down)
    step = _step(4, True, seed=42)
    got = _run_fused(layer, step)
    _assert_same(got, _run_composed(x86_ops, layer, step), rtol=1e-5, atol=1e-5)
    _assert_same(got, _run_composed(ref_ops, layer, step), **_reference_tol("w8a8"))


def test_fused_layer_skips_slot_minus_one_like_the_composition(x86_ops: Any, ref_ops: Any) -> None:
    layer = _layer("wint4")
    step = _step(3, True, seed=43)
    runs = []
    for run in (lambda m, k, v: _fused1(layer, *step.inputs(), step.cos_sin, m, k, v),
                lambda m, k, v: compose_decoder_layer(x86_ops, layer, *step.inputs(), step.cos_sin, m, k, v),
                lambda m, k, v: compose_decoder_layer(ref_ops, layer, *step.inputs(), step.cos_sin, m, k, v)):
        meta = step.meta()
        slots = meta.slot_mapping.numpy().copy()
        slots[1] = -1
        meta.slot_mapping = _t(slots)
        k_cache, v_cache = step.caches()
        out = run(meta, k_cache, v_cache)
        assert out is not None
        runs.append((out, k_cache, v_cache))
    skipped = step.meta().slot_mapping.numpy()[1]
    np.testing.assert_array_equal(runs[0][1].numpy()[skipped], step.k_start[skipped])
    _assert_same(runs[0], runs[1], rtol=1e-5, atol=1e-5)
    _assert_same(runs[0], runs[2], **_reference_tol("wint4"))


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_prefill_then_fused_decode_steps(x86_ops: Any, method: str) -> None:
    """Context written by a prefill step (composed), then decode steps run
    fused on one cache and composed on a copy: equal at every step."""
    layer = _layer(method)
    rng = np.random.default_rng(77)
    prompts = [5, 17, 33]
    steps = 4
    num_blocks = sum(-(-(n + steps) // BLOCK) for n in prompts) + 2
    order = [int(b) for b in rng.permutation(num_blocks)]
    tables, used = [], 0
    for n in prompts:
        k = -(-(n + steps) // BLOCK)
        tables.append(order[used:used + k])
        used += k
    k_fused, v_fused = x86_ops.allocate_kv_cache(num_blocks, BLOCK, 2, 64, "float32")
    cos_sin = rope_cos_sin(64, MAX_POS, 10000.0)
    prefill = AttentionMetadata.build(prompts, prompts, tables, BLOCK, 0)
    hidden = _t(rng.normal(0, 1, (sum(prompts), HIDDEN)).astype(np.float32))
    x86_ops.decoder_layers([layer], hidden, None, cos_sin, prefill, [k_fused], [v_fused])
    assert float(paddle.abs(k_fused).sum()) > 0
    k_comp, v_comp = k_fused.clone(), v_fused.clone()
    for i in range(1, steps + 1):
        lens = [n + i for n in prompts]
        hidden = rng.normal(0, 1, (3, HIDDEN)).astype(np.float32)
        residual = rng.normal(0, 1, (3, HIDDEN)).astype(np.float32)
        got = _fused1(layer, _t(hidden), _t(residual), cos_sin,
                      AttentionMetadata.build([1, 1, 1], lens, tables, BLOCK, 3), k_fused, v_fused)
        assert got is not None
        want = compose_decoder_layer(x86_ops, layer, _t(hidden), _t(residual), cos_sin,
                                     AttentionMetadata.build([1, 1, 1], lens, tables, BLOCK, 3), k_comp, v_comp)
        _assert_same((got, k_fused, v_fused), (want, k_comp, v_comp), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- declines


def _assert_declines(layer: DecoderLayerWeights, step: Step) -> None:
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    assert _fused1(layer, hidden, residual, step.cos_sin, step.meta(), k_cache, v_cache) is None
    np.testing.assert_array_equal(k_cache.numpy(), step.k_start)  # nothing was stored
    np.testing.assert_array_equal(v_cache.numpy(), step.v_start)


@pytest.mark.parametrize("method", ["wint8", "wint4", "w8a8"])
def test_declines_a_step_with_prefill_tokens(method: str) -> None:
    _assert_declines(_layer(method), _step(2, True, seed=5, prefills=2))


def test_declines_a_prefill_only_step() -> None:
    _assert_declines(_layer("w8a8"), _step(0, False, seed=6, prefills=3))


def _fp64_down(layer: DecoderLayerWeights) -> DecoderLayerWeights:
    """``layer`` with a float64 down projection: a weight no kernel of a run's takes."""
    return replace(layer, down=_layer(None).down.astype("float64"))


def test_fp32_weights_run_at_every_row_count(x86_ops: Any) -> None:
    """An fp32 layer (``--dtype float32``) runs its linears on fd_x86.dense16's kernels at every row count
    (the stream kernel at decode rows, the panel kernel from PANEL_MIN_ROWS), as fd_linear does: the
    composition's answer to fp32 summation order."""
    for rows in (3, 65):
        layer, step = _layer(None), _step(rows, True, seed=7)
        _assert_same(_run_fused(layer, step), _run_composed(x86_ops, layer, step), 1e-4, 1e-4)


def test_declines_when_one_weight_has_no_kernel() -> None:
    _assert_declines(_fp64_down(_layer("wint4")), _step(3, True, seed=8))


def test_wint8_past_the_packed_row_limit_runs_the_contract_layout_kernel(x86_ops: Any) -> None:
    """Above WINT8_PACKED_MAX_ROWS the layer takes wint8 on the contract layout,
    as fd_x86.linear does: the same answer as the composition of the ops."""
    assert WINT8_PACKED_MAX_ROWS == 7
    layer, step = _layer("wint8"), _step(WINT8_PACKED_MAX_ROWS + 1, True, seed=9)
    _assert_same(_run_fused(layer, step), _run_composed(x86_ops, layer, step), 1e-5, 1e-5)


def test_declines_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_X86_FUSED_LAYER", "0")
    fused._enabled.cache_clear()
    _assert_declines(_layer("w8a8"), _step(3, True, seed=10))
    monkeypatch.setenv("FD_X86_FUSED_LAYER", "1")
    fused._enabled.cache_clear()
    _run_fused(_layer("w8a8"), _step(3, True, seed=10))


def test_declines_without_repacked_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_X86_REPACK", "0")
    _assert_declines(_layer("wint4"), _step(3, True, seed=19))


# ----------------------------------------------------------------- bad input


def _run_bad(layer: DecoderLayerWeights, step: Step, meta: AttentionMetadata, cos_sin: Any, match: str) -> None:
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    with pytest.raises(Exception, match=match):
        _fused1(layer, hidden, residual, cos_sin, meta, k_cache, v_cache)
    # checked before anything is stored
    np.testing.assert_array_equal(k_cache.numpy(), step.k_start)
    np.testing.assert_array_equal(v_cache.numpy(), step.v_start)


def test_rejects_a_slot_past_the_cache() -> None:
    step = _step(3, True, seed=11)
    meta = step.meta()
    slots = meta.slot_mapping.numpy().copy()
    slots[-1] = step.k_start.shape[0]
    meta.slot_mapping = _t(slots)
    _run_bad(_layer("wint4"), step, meta, step.cos_sin, "past the cache")


def test_rejects_a_position_past_the_rotary_table() -> None:
    step = _step(3, True, seed=12, max_len=100)
    meta = step.meta()
    short = rope_cos_sin(64, 64, 10000.0)  # the first request is at position 99
    _run_bad(_layer("w8a8"), step, meta, short, "outside the table")


def test_rejects_a_block_table_past_the_cache() -> None:
    step = _step(3, True, seed=13)
    meta = step.meta()
    meta.block_tables = meta.block_tables.copy()
    meta.block_tables[1, 0] = step.k_start.shape[0] // BLOCK + 5
    _run_bad(_layer("wint8"), step, meta, step.cos_sin, "names block")


def test_rejects_caches_with_other_kv_heads() -> None:
    layer = _layer("wint4")  # 2 kv heads
    step = _step(2, True, seed=14, kv_heads=1, head_dim=64)
    _run_bad(layer, step, step.meta(), step.cos_sin, "kv heads|Hkv")


def test_rejects_a_residual_of_another_shape() -> None:
    step = _step(3, True, seed=17)
    step.residual = step.residual[:2]
    _run_bad(_layer("wint4"), step, step.meta(), step.cos_sin, "residual must have hidden's shape")


def test_rejects_norm_weights_of_another_width() -> None:
    layer = replace(_layer("w8a8"), post_norm=_t(np.ones(HIDDEN - 16, np.float32)))
    step = _step(2, False, seed=18)
    _run_bad(layer, step, step.meta(), step.cos_sin, "norm weights must have D")


# -------------------------------------------------------------- via the hook


def test_ops_decoder_layers_uses_the_fused_answer(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer("wint4")
    step = _step(3, True, seed=15)
    answers = []
    real = fused.decoder_layers

    def spy(*args: Any) -> Any:
        answers.append(real(*args))
        return answers[-1]

    def no_composition(*args: Any) -> Any:
        raise AssertionError("the fused layer answered; the composition must not run")

    monkeypatch.setattr(fused, "decoder_layers", spy)
    monkeypatch.setattr(decoder, "compose_decoder_layers", no_composition)
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    out = x86_ops.decoder_layers([layer], hidden, residual, step.cos_sin, step.meta(), [k_cache], [v_cache])
    assert len(answers) == 1 and answers[0] is not None
    assert out[0] is answers[0][0] and out[1] is answers[0][1]
    monkeypatch.undo()

    # turned off: the hook declines and Ops composes the same numbers
    monkeypatch.setenv("FD_X86_FUSED_LAYER", "0")
    fused._enabled.cache_clear()
    off_k, off_v = step.caches()
    hidden, residual = step.inputs()
    off = x86_ops.decoder_layers([layer], hidden, residual, step.cos_sin, step.meta(), [off_k], [off_v])
    _assert_same((out, k_cache, v_cache), (off, off_k, off_v), rtol=1e-5, atol=1e-5)


def test_ops_decoder_layers_composes_a_mixed_step(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer("w8a8")
    step = _step(2, True, seed=16, prefills=2)
    answers = []
    real = fused.decoder_layers

    def spy(*args: Any) -> Any:
        answers.append(real(*args))
        return answers[-1]

    monkeypatch.setattr(fused, "decoder_layers", spy)
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    out = x86_ops.decoder_layers([layer], hidden, residual, step.cos_sin, step.meta(), [k_cache], [v_cache])
    assert answers == [None]
    _assert_same((out, k_cache, v_cache), _run_composed(x86_ops, layer, step), rtol=1e-5, atol=1e-5)


def test_cached_kernel_inputs_follow_a_replaced_weight(x86_ops: Any) -> None:
    """The run's kernel inputs are cached by content: a linear replaced on the
    same DecoderLayerWeights, a dataclasses.replace copy, or a norm written in
    place through paddle is not answered from the stale entry."""
    layer, other = _layer("wint8"), _layer("w8a8")
    step = _step(2, True, seed=44)
    _run_fused(layer, step)
    layer.o = other.o
    _assert_same(_run_fused(layer, step), _run_composed(x86_ops, layer, step), 1e-5, 1e-5)
    copy = replace(layer, down=other.down)
    _assert_same(_run_fused(copy, step), _run_composed(x86_ops, copy, step), 1e-5, 1e-5)
    copy = replace(copy, post_norm=copy.post_norm.clone())  # its own norm, to write into
    before = _run_fused(copy, step)
    paddle.assign(copy.post_norm * 1.5, output=copy.post_norm)  # an in-place write paddle counts
    after = _run_fused(copy, step)
    _assert_same(after, _run_composed(x86_ops, copy, step), 1e-5, 1e-5)
    assert not np.allclose(after[0][0].numpy(), before[0][0].numpy())


def test_layers_with_qk_norms_or_biases_are_declined(x86_ops: Any) -> None:
    """The op has no q/k norms or biases: such a layer (Qwen3's) is declined
    and composes to the same result as the reference."""
    base = _layer("wint8")
    dh = base.head_dim
    rng = np.random.default_rng(5)
    for extra in ({"q_norm": _t(rng.normal(1, 0.1, dh).astype(np.float32)),
                   "k_norm": _t(rng.normal(1, 0.1, dh).astype(np.float32))},
                  {"o_bias": _t(rng.normal(0, 0.1, base.post_norm.shape[0]).astype(np.float32))}):
        layer = replace(base, **extra)
        step = _step(2, True, seed=46)
        hidden, residual = step.inputs()
        k_cache, v_cache = step.caches()
        assert fused.decoder_layers([layer], hidden, residual, step.cos_sin, step.meta(), [k_cache],
                                    [v_cache]) is None


# ------------------------------------------------------------ runs of layers


def _run_caches(step: Step, n: int) -> tuple[list[Any], list[Any]]:
    """``n`` layers' caches: the step's start contents, then random ones."""
    rng = np.random.default_rng(n)
    ks, vs = [_t(step.k_start.copy())], [_t(step.v_start.copy())]
    for _ in range(1, n):
        ks.append(_t(rng.normal(0, 1, step.k_start.shape).astype(np.float32)))
        vs.append(_t(rng.normal(0, 1, step.v_start.shape).astype(np.float32)))
    return ks, vs


def _copies(caches: list[Any]) -> list[Any]:
    return [c.clone() for c in caches]


@pytest.mark.parametrize("batch,with_residual", [(1, False), (5, True), (WINT8_PACKED_MAX_ROWS + 2, True)])
def test_a_run_of_layers_matches_the_composition_layer_by_layer(
    x86_ops: Any, ref_ops: Any, batch: int, with_residual: bool
) -> None:
    """Three layers with different methods, each with its own cache: the one
    op equals the x86 ops and the reference chained layer by layer."""
    layers = [_layer("wint8"), _layer("wint4", -1), _layer("w8a8")]
    step = _step(batch, with_residual, seed=60 + batch)
    ks, vs = _run_caches(step, 3)
    starts = [c.numpy() for c in ks]
    runs = {}
    for name, run in [("fused", lambda k, v: fused.decoder_layers(layers, *step.inputs(), step.cos_sin, step.meta(),
                                                                  k, v)),
                      ("x86", lambda k, v: compose_decoder_layers(x86_ops, layers, *step.inputs(), step.cos_sin,
                                                                  step.meta(), k, v)),
                      ("ref", lambda k, v: compose_decoder_layers(ref_ops, layers, *step.inputs(), step.cos_sin,
                                                                  step.meta(), k, v))]:
        k, v = _copies(ks), _copies(vs)
        out = run(k, v)
        assert out is not None, name
        runs[name] = (out, k, v)
    (out, k, v), (want, wk, wv) = runs["fused"], runs["x86"]
    for i in range(3):
        _assert_same((out, k[i], v[i]), (want, wk[i], wv[i]), rtol=1e-5, atol=1e-5)
        assert not np.array_equal(k[i].numpy(), starts[i])  # every layer stored into its own cache
    (want, wk, wv) = runs["ref"]
    for i in range(3):
        _assert_same((out, k[i], v[i]), (want, wk[i], wv[i]), **_reference_tol("w8a8"))


def test_a_run_declines_when_one_layer_cannot_be_fused() -> None:
    step = _step(3, True, seed=61)
    plain = _fp64_down(_layer("wint4"))
    for layers in ([_layer("wint8"), plain], [_layer("wint8"), _layer("wint4", 128, heads=8, kv_heads=2)]):
        ks, vs = _run_caches(step, 2)
        starts = [c.numpy() for c in ks + vs]
        hidden, residual = step.inputs()
        assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), ks, vs) is None
        for c, start in zip(ks + vs, starts):
            np.testing.assert_array_equal(c.numpy(), start)  # nothing was stored


def test_a_run_checks_every_layer_before_storing_anything() -> None:
    """A bad second layer fails the call before the first layer writes its cache."""
    bad = replace(_layer("w8a8"), post_norm=_t(np.ones(HIDDEN - 16, np.float32)))
    step = _step(2, True, seed=62)
    ks, vs = _run_caches(step, 2)
    starts = [c.numpy() for c in ks + vs]
    hidden, residual = step.inputs()
    with pytest.raises(Exception, match="layer 1: the norm weights must have D"):
        fused.decoder_layers([_layer("wint8"), bad], hidden, residual, step.cos_sin, step.meta(), ks, vs)
    for c, start in zip(ks + vs, starts):
        np.testing.assert_array_equal(c.numpy(), start)


def test_cached_run_inputs_follow_a_replaced_layer_or_cache(x86_ops: Any) -> None:
    """The run's op inputs are cached on its first layer, keyed on every
    layer and cache: a new layer object or another cache is not answered
    from the stale entry."""
    first, second, other = _layer("wint8"), _layer("wint4"), _layer("w8a8")
    step = _step(2, True, seed=63)

    def check(layers: list[DecoderLayerWeights], ks: list[Any], vs: list[Any]) -> None:
        want_k, want_v = _copies(ks), _copies(vs)
        got = fused.decoder_layers(layers, *step.inputs(), step.cos_sin, step.meta(), ks, vs)
        want = compose_decoder_layers(x86_ops, layers, *step.inputs(), step.cos_sin, step.meta(), want_k, want_v)
        assert got is not None
        for i in range(len(layers)):
            _assert_same((got, ks[i], vs[i]), (want, want_k[i], want_v[i]), 1e-5, 1e-5)

    ks, vs = _run_caches(step, 2)
    check([first, second], ks, vs)
    check([first, other], ks, vs)
    swapped_k, swapped_v = [ks[1], ks[0]], [vs[1], vs[0]]
    check([first, other], swapped_k, swapped_v)
    # a weight or norm assigned in place on the same layer objects, same caches
    mine = replace(first)
    check([mine, other], swapped_k, swapped_v)
    mine.up_gate = other.up_gate
    check([mine, other], swapped_k, swapped_v)
    mine.post_norm = _t(np.full(HIDDEN, 2.0, np.float32))
    check([mine, other], swapped_k, swapped_v)


# ------------------------------------------------------------- in the model


@pytest.mark.parametrize("method", ["wint8", "w8a8"])
def test_the_model_runs_all_its_layers_in_one_fused_call_per_decode_step(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """A quantized tiny dense model on x86: every decode-only step hands its
    whole stack of layers to one fused call, which answers it, and the greedy
    tokens and logprobs equal those of the layer-by-layer ops
    (``FD_X86_FUSED_LAYER=0``)."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.quantization.config import parse_quantization
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    model = generate_checkpoint(tmp_path / "tiny", "tiny-dense", naming="paddle", seed=6, dtype="float32")
    prompts = [[int(t) for t in np.random.default_rng(8).integers(100, 1000, n)] for n in (3, 11, 25)]
    answered: list[int] = []
    real = fused.decoder_layers

    def spy(layers: Any, *args: Any) -> Any:
        out = real(layers, *args)
        if out is not None:
            answered.append(len(layers))
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)

    def run() -> tuple[list[list[int]], list[list[float]]]:
        runner = ModelRunner(model, get_backend("x86"), num_blocks=24, block_size=16,
                             quantization=parse_quantization(method))
        return greedy_generate(runner, prompts, 8)

    tokens, logprobs = run()
    num_layers = 2  # tiny-dense
    assert answered and set(answered) == {num_layers}
    assert len(answered) >= 7  # the decode steps after the prompts' prefill
    monkeypatch.setenv("FD_X86_FUSED_LAYER", "0")
    fused._enabled.cache_clear()
    answered.clear()
    want_tokens, want_logprobs = run()
    assert not answered
    assert tokens == want_tokens
    np.testing.assert_array_equal(np.asarray(logprobs), np.asarray(want_logprobs))  # the same kernels


# ------------------------------------------------------------ KV-cache dtypes


def _typed_caches(step: Step, kv_dtype: str) -> tuple[Any, Any]:
    """The step's start contents in a pool of ``kv_dtype`` (rounded / quantized as the reference stores them)."""
    from fd_core.ops.kv_storage import allocate_pool, store_rows

    rows, kv_heads, head_dim = step.k_start.shape
    pools = []
    for start in (step.k_start, step.v_start):
        pool = allocate_pool(rows, kv_heads, head_dim, kv_dtype, host=True)
        store_rows(_t(start), pool, _t(np.arange(rows, dtype=np.int64)))
        pools.append(pool)
    return pools[0], pools[1]


def _pool_values(pool: Any) -> np.ndarray:
    from fd_core.ops.kv_dtype import dequantize
    from fd_core.ops.kv_storage import kv_dtype_of

    codes = getattr(pool, "codes", None)
    if codes is None:
        return pool.astype("float32").numpy()
    return dequantize(codes.numpy(), pool.scales.numpy(), kv_dtype_of(pool))


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16", "int8", "fp8"])
@pytest.mark.parametrize("method", ["wint8", "w8a8"])
def test_fused_layers_read_and_write_every_kv_dtype(x86_ops: Any, kv_dtype: str, method: str) -> None:
    """Over a bf16 / fp16 / int8 / fp8 cache the fused run answers and equals
    the separate native ops on the same pools: outputs and stored rows."""
    from fd_x86 import ops as native

    if not native._avx512():
        pytest.skip("16- and 8-bit KV pools need AVX-512")
    layers = [_layer(method), replace(_layer(method), post_norm=_layer("wint4").post_norm)]
    step = _step(3, True, seed=61)
    results = []
    for fused_run in (True, False):
        hidden, residual = step.inputs()
        caches = [_typed_caches(step, kv_dtype) for _ in layers]
        ks, vs = [c[0] for c in caches], [c[1] for c in caches]
        if fused_run:
            out = fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), ks, vs)
            assert out is not None, f"the fused run declined a {kv_dtype} cache"
        else:
            out = compose_decoder_layers(x86_ops, layers, hidden, residual, step.cos_sin, step.meta(), ks, vs)
        results.append((out, ks, vs))
    (got, got_k, got_v), (want, want_k, want_v) = results
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
    # a row stored from k / v that differ in the last bit may round to a neighbouring code
    step_size = {"bfloat16": 2**-7, "float16": 2**-10, "int8": 1 / 127, "fp8": 2**-3}[kv_dtype]
    for a, b in zip(got_k + got_v, want_k + want_v):
        np.testing.assert_allclose(_pool_values(a), _pool_values(b), rtol=step_size, atol=step_size * 4)


# ------------------------------------------------------------ 16-bit weights


def _half_layer(dtype: str) -> DecoderLayerWeights:
    """The fp32 layer's linears stored in ``dtype`` (norms stay fp32)."""
    base = _layer(None)
    return replace(base, qkv=base.qkv.astype(dtype), o=base.o.astype(dtype), up_gate=base.up_gate.astype(dtype),
                   down=base.down.astype(dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 5])
def test_fused_layers_run_16_bit_weights_like_the_separate_ops(x86_ops: Any, dtype: str, batch: int) -> None:
    """bf16 / fp16 linears run inside the fused op with fd_x86.dense16's kernel
    (stream below 16 rows: the reference's products exactly): the same
    result as the separate native ops, also mixed with a quantized linear."""
    from fd_x86.dense16 import dense16_enabled

    if not dense16_enabled():
        pytest.skip("no AVX-512 dense16 kernels here")
    layer = _half_layer(dtype)
    mixed = replace(layer, o=_layer("wint8").o)
    step = _step(batch, True, seed=71)
    for candidate in (layer, mixed):
        _assert_same(_run_fused(candidate, step), _run_composed(x86_ops, candidate, step), 1e-5, 1e-5)


def test_a_16_bit_weight_the_op_cannot_read_in_place_is_declined() -> None:
    layer = _half_layer("bfloat16")
    step = _step(2, True, seed=72)
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    strided = replace(layer, down=layer.down.transpose([1, 0]).transpose([1, 0]))  # a non-contiguous view
    if strided.down.is_contiguous():
        pytest.skip("paddle made the view contiguous")
    assert fused.decoder_layers([strided], hidden, residual, step.cos_sin, step.meta(), [k_cache], [v_cache]) is None


# ------------------------------------------------------------ the run cache


def test_the_run_cache_does_not_keep_a_model_alive() -> None:
    """A model's cached runs go with its rotary table: once the model's tensors
    are dropped, nothing of the fused layer's cache holds them (an engine shut
    down in-process gives its weights and KV pools back)."""
    import gc
    import weakref

    layer = _half_layer("bfloat16") if _dense16() else replace(_layer("wint8"))
    layer = replace(layer, input_norm=layer.input_norm.clone())
    step = _step(2, True, seed=81)
    cos_sin = step.cos_sin.clone()
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    assert fused.decoder_layers([layer], hidden, residual, cos_sin, step.meta(), [k_cache], [v_cache]) is not None
    refs = [weakref.ref(t) for t in (layer.input_norm, k_cache, cos_sin)]
    del layer, k_cache, v_cache, cos_sin, hidden, residual
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_a_transposed_view_of_a_weight_is_not_answered_from_the_cache(x86_ops: Any) -> None:
    """A square weight's transpose shares its pointer and shape: the content key
    tells them apart by strides, and the non-contiguous view is declined."""
    if not _dense16():
        pytest.skip("no AVX-512 dense16 kernels here")
    layer = _half_layer("bfloat16")
    assert layer.o.shape[0] == layer.o.shape[1]
    step = _step(2, True, seed=82)
    _run_fused(layer, step)
    flipped = replace(layer, o=layer.o.T)
    hidden, residual = step.inputs()
    k_cache, v_cache = step.caches()
    out = fused.decoder_layers([flipped], hidden, residual, step.cos_sin, step.meta(), [k_cache], [v_cache])
    if flipped.o.is_contiguous():
        _assert_same((out, k_cache, v_cache), _run_composed(x86_ops, flipped, step), 1e-5, 1e-5)
    else:
        assert out is None


def _dense16() -> bool:
    from fd_x86.dense16 import dense16_enabled

    return dense16_enabled()
