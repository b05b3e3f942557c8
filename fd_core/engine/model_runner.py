"""The model runner: one forward over a step's batch on the paged KV cache.

The scheduler describes a step as a ``StepInput`` (per request: new token
ids, cached length after the step, block table; decodes first) and the
runner returns logits for the requests that sample this step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fd_core._paddle import import_paddle
from fd_core.backends.base import Backend
from fd_core.engine.memory_profile import largest_steps, measure_peak_bytes
from fd_core.engine.step_tensors import DecodeBuffers, step_tensors
from fd_core.layers.attention import KVCache
from fd_core.model_loader.accounting import weight_bytes
from fd_core.model_loader.dtypes import checkpoint_dtype, resolve_weight_dtype
from fd_core.model_loader.loader import load_model, supported_weight_dtypes
from fd_core.models import registry
from fd_core.models.config import load_config
from fd_core.multimodal.encoder_cache import EncoderCache
from fd_core.ops._host import plug_tensor_init_leak
from fd_core.ops.kv_dtype import KV_DTYPES, bytes_per_token_head
from fd_core.parallel.config import local_kv_heads

__all__ = ["ModelRunner", "StepInput"]

logger = logging.getLogger(__name__)
paddle = import_paddle()


@dataclass
class StepInput:
    """One step's batch, requests in order: decodes first, then prefills."""

    token_ids: list[list[int]]  # request -> its new tokens this step
    seq_lens: list[int]  # request -> tokens cached after this step (context + new)
    block_tables: list[list[int]]  # request -> its KV block ids, in order
    num_decodes: int  # requests [0, num_decodes) decode exactly one token
    # request -> whether to return logits for its last new token (False for a
    # prefill chunk that does not finish the prompt)
    needs_logits: list[bool] = field(default_factory=list)
    # request -> return logits for every new token (prompt logprobs); its rows
    # come in order and include the last one
    all_logits: list[bool] = field(default_factory=list)
    # request -> its fd_core.multimodal.MultiModalInputs or None (empty: no request has images)
    mm_inputs: list[Any] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.token_ids)


class ModelRunner:
    """Owns the model, its KV cache, and the step forward."""

    def __init__(
        self,
        model_dir: str | Path,
        backend: Backend,
        num_blocks: int | None = None,
        block_size: int = 64,
        max_model_len: int | None = None,
        device_id: int = 0,
        num_host_blocks: int = 0,
        quantization: Any = None,
        dtype: str = "auto",
        kv_cache_dtype: str = "float32",
        tensor_parallel: Any = None,
        lm_head_fp32: bool = False,
    ) -> None:
        """Load the model. ``num_blocks``: allocate the KV cache now; None leaves it
        to ``allocate_kv_cache`` (the engine sizes it from the memory the weights
        left). ``quantization``: a ``fd_core.quantization.QuantizationConfig`` or None.
        ``dtype``: ``--dtype`` (auto, float32, float16, bfloat16), resolved by
        ``fd_core.model_loader.dtypes.resolve_weight_dtype`` into ``self.dtype``.
        ``kv_cache_dtype``: the KV pool's dtype, resolved (no "auto"): one of
        ``fd_core.ops.kv_dtype.KV_DTYPES``. ``tensor_parallel``: this rank's
        ``fd_core.parallel.tensor_parallel.TensorParallel`` (None: one device); the
        runner then loads the rank's shard and its KV pools hold the rank's KV heads."""
        if kv_cache_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_cache_dtype!r}")
        self.kv_cache_dtype = kv_cache_dtype
        # before any step: every tensor the engine makes from host data would leak otherwise
        plug_tensor_init_leak()
        self.backend = backend
        self.ops = backend.ops
        backend.set_device(device_id)
        self.config = load_config(model_dir)
        self.max_model_len = max_model_len or self.config.max_position_embeddings
        if self.max_model_len > self.config.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's "
                f"max_position_embeddings {self.config.max_position_embeddings}"
            )
        self.block_size = block_size
        self._decode_buffers = DecodeBuffers()  # decode-only steps reuse their host tensors (step_tensors)
        stored = checkpoint_dtype(model_dir)
        self.dtype = resolve_weight_dtype(dtype, stored, backend.capabilities().bf16, backend.name)
        if dtype == "auto" and self.dtype not in supported_weight_dtypes(registry.resolve(self.config.architecture)):
            self.dtype = "float32"  # a model that declares no 16-bit forward
        logger.info("weights: --dtype %s -> %s (checkpoint %s, backend %s)", dtype, self.dtype, stored, backend.name)
        self.tensor_parallel = tensor_parallel
        world = tensor_parallel.world if tensor_parallel is not None else 1
        self.num_kv_heads = local_kv_heads(self.config.num_kv_heads, world)  # KV heads in this rank's pools
        self.model = load_model(model_dir, self.ops, self.max_model_len, self.config, quantization, self.dtype,
                                transform=tensor_parallel, lm_head_fp32=lm_head_fp32)  # --lm_head-fp32
        # bytes the loaded weights hold (quantized: codes + scales), for benchmarks and logs
        self.weight_bytes: int = weight_bytes(self.model)
        self.encoder_cache = EncoderCache()  # image hash -> vision features (multimodal models)
        self.num_blocks = 0
        self.kv_caches: list[KVCache] = []
        self.host_caches: list[KVCache] = []
        if num_blocks is not None:
            self.allocate_kv_cache(num_blocks, num_host_blocks)

    def allocate_kv_cache(self, num_blocks: int, num_host_blocks: int = 0, kv_cache_dtype: str | None = None) -> None:
        """The paged KV cache (one K and one V pool per layer, block 0 the null
        block) and, with ``num_host_blocks``, its host (swap) tier, in
        ``kv_cache_dtype`` (None: the one given at construction)."""
        if kv_cache_dtype is not None:
            if kv_cache_dtype not in KV_DTYPES:
                raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_cache_dtype!r}")
            self.kv_cache_dtype = kv_cache_dtype
        c = self.config
        self.num_blocks = num_blocks
        dtype = self.kv_cache_dtype
        self.kv_caches = [
            KVCache(*self.ops.allocate_kv_cache(num_blocks, self.block_size, self.num_kv_heads, c.head_dim, dtype),
                    dtype)
            for _ in range(c.num_layers)
        ]
        self.host_caches = [
            KVCache(*self.ops.allocate_kv_cache(
                num_host_blocks, self.block_size, self.num_kv_heads, c.head_dim, dtype, location="host"), dtype)
            for _ in range(c.num_layers)
        ] if num_host_blocks else []

    def warmup(self) -> None:
        """One small prefill and one decode through the reserved null block 0
        (never read for real requests), so the first request does not pay
        for first-use costs (BLAS initialisation, allocator growth, lazily
        built kernels)."""
        n = max(1, min(self.block_size, 16, self.max_model_len - 1))
        self.execute(StepInput([[0] * n], [n], [[0]], 0, [True]))
        self.execute(StepInput([[0]], [n], [[0]], 1, [True]))

    def profile_run(self, max_num_batched_tokens: int, max_num_seqs: int, kv_cache_dtype: str | None = None,
                    device_id: int = 0) -> int:
        """Warm up with the largest steps the scheduler can issue and return
        their peak memory in bytes beyond what was in use before (activations,
        logits, attention workspaces), so the engine can size the KV pool from
        what is left. Runs before the pool exists, on a one-block pool (every
        block table is block 0, the null block) that is freed afterwards: the
        steps write nothing a request can read. Leaves no KV cache allocated."""
        steps = largest_steps(max_num_batched_tokens, max_num_seqs, self.max_model_len, self.block_size)

        def run() -> None:
            for token_ids, seq_lens, tables, num_decodes in steps:
                self.execute(StepInput(token_ids, seq_lens, tables, num_decodes))

        self.allocate_kv_cache(1, 0, kv_cache_dtype)
        try:
            return measure_peak_bytes(run, self.backend.info.device_type, self.backend, device_id)
        finally:
            self.kv_caches, self.host_caches, self.num_blocks = [], [], 0

    def apply_swaps(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Copy (device -> host) blocks, then (host -> device) blocks, every layer."""
        for pairs, outgoing in ((swap_out, True), (swap_in, False)):
            if not pairs:
                continue
            src_ids, dst_ids = [p[0] for p in pairs], [p[1] for p in pairs]
            for device, host in zip(self.kv_caches, self.host_caches):
                src, dst = (device, host) if outgoing else (host, device)
                self.ops.copy_kv_blocks(src.k, dst.k, src_ids, dst_ids, self.block_size)
                self.ops.copy_kv_blocks(src.v, dst.v, src_ids, dst_ids, self.block_size)

    @staticmethod
    def kv_bytes_per_block(config: Any, block_size: int, kv_cache_dtype: str = "float32",
                           num_kv_heads: int | None = None) -> int:
        """Bytes one KV block takes across all layers (K and V), in the
        reference layout of ``kv_cache_dtype``: int8 / fp8 count their fp32
        scale per token and KV head (head_dim 128: 132 bytes against fp32's
        512, 3.88x the blocks; head_dim 16: 20 against 64, 3.2x).
        ``num_kv_heads``: the heads a rank's pool holds (default: the model's)."""
        per_head = bytes_per_token_head(kv_cache_dtype, config.head_dim)
        heads = config.num_kv_heads if num_kv_heads is None else num_kv_heads
        return 2 * config.num_layers * block_size * heads * per_head

    def execute(self, step: StepInput) -> Any:
        """Run the step; returns logits ``[N, V]`` (fp32 paddle tensor), in
        request order: every new token's row for ``all_logits`` requests, the
        last row for other ``needs_logits`` requests; None if no rows."""
        flat, meta, logits_rows = step_tensors(step, self.block_size, self.config.vocab_size, self.max_model_len,
                                               self._decode_buffers)
        extra: dict[str, Any] = {}
        if getattr(self.model, "is_multimodal", False):  # 3D positions, image features (fd_core.multimodal.step)
            from fd_core.multimodal.step import build_step

            extra["mm"] = build_step(self.model, step.token_ids, step.seq_lens,
                                     step.mm_inputs or [None] * step.num_reqs, self.encoder_cache)
        with paddle.no_grad():
            return self.model.forward(flat, meta, self.kv_caches, logits_rows, **extra)

    def execute_steps(self, step: StepInput, steps: int, sampling: Any = None) -> list[list[int]] | None:
        """Multi-step decoding in one backend call: ``steps`` decode steps from ``step`` (decode-only,
        its block tables holding every step's slot), each request's token (greedy, or drawn as
        ``sampling``, a ``DecoderSampling``, says) fed to the next; the tokens ``[steps][requests]``, or
        None where the model or no backend runs them together (``Ernie4_5ForCausalLM.decode_steps``; the
        engine core then runs them one by one)."""
        decode_steps = getattr(self.model, "decode_steps", None)
        if decode_steps is None or getattr(self.model, "is_multimodal", False):
            return None
        flat, meta, logits_rows = step_tensors(step, self.block_size, self.config.vocab_size, self.max_model_len,
                                               self._decode_buffers)
        if logits_rows is not None or meta.num_decodes != step.num_reqs:
            return None
        with paddle.no_grad():
            tokens = decode_steps(flat, meta, self.kv_caches, steps, self.config.vocab_size, sampling)
        return None if tokens is None else tokens.numpy().tolist()
