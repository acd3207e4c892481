"""World size 2 on gloo, in real processes: the same gradient as one process, and a torchrun run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import ROOT, tiny_overrides
from scalerl.algorithms.losses import grpo_loss
from scalerl.distributed.context import DistContext
from scalerl.models.logprobs import completion_logprobs
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.base import Rollout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch() -> tuple[Rollout, torch.Tensor]:
    """8 completions of uneven lengths, fixed by a seed, with advantages."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, 17, (8, 5), generator=g)
    completion = torch.randint(4, 17, (8, 6), generator=g)
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    cmask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    batch = Rollout(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt), completion_ids=completion,
                    completion_mask=cmask, sampler_logprobs=torch.zeros(8, 6), truncated=torch.zeros(8, dtype=torch.bool),
                    group_ids=torch.arange(8) // 4)
    return batch, torch.randn(8, generator=g)


def _gradients(ctx: DistContext, rows: slice, loss_agg: str) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    full, adv = _batch()
    mine = full.select(rows)
    count = mine.completion_mask.sum() if loss_agg == "token" else torch.tensor(len(mine))
    normalizer = ctx.sum(count.double()).item()  # the global count, as the trainer computes it
    logprobs, _ = completion_logprobs(model, mine)
    old = logprobs.detach() - 0.1  # ratios away from 1 so that clipping is exercised
    loss, _ = grpo_loss(logprobs, old, adv[rows], mine.completion_mask, loss_agg=loss_agg, normalizer=normalizer)
    loss.backward()
    ctx.sum_gradients(model)
    return [p.grad for p in model.parameters()]


def _worker(rank: int, port: int, loss_agg: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ctx = DistContext(rank=rank, world_size=2)
    grads = _gradients(ctx, slice(4 * rank, 4 * rank + 4), loss_agg)
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
def test_two_gloo_ranks_give_the_single_process_gradient(tmp_path, loss_agg):
    out = str(tmp_path / "grads.pt")
    mp.spawn(_worker, args=(_free_port(), loss_agg, out), nprocs=2, join=True)
    distributed = torch.load(out, weights_only=True)
    single = _gradients(DistContext(), slice(0, 8), loss_agg)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(distributed, single))


@pytest.mark.slow
def test_torchrun_two_processes_train_with_rank0_logging(tmp_path):
    runs = tmp_path / "runs"
    overrides = tiny_overrides(runs, "ddp", **{"train.steps": 3, "checkpoint.every": 3})
    args = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
                           "-m", "scalerl.cli.main", "train", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (runs / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # written once, by rank 0
    # each step sampled 2 ranks x 4 prompts x 4 completions
    ckpt_dir = runs / "ddp" / "checkpoints" / "step_0000003"
    assert (ckpt_dir / "rng_rank0.pt").is_file() and (ckpt_dir / "rng_rank1.pt").is_file()
    state = json.loads((ckpt_dir / "trainer_state.json").read_text())
    assert state["data"]["index"] == 3 * 2 * 4
