"""The backend listing with the five hardware backends installed on a CPU machine.

Needs fd-cuda, fd-xpu, fd-iluvatar, fd-dcu and fd-gcu installed (``pip install
backends/fd_*``) next to the CPU ``paddlepaddle`` wheel: each must then be
listed as unusable, saying what is missing, without importing paddle.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib import metadata

import pytest

from fd_core.backends import BackendSelectionError, format_listing, get_backend, list_backends

# backend -> (distribution, paddle device type, visible-devices variable, collective)
HARDWARE = {
    "cuda": ("fd-cuda", "gpu", "CUDA_VISIBLE_DEVICES", "nccl"),
    "xpu": ("fd-xpu", "xpu", "XPU_VISIBLE_DEVICES", "bkcl"),
    "iluvatar": ("fd-iluvatar", "iluvatar_gpu", "CUDA_VISIBLE_DEVICES", "xccl"),
    "dcu": ("fd-dcu", "gpu", "CUDA_VISIBLE_DEVICES", "nccl"),
    "gcu": ("fd-gcu", "gcu", "TOPS_VISIBLE_DEVICES", "xccl"),
}
# backend -> what its availability reason must name as missing here
MISSING = {
    "cuda": "paddlepaddle-gpu",
    "xpu": "paddlepaddle-xpu",
    "iluvatar": "paddle-iluvatar-gpu",
    "dcu": "paddlepaddle-dcu",
    "gcu": "paddle-custom-gcu",
}


@pytest.fixture(scope="module", autouse=True)
def hardware_backends_installed() -> None:
    installed = {ep.name for ep in metadata.entry_points(group="fd_core.backends")}
    missing = sorted(set(HARDWARE) - installed)
    if missing:
        pytest.fail(
            f"hardware backends {missing} are not installed; run "
            + " ".join(f"pip install -e backends/fd_{name}" for name in missing),
            pytrace=False,
        )


@pytest.fixture(scope="module")
def rows() -> dict:
    return {row.name: row for row in list_backends()}


def backend_module(name: str):
    return importlib.import_module(f"fd_{name}.backend")


def test_cpu_reference_is_usable(rows: dict) -> None:
    assert rows["cpu"].availability.usable, rows["cpu"].availability.reason


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_hardware_backend_describes_its_device(rows: dict, name: str) -> None:
    distribution, device_type, visible_env, collective = HARDWARE[name]
    row = rows[name]
    assert row.distribution == f"{distribution} 0.1.0"
    assert row.info is not None
    assert (row.info.name, row.info.device_type) == (name, device_type)
    assert row.info.visible_devices_env == visible_env
    assert row.info.collective_backend == collective
    assert row.info.auto_priority == 100


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_hardware_backend_is_unusable_saying_what_is_missing(rows: dict, name: str) -> None:
    availability = rows[name].availability
    assert not availability.usable
    assert MISSING[name] in availability.reason
    assert "failed" not in availability.reason  # a diagnosis, not a crash


def test_format_listing_prints_a_row_per_backend(rows: dict) -> None:
    table = format_listing(list(rows.values())).splitlines()
    assert table[0].split()[:3] == ["backend", "usable", "device"]
    for name, row in rows.items():
        (line,) = [line for line in table if line.split()[0] == name]
        assert line.split()[1] == ("yes" if row.availability.usable else "no")
        assert row.distribution in line
        if not row.availability.usable:
            assert row.availability.reason in line


def test_selecting_an_unusable_backend_says_why(rows: dict) -> None:
    with pytest.raises(BackendSelectionError) as excinfo:
        get_backend("cuda")
    message = str(excinfo.value)
    assert "'cuda' cannot run here" in message
    assert rows["cuda"].availability.reason in message


def test_unknown_backend_lists_the_installed_ones() -> None:
    with pytest.raises(BackendSelectionError) as excinfo:
        get_backend("nope")
    message = str(excinfo.value)
    assert "unknown backend 'nope'" in message
    for name in ["cpu", *HARDWARE]:
        assert name in message


def test_listing_does_not_import_paddle(tmp_path) -> None:
    code = (
        "import sys, fd_core, fd_core.backends\n"
        "rows = fd_core.backends.list_backends()\n"
        "assert {'cpu', 'cuda', 'gcu'} <= {r.name for r in rows}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'paddle'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ------------------------------------------ availability past the wheel check


def pretend_device_wheel_installed(monkeypatch: pytest.MonkeyPatch, module) -> None:
    real = module._installed
    wanted = getattr(module, "PADDLE_DISTRIBUTIONS", None) or module.PLUGIN_DISTRIBUTIONS
    monkeypatch.setattr(module, "_installed", lambda d: "9.9.9" if d in wanted else real(d))


def test_probe_reports_a_cpu_paddle_by_its_compiled_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # A wheel named paddlepaddle-gpu that is really the CPU build: the child
    # process imports paddle and asks it.
    cuda = backend_module("cuda")
    pretend_device_wheel_installed(monkeypatch, cuda)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    availability = cuda.fd_device_availability()
    assert not availability.usable
    assert "is not a CUDA build (paddle.is_compiled_with_cuda() is False)" in availability.reason
    assert "paddlepaddle-gpu" in availability.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_every_probe_runs_against_the_cpu_paddle(name: str) -> None:
    module = backend_module(name)
    probe = module._probe(None)
    assert "error" not in probe, probe
    assert (probe["built"], probe["count"]) == (False, 0)


@pytest.mark.parametrize(
    "name, env",
    [
        ("cuda", "CUDA_VISIBLE_DEVICES"),
        ("xpu", "XPU_VISIBLE_DEVICES"),
        ("iluvatar", "CUDA_VISIBLE_DEVICES"),
        ("dcu", "HIP_VISIBLE_DEVICES"),
        ("gcu", "TOPS_VISIBLE_DEVICES"),
    ],
)
def test_empty_visible_devices_hides_every_device(
    monkeypatch: pytest.MonkeyPatch, name: str, env: str
) -> None:
    module = backend_module(name)
    pretend_device_wheel_installed(monkeypatch, module)
    monkeypatch.setenv(env, "")
    availability = module.fd_device_availability()
    assert not availability.usable
    assert f"{env} is set but empty" in availability.reason


@pytest.mark.parametrize(
    "probe, usable, expected",
    [
        ({"version": "3.3.1", "built": True, "count": 0}, False, "sees no GPU"),
        ({"version": "3.3.1", "built": True, "count": 2}, True, "2 GPU(s) visible"),
        ({"error": "importing paddle failed: libcudart.so.12: cannot open"}, False, "libcudart"),
    ],
)
def test_probe_results_become_availability(
    monkeypatch: pytest.MonkeyPatch, probe: dict, usable: bool, expected: str
) -> None:
    cuda = backend_module("cuda")
    pretend_device_wheel_installed(monkeypatch, cuda)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(cuda, "_probe", lambda visible: probe)
    availability = cuda.fd_device_availability()
    assert availability.usable is usable
    assert expected in (availability.reason if not usable else "; ".join(availability.details))


def test_custom_device_probe_names_the_missing_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    gcu = backend_module("gcu")
    pretend_device_wheel_installed(monkeypatch, gcu)
    monkeypatch.delenv("TOPS_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gcu, "_probe", lambda visible: {
        "version": "3.3.1", "built": False, "count": 0, "types": ["npu"]})
    reason = gcu.fd_device_availability().reason
    assert "no custom device 'gcu'" in reason and "['npu']" in reason


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_availability_never_raises(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    module = backend_module(name)

    def broken(distribution: str) -> str:
        raise OSError("metadata unreadable")

    monkeypatch.setattr(module, "_installed", broken)
    availability = module.fd_device_availability()
    assert not availability.usable
    assert "OSError: metadata unreadable" in availability.reason
