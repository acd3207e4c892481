"""The chunked head (scalerl/models/chunked_logprobs.py): log-probs, entropy and every gradient equal to the
whole-logits path's to round-off in float64, on every layout; the logits never exist whole; "auto" keeps
small batches on the whole-logits path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.config.plan import chunk_positions
from scalerl.models.logprobs import CompletionModel, completion_forward
from scalerl.types import Rollout

VOCAB = 97


@pytest.fixture(scope="module")
def model_and_batch():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=VOCAB, tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).double().train()
    g = torch.Generator().manual_seed(1)
    B, P, T = 6, 5, 9
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    completion_mask = torch.ones(B, T, dtype=torch.long)
    completion_mask[2, 6:] = 0  # a shorter completion
    prompts = torch.randint(3, VOCAB, (B, P), generator=g)
    prompts[3], prompt_mask[3] = prompts[2], prompt_mask[2]  # a group of two: "shared" and "packed" run it once
    batch = Rollout(prompt_ids=prompts, prompt_mask=prompt_mask, completion_ids=torch.randint(3, VOCAB, (B, T), generator=g),
                    completion_mask=completion_mask, sampler_logprobs=torch.zeros(B, T), group_ids=torch.tensor([0, 1, 2, 2, 3, 4]),
                    truncated=torch.zeros(B, dtype=torch.bool))
    return model, batch


def _run(model, batch, **options):
    """Log-probs, entropy, and the gradients of a loss that weighs both with random per-token weights."""
    model.zero_grad()
    out = completion_forward(model, batch, temperature=0.7, fp32_head=False, with_entropy=True, **options)
    w = torch.randn(out.logprobs.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ((out.logprobs * w).sum() + 0.3 * (out.entropy * w.flip(0)).sum()).backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("layout", ["full", "shared", "packed"])
@pytest.mark.parametrize("chunk", [1, 7, 16])  # one position a chunk, chunks that cut rows, a short last chunk
def test_chunked_equals_whole_logits_in_float64(model_and_batch, layout, chunk):
    model, batch = model_and_batch
    real = batch.completion_mask.bool()
    whole, g_whole = _run(model, batch, layout=layout, chunk_tokens=0)
    chunked, g_chunked = _run(model, batch, layout=layout, chunk_tokens=chunk)
    assert chunked.logprobs.dtype == torch.float64
    assert (chunked.logprobs - whole.logprobs)[real].abs().max() <= 1e-6
    assert (chunked.entropy - whole.entropy)[real].abs().max() <= 1e-6
    assert whole.logprobs[real].abs().min() > 1.0  # not trivially equal: real log-probs of a 97-token vocabulary
    for name, g in g_whole.items():
        assert g.abs().max() > 0, name
        assert (g_chunked[name] - g).abs().max() <= 1e-6 * max(1.0, g.abs().max().item()), name


def test_the_logits_never_exist_whole(model_and_batch):
    """No tensor of the forward or the backward has the (B, T, V) logits' size with chunks of 4 positions;
    the whole-logits path does make one (the check can see it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, batch = model_and_batch
    B, T = batch.completion_ids.shape
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # the head's weight and its views are not logits

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.shape[-1:] == (VOCAB,) and t.untyped_storage().data_ptr() not in weights:
                    self.largest = max(self.largest, t.numel() // VOCAB)  # positions of logits in one tensor
            return out

    for chunk, most in ((4, 4), (0, B * T)):
        with Largest() as seen:
            _run(model, batch, layout="full", chunk_tokens=chunk)
        assert seen.largest == most if chunk else seen.largest >= most, (chunk, seen.largest)


def test_auto_chunks_only_what_does_not_fit_one_chunk():
    # 2^24 / V positions: 512 at a 32k vocabulary, 110 at Qwen's 152k; 0 never chunks; a number is taken as it is
    assert chunk_positions(None, 32768) == 512 and chunk_positions(None, 151936) == 110
    assert chunk_positions(0, 32768) == 0 and chunk_positions(64, 32768) == 64
    assert CompletionModel(torch.nn.Identity()).chunk_tokens is None  # the learner's models default to auto
