"""Built-in `reasoning_gym` environment: procedural tasks from reasoning-gym, scored by each dataset's own verifier.

reasoning-gym (`pip install 'scalerl[reasoning-gym]'`) generates over a hundred task families (arithmetic,
algebra, logic, puzzles, counting, graphs) offline from a seed; item i of a dataset of seed s is drawn
from `Random(s + i)`, and each dataset has its own `score_answer(answer, entry) -> float`.

    env:
      name: reasoning_gym
      args:
        datasets:
          - {name: basic_arithmetic, weight: 3, size: 2000, config: {max_terms: 2, max_digits: 2}}
          - {name: leg_counting, size: 500}
        extract: answer_tag

Training pool: each dataset gives `size` tasks from the seeds seed .. seed + size − 1. The pool is
`Σ size` prompts long; position k comes from dataset d with probability weight_d / Σ weight (one draw by
`random.Random(mix_seed)`), taking that dataset's tasks in turn (a dataset with a small size and a large
weight repeats its tasks). Held-out set: `eval_size` tasks of each dataset from the seeds eval_seed,
eval_seed + 1, ... (default: seed + size, the first seeds the pool did not use), so no held-out task comes
from a seed trained on; with `eval_unseen` (default) a held-out task whose question is also in the pool
(a small task space repeats questions across seeds) is skipped for the next seed.

Prompt: `prompt_template` with `{question}` replaced by the dataset's question. Answer extraction
(`extract`) and the template it pairs with (the default template of each mode):

    answer_tag   the text inside the last <answer>...</answer> of the completion, stripped (reasoning-gym's
                 own `extract_answer`); no tag: no answer.
                 default template: "{question}\\nGive your final answer inside <answer></answer> tags."
    last_line    the completion's last non-empty line, stripped (a completion of one line: all of it).
                 default template: "{question}\\nGive only the final answer on the last line."

Reward (`score`): the dataset's `score_answer(extracted, entry)`, a float in [0, 1] (some datasets give
partial credit, e.g. for an answer that contains the right one); 0.0 when no answer was extracted or, with
`require_finished`, when the completion was cut off at max_new_tokens. Correctness (`correct`, what the
held-out pass rate and `scalerl eval` average): 1.0 iff that score is 1.0.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalerl.errors import ScaleRLError
from scalerl.types import Completion, Task

MISSING = "env.name=reasoning_gym needs the optional reasoning-gym package: pip install 'scalerl[reasoning-gym]'"
TEMPLATES = {
    "answer_tag": "{question}\nGive your final answer inside <answer></answer> tags.",
    "last_line": "{question}\nGive only the final answer on the last line.",
}
RESERVED = ("seed", "size")  # set by the environment from the dataset's own fields


def reasoning_gym_module() -> Any:
    """The reasoning_gym package, or the one-line error naming the extra."""
    try:
        import reasoning_gym
    except ImportError:
        raise ScaleRLError(MISSING) from None
    return reasoning_gym


def registered_datasets() -> dict[str, tuple[type, type]]:
    """reasoning-gym's datasets by name: (dataset class, config dataclass)."""
    reasoning_gym_module()
    from reasoning_gym.factory import DATASETS

    return DATASETS


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="A reasoning-gym dataset name, e.g. basic_arithmetic, leg_counting, spell_backward.")
    weight: float = Field(1.0, gt=0, description="Share of the training prompts drawn from this dataset (normalised over the datasets).")
    size: int = Field(1000, ge=1, description="Distinct training tasks: the seeds seed .. seed + size - 1.")
    seed: int = Field(0, ge=0, description="First seed of the training tasks.")
    eval_size: int = Field(100, ge=1, description="Held-out tasks of this dataset.")
    eval_seed: int | None = Field(None, ge=0, description="First seed of the held-out tasks; default seed + size (disjoint from the training seeds).")
    config: dict[str, Any] = Field(default_factory=dict, description="The dataset's own config options (its config dataclass's fields, less seed and size).")

    def held_out_seed(self) -> int:
        return self.seed + self.size if self.eval_seed is None else self.eval_seed


class ReasoningGymConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    datasets: list[DatasetSpec] = Field(..., min_length=1, description="One or more reasoning-gym datasets; a bare name is {name: NAME}.")
    extract: Literal["answer_tag", "last_line"] = Field("answer_tag", description="How the answer is read from a completion: the last <answer>...</answer>, or the last non-empty line.")
    prompt_template: str | None = Field(None, description="The prompt, with {question} replaced by the task's question; default: the extract mode's template (see the module docstring).")
    require_finished: bool = Field(True, description="A completion cut off at max_new_tokens (no EOS) scores 0.")
    eval_unseen: bool = Field(True, description="Skip held-out tasks whose question is also in the training pool (the next seed is taken instead).")
    mix_seed: int = Field(0, description="Seed of the draw that interleaves the datasets' tasks by weight in the training pool.")

    @model_validator(mode="before")
    @classmethod
    def _bare_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("datasets"), list):
            data = {**data, "datasets": [{"name": d} if isinstance(d, str) else d for d in data["datasets"]]}
        return data

    @model_validator(mode="after")
    def _check_datasets(self) -> ReasoningGymConfig:
        known = registered_datasets()
        for i, spec in enumerate(self.datasets):
            check_dataset(spec, known, f"env.args.datasets.{i}")
        if "{question}" not in self.template():
            raise ValueError("prompt_template must contain {question}")
        return self

    def template(self) -> str:
        return self.prompt_template if self.prompt_template is not None else TEMPLATES[self.extract]


def check_dataset(spec: DatasetSpec, known: dict[str, tuple[type, type]], where: str) -> None:
    """Raise a one-line ScaleRLError for an unknown dataset name, a config key its config does not take, or
    held-out seeds that overlap the training ones. (A ScaleRLError, not a ValueError: it reaches the user as is.)"""
    if spec.name not in known:
        close = difflib.get_close_matches(spec.name, list(known), n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise ScaleRLError(f"{where}.name: unknown reasoning-gym dataset '{spec.name}'{hint} "
                           f"({len(known)} datasets: python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))')")
    fields = [f.name for f in dataclasses.fields(known[spec.name][1]) if f.name not in RESERVED]
    for key in spec.config:
        if key in RESERVED:
            raise ScaleRLError(f"{where}.config.{key}: set it as {where}.{key} (the environment sets the dataset's {key})")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise ScaleRLError(f"{where}.config.{key}: {spec.name} takes no option '{key}'{hint}; allowed: {', '.join(fields)}")
    start, end = spec.held_out_seed(), spec.held_out_seed() + spec.eval_size
    if start < spec.seed + spec.size and spec.seed < end:
        raise ScaleRLError(f"{where}.eval_seed: the held-out seeds {start}..{end - 1} overlap the training seeds "
                           f"{spec.seed}..{spec.seed + spec.size - 1}; leave eval_seed unset or move it past them")


def make_dataset(spec: DatasetSpec, seed: int, size: int, where: str) -> Any:
    """reasoning-gym's dataset of `spec` with this seed and size; its config's own checks as one line."""
    rg = reasoning_gym_module()
    try:
        return rg.create_dataset(spec.name, seed=seed, size=size, **spec.config)
    except (AssertionError, ValueError, TypeError) as err:
        raise ScaleRLError(f"{where}.config: {spec.name} refused it ({type(err).__name__}: {str(err) or 'a check failed'}); "
                           "fix the option's value") from None


def extract_answer(text: str, mode: str) -> str | None:
    """The answer in a completion (see the module docstring), or None."""
    if mode == "answer_tag":
        from reasoning_gym.utils import extract_answer as tagged

        return tagged(text, tag_name="answer", strip=True)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


class ReasoningGymEnv:
    Config = ReasoningGymConfig

    def __init__(self, config: ReasoningGymConfig):
        self.config = c = config
        self._datasets: dict[int, Any] = {}  # the scorer of each dataset spec, by index
        pools: list[list[Task]] = []
        self._eval: list[Task] = []
        for i, spec in enumerate(c.datasets):
            where = f"env.args.datasets.{i}"
            train = make_dataset(spec, spec.seed, spec.size, where)
            self._datasets[i] = train
            pools.append([self._task(i, train[k]) for k in range(spec.size)])
            self._eval += self._held_out(i, spec, {t.meta["question"] for t in pools[-1]}, where)
        self._train = mix(pools, [s.weight for s in c.datasets], c.mix_seed)

    def _task(self, index: int, entry: dict[str, Any]) -> Task:
        prompt = self.config.template().replace("{question}", entry["question"])
        return Task(prompt=prompt, answer=str(entry["answer"]),
                    meta={"dataset": index, "question": entry["question"], "entry": entry})

    def _held_out(self, index: int, spec: DatasetSpec, seen: set[str], where: str) -> list[Task]:
        """eval_size tasks from the held-out seeds, skipping questions of the pool when eval_unseen."""
        tries = spec.eval_size * 20 if self.config.eval_unseen else spec.eval_size
        held = make_dataset(spec, spec.held_out_seed(), tries, where)
        tasks = []
        for k in range(tries):
            entry = held[k]
            if not (self.config.eval_unseen and entry["question"] in seen):
                tasks.append(self._task(index, entry))
            if len(tasks) == spec.eval_size:
                return tasks
        raise ScaleRLError(f"{where}.eval_size: only {len(tasks)} of {tries} held-out tasks of {spec.name} have a question "
                           f"the training pool lacks; lower eval_size or size, widen the task's config, or set "
                           "env.args.eval_unseen=false")

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def score(self, task: Task, completion: Completion) -> float:
        """The dataset's own score_answer of the extracted answer (0.0 without one, or when cut off and require_finished)."""
        if self.config.require_finished and not completion.finished:
            return 0.0
        answer = extract_answer(completion.final_turn, self.config.extract)
        if answer is None:
            return 0.0
        return float(self._datasets[task.meta["dataset"]].score_answer(answer, task.meta["entry"]))

    def correct(self, task: Task, completion: Completion) -> float:
        """1.0 iff the dataset's score is 1.0 (a full-credit answer): what held-out pass rates average."""
        return 1.0 if self.score(task, completion) == 1.0 else 0.0


def mix(pools: list[list[Task]], weights: list[float], seed: int) -> list[Task]:
    """Σ len(pool) tasks: each position from pool d with probability weights[d] / Σ weights, each pool's tasks in turn."""
    if len(pools) == 1:
        return list(pools[0])
    rng = random.Random(seed)
    picks = rng.choices(range(len(pools)), weights=weights, k=sum(len(p) for p in pools))
    taken = [0] * len(pools)
    out = []
    for d in picks:
        out.append(pools[d][taken[d] % len(pools[d])])
        taken[d] += 1
    return out
