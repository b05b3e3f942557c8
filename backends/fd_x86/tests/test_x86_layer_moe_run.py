"""A run of decoder layers whose MoE layers carry their MoE block
(``DecoderLayerWeights.moe``) in one ``fd_x86_decoder_layers`` call: the same
bits as the run split at its MoE layers (each piece ending with the layer's
attention half, ``fd_x86_moe_layer`` between the pieces), the blocks the op
declines and its switch, the op's own checks, and the ERNIE MoE model, whose
whole layer stack becomes one call a decode step with tokens and logprobs
unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fd_x86 import backend, build

paddle = pytest.importorskip("paddle")

import fd_x86.layer as fused  # noqa: E402
import fd_x86.offline  # noqa: E402
from fd_x86.linear import _use_packed  # noqa: E402
from test_x86_layer import HIDDEN, _layer, _step  # noqa: E402

from fd_core.ops.decoder import DecoderLayerWeights, MoELayerWeights, compose_decoder_layers  # noqa: E402
from fd_core.ops.linear import QuantizedWeight  # noqa: E402
from fd_core.quantization.weights import quantize_array, quantize_weight  # noqa: E402

EXPERTS, MOE_INTER, TOP_K = 8, 128, 2


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


def _block(method: str, shared_method: str | None, bias: bool, seed: int) -> MoELayerWeights:
    rng = np.random.default_rng(seed)
    group = 128 if method in ("wint4", "w4a8") else -1

    def stack(d_in: int, d_out: int) -> QuantizedWeight:
        parts = [quantize_array(method, rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05, group)
                 for _ in range(EXPERTS)]
        return QuantizedWeight(method, paddle.to_tensor(np.stack([p[0] for p in parts])),
                               paddle.to_tensor(np.stack([p[1] for p in parts])), d_in, d_out, parts[0][2])

    def dense(d_in: int, d_out: int) -> Any:
        assert shared_method is not None
        w = paddle.to_tensor(rng.standard_normal((d_in, d_out)).astype(np.float32) * 0.05)
        return quantize_weight(shared_method, w, 128 if shared_method in ("wint4", "w4a8") else -1)

    return MoELayerWeights(
        paddle.to_tensor(rng.standard_normal((HIDDEN, EXPERTS)).astype(np.float32) * 0.1),
        paddle.to_tensor(rng.normal(0, 0.05, EXPERTS).astype(np.float32)) if bias else None, TOP_K, True, 1e-12,
        None, None, (stack(HIDDEN, 2 * MOE_INTER), stack(MOE_INTER, HIDDEN)),
        dense(HIDDEN, 2 * MOE_INTER) if shared_method else None, dense(MOE_INTER, HIDDEN) if shared_method else None)


def _moe_layer(method: str, block: MoELayerWeights, head_dim: int = 64) -> DecoderLayerWeights:
    layer = _layer(method, heads=4, kv_heads=2, head_dim=head_dim)
    # its own norms (not the dense layer's), the MLP replaced by the block
    return replace(layer, input_norm=layer.post_norm, post_norm=layer.input_norm, up_gate=None, down=None,
                   moe=block)


def _run(layers: list[DecoderLayerWeights], step: Any, call: Any) -> tuple[Any, ...]:
    hidden, residual = step.inputs()
    caches = [step.caches() for _ in layers]
    out = call(layers, hidden, residual, step.cos_sin, step.meta(), [c[0] for c in caches], [c[1] for c in caches])
    assert out is not None
    return (*out, *(t for c in caches for t in c))


BLOCKS = [("wint8", "wint8"), ("wint4", "wint8"), ("w8a8", "w8a8"), ("wint8", None), ("w4a8", "w4a8")]


@pytest.mark.parametrize("method,shared", BLOCKS, ids=[f"{m}-{s}" for m, s in BLOCKS])
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_a_run_with_moe_layers_equals_the_run_split_at_them(
    x86_ops: Any, monkeypatch: pytest.MonkeyPatch, method: str, shared: str | None, batch: int, bias: bool
) -> None:
    """[dense, MoE, dense, MoE (no shared expert)] in one call against the
    split run (FD_X86_FUSED_MOE_RUN=0: the fused attention halves and
    fd_x86_moe_layer between them): the same kernels, so the same bits in
    the outputs and every cache."""
    monkeypatch.setenv("FD_X86_RUN_PLAN", "0")  # the spy reads fd_x86_decoder_layers' arguments
    if method == "w4a8" and not fd_x86.offline.available():
        pytest.skip("the w4a8 kernels need AVX-512 VNNI")
    dense = _layer(method)
    layers = [dense, _moe_layer(method, _block(method, shared, bias, seed=batch)), dense,
              _moe_layer(method, _block(method, None, bias, seed=batch + 100))]
    step = _step(batch, True, seed=batch * 3 + bias)
    calls: list[int] = []
    real = fused.load_ops().fd_x86_decoder_layers

    def counted(*args: Any) -> Any:
        calls.append(len(args[6]) // 2)  # the layers in the call (two norms each)
        return real(*args)

    monkeypatch.setattr(fused.load_ops(), "fd_x86_decoder_layers", counted)
    got = _run(layers, step, x86_ops.decoder_layers)
    assert calls == [4]  # the whole run in one call
    monkeypatch.setenv("FD_X86_FUSED_MOE_RUN", "0")
    calls.clear()
    want = _run(layers, step, x86_ops.decoder_layers)
    assert calls == [2, 2]  # [dense, attention half] twice, the blocks between
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert float(np.abs(got[0].numpy()).max()) > 0


def test_a_run_may_end_with_a_moe_layer_and_begin_with_one(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    layers = [_moe_layer("wint8", _block("wint8", "wint8", True, seed=1)),
              _moe_layer("wint8", _block("wint8", "wint8", True, seed=2))]
    step = _step(2, False, seed=5)  # the first layer starts the residual stream
    got = _run(layers, step, fused.decoder_layers)
    monkeypatch.setenv("FD_X86_FUSED_MOE_RUN", "0")
    assert fused.decoder_layers(layers, *step.inputs(), step.cos_sin, step.meta(), *map(list, zip(
        step.caches(), step.caches()))) is None
    want = _run(layers, step, x86_ops.decoder_layers)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_block_the_moe_op_declines_declines_the_run(x86_ops: Any, ref_ops: Any) -> None:
    """Unquantized experts (fd_x86_moe_layer has no kernel for them): the op
    declines the whole run, and Ops runs it split (the composition)."""
    block = _block("wint8", "wint8", True, seed=3)
    rng = np.random.default_rng(4)
    float_block = replace(block, quant=None, up_gate_weights=paddle.to_tensor(
        rng.standard_normal((EXPERTS, HIDDEN, 2 * MOE_INTER)).astype(np.float32) * 0.05),
        down_weights=paddle.to_tensor(rng.standard_normal((EXPERTS, MOE_INTER, HIDDEN)).astype(np.float32) * 0.05))
    layers = [_layer("wint8"), _moe_layer("wint8", float_block)]
    step = _step(1, True, seed=7)
    hidden, residual = step.inputs()
    k, v = step.caches()
    k2, v2 = step.caches()
    assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), [k, k2], [v, v2]) is None
    out = _run(layers, step, x86_ops.decoder_layers)
    want = _run(layers, step, lambda *args: compose_decoder_layers(ref_ops, *args))
    for a, b in zip(out, want, strict=True):  # the reference's numerics (wint8: the same codes)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


def test_the_op_checks_its_layer_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_X86_RUN_PLAN", "0")  # the spy reads fd_x86_decoder_layers' arguments
    layers = [_layer("wint8"), _moe_layer("wint8", _block("wint8", "wint8", True, seed=6))]
    step = _step(1, True, seed=9)
    caches = [step.caches() for _ in layers]
    meta = step.meta()
    real = fused.load_ops().fd_x86_decoder_layers
    seen: list[tuple] = []

    def capture(*args: Any) -> Any:
        seen.append(args)
        return real(*args)

    ops = fused.load_ops()
    try:
        ops.fd_x86_decoder_layers = capture
        assert fused.decoder_layers(layers, *step.inputs(), step.cos_sin, meta, [c[0] for c in caches],
                                    [c[1] for c in caches]) is not None
    finally:
        ops.fd_x86_decoder_layers = real
    args = list(seen[0])
    kinds = 16  # after the 15 inputs and has_residual
    assert args[kinds] == [0, 2]
    for bad, message in (([2, 0], "layer 1: qkv has"), ([0, 0], "out_features"), ([1, 2], "attention only, the last layer only"),
                         ([0, 3], "has kind 3")):
        args[kinds] = bad
        with pytest.raises(Exception, match=message):
            real(*args)
    # a bad MoE attribute (the isa code, its 11th int) raises before any cache is written
    args[kinds] = [0, 2]
    before = [c.numpy().copy() for pair in caches for c in pair]
    args[-8] = [*args[-8][:10], 3]  # moe_ints (then moe_norm_min, int8_act_rows, the 4 head attributes, embed)
    args[0] = args[0] * 2  # other k / v values than the cache holds: a store would show
    with pytest.raises(Exception, match="isa must be"):
        real(*args)
    for c, b in zip((c for pair in caches for c in pair), before, strict=True):
        np.testing.assert_array_equal(c.numpy(), b)


@pytest.mark.parametrize("quantization", ["wint8", "wint4", "w8a8"])
def test_the_moe_model_runs_its_whole_stack_in_one_call(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, quantization: str
) -> None:
    """A quantized tiny MoE model (dense, MoE, MoE) on x86: every decode-only
    step is one fused call of all three layers, the MoE blocks inside, and
    the greedy tokens and logprobs equal the split run's
    (``FD_X86_FUSED_MOE_RUN=0``) bit for bit."""
    from fd_core.backends import get_backend
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.quantization.config import parse_quantization
    from fd_core.testing.checkpoints import generate_checkpoint
    from fd_core.testing.greedy import greedy_generate

    model = generate_checkpoint(tmp_path / "tiny-moe", "tiny-moe", naming="paddle", seed=6, dtype="float32")
    prompts = [[int(t) for t in np.random.default_rng(8).integers(100, 1000, n)] for n in (3, 11, 25)]
    answered: list[list[str]] = []
    real = fused.decoder_layers

    def spy(layers: Any, *args: Any) -> Any:
        out = real(layers, *args)
        if out is not None:
            answered.append(["moe" if layer.moe is not None else "half" if layer.attention_only else "dense"
                             for layer in layers])
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)

    def run() -> tuple[list[list[int]], list[list[float]]]:
        runner = ModelRunner(model, get_backend("x86"), num_blocks=24, block_size=16,
                             quantization=parse_quantization(quantization, "Ernie4_5_MoeForCausalLM"))
        return greedy_generate(runner, prompts, 6)

    tokens, logprobs = run()
    assert len(answered) >= 5 and answered == [["dense", "moe", "moe"]] * len(answered)
    monkeypatch.setenv("FD_X86_FUSED_MOE_RUN", "0")
    answered.clear()
    want_tokens, want_logprobs = run()
    assert answered and ["dense", "moe", "moe"] not in answered
    assert tokens == want_tokens
    np.testing.assert_array_equal(np.asarray(logprobs), np.asarray(want_logprobs))


def test_the_moe_switches_are_read_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run cached while the MoE ops were on is declined once FD_X86_MOE_LAYER=0 (or
    FD_X86_MOE_NATIVE=0) is set, and taken again after: the same layers and caches each call,
    as the engine's steps give them."""
    layers = [_layer("wint8"), _moe_layer("wint8", _block("wint8", "wint8", True, seed=11))]
    step = _step(1, True, seed=13)
    caches = [step.caches() for _ in layers]
    ks, vs = [c[0] for c in caches], [c[1] for c in caches]

    def call() -> Any:
        return fused.decoder_layers(layers, *step.inputs(), step.cos_sin, step.meta(), ks, vs)

    assert call() is not None
    for name in ("FD_X86_MOE_LAYER", "FD_X86_MOE_NATIVE", "FD_X86_FUSED_MOE_RUN"):
        monkeypatch.setenv(name, "0")
        assert call() is None, name
        monkeypatch.delenv(name)
        assert call() is not None, name


def test_every_moe_check_runs_before_a_cache_is_written() -> None:
    """A block whose down projection holds fewer experts than its router and up_gate: the op
    raises (a Python error, not an abort) and no layer's cache has been written."""
    block = _block("wint8", "wint8", True, seed=15)
    up, down = block.quant
    short = QuantizedWeight(down.method, down.qweight[:4], down.scales[:4], down.in_features, down.out_features,
                            down.group_size)
    layers = [_layer("wint8"), _moe_layer("wint8", replace(block, quant=(up, short)))]
    step = _step(2, True, seed=17)
    caches = [step.caches() for _ in layers]
    before = [c.numpy().copy() for pair in caches for c in pair]
    with pytest.raises(Exception, match="down qweight is"):
        fused.decoder_layers(layers, *step.inputs(), step.cos_sin, step.meta(), [c[0] for c in caches],
                             [c[1] for c in caches])
    for c, b in zip((c for pair in caches for c in pair), before, strict=True):
        np.testing.assert_array_equal(c.numpy(), b)


def test_a_reassigned_expert_tensor_is_seen(x86_ops: Any) -> None:
    """The MoE entry is checked by identity on every tensor it reads: scales reassigned on the
    same QuantizedWeight objects change the run's output (moe_layer's too)."""
    block = _block("wint8", "wint8", True, seed=19)
    layers = [_layer("wint8"), _moe_layer("wint8", block)]
    step = _step(1, True, seed=21)
    first = _run(layers, step, fused.decoder_layers)[0].numpy()
    down, shared_down = block.quant[1], block.shared_down
    down.scales = down.scales * 2
    shared_down.scales = shared_down.scales * 2
    second = _run(layers, step, fused.decoder_layers)[0].numpy()
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, first * 2, rtol=1e-5, atol=1e-5)  # the block's output doubles


@pytest.mark.parametrize("method,shared", [("wint8", "wint8"), ("wint4", "wint8")])
def test_prefill_sized_rows_with_int8_activations_equal_the_split_run(
    x86_ops: Any, monkeypatch: pytest.MonkeyPatch, method: str, shared: str
) -> None:
    """40 decode rows with FD_X86_PREFILL_INT8_ACT=1 (the experts' opt-in int8 activations at 32+
    rows), and a run [MoE, dense, attention half]: bit-equal to the split run."""
    monkeypatch.setenv("FD_X86_RUN_PLAN", "0")  # the spy reads fd_x86_decoder_layers' arguments
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    dense = _layer(method)
    half = replace(_layer(method), up_gate=None, down=None)
    layers = [_moe_layer(method, _block(method, shared, True, seed=23)), dense, half]
    step = _step(40, True, seed=25)
    calls: list[int] = []
    real = fused.load_ops().fd_x86_decoder_layers

    def counted(*args: Any) -> Any:
        calls.append(args[-6])  # int8_act_rows (the 4 head attributes and embed follow it)
        return real(*args)

    monkeypatch.setattr(fused.load_ops(), "fd_x86_decoder_layers", counted)
    got = _run(layers, step, x86_ops.decoder_layers)
    assert calls == [32]  # the whole run, its MoE blocks on int8 activations
    monkeypatch.setenv("FD_X86_FUSED_MOE_RUN", "0")
    want = _run(layers, step, x86_ops.decoder_layers)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    monkeypatch.delenv("FD_X86_FUSED_MOE_RUN")
    monkeypatch.delenv("FD_X86_PREFILL_INT8_ACT")
    fp32 = _run(layers, step, x86_ops.decoder_layers)
    assert not np.array_equal(got[0].numpy(), fp32[0].numpy())  # the opt-in changed the experts' numerics


@pytest.mark.parametrize("quantization", ["wint4", "w8a8"])
def test_engine_outputs_do_not_change_with_preemption_and_chunking(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, quantization: str
) -> None:
    """The engine on x86 with a quantized tiny MoE model: decode-only steps run the whole stack in one
    call (the MoE blocks inside), mixed steps the split run; greedy tokens with a KV cache too small for
    the batch (preemption) and a 40-token step budget (chunked prefills) equal the default run's."""
    from fd_core import LLM, SamplingParams
    from fd_core.testing.checkpoints import generate_checkpoint

    checkpoint = generate_checkpoint(tmp_path / "tiny-moe", "tiny-moe", naming="paddle", seed=7, dtype="float32")
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(100, 1000, n)] for n in (5, 17, 33, 64, 9, 48)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    moe_runs: list[int] = []
    real = fused.decoder_layers

    def spy(layers: Any, *args: Any) -> Any:
        out = real(layers, *args)
        if out is not None and any(layer.moe is not None for layer in layers):
            moe_runs.append(len(layers))
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)

    def run(**kwargs: Any) -> list[list[int]]:
        llm = LLM(str(checkpoint), backend="x86", max_model_len=512, max_num_seqs=32, enable_prefix_caching=False,
                  quantization=quantization, **kwargs)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    base = run()
    assert moe_runs and set(moe_runs) == {3}  # the whole stack (dense, MoE, MoE) in one call
    moe_runs.clear()
    assert run(num_gpu_blocks_override=10, block_size=16, max_num_batched_tokens=40) == base
    assert moe_runs
