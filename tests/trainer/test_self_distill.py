"""forgetting.self_distill: the frozen starting policy as the teacher of the policy's own samples of anchor prompts,
as a formula and inside the learner's update."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.algorithms.forgetting import self_distill_loss
from scalerl.config import load_config
from scalerl.errors import ScaleRLError
from scalerl.models.logprobs import CompletionModel
from scalerl.trainer import loop

from test_forgetting import ANCHOR, _roles, _trained, _update_gradients


def test_self_distill_loss_is_the_reverse_kl_with_its_score_function_gradient():
    student = torch.tensor([[-1.0, -2.0, math.nan], [-0.5, math.inf, -3.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -7.0], [-0.5, -2.0, math.nan]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, kl = self_distill_loss(student, teacher, mask, normalizer=3)
    # d = log π_θ − log π_0 on the mask: (0.5, −1.0 | 0.0); value = Σ d / N = −0.5 / 3; NaN/inf under the zero mask ignored
    assert loss.item() == pytest.approx(-0.5 / 3) and kl.item() == pytest.approx(-0.5 / 3)
    loss.backward()
    # ∂L/∂ log π_θ = m · d / N: the per-token advantage −d of on-policy distillation, descending
    assert student.grad.flatten().tolist() == pytest.approx([0.5 / 3, -1.0 / 3, 0.0, 0.0, 0.0, 0.0])
    assert self_distill_loss(student, teacher, mask, normalizer=6)[0].item() == pytest.approx(-0.5 / 6)  # other ranks' tokens


def test_self_distill_adds_the_gradient_of_the_reverse_kl_on_sampled_anchor_prompts(runs, monkeypatch):
    """The teacher is the policy as built (the start); once the weights moved, the update's gradient gains exactly
    weight · ∇L_sd on the completions the policy samples for the update's anchor prompts, over a run without it."""
    extra = {"optim.max_grad_norm": None}  # unclipped: sums compare
    rollout, learner = _roles(runs, "sd", **extra, **{"forgetting.data": str(ANCHOR), "forgetting.self_distill": True, "forgetting.sft_fraction": 0,
                                                      "forgetting.self_distill_fraction": 0.25, "forgetting.self_distill_weight": 3.0})
    _, plain = _roles(runs, "no-sd", **extra)
    sd, fg = learner.forgetting.self_distill, learner.forgetting
    assert fg.rows == 0 and fg.ewc is None and sd.rows == 4  # 25 % of the 16-completion mini-batch; no SFT anchor rows
    first = sd.sample(fg.anchor, 0, torch.device("cpu"))
    assert torch.equal(sd.sample(fg.anchor, 0, torch.device("cpu")).completion_ids, first.completion_ids)  # seeded per update
    assert not torch.equal(sd.sample(fg.anchor, 1, torch.device("cpu")).completion_ids, first.completion_ids)
    teacher_lp = sd.teacher(first).logprobs
    assert torch.equal(teacher_lp, CompletionModel(learner.policy)(first).logprobs)  # at the start the teacher is the policy
    for learner_ in (learner, plain):  # the same move off the start in both
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in _trained(learner_):
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    first = sd.sample(fg.anchor, 0, torch.device("cpu"))  # what update 0 samples from the moved policy
    teacher_lp = sd.teacher(first).logprobs
    student_lp = CompletionModel(learner.policy)(first).logprobs
    loss, kl = self_distill_loss(student_lp, teacher_lp, first.completion_mask, normalizer=first.completion_mask.sum().item())
    expected = torch.autograd.grad(3.0 * loss, _trained(learner))
    batch = rollout.produce(1)
    seen = []
    real_backward = fg.self_distill.backward
    monkeypatch.setattr(fg.self_distill, "backward", lambda *a, **k: seen.append(real_backward(*a, **k)) or seen[-1])
    with_sd, without = _update_gradients(learner, batch, monkeypatch), _update_gradients(plain, batch, monkeypatch)
    for a, b, e in zip(with_sd, without, expected):
        assert torch.allclose(a - b, e, atol=1e-6)
    assert max(e.abs().max().item() for e in expected) > 1e-4
    assert seen[0]["self_distill/reverse_kl"] == pytest.approx(kl.item(), rel=1e-5) and kl.item() != 0.0
    assert loop.train_step(rollout, learner, 2, learner.ctx)[1]["self_distill/reverse_kl"] > 0  # in the step's logged metrics


def test_self_distill_config_errors():
    with pytest.raises(ScaleRLError, match="self_distill needs data"):
        load_config(overrides={"forgetting.self_distill": True})
    with pytest.raises(ScaleRLError, match="forgetting.self_distill with parallel.strategy=fsdp2"):
        load_config(overrides={"forgetting.self_distill": True, "forgetting.data": str(ANCHOR), "parallel.strategy": "fsdp2"})
