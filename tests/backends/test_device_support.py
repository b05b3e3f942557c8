"""fd_core.backends.device_support: the availability flow on fake devices.

No device and no real probe: ``installed``, ``paddle_importable`` and the
probe are replaced, so each branch's reason can be checked word for word.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fd_core.backends import device_support as ds

HINT = "install paddlepaddle-foo (see fd-foo's README)"

BUILD = ds.PaddleDeviceSpec(
    noun="FPU",
    device_type="foo",
    visible_devices_envs=("FOO_VISIBLE_DEVICES", "BAR_VISIBLE_DEVICES"),
    install_hint=HINT,
    driver_tool="foo-smi",
    paddle_distributions=("paddlepaddle-foo",),
    build="a FOO build",
    compiled_check="paddle.is_compiled_with_foo()",
    cpu_wheel_lacks="FOO support",
    count_expr="paddle.device.foo.device_count()",
)
PLUGIN = ds.PaddleDeviceSpec(
    noun="FPU",
    device_type="foo_dev",
    visible_devices_envs="FOO_VISIBLE_DEVICES",  # a single name is accepted too
    install_hint=HINT,
    driver_tool="foo-smi",
    plugin_distributions=("paddle-custom-foo",),
    plugin_title="Foo plugin",
)
OK_PROBE = {"version": "3.3.1", "built": True, "count": 2}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FOO_VISIBLE_DEVICES", "BAR_VISIBLE_DEVICES", "CUSTOM_DEVICE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ds, "paddle_importable", lambda: True)


def with_wheels(*present: str):
    return lambda d: "3.3.1" if d in present else None


def reason(spec: ds.PaddleDeviceSpec, wheels=("paddlepaddle", "paddlepaddle-foo", "paddle-custom-foo"),
           probe: dict = OK_PROBE) -> str:
    availability = ds.device_availability(spec, installed=with_wheels(*wheels), probe=lambda v: probe)
    assert not availability.usable
    return availability.reason


def test_paddle_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "paddle_importable", lambda: False)
    assert reason(BUILD) == f"paddle is not installed; {HINT}"


def test_only_the_cpu_wheel() -> None:
    assert reason(BUILD, wheels=("paddlepaddle",)) == (
        "paddle 3.3.1 here is the CPU build (paddlepaddle), which has no FOO support "
        f"(paddle.is_compiled_with_foo() is False); {HINT}"
    )


def test_no_distribution_at_all_goes_on_to_the_probe() -> None:
    # Paddle importable but no known wheel (a source build): ask paddle itself.
    assert ds.device_availability(BUILD, installed=with_wheels(), probe=lambda v: OK_PROBE).usable


def test_plugin_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert reason(PLUGIN, wheels=("paddlepaddle",)) == (
        "the Foo plugin paddle-custom-foo is not installed, so paddle has no custom "
        f"device 'foo_dev'; {HINT}"
    )
    monkeypatch.setenv("CUSTOM_DEVICE_ROOT", "/opt/plugins")  # a plugin built from source
    assert ds.device_availability(
        PLUGIN, installed=with_wheels("paddlepaddle"), probe=lambda v: OK_PROBE
    ).usable


@pytest.mark.parametrize("env", ["FOO_VISIBLE_DEVICES", "BAR_VISIBLE_DEVICES"])
def test_empty_visible_devices(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv(env, " ")
    assert reason(BUILD) == f"{env} is set but empty, which hides every FPU"


def test_probe_error() -> None:
    assert reason(BUILD, probe={"error": "importing paddle failed: boom"}) == (
        "importing paddle failed: boom"
    )


def test_not_built_for_the_device() -> None:
    probe = {"version": "3.3.1", "built": False, "count": 0, "types": ["npu"]}
    assert reason(BUILD, probe=probe) == (
        f"paddle 3.3.1 here is not a FOO build (paddle.is_compiled_with_foo() is False); {HINT}"
    )
    assert reason(PLUGIN, probe=probe) == (
        "paddle 3.3.1 has no custom device 'foo_dev' "
        f"(paddle.device.get_all_custom_device_type() is ['npu']); {HINT}"
    )


def test_zero_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO_VISIBLE_DEVICES", "0,1")
    probe = {"version": "3.3.1", "built": True, "count": 0}
    assert reason(BUILD, probe=probe) == (
        "paddle 3.3.1 is a FOO build but sees no FPU (paddle.device.foo.device_count() is 0, "
        "FOO_VISIBLE_DEVICES='0,1', BAR_VISIBLE_DEVICES=None); check the driver with foo-smi"
    )
    assert reason(PLUGIN, probe=probe) == (
        "paddle 3.3.1 has the 'foo_dev' plugin but sees no FPU (custom device count is 0, "
        "FOO_VISIBLE_DEVICES='0,1'); check the driver with foo-smi"
    )


def test_usable_and_the_probe_keyed_by_the_visible_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAR_VISIBLE_DEVICES", "3")
    keys = []
    availability = ds.device_availability(
        BUILD, installed=with_wheels("paddlepaddle-foo"), probe=lambda v: keys.append(v) or OK_PROBE
    )
    assert availability.usable
    assert availability.details == ("2 FPU(s) visible", "paddle 3.3.1", "kernels: fd-core reference ops")
    assert keys == [(None, "3")]


def test_defaults_use_the_module_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "installed", with_wheels("paddlepaddle-foo"))
    monkeypatch.setattr(ds, "probe_paddle", lambda code, key: dict(OK_PROBE, count=5))
    assert ds.device_availability(BUILD).details[0] == "5 FPU(s) visible"


def test_never_raises() -> None:
    def broken(distribution: str) -> str:
        raise OSError("metadata unreadable")

    availability = ds.device_availability(BUILD, installed=broken)
    assert availability.reason == "availability check failed: OSError: metadata unreadable"


def test_spec_needs_exactly_one_kind_of_distribution() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ds.PaddleDeviceSpec(noun="X", device_type="x", visible_devices_envs=(), install_hint="",
                            driver_tool="")


def test_default_probe_code() -> None:
    assert "built = paddle.is_compiled_with_foo()" in BUILD.probe_code
    assert "count = paddle.device.foo.device_count() if built else 0" in BUILD.probe_code
    assert 'get_custom_device_count("foo_dev")' in PLUGIN.probe_code
    compile(BUILD.probe_code, "probe", "exec")
    compile(PLUGIN.probe_code, "probe", "exec")


def test_probe_paddle_never_raises_and_caches() -> None:
    ds.probe_paddle.cache_clear()
    code = 'print(\'{"version": "x", "built": false, "count": 0}\')'
    assert ds.probe_paddle(code, "k") == {"version": "x", "built": False, "count": 0}
    assert ds.probe_paddle(code, "k") is ds.probe_paddle(code, "k")
    failed = ds.probe_paddle("import sys; sys.exit('no paddle here')")
    assert failed == {"error": "importing paddle failed: no paddle here"}
    assert "error" in ds.probe_paddle("print('not json')")
    assert "error" in ds.probe_paddle("")  # no output


def test_importing_the_module_imports_no_paddle(tmp_path) -> None:
    code = (
        "import sys, fd_core.backends.device_support\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'paddle'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
