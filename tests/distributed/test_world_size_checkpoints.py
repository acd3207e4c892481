"""Checkpoints are independent of the world size: FSDP2 shards saved by 2 gloo ranks load into one
process, and one process's checkpoint loads into 2 FSDP2 ranks, weights and AdamW moments exact."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import tiny_overrides
from ranks import free_port, global_batch, scored
from scalerl.distributed.context import DistContext, shutdown, start_process_group

KL = {"algorithm.kl.beta": 0.05}  # a reference model too, sharded like the policy


def _learner(ctx, runs, strategy: str):
    from scalerl.config import load_config
    from scalerl.models.loading import load_model
    from scalerl.learner.build import build_learner

    torch.manual_seed(0)
    config = load_config(overrides=tiny_overrides(runs, "ckpt", **{**KL, "parallel.strategy": strategy}))
    return build_learner(config, ctx, load_model(config.model, ctx.device))


def _full_state(learner) -> dict[str, torch.Tensor]:
    """Every weight and AdamW moment (and step) of the learner as whole tensors, by parameter name."""
    names = {p: n for n, p in learner.policy.named_parameters()}
    out = {}
    for p, n in names.items():
        out[f"w/{n}"] = p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
        for key, value in learner.optimizer.state.get(p, {}).items():  # .get: state is a defaultdict
            out[f"{key}/{n}"] = value.full_tensor() if hasattr(value, "full_tensor") else value.clone()
    return out


def _save(learner, folder, step: int):
    from transformers import AutoTokenizer

    from scalerl.models.paths import builtin_model_dir
    from scalerl.trainer import checkpoint as ckpt

    ckpt.save_checkpoint(folder, step, ctx=learner.ctx, model=learner.policy, tokenizer=AutoTokenizer.from_pretrained(builtin_model_dir()),
                         optimizer=learner.optimizer, rng={"torch": torch.get_rng_state()}, trainer_state={}, keep_last=2,
                         extra_modules=learner.extra_modules())


def _load(learner, folder):
    from scalerl.trainer import checkpoint as ckpt

    ckpt.load_checkpoint(ckpt.latest_checkpoint(folder), ctx=learner.ctx, model=learner.policy, optimizer=learner.optimizer,
                         extra_modules=learner.extra_modules())


def _ranks(rank: int, port: int, runs, batch: str, folder, out: str, mode: str) -> None:
    torch.set_num_threads(1)
    start_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ctx = DistContext(rank=rank, world_size=2)
    learner = _learner(ctx, runs, "fsdp2")
    if mode == "save":  # learn one batch (moments exist), save
        learner.learn(scored(batch, [2 * rank, 2 * rank + 1]), 1)
        _save(learner, folder, 1)
    else:
        _load(learner, folder)
    state = _full_state(learner)
    if rank == 0:
        torch.save(state, out)
    dist.barrier()  # no rank leaves while another still talks to it (gloo aborts on a closed peer)
    learner.close()
    shutdown(ctx)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and any(k.startswith("exp_avg_sq/") for k in a), (sorted(set(a) - set(b)), sorted(set(b) - set(a)))
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_two_fsdp2_ranks_resume_in_one_process_and_one_process_in_two(tmp_path):
    batch, out = str(tmp_path / "batch.pt"), str(tmp_path / "ranks.pt")
    global_batch(batch)
    # saved by 2 FSDP2 ranks → loaded by 1 process
    mp.spawn(_ranks, args=(free_port(), tmp_path / "runs", batch, tmp_path / "two", out, "save"), nprocs=2, join=True)
    saved = torch.load(out, weights_only=True)
    one = _learner(DistContext(), tmp_path / "runs", "fsdp2")
    untrained = _full_state(one)
    _load(one, tmp_path / "two")
    _same(saved, _full_state(one))
    assert not torch.equal(untrained["w/model.norm.weight"], saved["w/model.norm.weight"])  # it learned something
    # saved by that process (after one more batch) → loaded by 2 FSDP2 ranks
    one.learn(scored(batch, [0, 1, 2, 3]), 2)
    _save(one, tmp_path / "one", 2)
    mp.spawn(_ranks, args=(free_port(), tmp_path / "runs", batch, tmp_path / "one", out, "load"), nprocs=2, join=True)
    _same(_full_state(one), torch.load(out, weights_only=True))


def test_a_checkpoint_of_the_earlier_format_still_loads(tmp_path):
    """Before DCP a checkpoint held optimizer.pt and the safetensors only: that layout still loads, exactly."""
    import shutil

    from scalerl.trainer import checkpoint as ckpt

    batch = str(tmp_path / "batch.pt")
    global_batch(batch)
    saved = _learner(DistContext(), tmp_path / "runs", "none")
    saved.learn(scored(batch, [0, 1, 2, 3]), 1)
    _save(saved, tmp_path / "ck", 1)
    folder = ckpt.latest_checkpoint(tmp_path / "ck")
    shutil.rmtree(folder / "dcp")  # the earlier layout: the optimizer's own state dict instead of the shards
    torch.save(saved.optimizer.state_dict(), folder / "optimizer.pt")
    ckpt.write_manifest(folder)
    loaded = _learner(DistContext(), tmp_path / "runs", "none")
    _load(loaded, tmp_path / "ck")
    _same(_full_state(saved), _full_state(loaded))
