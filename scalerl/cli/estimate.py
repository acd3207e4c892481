"""`scalerl estimate`: memory per component, GPUs needed, hours and cost of a run, before launching it."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from scalerl.cli.common import run_guarded, setup_logging
from scalerl.errors import ScaleRLError


def _prompt_len(config) -> int:
    """The longest of the environment's first 256 training prompts, in the config's tokens."""
    from scalerl.envs.registry import build_env
    from scalerl.models.loading import load_tokenizer

    tok = load_tokenizer(config.model)
    return max(len(tok(task.prompt)["input_ids"]) for task in build_env(config.env.name, config.env.args).train_tasks()[:256])


WORKLOAD_KEYS = ("train.steps", "rollout.prompts_per_step", "rollout.group_size", "rollout.max_new_tokens")


def _flat(tree: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in tree.items():
        keys |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}"}
    return keys


def workload_sources(config_path: Optional[Path], overrides: list[str]) -> dict[str, str]:
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


def _checked(cfg, model_size: Optional[str]):
    """`check_config`; with --model-size the config's own model is not the one priced, so its context
    length does not bind the token budgets: Llama-2's 4096 positions do."""
    from scalerl.checks import check_config

    if model_size is None:
        return check_config(cfg)
    check_config(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": 1}),
                                        "eval": cfg.eval.model_copy(update={"max_new_tokens": None})}))
    for field, tokens in (("rollout.max_new_tokens", cfg.rollout.max_new_tokens), ("eval.max_new_tokens", cfg.eval.max_new_tokens)):
        if tokens is not None and tokens + 1 > PRESET_POSITIONS:
            raise ScaleRLError(f"{field}={tokens}: a Llama-2 {model_size} has {PRESET_POSITIONS} positions for the prompt and the "
                               f"completion together; set it to at most {PRESET_POSITIONS - 1} (less the longest prompt's tokens)")
    return cfg


def _calibrate(config_path: Optional[Path], overrides: list[str], steps: int) -> Path:
    """Run `steps` real steps of the config (no evaluation, no checkpoint) in a temporary folder; its run dir."""
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    root = Path(tempfile.mkdtemp(prefix="scalerl_calibrate_"))
    cfg = load_config(config_path, overrides + [f"train.steps={steps}", "eval.every=0", "eval.max_tasks=1", "checkpoint.save_final=false",
                                                f"log.run_dir={root}", "log.name=calibrate", "log.console=none", "log.tensorboard=false"])
    return Path(train(cfg)["run_dir"])


def _print_components(mem: dict[str, float]) -> None:
    from scalerl.predict.memory import GIB

    for key in ("weights", "gradients", "optimizer", "error_feedback", "frozen_base", "ewc", "working_copy", "activations",
                "backward_transient", "kv_cache", "optimizer_step", "reference", "critic", "peak"):
        print(f"  {key:<18} {mem[key] / GIB:10.3f} GiB")
    if mem["host"]:
        print(f"  host memory        {mem['host'] / GIB:10.3f} GiB (optim.offload: AdamW's moments and the host copies it steps on)")


def estimate(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The run's YAML overrides (model, batch shape, precision)."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key of the run's config (repeatable)."),
    model_size: Optional[str] = typer.Option(None, "--model-size", help="7b, 13b or 70b: a Llama-2 shape instead of the config's model."),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32, standard, aggressive or compressed (default: the config's precision.mode)."),
    optim_8bit: bool = typer.Option(False, "--optim-8bit", help="8-bit AdamW states (1 byte per moment)."),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Prompt tokens (default: the longest of the environment's first 256 prompts)."),
    gpu_mem_gb: float = typer.Option(80.0, "--gpu-mem-gb", help="Memory of one GPU, GB."),
    price: float = typer.Option(2.0, "--price-per-gpu-hour", help="Price of one GPU-hour."),
    efficiency: Optional[float] = typer.Option(None, "--efficiency", help="Efficiency factor (default: the source's 0.85 / 0.72 / 0.53 by size)."),
    tokens_per_s: Optional[float] = typer.Option(None, "--tokens-per-s", help="Generated tokens per second per process, if known."),
    calibrate: int = typer.Option(0, "--calibrate", help="Run N real steps of the config here and measure tokens/s."),
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="Read tokens/s from this run directory's metrics."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Memory per component (weights, gradients, AdamW, activations, KV cache, reference, critic), GPUs, hours, cost."""

    def go() -> None:
        from scalerl.config import load_config
        from scalerl.predict.cost import efficiency_for, run_cost, throughput_from_run
        from scalerl.predict.memory import (
            LEGACY_NAMES,
            MODEL_PRESETS,
            estimate_memory,
            gpus_needed,
            shape_of_model_path,
        )

        if model_size is not None and model_size.lower() not in MODEL_PRESETS:
            raise ScaleRLError(f"--model-size: {model_size!r} is not one of {', '.join(MODEL_PRESETS)}")
        cfg = _checked(load_config(config, list(set_)), model_size)
        shape = MODEL_PRESETS[model_size.lower()] if model_size else shape_of_model_path(cfg.model.path)
        micro = cfg.plan.micro_batch_size
        algo = cfg.algorithm
        prompt_tokens = prompt_len if prompt_len is not None else _prompt_len(cfg)
        prompt_from = "--prompt-len" if prompt_len is not None else f"the longest of {cfg.env.name}'s first 256 training prompts in {cfg.model.tokenizer or cfg.model.path}'s tokenizer"
        for line in describe_workload(cfg, workload_sources(config, list(set_)), prompt_tokens, prompt_from):
            print(line)
        mode = LEGACY_NAMES.get(precision, precision) if precision else cfg.precision.mode  # bf16, fp8: the older names
        mem = estimate_memory(shape, precision=mode, optim_8bit=optim_8bit, micro_batch=micro,
                              prompt_len=prompt_tokens, reference_8bit=cfg.precision.reference_8bit,
                              completion_len=cfg.rollout.max_new_tokens, rollout_sequences=cfg.batch_size,
                              reference=algo.kl.needs_reference, critic=algo.critic if algo.name == "ppo" else None,
                              checkpointing=cfg.model.gradient_checkpointing, entropy=algo.entropy_coef > 0,
                              lora=(cfg.model.lora.r, cfg.model.lora.target_modules) if cfg.model.lora.enabled else None,
                              ewc=cfg.forgetting.ewc, fp32_residual=cfg.precision.fp32_residual, offload=cfg.optim.offload)
        print(f"model: {shape.params / 1e6:,.2f}M parameters ({f'--model-size {model_size}, a Llama-2 shape' if model_size else cfg.model.path}), "
              f"precision {mode}"
              f"{', 8-bit AdamW' if optim_8bit else ''}, micro-batch {micro}")
        if cfg.model.lora.enabled:
            print(f"LoRA r={cfg.model.lora.r} on {cfg.model.lora.target_modules}: weights, gradients and optimizer are the adapters'; "
                  "the base is frozen_base; the reference is the base with the adapters off (no copy)")
        _print_components(mem)
        n = gpus_needed(mem, gpu_mem_gb)
        print(f"GPUs of {gpu_mem_gb:g} GB: {n if n is not None else 'does not fit (activations or KV cache alone exceed one GPU: lower train.micro_batch_size or rollout.prompts_per_step)'}"
              f"{' (states sharded FSDP/ZeRO-3 style)' if n and n > 1 else ''}")
        tps, per_step = tokens_per_s, cfg.batch_size * cfg.rollout.max_new_tokens
        per_step_from = f"{cfg.batch_size} completions x up to {cfg.rollout.max_new_tokens} new tokens"
        if calibrate or from_run:
            measured_in = from_run or _calibrate(config, list(set_), calibrate)
            tps, per_step = throughput_from_run(measured_in)
            per_step_from = (f"measured in {from_run}, that run's own workload and machine" if from_run
                             else f"measured in {calibrate} steps of this workload here")
            print(f"{per_step_from}: {tps:,.0f} generated tokens/s, {per_step:,.0f} tokens per step")
        if tps is None:
            print("hours and cost: pass --tokens-per-s, --calibrate N or --from-run RUN_DIR")
            return
        eff = efficiency if efficiency is not None else efficiency_for(shape.params)
        c = run_cost(steps=cfg.train.steps, tokens_per_step=per_step, tokens_per_s=tps, gpus=n or 1, price_per_gpu_hour=price, efficiency=eff)
        print(f"{cfg.train.steps} steps of the workload above x {per_step:,.0f} generated tokens per step ({per_step_from}) "
              f"at {tps:,.0f} tokens/s: {c['hours']:.3g} h wall, {c['gpu_hours']:.3g} GPU-h, cost {c['cost']:,.2f} "
              f"(= {price:g}/GPU-h × {c['gpu_hours']:.3g} GPU-h / efficiency {eff:g})")
        if not math.isfinite(c["cost"]):
            raise ScaleRLError("cost: not finite; check --tokens-per-s")

    setup_logging()
    run_guarded(go, debug)
