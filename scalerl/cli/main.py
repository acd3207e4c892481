"""`scalerl` command line: `scalerl train [--config run.yaml] [--set key=value ...]`, `scalerl train-rm [...]`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from scalerl.cli.common import command_overrides, guarded, launch_ranks, restarted, run_config, run_guarded, setup_logging
from scalerl.cli.config_ref import config_command
from scalerl.cli.estimate import estimate
from scalerl.cli.export_eval import evaluate, export
from scalerl.cli.launch import launch as launch_command
from scalerl.cli.plan import plan
from scalerl.cli.predict import predict
from scalerl.cli.report import report
from scalerl.errors import ScaleRLError

app = typer.Typer(add_completion=False, no_args_is_help=False, help="ScaleRL: RL post-training for language models.")


@app.callback()
def _root() -> None:
    """ScaleRL: RL post-training for language models (GRPO on CPU or GPU)."""


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file of overrides of the defaults."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key, e.g. --set optim.lr=3e-5 (repeatable)."),
    name: Optional[str] = typer.Option(None, "--name", help="Run name: the run directory is <log.run_dir>/<name>."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Shorthand for --set train.steps=N."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve Prometheus metrics on this port (--set log.metrics_port=N; 0: any free port)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run named by --name from its newest intact checkpoint, with its saved config (--set changes what may change mid-run)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete what the run folder of --name holds and start afresh."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Processes on this machine: runs `torchrun --standalone --nproc_per_node N` "
                                                       "over this command (parallel.strategy says how they split the learner)."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="With --nproc: torchrun restarts all processes this many times "
                                                                      "after one fails; each restart resumes the run of --name."),
) -> None:
    """Train a policy. With no arguments: GRPO on the built-in model and arithmetic environment."""
    overrides = command_overrides(set_, name, steps)
    if metrics_port is not None:
        overrides.append(f"log.metrics_port={metrics_port}")
    if nproc > 1 and dry_run:  # resolve what depends on the world size (cluster_preset) as the ranks will
        os.environ.setdefault("WORLD_SIZE", str(nproc))
        os.environ.setdefault("LOCAL_WORLD_SIZE", str(nproc))
    if nproc > 1 and not dry_run:
        argv = [*(["--config", str(config)] if config else []), *(a for v in overrides for a in ("--set", v)),
                *(["--resume"] if resume else []), *(["--overwrite"] if overwrite else []), *(["--debug"] if debug else [])]
        run_guarded(lambda: launch_ranks(nproc, max_restarts, argv, config, overrides, resume, overwrite), debug)
        return
    setup_logging()
    resume, overwrite = restarted(resume, overwrite)
    with guarded(debug):
        checked = run_config(config, overrides, dry_run=dry_run, resume=resume, overwrite=overwrite)
        if checked is not None:
            from scalerl.trainer.loop import train as run_training  # torch is imported only now

            run_training(checked, resume=resume, overwrite=overwrite)  # scalerl/trainer/loop.py


@app.command()
def sft(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file of overrides of the defaults (its sft: section, model, optim, precision...)."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key, e.g. --set sft.data=train.jsonl (repeatable)."),
    name: Optional[str] = typer.Option(None, "--name", help="Run name: the run directory is <log.run_dir>/<name>."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Shorthand for --set sft.steps=N."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run named by --name from its newest intact checkpoint, with its saved config."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete what the run folder of --name holds and start afresh."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Processes on this machine: runs `torchrun --standalone --nproc_per_node N` "
                                                       "over this command (parallel.strategy: ddp or fsdp2); each update's rows are split between them."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="With --nproc: torchrun restarts all processes this many times "
                                                                      "after one fails; each restart resumes the run of --name."),
) -> None:
    """Supervised fine-tuning on prompt/response data (loss on the response only); writes a model folder for scalerl train."""
    overrides = [*set_, *([f"log.name={name}"] if name is not None else []), *([f"sft.steps={steps}"] if steps is not None else [])]
    if nproc > 1:
        argv = [*(["--config", str(config)] if config else []), *(a for v in overrides for a in ("--set", v)),
                *(["--resume"] if resume else []), *(["--overwrite"] if overwrite else []), *(["--debug"] if debug else [])]
        run_guarded(lambda: launch_ranks(nproc, max_restarts, argv, config, overrides, resume, overwrite, command="sft"), debug)
        return
    resume, overwrite = restarted(resume, overwrite)
    setup_logging()
    with guarded(debug):
        from scalerl.cli.common import checked_config
        from scalerl.jobs.sft import run_sft  # torch is imported only now

        run_sft(checked_config(config, overrides, resume, overwrite), resume=resume, overwrite=overwrite)


app.command("report")(report)
app.command("export")(export)
app.command("eval")(evaluate)


@app.command("auto-shard")
def auto_shard(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The run's YAML config (its model, data and batch are profiled)."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key (repeatable)."),
    steps: int = typer.Option(20, "--steps", min=2, help="Training steps to profile (one process, a scratch run folder)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the parallel: section here (YAML, the report as comments); default: print it."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Profile how fast each parameter moves over K steps and write dynamic sharding's param_groups (source 000 §2.1)."""

    def go() -> None:
        from scalerl.config.checks import check_config
        from scalerl.config import load_config
        from scalerl.jobs.auto_shard import assign_intervals, param_groups_yaml, profile

        cfg = check_config(load_config(config, list(set_)))
        profiles = profile(cfg, steps)
        text = param_groups_yaml(profiles, assign_intervals(profiles), steps)
        if out is None:
            print(text, end="")
            return
        out.write_text(text)
        print("".join(line[2:] + "\n" for line in text.splitlines() if line.startswith("# ")), end="")
        print(f"wrote {out}: use it with scalerl train --config {out} (with your own config's keys beside it)")

    setup_logging()
    run_guarded(go, debug)


@app.command("continual")
def continual(
    root: Path = typer.Argument(..., help="The continual run's folder (state, events, one run per data file under segments/)."),
    watch: Path = typer.Option(..., "--watch", help="The folder new JSONL data files arrive in (each processed once, by name order)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file of overrides: the recipe of every segment."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key, e.g. --set continual.steps_per_batch=20 (repeatable)."),
    once: bool = typer.Option(False, "--once", help="Process the files there now and stop, instead of watching for more."),
    poll_s: float = typer.Option(30.0, "--poll-s", min=0.1, help="Seconds between looks at --watch."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Keep training on new data: online evaluation, incremental RL, validation with rollback (scalerl/jobs/continual.py)."""

    def go() -> None:
        from scalerl.config import load_config
        from scalerl.jobs.continual import STATE_FILE, run_continual

        saved = root / "config.yaml"
        if (root / STATE_FILE).is_file() and (config is not None or set_):
            raise ScaleRLError(f"{root} is a continual run already: it keeps its config.yaml; drop --config/--set, or choose another folder")
        cfg = load_config(saved) if (root / STATE_FILE).is_file() else load_config(config, list(set_))
        run_continual(root, cfg, watch, once=once, poll_s=poll_s)

    setup_logging()
    run_guarded(go, debug)


@app.command("train-rm")
def train_rm(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file of overrides of the reward-model defaults."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one key, e.g. --set epochs=3 --set data=prefs.jsonl (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Shorthand for --set out=DIR: where the model is saved."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out folder."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Train a reward model (Bradley-Terry) on preference pairs. With no arguments: the built-in model on the shipped arithmetic pairs."""
    from scalerl.rewards.rm_config import load_rm_config

    overrides = list(set_) + ([f"out={out}"] if out is not None else [])

    def go() -> None:
        rm_config = load_rm_config(config, overrides)
        from scalerl.rewards.reward_model import (
            train_reward_model,  # torch is imported only now
        )

        train_reward_model(rm_config, overwrite=overwrite)

    setup_logging()
    run_guarded(go, debug)


app.command("launch")(launch_command)
app.command("predict")(predict)
app.command("estimate")(estimate)
app.command("plan")(plan)
app.command("config")(config_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
