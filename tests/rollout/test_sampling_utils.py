"""left_pad and filter_logits from the Hugging Face rollout engine."""

import math

import torch

from scalerl.rollout.hf import filter_logits, left_pad

NEG_INF = float("-inf")


def test_left_pad_aligns_on_the_right():
    ids, mask = left_pad([[1, 2, 3], [4], [5, 6]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4], [0, 5, 6]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert ids.dtype == torch.long and mask.dtype == torch.long


def test_left_pad_same_lengths_and_pad_id():
    ids, mask = left_pad([[7, 8], [9, 10]], pad_id=99)
    assert ids.tolist() == [[7, 8], [9, 10]]
    assert mask.tolist() == [[1, 1], [1, 1]]
    ids, _ = left_pad([[7, 8, 1], [9]], pad_id=99)
    assert ids.tolist() == [[7, 8, 1], [99, 99, 9]]


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [5.0, -1.0, 4.0, 6.0]])
    out = filter_logits(logits, top_k=2, top_p=1.0)
    assert out.tolist() == [[NEG_INF, 3.0, 2.0, NEG_INF], [5.0, NEG_INF, NEG_INF, 6.0]]
    assert torch.isfinite(out).sum(-1).tolist() == [2, 2]


def test_disabled_filters_are_identity():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.equal(filter_logits(logits, top_k=0, top_p=1.0), logits)
    assert torch.equal(filter_logits(logits, top_k=4, top_p=1.0), logits)  # k >= V
    assert torch.equal(filter_logits(logits, top_k=10, top_p=1.0), logits)


def _logits(probs):
    return torch.tensor([probs]).log()


def test_top_p_keeps_smallest_set_reaching_p():
    # Probabilities 0.2, 0.5, 0.3 (sorted: 0.5, 0.3, 0.2; mass before each: 0, 0.5, 0.8).
    logits = _logits([0.2, 0.5, 0.3])
    kept = lambda p: torch.isfinite(filter_logits(logits, 0, p))[0].tolist()
    assert kept(0.75) == [False, True, True]  # 0.5 < 0.75 keeps 0.3; 0.8 >= 0.75 drops 0.2
    assert kept(0.4) == [False, True, False]  # the top token alone already reaches 0.4
    assert kept(0.85) == [True, True, True]  # 0.5 + 0.3 = 0.8 < 0.85 needs all three
    out = filter_logits(logits, 0, 0.75)
    assert torch.allclose(out[0, 1:], logits[0, 1:])  # kept logits are unchanged


def test_top_p_always_keeps_top_token():
    logits = torch.tensor([[0.0, 2.0, 1.0], [9.0, 0.0, 0.0]])
    out = filter_logits(logits, 0, 1e-6)
    assert torch.isfinite(out).tolist() == [[False, True, False], [True, False, False]]


def test_top_p_kept_mass_is_minimal():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 50, generator=g) * 2
    p = 0.9
    out = filter_logits(logits, 0, p)
    probs = logits.softmax(-1)
    for row in range(16):
        keep = torch.isfinite(out[row])
        kept_mass = probs[row][keep].sum().item()
        assert kept_mass >= p - 1e-6
        # Dropping the least likely kept token falls below p: the set is the smallest one.
        assert kept_mass - probs[row][keep].min().item() < p
        # It is a top set: every kept token is at least as likely as every dropped one.
        if (~keep).any():
            assert probs[row][keep].min() >= probs[row][~keep].max()


def test_top_k_then_top_p_uses_renormalised_mass():
    # Probabilities 0.4, 0.3, 0.2, 0.1; top-k 2 renormalises to 4/7, 3/7. With top_p 0.5 the top
    # token alone (4/7 ≈ 0.571) reaches p, so only it is kept (on the raw mass 0.4 < 0.5 two would be).
    logits = _logits([0.4, 0.3, 0.2, 0.1])
    out = filter_logits(logits, 2, 0.5)
    assert torch.isfinite(out)[0].tolist() == [True, False, False, False]
    assert torch.isfinite(filter_logits(logits, 0, 0.5))[0].tolist() == [True, True, False, False]
    assert math.isclose(out[0, 0].item(), math.log(0.4), rel_tol=1e-6)
