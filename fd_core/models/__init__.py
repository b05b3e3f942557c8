"""Model families and the registry keyed by config.json ``architectures``.

Owns model definitions (one file per family) and their configs. Models call
kernels only through a backend's ``ops``. General plugins add models through
the ``fd_register_models`` hook. May import: fd_core.layers, fd_core.ops,
fd_core.quantization (its load-time transform), fd_core.plugins,
fd_core._paddle, fd_core.backends (types).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ModelRegistry", "UnknownArchitectureError", "registry"]


class UnknownArchitectureError(ValueError):
    """config.json names an architecture no installed model implements."""


class ModelRegistry:
    """Architecture name -> model class (imported lazily)."""

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {
            "Ernie4_5ForCausalLM": "fd_core.models.ernie4_5:Ernie4_5ForCausalLM",
            "Ernie4_5_ForCausalLM": "fd_core.models.ernie4_5:Ernie4_5ForCausalLM",
            "Ernie4_5_MoeForCausalLM": "fd_core.models.ernie4_5:Ernie4_5ForCausalLM",
            "Qwen3ForCausalLM": "fd_core.models.qwen3:Qwen3ForCausalLM",
            "Ernie4_5_VLMoeForConditionalGeneration":
                "fd_core.models.ernie4_5_vl:Ernie4_5_VLForConditionalGeneration",
        }
        self._plugins_loaded = False

    def register(self, architecture: str, model_cls: Any) -> None:
        """Add or replace a model class (a class or ``"module:attr"``)."""
        self._entries[architecture] = model_cls

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from fd_core.plugins import manager

        modules = manager.load_general_plugins()
        if modules:
            manager.make_plugin_manager(*modules).hook.fd_register_models(registry=self)

    def supported(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def resolve(self, architecture: str) -> Any:
        self._load_plugins()
        entry = self._entries.get(architecture)
        if entry is None:
            raise UnknownArchitectureError(
                f"unknown architecture {architecture!r} in config.json; supported: "
                f"{', '.join(self.supported())}"
            )
        if isinstance(entry, str):
            module, attr = entry.split(":")
            entry = getattr(importlib.import_module(module), attr)
            self._entries[architecture] = entry
        return entry


registry = ModelRegistry()
