"""The KV-cached sampler against the model's own full forward and against `generate`."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.models.logprobs import completion_logprobs
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.base import SamplingParams
from scalerl.rollout.hf import HFSampler

PROMPTS = ["7+5=", "12+88=", "3+40=", "99+99="]  # different lengths, so left padding is exercised


def _setup():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    return tokenizer, model, sampler, [tokenizer(p)["input_ids"] for p in PROMPTS]


def test_sampler_logprobs_equal_the_training_forward():
    """The log-probs recorded while sampling (KV cache, one token at a time) are those the trainer
    recomputes with one full forward pass: at temperature 1 the importance ratio starts at exactly 1."""
    tokenizer, model, sampler, ids = _setup()
    batch = sampler.sample(ids, SamplingParams(max_new_tokens=8, temperature=1.0, n=4), torch.Generator().manual_seed(0))
    assert batch.completion_ids.shape[0] == 16 and batch.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, batch)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.sampler_logprobs[mask], atol=1e-4)
    assert (batch.sampler_logprobs[~mask] == 0).all()


def test_masks_and_truncation_flags():
    tokenizer, model, sampler, ids = _setup()
    batch = sampler.sample(ids, SamplingParams(max_new_tokens=3, temperature=1.0, n=8), torch.Generator().manual_seed(1))
    eos = tokenizer.eos_token_id
    for row, mask, cut in zip(batch.completion_ids.tolist(), batch.completion_mask.tolist(), batch.truncated.tolist()):
        n = sum(mask)
        assert mask == [1] * n + [0] * (len(mask) - n)  # trained tokens come first, then padding
        assert cut == (eos not in row[:n])  # truncated exactly when no EOS was produced
        if not cut:
            assert row[n - 1] == eos and all(t == tokenizer.pad_token_id for t in row[n:])


def test_greedy_matches_transformers_generate():
    tokenizer, model, sampler, ids = _setup()
    ours = sampler.sample(ids, SamplingParams(max_new_tokens=6, temperature=0.0), None)
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    ref = model.generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)[:, enc["input_ids"].shape[1]:]
    for mine, theirs, mask in zip(ours.completion_ids.tolist(), ref.tolist(), ours.completion_mask.tolist()):
        n = sum(mask)
        assert mine[:n] == theirs[:n]


def test_same_generator_state_same_samples():
    _, _, sampler, ids = _setup()
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=5, n=4)
    a = sampler.sample(ids, params, torch.Generator().manual_seed(3))
    b = sampler.sample(ids, params, torch.Generator().manual_seed(3))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampler_logprobs, b.sampler_logprobs)
