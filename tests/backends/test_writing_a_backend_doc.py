"""docs/writing-a-backend.md: its complete backend works as written, and its
field tables list every field of the device data types."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fd_core import envs
from fd_core.backends import get_backend, list_backends
from fd_core.plugins import types

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "writing-a-backend.md").read_text()


def section(title: str) -> str:
    start = DOC.index(f"\n{title}\n")
    end = DOC.find("\n## ", start + len(title) + 2)
    return DOC[start:end if end != -1 else None]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@pytest.fixture
def mydev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The doc's distribution, installed the way pip would: its package and a
    ``.dist-info`` carrying the doc's entry point, on ``sys.path``."""
    (pyproject,) = code_blocks(section("## Layout"), "toml")
    project = tomllib.loads(pyproject)["project"]
    (module,) = code_blocks(section("## A complete minimal backend"), "python")
    package = tmp_path / "fd_mydev"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "backend.py").write_text(module)
    info = tmp_path / f"fd_mydev-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["fd_core.backends"]
    (info / "entry_points.txt").write_text(
        "[fd_core.backends]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    assert points == {"mydev": "fd_mydev.backend"}
    monkeypatch.syspath_prepend(str(tmp_path))
    envs.reset()
    yield tmp_path
    for name in ("fd_mydev.backend", "fd_mydev"):
        sys.modules.pop(name, None)


def test_the_complete_backend_is_found_listed_and_answers_its_kernel(mydev: Path) -> None:
    (row,) = [r for r in list_backends() if r.name == "mydev"]
    assert row.availability.usable, row.availability.reason
    assert row.distribution == "fd-mydev 0.1.0"
    assert get_backend("auto").name != "mydev"  # auto_priority -1
    backend = get_backend("mydev")
    import paddle
    from fd_mydev import backend as module

    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(3, 8)).astype("float32"))
    got = backend.ops.silu_and_mul(x)
    assert module.calls["silu_and_mul"] == 1
    want = get_backend("cpu").ops.silu_and_mul(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    # every other op is the reference's
    normed = backend.ops.rms_norm(x, paddle.ones([8]), 1e-6)
    assert tuple(normed.shape) == (3, 8)
    assert backend.memory(0).total_bytes > 0


def test_the_complete_backend_passes_the_conformance_suite(mydev: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mydev), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fd_core.testing.conformance", "--fd-backend", "mydev",
         "-q", "-p", "no:xdist", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=mydev, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^\d+ passed", done.stdout.splitlines()[-1]), done.stdout[-2000:]
    assert re.search(r"silu_and_mul: +native", done.stdout), done.stdout[-2000:]


@pytest.mark.parametrize("cls", [types.DeviceInfo, types.Availability, types.MemoryInfo, types.Capabilities],
                         ids=lambda c: c.__name__)
def test_the_doc_lists_every_field(cls: type) -> None:
    start = DOC.index(f"`{cls.__name__}`: ")
    table = DOC[start:DOC.index("\n\n", DOC.index("| field |", start))]
    listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert listed == [f.name for f in dataclasses.fields(cls)]
