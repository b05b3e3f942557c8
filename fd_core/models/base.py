"""What every model family shares with the loader: where a checkpoint tensor lands.

A model class offers (see ``fd_core.models.ernie4_5`` and ``qwen3``):
``parameters()`` (name -> ``Param`` the checkpoint fills), ``checkpoint_targets(naming)``
(checkpoint tensor name -> ``Target``s), ``finish_loading()`` (ties, derived weights),
``forward(input_ids, meta, caches, logits_indices)``, ``weight_dtypes`` (the storage
dtypes its forward takes) and, when its linear layers can be quantized,
``quantizable = True`` (``fd_core.quantization.apply.quantize_model`` walks ``layers``
and ``lm_head``). Memory accounting lives in ``fd_core.model_loader.accounting``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fd_core.layers.param import Param

__all__ = ["Target"]


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: ``param[index] = f(tensor[source_index])``
    where ``f`` transposes the last two axes when ``transpose`` and then reshapes
    to the region (e.g. a ``[1, E]`` bias into ``[E]``). ``source_shape`` is the
    whole stored tensor's; ``source_index`` (empty: all of it) picks the part this
    process reads, e.g. a tensor-parallel rank's columns
    (``fd_core.parallel.tensor_parallel``), read from the memory-mapped file alone."""

    param: Param
    source_shape: tuple[int, ...]
    index: tuple[Any, ...] = ()
    transpose: bool = False
    source_index: tuple[Any, ...] = ()
