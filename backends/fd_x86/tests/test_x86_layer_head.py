"""A run of decoder layers that ends with the model's head (``DecoderHead``:
the final norm and the LM head) in one ``fd_x86_decoder_layers`` call: the
same bits as the run and then the head's own ops, for every head form the
op takes (quantized, bf16 in place, wint8's contract kernel above 7 rows),
after dense and MoE runs; what it declines; its checks before any cache
write; and the models, whose decode steps then make one call after the
embedding with tokens unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fd_x86 import build

paddle = pytest.importorskip("paddle")

import fd_x86.layer as fused  # noqa: E402
import fd_x86.offline  # noqa: E402
from test_x86_layer import HIDDEN, _layer, _step, _t, usable  # noqa: E402, F401 (usable: its module fixture)
from test_x86_layer_moe_run import _block, _moe_layer  # noqa: E402

from fd_core.ops.decoder import DecoderHead  # noqa: E402
from fd_core.quantization.weights import quantize_weight  # noqa: E402

VOCAB = 200  # not a multiple of 16: the packed kernels' tail


pytestmark = pytest.mark.usefixtures("fused_switches_unset")


def _head(form: str, seed: int = 7) -> DecoderHead:
    rng = np.random.default_rng(seed)
    w = (rng.normal(0, 1, (HIDDEN, VOCAB)) / np.sqrt(HIDDEN)).astype(np.float32)
    if form == "bfloat16":
        weight = _t(w).astype("bfloat16")
    elif form == "float32":
        weight = _t(w)
    else:
        weight = quantize_weight(form, w, 128)
    return DecoderHead(_t(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)), 1e-6, weight)


def _logits(x86_ops: Any, layers: list[Any], step: Any, head: DecoderHead, fold: bool,
            monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, list[np.ndarray]]:
    """The logits and every cache after the run, the head in the run (``fold``) or after it."""
    monkeypatch.setenv("FD_X86_FUSED_HEAD", "1" if fold else "0")
    hidden, residual = step.inputs()
    caches = [step.caches() for _ in layers]
    logits = x86_ops.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), [c[0] for c in caches],
                                    [c[1] for c in caches], head)
    return logits.numpy(), [t.numpy() for c in caches for t in c]


HEADS = ["wint8", "wint4", "w8a8", "w4a8", "bfloat16"]


@pytest.mark.parametrize("form", HEADS)
# 9: wint8's contract-layout kernel, as fd_linear picks there; 17 / 33: a bf16 head's GEMM (AMX-BF16 where the
# CPU has it, the wide-matrix rule from 32 rows)
@pytest.mark.parametrize("batch", [1, 9, 17, 33])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_the_head_in_the_run_equals_the_head_after_it(x86_ops: Any, monkeypatch: pytest.MonkeyPatch, form: str,
                                                      batch: int, moe: bool) -> None:
    """[dense, dense] or [dense, MoE] then the head: one call against the run
    and the head's own ops (fd_rms_norm, fd_linear), the same kernels, so the
    same bits in the logits and every cache."""
    monkeypatch.setenv("FD_X86_RUN_PLAN", "0")  # the spy reads fd_x86_decoder_layers' arguments
    if "w4a8" in (form, "w4a8" if moe else "") and not fd_x86.offline.available():
        pytest.skip("the w4a8 kernels need AVX-512 VNNI")
    method = "w4a8" if form == "w4a8" else "wint8"
    layers = [_layer(method), _moe_layer(method, _block(method, method, True, 3)) if moe else _layer(method)]
    step = _step(batch, True, seed=batch)
    head = _head(form)
    calls = []
    ops = build.load_ops()
    real = ops.fd_x86_decoder_layers
    monkeypatch.setattr(ops, "fd_x86_decoder_layers", lambda *a: calls.append(a[-5]) or real(*a))
    got, got_caches = _logits(x86_ops, layers, step, head, True, monkeypatch)
    want, want_caches = _logits(x86_ops, layers, step, head, False, monkeypatch)
    assert calls[0] >= 0 and calls[1] == -1, "the head ran in the first call only"
    assert got.shape == (batch, VOCAB)
    np.testing.assert_array_equal(got, want)
    for g, w in zip(got_caches, want_caches):
        np.testing.assert_array_equal(g, w)


def test_runs_the_head_cannot_take_are_declined(x86_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A float64 head (no kernel of a run's), a norm of the wrong width, a
    prefill step, or the switch: the plugin declines and Ops runs the layers,
    then the head's ops (the same logits as the head after the run)."""
    layers = [_layer("wint8"), _layer("wint8")]
    step = _step(2, True, seed=5)
    hidden, residual = step.inputs()
    k, v = zip(*(step.caches() for _ in layers))
    fp64 = replace(_head("float32"), weight=_head("float32").weight.astype("float64"))
    assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), list(k), list(v), fp64) is None
    narrow = replace(_head("wint8"), norm=_t(np.ones(HIDDEN // 2, np.float32)))
    assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), list(k), list(v), narrow) is None
    monkeypatch.setenv("FD_X86_FUSED_HEAD", "0")
    assert fused.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), list(k), list(v),
                                _head("wint8")) is None
    monkeypatch.delenv("FD_X86_FUSED_HEAD")
    prefill = _step(1, True, seed=6, prefills=1)
    hidden, residual = prefill.inputs()
    k, v = zip(*(prefill.caches() for _ in layers))
    assert fused.decoder_layers(layers, hidden, residual, prefill.cos_sin, prefill.meta(), list(k), list(v),
                                _head("wint8")) is None
    # Ops answers all of them: the layers, then the head's own ops
    got, _ = _logits(x86_ops, layers, step, fp64, True, monkeypatch)
    hidden, residual = step.inputs()
    caches = [step.caches() for _ in layers]
    h, r = x86_ops.decoder_layers(layers, hidden, residual, step.cos_sin, step.meta(), [c[0] for c in caches],
                                  [c[1] for c in caches])
    np.testing.assert_array_equal(got, fp64.run(x86_ops, h, r).numpy())


def test_the_head_is_checked_before_any_cache_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head whose input width is not the run's: the op refuses it naming
    the weight, and no layer has written its new token's K / V."""
    layers = [_layer("wint8"), _layer("wint8")]
    step = _step(1, True, seed=8)
    rng = np.random.default_rng(0)
    wide = quantize_weight("wint8", rng.normal(0, 0.05, (2 * HIDDEN, VOCAB)).astype(np.float32), 128)
    caches = [step.caches() for _ in layers]
    inputs = fused._run_inputs(layers, step.cos_sin, [c[0] for c in caches], [c[1] for c in caches], 1,
                               _head("wint8"))
    assert inputs is not None
    head_tensors, head_ints = inputs[13], inputs[14]
    assert head_ints[1] == VOCAB
    bad = fused._build_head(DecoderHead(head_tensors[0], 1e-6, wide), HIDDEN, False)
    assert bad is not None
    hidden, residual = step.inputs()
    before = [t.numpy().copy() for c in caches for t in c]
    meta = step.meta()
    ints = fused.step_ints(meta)
    first = layers[0]
    with pytest.raises(Exception, match="fd_x86_decoder_layers.*packed weight has"):
        build.load_ops().fd_x86_decoder_layers(
            hidden, residual, step.cos_sin, ints, ints, hidden, *inputs[:6], [hidden],
            bad[0][0], bad[0][1:], True, inputs[9], inputs[6], inputs[7], inputs[8], float(first.eps),
            int(first.num_heads), int(first.num_kv_heads), bool(first.interleaved_rope), int(meta.block_size),
            float(first.scale), 2, [], [], 0, bad[1][0], bad[1][1], bad[1][2], 1e-6, False)
    for b, after in zip(before, (t for pair in caches for t in pair)):
        np.testing.assert_array_equal(b, after.numpy())


@pytest.mark.parametrize("head_form", ["wint8", "wint4"])
def test_opt_in_int8_activations_apply_in_the_run_as_in_fd_linear(x86_ops: Any, monkeypatch: pytest.MonkeyPatch,
                                                                  head_form: str) -> None:
    """FD_X86_PREFILL_INT8_ACT=1 at 33 rows: the run's wint8 / wint4 linears and head take the int8-activation
    kernels fd_linear takes for as many rows, so the logits equal the head after the run and the layers one by
    one (FD_X86_FUSED_LAYER=0), and differ from the fp32-activation kernels' (the opt-in is seen)."""
    if not fd_x86.offline.available():
        pytest.skip("the int8-activation kernels need AVX-512 VNNI")
    layers = [_layer("wint8"), _layer("wint4")]
    step = _step(33, True, seed=12)
    head = _head(head_form)
    monkeypatch.setenv("FD_X86_PREFILL_INT8_ACT", "1")
    got, got_caches = _logits(x86_ops, layers, step, head, True, monkeypatch)
    want, want_caches = _logits(x86_ops, layers, step, head, False, monkeypatch)
    np.testing.assert_array_equal(got, want)
    monkeypatch.setenv("FD_X86_FUSED_LAYER", "0")
    fused._enabled.cache_clear()
    unfused, unfused_caches = _logits(x86_ops, layers, step, head, False, monkeypatch)
    monkeypatch.delenv("FD_X86_FUSED_LAYER")
    fused._enabled.cache_clear()
    np.testing.assert_array_equal(got, unfused)
    for g, w, u in zip(got_caches, want_caches, unfused_caches):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(g, u)
    monkeypatch.delenv("FD_X86_PREFILL_INT8_ACT")
    fp32_act, _ = _logits(x86_ops, layers, step, head, True, monkeypatch)
    assert not np.array_equal(got, fp32_act)


def test_a_plugin_declaring_heads_must_take_the_head() -> None:
    """A plugin that declares FD_DECODER_LAYERS_HEAD but whose fd_decoder_layers has no ``head`` argument would
    hand back (hidden, residual) as the logits: Ops refuses it at start, naming the plugin."""
    from fd_core.backends import cpu
    from fd_core.backends.base import Ops
    from fd_core.plugins import hookimpl
    from fd_core.plugins.manager import make_plugin_manager

    class _Old:
        FD_DECODER_LAYERS_HEAD = True

        @hookimpl
        def fd_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches):  # noqa: ANN001, ANN201
            return None

    with pytest.raises(ValueError, match="declares FD_DECODER_LAYERS_HEAD, but its fd_decoder_layers takes no 'head'"):
        Ops(make_plugin_manager(cpu, _Old()), "old")


@pytest.mark.parametrize("checkpoint,quantization", [
    ("tiny-dense", "wint8"), ("tiny-dense", None), ("tiny-moe", "wint4"),
    ("tiny-moe", '{"quantization": "wint8", "lm_head_quant_type": "wint8"}'),
])
def test_the_models_decode_the_same_tokens_with_the_head_in_the_run(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, checkpoint: str,
    quantization: str | None,
) -> None:
    """ERNIE dense and MoE: greedy tokens and logprobs equal with the head in
    the run and after it, and the separate norm / head ops gone from decode
    steps."""
    from fd_core import LLM, SamplingParams
    from fd_core.testing.checkpoints import generate_checkpoint

    path = generate_checkpoint(tmp_path_factory.mktemp(checkpoint) / "model", checkpoint, naming="paddle", seed=1)
    kwargs: dict[str, Any] = {"quantization": quantization} if quantization else {"dtype": "bfloat16"}
    llm = LLM(str(path), backend="x86", max_model_len=256, max_num_seqs=4, enable_prefix_caching=False, **kwargs)
    model = llm.engine.core.runner.model
    prompts = [{"prompt_token_ids": [int(t) for t in np.random.default_rng(i).integers(3, 200, 9 + 5 * i)]}
               for i in range(3)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    assert model.ops.fuses_heads
    answered: list[bool] = []  # per run handed a head: whether the op took it
    real = fused.decoder_layers

    def spy(*args: Any) -> Any:
        out = real(*args)
        if args[-1] is not None:
            answered.append(out is not None)
        return out

    monkeypatch.setattr(fused, "decoder_layers", spy)
    outs = {}
    for fold in ("1", "0"):
        monkeypatch.setenv("FD_X86_FUSED_HEAD", fold)
        answered.clear()
        result = llm.generate(prompts, params, use_tqdm=False)
        outs[fold] = ([list(o.outputs[0].token_ids) for o in result],
                      [[{k: v.logprob for k, v in p.items()} for p in o.outputs[0].logprobs] for o in result])
        # every decode step hands its head to the run; the op takes it unless switched off
        assert len(answered) >= 11 and all(answered) == (fold == "1") and any(answered) == (fold == "1")
    assert outs["1"] == outs["0"]
