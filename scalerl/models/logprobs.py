"""Per-token log-probabilities of completions under a causal LM (the policy or the reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalerl.types import Rollout


@dataclass
class CompletionForward:
    logprobs: torch.Tensor  # (B, T) log π(y_t | x, y_<t)
    entropy: torch.Tensor | None = None  # (B, T) entropy of π(· | x, y_<t), with grad
    hidden: torch.Tensor | None = None  # (B, T, H) last hidden state at the positions that predict y_t


def completion_forward(
    model: torch.nn.Module, batch: Rollout, *, temperature: float = 1.0, fp32_head: bool = True,
    with_entropy: bool = False, with_hidden: bool = False,
) -> CompletionForward:
    """One forward pass over prompt + completion, keeping only what predicts the completion.

    Logits are divided by the sampling temperature so that the ratio to the sampler's log-probs
    compares like with like. With `fp32_head` the logits are cast to float32 before the softmax
    (the ScaleRL recipe's FP32 LM head; free for fp32 models). Only the T + 1 last positions get
    logits (`logits_to_keep`): the prompt's own next-token predictions are never needed.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
    mask = batch.attention_mask()  # (B, P+T); a multi-turn episode's observations are context too
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=T + 1,
                output_hidden_states=with_hidden)
    logits = out.logits[:, :-1]  # (B, T, V): position P-1+t predicts completion token t
    if fp32_head:
        logits = logits.float()
    logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T)
    logprobs = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - log_norm  # (B, T)
    entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else None  # H = logZ − Σ p·z
    hidden = out.hidden_states[-1][:, -(T + 1):-1] if with_hidden else None  # (B, T, H)
    return CompletionForward(logprobs, entropy, hidden)


def completion_logprobs(
    model: torch.nn.Module, batch: Rollout, *, temperature: float = 1.0, fp32_head: bool = True, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy or None), both (B, T); see `completion_forward`."""
    out = completion_forward(model, batch, temperature=temperature, fp32_head=fp32_head, with_entropy=with_entropy)
    return out.logprobs, out.entropy
