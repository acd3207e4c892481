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
    with_entropy: bool = False, with_hidden: bool = False, share_prompts: bool = True,
) -> CompletionForward:
    """One forward pass over prompt + completion, keeping only what predicts the completion.

    Logits are divided by the sampling temperature so that the ratio to the sampler's log-probs
    compares like with like. With `fp32_head` the LM head's matmul and the softmax run in float32
    whatever the compute dtype (the ScaleRL recipe's FP32 LM head; free for fp32 models): under
    autocast or with low-precision weights the decoder's last hidden state goes through a float32
    copy of the head outside autocast. Only the T + 1 last positions get logits: the prompt's own
    next-token predictions are never needed.

    With `share_prompts`, rows that repeat the row before them's prompt (a GRPO group) run that prompt
    once: the decoder runs the distinct prompts with a KV cache, the cache is indexed out to every row
    (gradients flow back through the index, summing over the group), and the completions run on it.
    Exact up to float rounding; it saves (n − 1)/n of the prompt positions' forward and backward.
    Models with gradient checkpointing (no cache in training) or soft-capped logits take the full path.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
    mask = batch.attention_mask()  # (B, P+T); a multi-turn episode's observations are context too
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    if share_prompts and (groups := prompt_groups(batch)) is not None and _can_share(model):
        last = _shared_prompt_hidden(model, batch, mask, positions, groups)  # (B, T, H)
    elif fp32_head and head_not_fp32(model, ids.device.type):
        out = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        last = out.last_hidden_state[:, -(T + 1):-1]  # (B, T, H) after the final norm
    else:  # the model's own head (and its soft-capping, if any)
        last = None
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=T + 1,
                    output_hidden_states=with_hidden)
        logits = out.logits[:, :-1]  # (B, T, V): position P-1+t predicts completion token t
        logits = logits.float() if fp32_head else logits
        hidden = out.hidden_states[-1][:, -(T + 1):-1] if with_hidden else None  # (B, T, H)
    if last is not None:
        logits, hidden = head_logits(model, last, fp32_head), last if with_hidden else None
    logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T)
    logprobs = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - log_norm  # (B, T)
    entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else None  # H = logZ − Σ p·z
    return CompletionForward(logprobs, entropy, hidden)


def prompt_groups(batch: Rollout) -> torch.Tensor | None:
    """(B,) index of each row's prompt among the batch's runs of identical consecutive prompts (row i
    repeats row i−1's prompt and mask), or None when no row repeats the one before it."""
    ids, mask = batch.prompt_ids, batch.prompt_mask
    if len(ids) < 2:
        return None
    repeats = (ids[1:] == ids[:-1]).all(1) & (mask[1:] == mask[:-1]).all(1)  # (B−1,)
    if not bool(repeats.any()):
        return None
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=ids.device), ~repeats])
    return starts.long().cumsum(0) - 1


def _can_share(model: torch.nn.Module) -> bool:
    # transformers 5.x renamed is_gradient_checkpointing (which now warns) to is_activation_checkpointing
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return (model.get_output_embeddings() is not None and not getattr(model.config, "final_logit_softcapping", None)
            and not getattr(model, name, False))


def _shared_prompt_hidden(model: torch.nn.Module, batch: Rollout, mask: torch.Tensor, positions: torch.Tensor,
                          groups: torch.Tensor) -> torch.Tensor:
    """(B, T, H) final hidden states at the positions that predict each completion token, with each
    distinct prompt run once (see `completion_forward`)."""
    decoder, P = model.get_decoder(), batch.prompt_ids.shape[1]
    first = torch.cat([torch.zeros(1, dtype=torch.long, device=groups.device), (groups[1:] != groups[:-1]).nonzero().squeeze(1) + 1])
    prompt = decoder(input_ids=batch.prompt_ids[first], attention_mask=batch.prompt_mask[first], position_ids=positions[first, :P],
                     use_cache=True)
    cache_name = "cache" if hasattr(prompt, "cache") else "past_key_values"  # transformers 5.x renamed it
    cache = getattr(prompt, cache_name)
    cache.batch_select_indices(groups)  # (U, ...) → (B, ...), differentiable
    rest = decoder(input_ids=batch.completion_ids, attention_mask=mask, position_ids=positions[:, P:], use_cache=True,
                   **{cache_name: cache})
    # position P−1 (the prompt's last) predicts completion token 0; P−1+t predicts token t
    return torch.cat([prompt.last_hidden_state[groups, -1:], rest.last_hidden_state[:, :-1]], dim=1)


def head_logits(model: torch.nn.Module, hidden: torch.Tensor, fp32_head: bool) -> torch.Tensor:
    """The LM head on final hidden states (..., H). With `fp32_head` and a head that would multiply in
    less than float32, a float32 matmul outside autocast on float32 copies of the hidden states and the
    head; otherwise the model's head, its output cast to float32 with `fp32_head`."""
    head = model.get_output_embeddings()
    if fp32_head and head_not_fp32(model, hidden.device.type):
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), head.weight.float(), None if head.bias is None else head.bias.float())
    logits = head(hidden)
    return logits.float() if fp32_head else logits


def head_not_fp32(model: torch.nn.Module, device_type: str) -> bool:
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
