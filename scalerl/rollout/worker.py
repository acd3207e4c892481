"""The rollout side of training: prompts → sampler → environment and rewards → one `ScoredBatch`.

It owns the prompt stream, the sampler, the environment and the reward pipeline, and knows the
policy version its sampler holds. It never sees the learner: the loop hands it weights and a
version (`sync_weights`) and takes its batches (`produce`) and pass rates (`evaluate`): the
`RolloutSide` interface of scalerl/rollout/base.py. Today both roles live in one process;
an asynchronous producer or a vLLM engine replaces this side without the learner noticing.

Randomness is per request: prompt i of step s on rank r samples with
`derive_seed(train.seed, "train", s, r·prompts + i)`, so a resumed run needs no generator state
and draws exactly what the uninterrupted run drew.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from scalerl.distributed.context import DistContext
from scalerl.rewards.pipeline import RewardPipeline
from scalerl.rewards.scorer import RewardScorer
from scalerl.rollout.base import Sampler
from scalerl.rollout.chat import PromptFormat
from scalerl.rollout.evaluation import pass_rate
from scalerl.rollout.multiturn import sample_episodes
from scalerl.rollout.openai_server import OpenAIEndpoint
from scalerl.rollout.replay_mix import ReplayMixer
from scalerl.rollout.teacher import TeacherScorer
from scalerl.rollout.prompts import PromptStream
from scalerl.types import Rollout, SamplingParams, ScoredBatch, Task, derive_seed


@dataclass(frozen=True)
class EvalSettings:
    """How the held-out pass rate is measured (`eval.*`): greedy, or mean@samples at a temperature, with
    per-task seeds (train.seed, step, task) of its own, so it is reproducible, the same at any world
    size, and leaves the training's draws untouched."""

    params: SamplingParams
    max_tasks: int
    batch_size: int
    scorer: RewardScorer | None = None  # an environment without a verifier: the mean fused reward


@dataclass(frozen=True)
class BatchFilters:
    """The rollout side's data filters (ScaleRL recipe, Khatri et al. 2025 §3)."""

    zero_variance: bool = False  # mask out groups whose rewards are all equal: they carry no signal
    retire_pass_rate: float | None = None  # no-positive-resampling: a prompt whose group pass rate reaches this leaves the pool


class RolloutWorker:
    def __init__(self, *, sampler: Sampler, env, tokenizer, stream: PromptStream, rewards: RewardPipeline,
                 params: SamplingParams, filters: BatchFilters, seed: int, max_turns: int, ctx: DistContext,
                 shares_weights: bool, encode: Callable[[Task], list[int]] | None = None, replay: ReplayMixer | None = None,
                 evaluation: EvalSettings | None = None, teacher: TeacherScorer | None = None):
        self.sampler, self.env, self.tokenizer, self.stream, self.rewards = sampler, env, tokenizer, stream, rewards
        self.params, self.filters, self.seed, self.max_turns, self.ctx = params, filters, seed, max_turns, ctx
        self.shares_weights = shares_weights  # the sampler runs the learner's own modules: syncing is only a version
        self.encode = encode  # a task's prompt tokens; a PromptFormat (scalerl/rollout/chat.py) also renders later turns
                              # through its chat template; None: raw
        self.last_batch: ScoredBatch | None = None  # for the health monitor's collapse dump
        self.replay = replay  # older groups mixed into each batch (scalerl/rollout/replay_mix.py); None: no replay
        self.teacher = teacher  # on-policy distillation's teacher served here (distill_teacher_placement=rollout); None: not here
        self.evaluation = evaluation or EvalSettings(SamplingParams(max_new_tokens=params.max_new_tokens, temperature=0.0),
                                                     max_tasks=2**31, batch_size=64)

    @property
    def cuts_prompts(self) -> bool:
        """Whether the prompt encoding cuts prompts that do not fit (rollout.truncate_prompts left or right)."""
        return isinstance(self.encode, PromptFormat) and self.encode.max_tokens is not None and self.encode.truncate != "error"

    @property
    def version(self) -> int:
        return self.sampler.version

    def seeds(self, step: int) -> list[int]:
        first = self.ctx.rank * self.stream.per_rank
        return [derive_seed(self.seed, "train", step, first + i) for i in range(self.stream.per_rank)]

    def produce(self, step: int) -> ScoredBatch:
        """Sample, score and filter one step's batch (and, serving the distillation teacher, its log-probs)."""
        tasks = self.stream.next_batch()
        cut_before = self.encode.cut[0] if self.cuts_prompts else 0
        clock = getattr(self.sampler, "decode_clock", None)  # the HF engine's (rollout/hf.py), for `scalerl plan`
        if clock is not None:
            clock.reset()
        rollout, completions = sample_episodes(self.sampler, self.env, tasks, self.tokenizer, self.params, self.seeds(step),
                                               max_turns=self.max_turns, encode=self.encode)
        generated = int(rollout.completion_mask.sum())  # before any filtering
        rewards, task_rewards, metrics = self.rewards(step, tasks, rollout, completions)
        if clock is not None and clock.slope() is not None:
            metrics["time/decode_s_per_position"] = clock.slope()  # a decode step's growth per cached position
        if self.cuts_prompts:  # the prompts of this step's batch (all ranks) cut to fit (rollout.truncate_prompts)
            metrics["prompts_truncated"] = float(self.ctx.sum(torch.tensor([float(self.encode.cut[0] - cut_before)])).item())
        metrics.update(self.filter(tasks, rollout, rewards))
        group_ids = rollout.group_ids.tolist()
        batch = ScoredBatch(rollout, rewards, task_rewards, policy_version=self.version,
                            prompts=[tasks[g].prompt for g in group_ids], completions=[c.text for c in completions],
                            generated_tokens=generated, metrics=metrics)
        if self.replay is not None:
            batch = self.replay.mix(batch)
        if self.teacher is not None:  # after the mix: replayed rows get the (frozen) teacher's log-probs too
            batch.rollout.teacher_logprobs = self.teacher(batch.rollout)
        self.last_batch = batch
        return batch

    def filter(self, tasks: list[Task], rollout: Rollout, rewards: torch.Tensor) -> dict[str, float]:
        """Zero-variance filtering (mask out groups whose rewards are all equal) and no-positive-
        resampling (retire prompts whose group pass rate reached the threshold). Masking instead of
        dropping keeps every rank's batch the same shape, so collectives stay in step."""
        G = self.params.n
        grouped = rewards.view(-1, G)  # (P, G)
        metrics: dict[str, float] = {}
        if self.filters.zero_variance:
            flat = (grouped == grouped[:, :1]).all(dim=1)  # (P,)
            keep = (~flat).repeat_interleave(G).unsqueeze(1).to(rollout.completion_mask.dtype)  # (B, 1)
            rollout.completion_mask = rollout.completion_mask * keep
            flat_groups, groups = self.ctx.sum(torch.tensor([float(flat.sum()), float(len(flat))])).tolist()
            metrics["zero_variance_frac"] = flat_groups / groups
        if self.filters.retire_pass_rate is not None:
            done = [tasks[g].prompt for g in range(len(tasks)) if grouped[g].mean().item() >= self.filters.retire_pass_rate]
            self.stream.retire(self.ctx.gather_lists(done))
            metrics["retired_prompts"] = float(len(self.stream.retired))
        return metrics

    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        """Sample with these weights (None: the shared modules already are) as policy `version` from now on."""
        self.sampler.sync_weights(weights, version)

    def evaluate(self, step: int) -> float:
        ev = self.evaluation
        tasks = self.env.eval_tasks()[: ev.max_tasks]
        seeds = [derive_seed(self.seed, "eval", step, i) for i in range(len(tasks))] if ev.params.temperature > 0 else None
        self.last_eval_samples: list[dict] = []  # a few of this evaluation's completions, for a reader (trainer/bookkeeping.py)
        return pass_rate(self.env, tasks, self.sampler, self.tokenizer, ev.params, seeds, ctx=self.ctx, batch_size=ev.batch_size,
                         max_turns=self.max_turns, scorer=ev.scorer, encode=self.encode, samples=self.last_eval_samples)

    def save_files(self, folder: Path, rank: int) -> None:
        if self.replay is not None:
            self.replay.save(folder, rank)

    def load_files(self, folder: Path, rank: int) -> None:
        if self.replay is not None:
            self.replay.load(folder, rank)

    def state_dict(self) -> dict:
        return {"data": self.stream.state_dict(), "rewards": self.rewards.state_dict(), "policy_version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["data"])
        self.rewards.load_state_dict(state.get("rewards", {}))
        self.sampler.sync_weights(None, state.get("policy_version", 0))

    def close(self) -> None:
        self.rewards.close()
        if isinstance(self.sampler, OpenAIEndpoint):  # an agent environment's endpoint (scalerl/rollout/build.py)
            self.sampler.close()
