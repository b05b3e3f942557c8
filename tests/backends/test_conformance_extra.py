"""``pip install fd-core[conformance]`` brings everything the conformance kit imports."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import fd_core.testing

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
# modules the kit reaches (its package and the testing helpers it uses)
KIT = [*Path(fd_core.testing.__file__).parent.joinpath("conformance").glob("*.py"),
       Path(fd_core.testing.__file__).parent / "checkpoints.py",
       Path(fd_core.testing.__file__).parent / "greedy.py"]
# import name -> distribution, where they differ
DISTRIBUTIONS = {"yaml": "pyyaml", "xdist": "pytest-xdist"}
PADDLE = {"paddle"}  # comes with the backend's own paddle build, never with fd-core


def third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "fd_core"}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_conformance_extra_covers_the_kits_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["conformance"]
    provided = requirement_names(project["dependencies"]) | requirement_names(extra)
    assert "pytest" in requirement_names(extra)
    imported = set().union(*(third_party_imports(p) for p in KIT)) - PADDLE
    missing = {n for n in imported if DISTRIBUTIONS.get(n, n).replace("_", "-") not in provided}
    assert not missing, f"the conformance kit imports {sorted(missing)}; add them to the conformance extra"
