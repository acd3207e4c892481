"""Built-in `code` environment: write a Python function, scored by unit tests run in a sandbox.

A task is a prompt asking for one function plus its tests (`assert` statements). The completion is
Python source (the first fenced ``` block if there is one, else the whole text). The solution and
all tests run in one sandboxed process (`scalerl.envs.sandbox`: time, CPU, memory, process and
network limits); each test is guarded, so one failure does not stop the others.

Reward = (tests passed) / (tests), in [0, 1]: 1.0 for a correct function, 0.5 for one passing half
the tests, 0 for a syntax error, a crash on load, a missing `entry_point` or a timeout before any
test finished (tests that finished before a timeout still count).

The harness reports each test as a line `<nonce> <i> pass|fail` on the sandbox's results channel
(file descriptor 3, duplicated before the solution runs), so a solution that prints more than the
stdout cap, or closes or redirects stdout, still gets its results; the nonce is 128 random bits per run, handed over on stdin and read
before the solution is loaded, so a solution printing "pass" lines earns nothing. This stops
accidental and naive spoofing, not a solution that inspects the harness's frames in memory (it
runs in the same interpreter); the sandbox, not the nonce, is the security boundary.

Scoring is a pure function of (task, completion, limits): no shared state, and the environment
pickles, so worker processes may call `score` in parallel.
"""

from __future__ import annotations

import random
import re
import secrets
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalerl.envs.base import pop_prompt, renamed_args
from scalerl.envs.sandbox import run_sandboxed
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.types import Completion, Task

HARNESS = '''\
import os, sys


def _run_tests(solution, tests, entry_point):
    nonce = sys.stdin.readline().strip()
    out = os.dup(3)  # the results channel, kept even if the solution closes descriptor 3
    os.close(3)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    namespace = {"__name__": "solution"}
    try:
        exec(compile(solution, "solution.py", "exec"), namespace)
        if entry_point is not None and not callable(namespace.get(entry_point)):
            raise NameError(f"the solution defines no function {entry_point!r}")
    except BaseException as exc:
        os.write(2, f"solution failed to load: {type(exc).__name__}: {exc}\\n".encode())
        return
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"test_{i}", "exec"), namespace)
            verdict = "pass"
        except BaseException as exc:
            verdict = "fail"
            os.write(2, f"test {i} failed: {type(exc).__name__}: {exc}\\n".encode())
        os.write(out, f"{nonce} {i} {verdict}\\n".encode())


_run_tests(SOLUTION, TESTS, ENTRY_POINT)
'''
FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
DATA_FILE = "code_tasks.jsonl"


class CodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        return renamed_args(data, "code", {"data_path": "data_file"})

    data_file: Path | None = Field(None, description="JSONL of {prompt, tests: [assert ...], entry_point?}; "
                                                     "default: the 40 built-in tasks (older name: data_path).")
    eval_fraction: float = Field(0.25, gt=0, lt=1, description="Share of tasks held out for the greedy pass rate.")
    split_seed: int = Field(0, description="Seed of the one shuffle that splits held-out from training tasks.")
    prompt_suffix: str = Field("\n", description="Appended to every string prompt (e.g. a chat turn marker); "
                                                 "not to a list of messages, whose turns the chat template marks.")
    timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit for one completion's tests, in seconds.")
    cpu_s: int = Field(5, ge=1, description="CPU-time limit (RLIMIT_CPU) for one completion's tests, in seconds.")
    memory_mb: int = Field(512, ge=64, description="Address-space limit (RLIMIT_AS) of the test process, in MiB.")
    max_processes: int = Field(8, ge=1, description="Most processes the tested code may run at once.")
    isolation: Literal["auto", "namespaces", "process"] = Field(
        "auto", description="Sandbox level: namespaces (strong, Linux user namespaces), process (weaker "
                            "fallback: rlimits + audit hooks), or auto (the strongest available).")


def read_code_tasks(path: Path, suffix: str = "") -> list[Task]:
    """Tasks from a JSONL file: `prompt` (a string, or a list of {role, content} messages, TRL's
    conversational format, also as a `messages` field), `tests` (non-empty list of str), optional
    `entry_point` (str); any other field goes to `meta` too. `suffix` ends a string prompt; messages
    go into `meta["messages"]` as they are, for the chat template to mark the turns."""
    tasks = []
    for i, row in read_objects(path, expected="'prompt' and 'tests'", where="env.args.data_file"):
        prompt, tests = pop_prompt(row, f"env.args.data_file: {path}:{i}"), row.get("tests")
        if prompt is None or not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ScaleRLError(f"{path}:{i}: 'prompt' must be a string or a list of messages and 'tests' a non-empty list of strings")
        if not isinstance(row.get("entry_point", ""), str):
            raise ScaleRLError(f"{path}:{i}: 'entry_point' must be a function name (a string)")
        text, messages = prompt
        if messages is None:
            tasks.append(Task(prompt=text + suffix, answer=None, meta=row))
        else:
            tasks.append(Task(prompt=text, answer=None, meta={**row, "messages": messages}))
    return tasks

def extract_code(text: str) -> str:
    """The first fenced ``` block of `text` (an unclosed one runs to the end), else all of it."""
    match = FENCE.search(text)
    return match.group(1) if match else text


def harness_program(solution: str, tests: list[str], entry_point: str | None) -> str:
    """The Python program that loads `solution` and runs each test, reporting with the stdin nonce."""
    return f"SOLUTION = {solution!r}\nTESTS = {tests!r}\nENTRY_POINT = {entry_point!r}\n" + HARNESS


def passed_tests(stdout: str, nonce: str, n_tests: int) -> set[int]:
    """Indices i < n_tests with a line exactly `<nonce> <i> pass`."""
    passed = set()
    for line in stdout.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[2] == "pass" and parts[1].isdigit() and int(parts[1]) < n_tests:
            passed.add(int(parts[1]))
    return passed


def score_solution(solution: str, tests: list[str], *, entry_point: str | None = None, timeout_s: float = 5.0,
                   cpu_s: int = 5, memory_bytes: int = 512 << 20, max_processes: int = 8,
                   isolation: Literal["auto", "namespaces", "process"] = "auto") -> float:
    """Fraction of `tests` that pass against `solution`, all run in one sandboxed process."""
    nonce = secrets.token_hex(16)
    result = run_sandboxed(harness_program(solution, tests, entry_point), timeout_s=timeout_s, cpu_s=cpu_s,
                           memory_bytes=memory_bytes, max_processes=max_processes, network=False,
                           stdin=(nonce + "\n").encode(), isolation=isolation)
    return len(passed_tests(result.results, nonce, len(tests))) / len(tests)


class CodeEnv:
    Config = CodeConfig

    def __init__(self, config: CodeConfig | None = None):
        self.config = config or CodeConfig()
        c = self.config
        if c.data_file is not None:
            tasks = read_code_tasks(c.data_file, c.prompt_suffix)
        else:
            with resources.as_file(resources.files("scalerl.envs") / "data" / DATA_FILE) as path:
                tasks = read_code_tasks(path, c.prompt_suffix)
        if len(tasks) < 2:
            raise ScaleRLError(f"env.args.data_file: {len(tasks)} task cannot be split into training and held-out sets; add more")
        random.Random(c.split_seed).shuffle(tasks)
        n_eval = min(len(tasks) - 1, max(1, round(c.eval_fraction * len(tasks))))
        self._eval, self._train = tasks[:n_eval], tasks[n_eval:]

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def score(self, task: Task, completion: Completion) -> float:
        c = self.config
        return score_solution(extract_code(completion.text), task.meta["tests"], entry_point=task.meta.get("entry_point"),
                              timeout_s=c.timeout_s, cpu_s=c.cpu_s, memory_bytes=c.memory_mb << 20,
                              max_processes=c.max_processes, isolation=c.isolation)
