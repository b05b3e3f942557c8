"""Checkpoint discovery and weight loading.

Owns finding a model directory (local path or hub cache), reading
safetensors (memory-mapped, tensor by tensor, bf16/fp16 upcast to fp32) and
mapping checkpoint names onto model parameters. May import: fd_core.models,
fd_core.layers, numpy, paddle (through the layers).
"""

from fd_core.model_loader.discovery import resolve_model_path
from fd_core.model_loader.loader import CheckpointError, load_model

__all__ = ["CheckpointError", "load_model", "resolve_model_path"]
