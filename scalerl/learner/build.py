"""The learner's builders: reference, critic, the parallel strategy's wrapping, optimizer, β controller and
forgetting terms around a policy."""

from __future__ import annotations

import logging

import torch

from scalerl.algorithms.kl_control import KLController
from scalerl.config import Config
from scalerl.distributed.build import build_strategy
from scalerl.distributed.context import DistContext
from scalerl.learner.algorithm import objective_settings
from scalerl.learner.forgetting import AnchorData, EWCState, Forgetting, SelfDistill
from scalerl.learner.learner import Learner
from scalerl.learner.optim import build_optimizer
from scalerl.models.build import build_teacher
from scalerl.models.logprobs import CompletionModel
from scalerl.models.lora import AdaptersOff, trainable_fraction
from scalerl.precision.apply import build_reference, weights_dtype

log = logging.getLogger(__name__)


def build_critic(config: Config, policy: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """PPO's critic: a separate value model from the same checkpoint, or a value head on the policy; its
    weights in the precision mode's dtype, as the policy's."""
    from scalerl.models.value import ValueHead, ValueModel

    dtype = weights_dtype(config.precision_policy)
    if config.algorithm.critic == "head":
        return ValueHead(policy.config.hidden_size).to(device, dtype)
    return ValueModel.from_pretrained(config.model.path, trust_remote_code=config.model.trust_remote_code,
                                      hub_kernels=config.model.hub_kernels).to(device, dtype).train()


def build_forgetting(config: Config, ctx: DistContext, policy: torch.nn.Module, tokenizer, prompts) -> Forgetting | None:
    """The SFT anchor's data, EWC's state (θ* = the policy's weights now, F filled at step 0 or from a checkpoint) and
    self-distillation's teacher (a frozen copy of the policy now), or None when `forgetting` asks for none of them."""
    fg = config.forgetting
    if not (fg.sft or fg.ewc or fg.self_distill):
        return None
    anchor = AnchorData.build(fg.data, prompts.encode, tokenizer, prompts.stop_ids()[-1], config.train.seed, ctx.rank)
    trained = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    ewc = EWCState.zeros(trained, fg.ewc_lambda) if fg.ewc else None
    rows = max(1, round(fg.sft_fraction * config.plan.mini_batch_size)) if fg.sft else 0
    self_distill = None
    if fg.self_distill:  # before any update: the copy is the starting policy (a resume starts from the run's own start)
        self_distill = SelfDistill(teacher=CompletionModel(build_reference(policy, config.precision_policy)), policy=policy,
                                   rows=max(1, round(fg.self_distill_fraction * config.plan.mini_batch_size)), weight=fg.self_distill_weight,
                                   max_new_tokens=config.rollout.max_new_tokens, temperature=config.rollout.temperature,
                                   stop_ids=list(prompts.stop_ids()))
    return Forgetting(anchor=anchor, rows=rows, sft_weight=fg.sft_weight if fg.sft else 0.0, ewc=ewc,
                      params=[p for _, p in trained], ctx=ctx, fisher_rows=config.rollout.prompts_per_step,
                      fisher_batches=fg.fisher_batches, self_distill=self_distill)


def build_learner(config: Config, ctx: DistContext, policy: torch.nn.Module, forgetting: Forgetting | None = None,
                  precision_notes: tuple[str | None, str | None] = (None, None)) -> Learner:
    """Reference, critic, the parallel strategy's wrapping, optimizer and β controller around the policy; a
    learner of version 0. `precision_notes`: why precision.mode=auto chose
    the mode, and a warning on an explicit mode, for the start lines. The reference is copied before wrapping, the optimizer built after (FSDP2 swaps
    the parameters for their shards)."""
    algo = config.algorithm
    # β = 0 with a fixed schedule (and no tracking or guard) never builds or runs a reference model; with
    # LoRA the reference is the policy with its adapters off (no copy).
    lora = config.model.lora.enabled
    reference = build_reference(policy, config.precision_policy) if algo.kl.needs_reference and not lora else None
    critic = build_critic(config, policy, ctx.device) if algo.name == "ppo" else None
    parallel = build_strategy(config.parallel, ctx, config.precision_policy)
    chunk = config.train.logprob_chunk_tokens  # the LM head chunk by chunk (scalerl/models/chunked_logprobs.py)
    policy_forward = parallel.wrap(CompletionModel(policy, chunk_tokens=chunk))
    reference_forward = parallel.wrap(CompletionModel(reference, chunk_tokens=chunk), trainable=False) if reference is not None else None
    if lora:
        reference_forward = AdaptersOff(CompletionModel(policy, chunk_tokens=chunk), policy) if algo.kl.needs_reference else None
        trained, total = trainable_fraction(policy)
        log.info("LoRA r=%d: %d of %d policy parameters train (%.2f%%)", config.model.lora.r, trained, total, 100 * trained / total)
    critic = parallel.wrap(critic) if critic is not None else None
    teacher_forward = parallel.wrap(CompletionModel(build_teacher(config, policy, ctx.device), chunk_tokens=chunk), trainable=False) if algo.distill_teacher and algo.distill_teacher_placement == "learner" else None
    groups = [(policy, config.optim.lr)]
    if critic is not None:
        groups.append((critic, algo.critic_lr or config.optim.lr))
    optimizer = build_optimizer(groups, config.optim, config.precision_policy, ctx.device)
    kl = algo.kl
    kl_ctl = KLController(schedule=kl.schedule, beta=kl.beta, total_steps=config.train.steps, target_kl=kl.target_kl,
                          horizon=kl.horizon, beta_min=kl.beta_min, beta_target=kl.beta_target)
    return Learner(policy=policy, policy_forward=policy_forward, reference=reference, reference_forward=reference_forward, critic=critic, value_head=algo.name == "ppo" and algo.critic == "head",
                   optimizer=optimizer, kl_ctl=kl_ctl, plan=config.plan, precision=config.precision_policy, algo=algo, optim=config.optim,
                   objective=objective_settings(algo, max_new_tokens=config.rollout.max_new_tokens),
                   temperature=config.rollout.temperature, ctx=ctx, parallel=parallel, forgetting=forgetting,
                   teacher_forward=teacher_forward, precision_notes=precision_notes)
