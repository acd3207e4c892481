"""A run's held-out evaluations as a forecast reads them, every input problem a one-line error or a stated skip.

From `metrics.jsonl` (the guarded reader: a torn last line is dropped with a note): the rows
with `eval/pass_rate`, their step and the cumulative generated `tokens` before them. From
`config.yaml`: the planned `train.steps` (0 when unknown). R0's observation is the step-0
evaluation, else `pass_rate_before` of summary.json, else the run's first evaluation whatever its
step (a run evaluated from step 1 on, still in flight): the forecast keeps that one at its own
compute, past the warm-up cut, since it is the nearest the run comes to R0. `r0_source` says which
("none" only for a run with no evaluation at all).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from scalerl.errors import ScaleRLError

COMPUTE_KEYS = ("steps", "tokens")


@dataclass(frozen=True)
class RunEvals:
    run_dir: Path
    steps: list[int]
    tokens: list[float]
    pass_rate: list[float]
    r0: float | None
    r0_source: str  # "step-0 evaluation", "summary.json", "first evaluation (step N)", "none"
    planned_steps: int  # 0: no config.yaml (or no train.steps in it)
    notes: list[str] = field(default_factory=list)  # stated skips
    has_tokens: bool = True

    def compute(self, key: str) -> list[float]:
        if key not in COMPUTE_KEYS:
            raise ScaleRLError(f"--compute: {key!r} is not one of {', '.join(COMPUTE_KEYS)}")
        if key == "tokens" and not self.has_tokens:
            raise ScaleRLError(f"{self.run_dir}/metrics.jsonl has no `tokens` metric to sum; use --compute steps")
        return [float(s) for s in self.steps] if key == "steps" else list(self.tokens)


def read_run_evals(run_dir: Path | str) -> RunEvals:
    from scalerl.jsonl import read_metrics

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ScaleRLError(f"{run_dir}: no such run directory; pass a folder under runs/ written by `scalerl train`")
    if not (run_dir / "metrics.jsonl").is_file():
        raise ScaleRLError(f"{run_dir}: no metrics.jsonl here; give a run directory written by `scalerl train`")
    steps, tokens, rates, notes = [], [], [], []
    total, has_tokens, skipped, r0 = 0.0, False, [], None
    for row in read_metrics(run_dir):
        if isinstance(row.get("tokens"), (int, float)):
            total += row["tokens"]
            has_tokens = True
        value = row.get("eval/pass_rate")
        if value is None:
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            skipped.append(row.get("step"))
            continue
        if not 0 <= value <= 1:
            raise ScaleRLError(f"{run_dir}/metrics.jsonl: eval/pass_rate {value:g} at step {row.get('step')} is not in [0, 1] "
                               "(a percentage?); the forecast needs pass rates as fractions")
        if int(row["step"]) == 0:
            r0 = float(value)
            continue
        steps.append(int(row["step"]))
        tokens.append(total)
        rates.append(float(value))
    if skipped:
        notes.append(f"skipped {len(skipped)} evaluation(s) with a non-finite pass rate (steps {', '.join(map(str, skipped[:5]))})")
    source = "step-0 evaluation" if r0 is not None else "none"
    if r0 is None and (run_dir / "summary.json").is_file():
        try:
            before = json.loads((run_dir / "summary.json").read_text()).get("pass_rate_before")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
            raise ScaleRLError(f"{run_dir}/summary.json is not a JSON object ({err}); remove it or rerun the run's end") from None
        if isinstance(before, (int, float)) and math.isfinite(before) and 0 <= before <= 1:
            r0, source = float(before), "summary.json"
    if r0 is None and steps:
        source = f"first evaluation (step {steps[0]})"
    return RunEvals(run_dir, steps, tokens, rates, r0, source, _planned_steps(run_dir), notes, has_tokens)


def _planned_steps(run_dir: Path) -> int:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return 0
    import yaml

    try:
        config = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ScaleRLError(f"{path}: not readable YAML ({str(err).splitlines()[0]})") from None
    train = (config or {}).get("train") if isinstance(config, dict) else None
    steps = train.get("steps") if isinstance(train, dict) else None
    return int(steps) if isinstance(steps, int) and steps > 0 else 0
