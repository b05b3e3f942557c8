"""The import rules of DESIGN.md, checked: each package's ``__init__`` docstring
says what it may import ("May import: fd_core.ops, fd_core.backends (types), ...")
and no module of it imports another fd_core package beyond that, at module level
or inside a function; the graph of fd_core's packages and top-level modules has
no cycle. ``fd_core/__init__``'s lazy re-exports (``fd_core.LLM``, ...) are the
facade above everything and are not part of the graph."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "fd_core"
_RULE = re.compile(r"May import:?(.*?)(?:\.\s|\.$|$)", re.S)
_NAME = re.compile(r"fd_core\.(\w+)(\s*\((types?[^)]*)\))?")


def _node(module: str) -> str:
    """fd_core.ops.linear -> ops; fd_core.config -> config; "" for the fd_core facade's
    names (``from fd_core import LLM``)."""
    parts = module.split(".")
    if len(parts) < 2 or not ((ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").is_file()):
        return ""
    return parts[1]


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported fd_core module, line, under TYPE_CHECKING) for every absolute fd_core import."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            guarded = typing_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.ImportFrom) and not child.level and child.module:
                if child.module == "fd_core":
                    found.extend((f"fd_core.{a.name}", child.lineno, guarded) for a in child.names)
                elif child.module.startswith("fd_core."):
                    found.append((child.module, child.lineno, guarded))
            elif isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, guarded) for a in child.names if a.name.startswith("fd_core."))
            visit(child, guarded)

    visit(ast.parse(path.read_text()), False)
    return found


def _packages() -> dict[str, Path]:
    return {p.parent.name: p for p in sorted(ROOT.glob("*/__init__.py"))}


def _rules(init: Path) -> tuple[set[str], set[str]]:
    """(packages it may import, packages it may import for types only) from its docstring."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    match = _RULE.search(doc)
    assert match, f"{init.relative_to(ROOT.parent)}: its docstring must say 'May import: ...'"
    anything, types = set(), set()
    for name, _, note in _NAME.findall(match.group(1)):
        (types if note else anything).add(name)
    return anything, types


def test_every_package_keeps_its_import_rule() -> None:
    broken = []
    for name, init in _packages().items():
        if name == "testing":  # test tooling may use the whole engine
            continue
        anything, types = _rules(init)
        for path in init.parent.rglob("*.py"):
            for module, line, typing_only in _imports(path):
                target = _node(module)
                if target in (name, "") or target in anything or (typing_only and target in types):
                    continue
                broken.append(f"{path.relative_to(ROOT.parent)}:{line} imports {module}")
    assert not broken, "imports beyond the package's 'May import' rule:\n" + "\n".join(broken)


def test_the_package_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel == Path("__init__.py"):
            continue
        source = rel.parts[0].removesuffix(".py")
        for module, _, typing_only in _imports(path):
            target = _node(module)
            if not typing_only and target and target != source:
                graph[source].add(target)
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle between fd_core packages: " + " -> ".join(cycle or [])


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None
