"""The `code` environment: reward = fraction of unit tests passed, run in the sandbox."""

from __future__ import annotations

import json
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from conftest import run_cli, tiny_overrides
from scalerl.types import Completion, Task
from scalerl.envs.code import CodeConfig, CodeEnv, extract_code, passed_tests, score_solution
from scalerl.envs.registry import build_env, validate_env_args
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_metrics

TESTS = ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3", "assert f(4) == 4"]


def _c(text: str) -> Completion:
    return Completion(text=text, token_ids=(), finished=True)


@pytest.fixture(scope="module")
def env():
    return CodeEnv()


@pytest.mark.parametrize(
    "solution, reward",
    [
        ("def f(x):\n    return x\n", 1.0),
        ("def f(x):\n    return x if x <= 2 else 0\n", 0.5),  # passes tests 0 and 1 of 4
        ("def f(x):\n    if x == 3:\n        raise ValueError\n    return x\n", 0.75),  # one test crashes, the rest run
        ("def f(x) return x", 0.0),  # syntax error
        ("import sys\nsys.exit(0)\n", 0.0),  # exits while loading
        ("def g(x):\n    return x\n", 0.0),  # not the entry point
        ("", 0.0),
    ],
)
def test_reward_is_the_fraction_of_tests_passed(solution, reward):
    assert score_solution(solution, TESTS, entry_point="f") == reward


def test_printed_pass_lines_without_the_nonce_earn_nothing():
    spoof = ("import sys\nfor i in range(4):\n    print(f'{i} pass')\n    print(f'0 {i} pass')\n"
             "sys.stdout.flush()\ndef f(x):\n    return -1\n")
    assert score_solution(spoof, TESTS) == 0.0


def test_tests_finished_before_a_timeout_still_count():
    solution = "def f(x):\n    while x == 3:\n        pass\n    return x\n"
    assert score_solution(solution, TESTS, timeout_s=1.5) == 0.5  # tests 0, 1 pass; 2 hangs; 3 never runs


def test_passed_tests_parses_only_exact_lines_with_the_nonce():
    out = "n 0 pass\nn 1 fail\nn 2 pass extra\nm 3 pass\nn 9 pass\nn 3 pass\nn 3 pass\n"
    assert passed_tests(out, "n", 4) == {0, 3}


def test_extract_code_takes_the_first_fenced_block():
    assert extract_code("here:\n```python\ndef f(): pass\n```\nbye") == "def f(): pass\n"
    assert extract_code("```\nx = 1\n") == "x = 1\n"  # cut off before the closing fence
    assert extract_code("def f(): pass") == "def f(): pass"


def test_builtin_reference_solutions_score_one_and_garbage_zero(env):
    tasks = env.eval_tasks()[:4]
    for task in tasks:
        assert env.score(task, _c(f"```python\n{task.meta['solution']}```")) == 1.0, task.prompt
    assert env.score(tasks[0], _c("3+4=7 ab")) == 0.0  # what the built-in char model writes


def test_split_is_disjoint_deterministic_and_sized(env):
    train, held_out = env.train_tasks(), env.eval_tasks()
    assert (len(train), len(held_out)) == (30, 10)  # 40 tasks, eval_fraction 0.25
    assert not {t.prompt for t in train} & {t.prompt for t in held_out}
    assert [t.prompt for t in CodeEnv().eval_tasks()] == [t.prompt for t in held_out]
    assert [t.prompt for t in CodeEnv(CodeConfig(split_seed=1)).eval_tasks()] != [t.prompt for t in held_out]
    assert all(t.prompt.endswith("\n") and t.meta["tests"] for t in train)


def test_data_file_is_read_and_checked(tmp_path):
    good = tmp_path / "tasks.jsonl"
    good.write_text("".join(json.dumps({"prompt": f"p{i}", "tests": ["assert True"], "level": i}) + "\n" for i in range(4)))
    env = CodeEnv(CodeConfig(data_path=good, eval_fraction=0.5, prompt_suffix=""))
    assert sorted(t.prompt for t in env.train_tasks() + env.eval_tasks()) == ["p0", "p1", "p2", "p3"]
    assert env.score(env.train_tasks()[0], _c("")) == 1.0  # `assert True` passes against anything
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "tests": []}\n')
    with pytest.raises(ScaleRLError, match=r"bad.jsonl:1: .*non-empty list"):
        CodeEnv(CodeConfig(data_path=bad))
    with pytest.raises(ScaleRLError, match="does not exist"):
        CodeEnv(CodeConfig(data_path=tmp_path / "missing.jsonl"))


def test_registered_by_name_with_validated_args():
    assert isinstance(build_env("code", {"timeout_s": 2}), CodeEnv)
    with pytest.raises(ScaleRLError, match="env.args.timeout"):
        validate_env_args("code", {"timeout": 2})


def _score_in_worker(env: CodeEnv, task: Task, text: str) -> float:
    return env.score(task, _c(text))


def test_env_pickles_and_scores_from_worker_processes(env):
    # forkserver, as the reward worker pool starts its workers (never fork after torch threads)
    clone = pickle.loads(pickle.dumps(env))
    task = clone.eval_tasks()[0]
    texts = [task.meta["solution"], "not python", task.meta["solution"]]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
        rewards = list(pool.map(_score_in_worker, [clone] * 3, [task] * 3, texts))
    assert rewards == [1.0, 0.0, 1.0]


@pytest.mark.slow
def test_trainer_runs_with_the_code_env(runs):
    """The built-in char model cannot write Python (its prompts here exceed its 64 positions, so they are cut
    to their last 56 tokens by rollout.truncate_prompts=left, and its vocabulary lacks newlines): the point is
    that the whole loop runs and scores it 0."""
    overrides = tiny_overrides(runs, "code", **{"env.name": "code", "train.steps": 2, "rollout.prompts_per_step": 2,
                                                "rollout.group_size": 2, "rollout.max_new_tokens": 8, "eval.every": 2,
                                                "eval.max_tasks": 2, "rollout.truncate_prompts": "left"})
    proc = run_cli("-m", "scalerl.cli.main", "train", *[a for k, v in overrides.items() for a in ("--set", f"{k}={v}")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(runs / "code")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward_mean"] == 0.0 for r in rows)
    assert [r["prompts_truncated"] for r in rows] == [2, 2]  # every code prompt is longer than 56 tokens
    summary = json.loads((runs / "code" / "summary.json").read_text())
    assert summary["pass_rate_before"] == summary["pass_rate_after"] == 0.0
