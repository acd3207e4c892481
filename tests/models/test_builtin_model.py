"""The built-in base model: small, offline, deterministic to build, with room for RL."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from conftest import ROOT
from scalerl.models.char_tokenizer import build_char_tokenizer
from scalerl.models.paths import builtin_model_dir


def test_builtin_model_is_small_and_loads_offline():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = builtin_model_dir()
    assert (folder / "model.safetensors").stat().st_size <= 5 * 1024 * 1024
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "llama" and sum(p.numel() for p in model.parameters()) < 1_200_000
    # the shipped tokenizer is the one the package builds: same ids, BOS prepended
    assert tokenizer("12+35=")["input_ids"] == build_char_tokenizer()("12+35=")["input_ids"] == [1, 5, 6, 14, 7, 9, 15]


def test_builtin_pass_rate_leaves_room_for_rl(tmp_path):
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer import loop

    config = load_config(overrides={"log.run_dir": str(tmp_path), "log.name": "eval"})
    rollout, _, _ = loop.build_roles(config, DistContext(), False)
    assert 0.15 <= rollout.evaluate(0) <= 0.5  # measured: 0.325


def test_build_script_is_deterministic(tmp_path):
    digests = []
    for name in ("a", "b"):
        proc = subprocess.run([sys.executable, "scripts/build_base_model.py", "--steps", "15", "--out", str(tmp_path / name)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        digests.append(hashlib.sha256((tmp_path / name / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]
