"""Asking for a backend that is not there says which package brings it."""

from __future__ import annotations

import pytest

from fd_core import envs
from fd_core.backends import BackendSelectionError, get_backend
from fd_core.plugins import manager


@pytest.fixture
def only_cpu_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Discovery finds the built-in reference alone, and no entry point is installed."""
    real = manager.discover
    monkeypatch.setattr(manager, "discover", lambda group=manager.BACKEND_GROUP: {
        name: entry for name, entry in real(group).items() if name == "cpu"})
    monkeypatch.setattr("fd_core.backends.registry.metadata.entry_points", lambda group: [])


def selection_error(name: str) -> str:
    with pytest.raises(BackendSelectionError) as info:
        get_backend(name)
    return str(info.value)


@pytest.mark.parametrize("name,dist,folder", [
    ("cuda", "fd-cuda", "backends/fd_cuda"),
    ("x86", "fd-x86", "backends/fd_x86"),
    ("iluvatar", "fd-iluvatar", "backends/fd_iluvatar"),
])
def test_a_first_party_backend_names_its_package_and_folder(only_cpu_installed, name, dist, folder):
    message = selection_error(name)
    assert f"backend {name!r} is not installed; it comes with the {dist} package" in message
    assert f"pip install -e {folder}" in message
    assert f"pip wheel --no-deps {folder} -w dist/" in message
    assert "not on a package index yet" in message
    assert "installed: cpu" in message
    assert "fd-cuda" not in message or name == "cuda"  # never another backend's package


def test_an_unknown_name_lists_what_is_installed_and_how_plugins_register(only_cpu_installed):
    message = selection_error("nosuch")
    assert message.startswith("unknown backend 'nosuch'; installed: cpu")
    assert "entry point in the group 'fd_core.backends'" in message
    assert "docs/writing-a-backend.md" in message
    assert "pip install fd-" not in message  # no made-up package name


def test_a_backend_left_out_by_fd_plugins_says_so(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FD_PLUGINS", "cpu")
    envs.reset()
    try:
        message = selection_error("x86")
    finally:
        monkeypatch.delenv("FD_PLUGINS")
        envs.reset()
    assert "backend 'x86' is installed (fd-x86 " in message
    assert "FD_PLUGINS=cpu leaves it out; add x86 to FD_PLUGINS or unset it" in message
