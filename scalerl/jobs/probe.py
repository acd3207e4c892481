"""Time a step's heavy parts at a given shape on this machine: what `scalerl plan` prices a target with.

A probe builds the model from its config with random weights (no checkpoint is read), in the run's precision
mode, threads and parallel strategy, and times, after one warm-up, `repeats` rounds of

    rollout:  the HF sampler decoding prompts × group completions of exactly L new tokens from P-token prompts
              (random tokens; EOS masked for all L, so every row decodes L steps)
    learn:    the learner's `learn` on that batch (rewards alternating 0/1 within each group): advantages, the
              objective's forward (log-probs and entropy), backward, gradient sync, clipping, the AdamW step

with the run's own code (`build_learner`, `HFSampler`, the strategy's wrapping and gathers). With `world` > 1
the probe runs as that many processes on this machine (torchrun; gloo on CPU, NCCL on GPUs), each with its
share of the run, so the strategy's collectives and the processes' contention for the machine are in the
times. Everything that depends on the shape in ways a pilot at another shape cannot show (the FLOP/s a matmul
of that width reaches, weights that no longer fit the caches, per-layer and per-collective overheads) is
thereby measured, not extrapolated; this is how auto-parallel planners cost a model before running it
(Alpa, Zheng et al. 2022; Galvatron, Miao et al. 2022, profile each layer on the device). What a probe does
not do (environments, rewards, logging, the trainer's loop) the pilots calibrate (scalerl/jobs/plan.py).

    python -m torch.distributed.run --standalone --nproc_per_node W -m scalerl.jobs.probe SPEC.json OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError


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


def run_probe(spec: ProbeSpec, repeats: int) -> ProbeResult:
    """The probe in this process (rank of a torchrun group when WORLD_SIZE is set): see the module docstring."""
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
    ctx = init_distributed(config.train.device)
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
        shutdown(ctx)
        torch.set_num_threads(threads)
    return ProbeResult(tuple(rollout_s), tuple(learn_s), sampled, trained)


def probe(spec: ProbeSpec, repeats: int = 3) -> ProbeResult:
    """`run_probe` here (one process) or in `spec.world` processes started by torchrun (rank 0's times)."""
    if spec.world == 1:
        try:
            return run_probe(spec, repeats)
        except ScaleRLError:
            raise
        except Exception as err:  # a model transformers cannot build from its config, out of memory, ...
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ScaleRLError(f"plan: the probe of a {spec.model.get('model_type', '?')} model failed ({first}); run with --no-probe to "
                               "price from the pilots alone") from err
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_file.write_text(json.dumps({**asdict(spec), "repeats": repeats}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(spec.world),
               "-m", "scalerl.jobs.probe", str(spec_file), str(out_file)]
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        if out.returncode != 0 or not out_file.is_file():
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise ScaleRLError(f"plan: the {spec.world}-process probe failed ({tail}); run with --no-probe to price from the pilots alone")
        times = json.loads(out_file.read_text())
    return ProbeResult(tuple(times["rollout_s"]), tuple(times["learn_s"]), times["sampled"], times["trained"])


def probe_alternated(specs: list[ProbeSpec], *, repeats: int = 3, rounds: int = 2) -> list[ProbeResult]:
    """Each distinct spec probed `rounds` times, the specs taken in turn (so that a machine's drift spreads over
    all of them), every round's timings pooled per spec."""
    distinct = {s.key(): s for s in specs}
    pooled: dict[str, list[ProbeResult]] = {k: [] for k in distinct}
    for _ in range(rounds):
        for key, spec in distinct.items():
            pooled[key].append(probe(spec, repeats))
    merged = {k: ProbeResult(tuple(x for r in v for x in r.rollout_s), tuple(x for r in v for x in r.learn_s), v[-1].sampled, v[-1].trained)
              for k, v in pooled.items()}
    return [merged[s.key()] for s in specs]


def main(argv: list[str]) -> None:
    spec_file, out_file = Path(argv[0]), Path(argv[1])
    raw = json.loads(spec_file.read_text())
    repeats = raw.pop("repeats")
    result = run_probe(ProbeSpec(**raw), repeats)
    if int(os.environ.get("RANK", "0")) == 0:
        out_file.write_text(json.dumps({"rollout_s": result.rollout_s, "learn_s": result.learn_s, "sampled": result.sampled,
                                        "trained": result.trained}))


if __name__ == "__main__":
    main(sys.argv[1:])
