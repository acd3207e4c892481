"""Dynamic sharding (source 000 §2.1): groups of parameters synchronised at their own intervals.

Every rank steps its own optimizer every step on its own gradient (no gradient all-reduce); the
parameters of each group in `parallel.param_groups` are averaged over the ranks every
`sync_interval` steps (local SGD per group), their AdamW moments too with `parallel.sync_moments`.
Every group is averaged on the first and the last step and before every evaluation and
checkpoint, so what is evaluated and saved is one model; before a checkpoint the AdamW moments
too, so that the saved optimizer state is one (a resume continues every rank from it). Parameters
no group matches form the group `rest`, averaged every step.

A rank's loss is divided by the global batch's count (the learner's convention), so its gradient
is about 1/N of its own batch's mean gradient; it is multiplied by the world size before the step.
Clipping uses each rank's own norm; a non-finite gradient on any rank skips the update on every
rank (one all-reduced flag), so the learners' update counts, and with them the lr schedule, agree.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from scalerl.config import ParamGroupConfig
from scalerl.distributed.context import DistContext
from scalerl.distributed.parallel import Strategy
from scalerl.models.logprobs import CompletionModel
from scalerl.config.plan import PrecisionPolicy


@dataclass
class SyncGroup:
    name: str
    sync_interval: int
    params: list[torch.Tensor]

    @property
    def bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def resolve_groups(named: list[tuple[str, torch.Tensor]], groups: list[ParamGroupConfig], last_layer: int) -> list[SyncGroup]:
    """Each parameter into the first group one of whose patterns matches its name (`{last}`: the last
    layer's index); the unmatched ones into `rest` (interval 1). Empty groups are dropped."""
    resolved = [SyncGroup(g.name, g.sync_interval, []) for g in groups] + [SyncGroup("rest", 1, [])]
    patterns = [[p.replace("{last}", str(last_layer)) for p in g.params] for g in groups]
    for name, param in named:
        index = next((i for i, pats in enumerate(patterns) if any(fnmatch.fnmatchcase(name, pat) for pat in pats)), len(groups))
        resolved[index].params.append(param)
    return [g for g in resolved if g.params]


def last_layer_index(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    return max(0, getattr(config, "num_hidden_layers", 1) - 1)


class DynamicSharding(Strategy):
    name = "dynamic"

    def __init__(self, ctx: DistContext, precision: PrecisionPolicy, groups: list[ParamGroupConfig], *, sync_moments: bool):
        super().__init__(ctx, precision)
        self.config_groups, self.sync_moments = list(groups), sync_moments
        self.groups: list[SyncGroup] = []

    def wrap(self, module: nn.Module, *, trainable: bool = True) -> nn.Module:
        if trainable:
            self._roots.append(module)
            inner = module.model if isinstance(module, CompletionModel) else module
            named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
            if len(self._roots) > 1:  # a critic: its names would collide with the policy's
                self.groups.append(SyncGroup(f"critic{len(self._roots) - 1}", 1, [p for _, p in named]))
            else:
                self.groups.extend(resolve_groups(named, self.config_groups, last_layer_index(inner)))
        return module

    def finish_gradients(self) -> None:
        for p in self._trainable():
            if p.grad is not None:
                p.grad.mul_(self.ctx.world_size)  # this rank's gradient at the scale of the global batch's

    def grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
        bad = self.ctx.sum(torch.tensor([0.0 if math.isfinite(norm) else 1.0], dtype=torch.float64)).item()
        return math.nan if bad else norm  # NaN: the learner skips the update, on every rank

    def describe(self) -> str:
        parts = ", ".join(f"{g.name} every {g.sync_interval} ({g.bytes / 2**20:.2f} MiB)" for g in self.groups)
        return f"parallel: dynamic sharding over {self.ctx.world_size} ranks: {parts}"

    def end_of_step(self, step: int, full: bool, optimizer: torch.optim.Optimizer, moments: bool = False) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for g in self.groups:
            due = full or step % g.sync_interval == 0
            metrics[f"comm/bytes/{g.name}"] = float(self._average(g, optimizer, moments=moments or self.sync_moments) if due else 0)
        metrics["comm/bytes"] = sum(metrics.values())
        return metrics

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        for g in self.groups:
            self._average(g, optimizer, moments=True)

    @torch.no_grad()
    def _average(self, group: SyncGroup, optimizer: torch.optim.Optimizer, moments: bool) -> int:
        """Average the group's parameters (and AdamW moments) over the ranks, one flat all-reduce per
        dtype; returns the payload in bytes."""
        tensors = list(group.params)
        if moments:
            tensors += [v for p in group.params for k, v in optimizer.state.get(p, {}).items()
                        if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "step"]
        sent = 0
        for dtype in sorted({t.dtype for t in tensors}, key=str):
            same = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.reshape(-1) for t in same]).to(self.ctx.device)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat /= self.ctx.world_size
            offset = 0
            for t in same:
                t.copy_(flat[offset: offset + t.numel()].view_as(t))
                offset += t.numel()
            sent += flat.numel() * flat.element_size()
        return sent
