"""Developer sessions: `nox -s tests`, `lint`, `typecheck`, `conformance`.

Each session installs what it needs into its own virtual environment; the
backend packages under backends/ and the toy third-party backend used by the
tests are installed alongside fd-core.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
ROOT = Path(__file__).parent
BACKENDS = sorted(str(p) for p in (ROOT / "backends").glob("fd_*") if (p / "pyproject.toml").exists())
TOY = str(ROOT / "tests" / "plugins" / "fd_toy_backend")


def _install_all(session: nox.Session) -> None:
    session.install("torch==2.13.0")
    session.install("-e", ".[cpu,test]")
    for path in [*BACKENDS, TOY]:
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
    session.run("mypy", "fd_core")


@nox.session
@nox.parametrize("backend", ["cpu", "cuda", "xpu", "iluvatar", "dcu", "gcu"])
def conformance(session: nox.Session, backend: str) -> None:
    """Check a backend's kernels against the CPU reference (skips if absent)."""
    _install_all(session)
    session.run("python", "-m", "pytest", "-p", "fd_core.testing.conformance",
                "--fd-backend", backend, "-q", *session.posargs)
