"""What the Hugging Face engine adds to the `Sampler` contract (test_sampler_contract.py runs that):
agreement with `generate`, the inverse-CDF draw at its edges, and argument checking."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.hf import HFSampler, inverse_cdf
from scalerl.types import SamplingParams

PROMPTS = ["7+5=", "12+88=", "3+40=", "99+99="]  # different lengths, so left padding is exercised


def _setup():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    return tokenizer, model, sampler, [tokenizer(p)["input_ids"] for p in PROMPTS]


def test_greedy_matches_transformers_generate():
    tokenizer, model, sampler, ids = _setup()
    ours = sampler.sample(ids, SamplingParams(max_new_tokens=6, temperature=0.0))
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    ref = model.generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)[:, enc["input_ids"].shape[1]:]
    for mine, theirs, mask in zip(ours.completion_ids.tolist(), ref.tolist(), ours.completion_mask.tolist()):
        n = sum(mask)
        assert mine[:n] == theirs[:n]


def test_non_finite_probabilities_are_a_clear_error_not_an_index_error():
    with pytest.raises(ScaleRLError, match="next-token probabilities are not finite"):
        inverse_cdf(torch.tensor([[0.5, float("nan"), 0.5]]), torch.tensor([0.3]))


def test_inverse_cdf_by_hand_and_never_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]] * 6)  # tokens 0, 2, 4 filtered out
    # cdf = [0, 0.25, 0.25, 1, 1]: u in [0, 0.25) picks 1, u in [0.25, 1) picks 3
    u = torch.tensor([0.0, 0.1, 0.2499, 0.25, 0.9, 1.0 - 2 ** -24])
    assert inverse_cdf(probs, u).tolist() == [1, 1, 1, 3, 3, 3]
    # u·total rounding up to the total (here forced with u = 1) must stay on the last kept token,
    # not run past the end onto filtered token 4 (or out of range)
    assert inverse_cdf(probs[:1], torch.tensor([1.0])).tolist() == [3]
    # unnormalised rows (total 0.5): u scales with the row's own total
    assert inverse_cdf(torch.tensor([[0.1, 0.0, 0.4]]), torch.tensor([0.19])).tolist() == [0]
    assert inverse_cdf(torch.tensor([[0.1, 0.0, 0.4]]), torch.tensor([0.21])).tolist() == [2]


def test_seeds_are_checked():
    _, _, sampler, ids = _setup()
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="`seeds`"):
        sampler.sample(ids, params)
    with pytest.raises(ValueError, match="`seeds` has 2 seeds for 4 prompts"):
        sampler.sample(ids, params, [1, 2])


def test_sync_weights_shares_or_loads_strictly():
    tokenizer, model, sampler, _ = _setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sampler.sync_weights(None, 3)  # the learner's own modules: nothing to load
    assert sampler.version == 3 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    partial = dict(before)
    partial.pop("lm_head.weight")
    with pytest.raises(RuntimeError, match="lm_head.weight"):
        sampler.sync_weights(partial, 4)  # strict: a state dict missing a weight is an error, not a half-update
    assert sampler.version == 3


def test_min_new_tokens_matches_generate_and_keeps_eos_out_of_the_first_tokens():
    tokenizer, model, sampler, ids = _setup()
    eos = tokenizer.eos_token_id
    ours = sampler.sample(ids, SamplingParams(max_new_tokens=6, temperature=0.0, min_new_tokens=4))
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    ref = model.generate(**enc, do_sample=False, max_new_tokens=6, min_new_tokens=4,
                         pad_token_id=tokenizer.pad_token_id)[:, enc["input_ids"].shape[1]:]
    for mine, theirs, mask in zip(ours.completion_ids.tolist(), ref.tolist(), ours.completion_mask.tolist()):
        n = sum(mask)
        assert n >= 4 and mine[:n] == theirs[:n]
    # the trained model answers in 2-3 tokens + EOS: with the floor, no completion ends before 4, sampled either
    sampled = sampler.sample(ids * 8, SamplingParams(max_new_tokens=6, temperature=1.0, min_new_tokens=4), list(range(32)))
    assert (sampled.completion_ids[:, :4] != eos).all() and (sampled.completion_mask.sum(1) >= 4).all()
    free = sampler.sample(ids * 8, SamplingParams(max_new_tokens=6, temperature=1.0), list(range(32)))
    assert (free.completion_mask.sum(1) < 4).any()  # without it some do


def test_the_decode_clock_records_each_decode_step_against_its_cache_length():
    """`scalerl plan` prices long completions from a short pilot with the decode's growth per cached position
    (rollout/hf.py: DecodeClock): the least-squares slope of a step's seconds on its cache length, and one record per
    decode step after the first token (min_new_tokens keeps every row going)."""
    from scalerl.rollout.hf import DecodeClock

    clock = DecodeClock()
    for c in (10, 11, 12, 13):
        clock.add(c, 0.002 + 3e-5 * c)
    assert clock.slope() == pytest.approx(3e-5, rel=1e-9) and clock.seconds == pytest.approx(0.008 + 3e-5 * 46)
    clock.reset()
    clock.add(10, 0.1)
    clock.add(10, 0.2)
    clock.add(10, 0.3)
    assert clock.slope() is None  # one cache length: no growth to measure
    _, _, sampler, ids = _setup()
    sampler.sample(ids, SamplingParams(max_new_tokens=6, min_new_tokens=6, temperature=1.0), seeds=[1, 2, 3, 4])
    width = max(map(len, ids))
    assert sampler.decode_clock.n == 5 and sampler.decode_clock.c == sum(width + k for k in range(1, 6))
    assert sampler.decode_clock.slope() is not None
