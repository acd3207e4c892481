"""A step's reward, in order: the function components' calls start in their own processes, the
environment's score is computed meanwhile (in `reward.num_workers` processes), then the reward
components are collected and fused (`scorer`) → the dynamic cap → the diversity penalty → a sample
dump every `reward.dump_every` steps. Each piece is off unless configured; with none configured the
reward is exactly the environment's score. This is the rollout side's scoring (scalerl/rollout/worker.py).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch

from scalerl.config import RewardConfig
from scalerl.distributed.context import DistContext
from scalerl.rewards.cap import RewardCap
from scalerl.rewards.components import RewardInputs
from scalerl.rewards.diversity import SentenceEmbedder, diversity_penalty, policy_embeddings
from scalerl.rewards.dump import dump_due, dump_samples
from scalerl.rewards.failures import FailureWatch
from scalerl.rewards.scorer import RewardScorer
from scalerl.rewards.workers import RewardPool
from scalerl.types import Completion, Rollout, Task

log = logging.getLogger(__name__)

Embed = Callable[[Rollout, list[Completion]], torch.Tensor]  # (B, H) one embedding per completion


@dataclass
class RewardPipeline:
    """Everything that turns a step's completions into rewards, built once from `config.reward`."""

    config: RewardConfig
    scorer: RewardScorer | None  # reward.components (or reward.model alone); None: the environment's reward
    pool: RewardPool  # the environment's score, in worker processes when reward.num_workers >= 2
    cap: RewardCap | None
    embed: Embed | None  # diversity penalty's embeddings; None: no penalty
    ctx: DistContext
    run_dir: Path
    env_name: str = "env"
    watch: FailureWatch = field(init=False)
    env_failure: dict[str, str] = field(default_factory=dict)  # {"env": its first failure in words}, once it failed

    def __post_init__(self) -> None:
        self.watch = FailureWatch(self.config)

    def _checked_env_scores(self, scores: torch.Tensor, tasks: list[Task], group_ids: list[int]) -> tuple[torch.Tensor, float]:
        """The environment's scores with NaN, ±inf and non-numbers (NaN from the pool) replaced by 0, and how many
        there were; the first is named once (a warning) and kept for the stop line of `FailureWatch`."""
        bad = ~torch.isfinite(scores)  # (B,)
        if not bad.any():
            return scores, 0.0
        i = int(bad.nonzero()[0])
        if not self.env_failure:
            what = (f"{self.env_name}.score returned {scores[i].item()} (NaN, inf or not a number) for item {i} "
                    f"(prompt {tasks[group_ids[i]].prompt[:60]!r})")
            self.env_failure["env"] = what
            log.warning("%s; such items get reward 0 and count in reward/env_failures", what)
        return torch.where(bad, torch.zeros_like(scores), scores), float(bad.sum())

    def __call__(self, step: int, tasks: list[Task], batch: Rollout, completions: list[Completion]
                 ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(rewards (B,), the environment's own scores (B,), reward metrics) for the step's batch."""
        rc, ctx = self.config, self.ctx
        group_ids = batch.group_ids.tolist()
        inputs = RewardInputs.of(tasks, group_ids, completions)
        if self.scorer is not None:
            self.scorer.submit(inputs)  # function components start in their own processes ...
        env_scores = self.pool.map_scores("env", [(tasks[g], c) for g, c in zip(group_ids, completions)])  # ... while the env scores
        task_rewards, env_failed = self._checked_env_scores(torch.tensor(env_scores, dtype=torch.float32), tasks, group_ids)  # (B,)
        pool = self.pool.pop_metrics()
        # items the environment failed on, and the step's items, over every rank: every rank takes the same decision
        counts = ctx.sum(torch.tensor([env_failed + pool["reward_failed_items"], float(len(completions))], dtype=torch.float64))
        metrics: dict = {"reward/env_failures": float(counts[0]), "reward/env_restarts": pool["reward_pool_restarts"]}
        fused = task_rewards
        if self.scorer is not None:
            fused, scorer_metrics = self.scorer.score(dataclasses.replace(inputs, env_scores=task_rewards), ctx)
            fused = fused.float().cpu()
            metrics.update(scorer_metrics)
        failures = {name.removeprefix("reward/").removesuffix("_failures"): n for name, n in metrics.items()
                    if name.startswith("reward/") and name.endswith("_failures")}
        first = {**(self.scorer.first_failure if self.scorer is not None else {}), **self.env_failure}
        metrics["reward/failed_share"] = self.watch.check(step, failures, float(counts[1]), first)  # raises past reward.failures
        rewards = fused
        if self.cap is not None:  # every rank keeps the same window: the quantile is over the whole step
            every_rank = torch.tensor(ctx.gather_lists(fused.tolist()), dtype=torch.float32)
            rewards, cap_metrics = self.cap(rewards, step_rewards=every_rank)
            metrics.update(cap_metrics)
        similarity = None
        if self.embed is not None:
            embeddings = self.embed(batch, completions).float().cpu()
            rewards, similarity = diversity_penalty(rewards, embeddings, batch.group_ids.cpu(), weight=rc.diversity.weight)
            metrics["diversity_similarity"] = similarity.mean().item()
        if ctx.is_main and dump_due(step, rc.dump_every):
            components = self.scorer.last_scores if self.scorer is not None else {"env": task_rewards}
            dump_samples(self.run_dir, step, [tasks[g].prompt for g in group_ids], [c.text for c in completions],
                         group_ids=group_ids, finished=[c.finished for c in completions], components=components,
                         fused=fused, rewards=rewards, extra={"diversity_similarity": similarity} if similarity is not None else None)
        return rewards.to(ctx.device), task_rewards.to(ctx.device), metrics

    def state_dict(self) -> dict:
        state = {"cap": self.cap.state_dict()} if self.cap is not None else {}
        state["failures"] = self.watch.state_dict()
        if self.scorer is not None:  # dynamic fusion weights continue where they were
            state["scorer"] = self.scorer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.watch.load_state_dict(state.get("failures", {}))
        if self.cap is not None and "cap" in state:
            self.cap.load_state_dict(state["cap"])
        if self.scorer is not None and "scorer" in state:
            self.scorer.load_state_dict(state["scorer"])

    def close(self) -> None:
        self.pool.close()


def build_reward_pipeline(config: RewardConfig, env, *, group_size: int, policy: torch.nn.Module, autocast: Callable,
                          ctx: DistContext, run_dir: Path, functions: Mapping[str, Callable] | None = None,
                          deadline_s: float | None = None) -> RewardPipeline:
    """`policy` and `autocast` serve the diversity penalty's default embedder (the policy's own hidden states);
    `functions`: the Python API's reward callables (`function: python:NAME`); `deadline_s`: how long the pool of
    reward.num_workers may answer nothing (`health.hang.deadline_s`)."""
    from scalerl.rewards.scorer import build_reward_scorer

    scorer = build_reward_scorer(config, group_size=group_size, device=ctx.device, functions=functions)
    pool = RewardPool(config.num_workers, {"env": env.score}, deadline_s=deadline_s)
    pool.start()
    cap = RewardCap(quantile=config.cap.quantile, window=config.cap.window, warmup_steps=config.cap.warmup_steps) if config.cap.enabled else None
    embed: Embed | None = None
    if config.diversity.weight > 0 and config.diversity.embedder == "policy":
        embed = _policy_embedder(policy, autocast, config.diversity.batch_size)
    elif config.diversity.weight > 0:
        sentence = SentenceEmbedder(config.diversity.embedder, ctx.device, batch_size=config.diversity.batch_size)
        embed = lambda batch, completions: sentence([c.text for c in completions])  # noqa: E731
    return RewardPipeline(config, scorer, pool, cap, embed, ctx, run_dir, env_name=type(env).__name__)


def _policy_embedder(policy: torch.nn.Module, autocast: Callable, batch_size: int) -> Embed:
    """The policy's last hidden state mean-pooled over each completion, under the learner's precision."""
    def embed(batch: Rollout, completions: list[Completion]) -> torch.Tensor:
        with autocast():
            return policy_embeddings(policy, batch, micro_batch_size=batch_size)
    return embed
