"""'did you mean ...?': the nearest known key to a misspelled one: a known other name (TRL's spellings,
spelled-out short names such as learning_rate for lr), else difflib over the dotted keys."""

from __future__ import annotations

import difflib

# Other libraries' names (TRL's GRPOConfig, mostly) for keys of ours, by the last part of the key.
OTHER_NAMES = {
    "learning_rate": "optim.lr", "num_generations": "rollout.group_size", "max_completion_length": "rollout.max_new_tokens",
    "max_steps": "train.steps", "num_train_epochs": "train.epochs", "num_iterations": "train.epochs", "beta": "algorithm.kl.beta",
    "epsilon": "algorithm.clip_eps_low", "epsilon_high": "algorithm.clip_eps_high", "seed": "train.seed",
    "lr_scheduler_type": "optim.schedule", "max_grad_norm": "optim.max_grad_norm", "warmup_steps": "optim.warmup_steps",
    "model_name": "model.path", "model_name_or_path": "model.path", "output_dir": "log.run_dir", "eval_steps": "eval.every",
    "save_steps": "checkpoint.every", "loss_type": "algorithm.loss_agg", "temperature": "rollout.temperature",
}


def _initials(name: str) -> str:
    """learning_rate -> lr: how short settings are often spelled."""
    parts = [p for p in name.split("_") if p]
    return "".join(p[0] for p in parts) if len(parts) > 1 else ""


def nearest(key: str | None, known: list[str]) -> str:
    """'; did you mean `x`?' for the known key closest to `key`, or ''."""
    if not key:
        return ""
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
    if _initials(leaf) in siblings:
        match = [siblings[_initials(leaf)]]
    elif OTHER_NAMES.get(leaf) in known and OTHER_NAMES[leaf] != key:
        match = [OTHER_NAMES[leaf]]
    else:
        match = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean `{match[0]}`?" if match else ""
