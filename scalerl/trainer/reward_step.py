"""A step's reward, in order: the function components' calls start in their own processes, the
environment's score is computed meanwhile (in `reward.num_workers` processes), then the reward
components are collected and fused (`t.scorer`) → the dynamic cap → the diversity penalty → a sample dump
every `reward.dump_every` steps. Each piece is off unless configured; with none configured the
reward is exactly the environment's score.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scalerl.config import Config
from scalerl.rewards.cap import RewardCap
from scalerl.rewards.components import RewardInputs
from scalerl.rewards.diversity import (
    SentenceEmbedder,
    diversity_penalty,
    policy_embeddings,
)
from scalerl.rewards.dump import dump_due, dump_samples
from scalerl.rewards.workers import RewardPool
from scalerl.rollout.base import Rollout

if TYPE_CHECKING:
    from scalerl.trainer.step import Trainer


@dataclass
class RewardDefences:
    """What the reward path needs besides the scorer, built once from `config.reward`."""

    pool: RewardPool  # the environment's score, in worker processes when reward.num_workers >= 2
    cap: RewardCap | None
    embedder: SentenceEmbedder | None  # None with a diversity penalty means the policy's own hidden states

    def state_dict(self) -> dict:
        return {"cap": self.cap.state_dict()} if self.cap is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.cap is not None and "cap" in state:
            self.cap.load_state_dict(state["cap"])

    def close(self) -> None:
        self.pool.close()


def build_reward_defences(config: Config, env, device: torch.device) -> RewardDefences:
    rc = config.reward
    pool = RewardPool(rc.num_workers, {"env": env.score})
    pool.start()
    cap = RewardCap(quantile=rc.cap.quantile, window=rc.cap.window, warmup_steps=rc.cap.warmup_steps) if rc.cap.enabled else None
    embedder = (SentenceEmbedder(rc.diversity.embedder, device, batch_size=rc.diversity.batch_size)
                if rc.diversity.weight > 0 and rc.diversity.embedder != "policy" else None)
    return RewardDefences(pool, cap, embedder)


def score_batch(t: Trainer, step: int, tasks: list, batch: Rollout, completions: list) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(rewards (B,), the environment's own scores (B,), reward metrics) for the step's batch."""
    rc, d = t.config.reward, t.defences
    group_ids = batch.group_ids.tolist()
    inputs = RewardInputs.of(tasks, group_ids, completions)
    if t.scorer is not None:
        t.scorer.submit(inputs)  # function components start in their own processes ...
    env_scores = d.pool.map_scores("env", [(tasks[g], c) for g, c in zip(group_ids, completions)])  # ... while the env scores
    task_rewards = torch.tensor(env_scores, dtype=torch.float32)  # (B,)
    metrics: dict = dict(d.pool.pop_metrics())
    if t.scorer is None:
        fused = task_rewards
    else:
        fused, scorer_metrics = t.scorer.score(dataclasses.replace(inputs, env_scores=task_rewards), t.ctx)
        fused = fused.float().cpu()
        metrics.update(scorer_metrics)
    rewards = fused
    if d.cap is not None:  # every rank keeps the same window: the quantile is over the whole step
        every_rank = torch.tensor(t.ctx.gather_lists(fused.tolist()), dtype=torch.float32)
        rewards, cap_metrics = d.cap(rewards, step_rewards=every_rank)
        metrics.update(cap_metrics)
    similarity = None
    if rc.diversity.weight > 0:
        with t.autocast():
            embeddings = (policy_embeddings(t.policy, batch, micro_batch_size=rc.diversity.batch_size) if d.embedder is None
                          else d.embedder([c.text for c in completions]))
        rewards, similarity = diversity_penalty(rewards, embeddings.float().cpu(), batch.group_ids.cpu(), weight=rc.diversity.weight)
        metrics["diversity_similarity"] = similarity.mean().item()
    if t.ctx.is_main and dump_due(step, rc.dump_every):
        components = t.scorer.last_scores if t.scorer is not None else {"env": task_rewards}
        dump_samples(t.run_dir, step, [tasks[g].prompt for g in group_ids], [c.text for c in completions],
                     group_ids=group_ids, finished=[c.finished for c in completions], components=components,
                     fused=fused, rewards=rewards, extra={"diversity_similarity": similarity} if similarity is not None else None)
    return rewards.to(t.ctx.device), task_rewards.to(t.ctx.device), metrics
