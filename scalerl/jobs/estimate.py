"""`scalerl estimate`: what a run will need before it is launched.

From the run's config (or a Llama-2 shape with `--model-size`): the workload (steps x prompts x group
x new tokens, and whether each number came from `--set`, `--config FILE` or the defaults), the prompt
length (given, or the longest of the environment's first 256 training prompts in the config's
tokenizer), the memory of each component (`scalerl.predict.memory`), and, from a throughput (given,
measured in a few real steps here with `--calibrate N`, or read from a finished run with `--from-run`),
the hours, GPU-hours and cost (`scalerl.predict.cost`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError


def prompt_len(config) -> int:
    """The longest of the environment's first 256 training prompts, in the config's tokens."""
    from scalerl.envs.registry import build_env
    from scalerl.models.loading import load_tokenizer

    tok = load_tokenizer(config.model)
    return max(len(tok(task.prompt)["input_ids"]) for task in build_env(config.env.name, config.env.args).train_tasks()[:256])


def prompt_tokens(config, given: int | None) -> tuple[int, str]:
    """The prompt length priced (`given`, else `prompt_len`) and where it came from."""
    if given is not None:
        return given, "--prompt-len"
    return (prompt_len(config), f"the longest of {config.env.name}'s first 256 training prompts in "
                                f"{config.model.tokenizer or config.model.path}'s tokenizer")


WORKLOAD_KEYS = ("train.steps", "rollout.prompts_per_step", "rollout.group_size", "rollout.max_new_tokens")


def _flat(tree: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in tree.items():
        keys |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}"}
    return keys


def workload_sources(config_path: Path | None, overrides: list[str]) -> dict[str, str]:
    """Where each workload number came from: '--set', '--config FILE' or 'default'."""
    from scalerl.config import parse_override, read_yaml_mapping

    from_file = _flat(read_yaml_mapping(config_path, "model:, env:, ..."))
    from_set = {parse_override(item)[0] for item in overrides}
    return {key: "--set" if key in from_set else f"--config {config_path}" if key in from_file else "default" for key in WORKLOAD_KEYS}


def describe_workload(cfg, sources: dict[str, str], prompt_len: int, prompt_len_from: str) -> list[str]:
    """The lines naming the job the figures are for, where its numbers came from, and how to price another."""
    ro = cfg.rollout
    values = {"train.steps": cfg.train.steps, "rollout.prompts_per_step": ro.prompts_per_step,
              "rollout.group_size": ro.group_size, "rollout.max_new_tokens": ro.max_new_tokens}
    whose = ("the built-in default job (a toy: no --config or --set changed its size)" if set(sources.values()) == {"default"}
             else "the job of " + " and ".join(sorted({v.split(" ")[0] for v in sources.values() if v != "default"})) + " over the defaults")
    by_source: dict[str, list[str]] = {}
    for key, source in sources.items():
        by_source.setdefault(source, []).append(f"{key}={values[key]}")
    lines = [f"workload: {whose}: env {cfg.env.name}, {cfg.train.steps} steps x {ro.prompts_per_step} prompts x group "
             f"{ro.group_size} = {cfg.batch_size} completions per step and process, up to {ro.max_new_tokens} new tokens each, "
             f"prompts of {prompt_len} tokens ({prompt_len_from})",
             "  from: " + "; ".join(f"{source}: {', '.join(keys)}" for source, keys in by_source.items()),
             "  another workload: --config RUN.yaml, or --set train.steps=N --set rollout.prompts_per_step=P "
             "--set rollout.group_size=G --set rollout.max_new_tokens=T (and --prompt-len L)"]
    return lines


PRESET_POSITIONS = 4096  # Llama-2's context, the shape --model-size prices


def checked(cfg, model_size: str | None):
    """`check_config`; with --model-size the config's own model is not the one priced, so its context
    length does not bind the token budgets: Llama-2's 4096 positions do."""
    from scalerl.config.checks import check_config

    if model_size is None:
        return check_config(cfg)
    check_config(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": 1}),
                                        "eval": cfg.eval.model_copy(update={"max_new_tokens": None})}))
    for field, tokens in (("rollout.max_new_tokens", cfg.rollout.max_new_tokens), ("eval.max_new_tokens", cfg.eval.max_new_tokens)):
        if tokens is not None and tokens + 1 > PRESET_POSITIONS:
            raise ScaleRLError(f"{field}={tokens}: a Llama-2 {model_size} has {PRESET_POSITIONS} positions for the prompt and the "
                               f"completion together; set it to at most {PRESET_POSITIONS - 1} (less the longest prompt's tokens)")
    return cfg


def load_checked(config_path: Path | None, overrides: list[str], model_size: str | None):
    """The run's config, checked (`checked`), after --model-size is checked to name a preset."""
    from scalerl.config import load_config
    from scalerl.predict.memory import MODEL_PRESETS

    if model_size is not None and model_size.lower() not in MODEL_PRESETS:
        raise ScaleRLError(f"--model-size: {model_size!r} is not one of {', '.join(MODEL_PRESETS)}")
    return checked(load_config(config_path, overrides), model_size)


def model_shape(cfg, model_size: str | None):
    """The shape priced: the Llama-2 preset of --model-size, else the config's model."""
    from scalerl.predict.memory import MODEL_PRESETS, shape_of_model_path

    return MODEL_PRESETS[model_size.lower()] if model_size else shape_of_model_path(cfg.model.path)


def precision_override(precision: str) -> str:
    """--precision X as the override it stands for (precision.mode=X, older names mapped): the mode's defaults, e.g.
    compressed's gradient checkpointing, then apply as they do for --set precision.mode=X."""
    from scalerl.predict.memory import LEGACY_NAMES

    return f"precision.mode={LEGACY_NAMES.get(precision, precision)}"


def micro_batch_rows(cfg, prompt_tokens: int) -> int:
    """Rows of the largest forward/backward: train.micro_batch_size, or under train.micro_batch_tokens the rows of
    full length (prompt + max_new_tokens) its budget holds (scalerl/learner/micro_batches.py), at least one unit (a
    row; with loss_agg=prompt a whole group, which is never split) and at most the mini-batch."""
    plan = cfg.plan
    if plan.micro_batch_tokens is None:
        return plan.micro_batch_size
    unit = plan.group_size if cfg.algorithm.loss_agg == "prompt" else 1
    fit = plan.micro_batch_tokens // max(prompt_tokens + cfg.rollout.max_new_tokens, 1) // unit * unit
    return min(max(fit, unit), plan.mini_batch_size)


def component_memory(cfg, shape, mode: str, optim_8bit: bool, prompt_tokens: int) -> dict[str, float]:
    """`estimate_memory` of the shape under the config's batch, algorithm, LoRA, precision and optimizer."""
    from scalerl.predict.memory import estimate_memory

    algo = cfg.algorithm
    return estimate_memory(shape, precision=mode, optim_8bit=optim_8bit, micro_batch=micro_batch_rows(cfg, prompt_tokens),
                           prompt_len=prompt_tokens, reference_8bit=cfg.precision.reference_8bit,
                           completion_len=cfg.rollout.max_new_tokens, rollout_sequences=cfg.batch_size,
                           reference=algo.kl.needs_reference, critic=algo.critic if algo.name == "ppo" else None,
                           checkpointing=cfg.model.gradient_checkpointing, entropy=algo.entropy_coef > 0,
                           lora=(cfg.model.lora.r, cfg.model.lora.target_modules) if cfg.model.lora.enabled else None,
                           ewc=cfg.forgetting.ewc, fp32_residual=cfg.precision.fp32_residual, offload=cfg.optim.offload,
                           logprob_chunk=cfg.train.logprob_chunk_tokens, restore_point=restore_points(cfg))


def restore_points(cfg) -> bool:
    """Whether the run keeps the non-finite response's restore point (a host copy of the trained state)."""
    health = cfg.health
    return health.enabled and health.nonfinite.enabled and health.nonfinite.snapshot_every > 0


def calibrate(config_path: Path | None, overrides: list[str], steps: int) -> Path:
    """Run `steps` real steps of the config (no evaluation, no checkpoint) in a temporary folder; its run dir."""
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    root = Path(tempfile.mkdtemp(prefix="scalerl_calibrate_"))
    cfg = load_config(config_path, overrides + [f"train.steps={steps}", "eval.every=0", "eval.max_tasks=1", "checkpoint.save_final=false",
                                                f"log.run_dir={root}", "log.name=calibrate", "log.console=none", "log.tensorboard=false"])
    return Path(train(cfg)["run_dir"])


def throughput(cfg, config_path: Path | None, overrides: list[str], tokens_per_s: float | None, calibrate_steps: int,
               from_run: Path | None) -> tuple[float | None, float, str, bool]:
    """Generated tokens/s, tokens per step, where the tokens per step came from, and whether both were
    measured (in `from_run`, or in `calibrate_steps` steps run here) rather than given and planned."""
    from scalerl.predict.cost import throughput_from_run

    if not (calibrate_steps or from_run):
        return (tokens_per_s, cfg.batch_size * cfg.rollout.max_new_tokens,
                f"{cfg.batch_size} completions x up to {cfg.rollout.max_new_tokens} new tokens", False)
    measured_in = from_run or calibrate(config_path, overrides, calibrate_steps)
    tps, per_step = throughput_from_run(measured_in)
    return (tps, per_step, f"measured in {from_run}, that run's own workload and machine" if from_run
            else f"measured in {calibrate_steps} steps of this workload here", True)


def price_run(cfg, shape, tokens_per_step: float, tokens_per_s: float, gpus: int, price: float,
              efficiency: float | None) -> tuple[dict[str, Any], float]:
    """`run_cost` of the config's steps, and the efficiency used (given, else the source's for the shape's size)."""
    from scalerl.predict.cost import efficiency_for, run_cost

    eff = efficiency if efficiency is not None else efficiency_for(shape.params)
    return run_cost(steps=cfg.train.steps, tokens_per_step=tokens_per_step, tokens_per_s=tokens_per_s, gpus=gpus,
                    price_per_gpu_hour=price, efficiency=eff), eff
