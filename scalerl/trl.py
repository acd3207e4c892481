"""TRL's GRPO API on ScaleRL: `from scalerl.trl import GRPOConfig, GRPOTrainer` in place of `from trl import ...`.

A `GRPOConfig` takes TRL's field names and defaults; `GRPOTrainer` maps them onto ScaleRL's config keys and runs
`scalerl.Trainer` (the job `scalerl train` runs). A field ScaleRL cannot honour is refused in one line naming it
when it is set to anything but TRL's default; a name GRPOConfig does not know is refused the same way. Never ignored.

    TRL field                                         ScaleRL key
    output_dir                                        log.run_dir / log.name (the run folder)
    learning_rate, weight_decay, max_grad_norm,       optim.lr, optim.weight_decay, optim.max_grad_norm,
      adam_beta1/2, adam_epsilon                        optim.betas, optim.eps
    lr_scheduler_type, warmup_steps / warmup_ratio    optim.schedule (linear, cosine, constant), optim.warmup_steps
    per_device_train_batch_size                       train.micro_batch_size (completions per forward/backward)
    × gradient_accumulation_steps                     train.mini_batch_size (completions per optimizer step)
    × steps_per_generation / generation_batch_size    rollout.prompts_per_step × num_generations (completions per sampling)
    num_generations                                   rollout.group_size
    num_iterations                                    train.epochs
    max_steps (optimizer steps) or num_train_epochs   train.steps (one sampling per step, steps_per_generation /
                                                        gradient_accumulation_steps optimizer steps each)
    max_completion_length                             rollout.max_new_tokens
    temperature, top_p, top_k                         rollout.temperature, rollout.top_p, rollout.top_k
    beta, use_bias_correction_kl                      algorithm.kl.beta (k3 estimator, as TRL), algorithm.kl.with_ratio
    epsilon, epsilon_high, delta                      algorithm.clip_eps_low, clip_eps_high, delta
    loss_type                                         grpo: loss_agg sequence; dapo, bnpo: token; dr_grpo: constant;
                                                        cispo: algorithm.name cispo (epsilon_high: eps_max)
    scale_rewards                                     algorithm.scale_rewards (group, batch, none)
    importance_sampling_level                         algorithm.importance_level
    mask_truncated_completions                        algorithm.mask_truncated_completions
    off_policy_mask_threshold                         algorithm.off_policy_mask
    reward_weights                                    reward.components[i].weight
    seed, shuffle_dataset                             train.seed, env.shuffle
    logging_steps                                     every step is logged (metrics.jsonl, TensorBoard); log_completions:
                                                        reward.dump_every = logging_steps
    save_strategy, save_steps, save_total_limit       checkpoint.every, checkpoint.keep_last (save_strategy no: none on the way;
                                                        the final checkpoint is still written: save_model() exports it)
    eval_strategy, eval_steps, per_device_eval_batch_size   eval.every, eval.batch_size
    bf16, fp16 (True / False)                         precision.mode standard (bf16 / fp16 compute) / fp32; unset: ScaleRL's
    gradient_checkpointing, cast_lm_head_to_fp32      model.gradient_checkpointing, model.fp32_lm_head
    report_to                                         log.tensorboard, log.sinks (wandb, mlflow)
    use_vllm (vllm_mode colocate)                     rollout.engine vllm, rollout.vllm.*
    use_cpu                                           train.device cpu
    optim adamw_torch, adamw_torch_fused, adamw_hf    ScaleRL's AdamW (torch's, fused where torch has a fused kernel)
    tf32 False (True is refused: no TF32 here)        fp32 matmuls at full precision
    disable_tqdm, fsdp "", lr_scheduler_kwargs {},    accepted at those values, which change nothing here (ScaleRL's own
      max_prompt_length None                            progress line, parallel.strategy for FSDP, prompts untruncated)

Without an `eval_dataset`, TRL holds nothing out: neither does this (the training prompts are evaluated, at most
`per_device_eval_batch_size` of them, before and after training). `save_model()` without a folder writes
`<output_dir>/model` (the run folder holds ScaleRL's checkpoints and logs).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from scalerl.api.trainer import Trainer
from scalerl.errors import ScaleRLError

# Every field GRPOConfig accepts, with TRL's default. Those in UNMAPPED are accepted only at that default.
DEFAULTS: dict[str, Any] = {
    "output_dir": "trainer_output", "learning_rate": 1e-6, "weight_decay": 0.0, "max_grad_norm": 1.0, "adam_beta1": 0.9,
    "adam_beta2": 0.999, "adam_epsilon": 1e-8, "lr_scheduler_type": "linear", "warmup_steps": 0, "warmup_ratio": 0.0,
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "steps_per_generation": None, "generation_batch_size": None,
    "num_generations": 8, "num_iterations": 1, "max_steps": -1, "num_train_epochs": 3.0, "max_completion_length": 256,
    "max_prompt_length": 512, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "beta": 0.0, "use_bias_correction_kl": False,
    "epsilon": 0.2, "epsilon_high": None, "delta": None, "loss_type": "dapo", "scale_rewards": "group",
    "importance_sampling_level": "token", "mask_truncated_completions": False, "off_policy_mask_threshold": None,
    "reward_weights": None, "seed": 42, "shuffle_dataset": True, "logging_steps": 10, "log_completions": False,
    "save_strategy": "steps", "save_steps": 500, "save_total_limit": None, "eval_strategy": "no", "eval_steps": None,
    "per_device_eval_batch_size": 8, "bf16": None, "fp16": False, "gradient_checkpointing": True, "cast_lm_head_to_fp32": False,
    "report_to": "none", "use_vllm": False, "vllm_mode": "server", "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": None,
    "use_cpu": False,
    # accepted at their default only
    "min_p": None, "repetition_penalty": 1.0, "generation_kwargs": None, "chat_template_kwargs": None, "model_init_kwargs": None,
    "disable_dropout": False, "remove_unused_columns": False, "num_generations_eval": None, "ds3_gather_for_generation": True,
    "use_transformers_paged": False, "cache_implementation": None, "multi_objective_aggregation": "sum_then_normalize",
    "sync_ref_model": False, "ref_model_mixup_alpha": 0.6, "ref_model_sync_steps": 512, "top_entropy_quantile": 1.0,
    "sapo_temperature_neg": 1.05, "sapo_temperature_pos": 1.0, "max_tool_calling_iterations": None,
    "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_cap": 3.0,
    "num_completions_to_print": None, "log_unique_prompts": False, "log_completions_hub_repo": None, "logging_dir": None,
    "logging_strategy": "steps", "logging_first_step": False, "run_name": None, "push_to_hub": False, "hub_model_id": None,
    "optim": "adamw_torch", "lr_scheduler_kwargs": None, "gradient_checkpointing_kwargs": None, "dataloader_num_workers": 0,
    "torch_compile": False, "fsdp": None, "deepspeed": None, "load_best_model_at_end": False, "overwrite_output_dir": False,
    "disable_tqdm": None, "tf32": None,
}
UNMAPPED = set(list(DEFAULTS)[list(DEFAULTS).index("min_p"):]) | {"max_prompt_length"}
SAME_AS_DEFAULT = {"max_prompt_length": (None,), "optim": ("adamw_torch_fused", "adamw_hf"), "lr_scheduler_kwargs": ({},),
                   "fsdp": ("",), "disable_tqdm": (False, True), "tf32": (False,)}  # also accepted: they change nothing here
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
LOSS_AGG = {"grpo": "sequence", "dapo": "token", "bnpo": "token", "dr_grpo": "constant", "cispo": "token"}
SCALE = {True: "group", "group": "group", "batch": "batch", False: "none", "none": "none"}


def refuse(field: str, value: Any, why: str) -> ScaleRLError:
    return ScaleRLError(f"GRPOConfig.{field}={value!r}: {why}")


class GRPOConfig:
    """TRL's GRPOConfig fields (see the module docstring for what each becomes), with TRL's defaults."""

    def __init__(self, output_dir: str | None = None, **fields: Any):
        for name in fields:
            if name not in DEFAULTS:
                raise ScaleRLError(f"GRPOConfig.{name}: ScaleRL does not know this field; remove it (the fields it maps: "
                                   "scalerl.trl in the API reference, docs/reference/api.md)")
        for name, default in DEFAULTS.items():
            setattr(self, name, fields.get(name, default))
        self.output_dir = output_dir if output_dir is not None else DEFAULTS["output_dir"]
        for name in sorted(UNMAPPED):
            value = getattr(self, name)
            if value != DEFAULTS[name] and value not in SAME_AS_DEFAULT.get(name, ()):
                raise refuse(name, value, f"ScaleRL has no equivalent; remove it (or leave TRL's default {DEFAULTS[name]!r})")

    def __repr__(self) -> str:
        changed = {k: getattr(self, k) for k in DEFAULTS if getattr(self, k) != DEFAULTS[k]}
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def batch_keys(a: GRPOConfig, rows: int) -> dict[str, Any]:
    """Batch sizes and the number of steps: TRL counts optimizer steps, ScaleRL sampling steps."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = a.steps_per_generation or a.gradient_accumulation_steps  # micro-batches per sampling, per process
    completions = a.generation_batch_size // world if a.generation_batch_size else a.per_device_train_batch_size * per_step
    if completions % a.num_generations:
        raise refuse("per_device_train_batch_size", a.per_device_train_batch_size,
                     f"{completions} completions per sampling (× steps_per_generation, or generation_batch_size) is not a "
                     f"multiple of num_generations={a.num_generations}; make it one")
    mini = a.per_device_train_batch_size * a.gradient_accumulation_steps
    if completions % mini:
        raise refuse("gradient_accumulation_steps", a.gradient_accumulation_steps,
                     f"{completions} completions per sampling are not a whole number of optimizer steps of {mini}")
    prompts = completions // a.num_generations
    updates = completions // mini  # optimizer steps per sampling step
    steps = math.ceil(a.max_steps / updates) if a.max_steps > 0 else math.ceil(a.num_train_epochs * rows / (prompts * world))
    warmup = a.warmup_steps or math.ceil(a.warmup_ratio * steps * updates)
    return {"rollout.prompts_per_step": prompts, "rollout.group_size": a.num_generations, "train.micro_batch_size": a.per_device_train_batch_size,
            "train.mini_batch_size": mini, "train.epochs": a.num_iterations, "train.steps": max(1, steps), "optim.warmup_steps": warmup}


def algorithm_keys(a: GRPOConfig) -> dict[str, Any]:
    if a.loss_type not in LOSS_AGG:
        raise refuse("loss_type", a.loss_type, f"ScaleRL maps {', '.join(LOSS_AGG)}; use one of them")
    if a.scale_rewards not in SCALE:
        raise refuse("scale_rewards", a.scale_rewards, "ScaleRL maps group, batch and none (True, False)")
    keys = {"algorithm.loss_agg": LOSS_AGG[a.loss_type], "algorithm.scale_rewards": SCALE[a.scale_rewards], "algorithm.kl.beta": a.beta,
            "algorithm.kl.estimator": "k3", "algorithm.kl.with_ratio": a.use_bias_correction_kl,
            "algorithm.mask_truncated_completions": a.mask_truncated_completions, "algorithm.off_policy_mask": a.off_policy_mask_threshold}
    if a.loss_type == "cispo":
        for field in ("delta", "importance_sampling_level"):
            if getattr(a, field) != DEFAULTS[field]:
                raise refuse(field, getattr(a, field), "has no meaning for loss_type=cispo in ScaleRL; remove it")
        return {"algorithm.name": "cispo", **keys, **({"algorithm.eps_max": a.epsilon_high} if a.epsilon_high is not None else {})}
    return {"algorithm.name": "grpo", **keys, "algorithm.clip_eps_low": a.epsilon, "algorithm.clip_eps_high": a.epsilon_high or a.epsilon,
            "algorithm.delta": a.delta, "algorithm.importance_level": a.importance_sampling_level}


def run_keys(a: GRPOConfig) -> dict[str, Any]:
    """Optimizer, sampling, precision, logging and checkpoints."""
    if a.lr_scheduler_type not in SCHEDULES:
        raise refuse("lr_scheduler_type", a.lr_scheduler_type, f"ScaleRL maps {', '.join(SCHEDULES)}")
    out = Path(a.output_dir)
    keys: dict[str, Any] = {
        "log.run_dir": str(out.parent), "log.name": out.name, "optim.lr": a.learning_rate, "optim.weight_decay": a.weight_decay,
        "optim.max_grad_norm": a.max_grad_norm if a.max_grad_norm and a.max_grad_norm > 0 else None,
        "optim.betas": [a.adam_beta1, a.adam_beta2], "optim.eps": a.adam_epsilon, "optim.schedule": SCHEDULES[a.lr_scheduler_type],
        "rollout.max_new_tokens": a.max_completion_length, "rollout.temperature": a.temperature, "rollout.top_p": a.top_p,
        "rollout.top_k": a.top_k or 0, "train.seed": a.seed, "env.shuffle": a.shuffle_dataset,
        "model.gradient_checkpointing": a.gradient_checkpointing, "model.fp32_lm_head": a.cast_lm_head_to_fp32,
        "eval.batch_size": a.per_device_eval_batch_size}
    if a.log_completions:
        keys["reward.dump_every"] = a.logging_steps
    match a.save_strategy:
        case "steps":
            keys["checkpoint.every"] = a.save_steps
        case "no":
            keys["checkpoint.every"] = 0
        case _:
            raise refuse("save_strategy", a.save_strategy, "ScaleRL saves every N steps: use steps (with save_steps) or no")
    if a.save_total_limit:
        keys["checkpoint.keep_last"] = a.save_total_limit
    match a.eval_strategy:
        case "no":
            keys["eval.every"] = 0
        case "steps":
            keys["eval.every"] = a.eval_steps or a.logging_steps
        case _:
            raise refuse("eval_strategy", a.eval_strategy, "ScaleRL evaluates every N steps: use steps (with eval_steps) or no")
    if a.bf16 or a.fp16:
        keys.update({"precision.mode": "standard", "precision.compute": "bf16" if a.bf16 else "fp16"})
    elif a.bf16 is False:
        keys["precision.mode"] = "fp32"
    if a.use_cpu:
        keys["train.device"] = "cpu"
    return {**keys, **report_keys(a.report_to), **vllm_keys(a)}


def report_keys(report_to: Any) -> dict[str, Any]:
    names = [report_to] if isinstance(report_to, str) or report_to is None else list(report_to)
    names = [n for n in names if n not in (None, "none")]
    unknown = [n for n in names if n not in ("all", "tensorboard", "wandb", "mlflow")]
    if unknown:
        raise refuse("report_to", report_to, f"ScaleRL reports to tensorboard, wandb and mlflow, not {unknown[0]}")
    return {"log.tensorboard": "tensorboard" in names or "all" in names, "log.sinks": [n for n in names if n in ("wandb", "mlflow")]}


def vllm_keys(a: GRPOConfig) -> dict[str, Any]:
    if not a.use_vllm:
        return {}
    if a.vllm_mode != "colocate":
        raise refuse("vllm_mode", a.vllm_mode, "with use_vllm=True, ScaleRL runs vLLM inside the trainer, not as a server: "
                                               "set vllm_mode='colocate'")
    return {"rollout.engine": "vllm", "rollout.vllm.gpu_memory_utilization": a.vllm_gpu_memory_utilization,
            "rollout.vllm.max_model_len": a.vllm_max_model_length}


def scalerl_overrides(args: GRPOConfig, rows: int) -> dict[str, Any]:
    """ScaleRL's dotted config keys for TRL's `args` and a training set of `rows` prompts."""
    return {**run_keys(args), **algorithm_keys(args), **batch_keys(args, rows)}


def rows_of(dataset: Any, where: str) -> int:
    if isinstance(dataset, (str, Path)):
        return sum(1 for line in Path(dataset).read_text().splitlines() if line.strip())
    if not hasattr(dataset, "__len__") or isinstance(dataset, dict):
        raise ScaleRLError(f"{where}: give a datasets.Dataset, a list of dicts or a JSONL path (an IterableDataset or a "
                           "DatasetDict is not supported)")
    return len(dataset)


class GRPOTrainer:
    """TRL's GRPOTrainer signature over `scalerl.Trainer`: model (a folder, hub id or model object), reward_funcs (a
    callable or a list), args (GRPOConfig), train_dataset / eval_dataset (with a 'prompt' column), processing_class
    (the tokenizer). callbacks, optimizers, peft_config and reward_processing_classes are refused when given."""

    def __init__(self, model: Any, reward_funcs: Any, args: GRPOConfig | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Any = None, optimizers: tuple = (None, None), peft_config: Any = None):
        for name, value in (("reward_processing_classes", reward_processing_classes), ("callbacks", callbacks), ("peft_config", peft_config)):
            if value is not None:
                raise ScaleRLError(f"GRPOTrainer({name}=...): not supported by ScaleRL's TRL layer; remove it (LoRA: model.lora in a scalerl.Config)")
        if tuple(optimizers) != (None, None):
            raise ScaleRLError("GRPOTrainer(optimizers=...): ScaleRL builds its own AdamW; set learning_rate and adam_* in GRPOConfig")
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        for i, fn in enumerate(funcs):
            if isinstance(fn, (str, Path)):
                raise ScaleRLError(f"reward_funcs[{i}]={fn!r}: a reward model by name is not supported here; give callables "
                                   "(or use scalerl.Trainer with a config whose reward.components name a model folder)")
        if train_dataset is None:
            raise ScaleRLError("GRPOTrainer: give train_dataset (rows with a 'prompt' column)")
        self.args = args or GRPOConfig()
        overrides = scalerl_overrides(self.args, rows_of(train_dataset, "train_dataset"))
        if eval_dataset is None:  # TRL holds nothing out: evaluate a few training prompts, before and after
            overrides["eval.max_tasks"] = self.args.per_device_eval_batch_size
        self.trainer = Trainer(model=model, reward_funcs=list(funcs), train_dataset=train_dataset,
                               eval_dataset=eval_dataset if eval_dataset is not None else train_dataset, tokenizer=processing_class,
                               config=overrides, reward_weights=self.args.reward_weights)

    def train(self, resume_from_checkpoint: bool | None = None) -> dict[str, Any]:
        """Train; `resume_from_checkpoint=True` continues the run in output_dir. Returns ScaleRL's run summary."""
        if resume_from_checkpoint not in (None, False, True):
            raise ScaleRLError("train(resume_from_checkpoint=PATH): ScaleRL resumes the run in output_dir; pass True")
        return self.trainer.train(resume=bool(resume_from_checkpoint))

    def evaluate(self) -> dict[str, float]:
        return {"eval_reward": self.trainer.evaluate()}

    def save_model(self, output_dir: str | None = None) -> Path:
        """A Hugging Face folder of the trained policy: `output_dir`, default `<args.output_dir>/model`."""
        return self.trainer.save(output_dir or Path(self.args.output_dir) / "model", overwrite=True)
