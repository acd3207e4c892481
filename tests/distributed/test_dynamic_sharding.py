"""Dynamic sharding: the source's default groups, and 2 gloo ranks that step on their own gradients
and average each group exactly at its interval (and everything at full synchronisations)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import run_cli, tiny_overrides
from ranks import free_port, global_batch, scored
from scalerl.config import DEFAULT_PARAM_GROUPS, ParamGroupConfig
from scalerl.distributed.context import DistContext, shutdown, start_process_group
from scalerl.distributed.dynamic_sharding import resolve_groups
from scalerl.jsonl import read_metrics


def _builtin():
    from transformers import AutoModelForCausalLM

    from scalerl.models.paths import builtin_model_dir

    return AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)


def test_default_groups_follow_the_sources_sensitivity_split():
    model = _builtin()
    last = model.config.num_hidden_layers - 1
    groups = resolve_groups(list(model.named_parameters()), [ParamGroupConfig(**g) for g in DEFAULT_PARAM_GROUPS], last)
    where = {id(p): g.name for g in groups for p in g.params}
    name_of = dict(model.named_parameters())
    group = {n: where[id(p)] for n, p in name_of.items()}
    assert [g.name for g in groups] == ["sensitive", "mid", "embedding"]  # no parameter left over
    assert group["model.layers.0.self_attn.o_proj.weight"] == group[f"model.layers.{last}.mlp.down_proj.weight"] == "sensitive"
    assert group["model.layers.0.mlp.down_proj.weight"] == group["model.layers.1.self_attn.q_proj.weight"] == "mid"
    assert group["model.embed_tokens.weight"] == group["lm_head.weight"] == "embedding"
    assert group["model.norm.weight"] == group["model.layers.2.input_layernorm.weight"] == "sensitive"
    # what nothing matches goes to `rest`, every step
    only = resolve_groups(list(model.named_parameters()), [ParamGroupConfig(name="attn", params=["*.self_attn.*"], sync_interval=3)], last)
    assert [(g.name, g.sync_interval) for g in only] == [("attn", 3), ("rest", 1)]
    assert len(only[0].params) == 4 * model.config.num_hidden_layers


GROUPS = [{"name": "attn", "params": ["*.self_attn.*"], "sync_interval": 2},
          {"name": "mlp", "params": ["*.mlp.*"], "sync_interval": 3}]
PROBE = {"attn": "model.layers.1.self_attn.v_proj.weight", "mlp": "model.layers.2.mlp.up_proj.weight",
         "rest": "model.embed_tokens.weight"}
STEPS = 7  # full synchronisations at steps 1 and 7


def _ranks(rank: int, port: int, runs, batch: str, out: str) -> None:
    from scalerl.config import load_config
    from scalerl.models.loading import load_model
    from scalerl.learner.build import build_learner

    torch.set_num_threads(1)
    start_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    config = load_config(overrides=tiny_overrides(runs, "dyn", **{"rollout.prompts_per_step": 2, "parallel.strategy": "dynamic",
                                                                  "parallel.param_groups": GROUPS, "optim.lr": 1e-2}))
    ctx = DistContext(rank=rank, world_size=2)
    learner = build_learner(config, ctx, load_model(config.model, torch.device("cpu")))
    params = dict(learner.policy.named_parameters())
    log = []
    for step in range(1, STEPS + 1):
        learner.learn(scored(batch, [2 * rank, 2 * rank + 1]), step)  # each rank its own prompts
        before = {g: params[n].detach().clone() for g, n in PROBE.items()}
        metrics = learner.end_of_step(step, agree=step in (1, STEPS), saving=step == STEPS)  # what the training job calls
        after = {g: params[n].detach().clone() for g, n in PROBE.items()}
        moment = learner.optimizer.state[params[PROBE["mlp"]]]["exp_avg"].clone()
        log.append((before, after, moment, metrics))
    everyone = [None, None]
    dist.all_gather_object(everyone, log)
    if rank == 0:
        torch.save(everyone, out)
    dist.barrier()  # no rank leaves while another still talks to it (gloo aborts on a closed peer)
    learner.close()
    shutdown(ctx)


def test_two_ranks_average_each_group_at_its_interval(tmp_path):
    batch, out = str(tmp_path / "batch.pt"), str(tmp_path / "log.pt")
    global_batch(batch)
    mp.spawn(_ranks, args=(free_port(), tmp_path / "runs", batch, out), nprocs=2, join=True)
    r0, r1 = torch.load(out, weights_only=False)
    sizes = {}
    for step, ((b0, a0, m0, metrics), (b1, a1, m1, _)) in enumerate(zip(r0, r1), start=1):
        full = step in (1, STEPS)
        for g, interval in (("attn", 2), ("mlp", 3), ("rest", 1)):
            due = full or step % interval == 0
            assert not torch.equal(b0[g], b1[g]), (step, g)  # the ranks learned from different prompts
            if due:  # averaged: both ranks hold the mean of what they had
                assert torch.equal(a0[g], a1[g]) and torch.allclose(a0[g], (b0[g] + b1[g]) / 2, atol=1e-7), (step, g)
                sizes.setdefault((g, step == STEPS), set()).add(metrics[f"comm/bytes/{g}"])
            else:
                assert torch.equal(a0[g], b0[g]) and metrics[f"comm/bytes/{g}"] == 0, (step, g)
        assert metrics["comm/bytes"] == pytest.approx(sum(v for k, v in metrics.items() if k.startswith("comm/bytes/")))
        assert torch.equal(m0, m1) == (step == STEPS), step  # moments averaged before a save only (sync_moments off)
    for g in ("attn", "mlp", "rest"):  # one payload per group; the synchronisation before a save adds its two AdamW moments
        (periodic,), (with_moments,) = sizes[(g, False)], sizes[(g, True)]
        assert periodic > 0 and with_moments == 3 * periodic, g
    assert sizes[("mlp", False)] == {4 * 3 * 128 * 512 * 4}  # 4 layers x gate/up/down x 128 x 512 float32


@pytest.mark.slow
def test_the_training_job_makes_replicas_agree_on_the_first_and_last_step(tmp_path):
    """`scalerl train --nproc 2` with one group synced every 4 steps, 3 steps: the job asks the learner to agree
    on step 1 and on the last step (before its evaluation and final checkpoint, with the optimizer moments), not in
    between."""
    runs = tmp_path / "runs"
    groups = '[{"name": "all", "params": ["*"], "sync_interval": 4}]'
    overrides = tiny_overrides(runs, "agree", **{"train.steps": 3, "eval.every": 0, "rollout.prompts_per_step": 2,
                                                 "parallel.strategy": "dynamic", "parallel.param_groups": groups})
    args = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
    proc = run_cli("-m", "scalerl.cli.main", "train", "--nproc", "2", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent = [row["comm/bytes/all"] for row in read_metrics(runs / "agree")]
    assert sent[0] > 0 and sent[1] == 0 and sent[2] == 3 * sent[0], sent  # the last step saves: weights and both AdamW moments
