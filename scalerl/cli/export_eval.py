"""`scalerl export` (a run's policy as a deployable folder) and `scalerl eval` (a pass rate with its interval)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from scalerl.cli.common import run_guarded, setup_logging


def export(
    run_dir: Path = typer.Argument(..., help="A run folder of `scalerl train` (its newest intact checkpoint) or one checkpoint folder."),  # noqa: B008 (typer)
    out: Path = typer.Option(..., "--out", "-o", help="The folder to write (loadable with AutoModelForCausalLM.from_pretrained)."),  # noqa: B008
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32: the dtype of the saved weights."),
    quantize: str | None = typer.Option(None, "--quantize", help="nf4: the Linear layers' weights in 4-bit NormalFloat through "
                                        "bitsandbytes (needs bitsandbytes and accelerate); embeddings and LM head stay in --dtype."),
    merge_lora: bool = typer.Option(False, "--merge-lora", help="A LoRA run (model.lora): merge the adapters into the base weights "
                                    "and write a plain model; without it a LoRA run exports its adapter folder (base named inside)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out folder."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Export a run's policy: safetensors in --dtype (or nf4), config, tokenizer, generation config with the run's EOS."""

    def go() -> None:
        from scalerl.jobs.export import export_model

        folder = export_model(run_dir, out, dtype, quantize=quantize, merge_lora=merge_lora, overwrite=overwrite,
                              warn=lambda line: print(line, file=sys.stderr))
        print(f"exported {folder} as {dtype}{f' ({quantize})' if quantize else ''}{' (LoRA merged)' if merge_lora else ''} to {out}")

    setup_logging()
    run_guarded(go, debug)


def evaluate(
    model: str = typer.Argument(..., help="A model folder, 'builtin', a run folder (its newest intact checkpoint) or a checkpoint folder."),
    env: str | None = typer.Option(None, "--env", help="Environment (default: the run's, else arithmetic)."),
    samples: int = typer.Option(1, "--samples", "-k", min=1, help="Completions per task: the pass rate is their mean (mean@k)."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help="Default: 0 (greedy) with -k 1, else 1.0."),
    max_tasks: int | None = typer.Option(None, "--max-tasks", min=1, help="Evaluate on at most this many held-out tasks."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="Default: the run's rollout.max_new_tokens."),
    seed: int = typer.Option(0, "--seed", help="Seeds of sampled completions: derived from (seed, task)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the result as JSON here."),  # noqa: B008
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Held-out pass rate (mean@k) of a model or run on an environment, with a 95 % confidence interval."""

    def go() -> None:
        from scalerl.jobs.evaluate import run_eval

        result = run_eval(model, env, samples, temperature, max_tasks, max_new_tokens, seed)
        label = "pass rate" if result["scored_by"] == "verifier" else "mean reward"  # a reward's scores are no pass rate
        print(f"{label} {result['pass_rate']:.4f} (95 % CI {result['ci95'][0]:.4f}-{result['ci95'][1]:.4f}) over "
              f"{result['tasks']} tasks x {samples} samples, env {result['env']}, {result['model']}"
              + ("" if result["scored_by"] == "verifier" else f", scored by {result['scored_by']} (the mean reward)"))
        if json_out is not None:
            json_out.write_text(json.dumps(result, indent=1))

    setup_logging()
    run_guarded(go, debug)
