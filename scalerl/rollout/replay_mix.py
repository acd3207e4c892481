"""Replay on the rollout side (`replay.*`): older prompt groups mixed into each step's batch.

    fresh ScoredBatch ─┬─ sample k groups from the buffer (drawn before this step's groups go in)
                       ├─ they take the places of the k fresh groups with the least reward spread
                       │  (the batch keeps its shape, so the batch plan and every rank's collectives hold;
                       │  the replaced groups still enter the buffer, counted as replay/displaced_groups)
                       └─ every fresh group enters the buffer, its priority the spread of its rewards

The mixed batch is off-policy: its `policy_version` is the oldest of its rows, so the learner recomputes
π_old with its current weights and the replayed rows' stored sampler log-probs enter through the
truncated-IS weight (algorithm.tis_cap) or the off-policy mask; `row_weights` carries PER's importance
weights, which scale those rows' advantages. The buffer (scalerl/replay/) is each rank's own and is
saved inside every checkpoint (`replay_rank<R>/`), so a resume draws what the stopped run would have.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scalerl.replay.buffer import ReplayBuffer
from scalerl.replay.group import ReplayGroup
from scalerl.types import Rollout, ScoredBatch


def batch_groups(batch: ScoredBatch, group_size: int) -> list[ReplayGroup]:
    """The batch's prompt groups as replay items (prompts unpadded, completions as sampled)."""
    r = batch.rollout
    groups = []
    for start in range(0, len(batch), group_size):
        rows = slice(start, start + group_size)
        groups.append(ReplayGroup(
            prompt_ids=r.prompt_ids[start][r.prompt_mask[start].bool()].cpu(), completion_ids=r.completion_ids[rows].cpu(),
            completion_mask=r.completion_mask[rows].cpu(), sampler_logprobs=r.sampler_logprobs[rows].float().cpu(),
            truncated=r.truncated[rows].cpu(), rewards=batch.rewards[rows].float().cpu(),
            task_rewards=batch.task_rewards[rows].float().cpu(), policy_version=batch.policy_version,
            prompt=batch.prompts[start]))
    return groups


def _rows(groups: list[ReplayGroup], pad_id: int, device: torch.device) -> Rollout:
    """Groups as Rollout rows: prompts left-padded, completions right-padded to the widest."""
    P = max(len(g.prompt_ids) for g in groups)
    T = max(g.completion_ids.shape[1] for g in groups)
    parts = []
    for i, g in enumerate(groups):
        G, t, p = g.completion_ids.shape[0], g.completion_ids.shape[1], len(g.prompt_ids)
        prompt = torch.full((G, P), pad_id, dtype=torch.long)
        prompt[:, P - p:] = g.prompt_ids
        prompt_mask = torch.zeros((G, P), dtype=torch.long)
        prompt_mask[:, P - p:] = 1
        pad = (0, T - t)
        parts.append(Rollout(prompt_ids=prompt, prompt_mask=prompt_mask,
                             completion_ids=torch.nn.functional.pad(g.completion_ids, pad, value=pad_id),
                             completion_mask=torch.nn.functional.pad(g.completion_mask, pad),
                             sampler_logprobs=torch.nn.functional.pad(g.sampler_logprobs, pad), truncated=g.truncated,
                             group_ids=torch.full((G,), i, dtype=torch.long)))
    return concat(parts, pad_id, device)


def concat(parts: list[Rollout], pad_id: int, device: torch.device) -> Rollout:
    """Rollouts one after the other, re-padded to a common width (single-turn rows only)."""
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def left(x, value):
        return torch.nn.functional.pad(x.cpu(), (P - x.shape[1], 0), value=value)

    def right(x, value):
        return torch.nn.functional.pad(x.cpu(), (0, T - x.shape[1]), value=value)

    offsets, ids = 0, []
    for r in parts:
        ids.append(r.group_ids.cpu() + offsets)
        offsets += int(r.group_ids.max()) + 1 if len(r) else 0
    out = Rollout(prompt_ids=torch.cat([left(r.prompt_ids, pad_id) for r in parts]),
                  prompt_mask=torch.cat([left(r.prompt_mask, 0) for r in parts]),
                  completion_ids=torch.cat([right(r.completion_ids, pad_id) for r in parts]),
                  completion_mask=torch.cat([right(r.completion_mask, 0) for r in parts]),
                  sampler_logprobs=torch.cat([right(r.sampler_logprobs.float(), 0.0) for r in parts]),
                  truncated=torch.cat([r.truncated.cpu() for r in parts]), group_ids=torch.cat(ids))
    return Rollout(**{k: v.to(device) for k, v in vars(out).items()})


class ReplayMixer:
    def __init__(self, buffer: ReplayBuffer, groups_per_step: int, group_size: int, pad_id: int):
        self.buffer, self.k, self.group_size, self.pad_id = buffer, groups_per_step, group_size, pad_id

    def mix(self, batch: ScoredBatch) -> ScoredBatch:
        """The batch with up to k of its groups replaced by replayed ones (see the module docstring)."""
        fresh = batch_groups(batch, self.group_size)
        spread = [float(g.rewards.std()) if len(g.rewards) > 1 else 0.0 for g in fresh]
        k = min(self.k, len(fresh)) if len(self.buffer) else 0
        metrics = {"replay/size": float(len(self.buffer)), "replay/groups": float(k)}
        if k == 0:
            self.buffer.add(fresh, spread)
            return _with_metrics(batch, metrics, torch.ones(len(batch)))
        drawn = self.buffer.sample(k)
        self.buffer.add(fresh, spread)
        displaced = sorted(sorted(range(len(fresh)), key=lambda i: (spread[i], -i))[:k])
        kept = [i for i in range(len(fresh)) if i not in displaced]
        G, device = self.group_size, batch.rollout.completion_ids.device
        rows = torch.tensor([i * G + j for i in kept for j in range(G)], dtype=torch.long)
        mixed = concat([batch.rollout.select(rows.to(device)), _rows(drawn.groups, self.pad_id, device)], self.pad_id, device)
        weights = torch.cat([torch.ones(len(rows)), torch.tensor(drawn.weights, dtype=torch.float32).repeat_interleave(G)])
        versions = [batch.policy_version, *(g.policy_version for g in drawn.groups)]
        metrics.update({"replay/displaced_groups": float(k), "replay/weight_mean": float(drawn.weights.mean()),
                        "replay/staleness_mean": float(sum(batch.policy_version - v for v in versions[1:]) / k)})
        pick = rows.tolist()
        return ScoredBatch(
            rollout=mixed, rewards=torch.cat([batch.rewards[rows.to(batch.rewards.device)].cpu(), *(g.rewards for g in drawn.groups)]).to(
                batch.rewards.device),
            task_rewards=torch.cat([batch.task_rewards[rows.to(batch.rewards.device)].cpu(), *(g.task_rewards for g in drawn.groups)]).to(
                batch.rewards.device),
            policy_version=min(versions), prompts=[batch.prompts[i] for i in pick] + [g.prompt for g in drawn.groups for _ in range(G)],
            completions=[batch.completions[i] for i in pick] + [""] * (k * G), generated_tokens=batch.generated_tokens,
            metrics={**batch.metrics, **metrics}, row_weights=weights)

    def save(self, checkpoint: Path, rank: int) -> None:
        self.buffer.save(checkpoint / f"replay_rank{rank}")

    def load(self, checkpoint: Path, rank: int) -> None:
        folder = checkpoint / f"replay_rank{rank}"
        if folder.is_dir():  # a rank the saving run did not have starts empty
            self.buffer = ReplayBuffer.load(folder)


def _with_metrics(batch: ScoredBatch, metrics: dict[str, float], weights: torch.Tensor) -> ScoredBatch:
    batch.metrics.update(metrics)
    batch.row_weights = weights
    return batch
