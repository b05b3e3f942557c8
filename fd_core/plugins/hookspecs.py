"""The plugin API: every hook a backend (or general plugin) may implement.

A backend is a module of ``@hookimpl`` functions registered under the pluggy
project name ``fd_core``. It is found through the entry-point group
``fd_core.backends``; general plugins (models, parsers, quantization methods)
use ``fd_core.plugins``. Only the *selected* backend and the built-in CPU
reference (registered ``trylast=True``) sit in the plugin manager that runs a
model, so every ``firstresult`` kernel hook stops at the first non-None
result: a backend answers the ops it has and returns None (or does not
implement the hook) for the rest, which then fall through to the reference.

Implementations may accept a subset of a hook's arguments (pluggy passes
only the names they declare), so hooks can grow new arguments without
breaking plugins. Hooks are always called with keyword arguments.

Tensor conventions: paddle Tensors (typed as the ``Tensor`` protocol of
``fd_core.plugins.types``; a KV cache as ``KVPool``); a step's tokens are flattened to
``[T, ...]`` (T = new tokens in the step across all requests); ``H``/``Hkv``
are query/KV heads, ``Dh`` the head size, ``D`` the hidden size.
A plugin declares ``FD_API_VERSION = API_VERSION`` at module level; a plugin
built for another major version is refused with a message saying so.
"""

# Hookspec bodies are never run (pluggy reads only their signatures), so a
# spec that promises a non-None result has no return statement.
# mypy: disable-error-code="empty-body"

from __future__ import annotations

from typing import Any

import pluggy

from fd_core.plugins.types import (
    Availability,
    Capabilities,
    Communicator,
    DeviceInfo,
    KVPool,
    KVTransport,
    MemoryInfo,
    Tensor,
)

__all__ = ["API_VERSION", "PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "fd_core"
# Bumped (major) when a hook's meaning or required arguments change.
API_VERSION = 1

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

# ---------------------------------------------------------------- device


@hookspec(firstresult=True)
def fd_device_info() -> DeviceInfo:
    """Describe the device this backend drives.

    Called by the registry when backends are discovered and listed, before
    anything heavy is imported. Returns a ``fd_core.plugins.types.DeviceInfo``
    (name, paddle device type, visible-devices variable, collective backend,
    which paddle build it needs). Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_device_availability() -> Availability:
    """Say whether this backend can run on this machine, and why not.

    Called by the listing and by ``--backend auto``. Must be free of side
    effects: no device initialisation that cannot be undone, no memory
    allocated, never raises (an exception becomes "unusable: <error>").
    Returns ``fd_core.plugins.types.Availability``.
    """


@hookspec(firstresult=True)
def fd_device_memory(device_id: int) -> MemoryInfo:
    """Report total and free memory of device ``device_id`` (local index).

    Called once by the engine when it sizes the KV cache, after the model
    weights are loaded. Returns ``fd_core.plugins.types.MemoryInfo``.
    """


@hookspec(firstresult=True)
def fd_device_capabilities() -> Capabilities:
    """Report optional features: graph capture, fp8, bf16, supported
    quantization methods and KV-cache dtypes.

    Called at engine start-up to validate flags (``--quantization``,
    ``--use-cudagraph``). Returns ``fd_core.plugins.types.Capabilities``.
    """


@hookspec(firstresult=True)
def fd_set_device(device_id: int) -> str:
    """Make ``device_id`` the current device of this process.

    Called once per worker process before the model is built. Returns
    the paddle place string (e.g. ``"gpu:0"``, ``"cpu"``).
    """


# ------------------------------------------------------------- kernels


@hookspec(firstresult=True)
def fd_rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None
) -> Tensor | tuple[Tensor, Tensor] | None:
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight``.

    Called by every norm layer, once per layer per step, with ``x [T, D]``.
    When ``residual [T, D]`` is given, first ``x = x + residual`` and return
    ``(normed, x)`` (the sum becomes the next residual); otherwise return
    ``normed``. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_rotary_embedding(
    q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor] | None:
    """Rotate ``q [T, H, Dh]`` and ``k [T, Hkv, Dh]`` by their positions.

    Called by attention layers each step. ``positions [T]`` int64;
    ``cos_sin [max_pos, Dh]`` is ``concat(cos, sin)`` of the ``Dh/2``
    frequencies per position. ``interleaved=True`` (ERNIE 4.5) rotates pairs
    ``(x[0::2], x[1::2])``; False rotates halves (NeoX style). Returns
    ``(q, k)`` rotated (new tensors or in place). Stops at first non-None.
    """


@hookspec(firstresult=True)
def fd_silu_and_mul(x: Tensor) -> Tensor | None:
    """``silu(gate) * up`` for ``x [T, 2*I] = [gate | up]``; returns ``[T, I]``.

    Called by every MLP and expert FFN. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_linear(x: Tensor, weight: Tensor | None, bias: Tensor | None, quant: Any) -> Tensor | None:
    """``x [T, in] @ W + bias`` for one linear layer.

    Called by every linear layer each step. ``quant`` is None for an
    unquantized layer, whose ``weight`` is ``[in, out]`` float; otherwise a
    ``fd_core.ops.linear.QuantizedWeight`` (method name, packed weight,
    scales) and ``weight`` is None. A backend returns None for a method it
    does not implement. Returns ``[T, out]``. Stops at first non-None.
    ``quant.act_dtype`` is the model's activation dtype: under ``bfloat16``
    the activations may be rounded to bf16 at the linear (the reference's
    operands); under ``float32`` they must not be.
    """


@hookspec(firstresult=True)
def fd_allocate_kv_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str, location: str
) -> tuple[KVPool, KVPool] | None:
    """Allocate one layer's paged K and V cache; returns ``(k_cache, v_cache)``.

    Called by the model runner once per attention layer at start-up, with
    ``location="device"`` for the working cache and ``"host"`` for the
    ``--swap-space`` tier (host memory; pinned where the device has such a
    thing). The layout is the backend's own: only its cache-write, attention
    and block-copy kernels look inside. The reference uses
    ``[num_blocks * block_size, Hkv, Dh]`` so a slot
    ``block_id * block_size + offset`` is one row.
    """


@hookspec(firstresult=True)
def fd_copy_kv_blocks(
    src_cache: KVPool, dst_cache: KVPool, src_blocks: list[int], dst_blocks: list[int], block_size: int
) -> bool | None:
    """Copy whole blocks ``src_cache[src_blocks[i]] -> dst_cache[dst_blocks[i]]``.

    Called by the model runner before a step's forward for the scheduler's
    swap-outs (device -> host tier) and swap-ins (host -> device), once per
    layer and for K and V separately. Returns True.
    """


@hookspec(firstresult=True)
def fd_kv_transport(protocol: str) -> KVTransport | None:
    """A transport for prefill/decode disaggregation's KV transfer, or None.

    Called once at start by an instance started with ``--splitwise-role
    prefill|decode``, for each name of ``--cache-transfer-protocol`` in order
    (FastDeploy's ``ipc``, ``rdma``; a backend may answer ``nvlink`` ...) until
    one is answered. Nothing answers ``tcp``: fd-core's built-in ZeroMQ
    transport (``fd_core.disagg.transport``) serves it; a name nobody answers
    is refused. The KV frames the transport carries are read from and written
    to the pool with ``fd_allocate_kv_cache(location="host")`` and
    ``fd_copy_kv_blocks``. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_write_kv_cache(
    k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, slot_mapping: Tensor
) -> bool | None:
    """Store the step's new ``k, v [T, Hkv, Dh]`` into their cache slots.

    Called by each attention layer before attention. ``slot_mapping [T]``
    int64 gives ``block_id * block_size + offset`` per token; a slot of -1
    means "do not store" (padding). Writes in place; returns True.
    """


@hookspec(firstresult=True)
def fd_rope_and_write_kv_cache(
    qkv: Tensor,
    positions: Tensor,
    cos_sin: Tensor,
    interleaved: bool,
    num_heads: int,
    num_kv_heads: int,
    k_cache: KVPool,
    v_cache: KVPool,
    slot_mapping: Tensor,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """Optional fusion of an attention layer's steps between the QKV
    projection and attention: split, rotate, store.

    ``qkv [T, (H + 2*Hkv) * Dh]`` holds each token's ``[q | k | v]``. Must
    equal splitting it into ``q [T, H, Dh]``, ``k, v [T, Hkv, Dh]``, then
    ``fd_rotary_embedding(q, k, positions, cos_sin, interleaved)`` and
    ``fd_write_kv_cache(k, v, k_cache, v_cache, slot_mapping)`` (slot -1: not
    stored). Returns ``(q, k, v)`` with q and k rotated. The reference does
    not implement it: when no backend answers, ``Ops`` runs those three
    steps through the unfused hooks, so a backend implements this only to
    save their per-call costs (one call per layer instead of a split and two
    calls). Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_decoder_layers(
    layers: list[Any],
    hidden: Tensor,
    residual: Tensor | None,
    cos_sin: Tensor,
    metadata: Any,
    k_caches: list[KVPool],
    v_caches: list[KVPool],
    head: Any | None,
) -> tuple[Tensor, Tensor] | Tensor | None:
    """Optional fusion of a run of consecutive dense decoder layers (each:
    norm, attention block, norm, gated MLP) into one call.

    ``layers`` is a list of ``fd_core.ops.decoder.DecoderLayerWeights`` (one
    or more; the model passes each run of dense layers between MoE layers,
    all of a dense model's layers at once): a generic pre-norm layer of the
    Llama family, with optional per-head q/k RMSNorms (Qwen3), q/k/v and
    output biases, either rotary layout, any weight dtype or quantization.
    It is built afresh each step and carries no backend state: a backend
    that derives data from it (repacked weights) keys that data by content
    (``DecoderLayerWeights.key()``, ``fd_core.ops.content_key``), never by
    the object's identity. The last layer may be attention only (a MoE
    layer's attention half: ``up_gate`` / ``down`` None); the run then
    returns the post-attention-normed hidden state and the residual stream
    (``fd_core.ops.decoder``), and a backend without that case declines.
    A layer may carry its MoE block (``moe``, ``fd_moe_layer``'s arguments;
    ``up_gate`` / ``down`` None), anywhere in the run: the layer then runs
    whole, the block on its post-attention-normed stream. Such runs go only
    to plugins that declare ``FD_DECODER_LAYERS_MOE = True`` (as
    ``FD_DECODER_LAYERS_ATTENTION_ONLY`` for attention-only runs; one that
    ends attention only, to plugins that declare both); for the rest ``Ops``
    splits the run at its MoE layers.
    ``k_caches`` / ``v_caches`` the layers' caches in the same order. ``hidden [T, D]`` and ``residual``
    (None before the model's first layer) are the residual stream as the
    model carries it. Must equal ``fd_core.ops.decoder.compose_decoder_layers``,
    which chains the unfused hooks layer by layer, and returns the same
    ``(hidden, residual)`` after the last layer. ``head`` (a
    ``fd_core.ops.decoder.DecoderHead``: the model's final norm and LM head)
    is None except for plugins that declare ``FD_DECODER_LAYERS_HEAD = True``
    (with ``FD_DECODER_LAYERS_MOE`` too for a run with MoE blocks); given, the
    run returns the logits ``[T, V]``, ``DecoderHead.run`` of its
    ``(hidden, residual)``, and never ends attention only. A run with the head may
    start at the token embedding: ``hidden`` is then a
    ``fd_core.ops.decoder.DecoderEmbedding`` (the table and the step's ids;
    ``residual`` None), only for plugins that declare
    ``FD_DECODER_LAYERS_EMBEDDING = True`` as well (``Ops`` takes the rows first
    for the rest), and the stream starts at ``DecoderEmbedding.run()``. The reference does not
    implement it (``Ops`` composes then). A backend answers the cases it has
    a kernel for (say, decode-only steps with its quantized weights) and
    returns None for the rest. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_decoder_steps(
    layers: list[Any],
    embedding: Any,
    cos_sin: Tensor,
    metadata: Any,
    k_caches: list[KVPool],
    v_caches: list[KVPool],
    head: Any,
    steps: int,
    vocab_size: int,
    sampling: Any,
) -> Tensor | None:
    """Optional: ``steps`` decode steps of a whole model in one call
    (multi-step decoding, the engine's ``--num-scheduler-steps``).

    The arguments are those of an ``fd_decoder_layers`` run that starts at the
    token embedding (``embedding``, a ``fd_core.ops.decoder.DecoderEmbedding``
    holding the step's ids ``[T]``) and ends with the head, over a decode-only
    step (``metadata.num_decodes == T``). Must equal, for ``s`` in
    ``range(steps)``: that run's logits ``[T, V]``; each row's token from its
    first ``vocab_size`` logits: with ``sampling`` None the greedy token, the
    first index of the largest (a NaN counting as the largest: numpy's
    ``argmax``, as the engine's sampler); with a
    ``fd_core.ops.decoder.DecoderSampling``, the very token this backend's
    own ``fd_sample`` gives those logits with the row's ``temperature``,
    ``top_k``, ``top_p``, ``min_p``, ``uniforms[s]`` and ``method`` (a
    backend that leaves ``fd_sample`` to another plugin, or does not draw
    ``method`` itself, returns None; sampled steps go only to the plugin
    asked first for ``fd_sample``, and only to an implementation that takes
    ``sampling`` without a default); then the next step with those tokens as
    the ids, every row one position later (its slot ``block_table[pos //
    block_size] * block_size + pos % block_size``) and its sequence one token
    longer. Every step's slot lies in the rows' block tables (the scheduler
    allocates them first). Returns the tokens ``[steps, T]`` int64. The
    reference does not implement it: when no backend answers (None), the
    engine runs the steps one by one. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_prefill_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_cache: KVPool,
    v_cache: KVPool,
    metadata: Any,
    scale: float,
) -> Tensor | None:
    """Causal attention for the prefill part of a step, over the paged cache.

    Called by each attention layer when the step has prefill tokens, after
    ``fd_write_kv_cache``. ``q [Tp, H, Dh]``, ``k, v [Tp, Hkv, Dh]`` are the
    new tokens of the prefill requests (requests ``metadata.num_decodes ..
    num_reqs-1``, ragged, in order). A request's chunk may follow context
    already in the cache (chunked prefill, prefix-cache hits): token ``i`` of
    a chunk sits at position ``seq_len - query_len + i`` and attends to every
    cached position up to its own. ``metadata`` is
    ``fd_core.ops.attention.AttentionMetadata``. GQA: query head ``h`` uses
    KV head ``h // (H // Hkv)``. Returns ``[Tp, H, Dh]``.
    """


@hookspec(firstresult=True)
def fd_decode_attention(
    q: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any, scale: float
) -> Tensor | None:
    """Attention of one new token per request over its paged cache.

    Called by each attention layer when the step has decode requests (the
    first ``metadata.num_decodes`` requests, one token each), after the
    cache write. ``q [B, H, Dh]``; request ``b`` attends to its first
    ``metadata.seq_lens[b]`` cached positions. Returns ``[B, H, Dh]``.
    """


@hookspec(firstresult=True)
def fd_vision_attention(
    qkv: Tensor, cos: Tensor, sin: Tensor, cu_seqlens: list[int], num_heads: int, scale: float
) -> Tensor | None:
    """Bidirectional attention of a vision tower's patches within each frame,
    after the 2D rotary (ERNIE-4.5-VL's ViT).

    Called by each vision block (``fd_core.models.ernie4_5_vl_vision``) once
    per image or video the encoder runs, with the block's fused projection
    ``qkv [N, 3*H*Dh]`` (each row ``[q | k | v]``, ``H = num_heads`` heads of
    ``Dh`` each; fp32, or a 16-bit tower's dtype). q and k are first rotated as halves by ``cos, sin
    [N, Dh/2]`` (fp32, per patch): ``[x1*cos - x2*sin, x2*cos + x1*sin]`` for
    ``x = [x1 | x2]``. ``cu_seqlens`` (host ints, ``F + 1`` values rising from 0
    to N) delimits the frames: a patch attends to every patch of its own frame
    and no other, ``softmax(q k^T * scale) v``, no causal mask. Returns
    ``[N, H*Dh]`` in qkv's dtype, the heads side by side. The reference
    (computing in fp32 whatever qkv's dtype) is
    ``fd_core.ops.vision_attention.reference_vision_attention``; a backend
    returns None for inputs it has no kernel for. Stops at the first non-None
    result.
    """


@hookspec(firstresult=True)
def fd_moe_select_experts(
    router_logits: Tensor,
    top_k: int,
    correction_bias: Tensor | None,
    renormalize: bool,
    norm_min: float,
) -> tuple[Tensor, Tensor] | None:
    """Route each token to ``top_k`` experts.

    Called by MoE layers each step with ``router_logits [T, E]`` (fp32).
    Probabilities are ``softmax(router_logits)``; experts are *selected* by
    ``probs + correction_bias`` (``[E]``, may be None) but *weighted* by
    ``probs`` alone; with ``renormalize`` the weights are divided by
    ``max(sum of the top_k weights, norm_min)``. Returns
    ``(topk_weights [T, k] fp32, topk_ids [T, k] int64)``.
    """


@hookspec(firstresult=True)
def fd_moe_experts(
    x: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    up_gate_weights: Tensor | None,
    down_weights: Tensor | None,
    quant: Any,
) -> Tensor | None:
    """The routed experts' FFN: ``sum_k w[t,k] * FFN_{ids[t,k]}(x[t])``.

    Called by MoE layers each step. ``x [T, D]``; unquantized weights are
    ``up_gate_weights [E, D, 2*I]`` (``[gate | up]``) and
    ``down_weights [E, I, D]``; ``FFN_e(x) = silu_and_mul(x @ up_gate[e]) @
    down[e]``. Experts may receive any number of tokens, including none.
    ``quant`` is None or a per-expert ``QuantizedWeight`` pair (then both
    weight arguments are None). Returns
    ``[T, D]``. Shared experts are not included: MoE layers run them as a
    dense MLP through ``fd_linear`` and add them to this result (or ask
    ``fd_moe_layer_experts`` for both at once).
    """


@hookspec(firstresult=True)
def fd_moe_layer_experts(
    x: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    up_gate_weights: Tensor | None,
    down_weights: Tensor | None,
    quant: Any,
    shared_up_gate: Any,
    shared_down: Any,
) -> Tensor | None:
    """Optional fusion of a MoE layer's routed experts and its shared expert
    into one call.

    The first six arguments are ``fd_moe_experts``'; ``shared_up_gate``
    (``[D, 2*Is]``, ``[gate | up]``) and ``shared_down`` (``[Is, D]``) are the
    shared expert's weights, each a plain tensor or a 2-D ``QuantizedWeight``.
    Must equal ``fd_moe_experts(...) + down(silu_and_mul(x @ up_gate))``
    computed through ``fd_moe_experts``, ``fd_linear`` and
    ``fd_silu_and_mul``, in that order (routed sum first, then the shared
    expert added). Returns ``[T, D]``. The reference does not implement it:
    when no backend answers, ``Ops`` composes those hooks, so a backend
    answers only to save their per-call costs, for the weights it has a
    kernel for, and returns None for the rest. Stops at the first non-None
    result.
    """


@hookspec(firstresult=True)
def fd_moe_layer(
    x: Tensor,
    gate: Tensor,
    correction_bias: Tensor | None,
    top_k: int,
    renormalize: bool,
    norm_min: float,
    up_gate_weights: Tensor | None,
    down_weights: Tensor | None,
    quant: Any,
    shared_up_gate: Any,
    shared_down: Any,
) -> Tensor | None:
    """Optional fusion of a whole MoE layer (after its norm) into one call:
    routing, routed experts and shared expert.

    Called by MoE layers each step with ``x [T, D]`` and the router
    ``gate [D, E]`` (fp32). Must equal, in that order: ``router_logits =
    fd_linear(x as fp32, gate)``; ``fd_moe_select_experts(router_logits,
    top_k, correction_bias, renormalize, norm_min)``; then
    ``fd_moe_layer_experts`` with those weights and ids, the expert weights
    (``fd_moe_experts``' ``up_gate_weights`` / ``down_weights`` / ``quant``)
    and the shared expert (``shared_up_gate`` / ``shared_down``, as there),
    or ``fd_moe_experts`` alone when both shared arguments are None.
    Returns ``[T, D]``. The router logits may differ from ``fd_linear``'s in
    fp32 summation order; only a near-tie at the top-k boundary may then
    pick another expert. The reference does not implement it: when no
    backend answers, ``Ops.moe_layer`` composes those hooks, so a backend
    answers only to save their per-call costs, for the weights it has a
    kernel for, and returns None for the rest. Stops at the first non-None
    result.
    """


@hookspec(firstresult=True)
def fd_sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    uniforms: Tensor,
    method: str,
) -> Tensor | None:
    """Draw one token per row of ``logits [B, V]`` (fp32, penalties applied).

    Called by the sampler once per step. Per row: ``temperature [B]`` (0 means
    greedy argmax), ``top_k [B]`` int64 (0 = off), ``top_p [B]`` (1 = off),
    ``min_p [B]`` (0 = off). All randomness comes from ``uniforms [B, R]``
    (uniform in [0, 1), drawn per request from its own seeded generator), so
    a request's draw does not depend on its batch neighbours. ``method`` is
    ``"sort"`` (inverse CDF over the sorted, filtered distribution, using
    ``uniforms[:, 0]``) or ``"rejection"`` (no full sort; may use further
    columns; same distribution). Returns token ids ``[B]`` int64.
    """


@hookspec(firstresult=True)
def fd_apply_token_bitmask(logits: Tensor, bitmask: Any, rows: list[int]) -> Tensor | None:
    """Forbid the tokens a packed bitmask clears, for some rows of ``logits [N, V]`` (fp32).

    Called by the sampler once per step that has constrained rows
    (structured output), after penalties and before ``fd_sample``.
    ``bitmask [M, W]`` is an int32 numpy array: bit ``j`` (little-endian) of
    word ``w`` of row ``k`` allows token ``32 * w + j`` in logits row
    ``rows[k]``; a clear bit, and every column at or past ``32 * W``, sets
    that logit to ``-inf``. Other rows are untouched. Returns the masked
    logits: ``logits`` itself written in place, or a new tensor. The
    reference (``fd_core.ops.token_bitmask``) unpacks the mask with one
    vectorised op. Stops at the first non-None result.
    """


@hookspec(firstresult=True)
def fd_communicator(world_size: int, rank: int, group: Any) -> Communicator | None:
    """Return the collective communicator for tensor/expert parallelism.

    Called once per worker process after the process group is initialised.
    The object provides ``all_reduce(x)`` (sum, returns the reduced
    tensor), ``all_gather(x, axis)`` and ``all_to_all(x)``; see
    ``fd_core.ops.collectives.Communicator``.
    """


# --------------------------------------------------------- general plugins


@hookspec
def fd_register_models(registry: Any) -> None:
    """Add model classes: ``registry.register(architecture_name, cls)``.

    Called once when the model registry is first used, for every loaded
    general plugin (entry-point group ``fd_core.plugins``). A model whose
    config.json is not ERNIE-shaped also registers its parser here:
    ``fd_core.models.config.register_config_parser(architecture_name, parse)``.
    """


@hookspec
def fd_register_parsers(reasoning: Any, tool_call: Any) -> None:
    """Add reasoning or tool-call parsers to the two registries.

    Called once when a parser registry is first used.
    """


@hookspec
def fd_register_quantization_methods(registry: Any) -> None:
    """Add quantization methods: ``registry.register(name, method)``.

    Called once when the quantization registry is first used.
    """


@hookspec
def fd_register_checkpoint_generators(registry: Any) -> None:
    """Add random-weight checkpoint generators for a model family:
    ``registry.register(shape_name, generate)`` (a callable or
    ``"module:attr"``, imported when that shape is asked for).

    Called once when ``fd_core.testing.generators`` is first used (by
    ``generate_checkpoint`` and ``python -m fd_core.testing.checkpoints``),
    for every loaded general plugin. ``generate(path, shape, naming=, seed=,
    dtype=, shards=, **overrides)`` writes a checkpoint in the family's real
    on-disk format (config.json, tokenizer files, safetensors) and returns its
    directory; see that module.
    """


@hookspec(firstresult=True)
def fd_load_tokenizer(path: Any, chat_template: Any) -> Any:
    """Return the tokenizer of the checkpoint directory ``path`` (a ``pathlib.Path``), or None.

    Called by ``fd_core.tokenizer.Tokenizer.from_pretrained`` (in the engine
    and the API processes) when the directory holds neither
    ``tokenizer.model`` nor ``tokenizer.json``, for every loaded general
    plugin; stops at the first non-None result. ``chat_template`` is the
    ``--chat-template`` override (a path or jinja text) or None. The object
    must offer what ``fd_core.tokenizer.HFTokenizer`` offers (``encode``,
    ``decode``, ``token_bytes``, ``added_tokens``, ``apply_chat_template``,
    ``eos_token_ids``, ...) and must not import paddle.
    """
