"""optim.offload: AdamW's states and step on the host (scalerl/precision/offload.py) give plain AdamW's numbers."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_metrics
from scalerl.precision.offload import HostOffloadAdamW
from scalerl.trainer import loop

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def _pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    plain = torch.optim.AdamW([{"params": list(model.parameters()), "lr": HYPER["lr"]}], **HYPER, fused=True)
    offloaded = HostOffloadAdamW([{"params": list(twin.parameters()), "lr": HYPER["lr"]}], **HYPER)
    return (model, plain), (twin, offloaded)


def _update(model, optimizer, x, lr, *, skip_last=False):
    model(x).pow(2).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # clipped on the device, before the host steps
    if skip_last:  # a parameter without a gradient this update: AdamW leaves it (and its moments) alone
        model[2].bias.grad = None
    optimizer.param_groups[0]["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_updates_equal_fused_adamw_bitwise():
    """Five updates with clipping, a changing lr, weight decay and one parameter left out of an update: the same
    weights and the same state dict as torch's fused AdamW, bit for bit; the states sit in host tensors, keyed
    by the device's parameters."""
    pairs = _pair()
    for i in range(5):
        x = torch.randn(3, 8)
        for model, optimizer in pairs:
            _update(model, optimizer, x, 1e-2 * (i + 1), skip_last=i == 2)
    (model, plain), (twin, offloaded) = pairs
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
    a, b = plain.state_dict(), offloaded.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])
    assert int(b["state"][3]["step"]) == 4 and int(b["state"][0]["step"]) == 5  # the last bias skipped once
    assert set(offloaded.state) == set(twin.parameters())
    assert all(s["exp_avg"].data_ptr() != p.data_ptr() for p, s in offloaded.state.items())


def test_weights_changed_outside_the_optimizer_are_the_ones_it_steps_from():
    """A rollback or checkpoint load writes the device's weights: the next update starts from them (the host
    copy is refreshed every update), as plain AdamW's would."""
    pairs = _pair()
    x = torch.randn(3, 8)
    for model, optimizer in pairs:
        _update(model, optimizer, x, 1e-2)
        with torch.no_grad():
            model[0].weight.mul_(0.5)  # e.g. health recovery restoring earlier weights
        _update(model, optimizer, x, 1e-2)
    (model, _), (twin, _) = pairs
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_state_dicts_move_between_offloaded_and_plain_adamw():
    """An offloaded run's optimizer state loads into plain AdamW and the other way round, and both go on alike."""
    (model, plain), (twin, offloaded) = _pair()
    x = torch.randn(3, 8)
    _update(model, plain, x, 1e-2)
    _update(twin, offloaded, x, 1e-2)
    other_plain = torch.optim.AdamW(list(twin.parameters()), **HYPER, fused=True)
    other_plain.load_state_dict(offloaded.state_dict())
    other_offloaded = HostOffloadAdamW(list(model.parameters()), **HYPER)
    other_offloaded.load_state_dict(plain.state_dict())
    assert other_offloaded.param_groups[0]["lr"] == 1e-2 and len(other_offloaded.state) == 4
    _update(model, other_offloaded, x, 2e-2)
    _update(twin, other_plain, x, 2e-2)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_a_run_with_offload_learns_what_one_without_does(runs, monkeypatch, caplog):
    """The trainer end to end (GRPO, a KL reference, clipping, a schedule): `optim.offload=true` on CPU steps
    through HostOffloadAdamW (one step per update, counted), gives the same metrics and weights as the default,
    and warns that it saves nothing here."""
    steps, real_step = [], HostOffloadAdamW.step
    monkeypatch.setattr(HostOffloadAdamW, "step", lambda self, *a, **k: steps.append(1) or real_step(self, *a, **k))
    extra = {"train.steps": 3, "algorithm.kl.beta": 0.05, "optim.schedule": "linear", "optim.warmup_steps": 1, "checkpoint.save_final": True}
    loop.train(load_config(overrides=tiny_overrides(runs, "plain", **extra)))
    assert steps == []
    loop.train(load_config(overrides=tiny_overrides(runs, "offload", **extra, **{"optim.offload": True})))
    assert len(steps) == 3 and "optim.offload=true saves nothing on CPU" in caplog.text
    untimed = [[{k: v for k, v in row.items() if "time" not in k and k != "tokens_per_s"} for row in read_metrics(runs / name)]
               for name in ("plain", "offload")]
    assert untimed[0] == untimed[1] and len(untimed[0]) == 3
    final = [(runs / name / "checkpoints" / "step_0000003" / "model.safetensors").read_bytes() for name in ("plain", "offload")]
    assert final[0] == final[1]

@pytest.mark.parametrize("overrides, says", [({"parallel.strategy": "fsdp2"}, "parallel.strategy=fsdp2"),
                                             ({"precision.mode": "compressed"}, "precision.mode fp32 or standard")])
def test_offload_refuses_what_it_cannot_step(runs, overrides, says):
    with pytest.raises((ScaleRLError, ValueError), match=says):
        load_config(overrides=tiny_overrides(runs, "x", **{"optim.offload": True, **overrides}))
