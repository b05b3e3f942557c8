"""A backend from another distribution: found, selected, overriding one op.

The ``toy`` backend (tests/plugins/fd_toy_backend, installed by CI) brings its
own ``silu_and_mul`` and relies on the CPU reference for everything else.
Plugins that do not fit (wrong API version, unknown hook, failing import) are
built per test as throwaway distributions on ``sys.path``: a module plus a
``.dist-info`` whose entry point names it, found by the real discovery.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from fd_core import envs
from fd_core.backends import BackendSelectionError, get_backend, list_backends
from fd_core.plugins import manager
from fd_core.plugins.manager import PluginLoadError

HARDWARE = ("cuda", "xpu", "iluvatar", "dcu", "gcu")


@pytest.fixture(scope="module", autouse=True)
def toy_installed() -> None:
    if not list(metadata.entry_points(group="fd_core.backends", name="toy")):
        pytest.fail(
            "the toy backend is not installed; run: pip install tests/plugins/fd_toy_backend",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def fresh_envs() -> Iterator[None]:
    # FD_* variables are read once and cached: start and end each test clean.
    envs.reset()
    yield
    envs.reset()


@pytest.fixture
def toy():
    from fd_toy_backend import backend

    return backend


@pytest.fixture
def add_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``add_plugin(name, *sources)``: a distribution whose ``fd_core.backends``
    entry point ``name`` is a module made of the (dedented) ``sources``."""
    modules = []

    def add(name: str, *sources: str) -> None:
        module = f"fd_test_plugin_{name}"
        code = "\n".join(textwrap.dedent(source) for source in sources)
        (tmp_path / f"{module}.py").write_text(code)
        info = tmp_path / f"fd_test_plugin_{name}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: fd-test-plugin-{name}\nVersion: 0.0.1\n"
        )
        (info / "entry_points.txt").write_text(f"[fd_core.backends]\n{name} = {module}\n")
        modules.append(module)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield add
    for module in modules:
        sys.modules.pop(module, None)


VALID_HEADER = """
    from fd_core.plugins import API_VERSION, hookimpl
    from fd_core.plugins.types import Availability, DeviceInfo

    FD_API_VERSION = API_VERSION

    @hookimpl
    def fd_device_info():
        return DeviceInfo(name="x", device_type="cpu", visible_devices_env=None,
                          collective_backend="gloo", paddle_package="paddlepaddle",
                          auto_priority=50)

    @hookimpl
    def fd_device_availability():
        return Availability.ok()
"""


# ------------------------------------------------------------ the toy backend


def test_toy_is_discovered_through_its_entry_point() -> None:
    entry = manager.discover()["toy"]
    assert entry.error is None
    assert entry.value == "fd_toy_backend.backend"
    assert entry.distribution == "fd-toy-backend 0.1.0"


def test_toy_answers_silu_and_mul_with_its_own_kernel(toy) -> None:
    import paddle

    from fd_core.ops.activation import reference_silu_and_mul

    backend = get_backend("toy")
    x = paddle.randn([5, 8])
    before = toy.calls["silu_and_mul"]
    out = backend.ops.silu_and_mul(x)
    assert toy.calls["silu_and_mul"] == before + 1
    np.testing.assert_allclose(out.numpy(), reference_silu_and_mul(x).numpy(), rtol=1e-5, atol=1e-6)


def test_toy_falls_back_to_the_reference_for_other_ops(toy) -> None:
    import paddle

    from fd_core.backends import cpu
    from fd_core.ops.norm import reference_rms_norm

    backend = get_backend("toy")
    # Only the reference implements rms_norm in the selected backend's manager.
    assert [impl.plugin for impl in backend.pm.hook.fd_rms_norm.get_hookimpls()] == [cpu]
    x, weight = paddle.randn([3, 16]), paddle.rand([16])
    before = dict(toy.calls)
    out = backend.ops.rms_norm(x, weight, 1e-6)
    np.testing.assert_allclose(out.numpy(), reference_rms_norm(x, weight, 1e-6).numpy(), rtol=1e-6)
    assert toy.calls == before


def test_cpu_backend_does_not_use_the_toy_kernel(toy) -> None:
    import paddle

    before = toy.calls["silu_and_mul"]
    get_backend("cpu").ops.silu_and_mul(paddle.randn([2, 4]))
    assert toy.calls["silu_and_mul"] == before


def _best_usable() -> str:
    """What --backend auto should pick: the usable backend of highest priority
    (cpu here, or x86 when that backend is installed)."""
    rows = [r for r in list_backends() if r.availability.usable and r.info is not None]
    return max(rows, key=lambda r: r.info.auto_priority).name


def test_auto_follows_priority_and_never_picks_an_unusable_backend() -> None:
    rows = {row.name: row for row in list_backends()}
    for name in HARDWARE:
        if name in rows:
            assert not rows[name].availability.usable, f"{name} claims to be usable on this machine"
    # the toy (priority -1) is usable but ranks below the reference (0)
    assert rows["toy"].availability.usable
    assert _best_usable() in ("cpu", "x86")
    assert get_backend("auto").name == _best_usable()


# ---------------------------------------------------------------- FD_PLUGINS


def test_fd_plugins_restricts_what_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_PLUGINS", "cuda")
    envs.reset()
    assert set(manager.discover()) == {"cpu", "cuda"}  # the reference always loads
    assert get_backend("auto").name == "cpu"
    with pytest.raises(BackendSelectionError, match=r"backend 'toy' is installed \(fd-toy-backend .*\) but FD_PLUGINS=cuda leaves it out"):
        get_backend("toy")


def test_fd_plugins_can_name_the_toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_PLUGINS", "toy")
    envs.reset()
    assert set(manager.discover()) == {"cpu", "toy"}
    assert get_backend("toy").name == "toy"


# ------------------------------------------------------- plugins that don't fit


def test_wrong_api_version_is_refused(add_plugin) -> None:
    add_plugin("future", VALID_HEADER, "FD_API_VERSION = API_VERSION + 1")
    with pytest.raises(PluginLoadError) as excinfo:
        get_backend("future")
    message = str(excinfo.value)
    assert "written for fd-core plugin API version 2" in message
    assert "this fd-core provides version 1" in message


def test_missing_api_version_is_refused(add_plugin) -> None:
    add_plugin("unversioned", VALID_HEADER, "del FD_API_VERSION")
    with pytest.raises(PluginLoadError, match="does not declare FD_API_VERSION"):
        get_backend("unversioned")


def test_unknown_hook_is_refused(add_plugin, caplog: pytest.LogCaptureFixture) -> None:
    add_plugin("typo", VALID_HEADER, """
    @hookimpl
    def fd_no_such_hook():
        return 1
    """)
    with pytest.raises(PluginLoadError) as excinfo:
        get_backend("typo")
    assert "fd_no_such_hook" in str(excinfo.value)
    assert "fd_core.plugins.hookspecs" in str(excinfo.value)
    # With auto it is skipped (despite its priority 50 > cpu's 0) with a warning.
    with caplog.at_level(logging.WARNING, logger="fd_core.backends.registry"):
        assert get_backend("auto").name == _best_usable()
    assert "'typo' is broken" in caplog.text


def test_failing_import_raises_with_traceback_when_named(add_plugin) -> None:
    add_plugin("broken", """
    raise ImportError("libbroken_kernels.so: cannot open shared object file")
    """)
    with pytest.raises(PluginLoadError) as excinfo:
        get_backend("broken")
    message = str(excinfo.value)
    assert "plugin 'broken' (fd_test_plugin_broken, from fd-test-plugin-broken 0.0.1) failed to load" in message
    assert "Traceback (most recent call last)" in message
    assert "fd_test_plugin_broken.py" in message
    assert "libbroken_kernels.so: cannot open shared object file" in message


def test_failing_import_is_a_warning_with_auto(add_plugin, caplog: pytest.LogCaptureFixture) -> None:
    add_plugin("broken", """
    raise ImportError("libbroken_kernels.so: cannot open shared object file")
    """)
    with caplog.at_level(logging.WARNING, logger="fd_core.backends.registry"):
        assert get_backend("auto").name == _best_usable()
    assert "backend 'broken' failed to load; skipping it" in caplog.text
    assert "libbroken_kernels.so" in caplog.text
    row = {r.name: r for r in list_backends()}["broken"]
    assert not row.availability.usable
    assert "failed to import: ImportError: libbroken_kernels.so" in row.availability.reason
