"""The model runner's multimodal view of a step (``MultiModalStep``).

``build_step`` is called by ``fd_core.engine.model_runner.ModelRunner.execute``
for a model with ``is_multimodal``; it returns None when no request of the step
has images (the model then runs its text path). Otherwise, per request and its
tokens ``start .. end - 1`` this step: their 3D positions, the rows the MoE
routes to vision experts, and for every image whose tokens fall in the range
the matching slice of its features (encoded once, through the encoder cache),
so a prefill chunk may end inside an image and stay exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fd_core._paddle import import_paddle
from fd_core.multimodal.encoder_cache import EncoderCache

__all__ = ["MultiModalStep", "build_step"]

paddle = import_paddle()


@dataclass
class MultiModalStep:
    positions3d: np.ndarray | None  # [T, 3] int64 per token of the step
    embed_rows: Any  # [R] int64 paddle tensor: rows whose embedding an image feature replaces (None: none)
    embeds: Any  # [R, D] fp32 paddle tensor
    moe_rows: tuple[Any, Any, Any] | None  # (text rows or None, vision rows, inverse permutation); None: all text


def _encoder(model: Any, image: Any) -> Callable[[], Any]:
    return lambda: model.encode(image.pixel_values, image.grid_thw)


def build_step(model: Any, token_ids: Sequence[Sequence[int]], seq_lens: Sequence[int],
               mm_inputs: Sequence[Any], cache: EncoderCache) -> MultiModalStep | None:
    """The step's ``MultiModalStep`` (``mm_inputs``: request -> ``MultiModalInputs`` or None)."""
    if not any(m is not None for m in mm_inputs):
        return None
    positions, vision, rows, embeds = [], [], [], []
    row = 0
    for ids, seq_len, mm in zip(token_ids, seq_lens, mm_inputs):
        start, end = seq_len - len(ids), seq_len
        if mm is None:
            positions.append(np.repeat(np.arange(start, end, dtype=np.int64)[:, None], 3, axis=1))
            vision.append(np.zeros(end - start, dtype=bool))
        else:
            positions.append(mm.positions(start, end))
            vision.append(mm.vision_rows(start, end))
            for image, offset in zip(mm.images, mm.offsets):
                lo, hi = max(start, offset), min(end, offset + image.num_tokens)
                if lo >= hi:
                    continue
                features = cache.get(image.hash, _encoder(model, image))
                embeds.append(features[lo - offset : hi - offset])
                rows.append(np.arange(row + lo - start, row + hi - start, dtype=np.int64))
        row += end - start
    mask = np.concatenate(vision)
    moe_rows = None
    if mask.any():
        text_idx, vision_idx = np.nonzero(~mask)[0], np.nonzero(mask)[0]
        inverse = np.argsort(np.concatenate([text_idx, vision_idx]), kind="stable")
        moe_rows = (paddle.to_tensor(text_idx) if len(text_idx) else None, paddle.to_tensor(vision_idx),
                    paddle.to_tensor(inverse.astype(np.int64)))
    return MultiModalStep(
        positions3d=np.concatenate(positions, axis=0),
        embed_rows=paddle.to_tensor(np.concatenate(rows)) if rows else None,
        embeds=(paddle.concat(embeds, axis=0) if len(embeds) > 1 else embeds[0]) if embeds else None,
        moe_rows=moe_rows,
    )
