"""Your model, your data, your reward, from Python: `python examples/python_api.py` (CPU, about a minute).

The model here is the built-in one (give a Hugging Face model folder, or a transformers model object and its
tokenizer); the data is a list of dicts (or a datasets.Dataset, or a JSONL path) whose `prompt` is the prompt and
whose other columns reach the reward functions by name; reward functions have TRL's signature. TRL scripts run
with `from scalerl.trl import GRPOConfig, GRPOTrainer` in place of `from trl import ...`.
"""

import random

from scalerl import Trainer

pairs = random.Random(0).sample([(a, b) for a in range(50) for b in range(50)], 240)
rows = [{"prompt": f"{a}+{b}=", "total": a + b} for a, b in pairs]  # `total`: a column, passed to the reward by name


def exact_sum(prompts, completions, total, **kwargs):
    return [1.0 if c.strip() == str(t) else 0.0 for c, t in zip(completions, total)]


def short(prompts, completions, **kwargs):
    return [1.0 if len(c) <= 3 else 0.0 for c in completions]


trainer = Trainer(
    model="builtin",
    reward_funcs=[exact_sum, short],
    reward_weights=[1.0, 0.1],
    train_dataset=rows,  # the last tenth (at most 8 rows) is held out; or give eval_dataset=
    config={"train.steps": 40, "eval.every": 20, "log.console": "plain"},
    overrides={"optim.lr": 1e-4},
)
summary = trainer.train()  # the job `scalerl train` runs; trainer.run_dir holds its config, metrics and checkpoints
print("held-out reward:", summary["pass_rate_before"], "->", summary["pass_rate_after"], "| again:", trainer.evaluate())
trainer.save("runs/python-api-model", overwrite=True)  # AutoModelForCausalLM.from_pretrained("runs/python-api-model")
