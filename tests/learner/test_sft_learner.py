"""SFT's learner: masked cross-entropy on response tokens only, worked out by hand; the same numbers through the real
model's forward; and packed rows (a block-diagonal mask) giving the unpacked loss."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from scalerl.config import OptimConfig
from scalerl.config.plan import precision_policy
from scalerl.distributed.context import DistContext
from scalerl.distributed.parallel import Strategy
from scalerl.learner.sft import SFTLearner, as_batch, pack, truncate
from scalerl.models.logprobs import CompletionForward, CompletionModel


class Unigram(nn.Module):
    """log π(y_t | anything) = log_softmax(θ)[y_t]: a model whose log-probs are known in closed form."""

    def __init__(self, theta: list[float]):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(theta))

    def forward(self, batch, **_options) -> CompletionForward:
        return CompletionForward(torch.log_softmax(self.theta, -1)[batch.completion_ids])  # (B, T)


def learner(forward: nn.Module, policy: nn.Module, optimizer: torch.optim.Optimizer, lr: float, micro: int | None = None) -> SFTLearner:
    ctx = DistContext()
    parallel = Strategy(ctx, precision_policy("fp32"))
    parallel.wrap(forward)
    return SFTLearner(policy=policy, forward=forward, optimizer=optimizer, parallel=parallel, ctx=ctx,
                      optim=OptimConfig(lr=max(lr, 1e-9), max_grad_norm=None), autocast=lambda: torch.autocast("cpu", enabled=False),
                      fp32_head=True, total_updates=1,
                      micro_batch_size=micro, pad_id=0, lr=lr)


@pytest.mark.parametrize("micro", [None, 1])  # one micro-batch (row 2 padded), or one per row: the same update
def test_masked_cross_entropy_by_hand(micro):
    # θ = (0, ln 2, ln 3): π = (1/6, 1/3, 1/2). Examples (prompt, response): ([0], [1, 2]) and ([0, 0], [2]).
    # Trained tokens 1, 2, 2 (prompts and the padding after row 2's response, token 0, are masked out):
    #   L = −(ln 1/3 + ln 1/2 + ln 1/2) / 3 = ln 12 / 3 = 0.828302
    # ∂L/∂θ = mean over trained tokens of (π − onehot) = (3π − counts) / 3 = ((0.5, 1, 1.5) − (0, 1, 2)) / 3 = (1/6, 0, −1/6)
    # so one SGD step at lr 1 gives θ − (1/6, 0, −1/6).
    model = Unigram([0.0, math.log(2), math.log(3)])
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    out = learner(model, model, sgd, lr=1.0, micro=micro).update([[([0], [1, 2])], [([0, 0], [2])]])
    assert out["loss"] == pytest.approx(math.log(12) / 3, abs=1e-6)
    assert out["tokens"] == 3
    expected = torch.tensor([0.0, math.log(2), math.log(3)]) - torch.tensor([1 / 6, 0.0, -1 / 6])
    torch.testing.assert_close(model.theta.detach(), expected, atol=1e-6, rtol=0)


def real_loss(model: nn.Module, examples) -> float:
    """The token mean of −log p(response | prompt) from plain full forwards of each example alone."""
    total, count = 0.0, 0
    with torch.no_grad():
        for p, r in examples:
            logits = model(input_ids=torch.tensor([p + r])).logits[0].float()  # (L, V)
            logprobs = torch.log_softmax(logits[len(p) - 1: -1], -1)  # positions that predict the response
            total -= logprobs.gather(-1, torch.tensor(r)[:, None]).sum().item()
            count += len(r)
    return total / count


@pytest.fixture(scope="module")
def builtin():
    from scalerl.models.loading import load_model
    from scalerl.config import ModelConfig

    torch.manual_seed(0)
    return load_model(ModelConfig(), torch.device("cpu"))


EXAMPLES = [([1, 5, 14, 6, 15], [9, 2]), ([1, 7, 14, 8], [4, 5, 2]), ([1, 12, 14, 13, 14, 6], [5, 6, 2]), ([1, 4], [4, 2])]


@pytest.mark.parametrize("packing", [False, True])
def test_real_model_loss_matches_plain_forwards(builtin, packing):
    rows = pack(EXAMPLES, 16) if packing else [[e] for e in EXAMPLES]
    if packing:
        assert [len(r) for r in rows] == [2, 2]  # 7 + 7 tokens, then 9 + 3
    sgd = torch.optim.SGD(builtin.parameters(), lr=0.0)
    out = learner(CompletionModel(builtin), builtin, sgd, lr=0.0).update(rows)
    assert out["loss"] == pytest.approx(real_loss(builtin, EXAMPLES), abs=1e-5)


def test_truncate_and_pack():
    kept, dropped = truncate([([1, 2], [3, 4, 5]), ([1, 2, 3], [4])], 3)
    assert kept == [([1, 2], [3])] and dropped == 1  # the second's prompt fills max_length
    batch, segments = as_batch([[([1, 2], [3]), ([1], [4, 5])]], pad_id=0, device=torch.device("cpu"))
    assert batch.completion_ids.tolist() == [[2, 3, 1, 4, 5]] and batch.completion_mask.tolist() == [[0, 1, 0, 1, 1]]
    assert segments.tolist() == [[0, 0, 0, 1, 1, 1]]
