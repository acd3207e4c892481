"""gae against a plain reverse loop and by hand; whiten over a mask."""

import math

import pytest
import torch

from scalerl.algorithms.advantages import gae, whiten


def _reference_gae(rewards, values, lengths, gamma, lam):
    """The textbook loop, one row at a time, only over the row's own tokens."""
    T = len(rewards[0])
    advs, rets = [], []
    for r, v, n in zip(rewards, values, lengths):
        adv, last = [0.0] * T, 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            delta = r[t] + gamma * next_v - v[t]
            last = delta + gamma * lam * last
            adv[t] = last
        advs.append(adv)
        rets.append([adv[t] + v[t] if t < n else 0.0 for t in range(T)])
    return torch.tensor(advs, dtype=torch.float64), torch.tensor(rets, dtype=torch.float64)


def test_gae_by_hand():
    # One row of 2 tokens, then 1 padding token with garbage reward/value. γ = 0.9, λ = 0.8:
    #   δ_1 = 1 + 0.9·0 − 0.8 = 0.2                    Â_1 = 0.2
    #   δ_0 = 0 + 0.9·0.8 − 0.5 = 0.22                 Â_0 = 0.22 + 0.72·0.2 = 0.364
    #   returns = Â + V = (0.864, 1.0), padding 0.
    rewards = torch.tensor([[0.0, 1.0, 7.0]])
    values = torch.tensor([[0.5, 0.8, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.364, 0.2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.864, 1.0, 0.0]]))


@pytest.mark.parametrize("gamma, lam", [(0.9, 0.8), (0.99, 0.95), (1.0, 0.5), (0.5, 1.0)])
def test_gae_matches_reverse_loop_across_padding(gamma, lam):
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    lengths = [6, 3, 1, 0]  # rows of different lengths, one entirely padding
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = _reference_gae(rewards.tolist(), values.tolist(), lengths, gamma, lam)
    assert torch.allclose(adv, ref_adv)
    assert torch.allclose(ret, ref_ret)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    # γ = λ = 1: Â_t = Σ_{s ≥ t} r_s − V_t. Row 0 (3 tokens): rewards (0, 0, 1), V (0.2, 0.4, 0.6)
    #   -> reward-to-go (1, 1, 1) -> Â = (0.8, 0.6, 0.4), returns (1, 1, 1).
    # Row 1 (2 tokens): rewards (0.5, −1), V (0, 1) -> to-go (−0.5, −1) -> Â = (−0.5, −2),
    # returns (−0.5, −1).
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, -1.0, 3.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.8, 0.6, 0.4], [-0.5, -2.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0], [-0.5, -1.0, 0.0]]))


def test_gae_lambda_zero_is_one_step_td():
    # λ = 0: Â_t = δ_t. Values (1, 2), reward (0, 3), γ = 0.5: δ = (0 + 0.5·2 − 1, 3 + 0 − 2) = (0, 1).
    adv, ret = gae(torch.tensor([[0.0, 3.0]]), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2), gamma=0.5, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.0, 1.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 3.0]]))


def test_gae_no_gradient_and_untrained_positions_skipped():
    values = torch.ones(1, 3, requires_grad=True)
    adv, ret = gae(torch.ones(1, 3), values, torch.ones(1, 3))
    assert not adv.requires_grad and not ret.requires_grad
    # An untrained position (a multi-turn observation) is skipped: 0 there, the rest as if it were absent.
    gap, _ = gae(torch.ones(1, 3), torch.ones(1, 3), torch.tensor([[1, 0, 1]]), gamma=0.9, lam=0.8)
    dense, _ = gae(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2), gamma=0.9, lam=0.8)
    assert gap[0, 1] == 0 and torch.equal(gap[:, [0, 2]], dense)


def test_whiten_masked():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, -100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # Trained entries 1, 2, 3, 4: mean 2.5, Bessel var (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3.
    s = math.sqrt(5 / 3 + 1e-8)
    expected = torch.tensor([[-1.5, -0.5, 0.5], [1.5, 0.0, 0.0]]) / s
    expected[1, 1:] = 0.0  # padding is zeroed
    out = whiten(values, mask)
    assert torch.allclose(out, expected, atol=1e-6)
    assert out[mask.bool()].mean().abs().item() < 1e-6
    assert out[mask.bool()].std().item() == pytest.approx(1.0, abs=1e-6)
    # shift_mean=False keeps the mean: + 2.5 on the trained entries.
    kept = whiten(values, mask, shift_mean=False)
    assert torch.allclose(kept, (expected + 2.5) * mask, atol=1e-6)


def test_whiten_degenerate_masks_are_finite():
    values = torch.tensor([[3.0, 1.0]])
    assert torch.equal(whiten(values, torch.zeros(1, 2)), torch.zeros(1, 2))
    assert torch.equal(whiten(values, torch.tensor([[1, 0]])), torch.zeros(1, 2))  # one entry: 0
