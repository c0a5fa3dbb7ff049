"""The package reads as the pipeline: imports run one way, from the edges (app) down to the core, with no cycle."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import autoprec

PACKAGE = Path(autoprec.__file__).parent
# Lowest first. A module may import from its own layer or the layers below it, never above.
LAYERS = [
    ("core", ("autoprec.core", "autoprec.search_spaces")),
    ("tasks", ("autoprec.tasks",)),
    ("record", ("autoprec.record",)),
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


def layers_of(module: str) -> list[int]:
    """The layers whose prefixes hold ``module``: a package holds its modules, the package root only itself."""
    return [i for i, (_, prefixes) in enumerate(LAYERS)
            if any(module == p or (p != "autoprec" and module.startswith(p + ".")) for p in prefixes)]


def layer(module: str) -> int:
    return layers_of(module)[0]


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


def test_every_module_has_one_layer():
    """A new package must be given its layer here (it fell into the facade's, the top, where it may import anything:
    the root's prefix held every module)."""
    assert {name: layers_of(name) for name in MODULES if len(layers_of(name)) != 1} == {}
    assert layers_of("autoprec.newpackage.module") == []


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


# --- issue 53's checks: each concept once, in the room that owns it ---

TESTS = Path(__file__).parent
BENCHMARKS = PACKAGE.parent / "benchmarks"


def test_no_two_modules_share_a_file_name():
    """A module's file name says one thing in the whole package (``from ... import search`` is never ambiguous)."""
    names = Counter(path.name for path in MODULES.values() if path.name != "__init__.py")
    assert sorted(name for name, n in names.items() if n > 1) == []


def test_every_app_module_reads_in_one_screenful():
    """The orchestration (app/) calls the rooms below it: 400 lines at most a module."""
    long = sorted(f"{name}: {n} lines" for name, path in MODULES.items()
                  if name.startswith("autoprec.app.") and (n := len(path.read_text().splitlines())) > 400)
    assert long == []


def _private_targets(path: Path) -> list[str]:
    """Where a test sets a private name of autoprec: ``monkeypatch.setattr("autoprec...._x", ...)``,
    ``monkeypatch.setattr(module, "_x", ...)`` or ``setattr(module, "_x", ...)`` on an autoprec module."""
    tree = ast.parse(path.read_text())
    modules = {alias.asname or alias.name.split(".")[-1] for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autoprec")
               for alias in node.names}
    modules |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names if alias.name.startswith("autoprec")}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "setattr"
                and node.args):
            continue
        first, name = node.args[0], node.args[1] if len(node.args) > 1 else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("autoprec"):
            if first.value.rsplit(".", 1)[-1].startswith("_"):
                found.append(f"{path.name}:{node.lineno} {first.value}")
        elif (isinstance(first, ast.Name) and first.id in modules and isinstance(name, ast.Constant)
              and isinstance(name.value, str) and name.value.startswith("_") and not name.value.startswith("__")):
            found.append(f"{path.name}:{node.lineno} {first.id}.{name.value}")
    return found


def test_no_test_sets_a_private_name_of_autoprec():
    """Tests reach autoprec through what it offers (a parameter, a public name), so they run the path users run."""
    assert [found for path in sorted(TESTS.glob("*.py")) for found in _private_targets(path)] == []


FIRST_LINE = re.compile(r"splitlines\(\) or \[[^]]*\]\)\[0\]")  # (text.splitlines() or [...])[0]


def test_the_first_line_of_an_exception_is_written_once():
    """autoprec.core.errors.first_line, called everywhere else."""
    found = sorted(f"{name}: {n}" for name, path in MODULES.items()
                   if (n := len(FIRST_LINE.findall(path.read_text()))) and name != "autoprec.core.errors")
    assert found == []
    assert len(FIRST_LINE.findall((PACKAGE / "core" / "errors.py").read_text())) == 1


def test_no_schema_constant_beside_a_reader():
    """A result file is one typed value whose ``from_json`` checks what it reads: results/ holds no module-level
    dict describing a file's structure beside it."""
    found = []
    for name, path in MODULES.items():
        if name.startswith("autoprec.results"):
            for node in ast.parse(path.read_text()).body:
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and node.value.keys
                        and any(isinstance(v, (ast.Name, ast.Dict, ast.Call, ast.List)) for v in node.value.values)):
                    found.append(f"{name}.{node.targets[0].id}")
    assert found == []


def test_what_the_benchmarks_import_exists():
    """The suite runs two benchmarks' --quick (CI runs the rest after it): each name every benchmark imports from
    autoprec must still be there."""
    import importlib

    missing = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("autoprec"):
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and f"{node.module}.{a.name}" not in MODULES]
    assert missing == []
