"""Policy and value losses: per-token objectives, the one function that reduces them, and the
diagnostics that go with them.

Vocabulary: `logprobs` (current policy, with grad), `old_logprobs` (the policy that the ratio is
taken against, no grad), `sampler_logprobs` (the policy that generated the tokens, e.g. vLLM or a
stale asynchronous copy), `ref_logprobs` (frozen reference), `advantages` (one per completion (B,)
or one per token (B, T)), `loss_mask` (1 on completion tokens that are trained on, 0 on padding),
`group_ids` (B,) (consecutive equal ids are one prompt's completions).

Each objective returns per-token values (B, T) and leaves the reduction to `aggregate`, so any
objective combines with any aggregation level; `policy_stats` computes the detached diagnostics.
`scalerl.algorithms.objective.rl_objective` composes these pieces into the one training loss.
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token", "sequence", "prompt", "constant", "sequence_sum"]
ImportanceLevel = Literal["token", "sequence"]


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """(B,) per-completion advantages become (B, 1) to broadcast over tokens; (B, T) pass through."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def masked_fill_zero(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """`values` with every position where `loss_mask` is 0 set to 0 by selection (`torch.where`),
    not by multiplication: NaN · 0 and inf · 0 are NaN, so a NaN or inf under the mask would leak
    into a masked sum (verl's and SkyRL's masked reductions select the same way). Shapes broadcast."""
    return torch.where(loss_mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    level: LossAgg,
    normalizer: float | torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    *,
    max_new_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values (B, T) to a scalar.

        token:    Σ_i Σ_t m_it v_it / D                                   D = Σ_i Σ_t m_it by default
        sequence: Σ_i (Σ_t m_it v_it / Σ_t m_it) / D                      D = B by default
        prompt:   Σ_g (Σ_{i∈g} Σ_t m_it v_it / Σ_{i∈g} Σ_t m_it) / D      D = number of groups by default
        constant: Σ_i Σ_t m_it v_it / D                                   D = B · max_new_tokens by default
        sequence_sum: Σ_i Σ_t m_it v_it / D                               D = B by default

    "sequence_sum" is LUSPO's length-unbiased reduction (TRL 1.16's loss_type="luspo"): each
    completion's tokens are summed, not averaged, then completions are averaged, so a long
    completion's tokens are not down-weighted by its length (GRPO's sequence mean does that).

    "constant" is Dr. GRPO's length-independent normaliser (Liu et al., 2025, "Understanding R1-Zero-
    like training"; TRL's loss_type="dr_grpo"): no completion's tokens are up- or down-weighted by its
    own length. It needs `max_new_tokens` unless `normalizer` is given.

    "prompt" is the ScaleRL paper's prompt-level aggregation (Khatri et al., 2025): a token mean
    inside each prompt's group, then a mean over prompts. It needs `group_ids` (B,), where
    consecutive equal ids form one group (ids may repeat non-consecutively: each run is a group).

    `normalizer` replaces D when the batch is split into micro-batches (or across ranks): pass the
    token (sequence, group) count of the whole mini-batch so that accumulated gradients equal
    those of the unsplit batch. At prompt level this holds only if no group is split across
    micro-batches. A completion (or group) with no trained tokens contributes 0 but still counts
    in the default D, as a padded row does at sequence level. Values under a zero mask (NaN, inf)
    are ignored (`masked_fill_zero`).
    """
    mask = loss_mask.to(values.dtype)
    kept = masked_fill_zero(values, loss_mask)  # (B, T)
    match level:
        case "token":
            total = kept.sum()
            denom = mask.sum() if normalizer is None else normalizer
        case "sequence":
            per_seq = kept.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
            total = per_seq.sum()
            denom = values.shape[0] if normalizer is None else normalizer
        case "prompt":
            if group_ids is None:
                raise ValueError("prompt-level aggregation needs group_ids")
            _, group = torch.unique_consecutive(group_ids, return_inverse=True)  # (B,) in 0..G-1
            n_groups = int(group.max()) + 1 if group.numel() else 0
            sums = values.new_zeros(n_groups).index_add(0, group, kept.sum(dim=1))  # (G,)
            counts = values.new_zeros(n_groups).index_add(0, group, mask.sum(dim=1))  # (G,)
            total = (sums / counts.clamp(min=1.0)).sum()
            denom = n_groups if normalizer is None else normalizer
        case "constant":
            if normalizer is None and max_new_tokens is None:
                raise ValueError("constant aggregation needs max_new_tokens or a normalizer")
            total = kept.sum()
            denom = values.shape[0] * max_new_tokens if normalizer is None else normalizer
        case "sequence_sum":
            total = kept.sum()
            denom = values.shape[0] if normalizer is None else normalizer
        case _:
            raise ValueError(f"unknown loss aggregation {level!r}; use token, sequence, prompt, constant or sequence_sum")
    return total / max(float(denom), 1.0) if not torch.is_tensor(denom) else total / denom.clamp(min=1.0)


def aggregation_units(
    loss_mask: torch.Tensor,
    level: LossAgg,
    group_ids: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
) -> torch.Tensor:
    """How many units of `level` a batch holds, as a 0-dim tensor: summed over micro-batches and
    ranks it is the global `normalizer` to pass to `aggregate`.

        token:    trained tokens              sequence, sequence_sum: completions with a trained token
        prompt:   distinct group ids among completions with a trained token
        constant: rows · max_new_tokens       (Dr. GRPO's B · L, empty rows included)
    """
    has_tokens = loss_mask.sum(1) > 0  # (B,)
    match level:
        case "token":
            return loss_mask.sum()
        case "sequence" | "sequence_sum":
            return has_tokens.sum()
        case "prompt":
            if group_ids is None:
                raise ValueError("prompt-level aggregation needs group_ids")
            return torch.tensor(group_ids[has_tokens].unique().numel(), device=loss_mask.device)
        case "constant":
            if max_new_tokens is None:
                raise ValueError("constant aggregation needs max_new_tokens")
            return torch.tensor(loss_mask.shape[0] * max_new_tokens, device=loss_mask.device)
    raise ValueError(f"unknown loss aggregation {level!r}; use token, sequence, prompt, constant or sequence_sum")


def mask_truncated(loss_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Drop completions that hit the length limit from the loss (DAPO's overlong filtering, Yu et
    al., 2025; TRL's mask_truncated_completions): row i of `loss_mask` (B, T) becomes 0 where
    `truncated` (B,) bool is True. A truncated completion has no final answer, so its reward says
    little about its tokens."""
    return loss_mask * (~truncated.bool()).unsqueeze(1).to(loss_mask.dtype)  # (B, T)


def importance_log_ratio(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    level: ImportanceLevel = "token",
) -> torch.Tensor:
    """Log importance ratio of π_θ against π_old (π_old is data: stop-gradient).

        token:    log ρ_it = log π_θ(y_it) − sg(log π_old(y_it))                         (B, T)
        sequence: log s_i  = Σ_t m_it log ρ_it / Σ_t m_it                                 (B, 1)

    "sequence" is GSPO's length-normalised sequence ratio s_i = (π_θ(y_i) / π_old(y_i))^{1/|y_i|}
    (Zheng et al., 2025, eq. 7; TRL's importance_sampling_level="sequence"); it needs `loss_mask`
    and broadcasts over the tokens, so every token of a completion shares one ratio (and one clip).
    """
    log_ratio = logprobs - old_logprobs.detach()  # (B, T)
    match level:
        case "token":
            return log_ratio
        case "sequence":
            if loss_mask is None:
                raise ValueError("sequence-level importance ratios need loss_mask")
            m = loss_mask.to(log_ratio.dtype)
            return masked_fill_zero(log_ratio, loss_mask).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)  # (B, 1)
    raise ValueError(f"unknown importance level {level!r}; use token or sequence")


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    delta: float | None = None,
    loss_mask: torch.Tensor | None = None,
    importance_level: ImportanceLevel = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate, per token (Schulman et al., 2017, eq. 7; DAPO's clip-higher when
    eps_high > eps_low, Yu et al., 2025).

        ρ_t = exp(log π_θ(y_t) − sg(log π_old(y_t)))            (or GSPO's sequence ratio, see below)
        ℓ_t = −min(min(ρ_t, δ) Â, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â)

    `delta` is INTELLECT-2's two-sided clip (Prime Intellect, 2025; TRL's `delta`): the unclipped
    branch is capped at δ (> 1 + ε_high) too, so a negative-advantage token whose ratio has run away
    contributes the constant −δÂ with no gradient instead of an unbounded −ρÂ. The cap is applied
    after the ε-clip is formed, as in TRL. With δ = None, min(ρ, δ) = ρ.

    `importance_level="sequence"` uses `importance_log_ratio(..., "sequence")` (GSPO); it needs
    `loss_mask`.

    Args:
        logprobs, old_logprobs: (B, T).
        advantages: (B,) one per completion, or (B, T) per token.
    Returns:
        per_token ℓ (B, T), and `clipped` (B, T) bool: a clip took the token's gradient away (the
        ε-clipped branch is the minimum, as TRL counts clip_frac, or the δ cap bound). A = 0 is
        never clipped.
    """
    adv = _per_token(advantages)  # (B, 1) or (B, T)
    ratio = torch.exp(importance_log_ratio(logprobs, old_logprobs, loss_mask, importance_level))  # (B, T) or (B, 1)
    clipped_obj = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    capped = ratio if delta is None else ratio.clamp(max=delta)  # after clipped_obj, as TRL orders it
    unclipped = capped * adv
    per_token = -torch.minimum(unclipped, clipped_obj)
    clipped = clipped_obj < unclipped
    if delta is not None:
        clipped = clipped | ((ratio > delta) & (adv != 0))
    shape = logprobs.shape  # a sequence-level ratio (B, 1) is broadcast over the tokens
    return per_token.expand(shape), clipped.detach().expand(shape)


def cispo_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_max: float = 5.0,
    eps_min: float | None = None,
    loss_mask: torch.Tensor | None = None,
    importance_level: ImportanceLevel = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO, per token (MiniMax-M1, 2025; the ScaleRL paper's choice, Khatri et al., 2025).

        ρ_t = exp(log π_θ(y_t) − log π_old(y_t))
        ℓ_t = −sg(clip(ρ_t, ε_min, ε_max)) · Â · log π_θ(y_t)        (no lower bound when ε_min is None)

    `eps_min` is SkyRL's two-sided form (its cispo_eps_clip_low, as the absolute bound 1 − ε_low): a
    token the policy has turned far away from keeps at least weight ε_min.

    The importance weight is truncated from above only and is under stop-gradient, so every token
    keeps a gradient −sg(min(ρ_t, ε_max)) Â ∇log π_θ(y_t) (PPO's clip zeroes it instead). The
    paper's 1/Σ|y| normalisation is `aggregate(..., "token")`, applied by the caller. The value of
    ℓ is not meaningful by itself (it scales with log π); only its gradient is.
    `importance_level="sequence"` weights every token by the GSPO sequence ratio (needs `loss_mask`).

    Args:
        logprobs, old_logprobs: (B, T).
        advantages: (B,) one per completion, or (B, T) per token.
    Returns:
        per_token ℓ (B, T), and `clipped` (B, T) bool: ρ_t outside [ε_min, ε_max] (the weight was truncated).
    """
    with torch.no_grad():
        ratio = torch.exp(importance_log_ratio(logprobs, old_logprobs, loss_mask, importance_level))  # (B, T) or (B, 1)
        weight = ratio.clamp(min=eps_min, max=eps_max)  # no lower bound unless eps_min
    per_token = -weight * _per_token(advantages) * logprobs  # (B, T)
    clipped = (ratio > eps_max) if eps_min is None else (ratio > eps_max) | (ratio < eps_min)
    return per_token, clipped.expand(logprobs.shape)


def truncated_is_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, *, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights for tokens generated by a different policy (the
    inference engine, or a stale copy in asynchronous RL), Yao et al., 2025, "Your efficient RL
    framework secretly brings you off-policy RL training":

        w_t = sg(min(π_old(y_t) / π_sampler(y_t), C))

    Multiply the per-token objective by w (before `aggregate`). Returns (B, T), detached.
    """
    with torch.no_grad():
        return torch.exp(old_logprobs - sampler_logprobs).clamp(max=cap)  # (B, T)


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (DeepSeek-AI, 2025, §3.1; TRL's
    off_policy_mask_threshold): drop a completion whose advantage is negative when the policy has
    drifted far from the one that sampled it.

        KL_i = Σ_t m_it (log π_sampler(y_it) − sg(log π_θ(y_it))) / Σ_t m_it
        M_i  = 1[Â_i ≥ 0  or  KL_i ≤ threshold]

    Negative samples the current policy would no longer produce push it in directions that say
    little; positive ones are kept whatever their drift. Returns (B, 1) float, detached, to multiply
    into the per-token objective; with per-token advantages (B, T) it is (B, T) (each token's own
    sign, the row's KL), as TRL broadcasts. A token whose sampler log-prob is NaN (not scored by the
    engine) counts as zero drift.
    """
    with torch.no_grad():
        m = loss_mask.to(logprobs.dtype)
        drift = torch.nan_to_num(sampler_logprobs - logprobs, nan=0.0)  # (B, T)
        kl = masked_fill_zero(drift, loss_mask).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)  # (B, 1)
        return ((_per_token(advantages) >= 0) | (kl <= threshold)).to(logprobs.dtype)  # (B, 1) or (B, T)


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
    *,
    log_ratio: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Detached diagnostics, means over the trained tokens (all (B, T) inputs):

        clip_frac  = mean(clipped)
        approx_kl  = mean(e^Δ − 1 − Δ),  Δ = log π_θ − log π_old   (k3 estimate of KL(π_old ‖ π_θ),
                                                                   PPO implementations' approx_kl)
        ratio_mean = mean(ρ), ratio_max = max(ρ)                   (1.0 when no token is trained)

    ρ is exp(`log_ratio`) when given (the ratio the objective used: GSPO's (B, 1) sequence ratio
    broadcast over tokens), else exp(Δ). approx_kl is always per token. No host synchronisation.
    """
    with torch.no_grad():
        mask = loss_mask.bool()
        n = mask.sum().clamp(min=1)
        delta = logprobs - old_logprobs  # (B, T)
        ratio = torch.exp(delta if log_ratio is None else log_ratio).expand(delta.shape)  # (B, T)
        ratio_max = ratio.masked_fill(~mask, 0.0).max() if ratio.numel() else ratio.new_tensor(1.0)
        return {
            "clip_frac": (clipped.bool() & mask).sum() / n,
            "approx_kl": masked_fill_zero(torch.expm1(delta) - delta, mask).sum() / n,
            "ratio_mean": masked_fill_zero(ratio, mask).sum() / n,
            "ratio_max": torch.where(mask.any(), ratio_max, ratio.new_tensor(1.0)),
        }


def masked_mean(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Σ m·v / Σ m over trained tokens, detached, 0-dim (0 when nothing is trained; NaN/inf under
    the mask ignored). For diagnostics."""
    with torch.no_grad():
        m = loss_mask.to(values.dtype)
        return masked_fill_zero(values, loss_mask).sum() / m.sum().clamp(min=1.0)
