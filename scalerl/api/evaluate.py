"""`Trainer.evaluate()`: a model's held-out score, measured as the training job measures it (`eval.*`, the run's
environment, prompt format and reward components), in this process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from scalerl.config import Config, with_overrides
from scalerl.envs.registry import build_env
from scalerl.models.loading import load_model, load_tokenizer
from scalerl.rewards.scorer import build_reward_scorer
from scalerl.rollout.build import eval_settings
from scalerl.rollout.chat import prompt_format
from scalerl.rollout.evaluation import task_scores
from scalerl.rollout.hf import HFSampler
from scalerl.types import derive_seed


def held_out_score(config: Config, checkpoint: Path | None, reward_funcs: Mapping[str, Callable], max_tasks: int | None) -> float:
    """The mean score over the held-out tasks' completions of `checkpoint` (None: the config's model): the pass rate
    for an environment with a verifier, else the reward components' weighted reward (configured weights)."""
    if checkpoint is not None:  # a checkpoint folder holds the policy and its tokenizer
        config = with_overrides(config, {"model.path": str(checkpoint), "model.tokenizer": None})
    device = torch.device("cuda" if torch.cuda.is_available() and config.train.device != "cpu" else "cpu")
    env = build_env(config.env.name, config.env.args)
    tasks = list(env.eval_tasks())[:max_tasks]
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config.model, device).eval()
    encode = prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer)
    sampler = HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=encode.stop_ids() or tokenizer.eos_token_id, device=device)
    scorer = build_reward_scorer(config.reward, group_size=1, device=device, functions=reward_funcs)
    settings = eval_settings(config, scorer)
    params = settings.params
    seeds = [derive_seed(config.train.seed, "eval", i) for i in range(len(tasks))] if params.temperature > 0 else None
    try:
        sums = task_scores(env, tasks, sampler, tokenizer, params, seeds, batch_size=settings.batch_size,
                           max_turns=config.rollout.max_turns, scorer=settings.scorer, encode=encode)
    finally:
        if scorer is not None:
            scorer.close()
    return float(sums.sum() / max(1, len(tasks) * params.n))
