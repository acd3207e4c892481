"""Per-token KL estimators against a frozen reference policy (Schulman, "Approximating KL
Divergence", 2020).

With Δ = log π_θ(y) − log π_ref(y) for a token y sampled from π_θ:

    k1 = Δ                      unbiased, high variance, can be negative
    k2 = ½ Δ²                   biased, low variance, always >= 0
    k3 = e^{−Δ} − 1 + Δ         unbiased, low variance, always >= 0 (the default)
    abs = |Δ|                   biased, always >= 0 (verl's kl_penalty "abs")
    k3+ = k3's value, k2's gradient: sg(k3) + k2 − sg(k2)   (verl's straight-through "k3+": the
          gradient of k3 is not an unbiased estimate of ∇KL while k2's is, Schulman 2020; the
          value, and so the logged KL, stays k3's low-variance estimate)

Each is an estimate of KL(π_θ ‖ π_ref) per token; reduce it with the loss's aggregation.
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3", "abs", "k3+"]

# exp(-Δ) overflows float32 past Δ ≈ -88; clamping Δ to ±20 keeps k3 finite (e^20 ≈ 4.9e8) while
# any real policy is long past the point where the exact value matters.
_DELTA_CLAMP = 20.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token KL estimate, same shape as `logprobs` (B, T).

    Args:
        logprobs: log π_θ of the sampled tokens, (B, T).
        ref_logprobs: log π_ref of the same tokens, (B, T).
        estimator: "k1", "k2", "k3", "abs" or "k3+" (see the module docstring).
    """
    delta = (logprobs - ref_logprobs).clamp(-_DELTA_CLAMP, _DELTA_CLAMP)  # (B, T)
    match estimator:
        case "k1":
            return delta
        case "k2":
            return 0.5 * delta.square()
        case "k3":
            return torch.expm1(-delta) + delta
        case "abs":
            return delta.abs()
        case "k3+":
            k2 = 0.5 * delta.square()
            return (torch.expm1(-delta) + delta).detach() + k2 - k2.detach()
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2, k3, abs or k3+")


def measured_kl(kl: torch.Tensor, mask: torch.Tensor, level: Literal["token", "sequence"] = "token") -> float:
    """One number for a batch's per-token KL estimates `kl` (B, T) under `mask` (B, T):

        token:     Σ_{i,t} m_it · kl_it / Σ_{i,t} m_it                 (mean per-token KL)
        sequence:  (1/|S|) Σ_{i∈S} Σ_t m_it · kl_it,  S = {i : Σ_t m_it > 0}   (KL of a completion)

    Rows with no unmasked token (e.g. filtered groups) count in neither. 0.0 for an empty mask.
    Whatever sits under a zero mask (NaN, inf) is ignored: masked positions are selected away
    with `torch.where`, not multiplied by 0 (NaN · 0 is NaN), as verl and SkyRL mask.
    `masked_kl` is the same as a detached 0-dim tensor (no host synchronisation).
    """
    return masked_kl(kl, mask, level).item()


def masked_kl(kl: torch.Tensor, mask: torch.Tensor, level: Literal["token", "sequence"] = "token") -> torch.Tensor:
    """`measured_kl` as a detached 0-dim tensor."""
    with torch.no_grad():
        m = mask.to(kl.dtype)
        kept = torch.where(mask.bool(), kl, torch.zeros_like(kl))  # (B, T): NaN/inf under the mask dropped
        if level == "token":
            return kept.sum() / m.sum().clamp(min=1.0)
        if level == "sequence":
            rows = m.sum(1) > 0  # (B,) completions with a trained token
            return torch.where(rows, kept.sum(1), torch.zeros_like(rows, dtype=kl.dtype)).sum() / rows.sum().clamp(min=1)
    raise ValueError(f"unknown KL level {level!r}; use token or sequence")
