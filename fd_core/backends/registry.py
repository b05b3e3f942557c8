"""Which backends are installed, which are usable here, and selecting one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

from fd_core import envs
from fd_core.backends.base import Backend
from fd_core.plugins import manager
from fd_core.plugins.types import Availability, DeviceInfo

__all__ = ["BackendStatus", "BackendSelectionError", "get_backend", "list_backends", "format_listing",
           "missing_backend_message"]

logger = logging.getLogger(__name__)

REFERENCE = "cpu"
# fd-core's own backends: name -> distribution, each in backends/<package> of
# the fd-core repository (none is on a package index yet)
FIRST_PARTY = {"cuda": "fd-cuda", "xpu": "fd-xpu", "iluvatar": "fd-iluvatar", "dcu": "fd-dcu",
               "gcu": "fd-gcu", "x86": "fd-x86"}


class BackendSelectionError(RuntimeError):
    """The requested backend is unknown, failed to load, or cannot run here."""


@dataclass
class BackendStatus:
    """One row of the listing."""

    name: str
    distribution: str
    info: DeviceInfo | None
    availability: Availability
    module: ModuleType | None


def _describe(module: ModuleType, name: str) -> tuple[DeviceInfo, Availability]:
    # Ask the module alone: with the reference beside it, the reference's
    # trylast device hooks would answer for a backend that forgot to.
    pm = manager.make_plugin_manager(module)
    info = pm.hook.fd_device_info()
    if info is None:
        raise manager.PluginLoadError(f"backend {name!r} does not implement fd_device_info")
    try:
        availability = pm.hook.fd_device_availability()
    except Exception as exc:  # the hook must not raise; report it instead
        availability = Availability.unusable(f"availability check raised {type(exc).__name__}: {exc}")
    if availability is None:
        availability = Availability.unusable("backend does not implement fd_device_availability")
    return info, availability


def list_backends() -> list[BackendStatus]:
    """Every installed backend with whether it can run here and why not."""
    rows = []
    for name, entry in manager.discover(manager.BACKEND_GROUP).items():
        if entry.module is None:
            last = (entry.error or "").strip().splitlines()[-1:] or ["unknown error"]
            rows.append(BackendStatus(name, entry.distribution, None,
                                      Availability.unusable(f"failed to import: {last[0]}"), None))
            continue
        try:
            info, availability = _describe(entry.module, name)
        except Exception as exc:
            rows.append(BackendStatus(name, entry.distribution, None,
                                      Availability.unusable(str(exc)), entry.module))
            continue
        rows.append(BackendStatus(name, entry.distribution, info, availability, entry.module))
    return rows


def format_listing(rows: list[BackendStatus]) -> str:
    """The table ``fd-serve --list-backends`` prints."""
    lines = [f"{'backend':<10} {'usable':<7} {'device':<13} {'collective':<10} {'distribution':<22} notes"]
    for row in rows:
        device = row.info.device_type if row.info else "-"
        coll = row.info.collective_backend if row.info else "-"
        usable = "yes" if row.availability.usable else "no"
        notes = row.availability.reason if not row.availability.usable else "; ".join(row.availability.details)
        lines.append(f"{row.name:<10} {usable:<7} {device:<13} {coll:<10} {row.distribution:<22} {notes}")
    return "\n".join(lines)


def missing_backend_message(name: str, installed: list[str]) -> str:
    """Why ``--backend name`` is not among ``installed``, and what to install."""
    listed = f"installed: {', '.join(sorted(installed))} (fd-serve --list-backends shows which can run here)"
    filtered = [ep for ep in metadata.entry_points(group=manager.BACKEND_GROUP) if ep.name == name]
    if filtered:  # installed, but FD_PLUGINS leaves it out
        found = filtered[0].dist
        label = f" ({found.name} {found.version})" if found is not None else ""
        return (f"backend {name!r} is installed{label} but FD_PLUGINS="
                f"{','.join(envs.get('FD_PLUGINS') or ())} leaves it out; add {name} to FD_PLUGINS "
                f"or unset it. {listed}")
    if name in FIRST_PARTY:
        dist = FIRST_PARTY[name]
        folder = f"backends/{dist.replace('-', '_')}"
        return (f"backend {name!r} is not installed; it comes with the {dist} package, which is not on "
                f"a package index yet. From a checkout of the fd-core repository: pip install -e {folder} "
                f"(or pip wheel --no-deps {folder} -w dist/ and pip install the wheel); see {folder}/README.md "
                f"for what else it needs. {listed}")
    return (f"unknown backend {name!r}; {listed}. fd-core's own backends are "
            f"{', '.join([REFERENCE, *FIRST_PARTY])}; a third-party backend is a package that registers "
            f"an entry point in the group {manager.BACKEND_GROUP!r}: install it into this environment "
            "(see docs/writing-a-backend.md)")


def get_backend(name: str = "auto") -> Backend:
    """Select a backend by name, or the best usable one for ``"auto"``.

    The returned Backend's plugin manager holds the selected backend and the
    CPU reference. Asking by name for a backend that failed to import raises
    with its traceback; with ``auto``, such backends are skipped with a
    logged warning.
    """
    entries = manager.discover(manager.BACKEND_GROUP)
    reference = entries[REFERENCE].require_module()
    if name == "auto":
        best: tuple[int, str, ModuleType] | None = None
        for entry_name, entry in entries.items():
            if entry.module is None:
                logger.warning("backend %r failed to load; skipping it:\n%s", entry_name, entry.error)
                continue
            try:
                info, availability = _describe(entry.module, entry_name)
            except Exception as exc:
                logger.warning("backend %r is broken; skipping it: %s", entry_name, exc)
                continue
            if availability.usable and (best is None or info.auto_priority > best[0]):
                best = (info.auto_priority, entry_name, entry.module)
        assert best is not None, "the CPU reference backend is always usable"
        _, name, module = best
        logger.info("backend auto: selected %r", name)
    else:
        if name not in entries:
            raise BackendSelectionError(missing_backend_message(name, list(entries)))
        module = entries[name].require_module()
        _, availability = _describe(module, name)
        if not availability.usable:
            raise BackendSelectionError(f"backend {name!r} cannot run here: {availability.reason}")
    modules = [reference] if module is reference else [reference, module]
    return Backend(name, manager.make_plugin_manager(*modules))
