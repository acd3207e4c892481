"""The training forward's layouts (scalerl/models/logprobs.py): "shared" runs each group's prompt once,
"packed" runs each group as one sequence without padding; both give the full forward's log-probs,
entropies, hidden states and gradients on real tokens, at fewer positions, and "auto" picks by FLOPs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.models.logprobs import _layout, completion_forward, prompt_groups
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.hf import HFSampler
from scalerl.types import Rollout, SamplingParams

PROMPTS = ["7+5=", "12+88=", "3+40=", "99+99="]  # different lengths: left padding differs between groups


def _batch(n: int = 4, attn: str = "sdpa"):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32, attn_implementation=attn)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    rollout = sampler.sample(ids, SamplingParams(max_new_tokens=8, temperature=1.0, n=n), [1, 2, 3, 4])
    model.train()
    return model, rollout


def _run(model, batch, layout: str):
    model.zero_grad()
    out = completion_forward(model, batch, with_entropy=True, with_hidden=True, layout=layout)
    (out.logprobs * batch.completion_mask).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return out, grads


def _positions(model, batch, layout: str = "auto") -> list[int]:
    """The number of positions each decoder call ran, counted at the embedding."""
    seen = []
    handle = model.get_input_embeddings().register_forward_hook(lambda _m, inputs, _out: seen.append(inputs[0].numel()))
    completion_forward(model, batch, layout=layout)
    handle.remove()
    return seen


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("layout, rows", [  # whole groups, groups cut by a micro-batch's edges, no groups (packed only)
    ("shared", slice(0, 16)), ("shared", slice(2, 11)), ("packed", slice(0, 16)), ("packed", slice(2, 11)), ("packed", slice(0, 16, 4))])
def test_layouts_give_the_full_forward_and_its_gradients(rows, layout, attn):
    model, rollout = _batch(attn=attn)
    batch = rollout.select(rows)
    real = batch.completion_extent().bool()
    assert not real.all(), "the batch must have padding for the test to see it skipped"
    full, g_full = _run(model, batch, "full")
    other, g_other = _run(model, batch, layout)
    for a, b in ((full.logprobs, other.logprobs), (full.entropy, other.entropy), (full.hidden, other.hidden)):
        assert a.shape == b.shape
        torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=1e-5)
    assert ((g_other - g_full).norm() / g_full.norm()).item() < 1e-5


def test_packing_gives_the_full_forward_for_one_token_and_truncated_rows():
    """Packing leaves out each row's last token: a completion of a single token (EOS at once) runs nothing of its
    own, a truncated one runs all but its last; the numbers are the full forward's all the same."""
    model, rollout = _batch()
    T = rollout.completion_ids.shape[1]
    extent = rollout.completion_mask.clone()
    extent[0], extent[1] = (torch.arange(T) < 1).long(), 1  # row 0: one token; row 1: all T (truncated)
    batch = Rollout(**{**vars(rollout), "completion_mask": extent})
    real = extent.bool()
    full, g_full = _run(model, batch, "full")
    packed, g_packed = _run(model, batch, "packed")
    torch.testing.assert_close(packed.logprobs[real], full.logprobs[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.entropy[real], full.entropy[real], atol=1e-5, rtol=1e-5)
    assert ((g_packed - g_full).norm() / g_full.norm()).item() < 1e-5


def test_each_distinct_prompt_runs_once_and_packing_skips_padding():
    model, rollout = _batch()
    assert prompt_groups(rollout).tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert prompt_groups(rollout.select(slice(3, 9))).tolist() == [0, 1, 1, 1, 1, 2]
    assert prompt_groups(rollout.select(slice(0, 16, 4))) is None  # no row repeats the one before it
    P, T = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    assert _positions(model, rollout, "shared") == [4 * P, 16 * T]  # 4 prompts once, then 16 completions
    # each row's last real token predicts nothing: packing runs the others
    group_len = rollout.prompt_mask[::4].sum(1) + (rollout.completion_extent().sum(1) - 1).view(4, 4).sum(1)
    assert _positions(model, rollout, "packed") == [4 * int(group_len.max())]  # one pass, 4 sequences, no padding
    assert _positions(model, rollout) == _positions(model, rollout, "packed")  # short, padded: auto packs


def _lengths_batch(group: int, prompt: int, completion: int, lengths: list[int]) -> Rollout:
    """Rows in groups of `group` sharing a prompt of `prompt` tokens; row i has lengths[i] real completion tokens."""
    B, T = len(lengths), completion
    extent = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return Rollout(prompt_ids=(torch.arange(B) // group)[:, None].expand(B, prompt), prompt_mask=torch.ones((B, prompt), dtype=torch.long),
                   completion_ids=torch.ones((B, T), dtype=torch.long), completion_mask=extent,
                   sampler_logprobs=torch.zeros(B, T), truncated=torch.zeros(B, dtype=torch.bool), group_ids=torch.arange(B) // group)


def test_auto_packs_only_where_it_saves_flops():
    config = SimpleNamespace(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, intermediate_size=512,
                             _attn_implementation="sdpa")
    model = SimpleNamespace(config=config, get_output_embeddings=lambda: object(), is_gradient_checkpointing=False)
    # 8 completions of 3 tokens padded to 8: packing drops 5/8 of the completion positions
    assert _layout(model, _lengths_batch(8, 8, 8, [3] * 8)) == "packed"
    assert _layout(model, _lengths_batch(8, 8, 8, [3] * 16)) == "packed"  # two groups
    # 8 completions of 512 tokens, no padding: one 4,104-token sequence costs 8× the padded attention
    assert _layout(model, _lengths_batch(8, 8, 512, [512] * 8)) == "shared"
    config._attn_implementation = "flash_attention_2"  # no custom masks
    assert _layout(model, _lengths_batch(8, 8, 8, [3] * 8)) == "shared"


def test_gradient_checkpointing_packs_or_takes_the_full_path():
    model, rollout = _batch()
    model.gradient_checkpointing_enable()
    assert _layout(model, rollout) == "packed"  # no KV cache needed
    model.config._attn_implementation = "flash_attention_2"
    assert _layout(model, rollout) == "full"  # no custom mask, no cache in training: the full forward
