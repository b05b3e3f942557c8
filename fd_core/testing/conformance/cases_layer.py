"""The optional fused ``decoder_layers`` against the reference's unfused layers.

A run of dense decoder layers (each: norm, QKV, rotary + cache store, paged
attention, O, norm, gated MLP; one layer, and two with their own weights and
caches) on a decode-only step and on a mixed one, starting in the first
layer's form (no residual yet) and a later layer's, with unquantized
weights and every quantization method the backend lists. The backend runs
``Ops.decoder_layers`` (its fused kernel where it answers, else its unfused
hooks); the reference chains its own kernels
(``fd_core.ops.decoder.compose_decoder_layers``). Each layer reads the cache
it has just written, so a wrong store, or a layer given another's cache,
shows in the outputs. The layer's optional parts (Qwen3's q/k norms with
half-split rotary; q/k/v and output biases) run in their own cases: a
backend's fused kernel answers them or declines, and either way the result
is the reference's. A run may end with an attention-only layer (a MoE
layer's attention half: no ``up_gate`` / ``down``), alone or after a dense
layer, which returns the post-attention-normed hidden state and the
residual stream. A run may hold MoE layers that carry their MoE block
(``DecoderLayerWeights.moe``): what the model runs (``Ops.decoder_layers``:
the backend's fused kernel when its plugin declares ``FD_DECODER_LAYERS_MOE``
and answers, else the run split at its MoE layers) against the reference's
composition, the experts quantized with each method; the router's bias
tiers the experts so that every token picks the same ones on both sides
(routing itself is ``cases_moe_layer``'s). A run may end with the model's
head (``DecoderHead``: the final norm and an LM head quantized like the
layers): the backend's kernel when its plugin declares
``FD_DECODER_LAYERS_HEAD`` (both flags for a MoE run) and answers, else the
run and the head's own hooks, against the reference's logits. Such a run
may start at the token embedding (``DecoderEmbedding``): the backend's
kernel when its plugin declares ``FD_DECODER_LAYERS_EMBEDDING`` too, else
the rows taken first.

``decoder_steps`` (multi-step decoding: such whole-model runs for
several decode steps in one call, each row's token fed to the next)
against the same backend's runs one step at a time with numpy's argmax
(greedy rows) or the backend's own ``sample`` (sampled rows) between: the
same tokens exactly (what the op promises; the runs themselves
are checked against the reference above). A backend without the op answers
None and its engine steps one run at a time, which is then both sides.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fd_core.ops.attention import AttentionMetadata
from fd_core.ops.decoder import (
    DecoderEmbedding,
    DecoderHead,
    DecoderLayerWeights,
    DecoderSampling,
    MoELayerWeights,
    compose_decoder_layers,
)
from fd_core.ops.rope import rope_cos_sin
from fd_core.testing.conformance import STATE_KEY
from fd_core.testing.conformance.cases_attention import Step, _block_tables, _context
from fd_core.testing.conformance.cases_dense import _reference_quantizer
from fd_core.testing.conformance.cases_moe import ACT_QUANTIZED, expert_args
from fd_core.testing.conformance.harness import Harness, Tolerance, case_rng, replace_tensors

HIDDEN, INTER = 256, 512
HEAD_VOCAB = 200  # the LM head's outputs: not a multiple of 16 (kernels' tails)
LAYER_STEPS = [
    Step("decode-b1", 4, 2, 64, 16, (9,), ()),
    Step("decode-b5", 4, 2, 64, 16, (1, 17, 40, 64, 3), ()),
    Step("mixed", 4, 1, 64, 16, (5, 33), ((0, 7), (20, 4))),
]
# a layer chains ~7 kernels: allow their fp32 differences to compound
LAYER_TOLERANCE = Tolerance(rtol=2e-4, atol=2e-4)
# w8a8 rounds activations to int8 codes; a norm that differs in the last bit
# can move a code by one, which the next matmul spreads over its outputs
W8A8_TOLERANCE = Tolerance(rtol=5e-2, atol=5e-2)
# methods that quantize activations on the fly: a last-bit difference upstream can move one
# element to the next code; e4m3 codes are 1/8 apart (relative), so block_wise_fp8 moves more
ACT_QUANT_TOLERANCE = {"w8a8": W8A8_TOLERANCE, "w4a8": W8A8_TOLERANCE,
                       "block_wise_fp8": Tolerance(rtol=2e-1, atol=2e-1), "w4afp8": Tolerance(rtol=2e-1, atol=2e-1)}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "method" in metafunc.fixturenames and metafunc.function.__name__ in (
            "test_decoder_layers", "test_decoder_layers_attention_only", "test_decoder_layers_moe",
            "test_decoder_layers_head", "test_decoder_layers_embedding"):
        state = metafunc.config.stash[STATE_KEY]
        methods = state.quant_methods()
        metafunc.parametrize("method", ["none", *methods])


# the optional parts of a layer: name -> (tensors it adds, interleaved rotary)
VARIANTS = {"plain": ((), True), "qk-norm": (("q_norm", "k_norm"), False), "biases": (("qkv_bias", "o_bias"), True)}


def _weights(rng: np.random.Generator, step: Step, variant: str = "plain") -> dict[str, np.ndarray]:
    q, kv = step.heads * step.head_dim, step.kv_heads * step.head_dim
    shapes = {"qkv": (HIDDEN, q + 2 * kv), "o": (q, HIDDEN), "up_gate": (HIDDEN, 2 * INTER), "down": (INTER, HIDDEN)}
    out = {name: rng.normal(0, shape[0] ** -0.5, shape).astype(np.float32) for name, shape in shapes.items()}
    out["input_norm"] = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
    out["post_norm"] = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
    extra_sizes = {"q_norm": step.head_dim, "k_norm": step.head_dim, "qkv_bias": q + 2 * kv, "o_bias": HIDDEN}
    for name in VARIANTS[variant][0]:
        low, high = (0.5, 1.5) if name.endswith("norm") else (-0.5, 0.5)
        out[name] = rng.uniform(low, high, extra_sizes[name]).astype(np.float32)
    return out


def _layer(fd: Harness, on_reference: bool, step: Step, method: str, w: dict[str, np.ndarray]) -> DecoderLayerWeights:
    put = fd.host if on_reference else fd.device
    linears: dict[str, Any] = {}
    for name in ("qkv", "o", "up_gate", "down"):
        if method == "none":
            linears[name] = put(fd.rounded(w[name]))
            continue
        with fd.on_host():
            quant = _reference_quantizer(method)(method, fd.host(w[name]))
        linears[name] = quant if on_reference else replace_tensors(quant, lambda t: t.to(fd.place))
    extras = {name: put(w[name]) for name in ("q_norm", "k_norm", "qkv_bias", "o_bias") if name in w}
    return DecoderLayerWeights(
        put(w["input_norm"]), put(w["post_norm"]), 1e-5, num_heads=step.heads, num_kv_heads=step.kv_heads,
        head_dim=step.head_dim, scale=step.head_dim**-0.5, interleaved_rope="q_norm" not in w, **linears, **extras,
    )


MOE_EXPERTS, MOE_TOP_K, MOE_INTER = 8, 2, 256


def _moe_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A MoE block's weights; the bias tiers the experts (selection only, far
    above the router's probabilities), so both sides pick the same top-k."""
    e, i = MOE_EXPERTS, MOE_INTER
    return {"gate": rng.normal(0, 2 * HIDDEN**-0.5, (HIDDEN, e)).astype(np.float32),
            "bias": (rng.permutation(e) * 2.0).astype(np.float32),
            "up_gate": rng.normal(0, HIDDEN**-0.5, (e, HIDDEN, 2 * i)).astype(np.float32),
            "down": rng.normal(0, i**-0.5, (e, i, HIDDEN)).astype(np.float32),
            "s_up": rng.normal(0, HIDDEN**-0.5, (HIDDEN, 2 * i)).astype(np.float32),
            "s_down": rng.normal(0, i**-0.5, (i, HIDDEN)).astype(np.float32)}


def _moe_block(fd: Harness, on_reference: bool, method: str, m: dict[str, np.ndarray]) -> MoELayerWeights:
    args, host = expert_args(fd, method, m["up_gate"], m["down"], m["s_up"], m["s_down"])
    w = host if on_reference else args
    gate, bias = ((fd.host(m["gate"]), fd.host(m["bias"])) if on_reference
                  else (fd.device(m["gate"], "float32"), fd.device(m["bias"], "float32")))
    return MoELayerWeights(gate, bias, MOE_TOP_K, True, 1e-12, w["up_gate_weights"], w["down_weights"], w["quant"],
                           w["shared_up_gate"], w["shared_down"])


def _head(fd: Harness, on_reference: bool, method: str, h: dict[str, np.ndarray]) -> DecoderHead:
    """The model's final norm and LM head, the head quantized with the layers' method."""
    put = fd.host if on_reference else fd.device
    if method == "none":
        weight: Any = put(fd.rounded(h["weight"]))
    else:
        with fd.on_host():
            quant = _reference_quantizer(method)(method, fd.host(h["weight"]))
        weight = quant if on_reference else replace_tensors(quant, lambda t: t.to(fd.place))
    return DecoderHead(put(h["norm"]), 1e-6, weight)


def _run(fd: Harness, on_reference: bool, step: Step, method: str, data: dict[str, Any],
         tables: list[list[int]], num_blocks: int, with_residual: bool, kv_dtype: str = "float32",
         attention_only: bool = False) -> Any:
    call = fd.call_reference if on_reference else fd.call
    put = fd.host if on_reference else fd.device
    where: contextlib.AbstractContextManager[None] = fd.on_host() if on_reference else contextlib.nullcontext()
    with where:
        meta = AttentionMetadata.build(step.query_lens, step.seq_lens, tables, step.block_size,
                                       len(step.decode_lens))
    layers, k_caches, v_caches = [], [], []
    for weights, ctx_k, ctx_v in zip(data["weights"], data["ctx_k"], data["ctx_v"]):
        k_cache, v_cache = call("allocate_kv_cache", num_blocks=num_blocks, block_size=step.block_size,
                                num_kv_heads=step.kv_heads, head_dim=step.head_dim, dtype=kv_dtype,
                                location="device")
        if len(data["ctx_slots"]):
            call("write_kv_cache", k=put(ctx_k), v=put(ctx_v), k_cache=k_cache, v_cache=v_cache,
                 slot_mapping=put(data["ctx_slots"]))
        layers.append(_layer(fd, on_reference, step, method, weights))
        k_caches.append(k_cache)
        v_caches.append(v_cache)
    if attention_only:
        layers[-1] = replace(layers[-1], up_gate=None, down=None)
    for i, block in data.get("moe", {}).items():
        layers[i] = replace(layers[i], up_gate=None, down=None, moe=_moe_block(fd, on_reference, method, block))
    hidden: Any = put(data["hidden"])
    if "embedding" in data:  # the run starts at the token embedding
        hidden = DecoderEmbedding(put(data["embedding"]["table"]), put(data["embedding"]["ids"]))
        if on_reference:
            with fd.on_host():
                hidden = hidden.run()
    args = {"layers": layers, "hidden": hidden,
            "residual": put(data["residual"]) if with_residual else None, "cos_sin": put(data["cos_sin"]),
            "metadata": meta, "k_caches": k_caches, "v_caches": v_caches}
    if "head" in data:  # the run ends with the model's head: the logits
        head = _head(fd, on_reference, method, data["head"])
        if on_reference:
            with fd.on_host():
                return head.run(fd.reference.ops, *compose_decoder_layers(fd.reference.ops, **args))
        return fd.call_run(**args, head=head)
    if on_reference:
        with fd.on_host():
            return compose_decoder_layers(fd.reference.ops, **args)
    if "moe" in data:  # only a plugin that declares MoE runs is asked; else the model's split run
        return fd.call_run(**args)
    return fd.call_fused("decoder_layers", **args)  # type: ignore[no-any-return]


@pytest.mark.parametrize("num_layers", [1, 2], ids=["1-layer", "2-layers"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["first-layer", "residual"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers(conformance: Harness, step: Step, method: str, with_residual: bool, num_layers: int) -> None:
    _check_layers(conformance, step, method, with_residual, num_layers, "plain")


@pytest.mark.parametrize("num_layers", [1, 2], ids=["attention-only", "dense+attention-only"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["first-layer", "residual"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers_attention_only(conformance: Harness, step: Step, method: str, with_residual: bool,
                                       num_layers: int) -> None:
    _check_layers(conformance, step, method, with_residual, num_layers, "plain", attention_only=True)


@pytest.mark.parametrize("moe_at", [(1,), (0,), (0, 1)], ids=["dense+moe", "moe+dense", "moe+moe"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["first-layer", "residual"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers_moe(conformance: Harness, step: Step, method: str, with_residual: bool,
                            moe_at: tuple[int, ...]) -> None:
    _check_layers(conformance, step, method, with_residual, 2, "plain", moe_at=moe_at)


@pytest.mark.parametrize("moe_at", [(), (1,)], ids=["dense", "dense+moe"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers_head(conformance: Harness, step: Step, method: str, moe_at: tuple[int, ...]) -> None:
    """A run that ends with the model's head: the backend's kernel where its plugin declares
    FD_DECODER_LAYERS_HEAD (and FD_DECODER_LAYERS_MOE for the MoE run), else the run and then
    the head's own hooks; against the reference's composition, the logits."""
    _check_layers(conformance, step, method, True, 2, "plain", moe_at=moe_at, head=True)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "plain"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layer_variants(conformance: Harness, step: Step, variant: str) -> None:
    _check_layers(conformance, step, "none", True, 2, variant)


# a layer writes its new K / V rows and reads them back: a row whose fp32 value differs from the
# reference's in the last bit may round to the neighbouring 8-bit code, which the softmax spreads
KV_TOLERANCE = {"bfloat16": Tolerance(rtol=2e-3, atol=2e-3), "float16": Tolerance(rtol=1e-3, atol=1e-3),
                "int8": Tolerance(rtol=5e-2, atol=5e-2), "fp8": Tolerance(rtol=2e-1, atol=2e-1)}


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16", "int8", "fp8"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers_kv_dtypes(conformance: Harness, step: Step, kv_dtype: str) -> None:
    capabilities = conformance.backend.capabilities()
    if kv_dtype not in capabilities.kv_cache_dtypes:
        pytest.skip(f"the backend does not declare a {kv_dtype} KV cache")
    # with its first quantization method, which a fused kernel is likeliest to take
    method = next(iter(capabilities.quantization_methods), "none")
    _check_layers(conformance, step, method, True, 2, "plain", kv_dtype)


@pytest.mark.parametrize("moe_at", [(), (0,)], ids=["dense", "moe+dense"])
@pytest.mark.parametrize("step", LAYER_STEPS, ids=[s.name for s in LAYER_STEPS])
def test_decoder_layers_embedding(conformance: Harness, step: Step, method: str, moe_at: tuple[int, ...]) -> None:
    """A run that starts at the token embedding (a DecoderEmbedding: the table and the step's ids) and ends
    with the head: the backend's kernel where its plugin declares FD_DECODER_LAYERS_EMBEDDING too, else the
    rows taken first; against the reference's rows, composition and head, the logits."""
    _check_layers(conformance, step, method, False, 2, "plain", moe_at=moe_at, head=True, embedding=True)


def _check_layers(fd: Harness, step: Step, method: str, with_residual: bool, num_layers: int, variant: str,
                  kv_dtype: str = "float32", attention_only: bool = False, moe_at: tuple[int, ...] = (),
                  head: bool = False, embedding: bool = False) -> None:
    rng = case_rng("decoder-layers", step.name, method, with_residual, num_layers,
                   *(() if variant == "plain" else (variant,)), *(() if kv_dtype == "float32" else (kv_dtype,)),
                   *(("attention-only",) if attention_only else ()), *(("moe", *moe_at) if moe_at else ()),
                   *(("head",) if head else ()), *(("embedding",) if embedding else ()))
    num_blocks, tables = _block_tables(step, rng)
    ctx_slots = _context(step, tables, rng)
    tokens = sum(step.query_lens)
    with fd.on_host():
        cos_sin = rope_cos_sin(step.head_dim, max(step.seq_lens) + 8, 10000.0).numpy()
    ctx_shape = (len(ctx_slots), step.kv_heads, step.head_dim)
    data = {
        "weights": [_weights(rng, step, variant) for _ in range(num_layers)],
        "hidden": fd.rounded(rng.normal(0, 1, (tokens, HIDDEN))),
        "residual": fd.rounded(rng.normal(0, 1, (tokens, HIDDEN))),
        "cos_sin": cos_sin,
        "ctx_slots": ctx_slots,
        "ctx_k": [fd.rounded(rng.normal(0, 1, ctx_shape)) for _ in range(num_layers)],
        "ctx_v": [fd.rounded(rng.normal(0, 1, ctx_shape)) for _ in range(num_layers)],
    }
    if moe_at:
        data["moe"] = {i: _moe_weights(rng) for i in moe_at}
    if head:
        data["head"] = {"norm": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32),
                        "weight": rng.normal(0, HIDDEN**-0.5, (HIDDEN, HEAD_VOCAB)).astype(np.float32)}
    if embedding:
        data["embedding"] = {"table": fd.rounded(rng.normal(0, 1, (HEAD_VOCAB, HIDDEN))),
                             "ids": rng.integers(0, HEAD_VOCAB, tokens).astype(np.int64)}
    got = _run(fd, False, step, method, data, tables, num_blocks, with_residual, kv_dtype, attention_only)
    want = _run(fd, True, step, method, data, tables, num_blocks, with_residual, kv_dtype, attention_only)
    tol = fd.tol().looser(ACT_QUANT_TOLERANCE.get(method, LAYER_TOLERANCE))
    if moe_at and method in ACT_QUANTIZED:  # the experts quantize their hidden activations too (cases_moe)
        tol = tol.looser(Tolerance(rtol=5e-2, atol=5e-2))
    if kv_dtype != "float32":
        tol = tol.looser(KV_TOLERANCE[kv_dtype])
    if fd.override is not None:
        tol = fd.override
    parts = method if variant == "plain" else f"{method} {variant}"
    if kv_dtype != "float32":
        parts += f" kv={kv_dtype}"
    if attention_only:
        parts += " last-layer=attention-only"
    if moe_at:
        parts += f" moe-layers={list(moe_at)} experts={MOE_EXPERTS} top_k={MOE_TOP_K} moe_inter={MOE_INTER}"
    case = (f"{step.name}: {parts} layers={num_layers} D={HIDDEN} I={INTER} H={step.heads} "
            f"Hkv={step.kv_heads} Dh={step.head_dim} query_lens={step.query_lens} seq_lens={step.seq_lens} "
            f"residual={with_residual} dtype={fd.dtype}")
    if embedding:
        case += f" from the embedding [{HEAD_VOCAB}, {HIDDEN}]"
    if head:
        fd.assert_close("decoder_layers", case + f" head: final norm + LM head V={HEAD_VOCAB} (logits)", got, want,
                        tol)
        return
    fd.assert_close("decoder_layers", case + " (hidden)", got[0], want[0], tol)
    fd.assert_close("decoder_layers", case + " (residual)", got[1], want[1], tol)


STEPS_DECODES = [s for s in LAYER_STEPS if not s.prefills]
GREEDY_STEPS = 5


# per row (temperature, top_k, top_p, min_p) of the sampled multi-step case, cycled; a greedy row among them
STEPS_SAMPLING = [(0.8, 0, 0.8, 0.0), (1.0, 5, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (1.3, 0, 1.0, 0.05)]


@pytest.mark.parametrize("draw", ["greedy", "sampled"])
@pytest.mark.parametrize("moe_at", [(), (0,)], ids=["dense", "moe+dense"])
@pytest.mark.parametrize("step", STEPS_DECODES, ids=[s.name for s in STEPS_DECODES])
def test_decoder_steps(conformance: Harness, step: Step, moe_at: tuple[int, ...], draw: str) -> None:
    """Several decode steps of a whole-model run (embedding to head) in one call against the same backend's
    runs one step at a time, each row's token greedy or drawn (temperature / top-k / top-p / min-p, each
    step's uniforms given) by the backend's own ``sample``: the tokens [steps, T], every row crossing into a
    new block, the vocabulary narrower than the head (its last columns never chosen)."""
    fd = conformance
    method = next(iter(fd.backend.capabilities().quantization_methods), "none")
    rng = case_rng("decoder-greedy-steps", step.name, method, *moe_at)
    longer = replace(step, decode_lens=tuple(n + GREEDY_STEPS - 1 for n in step.decode_lens))
    num_blocks, tables = _block_tables(longer, rng)  # room for every step's slot
    ctx_slots = _context(step, tables, rng)
    with fd.on_host():
        cos_sin = rope_cos_sin(step.head_dim, max(longer.seq_lens) + 8, 10000.0).numpy()
    ctx_shape = (len(ctx_slots), step.kv_heads, step.head_dim)
    data: dict[str, Any] = {
        "weights": [_weights(rng, step) for _ in range(2)], "cos_sin": cos_sin, "ctx_slots": ctx_slots,
        "ctx_k": [fd.rounded(rng.normal(0, 1, ctx_shape)) for _ in range(2)],
        "ctx_v": [fd.rounded(rng.normal(0, 1, ctx_shape)) for _ in range(2)],
        "moe": {i: _moe_weights(rng) for i in moe_at},
        "head": {"norm": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32),
                 "weight": rng.normal(0, HIDDEN**-0.5, (HIDDEN, HEAD_VOCAB)).astype(np.float32)},
        "table": fd.rounded(rng.normal(0, 1, (HEAD_VOCAB, HIDDEN))),
        "ids": rng.integers(0, HEAD_VOCAB, len(step.decode_lens)).astype(np.int64),
    }
    if draw == "sampled":
        batch = len(step.decode_lens)
        rows = np.array([STEPS_SAMPLING[i % len(STEPS_SAMPLING)] for i in range(batch)])
        data["sampling"] = [rows[:, 0].astype(np.float32), rows[:, 1].astype(np.int64),
                            rows[:, 2].astype(np.float32), rows[:, 3].astype(np.float32),
                            rng.random((GREEDY_STEPS, batch, 16), dtype=np.float32)]
    vocab = HEAD_VOCAB - 5
    got = _decode_steps(fd, step, method, data, tables, num_blocks, vocab, together=True)
    want = _decode_steps(fd, step, method, data, tables, num_blocks, vocab, together=False)
    case = (f"{step.name}: {method} layers=2{f' moe-layers={list(moe_at)}' if moe_at else ''} D={HIDDEN} "
            f"seq_lens={step.seq_lens} block_size={step.block_size} steps={GREEDY_STEPS} vocab={vocab} of the "
            f"head's {HEAD_VOCAB} dtype={fd.dtype} {draw}: tokens [steps, T] against one run a step")
    fd.assert_equal("decoder_steps", case, got, want)


def _decode_steps(fd: Harness, step: Step, method: str, data: dict[str, Any], tables: list[list[int]],
                  num_blocks: int, vocab: int, together: bool) -> np.ndarray:
    layers, k_caches, v_caches = [], [], []
    for weights, ctx_k, ctx_v in zip(data["weights"], data["ctx_k"], data["ctx_v"]):
        k_cache, v_cache = fd.call("allocate_kv_cache", num_blocks=num_blocks, block_size=step.block_size,
                                   num_kv_heads=step.kv_heads, head_dim=step.head_dim, dtype="float32",
                                   location="device")
        fd.call("write_kv_cache", k=fd.device(ctx_k), v=fd.device(ctx_v), k_cache=k_cache, v_cache=v_cache,
                slot_mapping=fd.device(data["ctx_slots"]))
        layers.append(_layer(fd, False, step, method, weights))
        k_caches.append(k_cache)
        v_caches.append(v_cache)
    for i, block in data["moe"].items():
        layers[i] = replace(layers[i], up_gate=None, down=None, moe=_moe_block(fd, False, method, block))
    head, table, cos_sin = _head(fd, False, method, data["head"]), fd.device(data["table"]), fd.device(data["cos_sin"])
    batch = len(step.decode_lens)

    def meta(s: int) -> AttentionMetadata:
        return AttentionMetadata.build([1] * batch, [n + s for n in step.seq_lens], tables, step.block_size, batch)

    ids = fd.device(data["ids"])
    sampling = None
    if "sampling" in data:
        t, k, p, m, u = (fd.host(x) for x in data["sampling"])
        sampling = DecoderSampling(t, k, p, m, u, "sort")
    if together:
        tokens = fd.call_fused("decoder_steps", layers=layers, embedding=DecoderEmbedding(table, ids),
                               cos_sin=cos_sin, metadata=meta(0), k_caches=k_caches, v_caches=v_caches, head=head,
                               steps=GREEDY_STEPS, vocab_size=vocab, sampling=sampling)
        if tokens is not None:
            return np.asarray(tokens.numpy())
    rows = []  # the steps one run at a time: what the engine does without the op
    for s in range(GREEDY_STEPS):
        logits = fd.call_run(layers=layers, hidden=DecoderEmbedding(table, ids), residual=None, cos_sin=cos_sin,
                             metadata=meta(s), k_caches=k_caches, v_caches=v_caches, head=head)
        if sampling is None:
            rows.append(np.asarray(logits.numpy())[:, :vocab].argmax(axis=-1))
        else:
            t, k, p, m, u = data["sampling"]
            drawn = fd.call("sample", logits=logits[:, :vocab].astype("float32"),
                            temperature=fd.device(t, "float32"), top_k=fd.device(k), top_p=fd.device(p, "float32"),
                            min_p=fd.device(m, "float32"), uniforms=fd.device(u[s], "float32"), method="sort")
            rows.append(np.asarray(fd.numpy(drawn)))
        ids = fd.device(rows[-1].astype(np.int64))
    return np.stack(rows)
