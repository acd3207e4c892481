"""Advantage estimators: group-relative ones over scalar per-completion rewards (GRPO, RLOO,
REINFORCE++), and GAE over per-token rewards and values (PPO with a critic).

Rewards (N,) are laid out prompt by prompt: consecutive `group_size` entries are one prompt's
completions. Standard deviations use Bessel's correction throughout (as TRL and torch.std do).
"""

from __future__ import annotations

from typing import Literal

import torch

from scalerl.algorithms.losses import masked_fill_zero

ScaleRewards = Literal["group", "batch", "none"]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.view(-1, group_size)  # (P, G)


def _std(x: torch.Tensor) -> torch.Tensor:
    """Bessel std of all entries; 0 for a single entry (where torch.std is NaN)."""
    return x.std() if x.numel() > 1 else x.new_zeros(())


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scale: bool = True,
    eps: float = 1e-4,
    scale_rewards: ScaleRewards | None = None,
) -> torch.Tensor:
    """GRPO group-relative advantages (Shao et al., DeepSeekMath, 2024, §4.1.2).

        Â_i = (r_i − mean(r_group)) / (std(r_group) + eps)     "group" (GRPO)
        Â_i = (r_i − mean(r_group)) / (std(r_batch) + eps)     "batch" (ScaleRL paper, Khatri et al.,
                                                                2025; TRL scale_rewards="batch")
        Â_i =  r_i − mean(r_group)                             "none" (Dr. GRPO, Liu et al., 2025)

    `scale_rewards`, when given, chooses among the three; otherwise `scale=True` means "group" and
    `scale=False` means "none". std(r_batch) is the std of the raw rewards of the whole batch. std
    uses Bessel's correction (as TRL does). A group whose rewards are all equal gets Â = 0.

    Args:
        rewards: (N,) rewards, consecutive `group_size` entries belong to one prompt.
        group_size: completions per prompt; N must be a multiple of it.
    Returns:
        (N,) advantages, one per completion (broadcast to its tokens by the loss).
    """
    mode = scale_rewards if scale_rewards is not None else ("group" if scale else "none")
    grouped = _grouped(rewards, group_size)  # (P, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (P, G)
    match mode:
        case "group":
            std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
            centred = centred / (std + eps)
        case "batch":
            centred = centred / (_std(rewards) + eps)
        case "none":
            pass
        case _:
            raise ValueError(f"unknown scale_rewards {mode!r}; use group, batch or none")
    return centred.reshape(-1)  # (N,)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al., 2019; Ahmadian et al., 2024, "Back to Basics"):

        Â_i = r_i − 1/(G−1) Σ_{j≠i} r_j = G/(G−1) · (r_i − mean(r_group))

    Each completion's baseline is the mean of the other completions of its prompt, so it is
    independent of r_i and the estimate is unbiased. Needs G ≥ 2. Returns (N,).
    """
    if group_size < 2:
        raise ValueError(f"RLOO needs at least 2 completions per prompt, got group_size={group_size}")
    grouped = _grouped(rewards, group_size)  # (P, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred * (group_size / (group_size - 1))).reshape(-1)  # (N,)


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    baseline: Literal["batch", "group"] = "batch",
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ advantages (Hu, 2025, "REINFORCE++"), normalised over the global batch:

        "batch":  Â_i = (r_i − mean(r)) / (std(r) + eps)                      (REINFORCE++)
        "group":  a_i = r_i − mean(r_group);  Â_i = (a_i − mean(a)) / (std(a) + eps)
                                                                  (REINFORCE++-baseline)

    mean and std are over all N completions (std with Bessel's correction, like the rest of this
    module; OpenRLHF whitens over tokens instead, which weights completions by length). With the
    "group" baseline mean(a) = 0 up to rounding; it is subtracted anyway, as the paper writes it.
    Any KL term is left to the loss. Returns (N,).
    """
    grouped = _grouped(rewards, group_size)  # (P, G)
    match baseline:
        case "batch":
            x = rewards.reshape(-1)  # (N,)
        case "group":
            x = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # (N,)
        case _:
            raise ValueError(f"unknown REINFORCE++ baseline {baseline!r}; use batch or group")
    return (x - x.mean()) / (_std(x) + eps)  # (N,)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016, eq. 16) over completion tokens.

        δ_t = r_t + γ V_{t+1} − V_t          V_{t+1} = 0 after a row's last trained token
        Â_t = δ_t + γλ Â_{t+1}               Â = 0 after the last trained token
        R_t = Â_t + V_t                      (the critic's regression target)

    "t + 1" is the next trained token: untrained positions (padding, and the observations inside a
    multi-turn episode) are skipped, so the value and advantage carry over them undiscounted.

    With γ = λ = 1, Â_t = Σ_{s≥t} r_s − V_t. Computed under no-grad: advantages and returns are
    targets. Vectorised over rows, reverse loop over T.

    Args:
        rewards: (B, T) per-token rewards (e.g. the scalar reward on the last token, minus a
            per-token KL penalty).
        values: (B, T) critic values V_t.
        loss_mask: (B, T) 1 on trained tokens (ones then zeros, or with gaps in a multi-turn episode).
    Returns:
        advantages (B, T) and returns (B, T), both 0 on untrained positions.
    """
    mask = loss_mask.to(values.dtype)
    with torch.no_grad():
        r = masked_fill_zero(rewards.detach(), loss_mask)  # (B, T); NaN/inf under the mask ignored
        v = masked_fill_zero(values.detach(), loss_mask)  # (B, T), so V = 0 past each row's end
        adv = torch.zeros_like(v)  # (B, T)
        next_value = v.new_zeros(v.shape[0])  # (B,)
        next_adv = v.new_zeros(v.shape[0])  # (B,)
        for t in reversed(range(v.shape[1])):
            delta = r[:, t] + gamma * next_value - v[:, t]  # (B,)
            # Untrained positions get 0 and pass the next trained token's Â and V through, so the
            # last trained token starts from Â_{t+1} = V_{t+1} = 0.
            adv[:, t] = (delta + gamma * lam * next_adv) * mask[:, t]
            trained = mask[:, t] > 0  # (B,)
            next_adv = torch.where(trained, adv[:, t], next_adv)
            next_value = torch.where(trained, v[:, t], next_value)
        return adv, masked_fill_zero(adv + v, loss_mask)


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(3,) float64: [n, Σ x, Σ x²] over the masked entries; summed over ranks, they give `whiten`
    the global batch's mean and variance."""
    m = mask.to(torch.float64)
    x = masked_fill_zero(values.detach().to(torch.float64), mask)
    return torch.stack([m.sum(), x.sum(), x.square().sum()])


def whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8,
           moments: torch.Tensor | None = None) -> torch.Tensor:
    """Normalise over the masked entries (as TRL's masked_whiten, used for PPO advantages):

        μ = mean_m(x),  σ² = var_m(x) (Bessel),  x̂ = (x − μ) / sqrt(σ² + eps)   (+ μ if not shift_mean)

    Args:
        values: (B, T).
        mask: (B, T), 1 on the entries that count.
        moments: `masked_moments` of the whole batch (e.g. summed over ranks); default: of `values`.
            Then σ² = (Σx² − n μ²) / (n − 1).
    Returns:
        (B, T), 0 on masked-out entries.
    """
    m = mask.to(values.dtype)
    if moments is None:
        n = m.sum()
        mean = masked_fill_zero(values, mask).sum() / n.clamp(min=1.0)
        var = masked_fill_zero((values - mean).square(), mask).sum() / (n - 1).clamp(min=1.0)
    else:
        n, total, squares = moments.tolist()
        mean = total / max(n, 1.0)
        var = max(squares - n * mean * mean, 0.0) / max(n - 1.0, 1.0)
        mean, var = values.new_tensor(mean), values.new_tensor(var)
    out = (values - mean) * torch.rsqrt(var + eps)  # (B, T)
    if not shift_mean:
        out = out + mean
    return masked_fill_zero(out, mask)


def distillation_advantages(
    teacher_logprobs: torch.Tensor,
    student_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    coef: float = 1.0,
    task_advantages: torch.Tensor | None = None,
    task_coef: float = 0.0,
) -> torch.Tensor:
    """On-policy distillation's dense advantage (Agarwal et al., 2024, "On-Policy Distillation of
    Language Models: Learning from Self-Generated Mistakes"; Thinking Machines' tinker-cookbook, 2025;
    TRL's GKD at λ = 1, β = 1): on the student's own samples, each token is rewarded by the teacher's
    log-probability over the student's, the negative per-token reverse KL, optionally mixed with the
    task's outcome advantage:

        Â_it = coef · (log π_teacher(y_it) − log π_student(y_it)) + task_coef · Â_i

    No discounting across tokens (each token's own reverse-KL term, as tinker-cookbook's default).
    `student_logprobs` are the sampling policy's (π_old), detached. Returns (B, T), 0 off the mask.
    """
    with torch.no_grad():
        adv = coef * masked_fill_zero(teacher_logprobs - student_logprobs, loss_mask)  # (B, T)
        if task_advantages is not None and task_coef:
            task = task_advantages.unsqueeze(1) if task_advantages.dim() == 1 else task_advantages
            adv = adv + task_coef * masked_fill_zero(task.expand_as(adv), loss_mask)
        return adv
