"""`scalerl report RUN_DIR [--out FILE]`: the run's HTML report (plots, events, verdict, forecast)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from scalerl.cli.common import run_guarded, setup_logging


def report(
    run_dir: Path = typer.Argument(..., help="A run directory of `scalerl train` (holds metrics.jsonl)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the HTML file; default <RUN_DIR>/report.html."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Write a self-contained HTML report of a run: curves with health events, verdict, reward forecast."""

    def go() -> None:
        from scalerl.monitor.report import (
            write_report,  # matplotlib is imported only now
        )

        print(f"report: {write_report(run_dir, out)}")

    setup_logging()
    run_guarded(go, debug)
