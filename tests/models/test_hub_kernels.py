"""model.hub_kernels: transformers' hub kernels stay off unless asked. From 5.2x on, transformers kernelizes every model it
loads wherever the `kernels` package is installed (its own dependency there): layers through kernels' wrappers, a kernel
downloaded from the Hub where one fits, and a re-kernelization at every train()/eval() switch."""

from __future__ import annotations

import pytest
import torch
import transformers.utils
from transformers import AutoModel, AutoModelForCausalLM

from scalerl.config import load_config
from scalerl.errors import ScaleRLError
from scalerl.learner.build import build_critic
from scalerl.models.loading import hub_kernels_kwargs, load_model

CPU = torch.device("cpu")


def _record(monkeypatch, cls) -> list[dict]:
    """The keyword arguments of every `cls.from_pretrained` call (the real one still loads)."""
    seen, real = [], cls.from_pretrained

    def recording(_cls, *args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(cls, "from_pretrained", classmethod(recording))
    return seen


def test_the_policy_and_the_critic_load_without_hub_kernels(monkeypatch):
    # as with transformers 5.2x and `kernels` installed, whose default is to kernelize (this venv's transformers is older)
    monkeypatch.setattr(transformers.utils, "is_kernels_available", lambda: True)
    policy_calls, critic_calls = _record(monkeypatch, AutoModelForCausalLM), _record(monkeypatch, AutoModel)
    config = load_config(overrides={"algorithm.name": "ppo", "algorithm.critic": "separate"})
    policy = load_model(config.model, CPU)
    build_critic(config, policy, CPU)
    assert [c["use_kernels"] for c in policy_calls] == [False] and [c["use_kernels"] for c in critic_calls] == [False]
    assert policy.use_kernels is False
    assert hub_kernels_kwargs(True) == {"use_kernels": True}  # asked for: passed on as asked


def test_hub_kernels_without_the_kernels_package_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(transformers.utils, "is_kernels_available", lambda: False)
    assert hub_kernels_kwargs(False) == {}  # nothing to turn off: transformers kernelizes nothing then
    with pytest.raises(ScaleRLError, match=r"^model.hub_kernels: needs the `kernels` package"):
        load_model(load_config(overrides={"model.hub_kernels": True}).model, CPU)
