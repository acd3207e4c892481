"""Rollout with a Hugging Face causal LM: batched, KV-cached sampling in a plain loop.

A hand-written loop rather than `model.generate`: we need the sampling distribution's log-prob
of every token (for off-policy correction and diagnostics) and nothing of generate's machinery;
on small models the loop is also several times cheaper per token. The model's own forward with
`past_key_values` does the caching, so any architecture that supports `generate` works here.
"""

from __future__ import annotations

import inspect

import torch

from scalerl.rollout.base import Rollout, SamplingParams


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, P), real tokens aligned on the right."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids, mask


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. logits: (B, V) float32."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFSampler:
    """Samples from the training model itself (weights are shared, so `sync_weights` is a no-op)."""

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_id: int, device: torch.device):
        self.model, self.pad_id, self.eos_id, self.device = model, pad_id, eos_id, device
        # transformers 5.x renamed the cache argument of forward from `past_key_values` to `cache`.
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def sync_weights(self) -> None:
        pass

    @torch.no_grad()
    def sample(self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator | None = None) -> Rollout:
        n = params.n
        ids, mask = left_pad(prompt_ids, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        was_training = self.model.training
        self.model.eval()

        # Prefill each prompt once, then copy its KV cache to its n samples: the prompt forward
        # costs a factor n less, and every row still samples independently.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (P, L); left padding shifts positions
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        past, logits = getattr(out, self._cache_arg), out.logits[:, -1]  # (P, V)
        if n > 1:
            past.batch_repeat_interleave(n)
            ids, mask, positions, logits = (x.repeat_interleave(n, dim=0) for x in (ids, mask, positions, logits))
        B = ids.shape[0]
        next_pos = positions[:, -1:] + 1  # (B, 1)
        attn = mask
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        tokens, logps = [], []
        for step in range(params.max_new_tokens):
            logits = logits.float()
            if params.temperature == 0:
                token = logits.argmax(-1)  # (B,)
                logp = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
            else:
                logp_all = filter_logits(logits / params.temperature, params.top_k, params.top_p).log_softmax(-1)
                token = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)  # (B,)
                logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
            token = token.masked_fill(finished, self.pad_id)
            tokens.append(token)
            logps.append(logp.masked_fill(finished, 0.0))
            finished = finished | (token == self.eos_id)
            if bool(finished.all()) or step == params.max_new_tokens - 1:
                break
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=self.device)], dim=1)
            out = self.model(input_ids=token[:, None], attention_mask=attn, position_ids=next_pos,
                             use_cache=True, **{self._cache_arg: past})
            past, logits = getattr(out, self._cache_arg), out.logits[:, -1]
            next_pos = next_pos + 1
        self.model.train(was_training)

        completion = torch.stack(tokens, dim=1)  # (B, T)
        # A token is part of the completion if no EOS came strictly before it.
        is_eos = (completion == self.eos_id).long()
        completion_mask = ((is_eos.cumsum(1) - is_eos) == 0).long()  # (B, T)
        return Rollout(
            prompt_ids=ids,
            prompt_mask=mask,
            completion_ids=completion,
            completion_mask=completion_mask,
            sampler_logprobs=torch.stack(logps, dim=1) * completion_mask,
            truncated=~finished,
            group_ids=torch.arange(len(prompt_ids), device=self.device).repeat_interleave(params.n),
        )
