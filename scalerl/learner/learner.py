"""The learner: consumes `ScoredBatch`es and updates the policy (and critic).

    learn(batch) → targets (advantages over the global batch; old/ref log-probs) → KL guard
                 → `optimize`: epochs × mini-batches, one optimizer update each, accumulated over
                   micro-batches (`micro_step` → `rl_objective`) → version + 1

It owns the policy, the frozen reference, the critic, the optimizer and the lr schedule, gradient
sync (`parallel`, scalerl/distributed/parallel.py: the models run through the strategy's wrapped
modules, and the learner never asks which strategy it is) and precision, and its run-time state
(`LearnerState`: version, updates taken, the health responses' lr cut and clipping). It never
assumes the batch was sampled by its current weights: a batch is on-policy when its
`policy_version` equals the learner's and it gets exactly one update (`BatchPlan.single_update`);
only then are π_old's log-probs the detached current ones. Otherwise
they are recomputed with the current weights before the first update, and the sampler's own
log-probs enter through the truncated-IS weight and the off-policy mask of the objective.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from scalerl.algorithms.advantages import gae, masked_moments, whiten
from scalerl.algorithms.kl import kl_estimate
from scalerl.algorithms.kl_control import KLController
from scalerl.algorithms.entropy_control import applied_entropy_coef, next_entropy_coef
from scalerl.algorithms.advantages import distillation_advantages
from scalerl.errors import ScaleRLError
from scalerl.algorithms.losses import aggregation_units, mask_truncated, masked_fill_zero
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective
from scalerl.config import AlgorithmConfig, HealthConfig, OptimConfig
from scalerl.distributed.context import DistContext
from scalerl.distributed.parallel import Strategy, unwrap
from scalerl.models.logprobs import CompletionModel
from scalerl.config.plan import INITIAL_LOSS_SCALE, BatchPlan, PrecisionPolicy, next_loss_scale
from scalerl.precision.apply import autocast_context, component_bytes, expected_bytes
from scalerl.learner.algorithm import outcome_advantages, outcome_token_rewards
from scalerl.learner.forgetting import Forgetting
from scalerl.learner.micro_batches import Micro, micro_batches, split_to
from scalerl.learner.recovery import cool_kl, recover
from scalerl.learner.optim import lr_factor
from scalerl.monitor.events import Event
from scalerl.precision.apply import describe as describe_precision
from scalerl.types import Rollout, ScoredBatch


@dataclass
class LearnerState:
    """What changes during a run besides weights and optimizer moments; checkpointed with it."""

    version: int = 0  # policy version: +1 per learned batch (and per snapshot restore)
    updates: int = 0  # optimizer updates applied: the lr schedule's position
    lr_scale: float = 1.0  # persistent cut by the kl_explosion response
    max_grad_norm: float | None = None  # optim.max_grad_norm, or 1.0 once a non-finite step turned clipping on
    loss_scale: float = 1.0  # fp16's dynamic loss scale (scalerl/config/plan.py: next_loss_scale); 1 otherwise
    loss_scale_good: int = 0  # overflow-free updates in a row at this scale
    entropy_coef: float | None = None  # algorithm.entropy_target: the adaptive coefficient (None: algorithm.entropy_coef)
    last_entropy: float | None = None  # algorithm.entropy_target: mean entropy of the last update's trained tokens


@dataclass
class Targets:
    """What the update regresses towards, computed once per batch before any weight changes."""

    loss_mask: torch.Tensor  # (B, T) what is trained on (the rollout's mask, less truncated rows if configured)
    advantages: torch.Tensor  # (B,) per completion, or (B, T) per token (PPO)
    old_logprobs: torch.Tensor | None  # (B, T); None: on-policy, use the detached current log-probs
    ref_logprobs: torch.Tensor | None  # (B, T)
    old_values: torch.Tensor | None = None  # (B, T), PPO
    returns: torch.Tensor | None = None  # (B, T), PPO


@dataclass
class Snapshot:
    """A CPU copy of the weights and optimizer state (the non-finite response's restore point)."""

    policy: dict[str, torch.Tensor]
    critic: dict[str, torch.Tensor] | None
    optimizer: dict[str, Any]


@dataclass
class CheckpointParts:
    """What a checkpoint keeps of the learner besides `state_dict()`: weights and optimizer moments (through DCP)."""

    model: torch.nn.Module  # the policy as the sampler and Hugging Face see it (unwrapped)
    optimizer: torch.optim.Optimizer
    modules: dict[str, torch.nn.Module]  # besides the policy: PPO's critic
    tensors: dict[str, Any]  # besides modules and optimizer: EWC's anchors and Fisher


class LearnerSide(Protocol):
    """What the training job and the health guard ask of the learner, and all they may ask
    (tests/learner/test_learner_contract.py checks every implementation against it)."""

    @property
    def version(self) -> int:
        """The policy version: +1 per learned batch and per restore."""
        ...

    def learn(self, batch: ScoredBatch, step: int) -> dict[str, float]:
        """Update the policy from one scored batch; returns the step's learning metrics."""
        ...

    def weights(self) -> Mapping[str, torch.Tensor]:
        """The policy's current weights (a state dict, the sampler's names) for a rollout side that holds its own copy."""
        ...

    def end_of_step(self, step: int, *, agree: bool, saving: bool) -> dict[str, float]:
        """After a step: replicas that sync lazily (dynamic sharding) agree now when `agree` (and their optimizer
        moments too when `saving`); returns the communication metrics."""
        ...

    def respond(self, event: Event) -> bool:
        """Apply the response to a health event (kl_explosion, nonfinite), writing what it did into `event.action`
        and `event.values`; True when the weights changed and must be published again."""
        ...

    def restore_point(self, step: int) -> None:
        """Keep the current weights and optimizer state in memory as the non-finite response's restore point."""
        ...

    def restore_point_bytes(self) -> int:
        """Host bytes one restore point takes on this process (trained weights and optimizer state once allocated)."""
        ...

    def start(self, fresh: bool) -> list[str]:
        """The start-up lines (precision, parallel strategy); `fresh`: step 0 of a run, when EWC measures its Fisher."""
        ...

    def checkpoint_parts(self) -> CheckpointParts: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def cpu_copy(obj: Any, into: Any = None) -> Any:
    """A deep copy with every tensor cloned to the CPU (state dicts nest dicts and lists). `into`: an earlier copy
    whose CPU tensors of the same shape and dtype are written in place instead of allocating new ones (a restore
    point taken every few steps then costs no new memory)."""
    if isinstance(obj, torch.Tensor):
        if isinstance(into, torch.Tensor) and into.device.type == "cpu" and into.shape == obj.shape and into.dtype == obj.dtype:
            return into.copy_(obj.detach())
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v, into.get(k) if isinstance(into, dict) else None) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        earlier = list(into) if isinstance(into, (list, tuple)) and len(into) == len(obj) else [None] * len(obj)
        return type(obj)(cpu_copy(v, e) for v, e in zip(obj, earlier))
    return obj


def trained_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The entries of `module`'s state dict that training changes: its parameters that require a gradient."""
    trained = {name for name, p in module.named_parameters() if p.requires_grad}
    return {name: t for name, t in module.state_dict().items() if name in trained}


def load_trained_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load `trained_state`'s entries back; every other entry of `module` stays as it is."""
    other = sorted(set(state) - set(trained_state(module)))
    if other:
        raise RuntimeError(f"a restore point of other entries than the model's trained parameters: {other[:3]}")
    module.load_state_dict(state, strict=False)


class Learner:
    def __init__(self, *, policy: torch.nn.Module, policy_forward: torch.nn.Module, reference: torch.nn.Module | None,
                 reference_forward: torch.nn.Module | None, critic: torch.nn.Module | None, value_head: bool,
                 optimizer: torch.optim.Optimizer, kl_ctl: KLController, plan: BatchPlan, precision: PrecisionPolicy,
                 algo: AlgorithmConfig, optim: OptimConfig, objective: dict[str, Any], temperature: float, ctx: DistContext,
                 parallel: Strategy, forgetting: Forgetting | None = None, health: HealthConfig | None = None,
                 offload: bool = False, teacher_forward: torch.nn.Module | None = None,
                 precision_notes: tuple[str | None, str | None] = (None, None)):
        """`policy`: the Hugging Face model (what the sampler and checkpoints see); `policy_forward` and
        `reference_forward`: the strategy's wrapped `CompletionModel`s the learner runs; `critic`: wrapped too;
        `forgetting`: the SFT anchor and EWC terms around each update (scalerl/learner/forgetting.py);
        `teacher_forward`: algorithm.distill_teacher's frozen model, wrapped; `precision_notes`: (why precision.mode=auto
        chose this mode, a warning on an explicit mode) from scalerl/trainer/setup.py's resolve_precision: `start`
        puts the first on the precision line, the second on a line of its own."""
        self.policy, self.policy_forward, self.reference, self.reference_forward = policy, policy_forward, reference, reference_forward
        self.teacher_forward = teacher_forward
        self.critic, self.value_head, self.parallel = critic, value_head, parallel
        self.optimizer, self.kl_ctl, self.plan, self.precision = optimizer, kl_ctl, plan, precision
        self.algo, self.optim, self.objective, self.temperature, self.ctx = algo, optim, objective, temperature, ctx
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]  # peak lr of each group (policy, critic)
        self.state = LearnerState(max_grad_norm=optim.max_grad_norm, loss_scale=INITIAL_LOSS_SCALE if precision.loss_scaling else 1.0)
        self.forgetting = forgetting
        self.health = health or HealthConfig()  # the responses' factors (scalerl/learner/recovery.py)
        self.offload = offload  # optim.offload, for the start-up line
        self.precision_notes = precision_notes
        self.snapshot_step, self.kept_snapshot = 0, None  # the non-finite response's restore point

    @property
    def version(self) -> int:
        return self.state.version

    def close(self) -> None:
        """Done learning: the strategy lets go of the process group (see Strategy.close)."""
        self.parallel.close()

    def autocast(self):
        return autocast_context(self.precision, self.ctx.device)

    def lr(self) -> float:
        """The policy's learning rate for the next update."""
        return self.base_lrs[0] * lr_factor(self.state.updates, self.plan.total_updates, self.optim) * self.state.lr_scale

    def learn(self, batch: ScoredBatch, step: int) -> dict[str, float]:
        """One batch: targets, the KL guard, `epochs` × mini-batch updates; the policy version goes up by one."""
        on_policy = batch.policy_version == self.state.version and self.plan.single_update
        lr, beta = self.lr(), self.kl_ctl.beta_at(step)
        # π_old is the weights before the step's first update. With a single update those are the weights the
        # training forward runs with, so its detached log-probs are π_old whatever version sampled the batch (a stale
        # batch's sampler log-probs enter through tis_cap / off_policy_mask): the forward is needed first only for
        # several updates, PPO (the KL in the reward, GAE's old values) and the guard's pre-update KL.
        need_old = not self.plan.single_update or self.algo.name == "ppo" or self.algo.kl.max_kl is not None
        targets = self.targets(batch, beta, need_old)
        guard_scale, metrics = self.kl_guard(targets)
        metrics.update(self.optimize(batch.rollout, targets, beta, guard_scale))
        if "kl" in metrics:  # the controller follows the KL of all ranks, so every rank keeps the same β
            kl = self.ctx.sum(torch.tensor([metrics["kl"], metrics["kl_seq"]], dtype=torch.float64)) / self.ctx.world_size
            self.kl_ctl.update(kl[0 if self.algo.kl.level == "token" else 1].item(), n_steps=len(batch) * self.ctx.world_size)
        metrics.update(lr=lr, beta=beta, on_policy=float(on_policy), staleness=float(self.state.version - batch.policy_version))
        if self.algo.distill_teacher is not None:
            metrics["distill/reverse_kl"] = self.distill_kl  # mean over trained tokens of log π_student − log π_teacher
        self.state.version += 1
        return metrics

    @torch.no_grad()
    def frozen_forward(self, model: torch.nn.Module | None, batch: Rollout, *, values: bool = False) -> torch.Tensor:
        """Log-probs (or, with `values`, critic values) of `batch` under weights that are not being
        updated right now, micro-batch by micro-batch (as the update cuts them). (B, T)."""
        out = torch.zeros(batch.completion_ids.shape, device=batch.completion_ids.device)  # (B, T); 0 at trimmed padding
        for micro in self.micro_batches(batch, slice(0, len(batch))):
            mb = micro.select(batch)
            with self.autocast():
                part = self.values(mb) if values else model(mb, temperature=self.temperature, fp32_head=self.precision.fp32_lm_head).logprobs
            out[micro.rows, :part.shape[1]] = part.float()
        return out

    def micro_batches(self, batch: Rollout, rows: slice) -> list[Micro]:
        """The micro-batches of `rows` (scalerl/learner/micro_batches.py): train.micro_batch_size rows in order, or
        packed by length under train.micro_batch_tokens; with several ranks, as many on each rank (the most any has)."""
        plan = self.plan
        micros = micro_batches(batch, rows, size=plan.micro_batch_size, tokens=plan.micro_batch_tokens,
                               whole_groups=self.objective["loss_agg"] == "prompt")
        if plan.micro_batch_tokens is not None and self.ctx.active:
            micros = split_to(micros, int(self.ctx.gather(torch.tensor([len(micros)])).max()))
        return micros

    def values(self, batch: Rollout, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """V_t for every completion token, (B, T)."""
        if not self.value_head:
            return self.critic(batch)
        if hidden is None:
            hidden = self.policy_forward(batch, temperature=self.temperature, with_hidden=True).hidden
        return self.critic(hidden)

    def global_outcome_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """(B,) this rank's advantages, with batch statistics taken over every rank's rewards (as TRL)."""
        everyone = self.ctx.gather(rewards)  # (W·B,) whole groups per rank, in rank order
        mine = slice(self.ctx.rank * len(rewards), (self.ctx.rank + 1) * len(rewards))
        return outcome_advantages(self.algo, everyone, self.plan.group_size)[mine]

    def targets(self, batch: ScoredBatch, beta: float, need_old: bool) -> Targets:
        rollout, algo = batch.rollout, self.algo
        mask = mask_truncated(rollout.completion_mask, rollout.truncated) if algo.mask_truncated_completions else rollout.completion_mask
        ref_lp = self.frozen_forward(self.reference_forward, rollout) if self.reference_forward is not None else None
        old_lp = self.frozen_forward(self.policy_forward, rollout) if need_old else None
        w = batch.row_weights.to(mask.device) if batch.row_weights is not None else None  # PER's importance weights (replay)
        if algo.name != "ppo":
            advantages = self.global_outcome_advantages(batch.rewards)
            if algo.distill_teacher is not None:
                advantages = self.distill_advantages(rollout, mask, old_lp, advantages)  # (B, T)
            return Targets(mask, advantages if w is None else advantages * (w if advantages.dim() == 1 else w[:, None]), old_lp, ref_lp)
        old_values = self.frozen_forward(None, rollout, values=True)
        token_rewards = outcome_token_rewards(batch.rewards, mask)  # (B, T)
        if algo.kl.in_reward and ref_lp is not None and beta > 0:  # classic RLHF: r_t − β·(log π_old − log π_ref)
            token_rewards = token_rewards - beta * (old_lp - ref_lp) * mask
        advantages, returns = gae(token_rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
        if algo.whiten_advantages:  # over the tokens of every rank
            advantages = whiten(advantages, mask, moments=self.ctx.sum(masked_moments(advantages, mask)))
        return Targets(mask, advantages if w is None else advantages * w[:, None], old_lp, ref_lp, old_values, returns)

    def distill_advantages(self, rollout: Rollout, mask: torch.Tensor, old_lp: torch.Tensor | None,
                           task: torch.Tensor) -> torch.Tensor:
        """On-policy distillation's per-token advantage (B, T) against the teacher: the learner's own frozen copy, or
        (distill_teacher_placement=rollout) the log-probs the rollout side shipped in the batch. The mean reverse KL
        over all ranks' trained tokens goes to `self.distill_kl` for the step's metrics."""
        student = old_lp if old_lp is not None else self.frozen_forward(self.policy_forward, rollout)
        if self.teacher_forward is not None:
            teacher = self.frozen_forward(self.teacher_forward, rollout)
        elif rollout.teacher_logprobs.shape == student.shape:
            teacher = rollout.teacher_logprobs.to(student.device, torch.float32)
        else:
            raise ScaleRLError("algorithm.distill_teacher_placement=rollout: the batch carries no teacher log-probs (Rollout.teacher_logprobs "
                               f"{tuple(rollout.teacher_logprobs.shape)}, the completions {tuple(student.shape)}); the rollout side "
                               "must serve the teacher, or set distill_teacher_placement=learner")
        totals = self.ctx.sum(torch.stack([masked_fill_zero(student - teacher, mask).sum(), mask.sum()]).double())
        self.distill_kl = (totals[0] / totals[1].clamp(min=1)).item()
        return distillation_advantages(teacher, student, mask, coef=self.algo.distill_coef, task_advantages=task,
                                       task_coef=self.algo.distill_task_coef)

    def kl_guard(self, t: Targets) -> tuple[float, dict[str, float]]:
        """With kl.max_kl: KL(π_θ ‖ π_ref) of the whole batch (all ranks) before the update, at kl.level;
        the step's lr is scaled by max_kl / KL when it is above. Returns (scale, metrics)."""
        kl_cfg = self.algo.kl
        if kl_cfg.max_kl is None:
            return 1.0, {}
        kl = kl_estimate(t.old_logprobs, t.ref_logprobs, kl_cfg.estimator) * t.loss_mask  # (B, T), π_old = current weights
        if kl_cfg.level == "token":
            local = torch.stack([kl.sum(), t.loss_mask.sum()])
        else:  # summed over each completion, averaged over the completions that have trained tokens
            local = torch.stack([kl.sum(), (t.loss_mask.sum(1) > 0).sum()])
        total, count = self.ctx.sum(local.double()).tolist()
        pre_kl = total / count if count else 0.0
        scale = min(1.0, kl_cfg.max_kl / pre_kl) if pre_kl > 0 else 1.0
        return scale, {"kl_before": pre_kl, "kl_guard_scale": scale}

    def optimize(self, rollout: Rollout, t: Targets, beta: float, guard_scale: float) -> dict[str, float]:
        """`epochs` passes over the batch, one optimizer update per mini-batch, accumulating micro-batches."""
        plan, level = self.plan, self.objective["loss_agg"]
        sums: dict[str, float] = {}
        for _ in range(plan.epochs):
            for start in range(0, len(rollout), plan.mini_batch_size):
                rows = slice(start, start + plan.mini_batch_size)
                # The normalisers are the counts of units (tokens, completions, prompts) and of tokens of the
                # mini-batch over all ranks, computed once: each micro-batch divides its sum by them, and
                # gradients are summed across micro-batches and ranks, giving exactly the mini-batch's gradient.
                # A completion masked for truncation still counts as a unit (TRL's grpo divides by every
                # completion); one the rollout side filtered out (zero-variance group) does not.
                unit_mask = rollout.completion_mask[rows] if level in ("sequence", "sequence_sum", "prompt") else t.loss_mask[rows]
                counts = torch.stack([aggregation_units(unit_mask, level, rollout.group_ids[rows],
                                                        self.objective["max_new_tokens"]), t.loss_mask[rows].sum()])
                normalizer, tokens = self.ctx.sum(counts.double()).tolist()
                stats: dict[str, float] = {"loss": 0.0}
                if self.forgetting is not None:  # the SFT anchor's rows: gradients kept local, summed with the last micro-batch's
                    with self.parallel.accumulating(sync=False):
                        stats.update(self.forgetting.anchor_backward(self.policy_forward, self.state.updates, self.autocast,
                                                                  self.precision.fp32_lm_head, self.state.loss_scale))
                micros = self.micro_batches(rollout, rows)
                for i, micro in enumerate(micros):
                    with self.parallel.accumulating(sync=i == len(micros) - 1):  # only the last backward reduces across ranks
                        diagnostics = self.micro_step(rollout, t, micro, beta, normalizer, tokens)
                    stats["loss"] += diagnostics.pop("loss")  # already normalised by the whole mini-batch
                    for k, v in diagnostics.items():  # diagnostics are averaged over micro-batches
                        stats[k] = stats.get(k, 0.0) + v / len(micros)
                stats["grad_norm"] = self.apply_update(guard_scale, stats)
                stats |= self.steer_entropy(stats)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
        return {k: v / plan.updates_per_step for k, v in sums.items()}

    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient for this update: algorithm.entropy_coef, or with
        algorithm.entropy_target the adaptive one (`scalerl/algorithms/entropy_control.py`)."""
        if self.algo.entropy_target is None:
            return self.algo.entropy_coef
        coef = self.algo.entropy_coef if self.state.entropy_coef is None else self.state.entropy_coef
        return applied_entropy_coef(coef, self.state.last_entropy, self.algo.entropy_target)

    def steer_entropy(self, stats: dict[str, float]) -> dict[str, float]:
        """After an update with algorithm.entropy_target: move the coefficient by the update's mean entropy
        over all ranks (its micro-batches' token means, averaged); returns the metric entropy_coef."""
        if self.algo.entropy_target is None or "entropy" not in stats:
            return {}
        entropy = self.ctx.sum(torch.tensor([stats["entropy"], 1.0], dtype=torch.float64)).tolist()
        self.state.last_entropy = entropy[0] / entropy[1]
        coef = self.algo.entropy_coef if self.state.entropy_coef is None else self.state.entropy_coef
        self.state.entropy_coef = next_entropy_coef(coef, self.state.last_entropy, target=self.algo.entropy_target,
                                                    step=self.algo.entropy_coef_step, high=self.algo.entropy_coef_max)
        return {"entropy_coef": self.state.entropy_coef}

    def micro_step(self, rollout: Rollout, t: Targets, rows: Micro | slice, beta: float, normalizer: float, tokens: float) -> dict[str, float]:
        """Forward and backward of one micro-batch (`rows`: its rows and columns, or a slice of rows); returns
        its detached diagnostics."""
        micro = rows if isinstance(rows, Micro) else Micro(rows)
        mb = micro.select(rollout)
        with self.autocast():
            fwd = self.policy_forward(mb, temperature=self.temperature, fp32_head=self.precision.fp32_lm_head,
                                      with_entropy=True, with_hidden=self.value_head)
            values = self.values(mb, fwd.hidden).float() if t.returns is not None else None
        logprobs = fwd.logprobs.float()
        pick = micro.cut
        inputs = ObjectiveInputs(
            logprobs=logprobs, old_logprobs=logprobs.detach() if t.old_logprobs is None else pick(t.old_logprobs),
            advantages=pick(t.advantages), loss_mask=pick(t.loss_mask), group_ids=mb.group_ids,
            sampler_logprobs=mb.sampler_logprobs, ref_logprobs=pick(t.ref_logprobs), entropy=fwd.entropy.float(),
            values=values, old_values=pick(t.old_values), returns=pick(t.returns))
        in_loss = 0.0 if self.algo.kl.in_reward else beta  # PPO's KL-in-reward is already in the advantages
        loss, diagnostics = rl_objective(inputs, **{**self.objective, "entropy_coef": self.entropy_coef()}, beta=in_loss,
                                         normalizer=normalizer, token_normalizer=tokens)
        (loss * self.state.loss_scale if self.precision.loss_scaling else loss).backward()
        return {"loss": loss.item(), **{k: v.item() for k, v in diagnostics.items()}}

    def apply_update(self, guard_scale: float = 1.0, stats: dict[str, float] | None = None) -> float:
        """Finish the sum of gradients over ranks (then add EWC's, the same on every rank), clip, step (skipped when
        the gradient is not finite); returns the norm. `stats` receives the EWC penalty."""
        self.parallel.finish_gradients()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.precision.loss_scaling:  # back to the loss's own scale, before EWC's gradient, clipping and the step
            torch._foreach_mul_([p.grad for p in params if p.grad is not None], 1.0 / self.state.loss_scale)
        if self.forgetting is not None:
            (stats if stats is not None else {}).update(self.forgetting.ewc_gradients())
        # The strategy's norm (of the summed gradient; dynamic sharding: each rank's own, the skip agreed) gives every rank the same skip.
        grad_norm = self.parallel.grad_norm(params, self.state.max_grad_norm or math.inf)
        if self.precision.loss_scaling:
            # An overflow at a scale above 1 is the scaler's to handle (halve, skip), not a non-finite gradient
            overflow = not math.isfinite(grad_norm) and self.state.loss_scale > 1
            if stats is not None:  # the scale this update's backward ran at
                stats.update(loss_scale=self.state.loss_scale, loss_scale_overflows=float(overflow))
            self.state.loss_scale, self.state.loss_scale_good = next_loss_scale(self.state.loss_scale, self.state.loss_scale_good,
                                                                                math.isfinite(grad_norm))
        if math.isfinite(grad_norm):  # a NaN/Inf gradient never reaches the weights (then see scalerl/learner/recovery.py)
            factor = lr_factor(self.state.updates, self.plan.total_updates, self.optim) * self.state.lr_scale * guard_scale
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = base * factor
            self.optimizer.step()
            self.state.updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # --- the end of a step, the health responses, the start-up lines and what a checkpoint keeps ---

    def weights(self) -> Mapping[str, torch.Tensor]:
        return self.policy.state_dict()

    def end_of_step(self, step: int, *, agree: bool, saving: bool) -> dict[str, float]:
        return self.parallel.end_of_step(step, agree, self.optimizer, moments=saving)

    def respond(self, event: Event) -> bool:
        """kl_explosion: cool the KL; nonfinite: back to the restore point (scalerl/learner/recovery.py)."""
        match event.rule:
            case "kl_explosion":
                cool_kl(self, event, self.health.kl)
                return False
            case "nonfinite":
                return recover(self, event)
        return False

    def restore_point(self, step: int) -> None:
        self.kept_snapshot, self.snapshot_step = self.snapshot(into=self.kept_snapshot), step

    def start(self, fresh: bool) -> list[str]:
        precision = describe_precision(self.precision, self.policy, self.component_bytes(expected=True), offload=self.offload)
        why, warning = self.precision_notes
        lines = [f"{precision}; {why}" if why else precision, *([warning] if warning else [])]
        if self.ctx.active:
            lines.append(self.parallel.describe())
        if fresh and (line := self.start_forgetting()):
            lines.append(line)
        return lines

    def checkpoint_parts(self) -> CheckpointParts:
        return CheckpointParts(self.policy, self.optimizer, self.extra_modules(), self.extra_tensors())


    def scale_lr(self, factor: float) -> tuple[float, float]:
        """Scale every later learning rate by `factor`; returns the policy's (old, new) next lr."""
        old = self.lr()
        self.state.lr_scale *= factor
        return old, self.lr()

    def restore_point_bytes(self) -> int:
        parts = self.component_bytes(expected=True)  # the trained weights (the critic's too) and the optimizer's state
        return parts["weights"] + parts["optimizer"] + parts["error_feedback"]

    def snapshot(self, into: Snapshot | None = None) -> Snapshot:
        """A CPU copy of the trained weights (not LoRA's frozen base) and the optimizer state, written into `into`'s
        tensors where they match."""
        critic = cpu_copy(trained_state(self.critic), into and into.critic) if self.critic is not None else None
        return Snapshot(cpu_copy(trained_state(self.policy), into and into.policy), critic,
                        cpu_copy(self.optimizer.state_dict(), into and into.optimizer))

    def restore(self, snap: Snapshot) -> None:
        """Load a snapshot's weights and optimizer state (the lr schedule goes on); a new policy version. The optimizer
        gets a copy: its load_state_dict keeps tensors already on the right device and dtype as they are, so it would
        otherwise update the snapshot's own moments in place and a second restore would load later steps' moments."""
        load_trained_state(self.policy, snap.policy)
        if self.critic is not None:
            load_trained_state(self.critic, snap.critic)
        self.optimizer.load_state_dict(cpu_copy(snap.optimizer))
        self.state.version += 1

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        """What a checkpoint keeps besides the policy: PPO's critic, unwrapped (its names as a lone module's)."""
        return {"critic": unwrap(self.critic)} if self.critic is not None else {}

    def extra_tensors(self) -> dict[str, Any]:
        """What a checkpoint keeps besides modules and optimizer: EWC's anchors and Fisher."""
        ewc = self.forgetting.ewc if self.forgetting is not None else None
        return {"ewc": ewc.state_dict()} if ewc is not None else {}

    def start_forgetting(self) -> str | None:
        """At step 0 of a run: measure EWC's Fisher at the starting weights. Returns the start-up line (None: no forgetting terms)."""
        fg = self.forgetting
        if fg is None:
            return None
        parts = [f"SFT anchor: {fg.rows} of {len(fg.anchor)} rows per update" if fg.rows else ""]
        if fg.ewc is not None:
            n = fg.measure_fisher(CompletionModel(self.policy), self.autocast, self.precision.fp32_lm_head)
            parts.append(f"EWC: Fisher of {n} anchor rows, lambda {fg.ewc.lam}, anchors + Fisher {fg.ewc.bytes() / 2**20:.2f} MiB per rank")
        return "; ".join(p for p in parts if p)

    def component_bytes(self, expected: bool = False) -> dict[str, int]:
        """Bytes of the weights, gradients, optimizer moments, error feedback and reference held now; with
        `expected`, the optimizer's as they will be once allocated (they appear at the first update)."""
        parts = component_bytes(self.reference, self.optimizer)
        return {**parts, **expected_bytes(self.optimizer, self.precision)} if expected else parts

    def state_dict(self) -> dict[str, Any]:
        return {**asdict(self.state), "kl_controller": self.kl_ctl.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.kl_ctl.load_state_dict(state.pop("kl_controller"))
        self.state = LearnerState(**state)
