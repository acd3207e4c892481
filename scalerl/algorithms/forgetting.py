"""The terms that keep what the policy knew beside the RL loss: an SFT anchor and EWC. Pure functions.

Source 000 §5.2: a small share of each batch is supervised data (the SFT anchor), and an elastic
weight consolidation penalty (Kirkpatrick et al. 2017) holds the parameters that mattered for the
earlier task near their values then.
"""

from __future__ import annotations

import torch


def sft_nll(logprobs: torch.Tensor, loss_mask: torch.Tensor, *, normalizer: float) -> torch.Tensor:
    """The anchor's negative log-likelihood, summed over its response tokens and divided by `normalizer`:

        L_sft = − Σ_{i,t} m_{i,t} log π_θ(y_{i,t} | x_i, y_{i,<t}) / N

    logprobs, loss_mask: (B, T) for the anchor rows; N: the anchor tokens of the update over all ranks
    and micro-batches (so the summed gradients are the token mean). Returns a scalar."""
    return -(logprobs * loss_mask).sum() / max(normalizer, 1.0)


def ewc_penalty(params: list[torch.Tensor], anchors: list[torch.Tensor], fisher: list[torch.Tensor], *, lam: float) -> torch.Tensor:
    """Elastic weight consolidation (Kirkpatrick et al. 2017, eq. 3, with the ½ folded into λ as source 000 writes it):

        L_ewc = λ Σ_i F_i (θ_i − θ*_i)²        ∂L_ewc/∂θ_i = 2 λ F_i (θ_i − θ*_i)

    params: the trained tensors θ; anchors: θ* (their values when F was measured); fisher: the diagonal
    Fisher information F of the anchor data at θ* (`ewc_gradient` gives the gradient without autograd).
    Returns a float32 scalar."""
    total = torch.zeros((), dtype=torch.float32)
    for p, a, f in zip(params, anchors, fisher, strict=True):
        total = total + (f.float() * (p.float() - a.float()).square()).sum().to(total.device)
    return lam * total


def ewc_gradient(param: torch.Tensor, anchor: torch.Tensor, fisher: torch.Tensor, *, lam: float) -> torch.Tensor:
    """∂L_ewc/∂θ = 2 λ F (θ − θ*) for one tensor, in the parameter's dtype (see `ewc_penalty`)."""
    return (2.0 * lam * fisher.float() * (param.float() - anchor.float())).to(param.dtype)
