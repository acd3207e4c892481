"""The code's shape, checked: no import circles between modules or between the package's folders,
a ground floor that imports nothing of the project, a schema that imports no component, no
function over 80 lines. (`python -m pytest tests/test_layout.py` is how to check it.)"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "scalerl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module → the scalerl modules it imports anywhere (top level or inside functions)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scalerl"):
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("scalerl")]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else module  # scalerl.trainer.loop -> trainer; scalerl.config -> scalerl.config


def test_no_import_circles_between_modules_or_folders():
    graph = _imports()
    assert _cycles(graph) == []
    folders: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        folders[_folder(module)] |= {_folder(t) for t in targets if _folder(t) != _folder(module)}
    assert _cycles(folders) == [], dict(folders)


def test_ground_floor_and_schema_import_no_component():
    graph = _imports()
    assert graph.get("scalerl.types", set()) == set()
    assert graph.get("scalerl.plan", set()) == set()
    assert graph.get("scalerl.config", set()) <= {"scalerl.errors", "scalerl.plan"}


def test_ground_floor_imports_without_torch():
    """Reward-function workers unpickle Task and Completion: importing them must not pull in torch."""
    import subprocess
    import sys

    code = "import sys, scalerl.types, scalerl.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "False"


def test_no_function_over_80_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
