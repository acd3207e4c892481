"""Importing what a user names as `module:attribute` (environments, reward functions, shaping
hooks), with one-line errors that name the config key. No torch import: config checks use it.

A user's module is imported first in a fresh child interpreter (`probe_import`), then for real in
this process: a module that calls `os._exit` or `sys.exit` at import, or hangs there, would
otherwise end or freeze the trainer with no message. The child waits at most
`SCALERL_IMPORT_TIMEOUT_S` seconds (default 30). A worker process started by the trainer skips the
probe: its parent already made it.
"""

from __future__ import annotations

import difflib
import importlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from typing import Any

from scalerl.errors import ScaleRLError

TIMEOUT_VAR = "SCALERL_IMPORT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0
_MARK = "scalerl-import-probe:"
# The child: the parent's sys.path, one import, one report line. os._exit skips the module's
# atexit hooks and non-daemon threads, which could otherwise hold the child open.
_PROBE = f"""
import importlib, json, os, sys
sys.path[:] = json.loads(sys.argv[2])
try:
    importlib.import_module(sys.argv[1])
    report = {{"ok": True}}
except BaseException as err:
    report = {{"ok": False, "type": type(err).__name__, "message": str(err),
              "missing": err.name if isinstance(err, ModuleNotFoundError) else None}}
sys.stdout.write("\\n{_MARK}" + json.dumps(report) + "\\n")
sys.stdout.flush()
os._exit(0)
"""


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_VAR, "")
    try:
        timeout = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise ScaleRLError(f"{TIMEOUT_VAR}={raw!r}: give the seconds an import may take, e.g. 30")
    return timeout


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def _import_failed(where: str, module_name: str, kind: str, message: str, missing: str | None) -> ScaleRLError:
    if missing is not None and (module_name == missing or module_name.startswith(missing + ".")):
        return ScaleRLError(f"{where}: cannot import module '{module_name}' ({kind}: {_first_line(message)}); modules are "
                            "looked for in the current folder, the --config YAML's folder and PYTHONPATH: check the "
                            "spelling or put the file in one of them")
    if missing is not None:
        return ScaleRLError(f"{where}: module '{module_name}' imports '{missing}', which is not installed; install it")
    return ScaleRLError(f"{where}: importing module '{module_name}' raised {kind}: {_first_line(message)}; fix the module")


def _how_it_ended(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def probe_import(module_name: str, where: str) -> None:
    """Import `module_name` in a child interpreter; a one-line ScaleRLError if that import raises,
    exits or does not finish within the timeout."""
    timeout = _timeout_s()
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, module_name, json.dumps(sys.path)], capture_output=True,
                              text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ScaleRLError(f"{where}: importing module '{module_name}' did not finish within {timeout:g} s; a module must "
                           f"not block at import (or set {TIMEOUT_VAR} to wait longer)") from None
    reports = [line[len(_MARK):] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if not reports:
        raise ScaleRLError(f"{where}: importing module '{module_name}' ended the process ({_how_it_ended(proc.returncode)}); "
                           "a module must not exit at import")
    report = json.loads(reports[-1])
    if not report["ok"]:
        raise _import_failed(where, module_name, report["type"], report["message"], report["missing"])


def import_module(module_name: str, where: str) -> Any:
    """The module, probed in a child first unless it is already imported or this is a worker process. The current
    folder is searched too (after the import path's own entries), as `python -m` would: a reward module beside the
    command needs no PYTHONPATH=."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    if module_name not in sys.modules and multiprocessing.parent_process() is None:
        probe_import(module_name, where)
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # the probe passed, yet this import failed: the same one-line report
        raise _import_failed(where, module_name, type(err).__name__, str(err),
                             err.name if isinstance(err, ModuleNotFoundError) else None) from err


def import_object(spec: str, where: str, example: str = "my_pkg.module:name") -> Any:
    """The object named by 'module:attribute' (dots allowed on both sides: a nested attribute)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ScaleRLError(f"{where}: '{spec}' is not 'module:attribute', e.g. {example}")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ScaleRLError(f"{where}: '{module_name}' is not a module name (dotted Python identifiers), e.g. {example}")
    module = import_module(module_name, where)
    target: Any = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        owner, target = target, getattr(target, part, None)
        if target is None:
            close = difflib.get_close_matches(part, [name for name in dir(owner) if not name.startswith("_")], n=1)
            hint = f"; did you mean '{module_name}:{'.'.join([*parts[:i], close[0]])}'?" if close else ""
            raise ScaleRLError(f"{where}: module '{module_name}' has no attribute '{attr}'{hint}")
    return target


def import_function(spec: str, where: str) -> Any:
    """`import_object`, checked to be callable."""
    fn = import_object(spec, where, example="my_pkg.rewards:exact_match")
    if not callable(fn):
        raise ScaleRLError(f"{where}: '{spec}' is a {type(fn).__name__}, not a function")
    return fn
