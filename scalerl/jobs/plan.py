"""`scalerl plan`: the step time, hours, GPU-hours and cost of a run not yet launched, from short pilots.

With pilots, the target shape is the target model, the pilots' work per process (completions,
prompt positions) with the completion length of --completion-length, --gpus processes under the
pilots' strategy (or --strategy). Its step is priced

- by probes (default, `_probed`): the target's rollout and update timed on this machine with the
  run's own code (scalerl/jobs/probe.py), plus the pilots' loop around them (each pilot's measured
  phases minus its own probe); where the target cannot be probed here (`probe_unavailable`) or with
  `probe=False`,
- by terms fitted on the pilots' recorded steps (`scalerl.predict.pilot`) pooled into one `ShapeCost`
  (`scalerl.predict.step_cost`, the model the live time estimate uses), evaluated at the target shape.

Total time = steps × step time + evaluations (the pilots' mean evaluation time, scaled by the
target's generation time per step over the pilots'; one at step 0, then on the pilots' eval.every
and at the end). Cost = price × GPU-hours: the pilot measured this machine's efficiency, so no
factor is applied. Each figure has a band (`relative_band`: the pilots' scatter, misfit and drift,
and the target probe's scatter).

Without a pilot: the source's rule (seed 000 §4.3): the step's ideal FLOPs (6·P·T + 2·P·S) at
--peak-tflops × the efficiency factor of the model's size class (7B 0.85, 13B 0.72, 70B 0.53),
labelled as such, with no band.
"""

from __future__ import annotations

import os
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
    return ModelShape.from_hf_config(read_model_config(model), str(model)), str(model)


def read_model_config(model: Path) -> dict[str, Any]:
    """--model's config.json (a folder or the file itself) as a dict."""
    import json

    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ScaleRLError(f"--model: {model} is not a model folder with config.json (or a config.json); for a Llama-2 shape use --model-size")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ScaleRLError(f"--model: {path} is not JSON ({err})") from None


def llama_config(shape) -> dict[str, Any]:
    """A Llama's HF config with `shape`'s dimensions (a --model-size preset has no config.json): what the probe builds."""
    return {"model_type": "llama", "vocab_size": shape.vocab, "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim, "tie_word_embeddings": shape.tie_embeddings, "max_position_embeddings": 4096}


def _model_config(path: str) -> dict[str, Any]:
    from scalerl.models.paths import resolve_model_path

    return read_model_config(Path(resolve_model_path(path)))


def probe_unavailable(pilots, target, model) -> str | None:
    """Why the target cannot be probed on this machine (None: it can): the pilots ran on a device this machine
    does not have, sampled with vLLM or asynchronously (the probe runs the HF engine, sampling then learning), trained PPO
    with a separate critic model (loaded from a checkpoint), or the target's weights, gradients and AdamW moments (16 bytes a parameter, a 1/world share
    under FSDP2) would take over half of a GPU's free memory, or of the host's for all its CPU processes."""
    import torch

    device = pilots[-1].device
    if device == "cuda" and not torch.cuda.is_available():
        return "the pilots ran on cuda and this machine has no GPU"
    if any(p.config.rollout.engine != "hf" for p in pilots):
        return "a pilot sampled with vLLM; the probe times the HF engine"
    if any(p.config.algorithm.name == "ppo" and p.config.algorithm.critic == "separate" for p in pilots):
        return "a pilot trained PPO with a separate critic model, which the probe would load from the pilot's own checkpoint"
    if any(p.config.rollout.mode != "sync" for p in pilots):
        return "a pilot ran rollout.mode=async, where sampling overlaps learning; the probe times them in turn"
    per_process = 16.0 * model.params / (target.world if target.strategy == "fsdp2" else 1)
    if device == "cuda":
        need, free = per_process, torch.cuda.mem_get_info()[0]
    else:
        need, free = per_process * target.world, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > 0.5 * free:
        return f"the target's weights, gradients and moments (~{need / 1e9:.3g} GB) exceed half of the free memory ({free / 1e9:.3g} GB)"
    return None


def _probe_specs(pilots, target, model_config: dict[str, Any], world: int):
    """ProbeSpecs of every pilot (its config with the precision that ran, its model, its typical shape) and of the target
    (the last pilot's config with the target's strategy and length, the target model, `world` processes)."""
    from scalerl.config.load import dump_config, with_overrides
    from scalerl.jobs.probe import ProbeSpec

    def spec(pilot, shape, model: dict[str, Any], world: int, strategy: str) -> ProbeSpec:
        cfg = with_overrides(pilot.config, {"precision.mode": pilot.mode, "parallel.strategy": strategy, "train.device": pilot.device})
        prompt = max(round(shape.trained / max(shape.completions, 1e-12) - shape.decode_steps), 1)
        return ProbeSpec(config=dump_config(cfg), model=model, prompt_len=prompt, new_tokens=max(round(shape.decode_steps), 1), world=world)

    pilot_specs = [spec(p, p.typical(), _model_config(p.model_path), p.shapes[-1].world, p.config.parallel.strategy) for p in pilots]
    # the target's prompt is the last pilot's (as `plan_from_pilots` sets it), rounded as that pilot's spec rounds it
    return pilot_specs, replace(spec(pilots[-1], target, model_config, world, target.strategy), prompt_len=pilot_specs[-1].prompt_len)


def _check_positions(model_config: dict[str, Any] | None, model_name: str, prompt: float, length: float) -> None:
    """The target's prompt and completion must fit its positions, as `scalerl train` checks before it starts."""
    from scalerl.models.paths import max_positions

    limit = max_positions(model_config or {})
    if limit is not None and prompt + length > limit:
        raise ScaleRLError(f"--completion-length {length:g}: the target model ({model_name}) has {limit} positions for the prompt "
                           f"({prompt:.0f} tokens in the pilots) and the completion together; give at most {int(limit - prompt)}")


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


def _fitted(pilots, shapes, base, target, ref, *, bandwidth_gbs: float | None):
    """The terms fitted on the pilots' steps (`fit_shape_cost`): (parts at the target, at the pilots' typical
    shape, predicted pilot steps, notes)."""
    from scalerl.predict.step_cost import BALANCE_ROWS, fit_shape_cost

    balance = BALANCE_ROWS.get(ref.device, BALANCE_ROWS["cpu"])
    compute_bound = base.completions >= balance
    measured_comm = any(s.world > 1 for s in shapes)
    if target.world > 1 and not measured_comm and bandwidth_gbs is None:
        raise ScaleRLError(f"--gpus {target.world}: every pilot ran one process, so the communication has no measured bandwidth; pass "
                           "--bandwidth-gbs (the collective's bandwidth per process, GB/s) or add a pilot run with --nproc 2")
    kv_measured = [k for p in pilots for k in p.kv_s_per_byte]
    cost = fit_shape_cost(shapes, np.concatenate([p.rollout_s for p in pilots]), np.concatenate([p.learn_s for p in pilots]),
                          np.concatenate([p.other_s for p in pilots]), compute_bound=compute_bound,
                          bandwidth=None if measured_comm and bandwidth_gbs is None else (bandwidth_gbs or 1.0) * 1e9,
                          kv_s_per_byte=max(float(np.mean(kv_measured)), 0.0) if kv_measured else None)
    notes = [f"left out of the fit (the pilots do not vary it apart from the others): {', '.join(cost.left_out)}"] if cost.left_out else []
    notes.append(f"generation taken as {'compute' if compute_bound else 'memory'}-bound: {base.completions:.0f} rows per decode "
                 f"step {'>=' if compute_bound else '<'} {balance} on {ref.device}")
    flops = cost.achieved_flops
    if flops:
        notes.append(f"achieved training rate in the pilots: {flops / 1e9:.3g} GFLOP/s of 6·P·T (T: trained positions, padding included)")
    return cost.parts(target), cost.parts(base), np.array([cost.seconds(s) for s in shapes]), notes


PROBED = ("rollout (probed: sampling)", "learning (probed: the update)", "the loop around them (pilots: measured minus probed)")


def _probed(pilots, target, model_config: dict[str, Any], *, nodes: int, rounds: int, bandwidth_gbs: float | None):
    """The target's step from probes (scalerl/jobs/probe.py): the target's rollout and update timed on this machine,
    plus what the pilots spend outside them (each pilot's measured phases minus its own probe, the mean over pilots;
    negative where the probes ran slower than the pilots did, the machine's drift between them: at the pilots' own shape
    the plan is then their measured step). Several processes are probed as such where this machine has a device for
    each and the run is on one node; otherwise one process is, and the communication is priced by bytes.
    Returns (parts at the target, at the last pilot, predicted pilot steps, the probe's relative scatter, notes, the
    probes' record)."""
    import torch

    from scalerl.jobs.probe import probe_alternated
    from scalerl.predict.step_cost import comm_bytes

    device = pilots[-1].device
    local = torch.cuda.device_count() if device == "cuda" else os.cpu_count() or 1
    world = target.world if target.world <= local and nodes == 1 else 1
    pilot_specs, target_spec = _probe_specs(pilots, target, model_config, world)
    results = probe_alternated([*pilot_specs, target_spec], rounds=rounds)
    at_pilots, at_target = results[:-1], results[-1]
    loop_r = float(np.mean([np.mean(p.rollout_s) - r.rollout for p, r in zip(pilots, at_pilots)]))
    loop_l = float(np.mean([np.mean(p.learn_s) - r.learn for p, r in zip(pilots, at_pilots)]))
    other = float(np.mean(np.concatenate([p.other_s for p in pilots])))
    notes = [f"probed on this machine ({device}, {world} process{'es' if world > 1 else ''}): the target's rollout "
             f"{at_target.rollout:.4g} s and update {at_target.learn:.4g} s; the pilots' own probes "
             + ", ".join(f"{r.rollout + r.learn:.4g} s" for r in at_pilots) + " against their measured phases "
             + ", ".join(f"{np.mean(p.rollout_s) + np.mean(p.learn_s):.4g} s" for p in pilots)]
    comm = 0.0
    if world < target.world:
        if bandwidth_gbs is None:
            raise ScaleRLError(f"--gpus {target.world} --nodes {nodes}: this machine probes at most {local} processes on {device} on one "
                               "node, so the probe runs one and the communication is priced by bytes: pass --bandwidth-gbs (GB/s per process)")
        comm = comm_bytes(target) / (bandwidth_gbs * 1e9)
        notes.append(f"the probe ran 1 process (this machine: {local} {device} device(s), one node); communication priced as "
                     f"{comm_bytes(target) / 1e6:.4g} MB per step at {bandwidth_gbs:g} GB/s")

    def parts(r, comm_s: float = 0.0) -> dict[str, float]:
        return {PROBED[0]: r.rollout, PROBED[1]: r.learn, PROBED[2]: loop_r + loop_l, "communication": comm_s,
                "other (logging, health checks)": other}

    predicted = np.concatenate([[sum(parts(r).values())] * len(p.shapes) for p, r in zip(pilots, at_pilots)])
    record = {"target": at_target.record(), "pilots": [r.record() for r in at_pilots]}
    return parts(at_target, comm), parts(at_pilots[-1]), predicted, at_target.scatter(), notes, record


def plan_from_pilots(pilot_dirs: list[Path], *, model, model_name: str, gpus: int, nodes: int = 1, steps: int | None = None,
                     completion_length: int | None = None, price: float = 2.0, strategy: str | None = None,
                     bandwidth_gbs: float | None = None, model_config: dict[str, Any] | None = None, probe: bool = True,
                     probe_rounds: int = 2) -> dict[str, Any]:
    """The plan (see the module docstring) as a dict: figures, bands, the terms at the target and the dominant one.
    `model_config`: the target's HF config (default: a Llama of `model`'s shape), what the probe builds; `probe`
    False: price from the pilots' fitted terms alone."""
    from scalerl.predict.pilot import read_pilot
    from scalerl.predict.step_cost import relative_band
    from scalerl.predict.time_estimate import count_scheduled

    _check(gpus, nodes, steps, completion_length, price, strategy, bandwidth_gbs)
    if probe_rounds < 1:
        raise ScaleRLError(f"--probe-rounds: {probe_rounds} must be at least 1")
    pilots = [read_pilot(d) for d in pilot_dirs]
    shapes = [s for p in pilots for s in p.shapes]
    ref = pilots[-1]
    base = ref.typical()
    prompt = max(base.trained / base.completions - base.decode_steps, 0.0)
    length = float(completion_length) if completion_length is not None else base.decode_steps
    _check_positions(model_config, model_name, prompt, length)
    params = float(model.params)
    kv_bytes = 2.0 * model.layers * model.kv_heads * model.head_dim * base.weight_bytes  # as the pilot's (scalerl/predict/pilot.py)
    target = replace(base, params=params, hidden=model.hidden, layers=model.layers, world=gpus, decode_steps=length, kv_bytes=kv_bytes,
                     trained=base.completions * (prompt + length), strategy=strategy or base.strategy)
    measured = np.concatenate([p.step_s for p in pilots])
    why_not = probe_unavailable(pilots, target, model) if probe else "--no-probe"
    if why_not is None:
        at_target, at_base, predicted, scatter, notes, probe_record = _probed(pilots, target, model_config or llama_config(model), nodes=nodes,
                                                                              rounds=probe_rounds, bandwidth_gbs=bandwidth_gbs)
        gen = PROBED[:1]
    else:
        at_target, at_base, predicted, notes = _fitted(pilots, shapes, base, target, ref, bandwidth_gbs=bandwidth_gbs)
        scatter, probe_record = 0.0, None
        notes.insert(0, f"no probe ({why_not}): the step is priced by the terms fitted on the pilots")
        gen = ("generation compute (2·P·S FLOPs)", "generation memory (weight bytes × decode steps)", "generation per layer and decode step",
               "generation KV cache (bytes read)")
    rel = float(np.hypot(relative_band(predicted, measured, np.concatenate([[k] * len(p.shapes) for k, p in enumerate(pilots)])), scatter))
    n_steps = steps or ref.config.train.steps
    gen_ratio = sum(at_target[k] for k in gen) / max(sum(at_base[k] for k in gen), 1e-12)
    eval_s = float(np.mean([e for p in pilots for e in p.eval_s])) * gen_ratio if any(p.eval_s for p in pilots) else 0.0
    evals = 1 + count_scheduled(1, n_steps, ref.config.eval.every, include_last=True) if eval_s else 0
    step_s = max(sum(at_target.values()), 0.0)
    out = _figures(step_s, rel, n_steps, evals, eval_s, gpus, price)
    if not any(p.eval_s for p in pilots):
        notes.append("the pilots recorded no evaluation time (eval.every 0): evaluations are not priced")
    train_flops = 6 * params * target.trained / max(at_target.get(PROBED[1], 0.0), 1e-12) if why_not is None else None
    out.update(source="pilot", pilots=[str(p.run_dir) for p in pilots], pilot_steps=len(shapes), model=model_name, params=params,
               gpus=gpus, nodes=nodes, steps=n_steps, completion_length=length, strategy=target.strategy, evals=evals,
               eval_s=eval_s, parts=at_target, dominant=max(at_target, key=at_target.get), relative_band=rel, price_per_gpu_hour=price,
               achieved_tflops=train_flops / 1e12 if train_flops else None, pilot_params=sorted({s.params for s in shapes}),
               pilot_step_s=float(measured.mean()), probed=why_not is None, probe=probe_record, device=ref.device,
               eval_every=ref.config.eval.every, notes=notes)
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
