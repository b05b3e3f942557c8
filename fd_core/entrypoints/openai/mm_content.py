"""Chat content parts with images and videos, for a multimodal model (ERNIE-4.5-VL) behind the server.

``OpenAIServingChat.create`` calls, for a model with a vision tower:

1. ``split(request)``: every message's content parts -> text, with each image part
   (``{"type": "image_url", "image_url": {"url": ...}}``, the URL also as a plain string;
   ``{"type": "image", "image" | "url": ...}``) written as ERNIE-VL's
   ``Picture N:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>`` and remembered with its
   place (``messages[i].content[j]``); each video part (``{"type": "video_url", "video_url":
   {"url": ...}}``, the URL also as a plain string; ``{"type": "video", "video" | "url": ...}``) as
   ``Video N:<|VIDEO_START|><|VIDEO_END|>``. More images or videos than ``--limit-mm-per-prompt``
   allows or an unknown part is a 400 naming the part.
2. the usual template rendering and tokenization of the flattened messages;
3. ``prompt(ids, media)``: in a worker thread, each image or video is read from its URL --
   ``data:`` (base64) always; ``file://`` URLs and paths only under ``--allowed-local-media-path``;
   ``http(s)://`` only for hosts in ``--allowed-media-domains`` (no redirects) -- decoded and
   processed as HF's processors do (``--mm-processor-kwargs``: min/max pixels, video frame
   sampling; videos decoded with PyAV), then the placeholders are expanded
   (``fd_core.multimodal.build_inputs``). Any bad image or video (undecodable, no video stream,
   too many frames) is a 400 naming the part and the problem; nothing reaches the engine then.

The result is the engine prompt dict ``{"prompt_token_ids", "mm_inputs"}``; ``mm_inputs``
(numpy arrays, fp32 pixels) is pickled to the engine process with the request.
``image_url.detail`` and FastDeploy's ``uuid`` are accepted and have no effect here (the
encoder and prefix caches are keyed by the processed image's content hash).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from fd_core.entrypoints.openai.errors import OpenAIError
from fd_core.multimodal.options import MultiModalOptions

__all__ = ["MediaPart", "MultiModalChat"]

MAX_FETCH_BYTES = 64 << 20  # an http(s) image or video larger than this is refused
FETCH_TIMEOUT_SECONDS = 10.0
IMAGE_PROMPT = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"  # as fd_core.multimodal.prompt writes it
VIDEO_PROMPT = "<|VIDEO_START|><|VIDEO_END|>"  # the video's tokens go between (fd_core.multimodal.build_inputs)
_IMAGE_PARTS = ("image_url", "image", "input_image")
_VIDEO_PARTS = ("video_url", "video")
_OTHER_MEDIA = ("input_audio", "audio_url", "audio", "file", "input_file")


@dataclass(frozen=True)
class MediaPart:
    where: str  # "messages[i].content[j]"
    kind: str  # "image" or "video"
    url: str


def _bad(where: str, message: str) -> OpenAIError:
    return OpenAIError(f"{where}: {message}", 400, where)


def _part_url(part: dict[str, Any], kind: str, where: str) -> str:
    """The URL of a media part: image_url / video_url {"url": ...} / "...", or image / video
    {"image"|"video"|"url": ...}."""
    if kind in ("image_url", "video_url"):
        ref = part.get(kind)
        url = ref.get("url") if isinstance(ref, dict) else ref
    elif kind == "input_image":
        url = part.get("image_url")
    else:
        url = part.get(kind, part.get("url"))
    if not isinstance(url, str) or not url:
        media = "video" if kind in _VIDEO_PARTS else "image"
        example = "'data:video/mp4;base64,...'" if media == "video" else "'data:image/png;base64,...'"
        raise _bad(where, f"an {kind} part needs its {media} as a URL string "
                          f"({{'type': '{media}_url', '{media}_url': {{'url': {example}}}}}), got {str(part)[:120]}")
    return url


class MultiModalChat:
    """Image and video content parts -> the engine's prompt dict, for one model."""

    def __init__(self, model_dir: str | Path, config: Any, options: MultiModalOptions) -> None:
        # numpy and PIL are imported only for a multimodal model
        from fd_core.multimodal.image_processor import ImageProcessor
        from fd_core.multimodal.video_processor import VideoProcessor  # PyAV: on the first video

        self.config = config
        self.options = options
        self.processor = ImageProcessor.from_dir(model_dir, **options.processor_overrides)
        self.video_processor = VideoProcessor.from_dir(model_dir, **options.video)

    @classmethod
    def for_model(cls, model_dir: str | Path, options: MultiModalOptions | None,
                  enable_mm: bool = False) -> MultiModalChat | None:
        """The multimodal side of ``model_dir`` (None for a text model); ValueError when
        ``--enable-mm`` asks for it on a text model."""
        from fd_core.models.config import load_config

        try:
            config = load_config(model_dir)
        except Exception:  # noqa: BLE001 - a model without a readable config.json is not ours to judge here
            config = None
        if getattr(config, "vision", None) is None:
            if enable_mm:
                arch = getattr(config, "architecture", "unknown")
                raise ValueError(f"--enable-mm: the model ({arch}) has no vision tower; multimodal input needs "
                                 "a multimodal model such as ERNIE-4.5-VL (Ernie4_5_VLMoeForConditionalGeneration)")
            return None
        return cls(model_dir, config, options or MultiModalOptions())

    # ---- 1. content parts -> text ---------------------------------------------------
    def split(self, request: Any, escaped: bool = False) -> tuple[Any, list[MediaPart]]:
        """``request`` with image parts written as text (the same request when it has none),
        and the images in prompt order. ``escaped`` (``--escape-special-tokens``): image parts
        are refused, since the escaping would turn their markers into plain text."""
        media: list[MediaPart] = []
        messages = []
        changed = False
        for i, message in enumerate(request.messages or []):
            content = message.content
            if not isinstance(content, list):
                messages.append(message)
                continue
            messages.append(message.model_copy(update={"content": self._flatten(content, i, media)}))
            changed = True
        if media and escaped:
            raise _bad(media[0].where, "image parts are not taken by a server started with "
                                       "--escape-special-tokens yet (the escaping would make the image markers text)")
        if not changed:
            return request, media
        return request.model_copy(update={"messages": messages}), media

    def _flatten(self, content: list[Any], index: int, media: list[MediaPart]) -> str:
        texts = []
        for j, part in enumerate(content):
            where = f"messages[{index}].content[{j}]"
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type")
            if kind in ("text", "refusal") and isinstance(part.get(kind), str):
                texts.append(part[kind])
            elif kind in _IMAGE_PARTS or kind in _VIDEO_PARTS:
                url = _part_url(part, kind, where)
                modality = "image" if kind in _IMAGE_PARTS else "video"
                count = sum(1 for m in media if m.kind == modality) + 1
                limit = self.options.limits.get(modality, 0)
                if count > limit:
                    raise _bad(where, f"{modality} {count} of this prompt is over the limit of {limit} {modality}(s) "
                                      f"per prompt (--limit-mm-per-prompt '{{\"{modality}\": {limit}}}')")
                media.append(MediaPart(where, modality, url))
                texts.append(f"Picture {count}:{IMAGE_PROMPT}" if modality == "image" else f"Video {count}:{VIDEO_PROMPT}")
            elif kind in ("text", "refusal"):
                raise _bad(where, f"a '{kind}' part without a string '{kind}'")
            else:
                what = "a media type this model does not take" if kind in _OTHER_MEDIA else "an unknown part type"
                raise _bad(where, f"{kind!r} is {what}; expected 'text', 'image_url' (or 'image'), 'video_url' "
                                  "(or 'video')")
        return "".join(texts)

    # ---- 3. token ids + images -> the engine prompt -----------------------------------
    async def prompt(self, token_ids: list[int], media: list[MediaPart]) -> dict[str, Any]:
        """The engine prompt dict for the rendered ``token_ids`` holding one placeholder per image."""
        from fd_core.multimodal.inputs import build_inputs

        processed = await asyncio.to_thread(lambda: [self._process(part) for part in media])
        images = [p for p, part in zip(processed, media) if part.kind == "image"]
        videos = [p for p, part in zip(processed, media) if part.kind == "video"]
        try:
            ids, mm = build_inputs(token_ids, images, self.config, videos)
        except ValueError as exc:  # e.g. a placeholder token typed into a text part
            raise OpenAIError(str(exc), 400, "messages") from None
        return {"prompt": None, "prompt_token_ids": ids, "mm_inputs": mm}

    def _process(self, part: MediaPart) -> Any:
        from fd_core.multimodal.image_processor import ImageError
        from fd_core.multimodal.video_decode import VideoError

        processor = self.processor if part.kind == "image" else self.video_processor
        try:
            return processor(self._source(part))
        except (ImageError, VideoError) as exc:
            raise _bad(part.where, str(exc)) from None

    def _source(self, part: MediaPart) -> bytes | Path:
        """The encoded image (bytes) or the local file a part's URL names."""
        url = part.url
        scheme = urlsplit(url).scheme.lower() if ":" in url[:12] else ""
        if scheme == "data":
            header, sep, payload = url.partition(",")
            if not sep or ";base64" not in header:
                raise _bad(part.where, f"a data: URL must be base64 encoded (data:image/png;base64,...), "
                                       f"got {header[:60]!r}")
            try:
                return base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise _bad(part.where, f"the data: URL's base64 payload cannot be decoded: {exc}") from None
        if scheme in ("http", "https"):
            return self._fetch(part)
        if scheme in ("", "file"):
            return self._local(part)
        raise _bad(part.where, f"{part.kind} URL scheme {scheme!r} is not supported; send a data: URL (base64), "
                               "an http(s) URL (with --allowed-media-domains) or a file:// URL "
                               "(with --allowed-local-media-path)")

    def _local(self, part: MediaPart) -> Path:
        root = self.options.allowed_local_media_path
        path = unquote(urlsplit(part.url).path) if part.url.startswith("file:") else part.url
        if root is None:
            raise _bad(part.where, f"local {part.kind} files ({part.url[:80]!r}) are not read by this server; send a "
                                   "data: URL, or start the server with --allowed-local-media-path DIR")
        real = os.path.realpath(path)
        if os.path.commonpath([real, root]) != root:
            raise _bad(part.where, f"{part.kind} file {path!r} is outside --allowed-local-media-path {root!r}")
        return Path(real)

    def _fetch(self, part: MediaPart) -> bytes:
        import httpx

        host = (urlsplit(part.url).hostname or "").lower()
        if host not in self.options.allowed_media_domains:
            why = (f"host {host!r} is not in --allowed-media-domains {list(self.options.allowed_media_domains)}"
                   if self.options.allowed_media_domains else
                   "this server fetches no http(s) images; send a data: URL, or start it with "
                   "--allowed-media-domains HOST[,HOST...]")
            raise _bad(part.where, f"{part.kind} URL {part.url[:80]!r}: {why}")
        try:
            with httpx.stream("GET", part.url, timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as r:
                if r.status_code != 200:
                    raise _bad(part.where, f"{part.kind} URL {part.url[:80]!r} answered HTTP {r.status_code}")
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_FETCH_BYTES:
                        raise _bad(part.where, f"{part.kind} URL {part.url[:80]!r} is larger than {MAX_FETCH_BYTES} bytes")
                return bytes(body)
        except httpx.HTTPError as exc:
            raise _bad(part.where, f"{part.kind} URL {part.url[:80]!r} cannot be fetched: {type(exc).__name__}: {exc}") \
                from None
