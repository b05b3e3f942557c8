"""Checkpoint generators by shape name: fd-core's families and plugins'.

``generate_checkpoint(path, shape, ...)`` (``fd_core.testing.checkpoints``)
and ``python -m fd_core.testing.checkpoints --shape NAME`` look the shape up
here. fd-core's own shapes (ERNIE 4.5's ``tiny-dense`` ... and Qwen3's
``tiny-qwen3`` ...) are built in; a model plugin adds its family's shapes
from its general-plugin module (entry-point group ``fd_core.plugins``)::

    @hookimpl
    def fd_register_checkpoint_generators(registry):
        registry.register("tiny-mymodel", "my_plugin.checkpoint:generate")

A generator is called as ``generate(path, shape, naming=..., seed=...,
dtype=..., shards=..., **overrides)`` and returns the directory it wrote:
config.json naming the plugin's architecture, its tokenizer files and
safetensors weights, so the checkpoint opens with ``fd-serve --model DIR``
like a downloaded one. It raises ValueError for a naming, dtype or shard
count it does not write.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["GeneratorRegistry", "generators"]

Generator = Callable[..., Path]


class GeneratorRegistry:
    """Shape name -> generator (a callable or ``"module:attr"``, imported when used)."""

    def __init__(self) -> None:
        self._entries: dict[str, Generator | str] = {}
        self._plugins_loaded = False

    def register(self, shape: str, generate: Generator | str) -> None:
        """Add or replace the generator of ``shape``."""
        if not isinstance(shape, str) or not shape:
            raise ValueError(f"a checkpoint shape is a non-empty name, got {shape!r}")
        self._entries[shape] = generate

    def _load(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from fd_core.testing.checkpoints import SHAPES
        from fd_core.testing.qwen3_checkpoint import QWEN3_SHAPES

        for shape in SHAPES:
            self._entries.setdefault(shape, "fd_core.testing.checkpoints:generate_ernie_checkpoint")
        for shape in QWEN3_SHAPES:
            self._entries.setdefault(shape, "fd_core.testing.qwen3_checkpoint:generate_qwen3_checkpoint")
        from fd_core.testing.vl_checkpoint import VL_SHAPES

        for shape in VL_SHAPES:
            self._entries.setdefault(shape, "fd_core.testing.vl_checkpoint:generate_vl_checkpoint")
        from fd_core.plugins import manager

        modules = manager.load_general_plugins()
        if modules:
            manager.make_plugin_manager(*modules).hook.fd_register_checkpoint_generators(registry=self)

    def shapes(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def resolve(self, shape: str) -> Generator:
        self._load()
        entry = self._entries.get(shape)
        if entry is None:
            raise ValueError(f"unknown checkpoint shape {shape!r}; expected one of {self.shapes()}")
        if isinstance(entry, str):
            try:
                module, attr = entry.split(":")
                entry = getattr(importlib.import_module(module), attr)
            except (ValueError, ImportError, AttributeError) as exc:
                raise ValueError(f"checkpoint shape {shape!r}: its generator {entry!r} cannot be loaded "
                                 f"(expected 'module:function'): {exc}") from exc
            self._entries[shape] = entry
        return entry

    def generate(self, path: str | Path, shape: str, **kwargs: Any) -> Path:
        return Path(self.resolve(shape)(path, shape, **kwargs))


generators = GeneratorRegistry()
