"""The package reads as the pipeline: imports run one way, from the edges (app) down to the core, with no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import autoprec

PACKAGE = Path(autoprec.__file__).parent
# Lowest first. A module may import from its own layer or the layers below it, never above.
LAYERS = [
    ("core", ("autoprec.core", "autoprec.search_spaces")),
    ("sources", ("autoprec.analysis", "autoprec.zoo")),
    ("lower", ("autoprec.lower",)),
    ("backends", ("autoprec.backends",)),
    ("measure", ("autoprec.measure",)),
    ("study", ("autoprec.study",)),
    ("results", ("autoprec.results",)),
    ("export", ("autoprec.export",)),
    ("app", ("autoprec.app",)),
    ("facade", ("autoprec.api", "autoprec")),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    return next(i for i, (_, prefixes) in enumerate(LAYERS)
                if any(module == p or module.startswith(p + ".") for p in prefixes))


def imported(path: Path) -> set[str]:
    """The autoprec modules a file imports, at module level or inside functions. ``from autoprec import
    __version__`` is the package's version, not an import of what the package root re-exports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("autoprec.")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == "autoprec"
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in MODULES:
                    found.add(sub)
                elif not (node.module == "autoprec" and alias.name == "__version__"):
                    found.add(node.module)
    return found


GRAPH = {name: imported(path) - {name} for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    assert all(layer(name) >= 0 for name in MODULES)


def test_imports_never_go_up_a_layer():
    upward = sorted(f"{name} ({LAYERS[layer(name)][0]}) imports {other} ({LAYERS[layer(other)][0]})"
                    for name, others in GRAPH.items() for other in others if layer(other) > layer(name))
    assert upward == []


def test_no_import_cycle():
    """Strongly connected components of the import graph, each of one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in GRAPH.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert cycles == []


def test_no_function_is_longer_than_80_lines():
    """A function you can read at once (ruff's mccabe limit, in pyproject.toml, bounds its branches)."""
    long = sorted(f"{module_name(path)}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
                  for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80)
    assert long == []


def test_ruff_passes():
    """pyproject.toml's lint rules (pycodestyle, pyflakes, import order, mccabe <= 15) hold everywhere."""
    import subprocess
    import sys

    repo = PACKAGE.parent
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "autoprec", "tests", "benchmarks"], cwd=repo,
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stdout[-3000:]
