"""World size 2 on gloo, in real processes: the trainer's learner under each parallel strategy gives one
process's gradients and weights, and a torchrun run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import ROOT, tiny_overrides
from ranks import free_port, global_batch, scored
from scalerl.distributed.context import DistContext, shutdown, start_process_group


# 4 prompts x 4 completions in all. Two ranks take 2 prompts each and learn in mini-batches of one
# group per rank; one process takes all 4 in mini-batches of two groups, ordered so that its
# mini-batch k is the union of the ranks' mini-batch k. Two epochs, so the later updates start from
# weights the earlier ones changed (old log-probs recomputed); a KL penalty; batch-level reward
# scaling, whose std must be the global batch's.
LEARN = {"train.epochs": 2, "algorithm.kl.beta": 0.05, "algorithm.clip_eps_high": 0.28}
RANK = {"rollout.prompts_per_step": 2, "train.mini_batch_size": 4, "train.micro_batch_size": 2}
SINGLE = {"rollout.prompts_per_step": 4, "train.mini_batch_size": 8, "train.micro_batch_size": 4}
SINGLE_ORDER = [0, 2, 1, 3]  # groups: rank 0 holds groups 0 and 1, rank 1 groups 2 and 3


def _learn(ctx, runs, overrides, batch):
    """The trainer's own learner on `batch`; returns (gradients applied at each update, final weights, metrics)."""
    from scalerl.config import load_config
    from scalerl.models.loading import load_model
    from scalerl.learner.build import build_learner

    torch.manual_seed(0)
    config = load_config(overrides=tiny_overrides(runs, "learn", **{**LEARN, **overrides}))
    learner = build_learner(config, ctx, load_model(config.model, ctx.device))
    applied, step = [], learner.optimizer.step
    params = [p for group in learner.optimizer.param_groups for p in group["params"]]  # the policy's, and PPO's critic's

    def recording_step(*a, **k):
        applied.append([p.grad.clone() for p in params])  # summed over ranks and clipped
        return step(*a, **k)

    learner.optimizer.step = recording_step
    metrics = learner.learn(batch, 1)
    metrics.update(learner.parallel.end_of_step(1, True, learner.optimizer))
    weights = [p.detach().clone() for p in params]
    learner.close()
    return applied, weights, metrics


def _full(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """FSDP2's shards (DTensors) gathered into whole tensors; plain tensors as they are."""
    return [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]


# PPO with a value head: the critic is a module of its own that every strategy wraps too; advantages whitened over all ranks
ALGORITHMS = {"grpo": {"algorithm.scale_rewards": "batch"}, "ppo": {"algorithm.name": "ppo", "algorithm.critic": "head"}}


def _worker(rank: int, port: int, runs, path: str, out: str, strategy: str, algo: dict) -> None:
    torch.set_num_threads(1)
    start_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ctx = DistContext(rank=rank, world_size=2)
    grads, weights, metrics = _learn(ctx, runs, {**RANK, **algo, "parallel.strategy": strategy}, scored(path, [2 * rank, 2 * rank + 1]))
    result = [_full(g) for g in grads], _full(weights), metrics
    if rank == 0:
        torch.save(result, out)
    dist.barrier()  # no rank leaves while another still talks to it (gloo aborts on a closed peer)
    shutdown(ctx)


@pytest.mark.parametrize("strategy, algo", [("ddp", "grpo"), ("fsdp2", "grpo"), ("none", "grpo"), ("ddp", "ppo"), ("fsdp2", "ppo")])
def test_two_gloo_ranks_learn_exactly_what_one_process_learns(tmp_path, strategy, algo):
    """`Learner.learn` under 2 gloo processes equals 1 process on the same global batch: every update's
    gradient, the final weights and the grad norms, to float tolerance; with DDP (a summing comm hook),
    FSDP2 (sharded parameters, gradients and moments; a SUM reduce-scatter) and plain modules."""
    path, out = str(tmp_path / "batch.pt"), str(tmp_path / "ranks.pt")
    global_batch(path)
    mp.spawn(_worker, args=(free_port(), tmp_path / "runs", path, out, strategy, ALGORITHMS[algo]), nprocs=2, join=True)
    ranks_grads, ranks_weights, ranks_metrics = torch.load(out, weights_only=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: a matmul split over 2 threads rounds differently (~1e-5 relative)
    try:
        grads, weights, metrics = _learn(DistContext(), tmp_path / "runs", {**SINGLE, **ALGORITHMS[algo]}, scored(path, SINGLE_ORDER))
    finally:
        torch.set_num_threads(threads)
    assert len(grads) == len(ranks_grads) == 4  # 2 epochs x 2 mini-batches
    for update, (a, b) in enumerate(zip(ranks_grads, grads)):
        # 1e-6 of gradients up to ~0.1: FSDP2 reduces and steps shard by shard, which rounds differently (~2e-7)
        assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a, b)), f"update {update}"
    # The weights after 4 AdamW steps at lr 1e-4: AdamW divides by √v, so gradients ~2e-7 apart (a packed forward
    # rounds by the length of the group it packs: half a group per rank, a whole one here) end up to ~6e-6 apart.
    # A gradient a rank got wrong moves a weight by ~lr per step; 2e-5 is a fifth of that.
    assert all(torch.allclose(x, y, atol=2e-5, rtol=1e-4) for x, y in zip(ranks_weights, weights))
    assert ranks_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-4)
    # one reduction of every gradient per update: DDP's hook counts what it sent, so a micro-batch
    # that did not skip its sync (no_sync) would double it
    assert ranks_metrics["comm/bytes"] == 4 * sum(w.numel() * w.element_size() for w in weights)
    assert any(not torch.equal(x, y) for x, y in zip(weights, _learn(DistContext(), tmp_path / "runs", {**SINGLE, **ALGORITHMS[algo]},
                                                                     scored(path, [0, 1, 2, 3]))[1]))  # the order matters


@pytest.mark.slow
def test_torchrun_two_processes_train_with_rank0_logging(tmp_path):
    """The plain `torchrun ... -m scalerl.train` form (the flag-style entry point), DDP by default."""
    runs = tmp_path / "runs"
    overrides = tiny_overrides(runs, "ddp", **{"train.steps": 3, "checkpoint.every": 3})
    args = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
                           "-m", "scalerl.train", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (runs / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # written once, by rank 0
    # each step sampled 2 ranks x 4 prompts x 4 completions
    ckpt_dir = runs / "ddp" / "checkpoints" / "step_0000003"
    assert (ckpt_dir / "rng_rank0.pt").is_file() and (ckpt_dir / "rng_rank1.pt").is_file()
    state = json.loads((ckpt_dir / "trainer_state.json").read_text())
    assert state["rollout"]["data"]["index"] == 3 * 2 * 4 and state["rollout"]["policy_version"] == 3
    assert state["learner"]["version"] == 3 and state["learner"]["updates"] == 3


def _relative_errors(ranks: list[list[torch.Tensor]], single: list[list[torch.Tensor]]) -> list[float]:
    """Per update, |g_ranks − g_single| / |g_single| over all of that update's gradient."""
    return [float(torch.cat([(x - y).flatten() for x, y in zip(a, b)]).norm() / torch.cat([y.flatten() for y in b]).norm())
            for a, b in zip(ranks, single)]


@pytest.mark.parametrize("compute, tolerance", [("bf16", 0.1), ("fp16", 0.03)])
def test_fsdp2_standard_precision_learns_what_one_process_learns(tmp_path, compute, tolerance):
    """precision.mode=standard under FSDP2 (its MixedPrecisionPolicy: bf16 or fp16 parameters in compute, float32
    reduce-scatter; fp16 with the dynamic loss scale) against one fp32 process on the same global batch, one
    epoch, no clipping. Each update's gradient is compared as a whole: measured 1.3 % and 3.0 % apart in bf16,
    0.2 % and 0.9 % in fp16 (bf16's 8-bit mantissa against fp16's 11); a gradient divided by the world size
    (FSDP's default mean) is 50 % off, a loss scale left in ×65536, and computing in fp32 would be ~1e-7 off."""
    path, out = str(tmp_path / "batch.pt"), str(tmp_path / "ranks.pt")
    global_batch(path)
    run = {**ALGORITHMS["grpo"], "precision.mode": "standard", "precision.compute": compute, "optim.max_grad_norm": None,
           "train.epochs": 1}
    mp.spawn(_worker, args=(free_port(), tmp_path / "runs", path, out, "fsdp2", run), nprocs=2, join=True)
    ranks_grads, _, ranks_metrics = torch.load(out, weights_only=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        grads, _, metrics = _learn(DistContext(), tmp_path / "runs", {**SINGLE, **run, "precision.mode": "fp32", "precision.compute": "bf16"},
                                   scored(path, SINGLE_ORDER))
    finally:
        torch.set_num_threads(threads)
    assert len(grads) == len(ranks_grads) == 2  # 2 mini-batches, no update skipped
    errors = _relative_errors(ranks_grads, grads)
    assert 1e-3 < max(errors) < tolerance  # close to fp32, and not fp32 itself
    assert ranks_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=tolerance)
    if compute == "fp16":  # the scale in effect on every rank, no overflow
        assert ranks_metrics["loss_scale"] == 2.0**16 and ranks_metrics["loss_scale_overflows"] == 0
