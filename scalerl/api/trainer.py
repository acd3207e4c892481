"""`scalerl.Trainer`: your model, your data and your reward functions, trained by the job `scalerl train` runs.

    trainer = Trainer(model="path/to/model", reward_funcs=[my_reward], train_dataset=rows,
                      config={"train.steps": 50, "optim.lr": 3e-5})
    summary = trainer.train()        # scalerl.trainer.loop.train(config, reward_funcs=...): the CLI's job
    trainer.evaluate()               # mean reward (or pass rate) of greedy completions on the held-out prompts
    trainer.save("out/model")        # a Hugging Face folder: AutoModelForCausalLM.from_pretrained("out/model")

What is handed over becomes the run's config, so the run folder's config.yaml says what ran: the dataset is
written as JSONL beside the run folder (`<log.run_dir>/<name>.inputs/train.jsonl`, read by the `reward_model`
environment: prompts without a verifier, scored by the reward functions), a model object is saved there as a
model folder, and each reward callable becomes a component `function: python:NAME`. Reward callables are
called in the trainer's process (a worker process could not import them): failures are contained as for any
reward function (the component's fallback, counted in reward/<name>_failures), but a call that hangs holds the
run. A config.yaml with `python:` components runs only from the script that holds the callables.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from scalerl.api.data import dataset_file, model_folder, reward_components, trl_style
from scalerl.config import Config, load_config, with_overrides
from scalerl.errors import ScaleRLError

__all__ = ["Config", "Trainer"]


def base_config(config: Config | str | Path | dict[str, Any] | None) -> Config:
    """A Config as given, from a YAML path, or the defaults with dotted-key overrides ({"optim.lr": 3e-5})."""
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return load_config(Path(config))
    if config is None or isinstance(config, dict):
        return load_config(overrides=config or {})
    raise ScaleRLError(f"config: got {type(config).__name__}; give a scalerl.Config, a YAML path or a dict of dotted keys")


class Trainer:
    """A training run built from a config plus Python objects.

    model: a model folder, 'builtin' (default; or whatever `config` names when left None) or a transformers model object
    reward_funcs: a callable or a list, each f(prompts, completions, **columns) -> list[float] (TRL's signature;
        columns: the dataset's other columns by name, plus answers, tasks, finished, group_ids); reward_weights: one each
    train_dataset: rows with a 'prompt' (text or chat messages): a list of dicts, a datasets.Dataset or a JSONL path;
        None keeps the config's environment (the reward functions then score its prompts)
    eval_dataset: held-out rows, same forms; default: the last tenth of train_dataset (1 to 8 rows), unless
        config sets env.args.eval_size or env.args.eval_file
    tokenizer: a folder or tokenizer object; default: the model's
    config: a scalerl.Config, a YAML path, or a dict of dotted keys; overrides: dotted keys set on top of it
    """

    def __init__(self, model: Any = None, reward_funcs: Callable | Sequence[Callable] | None = None, train_dataset: Any = None, *,
                 eval_dataset: Any = None, tokenizer: Any = None, config: Config | str | Path | dict[str, Any] | None = None,
                 overrides: dict[str, Any] | None = None, reward_weights: Sequence[float] | None = None):
        base = base_config(config)
        name = base.log.name or datetime.now().strftime("%Y%m%d-%H%M%S")
        inputs = base.log.run_dir / f"{name}.inputs"  # beside the run folder, which a new run empties
        changes: dict[str, Any] = {"log.name": name}
        if model is not None or tokenizer is not None:
            changes.update({f"model.{k}": v for k, v in model_folder(model or base.model.path, tokenizer, inputs).items()})
        self.reward_funcs: dict[str, Callable] = {}
        if reward_funcs is not None:
            components, funcs = reward_components(reward_funcs, reward_weights)
            self.reward_funcs = {name: trl_style(fn) for name, fn in funcs.items()}
            changes["reward.components"] = [c.model_dump(exclude_defaults=True) for c in base.reward.components] + components
        if train_dataset is not None:
            changes["env.name"], changes["env.args"] = "reward_model", data_args(base, train_dataset, eval_dataset, inputs)
        elif eval_dataset is not None:
            raise ScaleRLError("eval_dataset: give train_dataset too (the held-out prompts of a dataset of your own)")
        self.config = with_overrides(with_overrides(base, changes), overrides or {})
        self.summary: dict[str, Any] | None = None

    @property
    def run_dir(self) -> Path:
        """The run folder: config.yaml, metrics, checkpoints, summary.json."""
        return self.config.log.run_dir / self.config.log.name

    def train(self, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Run the training job (`scalerl train`'s, the same function); returns its summary (also in summary.json).
        `resume`: continue the run from its newest checkpoint; `overwrite`: replace a finished run of the same name."""
        from scalerl.trainer.loop import train

        self.summary = train(self.config, resume=resume, overwrite=overwrite, reward_funcs=self.reward_funcs)
        return self.summary

    def evaluate(self, *, max_tasks: int | None = None) -> float:
        """The held-out score of the run folder's newest checkpoint (after `train`: the trained model; before it, an
        earlier run's under the same `log.name`, which `train(resume=True)` would continue: said on stderr), else of the
        starting model; greedy as `eval.*` says: the pass rate of an environment with a verifier, else the mean weighted
        reward of the reward functions. A LoRA run's checkpoint is scored as its base with the adapters merged."""
        from scalerl.api.evaluate import held_out_score

        model = self.checkpoint() if self.summary is not None or (self.run_dir / "checkpoints").is_dir() else None
        if model is not None and self.summary is None:
            print(f"evaluate: scoring {model}, of an earlier run under log.name {self.config.log.name!r} (another log.name "
                  "scores the starting model)", file=sys.stderr)
        return held_out_score(self.config, model, self.reward_funcs, max_tasks or self.config.eval.max_tasks)

    def checkpoint(self) -> Path:
        """The run's newest intact checkpoint folder."""
        from scalerl.jobs.export import resolve_checkpoint

        return resolve_checkpoint(self.run_dir, warn=lambda line: print(line, file=sys.stderr))

    def save(self, path: str | Path, *, dtype: str = "fp32", overwrite: bool = False) -> Path:
        """Write the trained policy as a Hugging Face folder (weights in `dtype`, config, tokenizer, generation config),
        loadable with `AutoModelForCausalLM.from_pretrained(path)`; `scalerl export` writes the same folder (its default
        dtype is bf16, this one's fp32)."""
        from scalerl.jobs.export import export_model

        if self.summary is None and not (self.run_dir / "checkpoints").is_dir():
            raise ScaleRLError(f"save: {self.run_dir} has no checkpoint yet; call train() first")
        export_model(self.run_dir, Path(path), dtype, overwrite=overwrite, warn=lambda line: print(line, file=sys.stderr))
        return Path(path)


def data_args(base: Config, train_dataset: Any, eval_dataset: Any, inputs: Path) -> dict[str, Any]:
    """env.args of the `reward_model` environment for these datasets (written under `inputs` unless they are files)."""
    file, rows = dataset_file(train_dataset, inputs, "train", "train_dataset")
    own = base.env.args if base.env.name == "reward_model" else {}
    if eval_dataset is not None:
        return {"data_file": str(file), "eval_file": str(dataset_file(eval_dataset, inputs, "eval", "eval_dataset")[0])}
    own = {{"num_eval": "eval_size", "file": "data_file"}.get(k, k): v for k, v in own.items()}  # the older spellings
    if "eval_file" in own or "eval_size" in own:
        return {**{k: own[k] for k in ("eval_file", "eval_size") if k in own}, "data_file": str(file)}
    if rows < 2:
        raise ScaleRLError(f"train_dataset: {rows} row leaves none to hold out; give more rows or an eval_dataset")
    return {"data_file": str(file), "eval_size": max(1, min(8, rows // 10))}
