"""AdamW with its states and its step in host memory (`optim.offload`): what a GPU keeps is the weights and gradients.

The float32 moments m and v (8 bytes a parameter) live in host memory, and each update runs torch's fused CPU
AdamW there: the device's weights and (clipped, unscaled, rank-summed) gradients are copied to pinned host
buffers, the host steps, and the new weights are copied back — ZeRO-Offload's split (DeepSpeed's
`offload_optimizer`, OpenRLHF's `--adam_offload`). The device's weights stay the authoritative copy: they are
read again at every update, so a checkpoint load or a rollback that changes them needs no hook here. One update
moves 12 bytes a parameter over the host link (weights and gradients down, weights up).

torchao's CPUOffloadOptimizer is not used: it copies each gradient to the host as soon as backward produces it
(a post-accumulate hook), before the learner unscales fp16's loss scale, adds EWC's gradient and clips, so the
host would step on the unclipped gradient; it also refuses CPU tensors. On CPU this optimizer gives exactly
torch's fused AdamW (the tests check it bitwise), and saves nothing: the states are in host memory either way.
"""

from __future__ import annotations

from typing import Any

import torch

HYPER = ("lr", "betas", "eps", "weight_decay")


class HostOffloadAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW(fused=True) over host copies of the parameters; `param_groups` hold the device's own
    parameters (the learner clips and sets each update's lr on them), `state` is the host optimizer's, keyed by
    the device parameters, and `state_dict` is a plain AdamW's (either loads the other's: tests/precision/test_offload.py)."""

    def __init__(self, param_groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float):
        super().__init__(param_groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.pin = torch.cuda.is_available() and any(p.is_cuda for g in self.param_groups for p in g["params"])
        self.host = [[self._buffer(p) for p in g["params"]] for g in self.param_groups]
        self.inner = torch.optim.AdamW([{**{k: g[k] for k in HYPER}, "params": hosts} for g, hosts in zip(self.param_groups, self.host)],
                                       lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)

    def _buffer(self, p: torch.Tensor) -> torch.Tensor:
        if p.dtype != torch.float32:
            raise ValueError(f"HostOffloadAdamW steps float32 weights, not {p.dtype}")
        host = torch.empty(p.shape, dtype=torch.float32, pin_memory=self.pin)
        host.grad_buffer = torch.empty_like(host, pin_memory=self.pin)  # host.grad is set to it for the updates it takes part in
        return host

    def _pairs(self):
        for group, inner, hosts in zip(self.param_groups, self.inner.param_groups, self.host):
            yield group, inner, list(zip(group["params"], hosts))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        stepped = []
        for group, inner, pairs in self._pairs():
            inner.update({k: group[k] for k in HYPER})  # this update's lr, as the learner set it
            for p, h in pairs:
                h.grad = None if p.grad is None else h.grad_buffer  # as AdamW: a parameter without gradient is left alone
                if p.grad is not None:
                    h.copy_(p.detach(), non_blocking=True)
                    h.grad.copy_(p.grad, non_blocking=True)
                    stepped.append((p, h))
        if self.pin:
            torch.cuda.current_stream().synchronize()  # the host reads what the copies wrote
        self.inner.step()
        for p, h in stepped:
            p.copy_(h, non_blocking=True)  # the device's stream orders this before the next forward
            self.state[p] = self.inner.state[h]
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)  # onto the host tensors: the states stay in host memory
        self.state.clear()
        for group, inner, pairs in self._pairs():
            group.update({k: inner[k] for k in HYPER})
            for p, h in pairs:
                if h in self.inner.state:
                    self.state[p] = self.inner.state[h]
