"""Prompts with images, as the offline ``LLM`` takes them (vLLM's and FastDeploy's forms).

- ``{"prompt": text, "multi_modal_data": {"image": img | [img, ...], "video": vid | [vid, ...]}}``
  (also ``multimodal_data``; ``prompt_token_ids`` instead of ``prompt``): one
  ``<|IMAGE_PLACEHOLDER|>`` in the prompt per image, one ``<|VIDEO_START|><|VIDEO_END|>`` per
  video; an image is a PIL image, a file path, encoded bytes or an ``[H, W, 3]`` uint8 array; a
  video is a file path, encoded bytes (mp4, webm, ...: decoded with PyAV), ``[T, H, W, 3]`` uint8
  frames or a list of frames, or ``{"frames": ..., "fps": 2.0}`` (frames at 24 fps otherwise).
- chat messages whose content is a list of parts ``{"type": "text", "text": ...}``
  and ``{"type": "image_url", "image_url": {"url": path | file:// | data:...;base64,...}}``
  (or ``{"type": "image", "image": img}``), and ``{"type": "video_url", "video_url": {"url": ...}}``
  (or ``{"type": "video", "video": vid}``): ``flatten_chat_images`` turns each image part into
  ERNIE-VL's ``Picture N:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>`` and each video part into
  ``Video N:<|VIDEO_START|><|VIDEO_END|>`` text and collects the media in order.

``MultiModalPrompts`` is built by ``LLM`` for a multimodal model (lazily, from the
model directory) and returns the dict the engine frontend takes
(``prompt_token_ids`` expanded, ``mm_inputs``).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from fd_core.multimodal.image_processor import ImageError, ImageProcessor
from fd_core.multimodal.inputs import build_inputs

__all__ = ["IMAGE_PROMPT", "VIDEO_PROMPT", "MultiModalPrompts", "flatten_chat_images", "split_chat_images"]

IMAGE_PROMPT = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
VIDEO_PROMPT = "<|VIDEO_START|><|VIDEO_END|>"  # the video's tokens go between (build_inputs)
_DATA_KEYS = ("multi_modal_data", "multimodal_data")


def _image_of_url(url: str) -> Any:
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise ImageError(f"a data: URL image must be base64 encoded, got {header!r}")
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError as exc:
            raise ImageError(f"the data: URL's base64 payload cannot be decoded: {exc}") from None
    if url.startswith(("http://", "https://")):
        raise ImageError(f"image URL {url[:80]!r}: fetching http(s) images is not supported offline; "
                         "pass a local path, a PIL image or a data: URL")
    return Path(url[len("file://"):] if url.startswith("file://") else url)


def _url_of(part: dict[str, Any], kind: str) -> Any:
    ref = part.get(kind)
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str):
        raise ImageError(f"an {kind} part needs {{'url': ...}}, got {ref!r}")
    return _image_of_url(url)


def flatten_chat_images(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """Messages with image/video parts -> (messages with string content, {"image": [...], "video": [...]}
    in order, only the kinds present)."""
    media: dict[str, list[Any]] = {}
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind in ("image_url", "image"):
                images = media.setdefault("image", [])
                images.append(part.get("image") if kind == "image" else _url_of(part, kind))
                texts.append(f"Picture {len(images)}:{IMAGE_PROMPT}")
            elif kind in ("video_url", "video"):
                videos = media.setdefault("video", [])
                videos.append(part.get("video") if kind == "video" else _url_of(part, kind))
                texts.append(f"Video {len(videos)}:{VIDEO_PROMPT}")
            else:
                raise ValueError(f"unsupported content part type {kind!r}; expected 'text', 'image_url', 'image', "
                                 "'video_url' or 'video'")
        out.append({**message, "content": "".join(texts)})
    return out, media


def split_chat_images(messages: Any) -> tuple[Any, list[dict[str, list[Any]]]]:
    """``LLM.chat``'s ``messages`` (one conversation or a list of them) -> the same shape with
    media parts flattened into text, and each conversation's media (``multi_modal_data``: one dict
    per conversation, empty without media)."""
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, (list, tuple)) for m in messages):
        pairs = [flatten_chat_images(list(c)) for c in messages]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(messages, (list, tuple)) and all(isinstance(m, dict) for m in messages):
        flat, media = flatten_chat_images(list(messages))
        return flat, [media]
    return messages, []


class MultiModalPrompts:
    """Turns prompts with images and videos into the engine's dicts (expanded ids + ``mm_inputs``)."""

    def __init__(self, model_dir: str | Path, config: Any, max_images: int | None = None,
                 processor_overrides: dict[str, Any] | None = None, max_videos: int | None = None,
                 video_overrides: dict[str, Any] | None = None) -> None:
        self.processor = ImageProcessor.from_dir(model_dir, **(processor_overrides or {}))
        self.model_dir = model_dir
        self.video_overrides = dict(video_overrides or {})
        self._video: Any = None  # VideoProcessor, built on the first video
        self.config = config
        self.limits = {"image": max_images, "video": max_videos}

    @property
    def video_processor(self) -> Any:
        if self._video is None:
            from fd_core.multimodal.video_processor import VideoProcessor

            self._video = VideoProcessor.from_dir(self.model_dir, **self.video_overrides)
        return self._video

    @staticmethod
    def has_images(prompt: Any) -> bool:
        return isinstance(prompt, dict) and any(k in prompt for k in _DATA_KEYS)

    def _process_video(self, video: Any) -> Any:
        if isinstance(video, dict):
            return self.video_processor(video.get("frames"), video.get("fps"))
        return self.video_processor(video)

    def prepare(self, prompt: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
        key = next(k for k in _DATA_KEYS if k in prompt)
        data = prompt[key]
        if not isinstance(data, dict) or set(data) - {"image", "video"}:
            raise ValueError(f"{key} must be {{'image': image or [images], 'video': video or [videos]}}, "
                             f"got keys {sorted(data) if isinstance(data, dict) else type(data).__name__}")
        media: dict[str, list[Any]] = {}
        for kind in ("image", "video"):
            items = data.get(kind)
            if kind == "video" and _frame_list(items):  # one video given as its frames
                items = [items]
            items = [] if items is None else list(items) if isinstance(items, (list, tuple)) else [items]
            limit = self.limits[kind]
            if limit is not None and len(items) > limit:
                raise ValueError(f"{len(items)} {kind}s in one prompt; at most {limit} are allowed "
                                 "(limit_mm_per_prompt)")
            media[kind] = items
        extra = set(prompt) - {key, "prompt", "prompt_token_ids"}
        if extra:
            raise ValueError(f"unknown prompt key(s) {sorted(extra)} beside {key!r}")
        if "prompt_token_ids" in prompt:
            token_ids = list(prompt["prompt_token_ids"])
        elif isinstance(prompt.get("prompt"), str):
            token_ids = tokenizer.encode(prompt["prompt"])
        else:
            raise ValueError(f"a prompt with {key} needs 'prompt' (text) or 'prompt_token_ids'")
        images = [self.processor(image) for image in media["image"]]
        videos = [self._process_video(video) for video in media["video"]]
        ids, mm = build_inputs(token_ids, images, self.config, videos)
        return {"prompt": prompt.get("prompt"), "prompt_token_ids": ids, "mm_inputs": mm}


def _frame_list(value: Any) -> bool:
    """A non-empty list of frames (PIL images or ``[H, W, C]`` arrays): one video, not a list of videos."""
    if not isinstance(value, (list, tuple)) or not value:
        return False
    return all(getattr(v, "ndim", None) == 3 or (hasattr(v, "mode") and hasattr(v, "size")) for v in value)
