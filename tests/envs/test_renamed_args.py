"""One spelling per concept across the environments (data_file, eval_size); the older spellings (train_file, data_path,
file, num_eval) still work, with one deprecation warning naming the new key."""

from __future__ import annotations

import logging

import pytest

from scalerl.envs import base
from scalerl.envs.registry import ENVIRONMENTS, build_env, validate_env_args
from scalerl.errors import ScaleRLError
from tests.conftest import run_cli

OLD = [("arithmetic", "train_file", "data_file"), ("arithmetic", "num_eval", "eval_size"), ("calculator", "num_eval", "eval_size"),
       ("math", "data_path", "data_file"), ("code", "data_path", "data_file"), ("reward_model", "file", "data_file"),
       ("reward_model", "num_eval", "eval_size")]


def test_one_name_per_concept():
    for name, cls in ENVIRONMENTS.items():
        fields = set(cls.Config.model_fields)
        assert not fields & {"train_file", "data_path", "file", "num_eval"}, name
        if name == "reasoning_gym":  # generated tasks; the held-out size is per dataset (datasets[].eval_size)
            from scalerl.envs.reasoning_gym import DatasetSpec

            assert "data_file" not in fields and "eval_size" in DatasetSpec.model_fields
            continue
        assert "data_file" in fields or name == "calculator", name  # calculator generates its tasks
        assert {"eval_size", "eval_fraction"} & fields, name


@pytest.mark.parametrize("env,old,new", OLD)
def test_older_spelling_still_works_and_warns_once(env, old, new, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(base, "_WARNED", set())
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}", "answer": "{i}", "tests": ["assert True"]}}\n' for i in range(12)))
    value = str(data) if new == "data_file" else 3
    extra = {"eval_size": 3} if new == "data_file" and env in ("math", "reward_model") else {}
    with caplog.at_level(logging.WARNING, logger="scalerl.envs.base"):
        old_env = build_env(env, {old: value, **extra})
        validate_env_args(env, {old: value, **extra})
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"env.args.{old} is deprecated (environment {env}): use env.args.{new}"]
    new_env = build_env(env, {new: value, **extra})
    assert [t.prompt for t in old_env.train_tasks()] == [t.prompt for t in new_env.train_tasks()]
    assert getattr(old_env.config, new) == getattr(new_env.config, new)
    with pytest.raises(ScaleRLError, match=f"env.args.{old} and env.args.{new} are the same option"):
        validate_env_args(env, {old: value, new: value})


def test_cli_shows_one_deprecation_line(tmp_path):
    proc = run_cli("-m", "scalerl.cli.main", "train", "--dry-run", "--set", "env.args.num_eval=20",
                   "--set", f"log.run_dir={tmp_path}", timeout=120, process=True)  # the warning is once per process
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "WARNING: env.args.num_eval is deprecated (environment arithmetic): use env.args.eval_size"]
    assert "20 held-out tasks" in proc.stdout
