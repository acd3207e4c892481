"""Time a step's heavy parts at a given shape on this machine, with the run's own code: what `scalerl plan` prices a
target with (scalerl/jobs/probe.py runs it in one or several processes) and what precision.mode=auto decides by
(scalerl/trainer/setup.py `resolve_precision`).

A probe builds the model from its config with random weights (no checkpoint is read), in the run's precision
mode, threads and parallel strategy, and times, after one warm-up, `repeats` rounds of

    rollout:  the HF sampler decoding prompts × group completions of exactly L new tokens from P-token prompts
              (random tokens; EOS masked for all L, so every row decodes L steps)
    learn:    the learner's `learn` on that batch (rewards alternating 0/1 within each group): advantages, the
              objective's forward (log-probs and entropy), backward, gradient sync, clipping, the AdamW step

(`build_learner`, `HFSampler`, the strategy's wrapping and gathers).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalerl.distributed.context import DistContext

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ProbeSpec:
    """One shape to time: `config` (the run's Config as a YAML string, with the precision mode that ran; its
    rollout.prompts_per_step × rollout.group_size completions per process), `model` (the model's HF config as a
    dict), the prompt and completion lengths and the processes."""

    config: str
    model: dict[str, Any] = field(hash=False)
    prompt_len: int
    new_tokens: int
    world: int = 1

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class ProbeResult:
    rollout_s: tuple[float, ...]  # each timed round's seconds
    learn_s: tuple[float, ...]
    sampled: int = 0  # positions the sampler decoded (completions × new tokens) and the learner ran (prompt + completion), per process
    trained: int = 0

    @property
    def rollout(self) -> float:
        return statistics.median(self.rollout_s)

    @property
    def learn(self) -> float:
        return statistics.median(self.learn_s)

    def record(self) -> dict[str, Any]:
        """What the plan reports of a probe: the medians and every round's seconds."""
        return {"rollout_s": self.rollout, "learn_s": self.learn, "rollout_rounds_s": list(self.rollout_s), "learn_rounds_s": list(self.learn_s)}

    def scatter(self) -> float:
        """Relative half-width (≈ 95 %) of the two medians' sum: the rounds' spread over their count."""
        total = [r + lr for r, lr in zip(self.rollout_s, self.learn_s)]
        if len(total) < 2:
            return 0.0
        return 2 * statistics.stdev(total) / statistics.mean(total) / len(total) ** 0.5


def _policy(config, model_cfg: dict[str, Any], device):
    """The policy as `build_policy` makes it, from a config instead of a checkpoint (random weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from scalerl.models.loading import attention_choice
    from scalerl.models.lora import apply_lora
    from scalerl.precision.apply import prepare_policy, weights_dtype

    cfg = AutoConfig.for_model(**model_cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=weights_dtype(config.precision_policy),
                                             attn_implementation=attention_choice(config.model.attn_implementation, device)[0])
    if config.model.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False
    model = model.to(device)
    prepare_policy(model, config.precision_policy, device)
    if config.model.lora.enabled:
        model = apply_lora(model, config.model.lora, config.model.gradient_checkpointing)
    return model


def run_probe(spec: ProbeSpec, repeats: int, ctx: DistContext | None = None) -> ProbeResult:
    """The probe in this process (rank of a torchrun group when WORLD_SIZE is set): see the module docstring. `ctx`: a
    context to run in (a run's own, or one process of it) instead of joining torchrun's group and leaving it after."""
    import torch

    from scalerl.config import load_config
    from scalerl.distributed.context import init_distributed, set_threads, shutdown
    from scalerl.learner.build import build_learner
    from scalerl.rollout.hf import HFSampler
    from scalerl.types import Rollout, SamplingParams, ScoredBatch

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.yaml").write_text(spec.config)
        config = load_config(Path(tmp) / "config.yaml")
    threads = torch.get_num_threads()
    set_threads(config.train.threads)
    own = ctx is None
    ctx = init_distributed(config.train.device) if own else ctx
    try:
        policy = _policy(config, spec.model, ctx.device)
        learner = build_learner(config, ctx, policy)
        eos = spec.model.get("eos_token_id")
        eos = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
        pad = spec.model.get("pad_token_id")
        sampler = HFSampler(policy, pad_id=eos if pad is None else pad, eos_id=eos, device=ctx.device, autocast=learner.autocast,
                            fp32_head=config.precision_policy.fp32_lm_head, gather=lambda: learner.parallel.gathered(learner.policy_forward))
        vocab = int(spec.model["vocab_size"])
        gen = torch.Generator().manual_seed(ctx.rank)
        ro = config.rollout
        prompts = [torch.randint(0, vocab, (spec.prompt_len,), generator=gen).tolist() for _ in range(ro.prompts_per_step)]
        params = SamplingParams(max_new_tokens=spec.new_tokens, min_new_tokens=spec.new_tokens, n=ro.group_size,
                                temperature=ro.temperature or 1.0, top_p=ro.top_p, top_k=ro.top_k)
        rows = ro.prompts_per_step * ro.group_size
        rewards = torch.tensor([float(i % 2) for i in range(rows)], device=ctx.device)
        rollout_s, learn_s = [], []
        for i in range(repeats + 1):
            if ctx.active:
                torch.distributed.barrier()
            start = time.perf_counter()
            rollout: Rollout = sampler.sample(prompts, params, seeds=[1000 * i + k for k in range(ro.prompts_per_step)])
            sampled = time.perf_counter()
            batch = ScoredBatch(rollout=rollout, rewards=rewards, task_rewards=rewards, policy_version=learner.version,
                                prompts=[""] * rows, completions=[""] * rows, generated_tokens=rows * spec.new_tokens)
            learner.learn(batch, i + 1)
            sampler.sync_weights(None, learner.version)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            done = time.perf_counter()
            if i:
                rollout_s.append(sampled - start)
                learn_s.append(done - sampled)
        learner.close()
        sampled, trained = rollout.completion_ids.numel(), rollout.prompt_ids.numel() + rollout.completion_ids.numel()
    finally:
        if own:
            shutdown(ctx)
        torch.set_num_threads(threads)
    return ProbeResult(tuple(rollout_s), tuple(learn_s), sampled, trained)


# precision.mode=auto's step probe (scalerl/precision/probe.py): the run's rows and options, a few layers, short lengths
STEP_PROBE_LAYERS = 2  # layers are alike: the bf16/fp32 ratio of two is that of all, at a fraction of the cost
STEP_PROBE_PROMPT = 16
STEP_PROBE_NEW_TOKENS = 8
# A probed step with this many seconds of matmuls at the matmul probe's fp32 rate is bound by its FLOPs, not by per-
# operator costs: the matmul probe's ratio holds for it, and the step probe (12 such steps) would cost seconds.
FLOP_BOUND_S = 0.25


# config.json keys that name or date a model rather than shape it: left out of the probe's cache key
NOT_SHAPE = ("_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "auto_map")


def precision_step_probe(config, model: dict[str, Any], device, fp32_gflops: float) -> tuple[str, Any]:
    """(shape key, measure) for precision.mode=auto's step probe: `measure()` times the run's step (`time_modes`, in a
    child process, so that neither the probe's memory nor its random draws stay in the run's) with `model`'s first
    STEP_PROBE_LAYERS layers, the run's rollout.prompts_per_step × rollout.group_size rows, a STEP_PROBE_PROMPT-token
    prompt and at most STEP_PROBE_NEW_TOKENS new tokens, in fp32 and in `standard` (bf16 autocast), and returns the
    fastest step of each; the rollout is left out where the run samples with vLLM. It returns None without probing
    where that step is FLOP-bound (FLOP_BOUND_S of matmuls at `fp32_gflops`, the matmul probe's rate; there the
    matmul's ratio is the step's) or where the child fails (the matmul decides then too)."""
    from scalerl.config.load import dump_config, with_overrides

    model = {**model, "num_hidden_layers": min(int(model.get("num_hidden_layers") or 1), STEP_PROBE_LAYERS)}
    new_tokens = min(config.rollout.max_new_tokens, STEP_PROBE_NEW_TOKENS)
    rows = config.rollout.prompts_per_step * config.rollout.group_size
    learn_only = config.rollout.engine != "hf"
    shape = (f"{json.dumps({k: v for k, v in model.items() if k not in NOT_SHAPE}, sort_keys=True, default=str)}"
             f"|rows {config.rollout.prompts_per_step}x{config.rollout.group_size}|prompt {STEP_PROBE_PROMPT}|new {new_tokens}"
             f"|lora {config.model.lora.enabled}|checkpointing {config.model.gradient_checkpointing}|{'learn' if learn_only else 'rollout+learn'}")

    def measure() -> tuple[float, float] | None:
        if 6 * _probe_params(model) * rows * (STEP_PROBE_PROMPT + new_tokens) / (fp32_gflops * 1e9) > FLOP_BOUND_S:
            return None
        specs = {mode: asdict(ProbeSpec(config=dump_config(with_overrides(config, {"precision.mode": mode, "parallel.strategy": "none",
                                                                                        "train.device": device.type})),
                                        model=model, prompt_len=STEP_PROBE_PROMPT, new_tokens=new_tokens))
                 for mode in ("fp32", "standard")}
        with tempfile.TemporaryDirectory() as tmp:
            job, out = Path(tmp) / "probe.json", Path(tmp) / "times.json"
            job.write_text(json.dumps({"specs": specs, "learn_only": learn_only, "device": str(device)}))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
            done = subprocess.run([sys.executable, "-m", "scalerl.trainer.step_probe", str(job), str(out)], capture_output=True, text=True,
                                  env=env, check=False)
            if done.returncode != 0 or not out.is_file():
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                log.warning("precision.mode=auto: the step probe failed (%s); the matmul probe decides", tail[:200])
                return None
            times = json.loads(out.read_text())
        return times["fp32"], times["standard"]

    return shape, measure


def time_modes(specs: dict[str, ProbeSpec], learn_only: bool, device) -> dict[str, float]:
    """The fastest probed step (rollout + learn, or learn alone) of each spec, in one process on `device`: the specs in
    turn, 2 rounds of a warm-up and 2 timed steps each (other processes only ever slow a step down)."""
    from scalerl.distributed.context import DistContext

    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=device)
    best = {mode: float("inf") for mode in specs}
    for _ in range(2):
        for mode, spec in specs.items():
            result = run_probe(spec, 2, ctx)
            steps = result.learn_s if learn_only else [r + lr for r, lr in zip(result.rollout_s, result.learn_s)]
            best[mode] = min(best[mode], *steps)
    return best


def main(argv: list[str]) -> None:
    """`python -m scalerl.trainer.step_probe JOB.json OUT.json`: `time_modes` of JOB's specs, written to OUT."""
    import torch

    job = json.loads(Path(argv[0]).read_text())
    specs = {mode: ProbeSpec(**spec) for mode, spec in job["specs"].items()}
    Path(argv[1]).write_text(json.dumps(time_modes(specs, job["learn_only"], torch.device(job["device"]))))


def _probe_params(model: dict[str, Any]) -> int:
    """About how many parameters the probe's model has: embeddings (twice when untied) and its layers' projections."""
    h, vocab = int(model.get("hidden_size") or 0), int(model.get("vocab_size") or 0)
    m = int(model.get("intermediate_size") or 4 * h)
    embeddings = vocab * h * (1 if model.get("tie_word_embeddings") else 2)
    return embeddings + int(model.get("num_hidden_layers") or 1) * (4 * h * h + 3 * h * m)


if __name__ == "__main__":
    main(sys.argv[1:])
