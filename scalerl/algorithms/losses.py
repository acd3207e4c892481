"""Policy and value losses: per-token objectives, the one function that reduces them, and the
diagnostics that go with them.

Vocabulary: `logprobs` (current policy, with grad), `old_logprobs` (the policy that the ratio is
taken against, no grad), `sampler_logprobs` (the policy that generated the tokens, e.g. vLLM or a
stale asynchronous copy), `ref_logprobs` (frozen reference), `advantages` (one per completion (B,)
or one per token (B, T)), `loss_mask` (1 on completion tokens that are trained on, 0 on padding),
`group_ids` (B,) (consecutive equal ids are one prompt's completions).

Each objective returns per-token values (B, T) and leaves the reduction to `aggregate`, so any
objective combines with any aggregation level; `policy_stats` computes the detached diagnostics.
"""

from __future__ import annotations

from typing import Literal

import torch

from scalerl.algorithms.kl import KLEstimator, kl_estimate

LossAgg = Literal["token", "sequence", "prompt"]


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """(B,) per-completion advantages become (B, 1) to broadcast over tokens; (B, T) pass through."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    level: LossAgg,
    normalizer: float | torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token values (B, T) to a scalar.

        token:    Σ_i Σ_t m_it v_it / D                                   D = Σ_i Σ_t m_it by default
        sequence: Σ_i (Σ_t m_it v_it / Σ_t m_it) / D                      D = B by default
        prompt:   Σ_g (Σ_{i∈g} Σ_t m_it v_it / Σ_{i∈g} Σ_t m_it) / D      D = number of groups by default

    "prompt" is the ScaleRL paper's prompt-level aggregation (Khatri et al., 2025): a token mean
    inside each prompt's group, then a mean over prompts. It needs `group_ids` (B,), where
    consecutive equal ids form one group (ids may repeat non-consecutively: each run is a group).

    `normalizer` replaces D when the batch is split into micro-batches (or across ranks): pass the
    token (sequence, group) count of the whole mini-batch so that accumulated gradients equal
    those of the unsplit batch. At prompt level this holds only if no group is split across
    micro-batches. A completion (or group) with no trained tokens contributes 0 but still counts
    in the default D, as a padded row does at sequence level.
    """
    mask = loss_mask.to(values.dtype)
    match level:
        case "token":
            total = (values * mask).sum()
            denom = mask.sum() if normalizer is None else normalizer
        case "sequence":
            per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
            total = per_seq.sum()
            denom = values.shape[0] if normalizer is None else normalizer
        case "prompt":
            if group_ids is None:
                raise ValueError("prompt-level aggregation needs group_ids")
            _, group = torch.unique_consecutive(group_ids, return_inverse=True)  # (B,) in 0..G-1
            n_groups = int(group.max()) + 1 if group.numel() else 0
            sums = values.new_zeros(n_groups).index_add(0, group, (values * mask).sum(dim=1))  # (G,)
            counts = values.new_zeros(n_groups).index_add(0, group, mask.sum(dim=1))  # (G,)
            total = (sums / counts.clamp(min=1.0)).sum()
            denom = n_groups if normalizer is None else normalizer
        case _:
            raise ValueError(f"unknown loss aggregation {level!r}; use token, sequence or prompt")
    return total / max(float(denom), 1.0) if not torch.is_tensor(denom) else total / denom.clamp(min=1.0)


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate, per token (Schulman et al., 2017, eq. 7; DAPO's clip-higher when
    eps_high > eps_low, Yu et al., 2025).

        ρ_t = exp(log π_θ(y_t) − sg(log π_old(y_t)))
        ℓ_t = −min(ρ_t Â, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â)

    Args:
        logprobs, old_logprobs: (B, T).
        advantages: (B,) one per completion, or (B, T) per token.
    Returns:
        per_token ℓ (B, T), and `clipped` (B, T) bool: the clipped branch is the minimum (its
        gradient is zero), as TRL counts clip_frac. A = 0 is never clipped.
    """
    adv = _per_token(advantages)  # (B, 1) or (B, T)
    ratio = torch.exp(logprobs - old_logprobs.detach())  # (B, T)
    unclipped = ratio * adv
    clipped_obj = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped_obj)  # (B, T)
    return per_token, (clipped_obj < unclipped).detach()


def cispo_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_max: float = 5.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO, per token (MiniMax-M1, 2025; the ScaleRL paper's choice, Khatri et al., 2025).

        ρ_t = exp(log π_θ(y_t) − log π_old(y_t))
        ℓ_t = −sg(min(ρ_t, ε_max)) · Â · log π_θ(y_t)

    The importance weight is truncated from above only and is under stop-gradient, so every token
    keeps a gradient −sg(min(ρ_t, ε_max)) Â ∇log π_θ(y_t) (PPO's clip zeroes it instead). The
    paper's 1/Σ|y| normalisation is `aggregate(..., "token")`, applied by the caller. The value of
    ℓ is not meaningful by itself (it scales with log π); only its gradient is.

    Args:
        logprobs, old_logprobs: (B, T).
        advantages: (B,) one per completion, or (B, T) per token.
    Returns:
        per_token ℓ (B, T), and `clipped` (B, T) bool: ρ_t > ε_max (the weight was truncated).
    """
    with torch.no_grad():
        ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
        weight = ratio.clamp(max=eps_max)  # (B, T), no lower bound
    per_token = -weight * _per_token(advantages) * logprobs  # (B, T)
    return per_token, ratio > eps_max


def truncated_is_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, *, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights for tokens generated by a different policy (the
    inference engine, or a stale copy in asynchronous RL), Yao et al., 2025, "Your efficient RL
    framework secretly brings you off-policy RL training":

        w_t = sg(min(π_old(y_t) / π_sampler(y_t), C))

    Multiply the per-token objective by w (before `aggregate`). Returns (B, T), detached.
    """
    with torch.no_grad():
        return torch.exp(old_logprobs - sampler_logprobs).clamp(max=cap)  # (B, T)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    clip_eps: float | None = 0.2,
) -> torch.Tensor:
    """PPO clipped value loss, per token (as in OpenAI baselines' ppo2 and cleanrl):

        V_clip = V_old + clip(V − V_old, −ε, ε)
        ℓ_t    = ½ · max((V − R)², (V_clip − R)²)          ℓ_t = ½ (V − R)² when clip_eps is None

    `old_values` and `returns` are targets (stop-gradient). All tensors (B, T); returns (B, T).
    """
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns).square()  # (B, T)
    if clip_eps is None:
        return 0.5 * unclipped
    v_clip = old_values + (values - old_values).clamp(-clip_eps, clip_eps)  # (B, T)
    return 0.5 * torch.maximum(unclipped, (v_clip - returns).square())


def policy_stats(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    clipped: torch.Tensor,
    loss_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Detached diagnostics, means over the trained tokens (all (B, T) inputs):

        clip_frac  = mean(clipped)
        approx_kl  = mean(e^Δ − 1 − Δ),  Δ = log π_θ − log π_old   (k3 estimate of KL(π_old ‖ π_θ),
                                                                   PPO implementations' approx_kl)
        ratio_mean = mean(ρ), ratio_max = max(ρ)                   (1.0 when no token is trained)
    """
    with torch.no_grad():
        mask = loss_mask.bool()
        n = mask.sum().clamp(min=1)
        log_ratio = logprobs - old_logprobs  # (B, T)
        ratio = torch.exp(log_ratio)
        return {
            "clip_frac": (clipped.bool() & mask).sum() / n,
            "approx_kl": ((torch.expm1(log_ratio) - log_ratio) * mask).sum() / n,
            "ratio_mean": (ratio * mask).sum() / n,
            "ratio_max": ratio.masked_fill(~mask, 0.0).max() if mask.any() else ratio.new_tensor(1.0),
        }


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    loss_agg: LossAgg = "token",
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO clipped surrogate with an optional KL penalty (DeepSeekMath eq. 3; DAPO's
    clip-higher when eps_high > eps_low).

        ρ_t = exp(log π_θ(y_t) − log π_old(y_t))
        ℓ_t = −min(ρ_t Â, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â) + β · KL_t(π_θ ‖ π_ref)
        L   = aggregate(ℓ, loss_mask)

    π_old is under stop-gradient (it is data). With one update per sampled batch ρ ≡ 1 and the
    gradient is the plain policy gradient −Â ∇log π_θ. Prompt-level aggregation needs group ids:
    compose `clipped_surrogate`, `kl_estimate` and `aggregate` directly for it.

    Args:
        logprobs, old_logprobs, loss_mask: (B, T).
        advantages: (B,) one per completion, or (B, T) per token.
        ref_logprobs: (B, T), required when beta > 0.
        normalizer: see `aggregate`.
    Returns:
        The scalar loss and detached diagnostics: clip_frac, approx_kl (to π_old), ratio_mean/max
        (see `policy_stats`), kl (to π_ref, whenever ref_logprobs is given).
    """
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    per_token, clipped = clipped_surrogate(
        logprobs, old_logprobs, advantages, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high
    )  # (B, T)
    kl = None
    if ref_logprobs is not None:  # with beta = 0 the KL is only measured
        kl = kl_estimate(logprobs, ref_logprobs.detach(), kl_estimator)  # (B, T)
        per_token = per_token + beta * kl
    loss = aggregate(per_token, loss_mask, loss_agg, normalizer)

    stats = policy_stats(logprobs, old_logprobs, clipped, loss_mask)
    if kl is not None:
        with torch.no_grad():
            stats["kl"] = (kl * loss_mask.bool()).sum() / loss_mask.bool().sum().clamp(min=1)
    return loss, stats
