"""On-policy distillation's teacher served by the rollout side (algorithm.distill_teacher_placement=rollout):
the same loss as the learner's own teacher, and the learner really uses what the batch carries."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.learner import learner as learner_module
from scalerl.trainer import loop


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A teacher that differs from the built-in student: its output embeddings ×3 (a sharper distribution)."""
    from scalerl.config.schema import ModelConfig
    from scalerl.models.loading import load_model

    model = load_model(ModelConfig(), torch.device("cpu"))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)
    folder = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(folder)
    return str(folder)


def _one_step(runs, name, teacher, placement, monkeypatch, seen):
    real = learner_module.rl_objective
    monkeypatch.setattr(learner_module, "rl_objective", lambda inputs, **kw: seen.append(inputs.advantages) or real(inputs, **kw))
    config = load_config(overrides=tiny_overrides(runs, name, **{"algorithm.distill_teacher": teacher,
                                                                 "algorithm.distill_teacher_placement": placement}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    return rollout, learner


def test_both_placements_give_the_same_loss(runs, teacher, monkeypatch):
    """Same seed, same start: the rollout side's shipped log-probs give the learner's own teacher's advantages,
    loss and reverse KL to round-off; only the rollout placement fills Rollout.teacher_logprobs, and its learner
    holds no teacher."""
    results = {}
    for placement in ("learner", "rollout"):
        seen = []
        rollout, learner = _one_step(runs, f"place-{placement}", teacher, placement, monkeypatch, seen)
        batch, metrics = loop.train_step(rollout, learner, 1, learner.ctx)
        results[placement] = (torch.cat(seen), metrics, batch.rollout.teacher_logprobs, learner.teacher_forward)
    adv_l, m_l, shipped_l, forward_l = results["learner"]
    adv_r, m_r, shipped_r, forward_r = results["rollout"]
    assert shipped_l.numel() == 0 and forward_l is not None
    assert shipped_r.shape == adv_r.shape and forward_r is None
    assert adv_l.abs().sum() > 0 and m_l["distill/reverse_kl"] != 0.0  # the teacher differs: a real signal
    torch.testing.assert_close(adv_r, adv_l, rtol=1e-5, atol=1e-6)
    assert m_r["loss"] == pytest.approx(m_l["loss"], rel=1e-5, abs=1e-7)
    assert m_r["distill/reverse_kl"] == pytest.approx(m_l["distill/reverse_kl"], rel=1e-5)


def test_the_learner_uses_the_shipped_teacher_log_probs(runs, teacher, monkeypatch):
    """Plant: the rollout side ships log π_teacher = log π_student + 0.5 on every completion token. The learner's
    advantage must then be distill_coef · 0.5 = 0.5 on every trained token and its reverse KL −0.5: a learner
    that ignored the batch's field (or scored with a teacher of its own) gives something else."""
    seen = []
    rollout, learner = _one_step(runs, "planted", teacher, "rollout", monkeypatch, seen)
    worker = rollout

    def planted(batch):  # the student's own log-probs now (version 0 sampled and learns), shifted by +0.5
        student = learner.frozen_forward(learner.policy_forward, batch)
        return torch.where(batch.completion_extent().bool(), student + 0.5, torch.zeros_like(student))

    worker.teacher = planted
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    [adv] = seen
    mask = worker.last_batch.rollout.completion_mask.bool()
    torch.testing.assert_close(adv[mask], torch.full_like(adv[mask], 0.5), rtol=0, atol=1e-5)
    assert adv[~mask].abs().max().item() == 0.0
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.5, abs=1e-5)


def test_a_batch_without_teacher_log_probs_is_refused(runs, teacher, monkeypatch):
    """Placement rollout, but the rollout side sent none (e.g. an engine that does not serve it): one clear error."""
    from scalerl.errors import ScaleRLError

    rollout, learner = _one_step(runs, "missing", teacher, "rollout", monkeypatch, [])
    rollout.teacher = None
    with pytest.raises(ScaleRLError, match="distill_teacher_placement=rollout: the batch carries no teacher log-probs"):
        loop.train_step(rollout, learner, 1, learner.ctx)


def test_the_placement_needs_a_teacher():
    with pytest.raises(Exception, match="distill_teacher_placement=rollout without algorithm.distill_teacher"):
        load_config(overrides={"algorithm.distill_teacher_placement": "rollout"})


def test_an_async_producer_serves_the_teacher(runs, teacher):
    """rollout.mode=async: the producer process loads the teacher (the learner and the trainer's evaluating worker
    hold none) and ships log π_teacher with each batch; they equal the rollout-side scorer's forward of the same
    batch here, and are 0 off the completion's tokens."""
    from scalerl.rollout.build import build_teacher_scorer

    config = load_config(overrides=tiny_overrides(runs, "async-teacher", **{
        "algorithm.distill_teacher": teacher, "algorithm.distill_teacher_placement": "rollout", "rollout.mode": "async",
        "algorithm.tis_cap": 2.0, "rollout.producer_threads": 1, "rollout.max_staleness": 1}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    try:
        batch = rollout.produce(1)
    finally:
        rollout.close()
    assert learner.teacher_forward is None and rollout.local.teacher is None
    shipped, mask = batch.rollout.teacher_logprobs, batch.rollout.completion_extent().bool()
    assert shipped.shape == batch.rollout.completion_ids.shape
    assert (shipped[mask] <= 0).all() and shipped[mask].sum() < 0 and shipped[~mask].abs().max().item() == 0.0
    expected = build_teacher_scorer(config, learner.policy, torch.device("cpu"), learner.autocast)(batch.rollout)
    torch.testing.assert_close(shipped, expected, rtol=1e-5, atol=1e-6)
