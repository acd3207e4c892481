"""`scalerl estimate`: memory per component, GPUs needed, hours and cost of a run, before launching it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import typer

from scalerl.cli.common import run_guarded, setup_logging
from scalerl.errors import ScaleRLError


def _print_components(mem: dict[str, float]) -> None:
    from scalerl.predict.memory import GIB

    for key in ("weights", "gradients", "optimizer", "error_feedback", "frozen_base", "ewc", "working_copy", "activations",
                "backward_transient", "kv_cache", "optimizer_step", "reference", "critic", "peak"):
        print(f"  {key:<18} {mem[key] / GIB:10.3f} GiB")
    if mem["host"]:
        offload = mem["host"] - mem["restore_point"]
        parts = [*([f"optim.offload's moments and the host copies it steps on, {offload / GIB:.3f}"] if offload else []),
                 *([f"health.nonfinite's restore point (a copy of the trained weights and optimizer state), {mem['restore_point'] / GIB:.3f}"]
                   if mem["restore_point"] else [])]
        print(f"  host memory        {mem['host'] / GIB:10.3f} GiB ({'; '.join(parts)})")


def estimate(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The run's YAML overrides (model, batch shape, precision)."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key of the run's config (repeatable)."),
    model_size: Optional[str] = typer.Option(None, "--model-size", help="7b, 13b or 70b: a Llama-2 shape instead of the config's model."),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32, standard, aggressive or compressed (default: the config's precision.mode; the older bf16 and fp8 mean standard and aggressive)."),
    optim_8bit: bool = typer.Option(False, "--optim-8bit", help="8-bit AdamW states (1 byte per moment)."),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="Prompt tokens (default: the longest of the environment's first 256 prompts)."),
    gpu_mem_gb: float = typer.Option(80.0, "--gpu-mem-gb", help="Memory of one GPU, GB."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="Answer for this many GPUs: the memory of each under the run's "
                                       "parallel.strategy (fsdp2 shards the states; ddp, dynamic and none replicate them), and the cost."),
    price: float = typer.Option(2.0, "--price-per-gpu-hour", help="Price of one GPU-hour."),
    efficiency: Optional[float] = typer.Option(None, "--efficiency", help="Efficiency factor (default: the source's 0.85 / 0.72 / 0.53 by size)."),
    tokens_per_s: Optional[float] = typer.Option(None, "--tokens-per-s", help="Generated tokens per second per process, if known."),
    calibrate: int = typer.Option(0, "--calibrate", help="Run N real steps of the config here and measure tokens/s."),
    from_run: Optional[Path] = typer.Option(None, "--from-run", help="Read tokens/s from this run directory's metrics."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Memory per component (weights, gradients, AdamW, activations, KV cache, reference, critic), GPUs, hours, cost."""

    def go() -> None:
        from scalerl.jobs import estimate as job
        from scalerl.predict.memory import GIB, gpus_needed, per_gpu_bytes

        overrides = list(set_) + ([job.precision_override(precision)] if precision else [])
        cfg = job.load_checked(config, overrides, model_size)  # --precision is --set precision.mode: the mode's defaults apply
        shape = job.model_shape(cfg, model_size)
        micro = cfg.plan.micro_batch_size
        prompt_tokens, prompt_from = job.prompt_tokens(cfg, prompt_len)
        for line in job.describe_workload(cfg, job.workload_sources(config, overrides), prompt_tokens, prompt_from):
            print(line)
        mode = "fp32" if cfg.precision.mode == "auto" else cfg.precision.mode  # auto: fp32 or standard by the device; fp32's is the larger
        mem = job.component_memory(cfg, shape, mode, optim_8bit, prompt_tokens)
        print(f"model: {shape.params / 1e6:,.2f}M parameters ({f'--model-size {model_size}, a Llama-2 shape' if model_size else cfg.model.path}), "
              f"precision {mode}{' (precision.mode=auto, estimated as fp32)' if cfg.precision.mode == 'auto' else ''}"
              f"{', 8-bit AdamW' if optim_8bit else ''}, micro-batch {micro}")
        if cfg.model.lora.enabled:
            print(f"LoRA r={cfg.model.lora.r} on {cfg.model.lora.target_modules}: weights, gradients and optimizer are the adapters'; "
                  "the base is frozen_base; the reference is the base with the adapters off (no copy)")
        _print_components(mem)
        n = gpus_needed(mem, gpu_mem_gb)
        print(f"GPUs of {gpu_mem_gb:g} GB: {n if n is not None else 'does not fit (activations or KV cache alone exceed one GPU: lower train.micro_batch_size or rollout.prompts_per_step)'}"
              f"{' (states sharded FSDP/ZeRO-3 style)' if n and n > 1 else ''}")
        if gpus is not None:
            n = gpus
            per_gpu = per_gpu_bytes(mem, gpus, cfg.parallel.strategy)
            fits = "fits" if per_gpu <= 0.9 * gpu_mem_gb * GIB else "does not fit (90 % usable)"
            print(f"per GPU with {gpus} GPU{'s' if gpus > 1 else ''} (parallel.strategy={cfg.parallel.strategy}): "
                  f"{per_gpu / GIB:.3f} GiB; {fits} in {gpu_mem_gb:g} GB")
        tps, per_step, per_step_from, measured = job.throughput(cfg, config, overrides, tokens_per_s, calibrate, from_run)
        if measured:
            print(f"{per_step_from}: {tps:,.0f} generated tokens/s, {per_step:,.0f} tokens per step")
        if tps is None:
            print("hours and cost: pass --tokens-per-s, --calibrate N or --from-run RUN_DIR")
            return
        c, eff = job.price_run(cfg, shape, per_step, tps, n or 1, price, efficiency)
        print(f"{cfg.train.steps} steps of the workload above x {per_step:,.0f} generated tokens per step ({per_step_from}) "
              f"at {tps:,.0f} tokens/s: {c['hours']:.3g} h wall, {c['gpu_hours']:.3g} GPU-h, cost {c['cost']:,.2f} "
              f"(= {price:g}/GPU-h × {c['gpu_hours']:.3g} GPU-h / efficiency {eff:g})")
        if not math.isfinite(c["cost"]):
            raise ScaleRLError("cost: not finite; check --tokens-per-s")

    setup_logging()
    run_guarded(go, debug)
