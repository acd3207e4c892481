"""The code's shape, checked: no import circles between modules or between the package's folders,
folders that are roles (the rollout side and the learner never import each other or the training
job), a ground floor that imports nothing of the project, a schema that imports no component, no
function over 80 lines and no file over 600, and the path from `scalerl train` to the objective
at most 6 calls with the config checked once. (`python -m pytest tests/test_layout.py`.)"""

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


# The one module of config/ that looks outside the config (model folders, reward modules, environments): it sits
# above the components, which import the schema, so it is a node of its own.
CONFIG_CHECKS = "scalerl.config.checks"


def _folder(module: str) -> str:
    """scalerl.trainer.loop -> trainer; scalerl.config (the package) -> config; scalerl.types -> scalerl.types."""
    if module == CONFIG_CHECKS:
        return module
    parts = module.split(".")
    if len(parts) == 1:  # the package itself (scalerl/__init__.py)
        return module
    if len(parts) > 2 or (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return module


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
    assert graph.get("scalerl.config.plan", set()) == set()
    config = {_module_name(p) for p in (PACKAGE / "config").glob("*.py")} - {CONFIG_CHECKS}
    assert config, "the config package moved"
    for module in config:  # the schema, its loading and the resume rules: the config, the errors and atomic writes only
        assert graph[module] <= config | {"scalerl.errors", "scalerl.files"}, (module, graph[module])
    assert not [m for m, targets in graph.items() if CONFIG_CHECKS in targets and _folder(m) not in ("config", "trainer", "cli", "jobs")]


ROLES = {  # folder -> the folders it must never import
    "rollout": {"learner", "trainer", "jobs", "cli"},
    "learner": {"rollout", "trainer", "jobs", "cli"},
    "trainer": {"jobs", "cli"},
}


def test_roles_do_not_import_each_other_or_the_job():
    """The rollout side (a producer process imports it alone) and the learner meet only in the training job."""
    crossings = [f"{m} imports {t}" for m, targets in _imports().items() for t in targets
                 if _folder(t) in ROLES.get(_folder(m), set())]
    assert crossings == []


def test_no_file_over_600_lines():
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600]
    assert long == []


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


HOPS_DRIVER = r"""
import json, sys
from pathlib import Path
import scalerl.config.checks as checks
import scalerl.learner.learner as learner_module
from scalerl.cli.main import app

root = Path(checks.__file__).resolve().parents[2]
seen = {"chain": None, "checks": 0}
real_objective, real_check = learner_module.rl_objective, checks.check_config

def objective(*args, **kwargs):  # walk the real stack from the objective's caller up to the CLI's train command
    if seen["chain"] is None:
        chain, frame = ["scalerl/algorithms/objective.py:rl_objective"], sys._getframe(1)
        while frame is not None:
            path = Path(frame.f_code.co_filename).resolve()
            chain.append(f"{path.relative_to(root) if path.is_relative_to(root) else path}:{frame.f_code.co_name}")
            if chain[-1] == "scalerl/cli/main.py:train":
                break
            frame = frame.f_back
        seen["chain"] = chain[::-1]
    return real_objective(*args, **kwargs)

def check_config(config):
    seen["checks"] += 1
    return real_check(config)

learner_module.rl_objective, checks.check_config = objective, check_config
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    print("HOPS " + json.dumps(seen))
"""


def test_scalerl_train_reaches_the_objective_in_at_most_6_calls_and_checks_the_config_once(tmp_path):
    """A 1-step `scalerl train`, with the stack walked when `rl_objective` runs: every frame between the CLI's
    train command and the objective counts (README's code map shows the same path, file:function per hop)."""
    import json

    from conftest import run_cli

    sets = {"rollout.prompts_per_step": 2, "rollout.group_size": 2, "train.threads": 1, "eval.every": 0, "eval.max_tasks": 2,
            "log.run_dir": str(tmp_path), "log.console": "none", "log.tensorboard": False}
    args = ["train", "--name", "hops", "--steps", "1", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]
    out = run_cli("-c", HOPS_DRIVER, *args, timeout=240)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("HOPS ")), None)
    assert out.returncode == 0 and line is not None, out.stderr[-2000:]
    seen = json.loads(line[5:])
    chain = seen["chain"]
    assert chain[0] == "scalerl/cli/main.py:train", chain
    assert len(chain) - 1 <= 6, " -> ".join(chain)
    assert seen["checks"] == 1
