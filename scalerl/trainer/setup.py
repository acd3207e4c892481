"""Build the training job: the run folder checked before anything loads, then the two roles around one policy.

    build_roles → the rollout side (scalerl/rollout/build.py: a RolloutWorker, or an AsyncRollout whose
                  producer is a process or a Ray actor) and the learner (scalerl/learner/build.py)
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml

from scalerl.config import Config, dump_config
from scalerl.config.resume import check_resume
from scalerl.distributed.context import DistContext, seed_everything, set_threads
from scalerl.distributed.pair_link import check_transport
from scalerl.errors import ScaleRLError
from scalerl.files import write_atomically
from scalerl.learner.build import build_forgetting, build_learner
from scalerl.learner.learner import LearnerSide
from scalerl.models.build import build_policy
from scalerl.models.loading import attention_choice, attention_used, load_tokenizer
from scalerl.models.paths import resolve_model_path
from scalerl.precision.apply import check_precision
from scalerl.precision.probe import (
    MARGIN,
    cache_path,
    choose_mode,
    cpu_rates,
    cpu_step_times,
    probe_shape,
    slower_warning,
)
from scalerl.rollout.async_rollout import AsyncRollout, ProducerProcess
from scalerl.rollout.base import RolloutSide
from scalerl.rollout.build import build_rollout
from scalerl.rollout.chat import prompt_format
from scalerl.rollout.static_decode import decode_path
from scalerl.trainer.run_lock import LOCK_FILE, RunLock
from scalerl.trainer.step import publish_weights
from scalerl.trainer.step_probe import precision_step_probe

log = logging.getLogger(__name__)


def check_offload(config: Config, device: torch.device) -> None:
    if config.optim.offload and device.type == "cpu":
        log.warning("optim.offload=true saves nothing on CPU (optimizer states live in host memory either way); the offloaded "
                    "AdamW runs all the same, with one copy of the weights and gradients per update")


def resolve_precision(config: Config, ctx: DistContext) -> tuple[Config, str | None, str | None]:
    """(the config with precision.mode=auto replaced by this device's choice, why it was chosen, a warning): the
    choice by scalerl/precision/probe.py, every rank taking rank 0's; the warning for an explicit bf16 mode that
    this CPU runs slower than fp32. Both go on the learner's start lines."""
    mode = config.precision.mode
    if ctx.device.type == "cuda":
        if mode != "auto":
            return config, None, None
        chosen, why = choose_mode(ctx.device, None, torch.cuda.get_device_capability(ctx.device))
    else:
        if mode not in ("auto", "standard", "compressed"):
            return config, None, None
        model = model_config(config)
        announce = _probe_announcer(ctx) if mode == "auto" else None
        rates = cpu_rates(probe_shape(*model_widths(model)), announce=announce)
        if mode != "auto":  # the step's probe only where an earlier start cached it: an explicit mode measures no step
            cached = None
            if rates.bf16 >= rates.fp32 and model is not None and ctx.world_size == 1:
                cached = cpu_step_times(precision_step_probe(config, model, ctx.device, rates.fp32)[0], lambda: None)
            return config, None, slower_warning(mode, rates, cached)
        step = None  # where bf16's matmul is faster, one process times the run's own step (several: the matmul decides)
        if rates.speedup >= MARGIN and model is not None and ctx.world_size == 1:
            step = cpu_step_times(*precision_step_probe(config, model, ctx.device, rates.fp32), announce=announce)
        chosen, why = choose_mode(ctx.device, rates, step=step)
    chosen, why = ctx.gather_lists([(chosen, why)])[0]  # one choice for every rank: rank 0's
    return config.with_precision_mode(chosen), f"precision.mode=auto: {why}", None


def _probe_announcer(ctx: DistContext) -> Callable[[], None]:
    """One line on rank 0 before precision.mode=auto first measures (a machine's first run of a shape waits 5-30 s on
    the probe, silent otherwise); nothing where everything it needs is cached."""
    said = []

    def announce() -> None:
        if ctx.is_main and not said:
            said.append(True)
            print(f"precision.mode=auto: timing bf16 against fp32 on this machine (matmuls, then this run's step where "
                  f"bf16's matmuls are faster: seconds, once; cached in {cache_path()})", file=sys.stderr, flush=True)
    return announce


def model_config(config: Config) -> dict | None:
    """The policy's config.json as a dict, for the precision probes; None where it cannot be read (a hub id not yet
    downloaded: the load that follows reports that)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(resolve_model_path(config.model.path), trust_remote_code=config.model.trust_remote_code).to_dict()
    except (OSError, ValueError):
        return None


def model_widths(model: dict | None) -> tuple[int, int]:
    """(hidden, MLP width) of the policy for the matmul probe; 2048² where its config could not be read."""
    hidden = (model or {}).get("hidden_size") or 2048
    return hidden, (model or {}).get("intermediate_size") or 4 * hidden


def check_run_dir(config: Config, resume: bool, overwrite: bool = False, lock: RunLock | None = None) -> Path:
    """Where the run goes, checked before anything loads (and nothing written but the `lock`, taken first so that two
    runs on one name cannot both pass these checks): a new run refuses a folder that holds a run (anything beside a
    config.yaml and resolved.yaml) unless `overwrite`; a resume needs the run there and may change only what can change
    mid-run (`check_resume`)."""
    if resume and config.log.name is None:
        raise ScaleRLError("--resume needs the run's name: add --name NAME (or set log.name)")
    name = config.log.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = config.log.run_dir / name
    if lock is not None:
        lock.take(run_dir)
    if resume:
        check_resume(config, run_dir)
        return run_dir
    held = [p.name for p in run_dir.iterdir() if p.name not in ("config.yaml", RESOLVED_FILE, LOCK_FILE)] if run_dir.is_dir() else []
    if held and not overwrite:
        raise ScaleRLError(f"log.name: {run_dir} already holds a run ({', '.join(sorted(held)[:3])}); continue it with --resume, "
                           "replace it with --overwrite, or choose another --name")
    return run_dir


RESOLVED_FILE = "resolved.yaml"
RESOLVED_HEADER = ("# What this run ran with where config.yaml leaves the choice to the machine, written once the model loaded\n"
                   "# (by the latest start: a resume rewrites it). config.yaml keeps what was asked for.\n")


def what_ran(config: Config, ctx: DistContext, policy: torch.nn.Module, precision: str | None = None) -> dict[str, Any]:
    """The resolved.yaml tree: the attention implementation the loaded policy runs (and why, when it
    is not the requested one), how the HF engine decodes (rollout.decode), the precision mode (and, from
    `resolve_precision`, why), the device and the number of processes."""
    requested = config.model.attn_implementation
    used = attention_used(policy, requested)
    model: dict[str, Any] = {"attn_implementation": used, "attn_implementation_requested": requested}
    if used != requested:
        model["attn_implementation_fallback"] = attention_choice(requested, ctx.device)[1] or f"transformers loaded {used}"
    ran: dict[str, Any] = {"model": model, "train": {"device": str(ctx.device), "world_size": ctx.world_size}}
    if config.rollout.engine == "hf":
        ran["rollout"] = {"decode": decode_path(policy, config.rollout.decode)}
    if precision:
        ran["precision"] = {"mode": config.precision.mode, "why": precision}
    return ran


def prepare_run_dir(config: Config, ctx: DistContext, run_dir: Path, resume: bool, ran: dict[str, Any] | None = None) -> None:
    """A new run: empty the folder (`check_run_dir` allowed it), write the resolved config (a fallback
    from the requested attention implementation noted on its line). Either way, once the model has
    loaded: resolved.yaml with `ran` (`what_ran`), and a startup line for a fallback. A resume leaves
    config.yaml to be rewritten once its checkpoint has loaded."""
    model = (ran or {}).get("model", {})
    fallback = model.get("attn_implementation_fallback")
    if not resume:
        ctx.barrier()  # every rank has looked before rank 0 empties the folder
        if ctx.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            for path in run_dir.iterdir():  # all but the lock this run holds (scalerl/trainer/run_lock.py)
                if path.name != LOCK_FILE:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            text = dump_config(config)
            if fallback:
                line = f"  attn_implementation: {model['attn_implementation_requested']}\n"
                text = text.replace(line, f"{line[:-1]}  # ran as {model['attn_implementation']}: see {RESOLVED_FILE}\n", 1)
            (run_dir / "config.yaml").write_text(text)
    if ctx.is_main and ran is not None:
        write_atomically(run_dir / RESOLVED_FILE, RESOLVED_HEADER + yaml.safe_dump(ran, sort_keys=False, width=1000))
        if fallback:
            log.warning("model.attn_implementation=%s; the run records it in %s", fallback, run_dir / RESOLVED_FILE)
    if not resume:
        ctx.barrier()




def build_roles(config: Config, ctx: DistContext, resume: bool, overwrite: bool = False,
                producer: ProducerProcess | None = None, reward_funcs: Mapping[str, Callable] | None = None,
                lock: RunLock | None = None) -> tuple[RolloutSide, LearnerSide, Path]:
    """The rollout side and the learner around one policy (shared in this process), and the run directory.
    `producer`: where an async run's producer runs (default: a process spawned beside this one); `reward_funcs`:
    the Python API's reward callables, which only this process holds (so never with rollout.mode=async). `lock`:
    the run folder's lock, taken here by rank 0 (the caller releases it when the run ends)."""
    if reward_funcs and config.rollout.mode == "async":
        raise ScaleRLError("rollout.mode=async samples in another process, which cannot call the reward functions of this "
                           "script; use rollout.mode=sync, or name the functions as module:function")
    run_dir = check_run_dir(config, resume, overwrite, lock if ctx.is_main else None)  # first: a refused resume or reuse loads nothing
    set_threads(config.train.threads)
    seed_everything(config.train.seed + ctx.rank)
    asked = config  # config.yaml keeps what was asked for (precision.mode=auto); resolved.yaml what ran
    config, precision_why, precision_warning = resolve_precision(config, ctx)
    check_precision(config.precision_policy, ctx.device)
    check_offload(config, ctx.device)
    asynchronous = config.rollout.mode == "async"
    if asynchronous:
        check_transport(config.rollout.weight_transport, ctx.device, "learner")
    tokenizer = load_tokenizer(config.model)
    policy = build_policy(config, ctx.device)
    # only once the model loaded: a run that cannot start leaves nothing, and resolved.yaml says what it loaded
    prepare_run_dir(asked, ctx, run_dir, resume, what_ran(config, ctx, policy, precision_why))
    policy.train()
    prompts = prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer)
    learner = build_learner(config, ctx, policy, build_forgetting(config, ctx, policy, tokenizer, prompts),
                            (precision_why, precision_warning))
    # async: batches come from a producer process, with rollout.engine there; this worker only evaluates, on the
    # learner's own modules (the HF engine: nothing to sync, no second vLLM engine and KV cache in this process)
    rollout = build_rollout(config, ctx, run_dir, policy, tokenizer, learner.autocast,
                            gather=lambda: learner.parallel.gathered(learner.policy_forward), engine="hf" if asynchronous else None,
                            functions=reward_funcs, teacher=not asynchronous)  # async: the producer serves the teacher
    if asynchronous:
        rollout = AsyncRollout(rollout, config, run_dir, producer)
        publish_weights(rollout, learner)
    return rollout, learner, run_dir
