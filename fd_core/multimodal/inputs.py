"""A prompt with images and videos: placeholder expansion, 3D positions, vision-expert tokens.

``build_inputs`` takes a tokenized prompt holding one ``<|IMAGE_PLACEHOLDER|>`` per
image (the chat template writes ``<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>``)
and one video slot per video (the video placeholder id, or an empty
``<|VIDEO_START|><|VIDEO_END|>`` pair: the chat parts write ``Video N:<|VIDEO_START|><|VIDEO_END|>``,
which every ERNIE tokenizer has) and returns the prompt with each placeholder repeated to its
item's token count, plus ``MultiModalInputs``: the processed images and videos in prompt order,
where their tokens sit, every prompt token's (time, height, width) rotary position as HF's
``get_rope_index`` computes it (a video's time axis counts frame pairs), and which prompt tokens
the MoE routes to vision experts (placeholders and the image/video start/end markers, as HF's
processor marks them).
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
    images: list[ProcessedImage]  # images and videos (ProcessedVideo), in prompt order
    offsets: list[int]  # image or video -> prompt index of its first token
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


def _image_positions(start: int, grid_thw: tuple[int, int, int], merge: int, temporal: int = 1) -> np.ndarray:
    """HF's ``get_vision_position_ids``: ``[3, t/temporal * h*w/m^2]``, all offset by ``start``
    (``temporal`` 2 for a video: two frames make one temporal position)."""
    t, h, w = grid_thw[0] // temporal, grid_thw[1] // merge, grid_thw[2] // merge
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + start


def _slots(token_ids: Sequence[int], config: Any) -> list[tuple[int, str]]:
    """``(index, kind)`` of each media slot: an image placeholder, a video placeholder, or an empty
    ``<|VIDEO_START|><|VIDEO_END|>`` pair (a video goes between; the slot index is the end marker's)."""
    slots = []
    for i, t in enumerate(token_ids):
        if t == config.image_token_id:
            slots.append((i, "image"))
        elif t == config.video_token_id:
            slots.append((i, "video"))
        elif t == config.video_end_token_id and i and token_ids[i - 1] == config.video_start_token_id:
            slots.append((i, "video_pair"))
    return slots


def build_inputs(token_ids: Sequence[int], images: Sequence[ProcessedImage], config: Any,
                 videos: Sequence[ProcessedImage] = ()) -> tuple[list[int], MultiModalInputs]:
    """Expand each image placeholder of ``token_ids`` to its image's tokens and each video slot (a
    video placeholder, or ``<|VIDEO_START|><|VIDEO_END|>`` with nothing between) to its video's;
    ``config`` has the token ids (``image_token_id``, ``video_token_id``, ...) and
    ``vision.spatial_merge_size`` / ``temporal_merge_size`` (a ``VLModelConfig``). ValueError when
    the placeholder counts differ from the numbers of images and videos."""
    slots = _slots(token_ids, config)
    for modality, given in (("image", len(images)), ("video", len(videos))):
        found = sum(1 for _, k in slots if k.startswith(modality))
        if found != given:
            marker = ("<|IMAGE_PLACEHOLDER|>, id " + str(config.image_token_id) if modality == "image" else
                      "<|VIDEO_START|><|VIDEO_END|> or the video placeholder id " + str(config.video_token_id))
            raise ValueError(f"the prompt holds {found} {modality} placeholder(s) ({marker}) but {given} "
                             f"{modality}(s) were given; put one placeholder where each {modality} goes")
    merge = config.vision.spatial_merge_size
    temporal = getattr(config.vision, "temporal_merge_size", 2)
    kind_at = {i: k for i, k in slots}
    queues = {"image": iter(images), "video": iter(videos)}
    ids: list[int] = []
    offsets: list[int] = []
    items: list[ProcessedImage] = []
    pieces: list[np.ndarray] = []
    pos = 0  # next text position
    text_run = 0

    def flush_text() -> None:
        nonlocal pos, text_run
        if text_run:
            pieces.append(np.repeat(np.arange(pos, pos + text_run)[None, :], 3, axis=0))
            pos += text_run
            text_run = 0

    for i, t in enumerate(token_ids):
        kind = kind_at.get(i)
        if kind is None:
            ids.append(t)
            text_run += 1
            continue
        flush_text()
        item = next(queues["image" if kind == "image" else "video"])
        offsets.append(len(ids))
        items.append(item)
        token = config.image_token_id if kind == "image" else config.video_token_id
        ids.extend([token] * item.num_tokens)
        pieces.append(_image_positions(pos, item.grid_thw, merge, 1 if kind == "image" else temporal))
        pos += max(item.grid_thw[1], item.grid_thw[2]) // merge
        if kind == "video_pair":  # the end marker this slot stands on is text after the video
            ids.append(t)
            text_run += 1
    flush_text()
    positions = np.concatenate(pieces, axis=1).T.astype(np.int64) if pieces else np.zeros((0, 3), np.int64)
    vision_ids = [config.image_token_id, config.image_start_token_id, config.image_end_token_id,
                  config.video_token_id, config.video_start_token_id, config.video_end_token_id]
    vision_mask = np.isin(np.asarray(ids, dtype=np.int64), vision_ids) if items else np.zeros(len(ids), bool)
    delta = int(positions.max()) + 1 - len(ids) if len(ids) else 0
    return ids, MultiModalInputs(items, offsets, positions, delta, vision_mask)
