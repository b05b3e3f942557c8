"""A prompt with images: placeholder expansion, 3D positions, vision-expert tokens.

``build_inputs`` takes a tokenized prompt holding one ``<|IMAGE_PLACEHOLDER|>`` per
image (the chat template writes ``<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>``)
and returns the prompt with each placeholder repeated to the image's token count,
plus ``MultiModalInputs``: the processed images, where their tokens sit, every
prompt token's (time, height, width) rotary position as HF's ``get_rope_index``
computes it, and which prompt tokens the MoE routes to vision experts (image
placeholders and the image start/end markers, as HF's processor marks them).
Built in the API process / offline ``LLM``; the engine core keeps it with the
request, the model runner reads positions and features from it (``step``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fd_core.multimodal.image_processor import ProcessedImage

__all__ = ["MultiModalInputs", "build_inputs"]


@dataclass
class MultiModalInputs:
    images: list[ProcessedImage]
    offsets: list[int]  # image -> prompt index of its first token
    positions3d: np.ndarray  # [P, 3] int64: (time, height, width) of each prompt token
    rope_delta: int  # token n >= P sits at position n + rope_delta on every axis
    vision_mask: np.ndarray  # [P] bool: prompt tokens the MoE routes to vision experts

    @property
    def hashes(self) -> list[str]:
        return [image.hash for image in self.images]

    @property
    def placeholder_ranges(self) -> list[tuple[int, int]]:
        """image -> (offset, length) in the prompt: the prefix cache's extra keys."""
        return [(o, image.num_tokens) for o, image in zip(self.offsets, self.images)]

    def positions(self, start: int, end: int) -> np.ndarray:
        """``[end - start, 3]`` positions of tokens ``start .. end - 1`` (prompt or generated)."""
        num_prompt = len(self.positions3d)
        head = self.positions3d[start : min(end, num_prompt)]
        if end <= num_prompt:
            return head
        tail = np.arange(max(start, num_prompt), end, dtype=np.int64) + self.rope_delta
        return np.concatenate([head, np.repeat(tail[:, None], 3, axis=1)], axis=0)

    def vision_rows(self, start: int, end: int) -> np.ndarray:
        """``[end - start]`` bool: which of tokens ``start .. end - 1`` go to vision experts."""
        mask = np.zeros(end - start, dtype=bool)
        stop = min(end, len(self.vision_mask))
        if stop > start:
            mask[: stop - start] = self.vision_mask[start:stop]
        return mask


def _image_positions(start: int, grid_thw: tuple[int, int, int], merge: int) -> np.ndarray:
    """HF's ``get_vision_position_ids`` for an image: ``[3, t*h*w/m^2]``, all offset by ``start``."""
    t, h, w = grid_thw[0], grid_thw[1] // merge, grid_thw[2] // merge
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + start


def build_inputs(token_ids: Sequence[int], images: Sequence[ProcessedImage], config: Any) -> \
        tuple[list[int], MultiModalInputs]:
    """Expand each image placeholder of ``token_ids`` to its image's tokens; ``config``
    has the token ids (``image_token_id``, ``image_start_token_id``, ...) and
    ``vision.spatial_merge_size`` (a ``VLModelConfig``). ValueError when the
    placeholder count differs from the number of images."""
    placeholder = config.image_token_id
    found = sum(1 for t in token_ids if t == placeholder)
    if found != len(images):
        raise ValueError(f"the prompt holds {found} image placeholder(s) (<|IMAGE_PLACEHOLDER|>, id {placeholder}) "
                         f"but {len(images)} image(s) were given; put one placeholder where each image goes")
    merge = config.vision.spatial_merge_size
    ids: list[int] = []
    offsets: list[int] = []
    pieces: list[np.ndarray] = []
    pos = 0  # next text position
    text_run = 0
    images_iter = iter(images)

    def flush_text() -> None:
        nonlocal pos, text_run
        if text_run:
            pieces.append(np.repeat(np.arange(pos, pos + text_run)[None, :], 3, axis=0))
            pos += text_run
            text_run = 0

    for t in token_ids:
        if t != placeholder:
            ids.append(t)
            text_run += 1
            continue
        flush_text()
        image = next(images_iter)
        offsets.append(len(ids))
        ids.extend([placeholder] * image.num_tokens)
        pieces.append(_image_positions(pos, image.grid_thw, merge))
        pos += max(image.grid_thw[1], image.grid_thw[2]) // merge
    flush_text()
    positions = np.concatenate(pieces, axis=1).T.astype(np.int64) if pieces else np.zeros((0, 3), np.int64)
    vision_ids = [config.image_token_id, config.image_start_token_id, config.image_end_token_id,
                  config.video_token_id, config.video_start_token_id, config.video_end_token_id]
    vision_mask = np.isin(np.asarray(ids, dtype=np.int64), vision_ids) if images else np.zeros(len(ids), bool)
    delta = int(positions.max()) + 1 - len(ids) if len(ids) else 0
    return ids, MultiModalInputs(list(images), offsets, positions, delta, vision_mask)
