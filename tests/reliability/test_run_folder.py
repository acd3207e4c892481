"""A run folder is one run: a name is not reused by accident, a resume continues the run as it was
configured (changes that may happen mid-run are applied and recorded, the others refused), a
finished run is left as it is, and a resumed run's metrics are the uninterrupted run's, health
counters included. A run with nothing to learn says so."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import ROOT
from faults_common import overrides, same_run, train, without_timing
from scalerl.config import load_config
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_metrics
from scalerl.monitor.events import read_events
from scalerl.config.resume import resume_config
from scalerl.trainer import loop

SHORT = {"train.steps": 4, "checkpoint.every": 2}


def _stopped_before(stop_step, runs, name, **extra):
    """Train until a KeyboardInterrupt at the start of step `stop_step` (as an abort leaves a run)."""
    real_step = loop.train_step

    def crash(rollout, learner, step, ctx):
        if step == stop_step:
            raise KeyboardInterrupt
        return real_step(rollout, learner, step, ctx)

    loop.train_step = crash
    try:
        with pytest.raises(KeyboardInterrupt):
            train(runs, name, **extra)
    finally:
        loop.train_step = real_step


def test_a_used_run_name_is_refused_without_resume_or_overwrite(runs, fault):
    train(runs, "run", **SHORT)
    before = (runs / "run" / "metrics.jsonl").read_bytes()
    with pytest.raises(ScaleRLError, match="already holds a run") as err:
        train(runs, "run", **SHORT)
    assert (runs / "run" / "metrics.jsonl").read_bytes() == before  # nothing appended, nothing rotated away
    loop.train(load_config(overrides=overrides(runs, "run", **SHORT, **{"train.seed": 1})), overwrite=True)
    assert len(read_metrics(runs / "run")) == 4 and "seed: 1" in (runs / "run" / "config.yaml").read_text()
    fault("run folder", "a new run under the name of an existing one, no --resume",
          f"refused, one line: {str(err.value).replace(str(runs), 'runs')}; the old run untouched; --overwrite replaced it")


def test_resume_starts_from_the_saved_config(runs, fault):
    model = runs.parent / "my-model"
    shutil.copytree(ROOT / "scalerl" / "models" / "builtin", model)
    custom = {"train.steps": 6, "checkpoint.every": 2, "model.path": str(model), "rollout.max_new_tokens": 6}
    run = runs / "run"
    _stopped_before(5, runs, "run", **custom)
    saved = (run / "config.yaml").read_text()
    where = [f"log.run_dir={runs}", "log.name=run", "log.console=none"]

    with pytest.raises(ScaleRLError, match="model.path cannot change mid-run") as refused:
        loop.train(resume_config(None, [*where, "model.path=builtin"]), resume=True)
    assert (run / "config.yaml").read_text() == saved  # a refused resume does not touch the record

    config = resume_config(None, [*where, "train.steps=8"])  # only the location and one allowed change
    assert (config.model.path, config.checkpoint.every, config.rollout.max_new_tokens) == (str(model), 2, 6)
    summary = loop.train(config, resume=True)
    assert summary["steps"] == 8 and read_metrics(run)[-1]["step"] == 8
    changes = [json.loads(line) for line in (run / "config_changes.jsonl").read_text().splitlines()]
    assert changes == [{"resumed_at_step": 4, "changes": {"train.steps": [6, 8]}}]
    assert "steps: 8" in (run / "config.yaml").read_text()
    fault("resume", "--resume of a 6-step run on a custom model, with only --name given",
          "ran with the saved config (model.path, checkpoint.every, max_new_tokens kept); model.path=builtin refused in one "
          f"line ({str(refused.value).split(';')[0]}), config.yaml untouched; train.steps=8 applied and logged in config_changes.jsonl")


def test_resuming_a_finished_run_leaves_it_as_it_was(runs, fault):
    train(runs, "run", **SHORT)
    summary = (runs / "run" / "summary.json").read_bytes()
    metrics = (runs / "run" / "metrics.jsonl").read_bytes()
    again = train(runs, "run", resume=True, **SHORT)
    assert (runs / "run" / "summary.json").read_bytes() == summary and (runs / "run" / "metrics.jsonl").read_bytes() == metrics
    assert again == json.loads(summary)
    fault("resume", "--resume of a finished run", "nothing trained; summary.json and metrics.jsonl byte-identical")


@pytest.mark.parametrize("variant", ["no reference (kl_inactive)", "KL penalty"])
def test_resumed_metrics_equal_the_uninterrupted_run_health_counters_included(runs, fault, variant):
    extra = {"algorithm.kl.beta": 0.0} if variant.startswith("no reference") else {}
    train(runs, "straight", **extra)
    _stopped_before(7, runs, "resumed", **extra)
    train(runs, "resumed", resume=True, **extra)
    assert same_run(runs / "resumed", runs / "straight", 8)
    rows = without_timing(read_metrics(runs / "resumed"))
    health = {k: v for k, v in rows[-1].items() if k.startswith("health/")}
    assert health and health == {k: v for k, v in without_timing(read_metrics(runs / "straight"))[-1].items() if k.startswith("health/")}
    assert [e["rule"] for e in read_events(runs / "resumed")] == [e["rule"] for e in read_events(runs / "straight")]
    fault("resume", f"stop after step 6 and resume ({variant})", f"metrics bit-for-bit the uninterrupted run's, health counters "
          f"included ({', '.join(f'{k} {v:g}' for k, v in sorted(health.items()))})")


def test_a_run_with_no_learning_signal_says_so(runs, fault):
    zero = {"reward.components": [{"name": "zero", "function": "zero_reward:zero"}], "train.steps": 6, "checkpoint.every": 0,
            "health.no_signal.steps": 3}
    train(runs, "run", **zero)
    events = [e for e in read_events(runs / "run") if e["rule"] == "no_signal"]
    assert [e["step"] for e in events] == [3] and events[0]["severity"] == "warning"
    assert "every reward was 0" in events[0]["message"]
    fault("bad input", "a reward that is 0 for every completion", f"health warning at step 3: {events[0]['message'][:110]}...")
