"""The command lines through real subprocesses: exit codes, one-line errors, the legacy interfaces."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import ROOT, run_cli


def test_help_is_instant_and_lists_train():
    proc = run_cli("-m", "scalerl.cli.main", "--help", timeout=30, process=True)  # a fresh interpreter: its imports count
    assert proc.returncode == 0 and "train" in proc.stdout


def test_dry_run_prints_the_resolved_config_with_overrides(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("optim:\n  lr: 3.0e-5\nrollout:\n  group_size: 4\n")
    proc = run_cli("-m", "scalerl.cli.main", "train", "--config", str(cfg), "--set", "train.steps=7", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["optim"]["lr"] == 3e-5 and resolved["rollout"]["group_size"] == 4 and resolved["train"]["steps"] == 7
    assert resolved["model"]["path"] == "builtin" and resolved["env"]["name"] == "arithmetic"


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_inputs_end_with_one_line_and_exit_2(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("optim: [unclosed\n")
    cases = [
        (["--set", "optim.lrr=1"], ["optim.lrr", "allowed here", "lr"]),
        (["--set", "algorithm.loss_agg=tokens"], ["algorithm.loss_agg", "'token', 'sequence', 'prompt', 'constant' or 'sequence_sum'"]),
        (["--config", str(tmp_path / "missing.yaml")], ["missing.yaml", "does not exist"]),
        (["--config", str(bad_yaml)], ["bad.yaml", "not valid YAML"]),
        (["--set", "env.name=nosuchenv"], ["env.name", "arithmetic", "module:Class"]),
        (["--set", f"model.path={tmp_path / 'nomodel'}"], ["model.path", "nomodel"]),
        (["--resume"], ["--resume", "--name"]),
        (["--name", "r", "--resume", "--overwrite"], ["--resume and --overwrite contradict"]),
        (["--nproc", "2", "--name", "r", "--resume", "--overwrite"], ["--resume and --overwrite contradict"]),
    ]
    for args, needles in cases:
        _one_line_error(run_cli("-m", "scalerl.cli.main", "train", *args), *needles)


def test_debug_shows_the_traceback():
    proc = run_cli("-m", "scalerl.cli.main", "train", "--set", "optim.lrr=1", "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "error: optim.lrr" in proc.stderr


def test_rl_train_maps_timesteps_to_steps_and_selects_the_algorithm():
    proc = run_cli("-m", "scalerl.cli.rl_train", "--algorithm", "grpo", "--model_name", "builtin", "--env_name", "arithmetic",
                   "--total_timesteps", "1e3", "--batch_size", "64", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["train"]["steps"] == 16  # ceil(1000 / 64)
    assert resolved["rollout"]["prompts_per_step"] == 8  # 64 completions / group of 8
    ppo = run_cli("-m", "scalerl.cli.rl_train", "--algorithm", "ppo", "--set", "algorithm.gamma=0.99", "--dry-run")
    assert ppo.returncode == 0 and yaml.safe_load(ppo.stdout)["algorithm"]["name"] == "ppo", ppo.stderr
    _one_line_error(run_cli("-m", "scalerl.cli.rl_train", "--algorithm", "a2c"), "a2c", "grpo")


def test_python_m_train_flags_map_to_config():
    proc = run_cli("-m", "scalerl.train", "--use_flash_attn", "2", "--gradient_checkpointing", "1",
                   "--offload_optimizer", "1", "--adam_offload", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["model"]["attn_implementation"] == "flash_attention_2"
    assert resolved["model"]["gradient_checkpointing"] is True and resolved["optim"]["offload"] is True


def test_python_m_train_runs_on_cpu_with_hardware_flags_falling_back(runs):
    """The source document's command line runs here: flash attention falls back to sdpa, offload saves nothing
    on CPU (the offloaded AdamW runs), each with a one-line warning; gradient checkpointing really runs."""
    proc = run_cli("-m", "scalerl.train", "--use_flash_attn", "2", "--gradient_checkpointing", "1", "--offload_optimizer", "1",
                   "--adam_offload", "1", "--steps", "2", "--name", "legacy", "--set", f"log.run_dir={runs}",
                   "--set", "log.console=plain", "--set", "eval.max_tasks=8", "--set", "rollout.prompts_per_step=2")
    assert proc.returncode == 0, proc.stderr
    assert "flash_attention_2 needs a CUDA GPU; using sdpa on cpu; the run records it in" in proc.stderr
    assert "optim.offload=true saves nothing on CPU" in proc.stderr
    assert "step 2/2" in proc.stdout and "run summary" in proc.stdout
    summary = json.loads((runs / "legacy" / "summary.json").read_text())
    assert summary["steps"] == 2
    # what ran is recorded beside what was asked for: sdpa, after the fallback
    resolved = yaml.safe_load((runs / "legacy" / "resolved.yaml").read_text())
    assert resolved["model"]["attn_implementation"] == "sdpa" and resolved["model"]["attn_implementation_requested"] == "flash_attention_2"
    assert "needs a CUDA GPU" in resolved["model"]["attn_implementation_fallback"] and resolved["train"]["device"] == "cpu"
    assert "attn_implementation: flash_attention_2  # ran as sdpa" in (runs / "legacy" / "config.yaml").read_text()


@pytest.mark.parametrize("setting", ["precision.mode=aggressive", "train.precision=fp8"])  # the second: the older spelling
def test_fp8_fails_clearly_on_cpu(runs, setting):
    proc = run_cli("-m", "scalerl.cli.main", "train", "--set", setting, "--set", f"log.run_dir={runs}", "--steps", "1")
    _one_line_error(proc, "precision.mode=aggressive", "H100", "precision.fp8=simulated", "precision.mode=standard")


def test_a_plugin_environment_trains_through_the_cli(runs):
    """The README's example environment, loaded as module:Class from PYTHONPATH by `--env_name`."""
    proc = run_cli("-m", "scalerl.cli.rl_train", "--env_name", "reverse_env:ReverseEnv", "--set", "env.args.n=300",
                   "--total_timesteps", "32", "--batch_size", "16", "--name", "plugin", "--set", f"log.run_dir={runs}",
                   "--set", "log.console=none", env={"PYTHONPATH": str(ROOT / "examples")})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((runs / "plugin" / "summary.json").read_text())
    assert summary["steps"] == 2 and 0.0 <= summary["pass_rate_after"] <= 1.0
    _one_line_error(run_cli("-m", "scalerl.cli.main", "train", "--set", "env.name=reverse_env:ReverseEnv",
                            "--set", "env.args.n=abc", env={"PYTHONPATH": str(ROOT / "examples")}), "env.args.n")


def test_a_hub_id_with_the_hub_off_fails_in_one_line(runs):
    proc = run_cli("-m", "scalerl.cli.main", "train", "--set", "model.path=nobody/no-such-model", "--set", f"log.run_dir={runs}",
                   env={"HF_HUB_OFFLINE": "1"})
    _one_line_error(proc, "nobody/no-such-model", "HF_HUB_OFFLINE=1")
    assert not runs.exists()  # nothing was created for a run that could not start


def test_estimate_names_the_workload_it_prices(tmp_path):
    """`--model-size 7b` alone prices the toy default job: the output says so, where each number came
    from, and how to price another; --config and --set name theirs (and a 7b job may ask for more
    tokens than the built-in model's 64 positions)."""
    proc = run_cli("-m", "scalerl.cli.main", "estimate", "--model-size", "7b", "--tokens-per-s", "2000")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("workload: the built-in default job (a toy: no --config or --set changed its size): env arithmetic, "
                               "300 steps x 16 prompts x group 8 = 128 completions per step and process, up to 8 new tokens each")
    assert lines[1] == "  from: default: train.steps=300, rollout.prompts_per_step=16, rollout.group_size=8, rollout.max_new_tokens=8"
    assert lines[2].startswith("  another workload: --config RUN.yaml, or --set train.steps=N --set rollout.prompts_per_step=P")
    assert "(--model-size 7b, a Llama-2 shape)" in lines[3]
    assert lines[-1].startswith("300 steps of the workload above x 1,024 generated tokens per step "
                                "(128 completions x up to 8 new tokens) at 2,000 tokens/s: ")
    job = tmp_path / "job.yaml"
    job.write_text("train:\n  steps: 2000\nrollout:\n  group_size: 16\n")
    proc = run_cli("-m", "scalerl.cli.main", "estimate", "--model-size", "7b", "--config", str(job), "--set", "rollout.max_new_tokens=512",
                   "--prompt-len", "256", "--tokens-per-s", "2000")
    assert proc.returncode == 0, proc.stderr
    first, sources = proc.stdout.splitlines()[:2]
    assert "2000 steps x 16 prompts x group 16 = 256 completions" in first and "up to 512 new tokens" in first
    assert "prompts of 256 tokens (--prompt-len)" in first
    assert sources == (f"  from: --config {job}: train.steps=2000, rollout.group_size=16; default: rollout.prompts_per_step=16; "
                       "--set: rollout.max_new_tokens=512")
    assert proc.stdout.splitlines()[-1].startswith("2000 steps of the workload above x 131,072 generated tokens per step")
    _one_line_error(run_cli("-m", "scalerl.cli.main", "estimate", "--model-size", "7b", "--set", "rollout.max_new_tokens=5000"),
                    "rollout.max_new_tokens=5000", "Llama-2 7b has 4096 positions")
    _one_line_error(run_cli("-m", "scalerl.cli.main", "estimate", "--set", "rollout.max_new_tokens=512"),
                    "rollout.max_new_tokens=512", "64 positions")  # the config's own model still binds without --model-size


def test_rl_train_takes_kebab_case_flags_too():
    """Every command's flags in one style: rl-train's --model_name is also --model-name (both kept)."""
    kebab = run_cli("-m", "scalerl.cli.rl_train", "--model-name", "builtin", "--env-name", "calculator", "--total-timesteps", "1e3",
                    "--batch-size", "64", "--learning-rate", "3e-5", "--dry-run")
    snake = run_cli("-m", "scalerl.cli.rl_train", "--model_name", "builtin", "--env_name", "calculator", "--total_timesteps", "1e3",
                    "--batch_size", "64", "--learning_rate", "3e-5", "--dry-run")
    assert kebab.returncode == 0 and snake.returncode == 0, kebab.stderr + snake.stderr
    resolved = yaml.safe_load(kebab.stdout)
    assert resolved == yaml.safe_load(snake.stdout)
    assert resolved["env"]["name"] == "calculator" and resolved["optim"]["lr"] == 3e-5 and resolved["train"]["steps"] == 16


def test_python_m_train_bool_flags_take_words():
    proc = run_cli("-m", "scalerl.train", "--gradient_checkpointing", "true", "--offload_optimizer", "off", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert resolved["model"]["gradient_checkpointing"] is True and resolved["optim"]["offload"] is False
    bad = run_cli("-m", "scalerl.train", "--gradient_checkpointing", "maybe", "--dry-run")
    assert bad.returncode == 2 and "is not 0, 1, true or false" in bad.stderr
