"""Per-token log-probs and entropy from final hidden states and the LM head, chunk by chunk, so that the
(B, T, V) logits never exist whole: the training forward's largest tensor at a real vocabulary, and the
backward's log-softmax holds four of it (scalerl/predict/memory.py: `backward_transient`).

For N positions with hidden states h (N, H), head W (V, H) and bias b, the logits of a chunk of c
positions are z = (h Wᵀ + b) / τ (c, V), and

    log π(y) = z_y − logsumexp(z),     H = logsumexp(z) − Σ_v p_v z_v,     p = softmax(z).

The forward keeps only h, W and the targets; the backward recomputes each chunk's logits and applies the
gradients in closed form (as Liger-Kernel's fused linear cross-entropy and prime-rl's chunked head do):

    ∂log π(y)/∂z = onehot(y) − p,     ∂H/∂z = −p ⊙ (log p + H),

so with upstream gradients g_lp and g_H (c,): g_z = g_lp·onehot(y) − p ⊙ (g_lp + g_H·(log p + H)), then
∂/∂h = (g_z / τ) W, ∂/∂W = (g_z / τ)ᵀ h, ∂/∂b = Σ g_z / τ. Peak extra memory: two (c, V) tensors of the
compute dtype, the head's gradient (V, H), and one float32 copy of W for a low-precision head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _chunk_stats(z: torch.Tensor, y: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(log π(y), entropy or None, logsumexp) of a chunk's logits z (c, V) and targets y (c,)."""
    lse = torch.logsumexp(z, dim=-1)  # (c,)
    lp = z.gather(-1, y[:, None]).squeeze(-1) - lse
    ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1) if with_entropy else None  # H = logZ − Σ p·z
    return lp, ent, lse


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, dtype, with_entropy):
        N = hidden.shape[0]
        lp = torch.empty(N, dtype=dtype, device=hidden.device)
        ent = torch.empty(N, dtype=dtype, device=hidden.device) if with_entropy else None
        lse = torch.empty(N, dtype=dtype, device=hidden.device)
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, N, chunk):
                z = F.linear(hidden[s:s + chunk].to(dtype), w, b).div_(temperature)  # (c, V)
                lp[s:s + chunk], e, lse[s:s + chunk] = _chunk_stats(z, targets[s:s + chunk], with_entropy)
                if with_entropy:
                    ent[s:s + chunk] = e
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.mark_non_differentiable(lse)
        return lp, ent, lse

    @staticmethod
    def backward(ctx, g_lp, g_ent, _g_lse):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        tau, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        g_h = torch.empty(hidden.shape, dtype=dtype, device=hidden.device) if need_h else None
        g_w = torch.zeros(w.shape, dtype=dtype, device=w.device) if need_w else None
        g_b = torch.zeros(w.shape[0], dtype=dtype, device=w.device) if need_b and b is not None else None
        g_lp = torch.zeros_like(lse) if g_lp is None else g_lp.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s:s + chunk].to(dtype)
                logp = F.linear(h, w, b).div_(tau).sub_(lse[s:s + chunk, None])  # (c, V) log p
                p = logp.exp()
                coef = g_lp[s:s + chunk, None]
                if g_ent is not None:  # g_lp + g_H·(log p + H), in place on log p
                    coef = logp.add_(ent[s:s + chunk, None]).mul_(g_ent[s:s + chunk, None].to(dtype)).add_(coef)
                g_z = p.mul_(coef).neg_()  # −p ⊙ (…), in place on p
                g_z.scatter_add_(-1, targets[s:s + chunk, None], g_lp[s:s + chunk, None])  # + g_lp at y
                g_z.div_(tau)
                if need_h:
                    torch.mm(g_z, w, out=g_h[s:s + chunk])
                if need_w:
                    g_w.addmm_(g_z.t(), h)
                if g_b is not None:
                    g_b += g_z.sum(0)
                del logp, p, g_z, coef, h  # before the next chunk's: two (c, V) tensors at a time
        return (g_h.to(hidden.dtype) if need_h else None, g_w.to(weight.dtype) if need_w else None,
                g_b.to(bias.dtype) if g_b is not None else None, None, None, None, None, None)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, *,
                     temperature: float = 1.0, chunk: int, dtype: torch.dtype = torch.float32,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log π(y), entropy or None), each shaped as `targets` (..., ), from `hidden` (..., H) and the head
    `weight` (V, H) / `bias` (V,), computed in `dtype` over chunks of `chunk` positions (see the module
    docstring); equal to the full logits' values up to rounding, gradients included."""
    shape = targets.shape
    lp, ent, _ = _ChunkedHead.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1),
                                    float(temperature), int(chunk), dtype, with_entropy)
    return lp.view(shape), ent.view(shape) if ent is not None else None
