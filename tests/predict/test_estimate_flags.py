"""`scalerl estimate`: `--precision X` and `--set precision.mode=X` give one answer (the mode's defaults, e.g.
compressed's gradient checkpointing, apply to both), and `--gpus N` answers per GPU under parallel.strategy."""

from __future__ import annotations

import re

import pytest

from scalerl.predict.memory import MODEL_PRESETS, estimate_memory, per_gpu_bytes
from tests.conftest import run_cli

BASE = ("-m", "scalerl.cli.main", "estimate", "--model-size", "7b", "--prompt-len", "64", "--set", "rollout.prompts_per_step=2",
        "--set", "rollout.group_size=2", "--set", "rollout.max_new_tokens=64")


def _components(out: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"^  (\w+)\s+([\d.]+) GiB", out, re.MULTILINE)}


@pytest.mark.parametrize("mode", ["compressed", "standard"])
def test_precision_flag_and_set_agree(mode):
    flag = run_cli(*BASE, "--precision", mode, timeout=120)
    setting = run_cli(*BASE, "--set", f"precision.mode={mode}", timeout=120)
    assert flag.returncode == 0 and setting.returncode == 0, flag.stderr + setting.stderr
    assert _components(flag.stdout) == _components(setting.stdout) and _components(flag.stdout)["peak"] > 0
    if mode == "compressed":  # its default recomputation: activations far below standard's
        standard = _components(run_cli(*BASE, "--precision", "standard", timeout=120).stdout)
        assert _components(flag.stdout)["activations"] < standard["activations"] / 4


def test_per_gpu_bytes_shards_states_only_under_fsdp2():
    mem = estimate_memory(MODEL_PRESETS["7b"], precision="standard", micro_batch=2, prompt_len=64, completion_len=64, rollout_sequences=4)
    transient = max(mem["activations"] + mem["backward_transient"], mem["kv_cache"], mem["optimizer_step"])
    assert per_gpu_bytes(mem, 1, "fsdp2") == pytest.approx(mem["peak"])
    assert per_gpu_bytes(mem, 8, "ddp") == pytest.approx(mem["peak"])  # every rank holds the whole model
    eight = per_gpu_bytes(mem, 8, "fsdp2")
    assert eight < mem["peak"] / 2 and eight >= mem["states"] / 8 + mem["activations"] + mem["backward_transient"] - 1
    assert eight <= mem["states"] / 8 + transient


def test_gpus_flag_answers_for_n_gpus():
    ddp = run_cli(*BASE, "--precision", "standard", "--gpus", "4", timeout=120)
    fsdp = run_cli(*BASE, "--precision", "standard", "--gpus", "4", "--set", "parallel.strategy=fsdp2", timeout=120)
    assert ddp.returncode == 0 and fsdp.returncode == 0, ddp.stderr + fsdp.stderr
    per_gpu = {}
    for name, proc in (("ddp", ddp), ("fsdp2", fsdp)):
        match = re.search(rf"per GPU with 4 GPUs \(parallel.strategy={name}\): ([\d.]+) GiB; (fits|does not fit)", proc.stdout)
        assert match, proc.stdout
        per_gpu[name] = float(match[1])
    peak = _components(ddp.stdout)["peak"]
    assert per_gpu["ddp"] == pytest.approx(peak, abs=2e-3)
    assert per_gpu["fsdp2"] < per_gpu["ddp"] / 2


def test_a_token_budget_prices_the_micro_batch_it_holds():
    """train.micro_batch_tokens: the estimate's micro-batch is the rows of full length the budget holds (at least one
    unit; a whole group under loss_agg=prompt; at most the mini-batch), not the whole mini-batch."""
    from scalerl.config import load_config
    from scalerl.jobs.estimate import component_memory, micro_batch_rows

    def cfg(**sets):
        return load_config(overrides={"rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 64, **sets})

    assert micro_batch_rows(cfg(), 64) == 16  # rows: the whole mini-batch by default
    assert micro_batch_rows(cfg(**{"train.micro_batch_tokens": 3 * 128 + 5}), 64) == 3
    assert micro_batch_rows(cfg(**{"train.micro_batch_tokens": 10}), 64) == 1  # a row alone over the budget
    assert micro_batch_rows(cfg(**{"train.micro_batch_tokens": 10**6}), 64) == 16
    assert micro_batch_rows(cfg(**{"train.micro_batch_tokens": 6 * 128, "algorithm.loss_agg": "prompt"}), 64) == 4
    by_tokens = component_memory(cfg(**{"train.micro_batch_tokens": 2 * 128}), MODEL_PRESETS["7b"], "standard", False, 64)
    by_rows = component_memory(cfg(**{"train.micro_batch_size": 2}), MODEL_PRESETS["7b"], "standard", False, 64)
    whole = component_memory(cfg(), MODEL_PRESETS["7b"], "standard", False, 64)
    assert by_tokens["activations"] == by_rows["activations"] < whole["activations"] / 4
