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


def _calibrate(config_path: Optional[Path], overrides: list[str], steps: int) -> Path:
    """Run `steps` real steps of the config (no evaluation, no checkpoint) in a temporary folder; its run dir."""
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    root = Path(tempfile.mkdtemp(prefix="scalerl_calibrate_"))
    cfg = load_config(config_path, overrides + [f"train.steps={steps}", "eval.every=0", "eval.max_tasks=1", "checkpoint.save_final=false",
                                                f"log.run_dir={root}", "log.name=calibrate", "log.console=none", "log.tensorboard=false"])
    return Path(train(cfg)["run_dir"])


def estimate(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The run's YAML overrides (model, batch shape, precision)."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key of the run's config (repeatable)."),
    model_size: Optional[str] = typer.Option(None, "--model-size", help="7b, 13b or 70b: a Llama-2 shape instead of the config's model."),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32, bf16 or fp8 (default: the config's train.precision)."),
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
        from scalerl.checks import check_config
        from scalerl.config import load_config
        from scalerl.predict.cost import efficiency_for, run_cost, throughput_from_run
        from scalerl.predict.memory import (
            GIB,
            MODEL_PRESETS,
            estimate_memory,
            gpus_needed,
            shape_of_model_path,
        )

        cfg = check_config(load_config(config, list(set_)))
        if model_size is not None and model_size.lower() not in MODEL_PRESETS:
            raise ScaleRLError(f"--model-size: {model_size!r} is not one of {', '.join(MODEL_PRESETS)}")
        shape = MODEL_PRESETS[model_size.lower()] if model_size else shape_of_model_path(cfg.model.path)
        micro = cfg.plan.micro_batch_size
        algo = cfg.algorithm
        mem = estimate_memory(shape, precision=precision or cfg.train.precision, optim_8bit=optim_8bit, micro_batch=micro,
                              prompt_len=prompt_len if prompt_len is not None else _prompt_len(cfg),
                              completion_len=cfg.rollout.max_new_tokens, rollout_sequences=cfg.batch_size,
                              reference=algo.kl.needs_reference, critic=algo.critic if algo.name == "ppo" else None,
                              checkpointing=cfg.model.gradient_checkpointing, entropy=algo.entropy_coef > 0)
        print(f"model: {shape.params / 1e6:,.2f}M parameters ({model_size or cfg.model.path}), precision {precision or cfg.train.precision}"
              f"{', 8-bit AdamW' if optim_8bit else ''}, micro-batch {micro}")
        for key in ("weights", "gradients", "optimizer", "activations", "kv_cache", "reference", "critic", "peak"):
            print(f"  {key:<12} {mem[key] / GIB:10.3f} GiB")
        n = gpus_needed(mem, gpu_mem_gb)
        print(f"GPUs of {gpu_mem_gb:g} GB: {n if n is not None else 'does not fit (activations or KV cache alone exceed one GPU: lower train.micro_batch_size or rollout.prompts_per_step)'}"
              f"{' (states sharded FSDP/ZeRO-3 style)' if n and n > 1 else ''}")
        tps, per_step = tokens_per_s, cfg.batch_size * cfg.rollout.max_new_tokens
        if calibrate or from_run:
            tps, per_step = throughput_from_run(from_run or _calibrate(config, list(set_), calibrate))
            print(f"measured: {tps:,.0f} generated tokens/s, {per_step:,.0f} tokens per step")
        if tps is None:
            print("hours and cost: pass --tokens-per-s, --calibrate N or --from-run RUN_DIR")
            return
        eff = efficiency if efficiency is not None else efficiency_for(shape.params)
        c = run_cost(steps=cfg.train.steps, tokens_per_step=per_step, tokens_per_s=tps, gpus=n or 1, price_per_gpu_hour=price, efficiency=eff)
        print(f"{cfg.train.steps} steps: {c['hours']:.3g} h wall, {c['gpu_hours']:.3g} GPU-h, cost {c['cost']:,.2f} "
              f"(= {price:g}/GPU-h × {c['gpu_hours']:.3g} GPU-h / efficiency {eff:g})")
        if not math.isfinite(c["cost"]):
            raise ScaleRLError("cost: not finite; check --tokens-per-s")

    setup_logging()
    run_guarded(go, debug)
