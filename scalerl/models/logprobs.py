"""Per-token log-probabilities of completions under a causal LM (the policy or the reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

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
    compares like with like. With `fp32_head` the LM head's matmul and the softmax run in float32
    whatever the compute dtype (the ScaleRL recipe's FP32 LM head; free for fp32 models): under
    autocast or with low-precision weights the decoder's last hidden state goes through a float32
    copy of the head outside autocast. Only the T + 1 last positions get logits: the prompt's own
    next-token predictions are never needed.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
    mask = batch.attention_mask()  # (B, P+T); a multi-turn episode's observations are context too
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    if fp32_head and _head_not_fp32(model, ids.device.type):
        out = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        last = out.last_hidden_state[:, -(T + 1):-1]  # (B, T, H) after the final norm
        head = model.get_output_embeddings()
        with torch.autocast(ids.device.type, enabled=False):
            logits = F.linear(last.float(), head.weight.float(), None if head.bias is None else head.bias.float())
        hidden = last if with_hidden else None
    else:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=T + 1,
                    output_hidden_states=with_hidden)
        logits = out.logits[:, :-1]  # (B, T, V): position P-1+t predicts completion token t
        logits = logits.float() if fp32_head else logits
        hidden = out.hidden_states[-1][:, -(T + 1):-1] if with_hidden else None  # (B, T, H)
    logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T)
    logprobs = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - log_norm  # (B, T)
    entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else None  # H = logZ − Σ p·z
    return CompletionForward(logprobs, entropy, hidden)


def _head_not_fp32(model: torch.nn.Module, device_type: str) -> bool:
    """Whether the model's own LM head would multiply in less than float32 (autocast, or bf16/fp16 weights).
    Models that post-process their logits (Gemma's soft-capping) keep their own head: the cast comes after it."""
    head = model.get_output_embeddings()
    if head is None or getattr(model.config, "final_logit_softcapping", None):
        return False
    return torch.is_autocast_enabled(device_type) or head.weight.dtype != torch.float32


def completion_logprobs(
    model: torch.nn.Module, batch: Rollout, *, temperature: float = 1.0, fp32_head: bool = True, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy or None), both (B, T); see `completion_forward`."""
    out = completion_forward(model, batch, temperature=temperature, fp32_head=fp32_head, with_entropy=with_entropy)
    return out.logprobs, out.entropy
