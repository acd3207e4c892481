"""`scalerl export` and `scalerl eval` on a real run of the built-in model."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_cli, tiny_overrides
from scalerl.trainer.evaluation import confidence_interval


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    runs = tmp_path_factory.mktemp("runs")
    train(load_config(overrides=tiny_overrides(runs, "r", **{"train.steps": 4, "checkpoint.every": 2, "optim.lr": 1e-3})))
    return runs / "r"


def test_export_writes_the_checkpoint_in_the_dtype_with_the_runs_eos(run, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "bf16"
    done = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(out), "--dtype", "bf16")
    assert done.returncode == 0, done.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    saved = load_file(run / "checkpoints" / "step_0000004" / "model.safetensors")
    assert all(torch.equal(p, saved[n].to(torch.bfloat16)) for n, p in model.state_dict().items() if n in saved)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id is not None
    assert json.loads((out / "scalerl_export.json").read_text())["step"] == 4
    again = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr and "\n" not in again.stderr.strip()


def test_export_skips_a_damaged_newest_checkpoint_without_moving_it(run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    weights = copy / "checkpoints" / "step_0000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    done = run_cli("-m", "scalerl.cli.main", "export", str(copy), "--out", str(tmp_path / "out"), "--dtype", "fp32")
    assert done.returncode == 0, done.stderr
    assert "step_0000004 is damaged" in done.stderr and "step_0000002" in done.stdout
    assert (copy / "checkpoints" / "step_0000004").is_dir()  # exporting only reads


def test_eval_of_a_run_gives_the_runs_own_last_pass_rate(run, tmp_path):
    out = tmp_path / "eval.json"
    done = run_cli("-m", "scalerl.cli.main", "eval", str(run), "--max-tasks", "16", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert result["pass_rate"] == pytest.approx(summary["pass_rate_after"]) and result["tasks"] == 16  # same greedy evaluation
    low, high = result["ci95"]
    assert low <= result["pass_rate"] <= high and result["interval"] == "wilson"
    bad = run_cli("-m", "scalerl.cli.main", "eval", str(run), "--samples", "4", "--temperature", "0")
    assert bad.returncode == 2 and "--temperature > 0" in bad.stderr


def test_confidence_intervals():
    # Wilson, 50 of 100: 0.5 ± 1.96·sqrt(0.25/100 + 1.96²/40000) / (1 + 1.96²/100)
    low, high = confidence_interval(torch.tensor([1.0] * 50 + [0.0] * 50, dtype=torch.float64), binary=True)
    assert (low, high) == pytest.approx((0.40383, 0.59617), abs=1e-5)
    # 0 of 20 still has an upper bound above 0
    assert confidence_interval(torch.zeros(20, dtype=torch.float64), binary=True)[1] == pytest.approx(0.16113, abs=1e-5)
    # normal over task means: mean 0.5, std 0.5345 (n = 8) → ± 1.96 · 0.5345 / sqrt(8)
    means = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.0, 1.0], dtype=torch.float64)
    assert confidence_interval(means, binary=False) == pytest.approx((0.5 - 1.96 * float(means.std()) / 8 ** 0.5,
                                                                       0.5 + 1.96 * float(means.std()) / 8 ** 0.5))
