"""The Backend: one selected hardware plugin plus the CPU reference behind it.

Model and layer code receive a backend's ``ops`` and call kernels through it;
they never branch on the device. Each op is a ``firstresult`` hook: the
selected backend answers first, the reference (``trylast``) answers whatever
it leaves. ``Ops`` binds every kernel hook once, when it is built (once per
engine): the implementations pluggy would call, in pluggy's order, become one
plain function per op (``fd_core.backends.binding``), so an op call costs a
Python call per implementation asked rather than a pluggy dispatch.
"""

from __future__ import annotations

from typing import Any, overload

import pluggy

from fd_core.backends.binding import Dispatch, bind_hook, call_order
from fd_core.plugins.types import (
    Availability,
    Capabilities,
    Communicator,
    DeviceInfo,
    KVPool,
    MemoryInfo,
    Tensor,
)

__all__ = ["Backend", "Ops", "OpNotProvidedError"]


class OpNotProvidedError(NotImplementedError):
    """No registered plugin answered an op (e.g. an unsupported quantization)."""


class Ops:
    """Typed call-through to the kernel hooks; see ``fd_core.plugins.hookspecs``.

    Each op is resolved at construction to the functions that will answer
    it: the selected backend's implementation, then the reference's, asked in
    that order until one returns non-None (exactly pluggy's ``firstresult``
    order and semantics); an op only the reference implements calls it
    directly. The backends are fixed at engine start: a plugin registered on
    ``pm`` after this is built is not asked (build a new ``Ops``).
    ``bind=False`` keeps pluggy dispatch on every call and ``fuse_layers=False``
    never asks ``fd_decoder_layers``; both exist for benchmarks and tests.
    """

    def __init__(
        self, pm: pluggy.PluginManager, backend_name: str, *, bind: bool = True, fuse_layers: bool = True
    ) -> None:
        self._hook = hooks = pm.hook
        self._backend_name = backend_name

        def resolve(hook: pluggy.HookCaller) -> Dispatch:
            return bind_hook(hook) if bind else hook

        self._fd_rms_norm = resolve(hooks.fd_rms_norm)
        self._fd_rotary_embedding = resolve(hooks.fd_rotary_embedding)
        self._fd_silu_and_mul = resolve(hooks.fd_silu_and_mul)
        self._fd_linear = resolve(hooks.fd_linear)
        self._fd_rope_and_write_kv_cache = resolve(hooks.fd_rope_and_write_kv_cache)
        self._fd_decoder_layers = resolve(hooks.fd_decoder_layers)
        self._fd_decoder_steps = resolve(hooks.fd_decoder_steps)
        self._fd_allocate_kv_cache = resolve(hooks.fd_allocate_kv_cache)
        self._fd_copy_kv_blocks = resolve(hooks.fd_copy_kv_blocks)
        self._fd_write_kv_cache = resolve(hooks.fd_write_kv_cache)
        self._fd_prefill_attention = resolve(hooks.fd_prefill_attention)
        self._fd_decode_attention = resolve(hooks.fd_decode_attention)
        self._fd_vision_attention = resolve(hooks.fd_vision_attention)
        self._fd_moe_select_experts = resolve(hooks.fd_moe_select_experts)
        self._fd_moe_experts = resolve(hooks.fd_moe_experts)
        self._fd_moe_layer_experts = resolve(hooks.fd_moe_layer_experts)
        self._fd_moe_layer = resolve(hooks.fd_moe_layer)
        self._fd_sample = resolve(hooks.fd_sample)
        self._fd_apply_token_bitmask = resolve(hooks.fd_apply_token_bitmask)
        self._fd_communicator = resolve(hooks.fd_communicator)
        # no plugin fuses layers (the reference alone): skip the hook call per layer
        self._fuses_layers = fuse_layers and bool(hooks.fd_decoder_layers.get_hookimpls())
        # Run shapes newer than API_VERSION 1 go only to plugins that declare them (a kernel written
        # before would not know to decline one): runs ending with an attention-only layer (a MoE
        # layer's attention half) to FD_DECODER_LAYERS_ATTENTION_ONLY = True, runs whose layers carry
        # their MoE block (DecoderLayerWeights.moe) to FD_DECODER_LAYERS_MOE = True, a MoE run that
        # ends attention only to plugins that declare both. None: no plugin does.
        impls = hooks.fd_decoder_layers.get_hookimpls()

        for impl in impls:  # a plugin handed the head must take it: else it would answer (hidden, residual)
            if getattr(impl.plugin, "FD_DECODER_LAYERS_HEAD", False) and "head" not in impl.argnames:
                raise ValueError(f"plugin {impl.plugin_name!r} declares FD_DECODER_LAYERS_HEAD, but its "
                                 "fd_decoder_layers takes no 'head' argument; expected (layers, hidden, residual, "
                                 "cos_sin, metadata, k_caches, v_caches, head)")

        def declaring(*flags: str) -> Dispatch | None:
            others = [impl.plugin for impl in impls if not all(getattr(impl.plugin, f, False) for f in flags)]
            if not fuse_layers or len(others) == len(impls):
                return None
            return resolve(pm.subset_hook_caller("fd_decoder_layers", remove_plugins=others)) if others \
                else self._fd_decoder_layers

        self._fd_decoder_layers_attention_only = declaring("FD_DECODER_LAYERS_ATTENTION_ONLY")
        self._fd_decoder_layers_moe = declaring("FD_DECODER_LAYERS_MOE")
        self._fd_decoder_layers_moe_attention_only = declaring("FD_DECODER_LAYERS_MOE",
                                                               "FD_DECODER_LAYERS_ATTENTION_ONLY")
        # runs that end with the model's head (a DecoderHead: logits out) to FD_DECODER_LAYERS_HEAD = True
        self._fd_decoder_layers_head = declaring("FD_DECODER_LAYERS_HEAD")
        # sampled multi-step runs only to the plugin asked first for a draw (fd_sample), and only when its
        # fd_decoder_steps takes `sampling`: its steps must draw the tokens its fd_sample would, and one
        # written without the argument would answer greedy tokens; None: no plugin qualifies
        steps_impls = hooks.fd_decoder_steps.get_hookimpls()
        drawer = next(iter(call_order(hooks.fd_sample)), None)
        others = [impl.plugin for impl in steps_impls
                  if drawer is None or impl.plugin is not drawer.plugin or "sampling" not in impl.argnames]
        self._fd_decoder_steps_sampled = None if len(others) == len(steps_impls) else (
            resolve(pm.subset_hook_caller("fd_decoder_steps", remove_plugins=others)) if others
            else self._fd_decoder_steps)
        self._fd_decoder_layers_moe_head = declaring("FD_DECODER_LAYERS_MOE", "FD_DECODER_LAYERS_HEAD")
        # such runs that also start at the token embedding (a DecoderEmbedding as hidden) to plugins that
        # declare FD_DECODER_LAYERS_EMBEDDING = True as well
        self._fd_decoder_layers_embedding_head = declaring("FD_DECODER_LAYERS_HEAD", "FD_DECODER_LAYERS_EMBEDDING")
        self._fd_decoder_layers_moe_embedding_head = declaring(
            "FD_DECODER_LAYERS_MOE", "FD_DECODER_LAYERS_HEAD", "FD_DECODER_LAYERS_EMBEDDING")

    @property
    def fuses_moe_runs(self) -> bool:
        """Whether a plugin takes runs whose MoE layers carry their block
        (``FD_DECODER_LAYERS_MOE``): a model plans such runs only then, so that
        with no such plugin it pays nothing for the split (``_split_moe_run``)."""
        return self._fd_decoder_layers_moe is not None

    @property
    def fuses_heads(self) -> bool:
        """Whether a plugin takes runs that end with the model's head
        (``FD_DECODER_LAYERS_HEAD``): a model hands its head to the run only
        then (without one, ``decoder_layers(head=...)`` runs the head's own hooks)."""
        return self._fd_decoder_layers_head is not None

    @property
    def fuses_embeddings(self) -> bool:
        """Whether a plugin takes runs that start at the token embedding and end
        with the head (``FD_DECODER_LAYERS_EMBEDDING`` and ``_HEAD``): a model
        hands its embedding to such a run only then."""
        return self._fd_decoder_layers_embedding_head is not None

    def implementers(self, op: str) -> list[str]:
        """The plugins that may answer ``op`` (e.g. ``"linear"``), in the
        order they are asked."""
        hook = getattr(self._hook, "fd_" + op, None)
        if hook is None or not hasattr(self, "_fd_" + op):
            raise ValueError(f"unknown op {op!r}; expected one of the fd_* kernel hooks without the prefix")
        return [impl.plugin_name for impl in call_order(hook)]

    def _answer(self, op: str, result: Any, what: str = "") -> Any:
        if result is None:
            raise OpNotProvidedError(
                f"no kernel for {op}{' (' + what + ')' if what else ''} in backend "
                f"{self._backend_name!r} or the CPU reference"
            )
        return result

    @overload
    def rms_norm(self, x: Tensor, weight: Tensor, eps: float, residual: None = None) -> Tensor: ...

    @overload
    def rms_norm(self, x: Tensor, weight: Tensor, eps: float, residual: Tensor) -> tuple[Tensor, Tensor]: ...

    def rms_norm(
        self, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``normed``, or ``(normed, x + residual)`` when ``residual`` is given."""
        return self._answer(
            "rms_norm", self._fd_rms_norm(x=x, weight=weight, eps=eps, residual=residual)
        )

    def rotary_embedding(
        self, q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor, interleaved: bool = True
    ) -> tuple[Tensor, Tensor]:
        return self._answer(  # type: ignore[no-any-return]
            "rotary_embedding",
            self._fd_rotary_embedding(
                q=q, k=k, positions=positions, cos_sin=cos_sin, interleaved=interleaved
            ),
        )

    def silu_and_mul(self, x: Tensor) -> Tensor:
        return self._answer("silu_and_mul", self._fd_silu_and_mul(x=x))

    def linear(self, x: Tensor, weight: Tensor | None, bias: Tensor | None = None, quant: Any = None) -> Tensor:
        out = self._fd_linear(x=x, weight=weight, bias=bias, quant=quant)
        return out if out is not None else self._answer("linear", None, getattr(quant, "method", "none"))

    def rope_and_write_kv_cache(
        self, qkv: Tensor, positions: Tensor, cos_sin: Tensor, interleaved: bool, num_heads: int,
        num_kv_heads: int, k_cache: KVPool, v_cache: KVPool, slot_mapping: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Split ``qkv``, rotate q and k, store k and v: the backend's fused
        kernel when it has one, else the unfused hooks (see the hookspec)."""
        fused = self._fd_rope_and_write_kv_cache(
            qkv=qkv, positions=positions, cos_sin=cos_sin, interleaved=interleaved, num_heads=num_heads,
            num_kv_heads=num_kv_heads, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping,
        )
        if fused is not None:
            return fused  # type: ignore[no-any-return]
        from fd_core._paddle import import_paddle

        paddle = import_paddle()
        tokens, width = qkv.shape
        head_dim = width // (num_heads + 2 * num_kv_heads)
        kv_size = num_kv_heads * head_dim
        q, k, v = paddle.split(qkv, [num_heads * head_dim, kv_size, kv_size], axis=-1)
        q = q.reshape([tokens, num_heads, head_dim])
        k = k.reshape([tokens, num_kv_heads, head_dim])
        v = v.reshape([tokens, num_kv_heads, head_dim])
        q, k = self.rotary_embedding(q, k, positions, cos_sin, interleaved)
        self.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
        return q, k, v

    @overload
    def decoder_layers(
        self, layers: list[Any], hidden: Tensor, residual: Tensor | None, cos_sin: Tensor, metadata: Any,
        k_caches: list[KVPool], v_caches: list[KVPool], head: None = None,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def decoder_layers(
        self, layers: list[Any], hidden: Any, residual: Tensor | None, cos_sin: Tensor, metadata: Any,
        k_caches: list[KVPool], v_caches: list[KVPool], head: Any,
    ) -> Tensor: ...

    def decoder_layers(
        self, layers: list[Any], hidden: Any, residual: Tensor | None, cos_sin: Tensor, metadata: Any,
        k_caches: list[KVPool], v_caches: list[KVPool], head: Any | None = None,
    ) -> tuple[Tensor, Tensor] | Tensor:
        """A run of dense decoder layers (the last may be attention only; any
        may carry its MoE block) -> ``(hidden, residual)``: the backend's fused
        kernel when it answers, else the unfused hooks layer by layer (see the
        hookspec). A run with MoE layers that no plugin fuses whole is split at
        them: each piece ends with a MoE layer's attention half, then
        ``moe_layer`` (``fd_core.ops.decoder``). With ``head`` (a
        ``DecoderHead``; the run must not end attention only) -> the logits
        ``[T, V]``: a plugin declaring ``FD_DECODER_LAYERS_HEAD`` runs the
        head inside the run, else the run as above and then ``head.run``.
        A run with ``head`` may start at the token embedding: ``hidden`` a
        ``DecoderEmbedding`` (``residual`` None), which a plugin declaring
        ``FD_DECODER_LAYERS_EMBEDDING`` too takes in the run; when none of
        those answers, the rows are taken first and the run goes to the
        plugins declaring ``FD_DECODER_LAYERS_HEAD`` as before (so a
        head-only plugin registered first is asked only then).
        """
        has_moe = any(getattr(layer, "moe", None) is not None for layer in layers)
        if not hasattr(hidden, "shape"):  # not a tensor: the run starts at the embedding
            from fd_core.ops.decoder import DecoderEmbedding

            if not isinstance(hidden, DecoderEmbedding):
                raise TypeError(f"decoder_layers: hidden must be a [T, D] tensor or a DecoderEmbedding, got "
                                f"{type(hidden).__name__}")
            if residual is not None or head is None:
                raise ValueError("decoder_layers: a run that starts at the embedding (a DecoderEmbedding) must be "
                                 "the model's first (residual None) and end with the head; got residual "
                                 f"{'set' if residual is not None else 'None'}, head "
                                 f"{'None' if head is None else 'set'}")
            if not (layers and layers[-1].attention_only):
                logits = self._ask(self._fd_decoder_layers_moe_embedding_head if has_moe
                                   else self._fd_decoder_layers_embedding_head,
                                   layers, hidden, residual, cos_sin, metadata, k_caches, v_caches, head)
                if logits is not None:
                    return logits  # type: ignore[no-any-return]
            hidden = hidden.run()
        args = (layers, hidden, residual, cos_sin, metadata, k_caches, v_caches)
        if head is not None:
            if layers and layers[-1].attention_only:
                raise ValueError("decoder_layers: a run that ends attention only cannot end with the head")
            logits = self._ask(self._fd_decoder_layers_moe_head if has_moe else self._fd_decoder_layers_head,
                               *args, head)
            if logits is not None:
                return logits  # type: ignore[no-any-return]
            hidden, residual = self.decoder_layers(*args)
            return head.run(self, hidden, residual)
        if has_moe:
            fused = self._ask(self._fd_decoder_layers_moe_attention_only if layers[-1].attention_only
                              else self._fd_decoder_layers_moe, *args)
            return fused if fused is not None else self._split_moe_run(*args)
        attention_only = bool(layers) and getattr(layers[-1], "attention_only", False)
        fused = self._ask(self._fd_decoder_layers_attention_only if attention_only else (
            self._fd_decoder_layers if self._fuses_layers else None), *args)
        if fused is not None:
            return fused  # type: ignore[no-any-return]
        from fd_core.ops.decoder import compose_decoder_layers

        return compose_decoder_layers(self, layers, hidden, residual, cos_sin, metadata, k_caches, v_caches)

    def decoder_steps(
        self, layers: list[Any], embedding: Any, cos_sin: Tensor, metadata: Any, k_caches: list[KVPool],
        v_caches: list[KVPool], head: Any, steps: int, vocab_size: int, sampling: Any = None,
    ) -> Tensor | None:
        """``steps`` decode steps of the whole model in one call: tokens ``[steps, T]`` int64 from the backend
        that answers ``fd_decoder_steps`` (see the hookspec; ``sampling`` None: greedy rows, else a
        ``DecoderSampling``), or None (none does: the caller runs the steps one by one)."""
        if steps < 1 or vocab_size < 1:
            raise ValueError(f"decoder_steps: steps and vocab_size must be >= 1, got {steps} and "
                             f"{vocab_size}")
        call = self._fd_decoder_steps if sampling is None else self._fd_decoder_steps_sampled
        if call is None:
            return None
        return call(  # type: ignore[no-any-return]
            layers=layers, embedding=embedding, cos_sin=cos_sin, metadata=metadata, k_caches=k_caches,
            v_caches=v_caches, head=head, steps=steps, vocab_size=vocab_size, sampling=sampling)

    @staticmethod
    def _ask(
        call: Dispatch | None, layers: list[Any], hidden: Any, residual: Tensor | None, cos_sin: Tensor,
        metadata: Any, k_caches: list[KVPool], v_caches: list[KVPool], head: Any | None = None,
    ) -> Any:
        """``fd_decoder_layers`` through ``call`` (a subset of the plugins, or None: none asked)."""
        if call is None:
            return None
        return call(layers=layers, hidden=hidden, residual=residual, cos_sin=cos_sin, metadata=metadata,
                    k_caches=k_caches, v_caches=v_caches, head=head)

    def _split_moe_run(
        self, layers: list[Any], hidden: Tensor, residual: Tensor | None, cos_sin: Tensor, metadata: Any,
        k_caches: list[KVPool], v_caches: list[KVPool],
    ) -> tuple[Tensor, Tensor]:
        """The run as pieces that end with each MoE layer's attention half, its MoE block after each."""
        if not (len(layers) == len(k_caches) == len(v_caches)):
            raise ValueError(f"decoder_layers: {len(layers)} layers with {len(k_caches)} k and {len(v_caches)} v "
                             "caches; expected one of each per layer")
        start = 0
        for i, layer in enumerate(layers):
            if layer.moe is None:
                continue
            piece = [*layers[start:i], layer.attention_half()]
            x, residual = self.decoder_layers(piece, hidden, residual, cos_sin, metadata, k_caches[start:i + 1],
                                              v_caches[start:i + 1])
            hidden = layer.moe.run(self, x)
            start = i + 1
        if start == len(layers):
            assert residual is not None  # a MoE layer ran: the stream has begun
            return hidden, residual
        return self.decoder_layers(layers[start:], hidden, residual, cos_sin, metadata, k_caches[start:],
                                   v_caches[start:])

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str,
        location: str = "device",
    ) -> tuple[KVPool, KVPool]:
        return self._answer(  # type: ignore[no-any-return]
            "allocate_kv_cache",
            self._fd_allocate_kv_cache(
                num_blocks=num_blocks, block_size=block_size, num_kv_heads=num_kv_heads,
                head_dim=head_dim, dtype=dtype, location=location,
            ),
        )

    def copy_kv_blocks(
        self, src_cache: KVPool, dst_cache: KVPool, src_blocks: list[int], dst_blocks: list[int],
        block_size: int,
    ) -> None:
        self._answer(
            "copy_kv_blocks",
            self._fd_copy_kv_blocks(
                src_cache=src_cache, dst_cache=dst_cache, src_blocks=src_blocks,
                dst_blocks=dst_blocks, block_size=block_size,
            ),
        )

    def write_kv_cache(self, k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, slot_mapping: Tensor) -> None:
        self._answer(
            "write_kv_cache",
            self._fd_write_kv_cache(
                k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping
            ),
        )

    def prefill_attention(
        self, q: Tensor, k: Tensor, v: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any, scale: float
    ) -> Tensor:
        return self._answer(
            "prefill_attention",
            self._fd_prefill_attention(
                q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, metadata=metadata, scale=scale
            ),
        )

    def decode_attention(self, q: Tensor, k_cache: KVPool, v_cache: KVPool, metadata: Any, scale: float) -> Tensor:
        return self._answer(
            "decode_attention",
            self._fd_decode_attention(
                q=q, k_cache=k_cache, v_cache=v_cache, metadata=metadata, scale=scale
            ),
        )

    def vision_attention(
        self, qkv: Tensor, cos: Tensor, sin: Tensor, cu_seqlens: list[int], num_heads: int, scale: float
    ) -> Tensor:
        """A vision tower's attention within each frame, 2D rotary applied:
        ``qkv [N, 3*H*Dh]`` -> ``[N, H*Dh]`` (see the hookspec)."""
        return self._answer(
            "vision_attention",
            self._fd_vision_attention(
                qkv=qkv, cos=cos, sin=sin, cu_seqlens=cu_seqlens, num_heads=num_heads, scale=scale
            ),
        )

    def moe_select_experts(
        self,
        router_logits: Tensor,
        top_k: int,
        correction_bias: Tensor | None = None,
        renormalize: bool = True,
        norm_min: float = 1e-12,
    ) -> tuple[Tensor, Tensor]:
        return self._answer(  # type: ignore[no-any-return]
            "moe_select_experts",
            self._fd_moe_select_experts(
                router_logits=router_logits, top_k=top_k, correction_bias=correction_bias,
                renormalize=renormalize, norm_min=norm_min,
            ),
        )

    def moe_experts(
        self,
        x: Tensor,
        topk_weights: Tensor,
        topk_ids: Tensor,
        up_gate_weights: Tensor | None,
        down_weights: Tensor | None,
        quant: Any = None,
    ) -> Tensor:
        return self._answer(
            "moe_experts",
            self._fd_moe_experts(
                x=x, topk_weights=topk_weights, topk_ids=topk_ids,
                up_gate_weights=up_gate_weights, down_weights=down_weights, quant=quant,
            ),
        )

    def moe_experts_with_shared(
        self,
        x: Tensor,
        topk_weights: Tensor,
        topk_ids: Tensor,
        up_gate_weights: Tensor | None,
        down_weights: Tensor | None,
        quant: Any,
        shared_up_gate: Any,
        shared_down: Any,
    ) -> Tensor:
        """Routed experts plus the shared expert (``shared_up_gate [D, 2*Is]``,
        ``shared_down [Is, D]``, tensors or ``QuantizedWeight``): the backend's
        fused kernel when it answers, else ``moe_experts(...) +
        down(silu_and_mul(up_gate(x)))`` through the unfused hooks (see the
        hookspec)."""
        fused = self._fd_moe_layer_experts(
            x=x, topk_weights=topk_weights, topk_ids=topk_ids, up_gate_weights=up_gate_weights,
            down_weights=down_weights, quant=quant, shared_up_gate=shared_up_gate, shared_down=shared_down,
        )
        if fused is not None:
            return fused  # type: ignore[no-any-return]
        from fd_core.ops.decoder import (
            apply_linear,  # paddle, so not at import (the API process lists backends)
        )

        out = self.moe_experts(x, topk_weights, topk_ids, up_gate_weights, down_weights, quant)
        return out + apply_linear(self, self.silu_and_mul(apply_linear(self, x, shared_up_gate)), shared_down)

    def moe_layer(
        self,
        x: Tensor,
        gate: Tensor,
        correction_bias: Tensor | None,
        top_k: int,
        renormalize: bool,
        norm_min: float,
        up_gate_weights: Tensor | None,
        down_weights: Tensor | None,
        quant: Any,
        shared_up_gate: Any = None,
        shared_down: Any = None,
    ) -> Tensor:
        """A MoE layer after its norm: router ``gate [D, E]``, routing, routed
        experts and the shared expert when given (both None: none). The
        backend's fused kernel when it answers, else the router linear,
        ``moe_select_experts`` and ``moe_experts_with_shared`` /
        ``moe_experts`` (see the hookspec)."""
        fused = self._fd_moe_layer(
            x=x, gate=gate, correction_bias=correction_bias, top_k=top_k, renormalize=renormalize,
            norm_min=norm_min, up_gate_weights=up_gate_weights, down_weights=down_weights, quant=quant,
            shared_up_gate=shared_up_gate, shared_down=shared_down,
        )
        if fused is not None:
            return fused  # type: ignore[no-any-return]
        router_logits = self.linear(x.astype("float32"), gate)
        weights, ids = self.moe_select_experts(router_logits, top_k, correction_bias, renormalize, norm_min)
        if shared_up_gate is None and shared_down is None:
            return self.moe_experts(x, weights, ids, up_gate_weights, down_weights, quant)
        return self.moe_experts_with_shared(
            x, weights, ids, up_gate_weights, down_weights, quant, shared_up_gate, shared_down,
        )

    def sample(
        self,
        logits: Tensor,
        temperature: Tensor,
        top_k: Tensor,
        top_p: Tensor,
        min_p: Tensor,
        uniforms: Tensor,
        method: str = "sort",
    ) -> Tensor:
        return self._answer(
            "sample",
            self._fd_sample(
                logits=logits, temperature=temperature, top_k=top_k, top_p=top_p,
                min_p=min_p, uniforms=uniforms, method=method,
            ),
            method,
        )

    def apply_token_bitmask(self, logits: Tensor, bitmask: Any, rows: list[int]) -> Tensor:
        """``logits`` with the tokens ``bitmask [M, W]`` (int32 numpy) clears set to
        -inf in rows ``rows``; see the hookspec ``fd_apply_token_bitmask``."""
        return self._answer(
            "apply_token_bitmask", self._fd_apply_token_bitmask(logits=logits, bitmask=bitmask, rows=rows)
        )

    def communicator(self, world_size: int, rank: int, group: Any = None) -> Communicator:
        return self._answer(
            "communicator",
            self._fd_communicator(world_size=world_size, rank=rank, group=group),
        )


class Backend:
    """A selected backend: its description, its plugin manager and its ops."""

    def __init__(self, name: str, pm: pluggy.PluginManager) -> None:
        self.name = name
        self.pm = pm
        self.ops = Ops(pm, name)

    @property
    def info(self) -> DeviceInfo:
        return self.pm.hook.fd_device_info()  # type: ignore[no-any-return]

    def availability(self) -> Availability:
        return self.pm.hook.fd_device_availability()  # type: ignore[no-any-return]

    def capabilities(self) -> Capabilities:
        return self.pm.hook.fd_device_capabilities()  # type: ignore[no-any-return]

    def memory(self, device_id: int = 0) -> MemoryInfo:
        return self.pm.hook.fd_device_memory(device_id=device_id)  # type: ignore[no-any-return]

    def set_device(self, device_id: int = 0) -> str:
        return self.pm.hook.fd_set_device(device_id=device_id)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"
