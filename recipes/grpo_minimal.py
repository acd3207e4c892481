"""GRPO in one file: the ScaleRL job top to bottom, with the library's pure functions.

Read this first. It trains the built-in tiny Llama on the built-in arithmetic environment with
GRPO, on CPU, in about a minute, and prints the held-out greedy pass rate before and after:

    python recipes/grpo_minimal.py [--steps 150] [--seed 0]

What the full trainer (`scalerl train`, scalerl/trainer/loop.py) adds and this file leaves out:
YAML config and validation, the split into a rollout side and a learner that exchange versioned
batches, the reference model and KL penalty (β = 0 here, the common choice for verifiable rewards),
several optimisation epochs and micro-batches per step (one update per freshly sampled batch here,
so π_old = π_θ and the importance ratio is exactly 1), LR schedules, checkpoints and resume,
TensorBoard, the progress bar, and torch.distributed. The advantage, objective (`rl_objective`)
and log-prob functions are the very ones the trainer calls.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.algorithms.advantages import group_advantages
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective
from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.envs.scoring import score_rollout
from scalerl.models.paths import builtin_model_dir
from scalerl.models.logprobs import completion_logprobs
from scalerl.types import SamplingParams, derive_seed
from scalerl.rollout.hf import HFSampler


def pass_rate(env, sampler, tokenizer) -> float:
    """Greedy decoding on the held-out tasks; the pass rate is the mean reward."""
    tasks = env.eval_tasks()
    batch = sampler.sample([tokenizer(t.prompt)["input_ids"] for t in tasks], SamplingParams(max_new_tokens=8, temperature=0.0), None)
    return score_rollout(env, tasks, batch, tokenizer).mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)

    # --- setup: model, tokenizer, environment, sampler, optimizer -------------------------------
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    policy = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    env = ArithmeticEnv()  # "a+b=" prompts, reward 1.0 for the exact sum followed by EOS
    sampler = HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=args.group)
    pool = env.train_tasks()

    before = pass_rate(env, sampler, tokenizer)
    print(f"held-out greedy pass rate before: {before:.3f}")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        # 1. sample: `group` completions for each of `prompts` prompts, (B, T) with B = prompts * group
        tasks = [pool[((step - 1) * args.prompts + i) % len(pool)] for i in range(args.prompts)]
        seeds = [derive_seed(args.seed, step, i) for i in range(args.prompts)]  # one per prompt: reproducible draws
        batch = sampler.sample([tokenizer(t.prompt)["input_ids"] for t in tasks], params, seeds)

        # 2. score: one scalar reward per completion, (B,)
        rewards = score_rollout(env, tasks, batch, tokenizer)

        # 3. advantages: rewards normalised within each prompt's group, (B,)
        advantages = group_advantages(rewards, args.group)

        # 4. loss: clipped surrogate, mean over all completion tokens of the batch. One update per
        #    fresh batch means π_old = π_θ, so old_logprobs is just the detached current value.
        logprobs, _ = completion_logprobs(policy, batch)  # (B, T)
        inputs = ObjectiveInputs(logprobs=logprobs, old_logprobs=logprobs.detach(), advantages=advantages,
                                 loss_mask=batch.completion_mask)
        loss, _ = rl_objective(inputs, policy_loss="clip", clip_eps_low=0.2, clip_eps_high=0.2, loss_agg="token")

        # 5. update
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()

        if step % 25 == 0 or step == args.steps:
            print(f"step {step:4d}  reward {rewards.mean():.3f}  loss {loss.item():+.4f}  grad_norm {grad_norm:.3f}  "
                  f"pass {pass_rate(env, sampler, tokenizer):.3f}  ({time.perf_counter() - start:.0f} s)")

    print(f"held-out greedy pass rate: {before:.3f} -> {pass_rate(env, sampler, tokenizer):.3f}")


if __name__ == "__main__":
    main()
