"""docs/your-model.md, executed as written: its files are extracted from the page (data.jsonl, my_reward.py,
run.yaml, train.py) and its commands run, on a random-init two-layer Qwen2 built here (nothing downloaded).
The only changes to the page's text: the model folder (`path/to/your-model`), 5 steps instead of 100, the data
rows repeated to 40 (the page shows 3), and small batches (passed as --set, or added to the Python config)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT

PAGE = ROOT / "docs" / "your-model.md"
SMALL = {"rollout.prompts_per_step": 2, "rollout.group_size": 4, "rollout.max_new_tokens": 6, "train.threads": 1,
         "eval.every": 0, "log.console": "plain", "log.tensorboard": False}


def page_files() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r'```\w+ title="([^"]+)"\n(.*?)```', PAGE.read_text(), re.S)}


def page_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


@pytest.fixture
def workdir(tmp_path) -> Path:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from scalerl.models.paths import builtin_model_dir

    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    files = page_files()
    assert set(files) == {"data.jsonl", "my_reward.py", "run.yaml", "train.py"}, set(files)
    for name, text in files.items():
        text = text.replace("path/to/your-model", str(tmp_path / "model")).replace("steps: 100", "steps: 5")
        text = text.replace('"train.steps": 100', '"train.steps": 5, ' + ", ".join(f'"{k}": {v!r}' for k, v in SMALL.items()))
        if name == "data.jsonl":
            rows = [json.loads(line) for line in text.splitlines()]
            text = "".join(json.dumps(rows[i % len(rows)]) + "\n" for i in range(40))
        (tmp_path / name).write_text(text)
    return tmp_path


def _env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # no PYTHONPATH: the page says reward modules are found in the folder


def test_the_page_from_the_command_line(workdir):
    commands = page_commands()
    assert len(commands) == 3 and commands[0].endswith("--dry-run") and commands[1].endswith("--name mine"), commands
    sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]
    for command in commands:
        words = shlex.split(command)
        env = _env(workdir)
        assert words[0] == "scalerl", command
        extra = sets if words[1] == "train" else []
        proc = subprocess.run([sys.executable, "-m", "scalerl.cli.main", *words[1:], *extra], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
        if words[1] == "train" and "--dry-run" not in words:  # no verifier: the held-out figure is a mean reward, not a pass rate
            assert "step 5/5  reward " in proc.stdout and "  eval " in proc.stdout and "  pass " not in proc.stdout, proc.stdout
    metrics = [json.loads(line) for line in (workdir / "runs" / "mine" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert all(m["reward/color_failures"] == 0 for m in metrics)  # the page's reward ran on every completion
    assert json.loads((workdir / "runs" / "mine" / "summary.json").read_text())["steps"] == 5


def test_the_page_from_python(workdir):
    proc = subprocess.run([sys.executable, "train.py"], cwd=workdir, env=_env(workdir), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out reward:" in proc.stdout
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(workdir / "my-model-rl").config.model_type == "qwen2"
