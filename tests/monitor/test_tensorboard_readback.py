"""TensorBoard's own reader sees exactly the scalars of metrics.jsonl, and the untrained model's evaluation at step 0."""

from __future__ import annotations

import json
import math

import pytest

from observed_run import observed
from scalerl.jsonl import read_metrics


def test_tensorboard_event_files_hold_the_metrics_jsonl_values(tmp_path_factory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = observed(tmp_path_factory)
    rows = read_metrics(run.run_dir)
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                expected.setdefault(key, []).append((row["step"], value))
    before = json.loads((run.run_dir / "summary.json").read_text())["pass_rate_before"]
    expected["eval/pass_rate"].insert(0, (0, before))  # the curve starts at the untrained model (summary.json's)
    acc = EventAccumulator(str(run.run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(expected)
    assert {"reward_mean", "kl", "loss", "eval/pass_rate"} <= set(expected)
    for key, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-7), key  # stored as float32
