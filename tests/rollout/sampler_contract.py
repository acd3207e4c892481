"""The `Sampler` contract (scalerl/rollout/base.py), as checks any engine can be run through.

`check_sampler_contract(make_sampler, model, tokenizer)` runs every check; `CHECKS` names them one
by one for a parametrized test. `make_sampler(model)` builds the engine over a Hugging Face causal
LM (the HF engine shares it; another engine loads its weights); the reference numbers come from
that same model's plain forward pass (`completion_forward`, or full logits without a KV cache).
Each check says in a comment which broken implementation it catches.
"""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch

from scalerl.models.logprobs import completion_forward
from scalerl.types import Rollout, SamplingParams

MakeSampler = Callable[[torch.nn.Module], object]
PROMPTS = ["7+5=", "12+88=", "3+40=", "99+99="]  # different lengths, so left padding is exercised


def _ids(tokenizer, prompts=PROMPTS) -> list[list[int]]:
    return [tokenizer(p)["input_ids"] for p in prompts]


def _completion_logits(model, batch: Rollout) -> torch.Tensor:
    """(B, T, V) float32 logits predicting each completion token, by one full forward (no KV cache)."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    mask = batch.attention_mask()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    return logits[:, -(T + 1):-1].float()


def check_shapes_and_grouping(make_sampler: MakeSampler, model, tokenizer) -> None:
    """B = prompts × n rows, prompt i's on rows i·n … i·n+n−1 (catches: interleaved groups, wrong group ids)."""
    sampler, ids, n = make_sampler(model), _ids(tokenizer), 3
    batch = sampler.sample(ids, SamplingParams(max_new_tokens=5, temperature=1.0, n=n), seeds=[11, 12, 13, 14])
    B = len(ids) * n
    assert len(batch) == B and batch.completion_ids.shape[0] == B and batch.prompt_ids.shape[0] == B
    assert batch.completion_ids.shape[1] <= 5
    assert batch.group_ids.tolist() == [g for g in range(len(ids)) for _ in range(n)]
    for shape_of in (batch.completion_mask, batch.sampler_logprobs):
        assert shape_of.shape == batch.completion_ids.shape
    assert batch.truncated.shape == batch.group_ids.shape == (B,)
    assert batch.sampler_logprobs.dtype == torch.float32 and batch.truncated.dtype == torch.bool
    # Row i·n+j carries prompt i, left-padded (real tokens flush right).
    for row in range(B):
        prompt = ids[row // n]
        assert batch.prompt_mask[row].tolist() == [0] * (batch.prompt_ids.shape[1] - len(prompt)) + [1] * len(prompt)
        assert batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist() == prompt


def check_eos_and_mask_conventions(make_sampler: MakeSampler, model, tokenizer) -> None:
    """Mask 1 up to and including the first EOS, pad and log-prob 0 after; truncated ⇔ no EOS
    (catches: EOS left out of the mask, tokens after EOS kept, a wrong truncation flag)."""
    sampler = make_sampler(model)
    eos, pad, max_new = tokenizer.eos_token_id, tokenizer.pad_token_id, 3
    batch = sampler.sample(_ids(tokenizer), SamplingParams(max_new_tokens=max_new, temperature=1.0, n=8), seeds=[1, 2, 3, 4])
    cut = batch.truncated.tolist()
    assert any(cut) and not all(cut)  # both kinds of row are exercised (measured: the sums end in 2-3 tokens)
    assert batch.completion_ids.shape[1] == max_new
    for row, mask, logps, truncated in zip(batch.completion_ids.tolist(), batch.completion_mask.tolist(),
                                           batch.sampler_logprobs.tolist(), cut):
        k = sum(mask)
        assert mask == [1] * k + [0] * (len(mask) - k)  # the completion comes first, then padding
        assert truncated == (eos not in row[:k])  # truncated exactly when no EOS was produced
        if truncated:
            assert k == max_new and eos not in row
        else:
            assert row.index(eos) == k - 1  # the first EOS is the last masked token
            assert all(t == pad for t in row[k:])
        assert all(lp == 0.0 for lp in logps[k:]) and all(lp <= 0.0 for lp in logps[:k])


def check_logprobs_equal_the_training_forward(make_sampler: MakeSampler, model, tokenizer) -> None:
    """At top_k 0 / top_p 1 the recorded log-probs are the trainer's forward at the same temperature
    (catches: the temperature left out of the log-probs, or a log-prob of the wrong token or row)."""
    sampler = make_sampler(model)
    for temperature in (0.7, 1.0):
        batch = sampler.sample(_ids(tokenizer), SamplingParams(max_new_tokens=8, temperature=temperature, n=4), seeds=[5, 6, 7, 8])
        with torch.no_grad():
            ref = completion_forward(model, batch, temperature=temperature).logprobs
        mask = batch.completion_mask.bool()
        assert int(mask.sum()) > 30
        assert torch.allclose(batch.sampler_logprobs[mask], ref[mask], atol=1e-5), temperature
        assert (batch.sampler_logprobs[~mask] == 0).all()


def check_top_k_filters_and_renormalises(make_sampler: MakeSampler, model, tokenizer) -> None:
    """With top_k, only top-k tokens are ever sampled and their log-probs are those of the
    renormalised top-k distribution (catches: filtering ignored, or log-probs of the unfiltered one)."""
    sampler, k, temperature = make_sampler(model), 3, 0.9
    prompts = _ids(tokenizer, ["Q", "1", "5+", "3+40="])  # flat first-token distributions: a 4th-best token would show up
    batch = sampler.sample(prompts, SamplingParams(max_new_tokens=6, temperature=temperature, top_k=k, n=32), seeds=[21, 22, 23, 24])
    logits = _completion_logits(model, batch) / temperature  # (B, T, V)
    mask = batch.completion_mask.bool()
    kth = logits.topk(k, dim=-1).values[..., -1]  # (B, T)
    chosen = logits.gather(-1, batch.completion_ids[..., None]).squeeze(-1)  # (B, T)
    assert (chosen[mask] >= kth[mask]).all()  # never outside the top k
    filtered = logits.masked_fill(logits < kth[..., None], float("-inf")).log_softmax(-1)
    renormalised = filtered.gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    full = logits.log_softmax(-1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    assert torch.allclose(batch.sampler_logprobs[mask], renormalised[mask], atol=1e-5)
    assert (batch.sampler_logprobs[mask] >= full[mask]).all() and (batch.sampler_logprobs[mask] > full[mask] + 1e-3).any()


def check_seeds_are_per_request(make_sampler: MakeSampler, model, tokenizer) -> None:
    """A prompt's samples depend on its seed alone (catches: one generator for the batch, a seed per
    row index instead of per prompt, the same draws for every sample of a prompt)."""
    sampler, ids = make_sampler(model), _ids(tokenizer)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=4)
    seeds = [101, 202, 303, 404]
    batch = sampler.sample(ids, params, seeds)
    n = params.n
    for i in range(len(ids)):
        alone = sampler.sample([ids[i]], params, [seeds[i]])
        rows = slice(i * n, i * n + n)
        k = alone.completion_ids.shape[1]
        assert torch.equal(batch.completion_ids[rows, :k], alone.completion_ids), i
        assert (batch.completion_mask[rows, k:] == 0).all()
        assert torch.allclose(batch.sampler_logprobs[rows, :k], alone.sampler_logprobs, atol=1e-5)
    # The same prompt and seed in another position, next to other prompts with other seeds.
    moved = sampler.sample([ids[2], ids[0], ids[3]], params, [9, seeds[0], 7])
    k = min(moved.completion_ids.shape[1], batch.completion_ids.shape[1])
    assert torch.equal(moved.completion_ids[n: 2 * n, :k], batch.completion_ids[:n, :k])
    # The same call twice: identical.
    again = sampler.sample(ids, params, seeds)
    assert torch.equal(again.completion_ids, batch.completion_ids) and torch.equal(again.sampler_logprobs, batch.sampler_logprobs)
    # Other seeds, other samples; and a prompt's n samples are not copies of one another.
    other = sampler.sample(ids, params, [s + 1 for s in seeds])
    for i in range(len(ids)):
        rows = slice(i * n, i * n + n)
        assert not torch.equal(other.completion_ids[rows], batch.completion_ids[rows]), i
    samples = [tuple(r) for r in batch.completion_ids.tolist()]
    assert all(len(set(samples[i * n: i * n + n])) > 1 for i in (0, 2))  # the prompts with spread-out answers
    with pytest.raises(ValueError, match="seeds"):
        sampler.sample(ids, params)  # sampling without seeds is refused, not silently unseeded


def check_greedy_is_argmax_without_seeds(make_sampler: MakeSampler, model, tokenizer) -> None:
    """Temperature 0 needs no seeds and is argmax decoding (catches: a broken KV cache or left-padding
    positions, which shift the logits; seeds required or used for greedy)."""
    sampler, ids, max_new = make_sampler(model), _ids(tokenizer), 6
    batch = sampler.sample(ids, SamplingParams(max_new_tokens=max_new, temperature=0.0, n=2))  # no seeds needed
    assert torch.equal(batch.completion_ids[0::2], batch.completion_ids[1::2])
    for i, prompt in enumerate(ids):
        seq, ref = list(prompt), []  # argmax decoding by full forwards, one prompt at a time
        for _ in range(max_new):
            with torch.no_grad():
                token = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            ref.append(token)
            seq.append(token)
            if token == tokenizer.eos_token_id:
                break
        k = int(batch.completion_mask[2 * i].sum())
        assert batch.completion_ids[2 * i, :k].tolist() == ref, i
    # seeds are ignored when nothing is drawn
    assert torch.equal(sampler.sample(ids, SamplingParams(max_new_tokens=max_new, temperature=0.0, n=2), [1, 2, 3, 4]).completion_ids,
                       batch.completion_ids)


def check_sync_weights_and_version(make_sampler: MakeSampler, model, tokenizer) -> None:
    """None records the version only; a state dict is what is sampled from next (catches: a state
    dict ignored, or loaded into something other than what samples)."""
    sampler = make_sampler(copy.deepcopy(model))  # a copy: the HF engine loads into the model it was given
    assert sampler.version == 0
    sampler.sync_weights(None, 7)
    assert sampler.version == 7
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    sampler.sync_weights({k: v.clone() for k, v in other.state_dict().items()}, 8)
    assert sampler.version == 8
    batch = sampler.sample(_ids(tokenizer), SamplingParams(max_new_tokens=6, temperature=1.0, n=2), [1, 2, 3, 4])
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        theirs = completion_forward(other, batch).logprobs
        before = completion_forward(model, batch).logprobs
    assert torch.allclose(batch.sampler_logprobs[mask], theirs[mask], atol=1e-5)
    assert not torch.allclose(batch.sampler_logprobs[mask], before[mask], atol=1e-3)


def check_first_token_frequencies_match_softmax(make_sampler: MakeSampler, model, tokenizer) -> None:
    """Over 4000 draws the first token's frequencies are softmax(logits / T) (catches an inverse CDF
    that samples the wrong distribution: the temperature left out of sampling, an off-by-one)."""
    sampler, temperature, draws = make_sampler(model), 0.7, 4000
    prompt = tokenizer("7+5=")["input_ids"]  # measured: top token 0.74 at T 0.7, 0.54 at T 1
    batch = sampler.sample([prompt], SamplingParams(max_new_tokens=1, temperature=temperature, n=draws), [12345])
    with torch.no_grad():
        probs = (model(input_ids=torch.tensor([prompt])).logits[0, -1].float() / temperature).softmax(-1)  # (V,)
    freq = torch.bincount(batch.completion_ids[:, 0], minlength=probs.shape[0]).double() / draws
    # σ of a frequency is √(p(1−p)/4000) ≤ 0.008; 0.03 is ~4σ for the widest.
    assert (freq - probs.double()).abs().max() < 0.03


CHECKS = {
    "shapes_and_grouping": check_shapes_and_grouping,
    "eos_and_mask_conventions": check_eos_and_mask_conventions,
    "logprobs_equal_the_training_forward": check_logprobs_equal_the_training_forward,
    "top_k_filters_and_renormalises": check_top_k_filters_and_renormalises,
    "seeds_are_per_request": check_seeds_are_per_request,
    "greedy_is_argmax_without_seeds": check_greedy_is_argmax_without_seeds,
    "sync_weights_and_version": check_sync_weights_and_version,
    "first_token_frequencies_match_softmax": check_first_token_frequencies_match_softmax,
}


def check_sampler_contract(make_sampler: MakeSampler, model, tokenizer) -> None:
    """Every check of the `Sampler` contract, on `model` (e.g. the built-in tiny Llama)."""
    for check in CHECKS.values():
        check(make_sampler, model, tokenizer)
