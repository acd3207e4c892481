"""`scalerl plan`: the step time, hours, GPU-hours and cost of a run not yet launched, from short pilots.

With pilots: their recorded steps (`scalerl.predict.pilot`) pooled into one `ShapeCost`
(`scalerl.predict.step_cost`, the model the live time estimate uses), evaluated at the target
shape: the target model's parameters, the pilots' work per process (completions, prompt positions)
with the completion length of --completion-length, --gpus processes under the pilots' strategy.
Total time = steps × step time + evaluations (the pilots' mean evaluation time, scaled by the
target's generation time per step over the pilots'; one at step 0, then on the pilots' eval.every
and at the end). Cost = price × GPU-hours: the pilot measured this machine's efficiency, so no
factor is applied. Each figure has a band (`relative_band`: the pilots' scatter, misfit and drift).

Without a pilot: the source's rule (seed 000 §4.3): the step's ideal FLOPs (6·P·T + 2·P·S) at
--peak-tflops × the efficiency factor of the model's size class (7B 0.85, 13B 0.72, 70B 0.53),
labelled as such, with no band.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.errors import ScaleRLError

STRATEGIES = ("none", "ddp", "fsdp2", "dynamic")


def target_shape(model_size: str | None, model: Path | None):
    """The target model's shape (`ModelShape`) and how it was named: a Llama-2 preset, or a model folder (or its config.json)."""
    from scalerl.predict.memory import MODEL_PRESETS, ModelShape

    if (model_size is None) == (model is None):
        raise ScaleRLError("plan: give the target model with exactly one of --model-size 7b|13b|70b and --model FOLDER")
    if model_size is not None:
        if model_size.lower() not in MODEL_PRESETS:
            raise ScaleRLError(f"--model-size: {model_size!r} is not one of {', '.join(MODEL_PRESETS)}; for another shape pass --model FOLDER")
        return MODEL_PRESETS[model_size.lower()], f"Llama-2 {model_size.lower()}"
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ScaleRLError(f"--model: {model} is not a model folder with config.json (or a config.json); for a Llama-2 shape use --model-size")
    import json

    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ScaleRLError(f"--model: {path} is not JSON ({err})") from None
    return ModelShape.from_hf_config(cfg, str(path)), str(model)


def _check(gpus: int, nodes: int, steps: int | None, completion_length: int | None, price: float, strategy: str | None,
           bandwidth_gbs: float | None) -> None:
    if gpus < 1 or nodes < 1 or gpus % nodes:
        raise ScaleRLError(f"--gpus {gpus} --nodes {nodes}: the GPUs must be a positive multiple of the nodes")
    for flag, value in (("--steps", steps), ("--completion-length", completion_length)):
        if value is not None and value < 1:
            raise ScaleRLError(f"{flag}: {value} must be at least 1")
    if price < 0:
        raise ScaleRLError(f"--price-per-gpu-hour: {price:g} must be >= 0")
    if strategy is not None and strategy not in STRATEGIES:
        raise ScaleRLError(f"--strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if bandwidth_gbs is not None and bandwidth_gbs <= 0:
        raise ScaleRLError(f"--bandwidth-gbs: {bandwidth_gbs:g} must be > 0")


def _figures(step_s: float, rel: float | None, steps: int, evals: int, eval_s: float, gpus: int, price: float) -> dict[str, Any]:
    """Hours, GPU-hours and cost of `steps` steps and `evals` evaluations, each with its band (± rel of the steps' part)."""
    def row(scale: float) -> dict[str, float]:
        seconds = steps * step_s * scale + evals * eval_s
        return {"step_s": step_s * scale, "total_s": seconds, "hours": seconds / 3600, "gpu_hours": seconds / 3600 * gpus,
                "cost": seconds / 3600 * gpus * price}

    point = row(1.0)
    if rel is None:
        return {**point, "band": None}
    lo, hi = row(max(1 - rel, 0.0)), row(1 + rel)
    return {**point, "band": {k: [lo[k], hi[k]] for k in point}}


def plan_from_pilots(pilot_dirs: list[Path], *, model, model_name: str, gpus: int, nodes: int = 1, steps: int | None = None,
                     completion_length: int | None = None, price: float = 2.0, strategy: str | None = None,
                     bandwidth_gbs: float | None = None) -> dict[str, Any]:
    """The plan (see the module docstring) as a dict: figures, bands, the terms at the target and the dominant one."""
    from scalerl.predict.pilot import read_pilot
    from scalerl.predict.step_cost import BALANCE_ROWS, fit_shape_cost, relative_band
    from scalerl.predict.time_estimate import count_scheduled

    _check(gpus, nodes, steps, completion_length, price, strategy, bandwidth_gbs)
    pilots = [read_pilot(d) for d in pilot_dirs]
    shapes = [s for p in pilots for s in p.shapes]
    ref = pilots[-1]
    base = ref.typical()
    balance = BALANCE_ROWS.get(ref.device, BALANCE_ROWS["cpu"])
    compute_bound = base.completions >= balance
    measured_comm = any(s.world > 1 for s in shapes)
    if gpus > 1 and not measured_comm and bandwidth_gbs is None:
        raise ScaleRLError(f"--gpus {gpus}: every pilot ran one process, so the communication has no measured bandwidth; pass "
                           "--bandwidth-gbs (the collective's bandwidth per process, GB/s) or add a pilot run with --nproc 2")
    kv_measured = [k for p in pilots for k in p.kv_s_per_byte]
    cost = fit_shape_cost(shapes, np.concatenate([p.rollout_s for p in pilots]), np.concatenate([p.learn_s for p in pilots]),
                          np.concatenate([p.other_s for p in pilots]), compute_bound=compute_bound,
                          bandwidth=None if measured_comm and bandwidth_gbs is None else (bandwidth_gbs or 1.0) * 1e9,
                          kv_s_per_byte=max(float(np.mean(kv_measured)), 0.0) if kv_measured else None)
    prompt = max(base.trained / base.completions - base.decode_steps, 0.0)
    length = float(completion_length) if completion_length is not None else base.decode_steps
    params = float(model.params)
    kv_bytes = 2.0 * model.layers * model.kv_heads * model.head_dim * base.weight_bytes  # as the pilot's (scalerl/predict/pilot.py)
    target = replace(base, params=params, hidden=model.hidden, layers=model.layers, world=gpus, decode_steps=length, kv_bytes=kv_bytes,
                     trained=base.completions * (prompt + length), strategy=strategy or base.strategy)
    measured = np.concatenate([p.step_s for p in pilots])
    predicted = np.array([cost.seconds(s) for s in shapes])
    rel = relative_band(predicted, measured, np.concatenate([[k] * len(p.shapes) for k, p in enumerate(pilots)]))
    parts = cost.parts(target)
    n_steps = steps or ref.config.train.steps
    gen = ("generation compute (2·P·S FLOPs)", "generation memory (weight bytes × decode steps)", "generation per layer and decode step",
           "generation KV cache (bytes read)")
    gen_ratio = sum(parts[k] for k in gen) / max(sum(cost.parts(base)[k] for k in gen), 1e-12)
    eval_s = float(np.mean([e for p in pilots for e in p.eval_s])) * gen_ratio if any(p.eval_s for p in pilots) else 0.0
    evals = 1 + count_scheduled(1, n_steps, ref.config.eval.every, include_last=True) if eval_s else 0
    out = _figures(cost.seconds(target), rel, n_steps, evals, eval_s, gpus, price)
    notes = [f"left out of the fit (the pilots do not vary it apart from the others): {', '.join(cost.left_out)}"] if cost.left_out else []
    if not any(p.eval_s for p in pilots):
        notes.append("the pilots recorded no evaluation time (eval.every 0): evaluations are not priced")
    notes.append(f"generation taken as {'compute' if compute_bound else 'memory'}-bound: {base.completions:.0f} rows per decode "
                 f"step {'>=' if compute_bound else '<'} {balance} on {ref.device}")
    flops = cost.achieved_flops
    out.update(source="pilot", pilots=[str(p.run_dir) for p in pilots], pilot_steps=len(shapes), model=model_name, params=params,
               gpus=gpus, nodes=nodes, steps=n_steps, completion_length=length, strategy=target.strategy, evals=evals,
               eval_s=eval_s, parts=parts, dominant=max(parts, key=parts.get), relative_band=rel, price_per_gpu_hour=price,
               achieved_tflops=flops / 1e12 if flops else None, pilot_params=sorted({s.params for s in shapes}),
               pilot_step_s=float(measured.mean()), notes=notes)
    return out


def plan_without_pilot(*, model, model_name: str, gpus: int, nodes: int = 1, steps: int | None = None,
                       completion_length: int | None = None, price: float = 2.0, prompt_len: int = 128, peak_tflops: float = 989.0,
                       config: Path | None = None) -> dict[str, Any]:
    """The source's efficiency-factor rule (see the module docstring), on the config's workload (default: the defaults')."""
    from scalerl.config import load_config
    from scalerl.predict.cost import efficiency_for

    _check(gpus, nodes, steps, completion_length, price, None, None)
    if peak_tflops <= 0:
        raise ScaleRLError(f"--peak-tflops: {peak_tflops:g} must be > 0")
    cfg = load_config(config)
    params = float(model.params)
    length = completion_length or cfg.rollout.max_new_tokens
    completions = cfg.batch_size
    flops = 6 * params * completions * (prompt_len + length) + 2 * params * completions * length
    eff = efficiency_for(params)
    step_s = flops / (peak_tflops * 1e12 * eff)
    n_steps = steps or cfg.train.steps
    out = _figures(step_s, None, n_steps, 0, 0.0, gpus, price)
    out.update(source=f"no pilot: the source's efficiency factor {eff:g} for the model's size class (7B 0.85, 13B 0.72, 70B 0.53) "
                      f"at {peak_tflops:g} TFLOP/s peak per GPU", model=model_name, params=params, gpus=gpus, nodes=nodes,
               steps=n_steps, completion_length=float(length), dominant="training compute (6·P·T FLOPs)", relative_band=None,
               price_per_gpu_hour=price, efficiency=eff,
               notes=[f"workload: {completions} completions per GPU and step, prompts of {prompt_len} tokens (--prompt-len), "
                      f"{length} new tokens; no band: nothing was measured"])
    return out
