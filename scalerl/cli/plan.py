"""`scalerl plan PILOT_RUN ... --model-size|--model --gpus N`: step time, hours, GPU-hours and cost of a bigger run,
from short pilot runs (or, with no pilot, from the source's efficiency factors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer

from scalerl.cli.common import run_guarded, setup_logging


def _band(out: dict[str, Any], key: str, fmt: str) -> str:
    band = out["band"]
    return f" (band {format(band[key][0], fmt)}-{format(band[key][1], fmt)})" if band else ""


def print_plan(out: dict[str, Any]) -> None:
    if out["source"] == "pilot":
        print(f"fitted on {out['pilot_steps']} steps of {len(out['pilots'])} pilot run(s) ({', '.join(out['pilots'])}); "
              f"pilot models {', '.join(f'{p / 1e6:.3g}M' for p in out['pilot_params'])} parameters, mean step {out['pilot_step_s']:.3g} s")
    else:
        print(out["source"])
    units = "process(es) on CPU" if out.get("device") == "cpu" else "GPU(s)"
    print(f"target: {out['model']} ({_millions(out['params'])}M parameters), {out['gpus']} {units} on {out['nodes']} node(s)"
          f"{', ' + out['strategy'] if out.get('strategy') and out['gpus'] > 1 else ''}, {out['steps']} steps, "
          f"{out['completion_length']:.0f} new tokens per completion")
    print(f"step time: {out['step_s']:.4g} s{_band(out, 'step_s', '.4g')}")
    when = f"step 0, every {out['eval_every']} steps and the end" if out.get("eval_every") else "step 0 and the end"
    evals = f" (incl. {out['evals']} evaluations of {out['eval_s']:.3g} s: {when})" if out.get("evals") else ""
    print(f"hours: {out['hours']:.4g}{_band(out, 'hours', '.4g')}{evals}")
    print(f"GPU-hours: {out['gpu_hours']:.4g}{_band(out, 'gpu_hours', '.4g')}")
    print(f"cost: {out['cost']:,.2f} at {out['price_per_gpu_hour']:g} per GPU-hour{_band(out, 'cost', ',.2f')}")
    if "parts" in out:
        total = sum(out["parts"].values())
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(out["parts"].items(), key=lambda kv: -kv[1]) if v != 0)
        print(f"dominant term: {out['dominant']}; per step: {shares}")
        if out.get("achieved_tflops"):
            print(f"the target's update as probed: {out['achieved_tflops'] * 1e3:.3g} GFLOP/s of 6·P·T "
                  "(T: trained positions, padding included)")
    for note in out["notes"]:
        print(f"note: {note}")


def plan(
    pilots: List[Path] = typer.Argument(None, help="Pilot run folders written by `scalerl train` (several pool into one fit); none: "
                                                  "the source's efficiency factors."),
    model_size: Optional[str] = typer.Option(None, "--model-size", help="The target model: 7b, 13b or 70b (a Llama-2 shape)."),
    model: Optional[Path] = typer.Option(None, "--model", help="The target model: a folder with config.json (or the file itself)."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs (processes) of the planned run."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes they are spread over (must divide --gpus)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps of the planned run (default: the pilot's train.steps)."),
    completion_length: Optional[int] = typer.Option(None, "--completion-length", help="New tokens per completion (the batch's longest; "
                                                                                     "default: the pilots' mean of each batch's longest)."),
    price: float = typer.Option(2.0, "--price-per-gpu-hour", help="Price of one GPU-hour."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="none, ddp, fsdp2 or dynamic (default: the pilots' parallel.strategy)."),
    bandwidth_gbs: Optional[float] = typer.Option(None, "--bandwidth-gbs", help="Collective bandwidth per process, GB/s (default: "
                                                                              "measured in pilots of several processes)."),
    probe: bool = typer.Option(True, "--probe/--no-probe", help="Time the target's rollout and update on this machine (random "
                               "weights, the pilots' config; --gpus processes where it has the devices) and calibrate with the "
                               "pilots; --no-probe: price from the terms fitted on the pilots alone."),
    probe_rounds: int = typer.Option(2, "--probe-rounds", help="Probe rounds (pilots and target in turn, 3 timed iterations each)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="No pilot: the run's YAML (its batch and lengths)."),
    prompt_len: int = typer.Option(128, "--prompt-len", help="No pilot: prompt tokens per completion."),
    peak_tflops: float = typer.Option(989.0, "--peak-tflops", help="No pilot: peak TFLOP/s of one GPU (989: H100 bf16 dense)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Plan a run before launching it: step time, hours, GPU-hours and cost, each with a band, from short pilots."""

    def go() -> None:
        from scalerl.jobs import plan as job

        shape, name = job.target_shape(model_size, model)
        model_config = job.read_model_config(model) if model is not None else None
        common = dict(model=shape, model_name=name, gpus=gpus, nodes=nodes, steps=steps, completion_length=completion_length, price=price)
        if pilots:
            out = job.plan_from_pilots(list(pilots), strategy=strategy, bandwidth_gbs=bandwidth_gbs, model_config=model_config,
                                       probe=probe, probe_rounds=probe_rounds, **common)
        else:
            out = job.plan_without_pilot(prompt_len=prompt_len, peak_tflops=peak_tflops, config=config, **common)
        if as_json:
            print(json.dumps(out))
        else:
            print_plan(out)

    setup_logging()
    run_guarded(go, debug)


def _millions(params: float) -> str:
    """Parameters in millions as people write them: 6,738 or 1.06 (no exponent: 13,016, not 1.302e+04)."""
    m = params / 1e6
    return f"{m:,.0f}" if m >= 1000 else f"{m:.4g}"
