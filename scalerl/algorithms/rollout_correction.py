"""Rollout correction for tokens the trained policy did not sample itself (the inference engine's
numerics, a stale asynchronous copy): importance weights and rejection masks as named presets, after
verl's rollout_corr (verl/trainer/ppo/rollout_corr_helper.py, read, not copied; the same modes in
TRL, OpenRLHF, NeMo-RL, AReaL). All (B, T), detached; δ_it = log π_old(y_it) − log π_sampler(y_it).

    IS weights (truncated, TIS):  token:    w_it = min(exp(clamp(δ_it, ±20)), C)
                                  sequence: w_i  = min(exp(clamp(Σ_t m_it δ_it, ±20)), C)   on every token
    rejection (MIS, masked IS): a token or completion outside its band gets keep = 0, from the statistic
        k1 = −δ (log π_sampler/π_old), k2 = ½δ², k3 = e^δ − 1 − δ, per token, or per completion as their
        sum, mean (the geometric-mean ratio for k1) or max; k1 keeps [log low, log high], k2/k3 keep ≤ high.

Presets (`PRESETS`): token_tis, seq_tis (verl decoupled_token_is / _seq_is); icepop (IcePop's two-sided
token mask, token_k1 in [low, high]); seq_mis (seq_sum_k1: the whole sequence ratio in the band);
geo_mis (seq_mean_k1: the geometric-mean ratio in the band, verl decoupled_geo_rs); k3_mis (seq_mean_k3
≤ high); and geo_mis_token_tis, geo_mis_seq_tis, seq_mis_seq_tis (a mask and weights together).
`bench/verl_loss_parity.py` checks weights and masks against verl's own functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalerl.algorithms.losses import masked_fill_zero, masked_mean

_BOUND = 20.0
# preset -> (IS level or None, rejection mode or None)
PRESETS: dict[str, tuple[str | None, str | None]] = {
    "token_tis": ("token", None), "seq_tis": ("sequence", None),
    "icepop": (None, "token_k1"), "seq_mis": (None, "seq_sum_k1"), "geo_mis": (None, "seq_mean_k1"), "k3_mis": (None, "seq_mean_k3"),
    "geo_mis_token_tis": ("token", "seq_mean_k1"), "geo_mis_seq_tis": ("sequence", "seq_mean_k1"),
    "seq_mis_seq_tis": ("sequence", "seq_sum_k1"),
}


@dataclass(frozen=True)
class RolloutCorrection:
    """One preset's settings: `cap` C of the IS weights, [`low`, `high`] the rejection band."""

    preset: str
    cap: float = 2.0
    low: float = 0.5
    high: float = 2.0


def is_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor, *,
               level: str, cap: float) -> torch.Tensor:
    """Truncated importance weights π_old / π_sampler per token or per completion (module docstring);
    0 on untrained positions."""
    with torch.no_grad():
        delta = masked_fill_zero(old_logprobs - sampler_logprobs, loss_mask)  # (B, T)
        if level == "token":
            w = torch.exp(delta.clamp(-_BOUND, _BOUND))
        elif level == "sequence":
            w = torch.exp(delta.sum(-1, keepdim=True).clamp(-_BOUND, _BOUND)).expand_as(delta)
        else:
            raise ValueError(f"unknown IS level {level!r}; use token or sequence")
        return (masked_fill_zero(w, loss_mask)).clamp(max=cap)


def rejection_mask(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor, *,
                   mode: str, low: float, high: float) -> torch.Tensor:
    """keep (B, T) in {0, 1} for `mode` = token_k{1,2,3} or seq_{sum,mean,max}_k{1,2,3} (max: k2, k3)."""
    with torch.no_grad():
        trained = loss_mask.bool()
        delta = (old_logprobs - sampler_logprobs).clamp(-_BOUND, _BOUND)
        stat = {"k1": -delta, "k2": 0.5 * delta.square(), "k3": torch.expm1(delta) - delta}[mode[-2:]]
        level = mode[:-3]
        if level == "seq_sum":
            stat = masked_fill_zero(stat, loss_mask).sum(-1, keepdim=True)
        elif level == "seq_mean":
            stat = masked_fill_zero(stat, loss_mask).sum(-1, keepdim=True) / loss_mask.sum(-1, keepdim=True).clamp(min=1)
        elif level == "seq_max" and mode[-2:] != "k1":
            stat = stat.masked_fill(~trained, -math.inf).amax(-1, keepdim=True)
            stat = torch.where(torch.isinf(stat), torch.zeros_like(stat), stat)
        elif level != "token":
            raise ValueError(f"unknown rejection mode {mode!r}")
        keep = (stat >= math.log(low)) & (stat <= math.log(high)) if mode.endswith("k1") else stat <= high
        return (keep.expand_as(delta) & trained).to(old_logprobs.dtype)


def ratio_quantiles(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The 5th, 50th and 95th percentiles of the token ratios π_old / π_sampler over trained tokens."""
    with torch.no_grad():
        ratio = torch.exp((old_logprobs - sampler_logprobs)[loss_mask.bool()].clamp(-_BOUND, _BOUND)).float()
        if ratio.numel() == 0:
            ratio = torch.ones(1)
        q = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95]))
        return {f"rollout_corr/ratio_p{p}": v.to(old_logprobs.dtype) for p, v in zip((5, 50, 95), q)}


def rollout_correction(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor,
                       rc: RolloutCorrection) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The factor (B, T) to multiply the per-token policy objective by (IS weight × keep), and the
    metrics: ratio quantiles, masked_frac (trained tokens the mask drops), is_clip_frac (weights at
    the cap), k3 sampler KL (mean over trained tokens of e^δ − 1 − δ: KL(π_sampler ‖ π_old))."""
    if rc.preset not in PRESETS:
        raise ValueError(f"unknown rollout correction {rc.preset!r}; use one of {', '.join(PRESETS)}")
    level, mode = PRESETS[rc.preset]
    factor = loss_mask.to(old_logprobs.dtype)
    stats = ratio_quantiles(old_logprobs, sampler_logprobs, loss_mask)
    delta = masked_fill_zero(old_logprobs - sampler_logprobs, loss_mask)
    stats["rollout_corr/sampler_kl_k3"] = masked_mean(torch.expm1(delta) - delta, loss_mask)
    if mode is not None:
        keep = rejection_mask(old_logprobs, sampler_logprobs, loss_mask, mode=mode, low=rc.low, high=rc.high)
        factor = factor * keep
        stats["rollout_corr/masked_frac"] = masked_mean(1.0 - keep, loss_mask)
    if level is not None:
        w = is_weights(old_logprobs, sampler_logprobs, loss_mask, level=level, cap=rc.cap)
        factor = factor * w
        stats["rollout_corr/is_clip_frac"] = masked_mean((w >= rc.cap).to(w.dtype), loss_mask)
    return factor.detach(), stats
