"""The terms that keep what the policy knew beside the RL loss: an SFT anchor, EWC and self-distillation. Pure functions.

Source 000 §5.2: a small share of each batch is supervised data (the SFT anchor), and an elastic
weight consolidation penalty (Kirkpatrick et al. 2017) holds the parameters that mattered for the
earlier task near their values then. Self-distillation (`self_distill_loss`) keeps the outputs instead: the
frozen starting policy is the teacher of the student's own samples of the anchor prompts.
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


def self_distill_loss(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, loss_mask: torch.Tensor, *,
                      normalizer: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-distillation against forgetting: the reverse KL from the frozen starting policy π_0 (the teacher) on the
    student's own samples y ~ π_θ of the anchor prompts, per token, as on-policy distillation writes it (Agarwal et
    al. 2024, "On-Policy Distillation of Language Models" (GKD), reverse KL on student samples; Lu & Thinking Machines
    Lab 2025, "On-Policy Distillation": the per-token reverse KL as the advantage, discount 0):

        d_{i,t} = log π_θ(y_{i,t} | x_i, y_{i,<t}) − log π_0(y_{i,t} | x_i, y_{i,<t})
        L_sd    = (1/N) Σ_{i,t} m_{i,t} [ sg(d_{i,t}) · (log π_θ(y_{i,t}) − sg(log π_θ(y_{i,t}))) + sg(d_{i,t}) ]
        ∇L_sd   = (1/N) Σ_{i,t} m_{i,t} d_{i,t} ∇ log π_θ(y_{i,t})

    i.e. policy gradient with the per-token advantage −d (the score-function gradient of KL(π_θ ‖ π_0) with each
    token's own term only), and the value of L_sd is the k1 estimate of the per-token reverse KL (1/N) Σ m d.
    At the start π_θ = π_0: d = 0, nothing is pulled; as RL moves the policy on the anchor prompts, the term
    pulls its own samples back toward what π_0 would say, without any anchor responses (an alternative to EWC's
    weight-space penalty, in output space).

    logprobs: (B, T) log π_θ with grad; teacher_logprobs: (B, T) log π_0; loss_mask: (B, T) 1 on sampled tokens;
    N: the anchor tokens of the update over all ranks and micro-batches. Positions under a zero mask are ignored
    whatever they hold (NaN, inf). Returns (L_sd, the detached reverse-KL estimate)."""
    keep = loss_mask.bool()
    d = torch.where(keep, logprobs.detach() - teacher_logprobs, torch.zeros_like(logprobs)).detach()  # (B, T)
    centred = torch.where(keep, logprobs - logprobs.detach(), torch.zeros_like(logprobs))  # value 0, gradient ∇ log π_θ
    n = max(normalizer, 1.0)
    kl = d.sum() / n
    return (d * centred).sum() / n + kl, kl
