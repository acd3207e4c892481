"""Per-token log-probabilities of completions under a causal LM (the policy or the reference)."""

from __future__ import annotations

import torch

from scalerl.rollout.base import Rollout


def completion_logprobs(
    model: torch.nn.Module, batch: Rollout, *, temperature: float = 1.0, fp32_head: bool = True, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(y_t | x, y_<t) for every completion token, (B, T), and optionally the entropy (B, T).

    Logits are divided by the sampling temperature so that the ratio to the sampler's log-probs
    compares like with like. With `fp32_head` the logits are cast to float32 before the softmax
    (the ScaleRL recipe's FP32 LM head; free for fp32 models). Only the T + 1 last positions get
    logits (`logits_to_keep`): the prompt's own next-token predictions are never needed.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=T + 1).logits
    logits = logits[:, :-1]  # (B, T, V): position P-1+t predicts completion token t
    if fp32_head:
        logits = logits.float()
    logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T)
    logprobs = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - log_norm  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            p = torch.softmax(logits, dim=-1)
            entropy = log_norm - (p * logits).sum(-1)  # H = logZ - Σ p·z
    return logprobs, entropy
