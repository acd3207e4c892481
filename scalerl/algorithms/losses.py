"""Policy losses: per-token objectives, and the one function that reduces them.

Vocabulary: `logprobs` (current policy, with grad), `old_logprobs` (the policy that the ratio is
taken against, no grad), `ref_logprobs` (frozen reference), `advantages` (one per completion),
`loss_mask` (1 on completion tokens that are trained on, 0 on padding).
"""

from __future__ import annotations

from typing import Literal

import torch

from scalerl.algorithms.kl import KLEstimator, kl_estimate

LossAgg = Literal["token", "sequence"]


def aggregate(values: torch.Tensor, loss_mask: torch.Tensor, level: LossAgg, normalizer: float | None = None) -> torch.Tensor:
    """Reduce per-token values (B, T) to a scalar.

        token:    Σ_i Σ_t m_it v_it / D      D = Σ_i Σ_t m_it by default
        sequence: Σ_i (Σ_t m_it v_it / Σ_t m_it) / D      D = B by default

    `normalizer` replaces D when the batch is split into micro-batches (or across ranks): pass the
    token (or sequence) count of the whole mini-batch so that accumulated gradients equal those of
    the unsplit batch. A completion with no trained tokens contributes 0.
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
        case _:
            raise ValueError(f"unknown loss aggregation {level!r}; use token or sequence")
    return total / max(float(denom), 1.0) if not torch.is_tensor(denom) else total / denom.clamp(min=1.0)


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
    gradient is the plain policy gradient −Â ∇log π_θ.

    Args:
        logprobs, old_logprobs, loss_mask: (B, T).
        advantages: (B,) one per completion, or (B, T) per token.
        ref_logprobs: (B, T), required when beta > 0.
        normalizer: see `aggregate`.
    Returns:
        The scalar loss and detached diagnostics: clip_frac, approx_kl (to π_old), ratio_mean/max,
        kl (to π_ref, whenever ref_logprobs is given).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # (B, T)
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    kl = None
    if ref_logprobs is not None:  # with beta = 0 the KL is only measured
        kl = kl_estimate(logprobs, ref_logprobs.detach(), kl_estimator)  # (B, T)
        per_token = per_token + beta * kl
    loss = aggregate(per_token, loss_mask, loss_agg, normalizer)

    with torch.no_grad():
        mask = loss_mask.bool()
        n = mask.sum().clamp(min=1)
        stats = {
            # Tokens where the clipped branch is the one taken (its gradient is zero), as TRL counts.
            "clip_frac": ((clipped < unclipped) & mask).sum() / n,
            # k3 estimate of KL(π_old ‖ π_θ), as in PPO implementations' approx_kl.
            "approx_kl": ((torch.expm1(log_ratio) - log_ratio) * mask).sum() / n,
            "ratio_mean": (ratio * mask).sum() / n,
            "ratio_max": ratio.masked_fill(~mask, 0.0).max() if mask.any() else ratio.new_tensor(1.0),
        }
        if kl is not None:
            stats["kl"] = (kl * mask).sum() / n
    return loss, stats
