"""Finding plugins through entry points and building plugin managers.

Nothing here runs at import time: callers ask for discovery explicitly, in
each process that needs plugins. ``FD_PLUGINS`` (comma-separated entry-point
names) restricts what loads; the built-in CPU reference backend always
loads, since it is the fallback every other backend relies on.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from fd_core import envs
from fd_core.plugins import hookspecs

__all__ = [
    "BACKEND_GROUP",
    "PLUGIN_GROUP",
    "PluginEntry",
    "PluginLoadError",
    "discover",
    "make_plugin_manager",
]

logger = logging.getLogger(__name__)

BACKEND_GROUP = "fd_core.backends"
PLUGIN_GROUP = "fd_core.plugins"
BUILTIN_BACKENDS = {"cpu": "fd_core.backends.cpu"}


class PluginLoadError(RuntimeError):
    """A plugin could not be imported or does not fit this fd-core."""


@dataclass
class PluginEntry:
    """One discovered plugin: its module, or why it failed to load."""

    name: str  # entry-point name, e.g. "cuda"
    value: str  # "package.module"
    distribution: str  # "fd-cuda 0.1.0", or "fd-core (built in)"
    module: ModuleType | None = None
    error: str | None = None  # traceback text when the import failed

    def require_module(self) -> ModuleType:
        """Return the module, or raise with the import traceback."""
        if self.module is None:
            raise PluginLoadError(
                f"plugin {self.name!r} ({self.value}, from {self.distribution}) failed to load:\n"
                f"{self.error}"
            )
        return self.module


def _entry_points(group: str) -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=group), key=lambda ep: ep.name)


def _check_api_version(module: ModuleType, name: str) -> None:
    declared = getattr(module, "FD_API_VERSION", None)
    if declared is None:
        raise PluginLoadError(
            f"plugin {name!r} ({module.__name__}) does not declare FD_API_VERSION; "
            f"set FD_API_VERSION = {hookspecs.API_VERSION} at module level "
            "(fd_core.plugins.hookspecs.API_VERSION)"
        )
    if declared != hookspecs.API_VERSION:
        raise PluginLoadError(
            f"plugin {name!r} ({module.__name__}) was written for fd-core plugin API "
            f"version {declared}, but this fd-core provides version {hookspecs.API_VERSION}; "
            "upgrade the plugin or fd-core so they match"
        )


def _load(name: str, value: str, distribution: str) -> PluginEntry:
    entry = PluginEntry(name=name, value=value, distribution=distribution)
    try:
        module = importlib.import_module(value)
        _check_api_version(module, name)
        entry.module = module
    except Exception:
        entry.error = traceback.format_exc()
    return entry


def discover(group: str = BACKEND_GROUP) -> dict[str, PluginEntry]:
    """Import the plugins of ``group`` that ``FD_PLUGINS`` allows.

    Returns name -> PluginEntry; a plugin that fails to import is kept with
    its traceback (callers decide whether that is an error or a warning).
    For the backend group, the built-in ``cpu`` backend is always present.
    """
    allowed = envs.get("FD_PLUGINS")
    found: dict[str, PluginEntry] = {}
    if group == BACKEND_GROUP:
        for name, value in BUILTIN_BACKENDS.items():
            found[name] = _load(name, value, "fd-core (built in)")
    for ep in _entry_points(group):
        if ep.name in found and ep.value == found[ep.name].value:
            continue  # fd-core's own entry point for a built-in
        if allowed is not None and ep.name not in allowed:
            continue
        if ep.name in found:
            logger.warning(
                "two plugins are named %r in %s (%s and %s); keeping the first",
                ep.name, group, found[ep.name].value, ep.value,
            )
            continue
        dist = ep.dist
        dist_label = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        found[ep.name] = _load(ep.name, ep.value, dist_label)
    return found


def make_plugin_manager(*modules: Any) -> pluggy.PluginManager:
    """A plugin manager with fd-core's hookspecs and ``modules`` registered.

    Modules are registered in order; pluggy calls later registrations first,
    and ``trylast`` implementations (the CPU reference) last. Raises
    PluginLoadError when a module implements a hook that does not exist.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for module in modules:
        if pm.is_registered(module):
            continue
        pm.register(module, name=getattr(module, "__name__", None))
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(
            f"{exc}; the hooks fd-core defines are listed in fd_core.plugins.hookspecs"
        ) from None
    return pm


def load_general_plugins() -> list[ModuleType]:
    """Import the ``fd_core.plugins`` group; failures are logged, not raised."""
    modules = []
    for entry in discover(PLUGIN_GROUP).values():
        if entry.module is None:
            logger.warning("plugin %r failed to load; skipping it:\n%s", entry.name, entry.error)
            continue
        modules.append(entry.module)
    return modules
