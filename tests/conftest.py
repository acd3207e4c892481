"""Shared helpers: a tiny, fast training config on the built-in model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import inprocess
import pytest

ROOT = Path(__file__).resolve().parents[1]

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2` on 2 cores: one thread per worker (and its subprocesses), no oversubscription
    os.environ["OMP_NUM_THREADS"] = "1"

# precision.mode=auto (the default) chooses by a timing probe (scalerl/precision/probe.py): the suite pins the probe's
# rates to a tie, so auto runs fp32 and no explicit mode is warned about, on any machine and load (subprocesses inherit it).
# tests/precision/test_auto_precision.py injects its own.
os.environ["SCALERL_PRECISION_RATES"] = "fp32:1,bf16:1"


def tiny_overrides(run_dir: Path, name: str, **extra) -> dict:
    """A few seconds of training: 4 prompts x 4 completions, 6 steps, 16 held-out tasks."""
    overrides = {
        "rollout.prompts_per_step": 4, "rollout.group_size": 4, "train.steps": 6, "train.threads": 1,
        "eval.every": 3, "eval.max_tasks": 16, "log.run_dir": str(run_dir), "log.name": name, "log.console": "none",
    }
    overrides.update(extra)
    return overrides


def run_cli(*args: str, timeout: float = 300, env: dict | None = None, process: bool = False) -> subprocess.CompletedProcess:
    """Run a console entry point of this checkout (`python -m ...`), capturing its output: in this process for the
    entry points of tests/inprocess.py (the same exit code and output, without a new interpreter's imports), unless
    `process` (the test needs a process of its own), `env` is given (PYTHONPATH, HF_HUB_OFFLINE and the like are read
    when a process starts or a library is imported) or the command is not one of them. Past `timeout`, a process is
    killed; in this process, the test process exits (tests/inprocess.py)."""
    if not process and not env and len(args) > 1 and args[0] == "-m" and args[1] in inprocess.ENTRY_POINTS:
        return inprocess.run_module(args[1], list(args[2:]), {"OMP_NUM_THREADS": "1"}, ROOT, timeout)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker (`pytest -n 2`), tests marked `serial` (they measure the machine's load, which the
    other worker changes) are skipped; the test command's second part, `pytest -m serial`, runs them alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    skip = pytest.mark.skip(reason="measures the machine's load: runs alone in `python -m pytest -q -m serial`")
    for item in items:
        if item.get_closest_marker("serial"):
            item.add_marker(skip)


def pytest_addoption(parser):
    parser.addoption("--reliability-doc", default=None, metavar="PATH",
                     help="write the fault-injection suite's table of faults and outcomes (tests/reliability/) to PATH")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


# The fault-injection suite's record (tests/reliability/): each fault test says what it tried and saw.
#
#     def test_x(fault):
#         ...  # inject the fault for real, measure what happened
#         fault("checkpoints", "SIGTERM mid-step, default checkpoint.every=0", f"exit 0, resumed from step {k}")
#
# A row counts as "held" only when its test passed; a test that fails after recording marks its rows
# "FAILED". `python -m pytest tests/reliability --reliability-doc docs/reliability.md` (the slow tests
# included) writes the table of every fault tried and its outcome; the doc is generated, never edited.

_ROWS: list[dict] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.failed):
        item._fault_verdict = "held" if report.passed else "FAILED"


@pytest.fixture
def fault(request):
    """record(area, fault, outcome): one row of docs/reliability.md, kept when the test ends."""
    rows: list[dict] = []

    position = request.session.items.index(request.node)  # the table follows collection order, whichever worker ran it

    def record(area: str, fault: str, outcome: str) -> None:
        rows.append({"area": area, "fault": fault, "outcome": outcome, "test": request.node.nodeid, "pos": position})

    yield record
    verdict = getattr(request.node, "_fault_verdict", "FAILED")
    _ROWS.extend({**row, "verdict": verdict} for row in rows)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: the controller gathers the rows each worker recorded (see pytest_sessionfinish)."""
    _ROWS.extend(json.loads(node.workeroutput.get("fault_rows", "[]")))


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # an xdist worker: hand the rows to the controller
        session.config.workeroutput["fault_rows"] = json.dumps(_ROWS)
        return
    target = session.config.getoption("--reliability-doc", default=None)
    if not target or not _ROWS:
        return
    order = {}
    for row in sorted(_ROWS, key=lambda r: r["pos"]):
        order.setdefault(row["area"], len(order))
    rows = sorted(_ROWS, key=lambda r: (order[r["area"]], r["pos"]))
    held = sum(r["verdict"] == "held" for r in rows)
    areas = ", ".join(f"{area} {sum(r['area'] == area for r in rows)}" for area in order)
    lines = [
        "# Reliability: every fault tried, and what happened",
        "",
        "Generated by the fault-injection suite (`tests/reliability/`); do not edit by hand. Regenerate with",
        "",
        "    python -m pytest tests/reliability --reliability-doc docs/reliability.md",
        "",
        f"What was tried: {len(rows)} faults, injected by {len({r['test'] for r in rows})} tests ({areas}); {held} held, "
        f"{len(rows) - held} FAILED. A fault that is not in this table was not tried.",
        "*held*: the test that injected the fault passed, so the outcome column is what its assertions checked;",
        "*FAILED*: the test failed and the outcome is what it expected.",
        "",
        "| area | fault injected | outcome | verdict | test |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["area"], r["fault"], re.sub(r"/\S*?pytest-of-[^/]+/pytest-\d+/", "<tmp>/", r["outcome"]), r["verdict"],
                 f"`{r['test'].removeprefix('tests/reliability/')}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    Path(target).write_text("\n".join(lines) + "\n")


def pytest_runtest_logreport(report):
    """SCALERL_TEST_TIMES=PATH: each test's phase durations appended as they finish (a partial run still says where the time went)."""
    path = os.environ.get("SCALERL_TEST_TIMES")
    if path and report.when in ("setup", "call", "teardown"):
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.nodeid}\n")
