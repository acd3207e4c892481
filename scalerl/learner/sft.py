"""Supervised fine-tuning's learner: tokenised examples into batches, and one optimizer update of masked
cross-entropy on the response tokens (what `scalerl sft` runs, scalerl/jobs/sft.py).

    examples (prompt ids, response ids + the stop token), cut to max_length
      → rows: one example each, or with packing several in a row (`pack`, a block-diagonal mask)
      → `SFTLearner.update(rows)`: micro-batches of sft_nll (scalerl/algorithms/forgetting.py),
        normalised by the update's response tokens over every rank, then clip, lr, step

The policy runs through the parallel strategy's wrapped `CompletionModel`, in the precision mode's autocast,
with the optimizer and lr schedule of the RL learner (scalerl/learner/optim.py), so an SFT run and an RL run
of one config train the same weights in the same dtypes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from scalerl.algorithms.forgetting import sft_nll
from scalerl.config import OptimConfig
from scalerl.distributed.context import DistContext
from scalerl.distributed.parallel import Strategy
from scalerl.learner.optim import lr_factor
from scalerl.types import Rollout

Example = tuple[list[int], list[int]]  # (prompt ids, response ids ending with the stop token)


def truncate(examples: list[Example], max_length: int) -> tuple[list[Example], int]:
    """Each example cut to max_length tokens (the response's end goes first); those with no response token left
    are dropped. Returns (kept, dropped count)."""
    kept = [(p, r[: max_length - len(p)]) for p, r in examples if len(p) < max_length]
    return kept, len(examples) - len(kept)


def pack(examples: list[Example], max_length: int) -> list[list[Example]]:
    """Consecutive examples in rows of at most max_length tokens (in order: a row is closed when the next
    example does not fit)."""
    rows: list[list[Example]] = []
    used = max_length
    for p, r in examples:
        if used + len(p) + len(r) > max_length:
            rows.append([])
            used = 0
        rows[-1].append((p, r))
        used += len(p) + len(r)
    return rows


def as_batch(rows: list[list[Example]], pad_id: int, device: torch.device) -> tuple[Rollout, torch.Tensor | None]:
    """Rows as a Rollout whose completion mask is 1 on response tokens, and their segments (None when no row packs
    more than one example). A single example: prompt left-padded, response right-padded. Packed rows: the row's
    first token is the prompt, the rest the completion (every example's prompt tokens masked out)."""
    if all(len(r) == 1 for r in rows):
        prompts, responses = [r[0][0] for r in rows], [r[0][1] for r in rows]
        P, T = max(map(len, prompts)), max(map(len, responses))
        prompt_ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((len(rows), P), dtype=torch.long)
        completion_ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), T), dtype=torch.long)
        for i, (p, c) in enumerate(zip(prompts, responses)):
            prompt_ids[i, P - len(p):], prompt_mask[i, P - len(p):] = torch.tensor(p), 1
            completion_ids[i, : len(c)], attention[i, : len(c)] = torch.tensor(c), 1
        return _rollout(prompt_ids, prompt_mask, completion_ids, attention, attention, device), None
    L = max(sum(len(p) + len(r) for p, r in row) for row in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    trained = torch.zeros((len(rows), L), dtype=torch.long)
    segments = torch.full((len(rows), L), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        at = 0
        for k, (p, r) in enumerate(row):
            ids[i, at: at + len(p) + len(r)] = torch.tensor(p + r)
            trained[i, at + len(p): at + len(p) + len(r)] = 1
            segments[i, at: at + len(p) + len(r)] = k
            at += len(p) + len(r)
    real = (segments >= 0).long()
    rollout = _rollout(ids[:, :1], real[:, :1], ids[:, 1:], trained[:, 1:], real[:, 1:], device)
    return rollout, segments.to(device)


def _rollout(prompt_ids, prompt_mask, completion_ids, trained, attention, device) -> Rollout:
    B, T = completion_ids.shape
    return Rollout(prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device), completion_ids=completion_ids.to(device),
                   completion_mask=trained.to(device), sampler_logprobs=torch.zeros((B, T), device=device),
                   truncated=torch.zeros(B, dtype=torch.bool, device=device), group_ids=torch.arange(B, device=device),
                   completion_attention_mask=attention.to(device))


@dataclass
class SFTLearner:
    """The policy's wrapped forward, its optimizer and the schedule: `update` takes one optimizer step."""

    policy: torch.nn.Module  # the Hugging Face model (what checkpoints save)
    forward: torch.nn.Module  # the strategy's wrapped CompletionModel
    optimizer: torch.optim.Optimizer
    parallel: Strategy
    ctx: DistContext
    optim: OptimConfig
    autocast: Callable[[], Any]
    fp32_head: bool
    total_updates: int
    micro_batch_size: int | None
    pad_id: int
    lr: float  # the peak learning rate
    updates: int = 0  # optimizer steps taken: the lr schedule's position

    def update(self, rows: list[list[Example]]) -> dict[str, float]:
        """One optimizer update on this rank's `rows` (a rank with none still runs a zero-weighted backward, so that
        every rank joins the gradient reduction). Returns loss (the token mean over every rank), tokens, grad_norm, lr."""
        weight = 1.0 if rows else 0.0
        rows = rows or [[([self.pad_id], [self.pad_id])]]
        micro = self.micro_batch_size or len(rows)
        local = sum(len(r) for row in rows for _, r in row) * weight
        tokens = self.ctx.sum(torch.tensor([local], dtype=torch.float64)).item()  # N of sft_nll: the update's response tokens
        loss_sum = 0.0
        for start in range(0, len(rows), micro):
            batch, segments = as_batch(rows[start: start + micro], self.pad_id, self.ctx.device)
            with self.parallel.accumulating(sync=start + micro >= len(rows)), self.autocast():
                logprobs = self.forward(batch, fp32_head=self.fp32_head, segments=segments).logprobs.float()  # (B, T)
            loss = sft_nll(logprobs, batch.completion_mask.float(), normalizer=tokens) * weight
            loss.backward()
            loss_sum += loss.item()
        self.parallel.finish_gradients()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = self.parallel.grad_norm(params, self.optim.max_grad_norm or math.inf)
        lr = self.lr * lr_factor(self.updates, self.total_updates, self.optim)
        if math.isfinite(grad_norm):  # a NaN/Inf gradient never reaches the weights
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss_all = self.ctx.sum(torch.tensor([loss_sum], dtype=torch.float64)).item()
        return {"loss": loss_all, "tokens": tokens, "grad_norm": grad_norm, "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
