"""`scalerl eval MODEL`: the held-out pass rate (mean@k) of a model or run on an environment, with its interval.

MODEL is a model folder, 'builtin', a run folder (its newest intact checkpoint, under the run's own
config.yaml: environment, prompt format, sampling and eval settings) or one checkpoint folder. Each of
the environment's held-out tasks (at most --max-tasks) gets k completions (greedy with k = 1 by
default, else sampled at temperature 1.0, seeds derived from (seed, task)), scored by the
environment's verifier on correctness only (no reward shaping); a task's score is the mean of its
k verdicts, and the pass rate is the mean over tasks. The 95 % interval is Wilson's score interval
when every score is one 0/1 verdict, else the normal approximation over the tasks. One process, on
the CPU. An environment without a verifier (reward_model) is scored with the run's own reward (its
functions or models, fused with its weights) when MODEL is a run whose reward had one; else refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scalerl.errors import ScaleRLError


def run_eval(model: str, env_name: str | None, samples: int, temperature: float | None, max_tasks: int | None,
             max_new_tokens: int | None, seed: int) -> dict:
    """The pass rate, its interval and what it was measured on (one process)."""
    import torch

    from scalerl.config import Config, load_config
    from scalerl.envs.registry import build_env
    from scalerl.jobs.export import resolve_checkpoint
    from scalerl.models.loading import load_model, load_tokenizer
    from scalerl.rewards.scorer import build_reward_scorer
    from scalerl.rewards.sources import env_has_verifier
    from scalerl.rollout.chat import prompt_format
    from scalerl.rollout.evaluation import confidence_interval, task_scores
    from scalerl.rollout.hf import HFSampler
    from scalerl.trainer.checkpoint import MARKER
    from scalerl.types import SamplingParams, derive_seed

    path = Path(model)
    run_config: Config | None = None
    if path.is_dir() and ((path / "checkpoints").is_dir() or (path / MARKER).is_file()):
        run_folder = path if (path / "checkpoints").is_dir() else path.parent.parent
        if (run_folder / "config.yaml").is_file():
            run_config = load_config(run_folder / "config.yaml")
        model = str(resolve_checkpoint(path, warn=lambda line: print(line, file=sys.stderr)))
    base = run_config or load_config()
    name = env_name or base.env.name
    args = base.env.args if name == base.env.name else {}
    config = load_config(overrides=[f"model.path={model}", f"env.name={name}"])
    reward = run_config.reward if run_config is not None and name == run_config.env.name else None
    if not env_has_verifier(name) and (reward is None or not (reward.components or reward.model)):
        raise ScaleRLError(f"--env {name} has no verifier and no run's reward to score with: pass a run folder whose reward "
                           "was a model or function, or an environment that checks answers")
    temp = temperature if temperature is not None else (0.0 if samples == 1 else 1.0)
    if samples > 1 and temp == 0:
        raise ScaleRLError("--samples > 1 needs --temperature > 0: greedy decoding gives the same completion every time")
    environment = build_env(name, args)
    tasks = environment.eval_tasks()[:max_tasks]
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config.model, torch.device("cpu")).eval()
    prompts = prompt_format(base.env.chat_template, base.env.system_prompt, tokenizer)  # the run's, else the defaults
    sampler = HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=prompts.stop_ids(), device=torch.device("cpu"))
    params = SamplingParams(max_new_tokens=max_new_tokens or base.rollout.max_new_tokens, temperature=temp, n=samples,
                            top_p=base.rollout.top_p, top_k=base.rollout.top_k)
    seeds = [derive_seed(seed, "eval", i) for i in range(len(tasks))] if temp > 0 else None
    # an environment without a verifier: the run's own reward (its functions or models, fused with its weights)
    scorer = None if env_has_verifier(name) else build_reward_scorer(reward, group_size=samples, device="cpu")
    try:
        sums = task_scores(environment, tasks, sampler, tokenizer, params, seeds, batch_size=base.eval.batch_size,
                           max_turns=base.rollout.max_turns, encode=prompts, scorer=scorer)
    finally:
        if scorer is not None:
            scorer.close()
    means = sums / samples
    # a verifier's 0/1 verdicts: Wilson's interval; a reward's scores are not a proportion even when all happen to be 0 or 1
    binary = scorer is None and samples == 1 and bool(((means == 0) | (means == 1)).all())
    low, high = confidence_interval(means, binary)
    return {"pass_rate": float(means.mean()) if len(means) else 0.0, "ci95": [low, high], "interval": "wilson" if binary else "normal",
            "tasks": len(tasks), "samples": samples, "temperature": temp, "env": name, "model": model, "seed": seed,
            "max_new_tokens": params.max_new_tokens,
            "scored_by": "verifier" if scorer is None else "the run's reward: " + ", ".join(scorer.names)}
