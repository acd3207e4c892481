"""The policy losses added since PPO's clip and CISPO, each per token (B, T) so that `aggregate`
reduces them like any other: SAPO's soft gate, VESPO's gamma-weighted sequence ratio, GMPO's
geometric-mean ratio, Clip-Cov and KL-Cov (the entropy-mechanism paper), and the top-entropy token
mask. Each function returns (per_token ℓ, clipped (B, T) bool, detached diagnostics).

Sources were read, not copied: TRL 1.16's GRPOTrainer._compute_loss and get_gamma_weights /
get_high_entropy_mask (sapo, vespo, top_entropy_quantile), verl's core_algos.py
(compute_policy_loss_sapo, _geo_mean, _clip_cov, _kl_cov). `bench/trl_loss_parity.py` and
`bench/verl_loss_parity.py` check these against the real functions.
"""

from __future__ import annotations

import math

import torch

from scalerl.algorithms.losses import ImportanceLevel, _per_token, importance_log_ratio, masked_fill_zero, masked_mean

Stats = dict[str, torch.Tensor]


def sapo_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_mask: torch.Tensor | None = None,
    importance_level: ImportanceLevel = "token",
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al., 2025, arXiv:2511.20347; TRL's
    loss_type="sapo", verl's policy_loss "sapo"): a smooth, temperature-gated surrogate instead
    of the hard clip.

        τ_it = τ_pos if A_it > 0 else τ_neg
        ℓ_it = −(4 / τ_it) · σ(τ_it (ρ_it − 1)) · A_it
        ∇ℓ_it = −4 σ(1 − σ) · ρ_it ∇log π_θ · A_it        (the gate 4σ(1−σ) is 1 at ρ = 1)

    A token far from the old policy loses its gradient smoothly rather than at a cliff; a larger
    τ_neg damps negative updates faster (they are the less stable ones). Nothing is "clipped":
    `clipped` is all False. Diagnostic sapo_gate: mean over trained tokens of 4σ(1−σ).
    """
    adv = _per_token(advantages)  # (B, 1) or (B, T)
    ratio = torch.exp(importance_log_ratio(logprobs, old_logprobs, loss_mask, importance_level))
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    per_token = (-(4.0 / tau) * sig * adv).expand(logprobs.shape)
    stats = {}
    if loss_mask is not None:
        stats["sapo_gate"] = masked_mean((4.0 * sig * (1.0 - sig)).expand(logprobs.shape), loss_mask)
    return per_token, torch.zeros_like(logprobs, dtype=torch.bool), stats


def vespo_weights(
    advantages: torch.Tensor,
    log_ratio: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    is_log_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """VESPO's sequence weight φ (TRL 1.16's loss_type="vespo", get_gamma_weights), detached:

        log w_i = clamp(Σ_t m_it clamp(log ρ_it, −20, 20) + Σ_t log w^IS_it, log 1e−8, 20)
        (k, λ)  = (k_pos, λ_pos) if A_i ≥ 0 else (k_neg, λ_neg),  λ ≥ 1e−4
        φ_i     = e^λ · w_i^k · e^{−λ w_i} = exp(λ + k log w_i − λ w_i)      (φ(1) = 1)

    A gamma-shaped weight of the (unnormalised) sequence ratio: 1 on-policy, vanishing for ratios
    far from 1 on either side, so stale or mismatched completions fade out smoothly. `is_log_weights`
    (B, T) are log truncated-IS weights log min(π_old / π_sampler, C), clamped to [log 1e−8, 20]
    (TRL folds its vLLM correction in here instead of multiplying the loss). Non-finite φ is 0.
    Returns (B, 1) (or (B, T) with per-token advantages).
    """
    with torch.no_grad():
        seq = masked_fill_zero(log_ratio.clamp(-20.0, 20.0), loss_mask).sum(-1, keepdim=True)  # (B, 1)
        if is_log_weights is not None:
            seq = seq + masked_fill_zero(is_log_weights.clamp(math.log(1e-8), 20.0), loss_mask).sum(-1, keepdim=True)
        log_w = seq.clamp(math.log(1e-8), 20.0)
        nonneg = _per_token(advantages) >= 0
        k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
        return torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    is_log_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """VESPO (TRL 1.16 loss_type="vespo"): ℓ_it = −φ_i · A_i · log π_θ(y_it), φ from `vespo_weights`
    (stop-gradient), so ∇ℓ = −φ A ∇log π: a REINFORCE step scaled by the sequence's gamma weight.
    Like CISPO's, the value of ℓ scales with log π; only its gradient means something. Token
    ratios only (φ is built from their sum). Diagnostic vespo_phi: mean φ over trained tokens."""
    phi = vespo_weights(advantages, logprobs - old_logprobs.detach(), loss_mask, k_pos=k_pos, lambda_pos=lambda_pos,
                        k_neg=k_neg, lambda_neg=lambda_neg, is_log_weights=is_log_weights)  # (B, 1|T)
    per_token = -phi * _per_token(advantages) * logprobs  # (B, T)
    return per_token, torch.zeros_like(logprobs, dtype=torch.bool), {"vespo_phi": masked_mean(phi.expand(logprobs.shape), loss_mask)}


def gmpo_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_eps_low: float = 0.4,
    clip_eps_high: float = 0.4,
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al., 2025, arXiv:2507.20673; verl's
    policy_loss "geo_mean"): one ratio per completion, the geometric mean of its token ratios, each
    clipped in log space before the mean.

        d_it   = log ρ_it,  s = sign(Â_it)
        d̃_it  = s · min(s · d_it, s · clip(d_it, −ε_low, ε_high))     (PPO's pessimism, per token, in log space)
        r_i    = exp(Σ_t m_it d̃_it / Σ_t m_it),  Â_i = Σ_t m_it Â_it / Σ_t m_it
        ℓ_it   = −Â_i · r_i      on every token of completion i

    The geometric mean is less sensitive to one outlier token than GRPO's arithmetic mean, so the
    paper widens the clip to (e^−0.4, e^0.4). With loss_agg="sequence" the loss is verl's mean over
    completions of −Â_i r_i. clipped: the token's log ratio was outside [−ε_low, ε_high].
    """
    m = loss_mask.to(logprobs.dtype)
    adv = _per_token(advantages).expand(logprobs.shape)  # (B, T)
    d = logprobs - old_logprobs.detach()  # (B, T)
    d_clip = d.clamp(-clip_eps_low, clip_eps_high)
    s = torch.sign(adv)
    d_min = s * torch.minimum(s * d, s * d_clip)
    n = m.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    ratio = torch.exp(masked_fill_zero(d_min, loss_mask).sum(-1, keepdim=True) / n)  # (B, 1)
    seq_adv = masked_fill_zero(adv, loss_mask).sum(-1, keepdim=True) / n  # (B, 1)
    per_token = (-seq_adv * ratio).expand(logprobs.shape)
    return per_token, (d != d_clip), {"gmpo_ratio": masked_mean(ratio.detach().expand(logprobs.shape), loss_mask)}


def _covariance(advantages: torch.Tensor, logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token centred product (Â − mean Â)(log π − mean log π), means over trained tokens."""
    adv = _per_token(advantages).expand(logprobs.shape)
    lp = logprobs.detach()
    return (adv - masked_mean(adv, loss_mask)) * (lp - masked_mean(lp, loss_mask))


def clip_cov_keep(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    clipped: torch.Tensor,
    *,
    ratio: float = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov's token mask (Cui et al., 2025, "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models", arXiv:2505.22617; verl's policy_loss "clip_cov"), detached (B, T):

        C_it = (Â_it − mean Â)(log π_θ(y_it) − mean log π_θ)       (means over trained tokens)
        candidates: trained tokens not already clipped by PPO with cov_low < C_it < cov_high
        drop max(⌊ratio · N_tokens⌋, 1) of them, chosen uniformly at random: keep = 0 there, else 1

    Tokens whose log-probability moves with their advantage are what collapses entropy; removing
    the gradient of a small random share of the high-covariance ones keeps entropy up. The choice
    draws `torch.randperm` (on `generator`, the global one by default), as verl does.
    """
    with torch.no_grad():
        cov = _covariance(advantages, logprobs, loss_mask)
        candidate = (cov > cov_low) & (cov < cov_high) & loss_mask.bool() & ~clipped.bool()
        idx = torch.nonzero(candidate)  # (K, 2)
        n_drop = max(int(ratio * loss_mask.sum().item()), 1)
        if len(idx):
            idx = idx[torch.randperm(len(idx), generator=generator)[:min(n_drop, len(idx))]]
        keep = torch.ones_like(logprobs)
        keep[idx[:, 0], idx[:, 1]] = 0.0
        return keep


def kl_cov_selected(advantages: torch.Tensor, logprobs: torch.Tensor, loss_mask: torch.Tensor, *, ratio: float = 2e-4) -> torch.Tensor:
    """KL-Cov's token selection (same paper; verl's policy_loss "kl_cov"), detached (B, T) bool:
    the max(⌊ratio · N_tokens⌋, 1) trained tokens with the largest C_it (see `clip_cov_keep`)."""
    with torch.no_grad():
        cov = _covariance(advantages, logprobs, loss_mask)
        flat_idx = torch.nonzero(loss_mask.reshape(-1).bool(), as_tuple=True)[0]
        selected = torch.zeros(logprobs.numel(), dtype=torch.bool, device=logprobs.device)
        if len(flat_idx):
            top = torch.topk(cov.reshape(-1)[flat_idx], max(1, int(len(flat_idx) * ratio))).indices
            selected[flat_idx[top]] = True
        return selected.view(logprobs.shape)


def kl_cov_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ratio: float = 2e-4,
    kl_coef: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """KL-Cov (Cui et al., 2025; verl's "kl_cov"): no clip; the unclipped surrogate everywhere, plus
    a penalty on the size of the update on the highest-covariance tokens only.

        ℓ_it = −Â_it ρ_it + kl_coef · |log ρ_it| · 1[(i, t) selected by `kl_cov_selected`]

    `clipped` marks the penalised tokens. Diagnostic cov_frac: their share of the trained tokens."""
    adv = _per_token(advantages)
    log_ratio = logprobs - old_logprobs.detach()
    selected = kl_cov_selected(advantages, logprobs, loss_mask, ratio=ratio)
    per_token = -adv * log_ratio.exp() + kl_coef * log_ratio.abs() * selected
    return per_token, selected, {"cov_frac": masked_mean(selected.to(logprobs.dtype), loss_mask)}


def high_entropy_mask(entropy: torch.Tensor, loss_mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's top_entropy_quantile ("Beyond the 80/20 Rule", Wang et al., 2025, arXiv:2506.01939):
    train only on the `quantile` share of trained tokens with the highest entropy. (B, T) float,
    detached: 1 where m_it = 1 and H_it ≥ q, q = the (1 − quantile) quantile (linear interpolation,
    torch.quantile) of the batch's trained-token entropies; all 0 when no token is trained."""
    with torch.no_grad():
        trained = loss_mask.bool()
        values = entropy[trained].float()
        if values.numel() == 0:
            return torch.zeros_like(entropy)
        threshold = torch.quantile(values, 1.0 - quantile).to(entropy.dtype)
        return ((entropy >= threshold) & trained).to(entropy.dtype)
