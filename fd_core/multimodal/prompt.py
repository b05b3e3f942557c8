"""Prompts with images, as the offline ``LLM`` takes them (vLLM's and FastDeploy's forms).

- ``{"prompt": text, "multi_modal_data": {"image": img | [img, ...]}}`` (also
  ``multimodal_data``; ``prompt_token_ids`` instead of ``prompt``): one
  ``<|IMAGE_PLACEHOLDER|>`` in the prompt per image; an image is a PIL image, a
  file path, encoded bytes or an ``[H, W, 3]`` uint8 array.
- chat messages whose content is a list of parts ``{"type": "text", "text": ...}``
  and ``{"type": "image_url", "image_url": {"url": path | file:// | data:...;base64,...}}``
  (or ``{"type": "image", "image": img}``): ``flatten_chat_images`` turns each image
  part into ERNIE-VL's ``Picture N:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>``
  text and collects the images in order.

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

__all__ = ["IMAGE_PROMPT", "MultiModalPrompts", "flatten_chat_images", "split_chat_images"]

IMAGE_PROMPT = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
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


def flatten_chat_images(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages with image parts -> (messages with string content, images in order)."""
    images: list[Any] = []
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
                if kind == "image":
                    image = part.get("image")
                else:
                    ref = part.get("image_url")
                    url = ref.get("url") if isinstance(ref, dict) else ref
                    if not isinstance(url, str):
                        raise ImageError(f"an image_url part needs {{'url': ...}}, got {ref!r}")
                    image = _image_of_url(url)
                images.append(image)
                texts.append(f"Picture {len(images)}:{IMAGE_PROMPT}")
            else:
                raise ValueError(f"unsupported content part type {kind!r}; expected 'text', 'image_url' or 'image'")
        out.append({**message, "content": "".join(texts)})
    return out, images


def split_chat_images(messages: Any) -> tuple[Any, list[list[Any]]]:
    """``LLM.chat``'s ``messages`` (one conversation or a list of them) -> the same shape with
    image parts flattened into text, and each conversation's images (one list per conversation)."""
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, (list, tuple)) for m in messages):
        pairs = [flatten_chat_images(list(c)) for c in messages]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if isinstance(messages, (list, tuple)) and all(isinstance(m, dict) for m in messages):
        flat, images = flatten_chat_images(list(messages))
        return flat, [images]
    return messages, []


class MultiModalPrompts:
    """Turns prompts with images into the engine's dicts (expanded ids + ``mm_inputs``)."""

    def __init__(self, model_dir: str | Path, config: Any, max_images: int | None = None,
                 processor_overrides: dict[str, Any] | None = None) -> None:
        self.processor = ImageProcessor.from_dir(model_dir, **(processor_overrides or {}))
        self.config = config
        self.max_images = max_images

    @staticmethod
    def has_images(prompt: Any) -> bool:
        return isinstance(prompt, dict) and any(k in prompt for k in _DATA_KEYS)

    def prepare(self, prompt: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
        key = next(k for k in _DATA_KEYS if k in prompt)
        data = prompt[key]
        if not isinstance(data, dict) or set(data) - {"image"}:
            raise ValueError(f"{key} must be {{'image': image or [images]}} (video is not supported yet), "
                             f"got keys {sorted(data) if isinstance(data, dict) else type(data).__name__}")
        images = data.get("image")
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        if self.max_images is not None and len(images) > self.max_images:
            raise ValueError(f"{len(images)} images in one prompt; at most {self.max_images} are allowed "
                             "(limit_mm_per_prompt)")
        extra = set(prompt) - {key, "prompt", "prompt_token_ids"}
        if extra:
            raise ValueError(f"unknown prompt key(s) {sorted(extra)} beside {key!r}")
        if "prompt_token_ids" in prompt:
            token_ids = list(prompt["prompt_token_ids"])
        elif isinstance(prompt.get("prompt"), str):
            token_ids = tokenizer.encode(prompt["prompt"])
        else:
            raise ValueError(f"a prompt with {key} needs 'prompt' (text) or 'prompt_token_ids'")
        processed = [self.processor(image) for image in images]
        ids, mm = build_inputs(token_ids, processed, self.config)
        return {"prompt": prompt.get("prompt"), "prompt_token_ids": ids, "mm_inputs": mm}
