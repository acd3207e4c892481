"""The held-out pass rate: greedy, or mean@k over sampled completions."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.envs.scoring import completions_of
from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir
from scalerl.jsonl import read_metrics
from scalerl.rollout.hf import HFSampler
from scalerl.types import SamplingParams, derive_seed
from scalerl.trainer import loop
from scalerl.rollout.evaluation import pass_rate


def _setup():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    return ArithmeticEnv(), sampler, tokenizer


def test_mean_at_k_is_the_mean_over_every_sampled_completion():
    env, sampler, tokenizer = _setup()
    tasks = env.eval_tasks()[:12]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=4)
    seeds = [derive_seed(0, "eval", 3, i) for i in range(len(tasks))]
    rate = pass_rate(env, tasks, sampler, tokenizer, params, seeds, batch_size=5, ctx=DistContext())
    # by hand: each task sampled alone with its own seed (its draws do not depend on the batch), scored one by one
    correct = []
    for task, seed in zip(tasks, seeds):
        batch = sampler.sample([tokenizer(task.prompt)["input_ids"]], params, [seed])
        correct += [env.score(task, c) for c in completions_of(batch, tokenizer)]
    assert len(correct) == 48
    assert rate == pytest.approx(sum(correct) / 48)
    assert 0 < rate < 1  # the built-in model is right on some sums, not all: the draws differ
    greedy = pass_rate(env, tasks, sampler, tokenizer, SamplingParams(max_new_tokens=8, temperature=0.0), batch_size=5,
                       ctx=DistContext())
    assert greedy * 12 == pytest.approx(round(greedy * 12))  # one completion per task
    with pytest.raises(ValueError, match="`seeds` has 11 seeds for 12 tasks"):
        pass_rate(env, tasks, sampler, tokenizer, params, seeds[:-1], batch_size=5, ctx=DistContext())


@dataclass
class OneRankOf:
    """Rank `rank` of `world_size` without a process group: `sum` keeps this rank's part for the test to add."""

    rank: int
    world_size: int
    parts: list = field(default_factory=list)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        self.parts.append(values.clone())
        return values


@pytest.mark.parametrize("world_size", [2, 3])
def test_sampled_pass_rate_is_the_same_at_any_world_size_and_batch_size(world_size):
    """Each rank takes tasks[rank::world] with their own seeds: the sums over ranks are world size 1's."""
    env, sampler, tokenizer = _setup()
    tasks = env.eval_tasks()[:10]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3)
    seeds = [derive_seed(0, "eval", 5, i) for i in range(len(tasks))]
    single = pass_rate(env, tasks, sampler, tokenizer, params, seeds, batch_size=4, ctx=DistContext())
    ranks = [OneRankOf(r, world_size) for r in range(world_size)]
    for ctx in ranks:
        pass_rate(env, tasks, sampler, tokenizer, params, seeds, batch_size=3, ctx=ctx)
    correct, count = sum(ctx.parts[0] for ctx in ranks).tolist()
    assert count == 30 and 0 < single < 1
    assert correct / count == pytest.approx(single)


def test_sampled_evaluation_is_reproducible_and_leaves_training_untouched(runs):
    """Evaluations draw from their own seeded generator: two runs give the same pass rates, and the
    training metrics are those of a run that evaluates greedily."""
    sampled = {"eval.temperature": 1.0, "eval.samples": 4, "eval.every": 2, "train.steps": 4}
    rows = []
    for name, extra in [("a", sampled), ("b", sampled), ("greedy", {"eval.every": 2, "train.steps": 4})]:
        loop.train(load_config(overrides=tiny_overrides(runs, name, **extra)))
        rows.append(read_metrics(runs / name))
    passes = [[r["eval/pass_rate"] for r in run if "eval/pass_rate" in r] for run in rows]
    assert passes[0] == passes[1] and len(passes[0]) == 2
    assert all(round(p * 64) == pytest.approx(p * 64) for p in passes[0])  # 16 tasks x 4 completions
    train_keys = ("reward_mean", "loss", "grad_norm", "entropy")
    assert [[r[k] for k in train_keys] for r in rows[0]] == [[r[k] for k in train_keys] for r in rows[2]]


def test_several_greedy_samples_are_refused():
    with pytest.raises(ScaleRLError, match=r"eval.samples=4 with eval.temperature=0"):
        load_config(overrides={"eval.samples": 4})
