"""Multimodal inputs: images in, model-ready features out.

Owns the image processor (``image_processor``: decode, resize to the pixel
budget, normalize and patch, exactly as HF's ERNIE-4.5-VL processor does, with
PIL and numpy only), the video processor (``video_processor``: PyAV decoding in
``video_decode``, HF's frame sampling and timestamps, torchvision's antialiased
bicubic in ``video_resize``; no torch), the prompt side (``inputs``: placeholder expansion, 3D
rotary positions, the tokens routed to vision experts, per-image hashes for the
prefix cache), the encoder cache keyed by image hash (``encoder_cache``) and the
model runner's per-step view (``step``: which rows take which image features).

The API process and the offline ``LLM`` use ``image_processor``, ``video_processor`` and
``inputs`` (numpy, PIL, PyAV; no paddle, no torch); the engine's model runner uses ``step`` and
``encoder_cache``; the API server's ``options`` (the multimodal flags) is pure Python.
May import: fd_core.models (configs), fd_core._paddle (``step`` only).
"""

from typing import Any

__all__ = ["ImageError", "ImageProcessor", "MultiModalInputs", "ProcessedImage", "ProcessedVideo", "VideoError",
           "VideoProcessor", "build_inputs"]

_LAZY = {"ImageError": "image_processor", "ImageProcessor": "image_processor", "ProcessedImage": "image_processor",
         "MultiModalInputs": "inputs", "build_inputs": "inputs", "ProcessedVideo": "video_processor",
         "VideoError": "video_processor", "VideoProcessor": "video_processor"}


def __getattr__(name: str) -> Any:
    """The names above, imported on first use: the API server imports ``options`` without numpy."""
    if name not in _LAZY:
        raise AttributeError(f"module 'fd_core.multimodal' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"fd_core.multimodal.{_LAZY[name]}"), name)
