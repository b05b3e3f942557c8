"""Multimodal inputs: images in, model-ready features out.

Owns the image processor (``image_processor``: decode, resize to the pixel
budget, normalize and patch, exactly as HF's ERNIE-4.5-VL processor does, with
PIL and numpy only), the prompt side (``inputs``: placeholder expansion, 3D
rotary positions, the tokens routed to vision experts, per-image hashes for the
prefix cache), the encoder cache keyed by image hash (``encoder_cache``) and the
model runner's per-step view (``step``: which rows take which image features).

The API process and the offline ``LLM`` use ``image_processor`` and ``inputs``
(numpy, PIL; no paddle); the engine's model runner uses ``step`` and
``encoder_cache``. May import: fd_core.models (configs), fd_core._paddle (``step`` only).
"""

from fd_core.multimodal.image_processor import ImageError, ImageProcessor, ProcessedImage
from fd_core.multimodal.inputs import MultiModalInputs, build_inputs

__all__ = ["ImageError", "ImageProcessor", "MultiModalInputs", "ProcessedImage", "build_inputs"]
