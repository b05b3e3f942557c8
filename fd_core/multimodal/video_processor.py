"""ERNIE-4.5-VL's video processor, numerically HF's (``Ernie4_5_VLMoeVideoProcessor``), without torch.

A video (encoded bytes or a path, decoded with PyAV by ``video_decode``; or frames already decoded:
an ``[T, H, W, 3]`` uint8 array or a list of PIL images / arrays, at ``fps``) becomes
``ProcessedVideo``:

1. frames sampled as HF does: all of them, or ``fps`` per second when set, clamped to
   ``[min_frames, max_frames]`` and the frame count, at ``arange(0, total, total / n)`` (float32,
   truncated);
2. each frame stamped in its top-left corner with ``time: HH:MM:SS.ss`` (black text, white outline,
   a tenth of the short side high) in the font the model ships (``font`` in
   video_preprocessor_config.json, e.g. Roboto-Regular.ttf next to it); without that file PIL's
   built-in font stands in (HF refuses to load then) and the stamps differ from HF's;
3. an odd frame count repeats the last frame (the temporal patch is 2 frames);
4. frames resized to ``smart_resize`` of the pixel budget (``video_min_pixels``/``video_max_pixels``)
   with torchvision's antialiased bicubic, reproduced exactly (``video_resize``);
5. normalized (CLIP mean/std, fp32 as HF's fused rescale-normalize) and cut into merge-block patches:
   ``pixel_values [T*h*w, 3*P*P]``, ``grid_thw = (T, h, w)``, ``T*h*w / merge^2 / 2`` LM tokens.

Called by the offline ``LLM`` and the API server (in a worker thread) before a request reaches the
engine; bad videos raise ``VideoError`` naming the problem.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fd_core.multimodal.image_processor import (
    _CLIP_MEAN,
    _CLIP_STD,
    ImageError,
    ProcessedImage,
    smart_resize,
)
from fd_core.multimodal.video_decode import DecodedVideo, VideoError, decode_video
from fd_core.multimodal.video_resize import resize_bicubic_aa

__all__ = ["ProcessedVideo", "VideoError", "VideoProcessor", "VideoProcessorConfig", "sample_indices"]

logger = logging.getLogger(__name__)

# --mm-processor-kwargs key (FastDeploy's and HF's names) -> VideoProcessorConfig field
OPTION_KEYS = {"video_fps": "fps", "fps": "fps", "video_min_frames": "min_frames", "min_frames": "min_frames",
               "video_max_frames": "max_frames", "max_frames": "max_frames", "video_min_pixels": "min_pixels",
               "video_max_pixels": "max_pixels", "video_max_input_frames": "max_input_frames"}


@dataclass(frozen=True)
class VideoProcessorConfig:
    """video_preprocessor_config.json's keys, HF's class defaults where absent."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 299 * 28 * 28
    max_pixels: int = 1196 * 28 * 28
    min_frames: int = 16
    max_frames: int = 180
    fps: float | None = None  # frames per second to sample; None: every frame (within the limits)
    draw_on_frames: bool = True
    font: str | None = None  # path of the TrueType font for the timestamps (None: PIL's built-in one)
    image_mean: tuple[float, ...] = _CLIP_MEAN
    image_std: tuple[float, ...] = _CLIP_STD
    rescale_factor: float = 1 / 255
    max_input_frames: int = 18000  # a video with more frames than this is refused
    max_input_pixels: int = 8192 * 8192  # per frame

    @classmethod
    def from_dir(cls, model_dir: str | Path, **overrides: Any) -> VideoProcessorConfig:
        """Read ``video_preprocessor_config.json`` (or ``processor_config.json``'s "video_processor")
        from ``model_dir``; ``overrides`` (``--mm-processor-kwargs`` names, ``OPTION_KEYS``) win."""
        model_dir = Path(model_dir)
        raw: dict[str, Any] = {}
        nested = model_dir / "processor_config.json"
        if nested.exists():
            raw = json.loads(nested.read_text()).get("video_processor") or {}
        if not raw and (model_dir / "video_preprocessor_config.json").exists():
            raw = json.loads((model_dir / "video_preprocessor_config.json").read_text())
        size = raw.get("size") or {}
        values: dict[str, Any] = {k: raw[k] for k in ("patch_size", "merge_size", "temporal_patch_size", "min_frames",
                                                      "max_frames", "fps", "draw_on_frames", "rescale_factor")
                                  if raw.get(k) is not None}
        if "shortest_edge" in size:
            values["min_pixels"] = size["shortest_edge"]
        if "longest_edge" in size:
            values["max_pixels"] = size["longest_edge"]
        for key in ("image_mean", "image_std"):
            if key in raw:
                values[key] = tuple(raw[key])
        font = raw.get("font", "Roboto-Regular.ttf")
        values["font"] = str(model_dir / font) if font and (model_dir / font).is_file() else None
        for key, value in overrides.items():
            if key not in OPTION_KEYS:
                raise ValueError(f"unknown video processor option {key!r}; expected some of {sorted(OPTION_KEYS)}")
            values[OPTION_KEYS[key]] = value
        config = cls(**values)
        if config.temporal_patch_size != 2:
            raise ValueError(f"temporal_patch_size {config.temporal_patch_size}: ERNIE-4.5-VL takes 2")
        if config.min_frames > config.max_frames:
            raise ValueError(f"video_min_frames {config.min_frames} exceeds video_max_frames {config.max_frames}")
        return config


@dataclass
class ProcessedVideo(ProcessedImage):
    """One video, ready for the vision tower (``grid_thw = (frames, h, w)``)."""

    modality: ClassVar[str] = "video"
    timestamps: list[float] = field(default_factory=list)  # seconds of each sampled frame


def sample_indices(total: int, fps: float, config: VideoProcessorConfig) -> list[int]:
    """HF's ``sample_frames``: which of ``total`` frames (at ``fps``) to keep."""
    if config.fps is not None:
        num = total / fps * config.fps
    else:
        num = total
    num = min(max(num, config.min_frames), config.max_frames, total)
    step = total / num
    count = math.ceil(total / step)
    # torch.arange(0, total, step) in float32 (computed in double, stored as float), then .int()
    values = (np.arange(count, dtype=np.float64) * step).astype(np.float32)
    return [int(v) for v in values]


def _timestamp(seconds: float) -> str:
    hours, seconds = seconds // 3600, seconds % 3600
    minutes, seconds = seconds // 60, seconds % 60
    return f"time: {int(hours):02d}:{int(minutes):02d}:{seconds:05.02f}"


class VideoProcessor:
    """Videos -> ``ProcessedVideo`` (HF's video processor, numerically)."""

    _warned_font = False

    def __init__(self, config: VideoProcessorConfig | None = None) -> None:
        self.config = config or VideoProcessorConfig()

    @classmethod
    def from_dir(cls, model_dir: str | Path, **overrides: Any) -> VideoProcessor:
        return cls(VideoProcessorConfig.from_dir(model_dir, **overrides))

    def decode(self, video: Any, fps: float | None = None) -> DecodedVideo:
        """Sampled frames of ``video`` (bytes or a path: decoded; or frames at ``fps``, default 24),
        each stamped with its time and resized to the pixel budget as it is decoded."""
        c = self.config
        if isinstance(video, (bytes, bytearray, str, Path)):
            return decode_video(video, lambda total, rate: sample_indices(total, rate, c), c.max_input_frames,
                                c.max_input_pixels, self._frame)
        frames = _as_frames(video)
        rate = float(fps) if fps else 24.0
        indices = sample_indices(len(frames), rate, c)
        return DecodedVideo(np.stack([self._frame(frames[i], i, rate) for i in indices]), indices, rate, len(frames))

    def _frame(self, frame: np.ndarray, index: int, fps: float) -> np.ndarray:
        """One sampled ``[H, W, 3]`` frame: its timestamp drawn, resized (HF's order)."""
        c = self.config
        if c.draw_on_frames:
            frame = self._draw(frame, _timestamp(index / fps))
        try:
            height, width = smart_resize(frame.shape[0], frame.shape[1], c.patch_size * c.merge_size,
                                         c.min_pixels, c.max_pixels)
        except ImageError as exc:
            raise VideoError(f"video frames: {exc}") from None
        return resize_bicubic_aa(frame, height, width)

    def __call__(self, video: Any, fps: float | None = None) -> ProcessedVideo:
        c = self.config
        decoded = self.decode(video, fps)
        resized = decoded.frames  # [T, H, W, 3] uint8, stamped and resized
        stamps = [i / decoded.fps for i in decoded.indices[: len(resized)]]
        if len(resized) % c.temporal_patch_size:  # HF repeats the last (stamped) frame before resizing
            resized = np.concatenate([resized, resized[-1:]], axis=0)
        scale = np.float32(1.0 / c.rescale_factor)
        mean = np.asarray(c.image_mean, np.float32) * scale
        std = np.asarray(c.image_std, np.float32) * scale
        normed = ((resized.astype(np.float32) - mean) / std).transpose(0, 3, 1, 2)  # [T, 3, H, W]
        p, m, t = c.patch_size, c.merge_size, len(resized)
        gh, gw = resized.shape[1] // p, resized.shape[2] // p
        patches = normed.reshape(t, 3, gh // m, m, p, gw // m, m, p).transpose(0, 2, 5, 3, 6, 1, 4, 7)
        pixel_values = np.ascontiguousarray(patches.reshape(t * gh * gw, 3 * p * p), dtype=np.float32)
        digest = hashlib.sha256(pixel_values.tobytes())
        digest.update(f"video:{t}x{gh}x{gw}".encode())
        tokens = t * gh * gw // (m * m * c.temporal_patch_size)
        return ProcessedVideo(pixel_values, (t, gh, gw), tokens, digest.hexdigest()[:32], stamps)

    def _draw(self, frame: np.ndarray, text: str) -> np.ndarray:
        """HF's ``_render_image_with_timestamp`` on one ``[H, W, 3]`` frame."""
        from PIL import Image, ImageDraw, ImageFont

        image = Image.fromarray(frame)
        font_size = int(min(*image.size) * 0.1)
        if font_size < 1:
            raise VideoError(f"video frames of {image.size[0]}x{image.size[1]} pixels are too small to stamp "
                             "their time on (at least 10 pixels a side)")
        if self.config.font is not None:
            font: Any = ImageFont.truetype(self.config.font, font_size)
        else:
            if not VideoProcessor._warned_font:
                VideoProcessor._warned_font = True
                logger.warning("the model ships no timestamp font (video_preprocessor_config.json 'font'); "
                               "video frames are stamped with PIL's built-in font, unlike HF's processor")
            font = ImageFont.load_default(font_size)
        draw = ImageDraw.Draw(image)
        draw.text((0, 0), text, font=font, fill=(0, 0, 0), stroke_width=int(font_size * 0.1),
                  stroke_fill=(255, 255, 255))
        return np.asarray(image)


def _as_frames(video: Any) -> np.ndarray:
    """``[T, H, W, 3]`` uint8 from an array or a list of PIL images / arrays."""
    if isinstance(video, np.ndarray):
        frames = video
    elif isinstance(video, (list, tuple)) and video:
        from PIL import Image

        frames = np.stack([np.asarray(f.convert("RGB")) if isinstance(f, Image.Image) else np.asarray(f)
                           for f in video])
    else:
        raise VideoError(f"a video must be bytes, a path, a [T, H, W, 3] uint8 array or a list of frames, "
                         f"got {type(video).__name__}")
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise VideoError(f"video frames must be [T, H, W, 3] uint8 with T >= 1, got {list(frames.shape)} {frames.dtype}")
    return frames
