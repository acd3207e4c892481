"""The training objective: one pure function from a batch's tensors to the scalar loss and its
detached diagnostics. The trainer, the minimal recipe and the tests all call `rl_objective`; its
pieces (per-token objectives, masks, weights, aggregation) live in `losses.py` and `kl.py`.

Semantics match TRL 1.16's `GRPOTrainer._compute_loss` (the loss_type mapping: TRL "grpo" is our
loss_agg="sequence", "bnpo" is "token", "dr_grpo" is "constant", "dapo"/"cispo" normalised by
num_items_in_batch are "token" with a global token normalizer; TRL's CISPO cap epsilon_high is our
eps_max). `bench/trl_loss_parity.py` checks this against TRL itself.

Left out: TRL's top-entropy token mask, SAPO, VESPO and LUSPO, sequence-level IS correction modes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

import torch

from scalerl.algorithms.kl import KLEstimator, kl_estimate, masked_kl
from scalerl.algorithms.losses import (
    LossAgg,
    aggregate,
    cispo_objective,
    clipped_surrogate,
    importance_log_ratio,
    masked_mean,
    off_policy_sequence_mask,
    policy_stats,
    truncated_is_weights,
    value_loss,
)


@dataclass
class ObjectiveInputs:
    """One (micro-)batch of B completions padded to T tokens."""

    logprobs: torch.Tensor  # (B, T) log π_θ, with grad
    old_logprobs: torch.Tensor  # (B, T) log π_old (data, no grad)
    advantages: torch.Tensor  # (B,) per completion or (B, T) per token
    loss_mask: torch.Tensor  # (B, T) 1 on trained tokens
    group_ids: torch.Tensor | None = None  # (B,) needed for loss_agg="prompt"
    sampler_logprobs: torch.Tensor | None = None  # (B, T) behaviour policy (inference engine / stale copy)
    ref_logprobs: torch.Tensor | None = None  # (B, T) frozen reference
    entropy: torch.Tensor | None = None  # (B, T) per-token entropy of π_θ, with grad
    values: torch.Tensor | None = None  # (B, T) critic, with grad (PPO)
    old_values: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)


def rl_objective(
    inputs: ObjectiveInputs,
    *,
    policy_loss: Literal["clip", "cispo"] = "clip",
    importance_level: Literal["token", "sequence"] = "token",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    delta: float | None = None,
    eps_max: float = 5.0,
    tis_cap: float | None = None,
    off_policy_mask: float | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_with_ratio: bool = False,
    entropy_coef: float = 0.0,
    vf_coef: float = 0.5,
    value_clip: float | None = 0.2,
    loss_agg: LossAgg = "token",
    max_new_tokens: int | None = None,
    normalizer: float | torch.Tensor | None = None,
    token_normalizer: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = aggregate_{loss_agg}(ℓ, m) − c_H · Σ m·H / N_tokens, with per token (i, t):

        ρ_it  = exp(log π_θ − sg(log π_old))           or GSPO's exp(mean_t log ρ_it) per row (Zheng et al., 2025)
        clip:  p_it = −min(min(ρ, δ)·A, clip(ρ, 1−ε_low, 1+ε_high)·A)  (PPO; DAPO clip-higher; INTELLECT-2 δ)
        cispo: p_it = −sg(min(ρ, ε_max))·A·log π_θ                    (MiniMax-M1, 2025)
        ℓ_it  = p_it · M_i · w_it + β·KL_it + c_V·ℓᵛ_it
          M_i   = 1[A_i ≥ 0 or mean_t(log π_sampler − sg(log π_θ)) ≤ off_policy_mask]  (DeepSeek-V3.2)
          w_it  = sg(min(π_old / π_sampler, tis_cap))     (truncated IS, Yao et al., 2025)
          KL_it = k(log π_θ − sg(log π_ref)), times ρ_it when kl_with_ratio (DeepSeek-V3.2's unbiased
                  KL; ρ before the δ cap and with its gradient, as TRL's use_bias_correction_kl)
          ℓᵛ_it = PPO clipped value loss (`value_loss`)

    Each factor is present only when its option and inputs are: M with `off_policy_mask` (π_old
    stands in for a missing π_sampler, as in TRL), w with `tis_cap` and sampler_logprobs, β·KL with
    beta > 0 (KL is measured whenever ref_logprobs is given), ℓᵛ with `returns`, the bonus with
    `entropy`. The bonus is a token mean at every loss_agg (TRL 1.16: L_policy − c·H), over
    `token_normalizer` tokens when given (micro-batching) else the batch's own. `normalizer` is
    `aggregate`'s (see `aggregation_units`); "constant" (Dr. GRPO) defaults to B · max_new_tokens.

    Returns the scalar loss and detached 0-dim diagnostics: clip_frac, approx_kl, ratio_mean,
    ratio_max (`policy_stats`), and when their inputs are given: entropy, kl and kl_seq
    (`measured_kl`), value_loss (token means), tis_clip_frac (trained tokens whose weight was
    capped), off_policy_masked_frac (completions with trained tokens that lost some to M), sampler_kl
    (mean_t log π_sampler − log π_old: KL(π_sampler ‖ π_old)'s k1 estimate, the engine's or stale copy's drift).
    """
    x, mask = _masked_inputs(inputs), inputs.loss_mask
    if beta > 0 and x.ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    log_ratio = importance_log_ratio(x.logprobs, x.old_logprobs, mask, importance_level)  # (B, T) or (B, 1)
    per_token, clipped = _policy_term(x, policy_loss, importance_level, clip_eps_low, clip_eps_high, delta, eps_max)
    stats = policy_stats(x.logprobs, x.old_logprobs, clipped, mask, log_ratio=log_ratio)

    if off_policy_mask is not None:
        sampler = x.old_logprobs if x.sampler_logprobs is None else x.sampler_logprobs
        keep = off_policy_sequence_mask(x.advantages, x.logprobs, sampler, mask, threshold=off_policy_mask)  # (B, 1|T)
        per_token = per_token * keep
        stats["off_policy_masked_frac"] = _masked_row_fraction(keep, mask)
    if tis_cap is not None:  # without sampler_logprobs π_sampler = π_old: no weight, none capped
        per_token, stats["tis_clip_frac"] = _truncated_is(per_token, x, tis_cap)
    stats |= _sampler_drift(x)
    if x.ref_logprobs is not None:
        kl = kl_estimate(x.logprobs, x.ref_logprobs.detach(), kl_estimator)  # (B, T)
        if kl_with_ratio:
            kl = kl * log_ratio.exp()
        if beta > 0:
            per_token = per_token + beta * kl
        stats["kl"], stats["kl_seq"] = masked_kl(kl, mask, "token"), masked_kl(kl, mask, "sequence")
    if x.returns is not None:
        vloss = _value_term(x, value_clip)  # (B, T)
        per_token = per_token + vf_coef * vloss
        stats["value_loss"] = masked_mean(vloss, mask)

    loss = aggregate(per_token, mask, loss_agg, normalizer, x.group_ids, max_new_tokens=max_new_tokens)
    if x.entropy is not None:  # the bonus is not folded into ℓ: it is a token mean at every loss_agg
        if entropy_coef:
            loss = loss - entropy_coef * aggregate(x.entropy, mask, "token", token_normalizer)
        stats["entropy"] = masked_mean(x.entropy, mask)
    return loss, stats


def _masked_inputs(x: ObjectiveInputs) -> ObjectiveInputs:
    """The inputs with every (B, T) tensor set to 0 under a zero loss mask, by `torch.where`: a NaN
    or inf at an untrained position (a padded log-prob, an unscored sampler token) then reaches
    neither the loss nor, through 0 · NaN in a backward, any gradient."""
    mask = x.loss_mask.bool()
    def clean(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or t.dim() != 2:
            return t
        return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))
    return replace(x, **{f.name: clean(getattr(x, f.name)) for f in fields(x) if f.name not in ("loss_mask", "group_ids")})


def _policy_term(
    x: ObjectiveInputs,
    policy_loss: str,
    importance_level: Literal["token", "sequence"],
    clip_eps_low: float,
    clip_eps_high: float,
    delta: float | None,
    eps_max: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token policy objective (B, T), clipped (B, T) bool) for the chosen policy loss."""
    match policy_loss:
        case "clip":
            return clipped_surrogate(x.logprobs, x.old_logprobs, x.advantages, clip_eps_low=clip_eps_low,
                                     clip_eps_high=clip_eps_high, delta=delta, loss_mask=x.loss_mask,
                                     importance_level=importance_level)
        case "cispo":
            if delta is not None:
                raise ValueError("delta (two-sided clip) applies to policy_loss='clip' only")
            return cispo_objective(x.logprobs, x.old_logprobs, x.advantages, eps_max=eps_max,
                                   loss_mask=x.loss_mask, importance_level=importance_level)
    raise ValueError(f"unknown policy loss {policy_loss!r}; use clip or cispo")


def _truncated_is(per_token: torch.Tensor, x: ObjectiveInputs, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token · w with w = sg(min(π_old / π_sampler, cap)) (B, T), and the fraction of trained
    tokens whose weight was capped."""
    if x.sampler_logprobs is None:
        return per_token, x.logprobs.new_zeros(())
    per_token = per_token * truncated_is_weights(x.old_logprobs, x.sampler_logprobs, cap=cap)  # (B, T)
    capped = ((x.old_logprobs - x.sampler_logprobs).exp() > cap).to(x.logprobs.dtype)  # (B, T)
    return per_token, masked_mean(capped, x.loss_mask)


def _sampler_drift(x: ObjectiveInputs) -> dict[str, torch.Tensor]:
    """{"sampler_kl": mean over trained tokens of log π_sampler − log π_old} when sampler_logprobs are given."""
    if x.sampler_logprobs is None:
        return {}
    return {"sampler_kl": masked_mean(x.sampler_logprobs - x.old_logprobs, x.loss_mask)}


def _value_term(x: ObjectiveInputs, value_clip: float | None) -> torch.Tensor:
    """PPO's per-token value loss (B, T); the clipped form needs old_values."""
    if x.values is None:
        raise ValueError("returns needs values (the critic's predictions)")
    if x.old_values is None and value_clip is not None:
        raise ValueError("a clipped value loss needs old_values (or value_clip=None)")
    old_values = x.values.detach() if x.old_values is None else x.old_values  # unused when value_clip is None
    return value_loss(x.values, old_values, x.returns, clip_eps=value_clip)


def _masked_row_fraction(keep: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Fraction of completions with a trained token where `keep` (B, 1) or (B, T) drops at least one
    trained token; detached, 0-dim."""
    with torch.no_grad():
        trained = loss_mask.bool()  # (B, T)
        rows = trained.any(1)  # (B,)
        dropped = ((keep == 0) & trained).any(1) & rows  # (B,)
        return dropped.sum() / rows.sum().clamp(min=1)
