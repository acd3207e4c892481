"""The training objective: one pure function from a batch's tensors to the scalar loss and its
detached diagnostics. The trainer, the minimal recipe and the tests all call `rl_objective`; its
pieces (per-token objectives, masks, weights, aggregation) live in `losses.py` and `kl.py`.

Semantics match TRL 1.16's `GRPOTrainer._compute_loss` (the loss_type mapping: TRL "grpo" is our
loss_agg="sequence", "bnpo" is "token", "dr_grpo" is "constant", "dapo"/"cispo" normalised by
num_items_in_batch are "token" with a global token normalizer; TRL's CISPO cap epsilon_high is our
eps_max). `bench/trl_loss_parity.py` checks this against TRL itself, on one unsplit batch.

Under gradient accumulation the two differ by design at loss_agg="token": the trainer passes the
whole mini-batch's token count as `normalizer`, so every micro-batch divides by the same number and
the accumulated gradient equals the unsplit batch's (split-invariant), whereas TRL's bnpo divides
each micro-batch by its own token count times the accumulation steps (a micro-batch with few tokens
then weighs its tokens more). At loss_agg="sequence" the trainer counts every completion of the
mini-batch, those masked by mask_truncated_completions included, as TRL's grpo does (completions in
groups removed by zero_variance_filter are not counted).

TRL's luspo is policy_loss="clip" with loss_agg="sequence_sum"; its sapo and vespo are policy_loss
"sapo" and "vespo" (with loss_agg "sequence" and "token" with a global normalizer, as TRL reduces
them); its top_entropy_quantile is ours. verl's dual-clip c is our δ (the same values and
gradients); its geo_mean, clip_cov and kl_cov are "gmpo", "clip_cov" and "kl_cov"
(`bench/verl_loss_parity.py`).
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
from scalerl.algorithms.policy_losses import (
    clip_cov_keep,
    gmpo_objective,
    high_entropy_mask,
    kl_cov_objective,
    sapo_objective,
    vespo_objective,
)

from scalerl.algorithms.rollout_correction import RolloutCorrection, rollout_correction

PolicyLoss = Literal["clip", "cispo", "sapo", "vespo", "gmpo", "clip_cov", "kl_cov"]


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
    policy_loss: PolicyLoss = "clip",
    policy_params: dict[str, float] | None = None,
    importance_level: Literal["token", "sequence"] = "token",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    delta: float | None = None,
    eps_max: float = 5.0,
    tis_cap: float | None = None,
    rollout_correction: RolloutCorrection | None = None,
    off_policy_mask: float | None = None,
    top_entropy_quantile: float = 1.0,
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
    """L = aggregate_{loss_agg}(ℓ, m) − c_H · Σ m·E·H / N_tokens, with per token (i, t):

        ρ_it  = exp(log π_θ − sg(log π_old))           or GSPO's exp(mean_t log ρ_it) per row (Zheng et al., 2025)
        clip:     p = −min(min(ρ, δ)·A, clip(ρ, 1−ε_low, 1+ε_high)·A)  (PPO; DAPO clip-higher; INTELLECT-2 δ,
                  which is also dual-clip PPO's c: −A·min(c, max(ρ, clip ρ)) for A < 0, Ye et al., 2020)
        cispo:    p = −sg(clip(ρ, ε_min, ε_max))·A·log π_θ   (MiniMax-M1; ε_min: SkyRL's, policy_params)
        sapo, vespo, gmpo, clip_cov, kl_cov: see scalerl/algorithms/policy_losses.py; `policy_params`
                  are that function's keywords (sapo: tau_pos, tau_neg; vespo: k_pos, lambda_pos, k_neg,
                  lambda_neg; clip_cov: ratio, cov_low, cov_high; kl_cov: ratio, kl_coef)
        ℓ_it  = p_it · M_i · E_it · w_it + β·KL_it + c_V·ℓᵛ_it
          M_i   = 1[A_i ≥ 0 or mean_t(log π_sampler − sg(log π_θ)) ≤ off_policy_mask]  (DeepSeek-V3.2)
          E_it  = 1[H_it ≥ the (1 − top_entropy_quantile) quantile of the batch's H]  (`high_entropy_mask`)
          w_it  = sg(min(π_old / π_sampler, tis_cap)) (truncated IS, Yao et al.; vespo folds log w into φ, as TRL),
                  or a `rollout_correction` preset's weights × rejection mask (rollout_correction.py)
          KL_it = k(log π_θ − sg(log π_ref)), times ρ_it when kl_with_ratio (DeepSeek-V3.2's unbiased
                  KL; ρ before the δ cap and with its gradient, as TRL's use_bias_correction_kl)
          ℓᵛ_it = PPO clipped value loss (`value_loss`)

    Each factor is present only when its option and inputs are: M with `off_policy_mask` (π_old
    stands in for a missing π_sampler, as in TRL), E with top_entropy_quantile < 1 and `entropy`,
    w with `tis_cap` and sampler_logprobs, β·KL with beta > 0 (KL is measured whenever
    ref_logprobs is given), ℓᵛ with `returns`, the bonus with `entropy`: a token mean at every loss_agg
    (TRL 1.16: L_policy − c·H) over the tokens E keeps, over `token_normalizer` tokens when given (scaled
    by the share E keeps) else the batch's own. `normalizer`: `aggregate`'s (see `aggregation_units`).

    Returns the scalar loss and detached 0-dim diagnostics: clip_frac, approx_kl, ratio_mean, ratio_max
    (`policy_stats`), the policy loss's own (sapo_gate, vespo_phi, gmpo_ratio, cov_frac), and with their
    inputs: entropy, kl, kl_seq, value_loss, tis_clip_frac, off_policy_masked_frac, top_entropy_frac
    (share of trained tokens E keeps), sampler_kl (mean_t log π_sampler − log π_old, the sampler's drift).
    """
    x, mask = _masked_inputs(inputs), inputs.loss_mask
    if beta > 0 and x.ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    log_ratio = importance_log_ratio(x.logprobs, x.old_logprobs, mask, importance_level)  # (B, T) or (B, 1)
    clip = dict(importance_level=importance_level, clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, delta=delta)
    per_token, stats, keep_entropy = _policy_part(x, policy_loss, policy_params or {}, clip, eps_max, (tis_cap, rollout_correction),
                                                  off_policy_mask, top_entropy_quantile, log_ratio)
    if x.ref_logprobs is not None:
        kl = kl_estimate(x.logprobs, x.ref_logprobs.detach(), kl_estimator)  # (B, T)
        if kl_with_ratio:
            kl = kl * log_ratio.exp()
        if beta > 0:
            per_token = per_token + beta * kl
        stats["kl"], stats["kl_seq"] = masked_kl(kl, mask, "token"), masked_kl(kl, mask, "sequence")
    if x.returns is not None:
        vloss, stats["value_clip_frac"] = _value_term(x, value_clip)  # (B, T), 0-dim
        per_token = per_token + vf_coef * vloss
        stats["value_loss"] = masked_mean(vloss, mask)

    loss = aggregate(per_token, mask, loss_agg, normalizer, x.group_ids, max_new_tokens=max_new_tokens)
    if x.entropy is not None:  # the bonus is not folded into ℓ: it is a token mean at every loss_agg
        if entropy_coef:
            loss = loss - entropy_coef * _entropy_bonus(x.entropy, mask, keep_entropy, token_normalizer)
        stats["entropy"] = masked_mean(x.entropy, mask)
    return loss, stats


def _policy_part(
    x: ObjectiveInputs,
    policy_loss: str,
    params: dict[str, float],
    clip: dict,
    eps_max: float,
    correction: tuple[float | None, RolloutCorrection | None],
    off_policy_mask: float | None,
    top_entropy_quantile: float,
    log_ratio: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """p · M · E · w (B, T), its diagnostics, and E (None when every token is kept)."""
    mask, (tis_cap, rc) = x.loss_mask, correction
    if rc is not None and (tis_cap is not None or policy_loss == "vespo"):
        raise ValueError(f"rollout_correction with {'tis_cap' if tis_cap is not None else 'policy_loss=vespo'}: "
                         "both weight by π_old/π_sampler; use one")
    is_log = None
    if policy_loss == "vespo" and tis_cap is not None and x.sampler_logprobs is not None:
        is_log = torch.log(truncated_is_weights(x.old_logprobs, x.sampler_logprobs, cap=tis_cap))  # (B, T)
    per_token, clipped, own = _policy_term(x, policy_loss, params, clip, eps_max, is_log)
    stats = policy_stats(x.logprobs, x.old_logprobs, clipped, mask, log_ratio=log_ratio) | own
    if off_policy_mask is not None:
        sampler = x.old_logprobs if x.sampler_logprobs is None else x.sampler_logprobs
        keep = off_policy_sequence_mask(x.advantages, x.logprobs, sampler, mask, threshold=off_policy_mask)  # (B, 1|T)
        per_token = per_token * keep
        stats["off_policy_masked_frac"] = _masked_row_fraction(keep, mask)
    keep_entropy = None
    if top_entropy_quantile < 1.0:
        if x.entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs entropy")
        keep_entropy = high_entropy_mask(x.entropy, mask, top_entropy_quantile)  # (B, T)
        per_token = per_token * keep_entropy
        stats["top_entropy_frac"] = masked_mean(keep_entropy, mask)
    if tis_cap is not None:  # without sampler_logprobs π_sampler = π_old: no weight, none capped
        weighted, stats["tis_clip_frac"] = _truncated_is(per_token, x, tis_cap)
        per_token = per_token if is_log is not None else weighted
    if rc is not None and x.sampler_logprobs is not None:  # without them π_sampler = π_old: nothing to correct
        factor, rc_stats = rollout_correction(x.old_logprobs, x.sampler_logprobs, mask, rc)
        per_token, stats = per_token * factor, stats | rc_stats
    stats |= _sampler_drift(x)
    return per_token, stats, keep_entropy


def _entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None,
                   token_normalizer: float | torch.Tensor | None) -> torch.Tensor:
    """Token-mean entropy over the trained tokens `keep` leaves (TRL: mask · entropy_mask); with a
    mini-batch `token_normalizer`, that count is scaled by the share of this micro-batch's tokens kept."""
    if keep is None:
        return aggregate(entropy, mask, "token", token_normalizer)
    effective = mask * keep
    if token_normalizer is None:
        return aggregate(entropy, effective, "token")
    share = effective.sum() / mask.sum().clamp(min=1.0)
    return aggregate(entropy, effective, "token", token_normalizer * share)


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
    params: dict[str, float],
    clip: dict,
    eps_max: float,
    is_log_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(per-token policy objective (B, T), clipped (B, T) bool, the loss's own diagnostics)."""
    sequence = clip["importance_level"] == "sequence"
    if clip["delta"] is not None and policy_loss not in ("clip", "clip_cov"):
        raise ValueError(f"delta (two-sided clip) applies to policy_loss clip or clip_cov, not {policy_loss}")
    if sequence and policy_loss in ("vespo", "gmpo", "clip_cov", "kl_cov"):
        raise ValueError(f"importance_level=sequence does not apply to policy_loss={policy_loss} (it has its own ratio)")
    lp, old, adv, mask = x.logprobs, x.old_logprobs, x.advantages, x.loss_mask
    match policy_loss:
        case "clip" | "clip_cov":
            per_token, clipped = clipped_surrogate(lp, old, adv, loss_mask=mask, **clip)
            if policy_loss == "clip":
                return per_token, clipped, {}
            keep = clip_cov_keep(adv, lp, mask, clipped, **params)  # (B, T)
            return per_token * keep, clipped | (keep == 0), {"cov_frac": masked_mean(1.0 - keep, mask)}
        case "cispo":
            return *cispo_objective(lp, old, adv, eps_max=eps_max, eps_min=params.get("eps_min"), loss_mask=mask,
                                    importance_level=clip["importance_level"]), {}
        case "sapo":
            return sapo_objective(lp, old, adv, loss_mask=mask, importance_level=clip["importance_level"], **params)
        case "vespo":
            return vespo_objective(lp, old, adv, mask, is_log_weights=is_log_weights, **params)
        case "gmpo":
            return gmpo_objective(lp, old, adv, mask, clip_eps_low=clip["clip_eps_low"], clip_eps_high=clip["clip_eps_high"])
        case "kl_cov":
            return kl_cov_objective(lp, old, adv, mask, **params)
    raise ValueError(f"unknown policy loss {policy_loss!r}; use clip, cispo, sapo, vespo, gmpo, clip_cov or kl_cov")


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


def _value_term(x: ObjectiveInputs, value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token value loss (B, T), and the share of trained tokens whose clipped branch was the
    larger one (their value gradient is gone; 0 without a clip). The clipped form needs old_values."""
    if x.values is None:
        raise ValueError("returns needs values (the critic's predictions)")
    if x.old_values is None and value_clip is not None:
        raise ValueError("a clipped value loss needs old_values (or value_clip=None)")
    old_values = x.values.detach() if x.old_values is None else x.old_values  # unused when value_clip is None
    vloss = value_loss(x.values, old_values, x.returns, clip_eps=value_clip)
    if value_clip is None:
        return vloss, x.values.new_zeros(())
    with torch.no_grad():
        v_clip = old_values + (x.values - old_values).clamp(-value_clip, value_clip)
        clipped = ((v_clip - x.returns).square() > (x.values - x.returns).square()).to(x.values.dtype)
    return vloss, masked_mean(clipped, x.loss_mask)


def _masked_row_fraction(keep: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Fraction of completions with a trained token where `keep` (B, 1) or (B, T) drops at least one
    trained token; detached, 0-dim."""
    with torch.no_grad():
        trained = loss_mask.bool()  # (B, T)
        rows = trained.any(1)  # (B,)
        dropped = ((keep == 0) & trained).any(1) & rows  # (B,)
        return dropped.sum() / rows.sum().clamp(min=1)
