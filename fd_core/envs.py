"""Every FD_* environment variable fd-core reads, typed, read once.

Nothing else in fd_core reads ``os.environ`` for configuration (the
visible-devices variables belong to the backends that declare them).
Values are read on first access and cached; tests call ``reset()`` after
changing the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["get", "reset", "VARIABLES"]


def _str(default: str | None) -> Callable[[str | None], Any]:
    return lambda raw: default if raw is None or raw == "" else raw


def _bool(default: bool) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> bool:
        if raw is None or raw == "":
            return default
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean (1/0/true/false), got {raw!r}")

    return parse


def _int(default: int | None) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> int | None:
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None

    return parse


def _float(default: float) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> float:
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
        if value <= 0:
            raise ValueError(f"expected a positive number, got {raw!r}")
        return value

    return parse


def _csv(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or raw.strip() == "":
        return None
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _choice(default: str, choices: tuple[str, ...]) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> str:
        value = default if raw is None or raw == "" else raw.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


# name -> (parser, meaning)
VARIABLES: dict[str, tuple[Callable[[str | None], Any], str]] = {
    "FD_PLUGINS": (_csv, "comma-separated entry-point names of plugins/backends to load; unset loads all"),
    "FD_SAMPLING_CLASS": (_choice("base", ("base", "rejection")), "'rejection' selects the rejection top-k/top-p sampler"),
    "FD_DISABLE_CHUNKED_PREFILL": (_bool(False), "1 turns chunked prefill off"),
    "FD_CPU_NUM_THREADS": (_int(None), "threads for the CPU backend's kernels; default: all cores"),
    "FD_CPU_KVCACHE_SPACE": (_float(4.0), "GiB of host memory for the CPU backend's KV cache (default 4)"),
    "FD_API_KEY": (_str(None), "API key the server requires (like --api-key)"),
    "FD_LOG_LEVEL": (_str("INFO"), "log level of fd_core loggers"),
}

_cache: dict[str, Any] = {}


def get(name: str) -> Any:
    """Return the typed value of ``name``; raise ValueError naming a bad value."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not an fd-core environment variable; known: {sorted(VARIABLES)}")
    if name not in _cache:
        parser, _ = VARIABLES[name]
        try:
            _cache[name] = parser(os.environ.get(name))
        except ValueError as exc:
            raise ValueError(f"environment variable {name}: {exc}") from None
    return _cache[name]


def reset() -> None:
    """Forget cached values so the next ``get`` reads the environment again."""
    _cache.clear()
