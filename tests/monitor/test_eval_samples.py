"""Completions visible by default: each evaluation shows a few completions (without special tokens) on the console, in
TensorBoard's text tab and in samples/eval_step_NNNNNN.jsonl, with reward.dump_every left at 0."""

from __future__ import annotations

import json

import pytest

from scalerl.rollout.evaluation import shown_text
from tests.conftest import run_cli, tiny_overrides


class _Tok:
    all_special_tokens = ("<s>", "</s>", "<unk>", "<pad>")


def test_shown_text_drops_special_tokens():
    assert shown_text("<s> 12<unk>3</s><pad><pad>", _Tok()) == "123"


@pytest.mark.slow
def test_a_run_shows_eval_samples_by_default(tmp_path):
    overrides = tiny_overrides(tmp_path / "runs", "s", **{"train.steps": 3, "eval.max_tasks": 4, "log.console": "plain"})
    proc = run_cli("-m", "scalerl.cli.main", "train", *(a for k, v in overrides.items() for a in ("--set", f"{k}={v}")), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "runs" / "s"
    for step in (0, 3):
        rows = [json.loads(line) for line in (run / "samples" / f"eval_step_{step:06d}.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and all(r["step"] == step and r["prompt"].endswith("=") for r in rows), rows
        assert all(r["score"] in (0.0, 1.0) for r in rows)
        assert not any(tok in r["completion"] for r in rows for tok in ("<unk>", "<s>", "</s>", "<pad>"))
    assert proc.stdout.count("eval sample (step 3): ") == 3
    assert "step 3/3  reward " in proc.stdout and "  pass " in proc.stdout  # a verifier's task: a pass rate on the bar
    events = b"".join(p.read_bytes() for p in (run / "tensorboard").glob("events.out.tfevents.*"))
    assert b"eval/samples" in events
