"""The forgetting terms (`forgetting.*`): the SFT anchor's NLL and EWC, as formulas and inside the learner's update."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_overrides
from scalerl.algorithms.forgetting import ewc_gradient, ewc_penalty, sft_nll
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.models.logprobs import CompletionModel
from scalerl.errors import ScaleRLError
from scalerl.trainer import loop

ANCHOR = Path(__file__).parent / "data" / "addition_anchor.jsonl"  # 40 rows "a+b=" -> "a+b"


def test_sft_nll_is_the_token_sum_over_the_normalizer():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # −(−1 − 2 − 0.5) / 3 = 7/6 with the update's 3 anchor tokens; / 6 when other ranks hold 3 more
    assert sft_nll(logprobs, mask, normalizer=3).item() == pytest.approx(7 / 6)
    assert sft_nll(logprobs, mask, normalizer=6).item() == pytest.approx(7 / 12)


def test_ewc_penalty_and_its_gradient():
    theta = [torch.tensor([1.0, 2.0]), torch.tensor([[0.5]])]
    anchor = [torch.tensor([0.0, 2.0]), torch.tensor([[1.5]])]
    fisher = [torch.tensor([3.0, 7.0]), torch.tensor([[2.0]])]
    # λ Σ F (θ − θ*)² = 0.1 · (3·1 + 7·0 + 2·1) = 0.5
    assert ewc_penalty(theta, anchor, fisher, lam=0.1).item() == pytest.approx(0.5)
    leaves = [t.clone().requires_grad_() for t in theta]
    ewc_penalty(leaves, anchor, fisher, lam=0.1).backward()
    for leaf, t, a, f in zip(leaves, theta, anchor, fisher):
        assert torch.allclose(ewc_gradient(t, a, f, lam=0.1), leaf.grad)  # 2 λ F (θ − θ*)


def _roles(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **extra))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    return rollout, learner


def _trained(learner):
    return [p for p in learner.policy.parameters() if p.requires_grad]


def _update_gradients(learner, batch, monkeypatch):
    """The gradients the optimizer steps on for `batch` (one update: one mini-batch, one epoch)."""
    seen, real = [], learner.optimizer.step
    monkeypatch.setattr(learner.optimizer, "step", lambda: (seen.append([p.grad.clone() for p in _trained(learner)]), real())[1])
    learner.learn(batch, 1)
    return seen[0]


def test_anchor_rows_are_the_prompt_and_the_response_with_the_stop_token(runs):
    rollout, learner = _roles(runs, "anchor-rows", **{"forgetting.data": str(ANCHOR)})
    anchor = learner.forgetting.anchor
    tok = rollout.tokenizer
    assert len(anchor) == 40
    first = ANCHOR.read_text().splitlines()[0]
    import json

    row = json.loads(first)
    assert anchor.prompts[0] == tok(row["prompt"])["input_ids"]
    assert anchor.responses[0] == tok(row["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    batch = anchor.batch(3, 1, 5, torch.device("cpu"))
    assert len(batch) == 5 and torch.equal(batch.completion_mask.sum(1), torch.tensor([len(anchor.responses[i]) for i in
                                                                                        _rows(anchor, 3, 1, 5)]))
    assert torch.equal(anchor.batch(3, 1, 5, torch.device("cpu")).completion_ids, batch.completion_ids)  # a function of (step, update)
    # 5 % of a 16-completion mini-batch rounds to 1 row, the least
    assert learner.forgetting.rows == 1


def _rows(anchor, step, update, n):
    from scalerl.types import derive_seed

    gen = torch.Generator().manual_seed(derive_seed(anchor.seed, "anchor", step, update, anchor.rank))
    return torch.randperm(len(anchor), generator=gen)[:n].tolist()


def test_the_sft_anchor_adds_the_gradient_of_its_weighted_nll(runs, monkeypatch):
    extra = {"train.mini_batch_size": 16, "train.micro_batch_size": 8, "optim.max_grad_norm": None}  # unclipped: sums compare
    rollout, plain = _roles(runs, "plain", **extra)
    batch = rollout.produce(1)
    _, anchored = _roles(runs, "anchored", **extra, **{"forgetting.data": str(ANCHOR), "forgetting.sft_fraction": 0.25,
                                                      "forgetting.sft_weight": 2.0})
    assert anchored.forgetting.rows == 4  # 25 % of 16
    rows = anchored.forgetting.anchor.batch(0, 0, 4, torch.device("cpu"))  # update 0's rows
    expected = torch.autograd.grad(2.0 * sft_nll(CompletionModel(anchored.policy)(rows).logprobs, rows.completion_mask,
                                                 normalizer=rows.completion_mask.sum().item()), _trained(anchored))
    without = _update_gradients(plain, batch, monkeypatch)
    with_anchor = _update_gradients(anchored, batch, monkeypatch)
    for a, b, e in zip(with_anchor, without, expected):
        assert torch.allclose(a - b, e, atol=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(with_anchor, without)) > 1e-4


def test_ewc_measures_the_fisher_and_pulls_towards_the_anchor(runs, monkeypatch):
    rollout, learner = _roles(runs, "ewc", **{"forgetting.data": str(ANCHOR), "forgetting.ewc": True, "forgetting.sft_fraction": 0,
                                              "forgetting.ewc_lambda": 50.0, "forgetting.fisher_batches": 2,
                                              "optim.max_grad_norm": None})
    fg = learner.forgetting
    assert fg.rows == 0 and "Fisher of 8 anchor rows" in learner.start_forgetting()  # 2 batches x rollout.prompts_per_step (4)
    # the Fisher, recomputed here: the mean of each row's squared log-likelihood gradient
    params, model = fg.params, CompletionModel(learner.policy)
    squares = [torch.zeros_like(p) for p in params]
    for b in range(2):
        rows = fg.anchor.batch(-1, b, 4, torch.device("cpu"))
        for i in range(len(rows)):
            row = rows.select(slice(i, i + 1))
            grads = torch.autograd.grad((model(row).logprobs * row.completion_mask).sum(), params)
            for s, g in zip(squares, grads):
                s += g.square() / 8
    assert all(torch.allclose(f, s, rtol=1e-5, atol=1e-12) for f, s in zip(fg.ewc.fisher, squares))
    assert sum(f.sum() for f in fg.ewc.fisher) > 0
    from scalerl.predict.memory import estimate_memory, shape_of_model_path

    est = estimate_memory(shape_of_model_path("builtin"), micro_batch=1, prompt_len=1, completion_len=1, rollout_sequences=1, ewc=True)
    assert fg.ewc.bytes() == est["ewc"] == 1_063_808 * 8  # fp32 anchors + fp32 Fisher of every trained weight
    # weights moved off the anchor θ*: the update's gradient gains exactly 2 λ F (θ − θ*) over a run without EWC
    _, plain = _roles(runs, "no-ewc", **{"optim.max_grad_norm": None})
    for learner_ in (learner, plain):
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in _trained(learner_):
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    batch = rollout.produce(1)
    expected = [ewc_gradient(p, a, f, lam=50.0) for p, a, f in zip(params, fg.ewc.anchors, fg.ewc.fisher)]
    with_ewc, without = _update_gradients(learner, batch, monkeypatch), _update_gradients(plain, batch, monkeypatch)
    for a, b, e in zip(with_ewc, without, expected):
        assert torch.allclose(a - b, e, atol=1e-6)
    assert max(e.abs().max().item() for e in expected) > 1e-5


def test_forgetting_config_errors():
    with pytest.raises(ScaleRLError, match="ewc needs data"):
        load_config(overrides={"forgetting.ewc": True})
    with pytest.raises(ScaleRLError, match="forgetting.ewc with parallel.strategy=fsdp2"):
        load_config(overrides={"forgetting.ewc": True, "forgetting.data": str(ANCHOR), "parallel.strategy": "fsdp2"})


def test_bad_anchor_rows_name_the_file_and_line(runs, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(ScaleRLError, match=r"forgetting.data: .*bad.jsonl:2 needs a 'prompt'"):
        _roles(runs, "bad", **{"forgetting.data": str(bad)})
