"""`scalerl continual`: three batches of new data train on in turn; a forced regression rolls back."""

from __future__ import annotations

import json
import random

import pytest
from safetensors.torch import load_file

from conftest import run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.jsonl import read_metrics
from scalerl.monitor.events import read_events
from scalerl.jobs.continual import STATE_FILE, Continual


def _data(folder, name, seed, n=48):
    rng = random.Random(seed)
    path = folder / name
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return path


RECIPE = {"continual.steps_per_batch": 3, "continual.validate_every_steps": 1, "continual.max_regression": 0.1, "eval.max_tasks": 100,
          "replay.kind": "prioritized", "algorithm.tis_cap": 2.0, "optim.lr": 1e-4, "eval.every": 0}


@pytest.mark.slow
def test_three_batches_train_in_turn_and_a_forced_regression_rolls_back(tmp_path):
    root, inbox = tmp_path / "continual", tmp_path / "inbox"
    inbox.mkdir()
    config = load_config(overrides=tiny_overrides(tmp_path / "unused", "x", **RECIPE))
    loop = Continual(root, config, printer=lambda _: None)
    files = [_data(inbox, f"batch{i}.jsonl", i) for i in range(3)]
    assert loop.pending(inbox) == files

    results = [loop.process(files[0]), loop.process(files[1])]
    for i, r in enumerate(results):  # each batch trained a segment of its own, from the policy before it
        assert r["validation"] == "validated"
        rows = read_metrics(root / "segments" / f"{i + 1:04d}")
        assert [row["step"] for row in rows] == [1, 2, 3]
    seg2 = load_config(root / "segments" / "0002" / "config.yaml")
    assert seg2.model.path.endswith("segments/0001/checkpoints/step_0000003")  # continued from the first segment's policy
    assert seg2.env.args["data_file"] == str(files[1].resolve())  # continual.data_arg: data_file, one name for the data file
    assert seg2.replay.init_from is not None and "0001" in str(seg2.replay.init_from)  # the replay cache carried over
    assert read_metrics(root / "segments" / "0002")[0]["replay/groups"] > 0  # ... and replayed from the first step
    validated = loop.state.validated

    # the third batch with a learning rate that wrecks the policy: validation sees the regression and rolls back
    forced = loop.process(files[2], overrides={"optim.lr": 0.5, "optim.max_grad_norm": None})
    assert forced["validation"] == "rollback" and forced["pass_rate"] < forced["validated_pass_rate"] - 0.1
    assert loop.state.current == loop.state.validated == validated
    events = [e["rule"] for e in read_events(root)]
    assert events == ["continual_start", *["continual_new_data", "continual_validated"] * 2, "continual_new_data", "continual_rollback"]
    state = json.loads((root / STATE_FILE).read_text())
    assert state["files"] == [str(f.resolve()) for f in files] and state["current"] == validated
    assert loop.pending(inbox) == []
    loop.close()

    # the CLI goes on from the saved state: a fourth file trains from the rolled-back (validated) policy
    _data(inbox, "batch3.jsonl", 3)
    done = run_cli("-m", "scalerl.cli.main", "continual", str(root), "--watch", str(inbox), "--once")
    assert done.returncode == 0, done.stderr
    assert load_config(root / "segments" / "0004" / "config.yaml").model.path == validated
    before = load_file(f"{validated}/model.safetensors")
    after = load_file(root / "segments" / "0004" / "checkpoints" / "step_0000003" / "model.safetensors")
    assert any((before[k] - after[k]).abs().max() > 0 for k in before)
