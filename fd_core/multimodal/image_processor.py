"""ERNIE-4.5-VL's image processor, numerically HF's (``Ernie4_5_VLMoeImageProcessorPil``).

An image (a PIL image, a path, encoded bytes or an ``[H, W, 3]`` uint8 array) is
decoded to RGB (transparency composited onto white), resized with PIL's bicubic
filter to the nearest multiple of ``patch_size * merge_size`` within the pixel
budget (``smart_resize``), scaled by 1/255, normalized by CLIP's mean and std, and
cut into ``patch_size`` patches laid out so every ``merge x merge`` block is
contiguous: ``pixel_values [h*w, 3*P*P]`` fp32 with ``grid_thw = (1, h, w)`` and
``h*w / merge^2`` language-model tokens. Called by the offline ``LLM`` (and the
server) before a request reaches the engine. Bad images raise ``ImageError``
(a ValueError) naming the problem.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

__all__ = ["ImageError", "ImageProcessor", "ImageProcessorConfig", "ProcessedImage", "load_image", "smart_resize"]

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ImageError(ValueError):
    """An image that cannot be used: undecodable, too large, wrong shape or type."""


@dataclass(frozen=True)
class ImageProcessorConfig:
    """preprocessor_config.json's keys (HF's defaults where absent)."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 6177
    image_mean: tuple[float, ...] = _CLIP_MEAN
    image_std: tuple[float, ...] = _CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic
    max_input_pixels: int = 8192 * 8192  # a decoded image larger than this is refused

    @classmethod
    def from_dir(cls, model_dir: str | Path, **overrides: Any) -> ImageProcessorConfig:
        """Read ``model_dir/preprocessor_config.json`` (defaults when absent); ``overrides``
        (``--mm-processor-kwargs``: min_pixels, max_pixels, ...) win."""
        path = Path(model_dir) / "preprocessor_config.json"
        raw = json.loads(path.read_text()) if path.exists() else {}
        size = raw.get("size") or {}
        values: dict[str, Any] = {
            "patch_size": raw.get("patch_size", 14), "merge_size": raw.get("merge_size", 2),
            "min_pixels": raw.get("min_pixels", size.get("shortest_edge", 56 * 56)),
            "max_pixels": raw.get("max_pixels", size.get("longest_edge", 28 * 28 * 6177)),
            "image_mean": tuple(raw.get("image_mean", _CLIP_MEAN)), "image_std": tuple(raw.get("image_std", _CLIP_STD)),
            "rescale_factor": raw.get("rescale_factor", 1 / 255), "resample": raw.get("resample", 3),
        }
        unknown = sorted(set(overrides) - set(values) - {"max_input_pixels"})
        if unknown:
            raise ValueError(f"unknown image processor option(s) {unknown}; expected some of "
                             f"{sorted(set(values) | {'max_input_pixels'})}")
        values.update(overrides)
        return cls(**values)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """HF's rule: both sides multiples of ``factor``, the area within
    ``[min_pixels, max_pixels]``, the aspect ratio kept as closely as possible."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"image of {width}x{height} pixels: its aspect ratio "
                         f"{max(height, width) / min(height, width):.1f} is more than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def load_image(image: Any, max_input_pixels: int = 8192 * 8192) -> Any:
    """A PIL RGB image from a PIL image, a path, encoded bytes or an ``[H, W, 3]`` uint8 array."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # our own limit below names the size
    if isinstance(image, (str, Path)):
        try:
            image = Image.open(Path(image))
        except FileNotFoundError:
            raise ImageError(f"image file {str(image)!r} does not exist") from None
        except Exception as exc:
            raise ImageError(f"image file {str(image)!r} cannot be decoded: {exc}") from None
    elif isinstance(image, (bytes, bytearray)):
        try:
            image = Image.open(io.BytesIO(image))
        except Exception as exc:
            raise ImageError(f"image bytes ({len(image)} bytes) cannot be decoded: {exc}") from None
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ImageError(f"an image array must be [H, W, 3] uint8, got {list(image.shape)} {image.dtype}")
        image = Image.fromarray(image)
    elif not isinstance(image, Image.Image):
        raise ImageError(f"an image must be a PIL image, a path, bytes or an array, got {type(image).__name__}")
    width, height = image.size
    if width * height > max_input_pixels:
        raise ImageError(f"image of {width}x{height} pixels is too large: at most {max_input_pixels} pixels")
    if width < 1 or height < 1:
        raise ImageError(f"image of {width}x{height} pixels is empty")
    try:
        has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
        if has_alpha:  # HF's convert_to_rgb: transparency over white
            rgba = image.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
        return image.convert("RGB")
    except Exception as exc:  # truncated data fails here, when PIL first decodes the pixels
        raise ImageError(f"image of {width}x{height} pixels cannot be decoded: {exc}") from None


@dataclass
class ProcessedImage:
    """One image, ready for the vision tower."""

    modality: ClassVar[str] = "image"
    pixel_values: np.ndarray  # [h*w, 3*P*P] fp32, merge blocks contiguous
    grid_thw: tuple[int, int, int]  # (1, h, w) in patches
    num_tokens: int  # language-model tokens: h*w / merge^2
    hash: str  # content hash of the processed pixels: the encoder cache and prefix cache key


class ImageProcessor:
    """Images -> ``ProcessedImage`` (HF's PIL processor, numerically)."""

    def __init__(self, config: ImageProcessorConfig | None = None) -> None:
        self.config = config or ImageProcessorConfig()

    @classmethod
    def from_dir(cls, model_dir: str | Path, **overrides: Any) -> ImageProcessor:
        return cls(ImageProcessorConfig.from_dir(model_dir, **overrides))

    def __call__(self, image: Any) -> ProcessedImage:
        c = self.config
        rgb = load_image(image, c.max_input_pixels)
        factor = c.patch_size * c.merge_size
        height, width = smart_resize(rgb.size[1], rgb.size[0], factor, c.min_pixels, c.max_pixels)
        resized = np.asarray(rgb.resize((width, height), resample=c.resample))  # [H, W, 3] uint8
        scaled = (resized.astype(np.float64) * c.rescale_factor).astype(np.float32)
        mean, std = np.asarray(c.image_mean, np.float32), np.asarray(c.image_std, np.float32)
        normed = ((scaled - mean) / std).transpose(2, 0, 1)  # [3, H, W]
        p, m = c.patch_size, c.merge_size
        gh, gw = height // p, width // p
        patches = normed.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        pixel_values = np.ascontiguousarray(patches.reshape(gh * gw, 3 * p * p), dtype=np.float32)
        digest = hashlib.sha256(pixel_values.tobytes())
        digest.update(f"{gh}x{gw}".encode())
        return ProcessedImage(pixel_values, (1, gh, gw), gh * gw // (m * m), digest.hexdigest()[:32])
