"""Built-in `math` environment: prompts with a gold answer, judged for equivalence by math-verify.

Data: a JSONL file (`data_file`, one JSON object per line) or a Hugging Face dataset (`hf_dataset`:
a local folder written by `save_to_disk`, or a hub name, with `split`); the prompt and the gold
answer are read from the `prompt_column` and `answer_column` columns (other JSONL fields go to
`Task.meta`). With neither, the shipped `data/math_small.jsonl` (324 short problems made by
`scripts/make_math_data.py`, written for the built-in character model) is used. Each prompt is
`prompt_template` with every `{prompt}` replaced by the row's prompt.

Split: the rows are shuffled once with `random.Random(split_seed)`; the first `eval_size` are the
held-out set and the rest, in that order, the training pool. With `eval_split` (Hugging Face only)
the held-out set is instead the first `eval_size` rows of that split and all of `split` trains.

Correctness (`correct`, what the held-out pass rate measures): 1.0 iff the completion finished
(ended with EOS; `require_finished`) and math-verify judges its answer equal to the gold one
(`scalerl/envs/math_answers.py`: `3/4` = `0.75` = `\\frac{3}{4}` = `\\boxed{3/4}`), else 0.0.

Training reward (`score`), with the shaping rule of `scalerl/envs/shaping.py`:

    score = max(correct, shaping.weight · partial_credit)

where `partial_credit` is 1.0 iff the completion finished and math-verify reads a numeric answer
in it (a well-formed answer, right or wrong: `7`, `-3/4`, `0.5`, `x=4`), else 0.0, unless `shaping.function` names a
`module:function(task, completion) -> float` to use instead. `shaping.weight` defaults to 0, so by
default `score == correct`.

The environment is picklable (plain data, a config, and at most a module-level function), so
worker processes can call `score`; see `math_answers.py` for the thread rules of math-verify.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scalerl.envs.base import conversational_prompt, renamed_args
from scalerl.envs.math_answers import (
    answers_match,
    is_numeric_answer,
    parse_prediction,
    signal_timeout,
)
from scalerl.envs.shaping import ShapingConfig, import_partial_credit, shaped_reward
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.types import Completion, Task

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "math_small.jsonl"


class MathConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        return renamed_args(data, "math", {"data_path": "data_file", "num_eval": "eval_size"})

    data_file: Path | None = Field(None, description="JSONL file of problems; default: the shipped data/math_small.jsonl (older name: data_path).")
    hf_dataset: str | None = Field(None, description="A Hugging Face dataset: a save_to_disk folder or a hub name (needs `datasets`).")
    split: str = Field("train", description="Split of hf_dataset to read (ignored for a folder holding a single split).")
    eval_split: str | None = Field(None, description="Split of hf_dataset for the held-out set; default: carve eval_size rows out of `split`.")
    prompt_column: str = Field("prompt", description="Column holding the problem text.")
    answer_column: str = Field("answer", description="Column holding the gold answer (LaTeX or plain).")
    prompt_template: str = Field("{prompt}", description="The prompt given to the policy; every '{prompt}' is replaced by the problem.")
    eval_size: int = Field(50, ge=1, description="Held-out problems for the greedy pass rate.")
    split_seed: int = Field(0, description="Seed of the one shuffle that splits held-out from training problems.")
    require_finished: bool = Field(True, description="A completion cut off at max_new_tokens scores 0.")
    timeout_s: int = Field(5, ge=1, description="math-verify's per-parse/compare timeout (main thread only; see math_answers.py).")
    shaping: ShapingConfig = Field(default_factory=ShapingConfig, description="Partial credit for incorrect completions (scalerl/envs/shaping.py).")

    @field_validator("prompt_template")
    @classmethod
    def _has_placeholder(cls, value: str) -> str:
        if "{prompt}" not in value:
            raise ValueError("must contain '{prompt}', where the problem text goes")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MathConfig:
        if self.data_file is not None and self.hf_dataset is not None:
            raise ValueError("give data_file or hf_dataset, not both")
        if self.eval_split is not None and self.hf_dataset is None:
            raise ValueError("eval_split needs hf_dataset (a JSONL file has no splits)")
        return self


def read_jsonl_rows(path: Path, columns: tuple[str, str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, each checked to hold both `columns`."""
    rows = []
    for i, row in read_objects(path, expected=f"'{columns[0]}' and '{columns[1]}'", where="env.args.data_file"):
        for key, column in zip(("prompt_column", "answer_column"), columns):
            if column not in row:
                raise ScaleRLError(f"env.args.{key}: column '{column}' is missing from {path}:{i} "
                                   f"(it has: {', '.join(row) or 'nothing'}); set env.args.{key}")
        rows.append(row)
    return rows

def first_line(err: Exception) -> str:
    return str(err).splitlines()[0] if str(err) else ""


def read_hf_rows(name: str, split: str, columns: tuple[str, str], split_key: str = "split") -> list[dict[str, Any]]:
    """Rows (only the two `columns`) of a `save_to_disk` folder or a hub dataset's `split`
    (`split_key` names the config field that chose it, for messages)."""
    try:
        import datasets
    except ImportError:
        raise ScaleRLError("env.args.hf_dataset: needs the optional 'datasets' package; "
                           "pip install 'scalerl[datasets]', or use env.args.data_file with a JSONL file") from None
    where = f"{name} split '{split}'"
    if Path(name).is_dir():
        try:
            ds = datasets.load_from_disk(name)
        except FileNotFoundError as err:
            raise ScaleRLError(f"env.args.hf_dataset: {name} is not a save_to_disk folder ({first_line(err)})") from None
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ScaleRLError(f"env.args.{split_key}: {name} has no split '{split}'; use one of [{', '.join(ds)}]")
            ds = ds[split]
        elif split_key == "eval_split":
            raise ScaleRLError(f"env.args.eval_split: {name} holds a single split; drop eval_split to carve eval_size rows from it")
        else:
            where = name
    else:
        try:
            ds = datasets.load_dataset(name, split=split)
        except (FileNotFoundError, ConnectionError, ValueError) as err:
            raise ScaleRLError(f"env.args.hf_dataset: cannot load {where} ({type(err).__name__}: {first_line(err)}); "
                               "give a save_to_disk folder or a reachable dataset name") from None
    for key, column in zip(("prompt_column", "answer_column"), columns):
        if column not in ds.column_names:
            raise ScaleRLError(f"env.args.{key}: column '{column}' is missing from {where} "
                               f"(it has: {', '.join(ds.column_names)}); set env.args.{key}")
    if len(ds) == 0:
        raise ScaleRLError(f"env.args.hf_dataset: {where} holds no rows")
    return [{columns[0]: p, columns[1]: a} for p, a in zip(ds[columns[0]], ds[columns[1]])]


def partial_credit_for_form(completion: Completion, timeout_s: int = 5) -> float:
    """1.0 iff the completion finished and math-verify reads a numeric answer in it
    (`is_numeric_answer`: `7`, `-3/4`, `0.5`, `x=4`), else 0.0."""
    if not completion.finished:
        return 0.0
    return 1.0 if is_numeric_answer(parse_prediction(completion.text, signal_timeout(timeout_s))) else 0.0


class MathEnv:
    Config = MathConfig

    def __init__(self, config: MathConfig | None = None):
        self.config = config or MathConfig()
        c = self.config
        columns = (c.prompt_column, c.answer_column)
        if c.hf_dataset is not None:
            rows = read_hf_rows(c.hf_dataset, c.split, columns)
            eval_rows = read_hf_rows(c.hf_dataset, c.eval_split, columns, "eval_split") if c.eval_split else None
        else:
            rows, eval_rows = read_jsonl_rows(c.data_file or DEFAULT_DATA, columns), None
        tasks = [self._task(r) for r in rows]
        if eval_rows is not None:
            self._eval, self._train = [self._task(r) for r in eval_rows[: c.eval_size]], tasks
        else:
            if c.eval_size >= len(tasks):
                raise ScaleRLError(f"env.args.eval_size: {c.eval_size} leaves no training problems out of {len(tasks)}; lower it")
            random.Random(c.split_seed).shuffle(tasks)
            self._eval, self._train = tasks[: c.eval_size], tasks[c.eval_size:]
        self._partial = import_partial_credit(c.shaping.function) if c.shaping.function else None

    def _task(self, row: dict[str, Any]) -> Task:
        c = self.config
        meta = {k: v for k, v in row.items() if k not in (c.prompt_column, c.answer_column)}
        value = row[c.prompt_column]
        if isinstance(value, list):  # conversational rows: the messages go through the chat template as they are
            text, messages = conversational_prompt(value, f"env.args.prompt_column {c.prompt_column}")
            return Task(prompt=text, answer=str(row[c.answer_column]), meta={**meta, "messages": messages})
        return Task(prompt=c.prompt_template.replace("{prompt}", str(value)), answer=str(row[c.answer_column]), meta=meta)

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def correct(self, task: Task, completion: Completion) -> float:
        """The unshaped exact-answer score in {0, 1}: what the held-out pass rate averages."""
        if self.config.require_finished and not completion.finished:
            return 0.0
        return 1.0 if answers_match(task.answer, completion.text, timeout_s=self.config.timeout_s) else 0.0

    def partial_credit(self, task: Task, completion: Completion) -> float:
        """`shaping.function(task, completion)` when set, else 1.0 for a finished, well-formed answer."""
        if self._partial is not None:
            return float(self._partial(task, completion))
        return partial_credit_for_form(completion, self.config.timeout_s)

    def score(self, task: Task, completion: Completion) -> float:
        """The training reward: max(correct, shaping.weight · partial_credit)."""
        correct, weight = self.correct(task, completion), self.config.shaping.weight
        if correct == 1.0 or weight == 0.0:
            return correct
        return shaped_reward(correct, self.partial_credit(task, completion), weight)
