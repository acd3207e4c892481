"""Every rollout engine through the `Sampler` contract (tests/rollout/sampler_contract.py), on the
built-in tiny Llama. The vLLM engine runs the same checks in test_vllm_engine.py (slow; skipped without vLLM),
on one engine for its module."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sampler_contract import CHECKS
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.hf import HFSampler


def _hf(tokenizer):
    return lambda model: HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))


ENGINES = {"hf": _hf}


@pytest.fixture(scope="module")
def tiny():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    return model, tokenizer


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("engine", list(ENGINES))
def test_sampler_contract(engine, check, tiny):
    model, tokenizer = tiny
    CHECKS[check](ENGINES[engine](tokenizer), model, tokenizer)
