"""TRL's W2 script (shared/bench/trl_grpo_w2.py) unchanged but for the model's attention implementation.

    cd ../shared/bench && ../../main/.bench/trl-venv/bin/python ../../main/bench/trl_w2_attn.py eager [--bf16] [--no-probe]

The reference script builds its model with transformers' default (sdpa); this runs the same script
with `model.set_attn_implementation(NAME)` right after the model is built, so that TRL gets the same
attention option as ScaleRL's `model.attn_implementation` (bench/w2_parity.py uses it).
"""

import os
import sys

sys.path.insert(0, os.getcwd())  # the reference folder: trl_grpo_w2 and tiny_task
import trl_grpo_w2  # noqa: E402

name = sys.argv.pop(1)
build = trl_grpo_w2.build_w2_model


def build_with_attention(tokenizer):
    model = build(tokenizer)
    model.set_attn_implementation(name)
    return model


trl_grpo_w2.build_w2_model = build_with_attention
trl_grpo_w2.main()
