"""The two parser registries, by the names ``--reasoning-parser`` and
``--tool-call-parser`` take.

Names match with ``-`` and ``_`` treated alike and case ignored, so
``ernie_x1`` and ``ernie-x1`` are the same parser. Built-in parsers are
imported when first asked for. General plugins (entry-point group
``fd_core.plugins``) add their own through the ``fd_register_parsers`` hook,
called once, the first time either registry is used.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ParserRegistry", "ReasoningParserManager", "ToolParserManager"]


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


class ParserRegistry:
    """Parser name -> parser class (or ``"module:attr"``, imported lazily)."""

    def __init__(self, kind: str, builtins: dict[str, str]) -> None:
        self.kind = kind  # "reasoning" or "tool-call", for messages
        self._entries: dict[str, tuple[str, Any]] = {}  # key -> (display name, class or path)
        for name, target in builtins.items():
            self.register(name, target)

    def register(self, name: str, cls: Any) -> None:
        """Add or replace a parser (a class or ``"module:attr"``)."""
        if not isinstance(name, str) or not _key(name):
            raise ValueError(f"a {self.kind} parser needs a non-empty name, got {name!r}")
        self._entries[_key(name)] = (name, cls)

    def register_module(self, name: str) -> Callable[[Any], Any]:
        """Decorator form of ``register`` (FastDeploy's spelling)."""

        def decorate(cls: Any) -> Any:
            self.register(name, cls)
            return cls

        return decorate

    def names(self) -> list[str]:
        """Registered names, sorted, as they were registered."""
        _load_plugins()
        return sorted(display for display, _ in self._entries.values())

    def get(self, name: str) -> Any:
        """The parser class for ``name``; ValueError listing the known names if none."""
        _load_plugins()
        entry = self._entries.get(_key(name)) if isinstance(name, str) else None
        if entry is None:
            raise ValueError(
                f"unknown {self.kind} parser {name!r}; available: {', '.join(self.names())} "
                f"(plugins add more through the fd_register_parsers hook)"
            )
        display, cls = entry
        if isinstance(cls, str):
            module, attr = cls.split(":")
            cls = getattr(importlib.import_module(module), attr)
            self._entries[_key(name)] = (display, cls)
        return cls

    def import_tool_parser(self, path: str) -> None:
        """Run a Python file that registers parsers (``--tool-parser-plugin FILE``,
        FastDeploy's spelling): it uses ``@ToolParserManager.register_module("name")``.
        Raises ValueError naming the file when it is missing or fails to import."""
        import importlib.util
        import sys
        from pathlib import Path

        file = Path(path).expanduser()
        if not file.is_file():
            raise ValueError(f"--tool-parser-plugin {path}: no such file")
        name = f"fd_core_parser_plugin_{abs(hash(str(file.resolve())))}"
        if name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ValueError(f"--tool-parser-plugin {path}: not a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ValueError(f"--tool-parser-plugin {path} failed to import: {type(exc).__name__}: {exc}") from None

    def __contains__(self, name: object) -> bool:
        _load_plugins()
        return isinstance(name, str) and _key(name) in self._entries


ReasoningParserManager = ParserRegistry("reasoning", {
    "ernie_x1": "fd_core.parsers.reasoning_ernie_x1:ErnieX1ReasoningParser",
    "ernie-45-vl": "fd_core.parsers.reasoning_ernie45_vl:Ernie45VLReasoningParser",
    "ernie-45-vl-thinking": "fd_core.parsers.reasoning_ernie45_vl:Ernie45VLReasoningParser",
    "qwen3": "fd_core.parsers.reasoning_qwen3:Qwen3ReasoningParser",
})
ToolParserManager = ParserRegistry("tool-call", {
    "ernie_x1": "fd_core.parsers.tool_ernie_x1:ErnieX1ToolParser",
    "ernie-45-vl-thinking": "fd_core.parsers.tool_ernie45_vl_thinking:Ernie45VLThinkingToolParser",
})

_plugins_loaded = False
_lock = threading.Lock()


def _load_plugins() -> None:
    """Let general plugins register parsers, once per process."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        from fd_core.plugins import manager

        modules = manager.load_general_plugins()
        if modules:
            manager.make_plugin_manager(*modules).hook.fd_register_parsers(
                reasoning=ReasoningParserManager, tool_call=ToolParserManager
            )
