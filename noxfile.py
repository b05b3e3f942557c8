"""Developer sessions: `nox -s tests`, `lint`, `typecheck`, `conformance`.

Each session installs what it needs into its own virtual environment; the
backend packages under backends/ and the test plugins under tests/plugins/
(a toy third-party backend, a scripted model) are installed alongside fd-core.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
ROOT = Path(__file__).parent
BACKENDS = sorted(str(p) for p in (ROOT / "backends").glob("fd_*") if (p / "pyproject.toml").exists())
TEST_PLUGINS = sorted(str(p) for p in (ROOT / "tests" / "plugins").glob("fd_*") if (p / "pyproject.toml").exists())


def _install_all(session: nox.Session) -> None:
    session.install("torch==2.13.0")
    session.install("-e", ".[cpu,test]")
    for path in [*BACKENDS, *TEST_PLUGINS]:
        session.install("--no-build-isolation", "-e", path)


@nox.session
def tests(session: nox.Session) -> None:
    """The default (fast) suite; pass `-- -m slow` for the slow tests."""
    _install_all(session)
    session.run("python", "-m", "pytest", "-n", "2", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "fd_core", "backends", "tests", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("mypy", "-e", ".[cpu]")
    session.run("mypy", "fd_core", "backends/fd_x86/fd_x86", env={"MYPYPATH": "backends/fd_x86"})


@nox.session
@nox.parametrize("backend", ["cpu", "cuda", "xpu", "iluvatar", "dcu", "gcu"])
def conformance(session: nox.Session, backend: str) -> None:
    """Check a backend's kernels against the CPU reference (skips if absent)."""
    _install_all(session)
    session.run("python", "-m", "pytest", "-p", "fd_core.testing.conformance",
                "--fd-backend", backend, "-q", *session.posargs)
