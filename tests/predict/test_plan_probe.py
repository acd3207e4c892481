"""`scalerl plan`'s probe (scalerl/jobs/probe.py): it runs the run's own sampler and learner at the shape it is
given, in one process or several (torchrun, gloo, FSDP2), and the plan adds the pilots' loop around it."""

from dataclasses import replace

import pytest

from scalerl.config import load_config
from scalerl.config.load import dump_config, with_overrides
from scalerl.errors import ScaleRLError
from scalerl.jobs.probe import ProbeSpec, probe

TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64, "eos_token_id": 1, "pad_token_id": 0}


def _spec(world=1, strategy="ddp", new_tokens=5):
    cfg = with_overrides(load_config(), {"precision.mode": "fp32", "train.threads": 1, "parallel.strategy": strategy, "train.device": "cpu",
                                          "rollout.prompts_per_step": 3, "rollout.group_size": 2})
    return ProbeSpec(config=dump_config(cfg), model=TINY, prompt_len=4, new_tokens=new_tokens, world=world)


@pytest.mark.parametrize("world,strategy", [(1, "ddp"), (2, "fsdp2")])
def test_the_probe_runs_the_shape_it_is_given(world, strategy):
    out = probe(_spec(world, strategy), repeats=2)
    assert len(out.rollout_s) == len(out.learn_s) == 2 and min(out.rollout_s + out.learn_s) > 0
    # every row decodes exactly the new tokens asked (EOS masked), the learner runs prompt + completion, per process
    assert (out.sampled, out.trained) == (3 * 2 * 5, 3 * 2 * (4 + 5))


def test_a_probe_that_cannot_build_the_model_says_so_in_one_line():
    with pytest.raises(ScaleRLError, match=r"^plan: the probe of a nope model failed \(.*\); run with --no-probe"):
        probe(replace(_spec(), model={**TINY, "model_type": "nope"}), repeats=1)
