"""mypy checks each backend's hook implementations against the hookspecs.

For every hook a backend implements, a generated function with the spec's
signature calls the implementation as pluggy does (keyword arguments, only
the names the implementation declares) and returns its result under the
spec's return type. mypy then proves each argument the core passes fits the
implementation's parameter and each result fits what the core expects; a
deliberately wrong backend in the same run must be refused, hook by hook.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from fd_core.plugins import hookspecs

ROOT = Path(__file__).resolve().parents[2]
# implementation module -> the folder mypy finds it under (editable installs use
# import hooks mypy cannot follow)
BACKENDS = {
    "fd_core.backends.cpu": ROOT,
    "fd_toy_backend.backend": ROOT / "tests" / "plugins" / "fd_toy_backend",
    # fd_x86 and the hardware backends
    **{f"{p.parent.name}.backend": p.parent.parent for p in sorted(ROOT.glob("backends/fd_*/fd_*/backend.py"))},
}
# general-plugin hooks whose result is an object the caller duck-types
UNTYPED_RESULT = {"fd_load_tokenizer"}

BAD_BACKEND = '''
from __future__ import annotations

import numpy as np

from fd_core.plugins import hookimpl
from fd_core.plugins.types import DeviceInfo, Tensor


@hookimpl
def fd_rotary_embedding(q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor,
                        interleaved: bool) -> Tensor | None:  # wrong: the spec returns (q, k)
    return None


@hookimpl
def fd_rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor) -> Tensor:  # wrong: residual may be None
    return x


@hookimpl
def fd_sample(logits: Tensor, method: str) -> np.ndarray:  # wrong: a host array, not a Tensor
    return np.zeros(1)


@hookimpl
def fd_device_info() -> DeviceInfo | None:  # wrong: a backend must describe its device
    return None


@hookimpl
def fd_silu_and_mul(x: Tensor) -> Tensor | None:  # right
    return None
'''
BAD_HOOKS = {"fd_rotary_embedding", "fd_rms_norm", "fd_sample", "fd_device_info"}


def _specs() -> dict[str, Callable[..., object]]:
    return {name: fn for name, fn in vars(hookspecs).items()
            if name.startswith("fd_") and hasattr(fn, "fd_core_spec")}


def _impls(module: ModuleType) -> dict[str, Callable[..., object]]:
    return {name: fn for name, fn in vars(module).items() if hasattr(fn, "fd_core_impl")}


@dataclass
class Generated:
    source: str
    hook_at_line: dict[int, str]  # line of the generated file -> the hook checked there


def _generate(modules: list[str]) -> Generated:
    """One checking function per (module, implemented hook)."""
    specs = _specs()
    lines = ["from __future__ import annotations", "", "from typing import Any",
             "", "from fd_core.plugins.types import *  # noqa: F403", ""]
    lines += [f"import {name} as m{i}" for i, name in enumerate(modules)]
    hook_at_line: dict[int, str] = {}
    for i, name in enumerate(modules):
        for hook, impl in sorted(_impls(importlib.import_module(name)).items()):
            assert hook in specs, f"{name}.{hook} implements no hookspec"
            spec = inspect.signature(specs[hook])
            taken = list(inspect.signature(impl).parameters)
            extra = set(taken) - set(spec.parameters)
            assert not extra, f"{name}.{hook} takes {sorted(extra)}, which the spec does not pass"
            params = ", ".join(f"{p.name}: {p.annotation}" for p in spec.parameters.values())
            call = ", ".join(f"{p}={p}" for p in taken)
            lines += ["", ""]
            start = len(lines) + 1
            lines.append(f"def check_m{i}_{hook}({params}) -> {spec.return_annotation}:")
            lines.append(f"    return m{i}.{hook}({call})")
            for n in range(start, len(lines) + 1):
                hook_at_line[n] = f"{name}.{hook}"
    return Generated("\n".join(lines) + "\n", hook_at_line)


@dataclass
class MypyRun:
    errors: dict[str, list[str]]  # file name -> its error lines
    generated: dict[str, Generated]


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MypyRun]:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed; it comes with the dev extra: pip install -e '.[dev]'",
                    pytrace=False)
    work = tmp_path_factory.mktemp("contract")
    (work / "bad_backend.py").write_text(textwrap.dedent(BAD_BACKEND))
    sys.path.insert(0, str(work))
    try:
        generated = {"check_backends.py": _generate(list(BACKENDS)),
                     "check_bad.py": _generate(["bad_backend"])}
    finally:
        sys.path.remove(str(work))
    for file, gen in generated.items():
        (work / file).write_text(gen.source)
    env = dict(os.environ, MYPYPATH=os.pathsep.join(str(p) for p in {*BACKENDS.values(), work}))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--show-error-codes", "--no-error-summary", *(str(work / f) for f in generated)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), f"mypy failed to run:\n{proc.stdout}\n{proc.stderr}"
    errors: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"(.+?):(\d+): error: ", line)
        if match:
            errors.setdefault(Path(match.group(1)).name, []).append(line)
    yield MypyRun(errors, generated)


def _hook_of(run: MypyRun, file: str, error: str) -> str:
    line = int(error.split(":")[1])
    return run.generated[file].hook_at_line.get(line, f"line {line}")


def test_backends_implement_the_hookspecs_as_typed(mypy_run: MypyRun) -> None:
    """cpu (the reference), fd_x86, the hardware backends and the toy
    backend: every hook they implement takes what the core passes and
    returns what the core expects, and their bodies agree with their own
    annotations."""
    checked = set(mypy_run.generated["check_backends.py"].hook_at_line.values())
    assert {"fd_core.backends.cpu.fd_rms_norm", "fd_x86.backend.fd_decoder_layers",
            "fd_toy_backend.backend.fd_silu_and_mul"} <= checked
    own_files = {"check_backends.py", "cpu.py", "backend.py"}
    found = [e for file, errs in mypy_run.errors.items() if file in own_files for e in errs]
    assert not found, "hook implementations disagree with the hookspecs:\n" + "\n".join(found)


def test_a_mismatched_backend_is_refused_hook_by_hook(mypy_run: MypyRun) -> None:
    errors = mypy_run.errors.get("check_bad.py", [])
    refused = {_hook_of(mypy_run, "check_bad.py", e).removeprefix("bad_backend.") for e in errors}
    assert refused == BAD_HOOKS, "\n".join(errors)


def test_kernel_hooks_state_their_results() -> None:
    """No hookspec returns ``Any`` (general-plugin hooks listed in
    UNTYPED_RESULT excepted)."""
    untyped = [name for name, fn in _specs().items()
               if name not in UNTYPED_RESULT and "Any" in str(inspect.signature(fn).return_annotation)]
    assert not untyped, f"hookspecs returning Any: {untyped}"
