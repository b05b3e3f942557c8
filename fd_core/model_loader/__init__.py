"""Checkpoint discovery and weight loading.

Owns finding a model directory (local path or hub cache), reading
safetensors (memory-mapped, tensor by tensor) and mapping checkpoint names
onto model parameters. May import: fd_core.models, fd_core.layers,
fd_core.ops, fd_core.quantization, fd_core.errors, fd_core.envs. Importing this package imports no paddle
(the API process resolves model paths with ``discovery``); ``load_model``
and ``CheckpointError`` load ``loader`` on first access.
"""

from __future__ import annotations

from typing import Any

from fd_core.model_loader.discovery import resolve_model_path

__all__ = ["CheckpointError", "load_model", "resolve_model_path"]


def __getattr__(name: str) -> Any:
    if name in ("CheckpointError", "load_model"):
        from fd_core.model_loader import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
