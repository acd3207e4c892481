"""Reward components: function components in their worker process (every failure path with real
functions from `reward_fns.py`), model components, config spellings, the `reward_model` env."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch
import yaml

from scalerl.config.checks import check_config
from scalerl.config import dump_config, load_config
from scalerl.types import Completion, Task
from scalerl.errors import ScaleRLError
from scalerl.rewards.components import EnvComponent, FunctionComponent, ModelComponent, RewardInputs
from scalerl.rewards.reward_model import RewardModelScorer, load_reward_model, save_reward_model
from scalerl.rewards.safe_call import FunctionWorker, RewardCallError
from scalerl.rewards.scorer import RewardScorer, build_reward_scorer


def _inputs(prompts=("1+1=", "1+1=", "2+2=", "2+2="), texts=("2", "22", "4", "4444"), env=(1.0, 0.0, 1.0, 0.0)):
    tasks = [Task("1+1=", "2"), Task("2+2=", "4")]
    group_ids = [0 if p == "1+1=" else 1 for p in prompts]
    completions = [Completion(t, (), finished=i % 2 == 0) for i, t in enumerate(texts)]
    inputs = RewardInputs.of(tasks, group_ids, completions, torch.tensor(env))
    return RewardInputs(list(prompts), inputs.completions, inputs.finished, inputs.tasks, group_ids, inputs.env_scores)


def _scorer(*components, fallback=-1.0, fusion="weighted_sum"):
    return RewardScorer(list(components), weights=[1.0] * len(components), fallbacks=[fallback] * len(components),
                        fusion=fusion, group_size=2)


# --- function components: the normal path -----------------------------------------------------------


def test_function_gets_trl_arguments_and_kwargs():
    comp = FunctionComponent("k", "reward_fns:sees_kwargs", timeout_s=10)
    try:
        # rows: groups 0,0,1,1; finished 1,0,1,0; answers match their tasks (+100): 10g + f + 100.
        assert comp.score(_inputs()).tolist() == [101.0, 100.0, 111.0, 110.0]
        assert FunctionComponent("l", "reward_fns:length_score", timeout_s=10).score(_inputs()).tolist() == [0.125, 0.25, 0.125, 0.5]
    finally:
        comp.close()


def test_submitted_functions_run_at_the_same_time_as_each_other_and_the_caller():
    """Two 0.5 s functions, submitted, then 0.5 s of the caller's own work: all three overlap, so
    collecting both takes ≈ 0.5 s in all instead of 1.5 s in series."""
    comps = [FunctionComponent(n, "reward_fns:sleeps_half_a_second", timeout_s=10) for n in ("a", "b")]
    scorer = _scorer(*comps)
    try:
        for comp in comps:
            comp.worker.wait_ready()  # start-up is not what is measured
        start = time.perf_counter()
        scorer.submit(_inputs())
        time.sleep(0.5)  # the trainer scoring the environment meanwhile
        rewards, metrics = scorer.score(_inputs())
        elapsed = time.perf_counter() - start
        assert rewards.tolist() == [2.0] * 4 and metrics["reward/a_failures"] == 0.0
        assert elapsed < 1.2, elapsed  # in series: ≥ 1.5 s
    finally:
        scorer.close()


def test_async_function_and_async_timeout_keep_the_worker():
    worker = FunctionWorker("reward_fns:async_length", timeout_s=5)
    hang = FunctionWorker("reward_fns:async_hangs", timeout_s=1)
    try:
        assert worker.call(["p", "p"], ["ab", "abcd"], {}) == [0.25, 0.5]
        hang.wait_ready()
        start = time.perf_counter()
        with pytest.raises(RewardCallError) as err:
            hang.call(["p"], ["a"], {})
        assert time.perf_counter() - start < 2.0
        # asyncio.wait_for cancelled the coroutine inside the worker: no restart was needed.
        assert err.value.kind == "timeout" and hang.restarts == 0
    finally:
        worker.close()
        hang.close()


# --- failure containment -----------------------------------------------------------------------------


def test_raising_function_gets_fallback_counted_and_traceback_logged_once(caplog):
    scorer = _scorer(FunctionComponent("boom", "reward_fns:raises", timeout_s=10), EnvComponent("env"))
    try:
        with caplog.at_level(logging.WARNING, logger="scalerl.rewards.scorer"):
            for _ in range(2):
                rewards, metrics = scorer.score(_inputs())
                # fallback -1 for every row, plus the env score (1, 0, 1, 0), weights 1 and 1.
                assert rewards.tolist() == [0.0, -1.0, 0.0, -1.0]
                assert metrics["reward/boom_failures"] == 4 and metrics["reward/env_failures"] == 0
                assert metrics["reward/boom_mean"] == -1.0 and metrics["reward/env_mean"] == 0.5
        warnings = [r for r in caplog.records if "boom" in r.getMessage()]
        assert len(warnings) == 1  # the first failure only
        logged = warnings[0].getMessage()
        assert "RuntimeError: boom from reward_fns.raises" in logged and "Traceback" in logged
        # the function's own frames only: the line that raised, none of the worker's (scalerl/rewards/safe_call.py)
        assert 'reward_fns.py", line 23, in raises' in logged and "safe_call.py" not in logged, logged
    finally:
        scorer.close()


def test_hanging_function_returns_within_two_seconds_and_the_worker_is_replaced():
    comp = FunctionComponent("slow", "reward_fns:hangs_when_asked", timeout_s=1)
    scorer = _scorer(comp, fallback=0.25)
    try:
        comp.worker.wait_ready()
        start = time.perf_counter()
        rewards, metrics = scorer.score(_inputs(prompts=("hang", "hang", "x", "x")))
        assert time.perf_counter() - start < 2.0  # timeout 1 s + 0.5 s grace + the kill
        assert rewards.tolist() == [0.25] * 4 and metrics["reward/slow_failures"] == 4
        assert comp.worker.restarts == 1
        rewards, metrics = scorer.score(_inputs())  # the fresh worker answers the next batch
        assert rewards.tolist() == [1.0] * 4 and metrics["reward/slow_failures"] == 0
    finally:
        scorer.close()


def test_none_nan_inf_and_non_numbers_get_the_fallback_per_entry(caplog):
    scorer = _scorer(FunctionComponent("bad", "reward_fns:bad_entries", timeout_s=10), fallback=-2.0)
    try:
        with caplog.at_level(logging.WARNING, logger="scalerl.rewards.scorer"):
            rewards, metrics = scorer.score(_inputs(prompts=("1+1=",) * 2 + ("2+2=",) * 3 + ("1+1=",),
                                                    texts=("a",) * 6, env=(0.0,) * 6))
        # pattern NaN, None, inf, 'x', 0.5, NaN: five entries replaced by -2, the 0.5 kept.
        assert rewards.tolist() == [-2.0, -2.0, -2.0, -2.0, 0.5, -2.0]
        assert metrics["reward/bad_failures"] == 5
        assert metrics["reward/bad_mean"] == pytest.approx((5 * -2.0 + 0.5) / 6)
        assert "returned 5 None/NaN/inf" in caplog.text
    finally:
        scorer.close()


def test_wrong_length_is_an_error_naming_the_function(caplog):
    scorer = _scorer(FunctionComponent("len", "reward_fns:wrong_length", timeout_s=10), fallback=0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="scalerl.rewards.scorer"):
            rewards, metrics = scorer.score(_inputs())
        assert rewards.tolist() == [0.0] * 4 and metrics["reward/len_failures"] == 4  # not broadcast, not truncated
        assert "reward_fns:wrong_length returned 5 scores for 4 completions" in caplog.text
        with pytest.raises(RewardCallError, match="returned float; expected a list"):
            FunctionComponent("x", "reward_fns:not_a_list", timeout_s=10).score(_inputs())
    finally:
        scorer.close()


def test_a_worker_that_dies_is_restarted():
    worker = FunctionWorker("reward_fns:exits", timeout_s=10)
    try:
        with pytest.raises(RewardCallError) as err:
            worker.call(["die"], ["a"], {})
        assert err.value.kind == "died" and "exit code 3" in err.value.message and worker.restarts == 1
        assert worker.call(["ok", "ok"], ["a", "b"], {}) == [2.0, 2.0]
    finally:
        worker.close()


# --- model components and the legacy reward.model path ----------------------------------------------


def test_model_component_is_the_reward_model_score(tmp_path):
    torch.manual_seed(0)
    model, tok = load_reward_model("builtin")
    save_reward_model(tmp_path / "rm", model.eval(), tok, {})
    inputs = _inputs()
    expected = RewardModelScorer(str(tmp_path / "rm"), normalize="sigmoid").score(inputs.prompts, inputs.completions, inputs.finished)
    comp = ModelComponent("rm", str(tmp_path / "rm"), "cpu", batch_size=3, normalize="sigmoid")
    torch.testing.assert_close(comp.score(inputs), expected)
    # reward.model without components: one component, weight 1, exactly the model's raw score.
    config = load_config(None, {"reward.model": str(tmp_path / "rm")})
    legacy = build_reward_scorer(config.reward, group_size=2, device="cpu")
    rewards, metrics = legacy.score(inputs)
    torch.testing.assert_close(rewards, RewardModelScorer(str(tmp_path / "rm")).score(inputs.prompts, inputs.completions, inputs.finished))
    assert metrics["reward/weight/reward_model"] == 1.0
    assert build_reward_scorer(load_config(None, {}).reward, group_size=2, device="cpu") is None  # the env's reward


# --- config -------------------------------------------------------------------------------------------


SOURCE_YAML = """
reward_components:
  - {name: grammar, model: builtin, weight: 0.3}
  - {name: correctness, function: reward_fns:length_score, weight: 0.4}
  - {name: env, weight: 0.3}
fusion_method: dynamic_weight
"""


def test_top_level_spelling_nested_spelling_and_set_overrides_agree(tmp_path):
    top = tmp_path / "top.yaml"
    top.write_text(SOURCE_YAML)
    nested = tmp_path / "nested.yaml"
    nested.write_text(yaml.safe_dump({"reward": {"components": yaml.safe_load(SOURCE_YAML)["reward_components"],
                                                  "fusion": "dynamic_weight"}}))
    a, b = load_config(top), load_config(nested)
    assert a.reward == b.reward and a.reward.fusion == "dynamic_weight"
    assert [(c.name, c.weight) for c in a.reward.components] == [("grammar", 0.3), ("correctness", 0.4), ("env", 0.3)]
    assert a.reward.components[2].env and a.reward.components[0].model == "builtin"
    assert yaml.safe_load(dump_config(a))["reward"]["fusion"] == "dynamic_weight"  # written back in the nested spelling
    # --set, in either spelling, on top of the YAML.
    assert load_config(top, ["fusion_method=weighted_sum"]).reward.fusion == "weighted_sum"
    assert load_config(top, ["reward.dynamic.eps=0.2"]).reward.dynamic.eps == 0.2
    only_env = load_config(None, ["reward_components=[{name: env, weight: 2}]", "reward.fusion=dynamic_weight"])
    assert [(c.name, c.env, c.weight) for c in only_env.reward.components] == [("env", True, 2.0)]
    with pytest.raises(ScaleRLError, match="fusion_method and reward.fusion are the same setting"):
        load_config(top, ["reward.fusion=weighted_sum"])


@pytest.mark.parametrize("overrides, needles", [
    ({"reward_components": [{"name": "a"}]}, ["reward.components.0", "exactly one of model:, function: or env"]),
    ({"reward_components": [{"name": "a", "env": True, "colour": 1}]}, ["reward.components.0.colour", "unknown key", "timeout_s"]),
    ({"reward_components": [{"name": "env"}, {"name": "env"}]}, ["names must be unique"]),
    ({"reward_components": [{"name": "x", "function": "no_such_mod:f"}]}, ["reward.components.0.function", "no_such_mod"]),
    ({"reward_components": [{"name": "x", "function": "reward_fns:nope"}]}, ["reward.components.0.function", "no attribute 'nope'"]),
    ({"reward_components": [{"name": "x", "model": "/no/such/rm"}]}, ["reward.components.0.model"]),
    ({"reward_components": [{"name": "env", "weight": 0}]}, ["weights sum to 0"]),
    ({"reward_components": [{"name": "env"}], "reward.model": "builtin"}, ["reward.model and reward.components"]),
    ({"reward_components": [{"name": "x", "env": True, "ceiling": 0, "floor": 1}]}, ["ceiling (0.0) must be above floor"]),
    ({"env.name": "reward_model"}, ["env.name=reward_model has no verifier", "reward_components"]),
    ({"env.name": "reward_model", "reward_components": [{"name": "env"}]}, ["always score 0"]),
])
def test_config_errors_name_the_key(overrides, needles):
    with pytest.raises(ScaleRLError) as err:
        check_config(load_config(None, overrides))
    for needle in needles:
        assert needle in str(err.value), str(err.value)


# --- the reward_model environment -----------------------------------------------------------------------


def test_reward_model_env_ships_prompts_the_char_tokenizer_encodes(tmp_path):
    from scalerl.envs.registry import build_env
    from scalerl.models.loading import load_tokenizer

    config = load_config(None, {"env.name": "reward_model", "reward_components": [{"name": "len", "function": "reward_fns:length_score"}]})
    env = build_env(config.env.name, config.env.args)
    assert len(env.train_tasks()) == 32 and len(env.eval_tasks()) == 8 and env.verifier is False
    tok = load_tokenizer(config.model)
    for task in [*env.train_tasks(), *env.eval_tasks()]:
        assert tok.unk_token_id not in tok(task.prompt)["input_ids"] and len(task.prompt) <= 24
    assert env.score(env.train_tasks()[0], Completion("anything", (), True)) == 0.0
    own = tmp_path / "p.jsonl"
    own.write_text(json.dumps({"prompt": "hi:", "answer": 7, "topic": "x"}) + "\n" + json.dumps({"prompt": "yo:"}) + "\n")
    env = build_env("reward_model", {"file": str(own), "num_eval": 1})
    # the answer column stays in meta with its own type too: reward functions receive it by name, as TRL passes it
    assert env.train_tasks() == [Task("hi:", "7", {"answer": 7, "topic": "x"})] and env.eval_tasks() == [Task("yo:")]
    with pytest.raises(ScaleRLError, match="leaves no training prompts"):
        build_env("reward_model", {"file": str(own), "num_eval": 2})


# --- end to end through the CLI -------------------------------------------------------------------------


def _train(runs, name, yaml_text, **extra):
    from conftest import ROOT, run_cli, tiny_overrides

    cfg = runs.parent / f"{name}.yaml"
    runs.mkdir(parents=True, exist_ok=True)
    cfg.write_text(yaml_text)
    sets = [a for k, v in tiny_overrides(runs, name, **extra).items() for a in ("--set", f"{k}={v}")]
    proc = run_cli("-m", "scalerl.cli.main", "train", "--config", str(cfg), *sets, timeout=240,
                   env={"PYTHONPATH": str(ROOT / "tests" / "rewards")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]


def test_cli_run_with_top_level_components_logs_means_and_weights(runs):
    rows = _train(runs, "fused", "reward_components:\n"
                  "  - {name: brevity, function: reward_fns:length_score, weight: 0.5}\n"
                  "  - {name: correctness, env: true, weight: 0.5, ceiling: 1, floor: 0}\n"
                  "fusion_method: dynamic_weight\n", **{"train.steps": 4, "checkpoint.every": 2, "eval.every": 0})
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["reward/brevity_failures"] == 0 and r["reward/correctness_failures"] == 0
        assert r["reward/weight/brevity"] + r["reward/weight/correctness"] == pytest.approx(1.0)
        assert 0 <= r["reward/correctness_mean"] <= 1 and r["reward/correctness_mean"] == pytest.approx(r["task_reward_mean"])
        # the fused mean is the weighted sum of the component means (weights are per step)
        fused = r["reward/weight/brevity"] * r["reward/brevity_mean"] + r["reward/weight/correctness"] * r["reward/correctness_mean"]
        assert r["reward_mean"] == pytest.approx(fused, abs=1e-5)
    state = json.loads((runs / "fused" / "checkpoints" / "step_0000004" / "trainer_state.json").read_text())["rollout"]["rewards"]["scorer"]
    assert state["names"] == ["brevity", "correctness"]
    assert state["dynamic"]["weights"] == pytest.approx([rows[-1]["reward/weight/brevity"], rows[-1]["reward/weight/correctness"]])


@pytest.mark.slow
def test_cli_reward_model_env_is_scored_by_its_components(runs):
    rows = _train(runs, "open", "env: {name: reward_model}\n"
                  "reward_components: [{name: brevity, function: reward_fns:length_score}]\n",
                  **{"train.steps": 2, "eval.every": 0})
    summary = json.loads((runs / "open" / "summary.json").read_text())
    assert rows[-1]["task_reward_mean"] == 0.0 and rows[-1]["reward_mean"] == pytest.approx(rows[-1]["reward/brevity_mean"])
    # the held-out number is the mean fused reward of greedy completions (length/8 > 0 for a non-empty one)
    assert 0 < summary["pass_rate_after"] <= 1


def _only_completions(completions):  # no **kwargs: cannot take the columns
    return [1.0] * len(completions)


def _asks_for_a_missing_column(completions, solution, **kwargs):
    return [1.0] * len(completions)


def _raises_its_own_type_error(completions, **kwargs):
    return [len(None)]  # a TypeError from inside the function: left as it is


def test_a_signature_that_cannot_take_the_call_says_what_to_change():
    from scalerl.rewards.safe_call import call_function

    kwargs = {"answer": ["3"], "tasks": [None]}
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument .*; fn:only is called with prompts, completions, answer, "
                                        r"tasks by name: add \*\*kwargs to its signature to take only what it names"):
        call_function(_only_completions, "fn:only", ["1+2="], ["3"], kwargs, 5.0)
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'solution'; fn:missing asks for 'solution', which "
                                        r"the call does not pass: it passes prompts, completions, answer, tasks$"):
        call_function(_asks_for_a_missing_column, "fn:missing", ["1+2="], ["3"], kwargs, 5.0)
    with pytest.raises(TypeError, match=r"^object of type 'NoneType' has no len\(\)$"):
        call_function(_raises_its_own_type_error, "fn:own", ["1+2="], ["3"], kwargs, 5.0)
    from scalerl.api.data import trl_style  # the Python API's wrapper: the hint reads the user's signature through it

    with pytest.raises(TypeError, match=r"; python:only is called with prompts, completions, answer by name: add \*\*kwargs"):
        call_function(trl_style(_only_completions), "python:only", ["1+2="], ["3"], {"answer": ["3"]}, 5.0)


def test_a_callable_rewards_traceback_starts_at_the_users_own_frame():
    """The Python API's callables run in this process: the reported traceback leaves out ScaleRL's frames above the
    function (the component's call, call_function, the API's column wrapper), as a worker's report does."""
    from scalerl.rewards.components import CallableComponent
    from scalerl.rewards.safe_call import RewardCallError

    def raising(completions, **kwargs):
        raise ValueError("nope")

    component = CallableComponent("bad", "python:bad", raising, timeout_s=5.0)
    with pytest.raises(RewardCallError) as caught:
        component.score(_inputs())
    report = caught.value.message
    assert report.startswith("Traceback (most recent call last):\n") and "in raising" in report and report.strip().endswith("ValueError: nope")
    assert "scalerl/rewards" not in report and "scalerl/api" not in report, report
