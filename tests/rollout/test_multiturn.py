"""Multi-turn episodes: masks, log-probs, gradients, the single-turn path, and the calculator end to end."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import run_cli, tiny_overrides
from scalerl.algorithms.advantages import gae
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.types import Task
from scalerl.envs.calculator import CalculatorEnv
from scalerl.envs.scoring import completions_of
from scalerl.errors import ScaleRLError
from scalerl.models.logprobs import completion_forward
from scalerl.models.paths import builtin_model_dir
from scalerl.jsonl import read_metrics
from scalerl.types import SamplingParams, ScoredBatch, derive_seed
from scalerl.rollout.hf import HFSampler
from scalerl.rollout.multiturn import sample_episodes
from scalerl.trainer import loop
from scalerl.learner.algorithm import outcome_token_rewards

TASKS = [Task("12*34=", "408"), Task("7*5=", "35"), Task("99*99=", "9801")]  # different lengths: left padding


class LengthEcho:
    """A deterministic multi-turn environment: answers every turn with `=<its length in characters> A:`."""

    def __init__(self):
        self.calls: list[tuple[str, ...]] = []

    def step(self, task: Task, transcript):
        self.calls.append(tuple(transcript))
        return f"={len(transcript[-1])} A:"

    def score(self, task, completion):
        return 0.0


class EchoCalculator(CalculatorEnv):
    """The calculator's tasks and reward, with LengthEcho's observations."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    step = LengthEcho.step


def _setup():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    return tokenizer, model, HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))


def _reference_episode(sampler, tokenizer, prompt: str, max_new_tokens: int, max_turns: int) -> tuple[list[int], list[int]]:
    """(tokens, trained) of one greedy LengthEcho episode, built turn by turn with single-row calls."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    tokens, trained = [], []
    for k in range(1, max_turns + 1):
        turn = sampler.sample([prompt_ids + tokens], SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
        n = int(turn.completion_mask.sum())
        ids = turn.completion_ids[0, :n].tolist()
        tokens, trained = tokens + ids, trained + [1] * n
        if bool(turn.truncated[0]) or k == max_turns:
            break
        text = tokenizer.decode(ids[:-1], skip_special_tokens=False)
        obs = tokenizer(f"={len(text)} A:", add_special_tokens=False)["input_ids"]
        tokens, trained = tokens + obs, trained + [0] * len(obs)
    return tokens, trained


@pytest.mark.parametrize("max_new_tokens", [6, 2])  # 2: every first turn is cut off, which ends the episode
def test_mask_is_one_exactly_on_policy_tokens(max_new_tokens):
    tokenizer, _, sampler = _setup()
    env = LengthEcho()
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    batch, completions = sample_episodes(sampler, env, TASKS, tokenizer, params, None, max_turns=3)
    T = batch.completion_ids.shape[1]
    for b, task in enumerate(TASKS):
        tokens, trained = _reference_episode(sampler, tokenizer, task.prompt, max_new_tokens, 3)
        n = len(tokens)
        assert batch.completion_ids[b, :n].tolist() == tokens
        assert batch.completion_mask[b].tolist() == trained + [0] * (T - n)
        assert batch.completion_attention_mask[b].tolist() == [1] * n + [0] * (T - n)
        assert (batch.completion_ids[b, n:] == tokenizer.pad_token_id).all()
        turns = completions[b].turns
        if max_new_tokens == 2:
            assert trained == [1, 1] and bool(batch.truncated[b]) and len(turns) == 1
            continue
        # Hand-check the layout: turn₁ + EOS, then `=len(turn₁) A:` (0s), then turn₂ + EOS ...
        n1 = len(turns[0]) + 1
        obs = f"={len(turns[0])} A:"
        assert turns[1] == obs and trained[:n1] == [1] * n1 and trained[n1: n1 + len(obs)] == [0] * len(obs)
        assert tokenizer.decode(batch.completion_ids[b, n1: n1 + len(obs)]) == obs
        assert batch.completion_ids[b, n1 - 1] == tokenizer.eos_token_id
        assert len(turns) == 5 and not batch.truncated[b] and sum(trained) == sum(len(t) + 1 for t in turns[::2])
    assert len(env.calls) == (0 if max_new_tokens == 2 else 6)  # after turns 1 and 2, never after the last allowed one
    assert (batch.sampler_logprobs[batch.completion_mask == 0] == 0).all()
    # `completions_of` reads a multi-turn rollout the same way the episode loop decoded it.
    assert [(c.text, c.token_ids, c.finished) for c in completions_of(batch, tokenizer)] == \
        [(c.text, c.token_ids, c.finished) for c in completions]


def test_sampler_logprobs_equal_the_training_forward_on_policy_tokens():
    tokenizer, model, sampler = _setup()
    batch, _ = sample_episodes(sampler, LengthEcho(), TASKS, tokenizer, SamplingParams(max_new_tokens=6, n=4),
                               [0, 1, 2], max_turns=3)
    policy, observed = batch.completion_mask.bool(), (batch.completion_attention_mask - batch.completion_mask).bool()
    assert observed.any() and int(policy.sum()) > 3 * 12  # later turns exist
    with torch.no_grad():
        logprobs = completion_forward(model, batch).logprobs
        # Without the observations as context the later turns' log-probs are different numbers.
        blind = completion_forward(model, replace(batch, completion_attention_mask=torch.empty(0))).logprobs
    assert torch.allclose(logprobs[policy], batch.sampler_logprobs[policy], atol=1e-4)
    assert not torch.allclose(blind[policy], batch.sampler_logprobs[policy], atol=1e-2)


class AddFive:
    """Answers every turn with ` 5+`: the built-in model's next turns are then spread-out numbers (after
    LengthEcho's observation it almost surely ends the turn at once, so seeds would not show)."""

    observation = " 5+"

    def step(self, task: Task, transcript):
        return self.observation

    def score(self, task, completion):
        return 0.0


def _reference_sampled_episode(sampler, tokenizer, prompt: str, params, seed: int, j: int, max_turns: int) -> list[int]:
    """The tokens of AddFive episode j (the j-th completion) of one task, turn by turn: turn 1 is
    row j of the task's own call with `seed`, turn k ≥ 2 one row seeded derive_seed(seed, j, k)."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    turn, row, tokens = sampler.sample([prompt_ids], params, [seed]), j, []
    for k in range(1, max_turns + 1):
        n = int(turn.completion_mask[row].sum())
        tokens += turn.completion_ids[row, :n].tolist()
        if bool(turn.truncated[row]) or k == max_turns:
            return tokens
        tokens += tokenizer(AddFive.observation, add_special_tokens=False)["input_ids"]
        turn, row = sampler.sample([prompt_ids + tokens], replace(params, n=1), [derive_seed(seed, j, k + 1)]), 0
    return tokens


def test_later_turns_are_seeded_per_episode():
    """Every turn of an episode depends on its task's seed alone: the same episodes whether the task
    is sampled with others or alone, and exactly those of single-row calls with the derived seeds."""
    tokenizer, _, sampler = _setup()
    params, seeds = SamplingParams(max_new_tokens=6, temperature=1.0, n=3), [10, 20, 30]
    batch, completions = sample_episodes(sampler, AddFive(), TASKS, tokenizer, params, seeds, max_turns=3)
    later = [c.turns[2::2] for c in completions if len(c.turns) > 2]
    assert len(later) >= 6 and len(set(later)) >= 4  # later turns were sampled, and they differ
    alone, _ = sample_episodes(sampler, AddFive(), TASKS[1:2], tokenizer, params, seeds[1:2], max_turns=3)
    for b in range(len(batch)):
        i, j = divmod(b, params.n)
        tokens = _reference_sampled_episode(sampler, tokenizer, TASKS[i].prompt, params, seeds[i], j, 3)
        assert batch.completion_ids[b, :len(tokens)].tolist() == tokens and int(batch.completion_extent()[b].sum()) == len(tokens), b
        if i == 1:
            assert alone.completion_ids[j, :len(tokens)].tolist() == tokens


def test_loss_gradient_is_zero_on_logits_that_predict_observations(runs):
    config = load_config(overrides=tiny_overrides(runs, "grad", **{"env.name": "calculator", "rollout.max_turns": 3}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    params = SamplingParams(max_new_tokens=6, n=4)
    batch, completions = sample_episodes(rollout.sampler, LengthEcho(), TASKS, rollout.tokenizer, params, [1, 2, 3], max_turns=3)
    rewards = torch.arange(len(batch), dtype=torch.float32)  # distinct rewards: every advantage is non-zero
    scored = ScoredBatch(batch, rewards, rewards, policy_version=learner.version, prompts=[""] * len(batch),
                         completions=[c.text for c in completions], generated_tokens=int(batch.completion_mask.sum()))
    captured = {}

    def keep(_module, _inputs, logits):
        logits.retain_grad()
        captured["logits"] = logits  # (B, T+1, V), or (B, T, V) with the prompts shared: column t predicts completion token t

    handle = learner.policy.lm_head.register_forward_hook(keep)
    targets = learner.targets(scored, beta=0.0, need_old=False)
    tokens = float(batch.completion_mask.sum())
    learner.micro_step(batch, targets, slice(0, len(batch)), 0.0, tokens, tokens)
    handle.remove()
    grad = captured["logits"].grad[:, :batch.completion_ids.shape[1]].abs().sum(-1)  # (B, T)
    observed = (batch.completion_attention_mask - batch.completion_mask).bool()
    assert observed.any()
    assert (grad[observed] == 0).all() and (grad[batch.completion_attention_mask == 0] == 0).all()
    assert (grad[batch.completion_mask.bool()] > 0).all()


def test_single_turn_is_one_sampler_call_unchanged():
    tokenizer, _, sampler = _setup()
    ids = [tokenizer(task.prompt)["input_ids"] for task in TASKS]
    params = SamplingParams(max_new_tokens=6, n=4)
    plain = sampler.sample(ids, params, [5, 6, 7])
    env = LengthEcho()
    batch, completions = sample_episodes(sampler, env, TASKS, tokenizer, params, [5, 6, 7], max_turns=1)
    assert not env.calls and batch.completion_attention_mask.numel() == 0
    for name, value in vars(plain).items():
        assert torch.equal(value, getattr(batch, name)), name
    assert completions == completions_of(plain, tokenizer) and all(c.turns == () and c.final_turn == c.text for c in completions)
    # The training forward over a single-turn rollout attends exactly to prompt + completion mask, as before.
    assert torch.equal(batch.attention_mask(), torch.cat([batch.prompt_mask, batch.completion_mask], dim=1))
    with pytest.raises(ScaleRLError, match="rollout.max_turns"):
        sample_episodes(sampler, ArithmeticEnv(), TASKS, tokenizer, params, None, max_turns=2)


def test_gae_and_outcome_reward_skip_observation_gaps():
    """A row with an observation gap gives the same advantages as the row with the gap removed."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 9.0], [0.1, 0.2, 0.3, 0.4, 9.0, 9.0, 9.0]])
    rewards = outcome_token_rewards(torch.tensor([1.0, 1.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0, 0]]  # on the last trained token
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv[0, mask[0].bool()], adv[1, mask[1].bool()]) and (adv[0, 2:4] == 0).all()
    assert torch.allclose(ret[0, mask[0].bool()], ret[1, mask[1].bool()])
    # Hand value at the first token: δ = [0.9·0.2−0.1, 0.9·0.3−0.2, 0.9·0.4−0.3, 1−0.4], Â₀ = Σ (γλ)^k δ_k.
    deltas = [0.08, 0.07, 0.06, 0.6]
    assert adv[0, 0].item() == pytest.approx(sum(0.72 ** k * d for k, d in enumerate(deltas)), abs=1e-6)


@pytest.mark.parametrize("algorithm", [{}, {"algorithm.name": "ppo"}], ids=["grpo", "ppo"])
def test_train_step_runs_multi_turn_episodes(runs, algorithm):
    overrides = tiny_overrides(runs, "step", **{"env.name": "calculator", "rollout.max_turns": 2, **algorithm})
    config = load_config(overrides=overrides)
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    rollout.env = EchoCalculator()  # every turn gets an observation, so the step trains on real two-turn episodes
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    assert len(rollout.env.calls) > 0 and all(len(c) == 1 for c in rollout.env.calls)
    assert math.isfinite(metrics["loss"]) and 0 < metrics["response_len"] <= 2 * config.rollout.max_new_tokens


@pytest.mark.slow
def test_calculator_trains_end_to_end_through_the_cli(runs):
    overrides = tiny_overrides(runs, "calc", **{"env.name": "calculator", "rollout.max_turns": 2, "train.steps": 3,
                                                 "eval.every": 0, "eval.max_tasks": 8})
    args = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    proc = run_cli("-m", "scalerl.cli.main", "train", *args)
    assert proc.returncode == 0, proc.stderr
    rows = read_metrics(runs / "calc")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in rows)
    summary = json.loads((runs / "calc" / "summary.json").read_text())
    assert summary["steps"] == 3 and 0.0 <= summary["pass_rate_after"] <= 1.0
