"""The training forward runs each group's prompt once (scalerl/models/logprobs.py, `share_prompts`):
the same log-probs, entropies, hidden states and gradients as the full forward, at fewer positions."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.models.logprobs import completion_forward, prompt_groups
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.hf import HFSampler
from scalerl.types import SamplingParams

PROMPTS = ["7+5=", "12+88=", "3+40=", "99+99="]  # different lengths: left padding differs between groups


def _batch(n: int = 4):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    rollout = sampler.sample(ids, SamplingParams(max_new_tokens=8, temperature=1.0, n=n), [1, 2, 3, 4])
    model.train()
    return model, rollout


def _run(model, batch, share: bool):
    model.zero_grad()
    out = completion_forward(model, batch, with_entropy=True, with_hidden=True, share_prompts=share)
    (out.logprobs * batch.completion_mask).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return out, grads


@pytest.mark.parametrize("rows", [slice(0, 16), slice(2, 11)])  # whole groups, and groups cut by a micro-batch's edges
def test_shared_prompts_give_the_full_forward_and_its_gradients(rows):
    model, rollout = _batch()
    batch = rollout.select(rows)
    full, g_full = _run(model, batch, share=False)
    shared, g_shared = _run(model, batch, share=True)
    for a, b in ((full.logprobs, shared.logprobs), (full.entropy, shared.entropy), (full.hidden, shared.hidden)):
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert ((g_shared - g_full).norm() / g_full.norm()).item() < 1e-5


def test_each_distinct_prompt_runs_once():
    model, rollout = _batch()
    assert prompt_groups(rollout).tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert prompt_groups(rollout.select(slice(3, 9))).tolist() == [0, 1, 1, 1, 1, 2]
    assert prompt_groups(rollout.select(slice(0, 16, 4))) is None  # no row repeats the one before it
    positions = []
    handle = model.get_input_embeddings().register_forward_hook(lambda _m, inputs, _out: positions.append(inputs[0].numel()))
    completion_forward(model, rollout, share_prompts=True)
    handle.remove()
    P, T = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    assert positions == [4 * P, 16 * T]  # 4 prompts once, then 16 completions, against 16 · (P + T) in one pass


def test_gradient_checkpointing_takes_the_full_path():
    model, rollout = _batch()
    model.gradient_checkpointing_enable()
    positions = []
    handle = model.get_input_embeddings().register_forward_hook(lambda _m, inputs, _out: positions.append(inputs[0].numel()))
    completion_forward(model, rollout, share_prompts=True)
    handle.remove()
    assert positions == [rollout.prompt_ids.numel() + rollout.completion_ids.numel()]
