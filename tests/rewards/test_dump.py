"""Sample dumps: when they are due, where they go, and exactly what each line holds."""

from __future__ import annotations

import json

import pytest
import torch

from scalerl.rewards.dump import dump_due, dump_path, dump_samples, sample_rows


def test_dump_due_every_n_steps():
    assert [s for s in range(1, 21) if dump_due(s, 5)] == [5, 10, 15, 20]
    assert not any(dump_due(s, 0) for s in range(1, 21))  # 0 never dumps


def test_dump_writes_one_json_line_per_sample(tmp_path):
    path = dump_samples(
        tmp_path, 50, ["1+2=", "1+2=", "5+5="], ["3", "4", "10 and more"],
        group_ids=torch.tensor([0, 0, 1]), finished=[True, True, False],
        components={"correct": [1.0, 0.0, 0.0], "length": torch.tensor([-0.1, -0.1, -0.4])},
        fused=torch.tensor([0.9, -0.1, float("nan")]), rewards=[0.85, -0.15, 0.0],
        extra={"diversity_similarity": [0.5, 0.5, 0.0], "note": ["a", "b", "c"]},
    )
    assert path == tmp_path / "samples" / "step_000050.jsonl" == dump_path(tmp_path, 50)
    assert not list((tmp_path / "samples").glob("*.tmp"))  # renamed into place
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 3
    assert rows[0] == {"step": 50, "index": 0, "group": 0, "prompt": "1+2=", "completion": "3", "finished": True,
                       "components": {"correct": 1.0, "length": pytest.approx(-0.1)}, "fused": pytest.approx(0.9),
                       "reward": 0.85, "diversity_similarity": 0.5, "note": "a"}
    assert rows[2]["group"] == 1 and rows[2]["finished"] is False and rows[2]["completion"] == "10 and more"
    assert rows[2]["fused"] is None  # NaN is not JSON: written as null
    assert rows[1]["components"]["correct"] == 0.0 and rows[1]["reward"] == -0.15


def test_a_column_of_the_wrong_length_is_an_error():
    with pytest.raises(ValueError, match="3 completions"):
        sample_rows(1, ["a", "b", "c"], ["x", "y", "z"], group_ids=[0, 0, 1], components={"correct": [1.0, 0.0]},
                    fused=[0.0] * 3, rewards=[0.0] * 3)
