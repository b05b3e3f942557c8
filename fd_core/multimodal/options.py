"""The server's multimodal settings: ``--limit-mm-per-prompt``, ``--mm-processor-kwargs`` and where
media may come from (``--allowed-local-media-path``, ``--allowed-media-domains``).

``MultiModalOptions.from_flags`` checks the flag values at start-up (a ValueError naming the
flag and the bad key or value, which fd-serve turns into exit 2); ``processor_overrides`` are
the ``ImageProcessorConfig`` keys the processor kwargs set. Pure data: the API process
imports it (no paddle, no PIL).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_LIMITS", "MODALITIES", "MultiModalOptions"]

MODALITIES = ("image", "video")
DEFAULT_LIMITS = {"image": 100, "video": 100}  # the values of FastDeploy's ERNIE-4.5-VL launch line

# --mm-processor-kwargs key -> the ImageProcessorConfig field it sets (FastDeploy's and HF's names)
_IMAGE_KEYS = {"image_min_pixels": "min_pixels", "image_max_pixels": "max_pixels",
               "min_pixels": "min_pixels", "max_pixels": "max_pixels"}
# video sampling and sizing (FastDeploy's names) -> their type; VideoProcessorConfig.from_dir takes them
_VIDEO_KEYS = {"video_fps": float, "fps": float, "video_min_frames": int, "video_max_frames": int,
               "min_frames": int, "max_frames": int, "video_min_pixels": int, "video_max_pixels": int,
               "video_max_input_frames": int}


def _as_dict(value: Any, flag: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag} must be a JSON object, got {value!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {type(value).__name__} {value!r}")
    return value


def _positive(flag: str, key: str, value: Any, kind: type) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok or (kind is int and int(value) != value):
        raise ValueError(f"{flag}: {key} must be a positive {kind.__name__}, got {value!r}")
    return kind(value)


@dataclass(frozen=True)
class MultiModalOptions:
    """What the API process needs to turn chat content parts into model inputs."""

    limits: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    processor_overrides: dict[str, int] = field(default_factory=dict)  # ImageProcessorConfig fields
    video: dict[str, float] = field(default_factory=dict)  # video sampling keys as given (VideoProcessor's)
    allowed_local_media_path: str | None = None  # file:// URLs and paths under it are read
    allowed_media_domains: tuple[str, ...] = ()  # http(s) URLs of these hosts are fetched; none: refused

    @classmethod
    def from_flags(cls, limit_mm_per_prompt: Any = None, mm_processor_kwargs: Any = None,
                   allowed_local_media_path: str | None = None,
                   allowed_media_domains: Any = None) -> MultiModalOptions:
        limits = dict(DEFAULT_LIMITS)
        for key, value in _as_dict(limit_mm_per_prompt, "--limit-mm-per-prompt").items():
            if key not in MODALITIES:
                raise ValueError(f"--limit-mm-per-prompt: unknown modality {key!r}; expected some of "
                                 f"{list(MODALITIES)}")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"--limit-mm-per-prompt: {key} must be an integer >= 0, got {value!r}")
            limits[key] = value
        overrides: dict[str, int] = {}
        video: dict[str, float] = {}
        for key, value in _as_dict(mm_processor_kwargs, "--mm-processor-kwargs").items():
            if key in _IMAGE_KEYS:
                overrides[_IMAGE_KEYS[key]] = _positive("--mm-processor-kwargs", key, value, int)
            elif key in _VIDEO_KEYS:
                video[key] = _positive("--mm-processor-kwargs", key, value, _VIDEO_KEYS[key])
            else:
                raise ValueError(f"--mm-processor-kwargs: unknown key {key!r}; expected some of "
                                 f"{sorted({*_IMAGE_KEYS, *_VIDEO_KEYS})}")
        if overrides.get("min_pixels", 0) > overrides.get("max_pixels", 1 << 62):
            raise ValueError(f"--mm-processor-kwargs: min pixels {overrides['min_pixels']} exceed max pixels "
                             f"{overrides['max_pixels']}")
        for lo, hi in (("video_min_frames", "video_max_frames"), ("min_frames", "max_frames"),
                       ("video_min_pixels", "video_max_pixels")):
            if video.get(lo, 0) > video.get(hi, 1 << 62):
                raise ValueError(f"--mm-processor-kwargs: {lo} {video[lo]} exceeds {hi} {video[hi]}")
        local = None
        if allowed_local_media_path:
            local = os.path.realpath(allowed_local_media_path)
            if not os.path.isdir(local):
                raise ValueError(f"--allowed-local-media-path {allowed_local_media_path!r} is not a directory")
        domains: tuple[str, ...] = ()
        if allowed_media_domains:
            items = allowed_media_domains.split(",") if isinstance(allowed_media_domains, str) \
                else list(allowed_media_domains)
            domains = tuple(d.strip().lower() for item in items for d in str(item).split(",") if d.strip())
        return cls(limits, overrides, video, local, domains)
