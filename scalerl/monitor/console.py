"""What a person watching the run sees: a live progress bar, then a summary table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def _clock(seconds: float | None) -> str:
    """H:MM:SS, or — when unknown."""
    if seconds is None:
        return "—"
    s = max(int(round(seconds)), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RunConsole:
    """`rich`: a live bar with reward, KL and pass rate; `plain`: one line per step; `none`: silent.

    Only rank 0 builds one; the other ranks get mode `none`.
    """

    def __init__(self, mode: str, total_steps: int, start_step: int = 0, eval_label: str = "pass"):
        """`eval_label`: what the held-out figure is called on the bar ("pass": a verifier's pass rate; "eval": the mean
        fused reward of an environment without one)."""
        self.mode, self.total, self.eval_label = mode, total_steps, eval_label
        self.console = Console(stderr=False)
        self.pass_rate: float | None = None
        self._progress = None
        if mode == "rich":
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn(f"reward {{task.fields[reward]}}  kl {{task.fields[kl]}}  {eval_label} {{task.fields[pass_rate]}}"),
                # The ETA is the trainer's own estimate (scalerl/predict/time_estimate.py): it counts the
                # evaluations and checkpoints still to come, which rich's per-step rate cannot see.
                TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"), console=self.console,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, reward="—", kl="—", pass_rate="—", eta="—")
            self._progress.start()

    def print(self, message: str) -> None:
        if self.mode != "none":
            self.console.print(message, highlight=False)

    def step(self, step: int, metrics: dict[str, Any]) -> None:
        if metrics.get("eval/pass_rate") is not None:
            self.pass_rate = metrics["eval/pass_rate"]
        reward, kl, pr = _fmt(metrics.get("reward_mean")), _fmt(metrics.get("kl"), ".4f"), _fmt(self.pass_rate)
        eta = _clock(metrics.get("time/remaining_s"))
        if self._progress is not None:
            self._progress.update(self._task, completed=step, reward=reward, kl=kl, pass_rate=pr, eta=eta)
        elif self.mode == "plain":
            self.console.print(f"step {step}/{self.total}  reward {reward}  kl {kl}  loss {_fmt(metrics.get('loss'), '.4f')}  {self.eval_label} {pr}  eta {eta}", highlight=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def summary(self, summary: dict[str, Any]) -> None:
        if self.mode == "none":
            return
        table = Table(title="ScaleRL run summary", show_header=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")  # a long run directory wraps rather than being cut
        rows = [
            (f"held-out {summary.get('eval_metric', 'pass rate')}", f"{_fmt(summary['pass_rate_before'])} → {_fmt(summary['pass_rate_after'])}"),
            ("steps", str(summary["steps"])),
            ("wall time", f"{summary['wall_time_s']:.1f} s"),
            ("generated tokens/s", f"{summary['tokens_per_s']:.0f}"),
        ]
        if summary.get("phase_verdict"):
            rows.append(("reward curve", summary["phase_verdict"]))
        if summary.get("health_events"):
            rows.append(("health events", ", ".join(f"{rule} {n}" for rule, n in summary["health_events"].items()
                                                     if rule != "phase_verdict") or "none"))
        if summary.get("time_estimate_rel_error") is not None:
            est, upper = summary["time_estimate_at_10pct_s"], summary["time_upper_at_10pct_s"]
            cap = (f"; {upper:.1f} s had completions grown to max_new_tokens at the costs measured by then"
                   if upper is not None and upper > est else "")
            rows.append(("time estimate at 10 %", f"{est:.1f} s ({100 * summary['time_estimate_rel_error']:+.1f} % of the actual{cap})"))
        rows.append(("run directory", summary["run_dir"]))
        rows.append(("next", ("scalerl report DIR (the run on one HTML page), scalerl eval DIR, scalerl export DIR --out OUT "
                              "(a Hugging Face folder); DIR: the run directory")))
        for key, value in rows:
            table.add_row(key, value)
        self.console.print(table)
