"""`rl-train`: the gym-style interface of the source documents.

    rl-train --algorithm grpo --model_name PATH_OR_ID --env_name arithmetic --total_timesteps 12800

Every flag is also spelled as every other command spells its flags (kebab-case): --model-name, --env-name,
--total-timesteps, --batch-size, --learning-rate.

A timestep is one completion (one episode of a single-turn environment), so the run takes
ceil(total_timesteps / (prompts_per_step x group_size)) training steps. `--batch_size` counts
completions per step too, as TRL does.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from scalerl.cli.common import launch, run_guarded, setup_logging
from scalerl.errors import ScaleRLError

ALGORITHMS = ("grpo", "cispo", "rloo", "reinforce_pp", "ppo")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rl-train", description="Train a policy (gym-style interface).")
    ap.add_argument("--algorithm", default=None, help=f"One of {', '.join(ALGORITHMS)} (algorithm.name; default grpo).")
    ap.add_argument("--model-name", "--model_name", dest="model_name", default=None, help="Model folder, hub id or 'builtin' (model.path).")
    ap.add_argument("--env-name", "--env_name", dest="env_name", default=None, help="Environment name or module:Class (env.name).")
    ap.add_argument("--total-timesteps", "--total_timesteps", dest="total_timesteps", type=float, default=None, help="Completions to sample in total (1e6 works).")
    ap.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=None, help="Completions per step (a multiple of the group size).")
    ap.add_argument("--learning-rate", "--learning_rate", dest="learning_rate", type=float, default=None, help="optim.lr")
    ap.add_argument("--seed", type=int, default=None, help="train.seed")
    ap.add_argument("--config", type=Path, default=None, help="YAML file of overrides.")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Override a config key (repeatable).")
    ap.add_argument("--name", default=None, help="Run name (log.name).")
    ap.add_argument("--resume", action="store_true", help="Continue the run of --name with its saved config.")
    ap.add_argument("--overwrite", action="store_true", help="Replace the run folder of --name.")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--debug", action="store_true")
    return ap


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    if args.algorithm is not None and args.algorithm not in ALGORITHMS:
        raise ScaleRLError(f"--algorithm: unknown algorithm '{args.algorithm}'; use one of {', '.join(ALGORITHMS)}")
    from scalerl.config import load_config

    overrides = [f"algorithm.name={args.algorithm}"] if args.algorithm else []
    overrides += args.set
    for flag, key in (("model_name", "model.path"), ("env_name", "env.name"), ("learning_rate", "optim.lr"),
                      ("seed", "train.seed"), ("name", "log.name")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    base = load_config(args.config, overrides)
    group = base.rollout.group_size
    if args.batch_size is not None:
        if args.batch_size % group:
            raise ScaleRLError(f"--batch_size {args.batch_size} must be a multiple of rollout.group_size ({group})")
        overrides.append(f"rollout.prompts_per_step={args.batch_size // group}")
    if args.total_timesteps is not None:
        per_step = (args.batch_size or base.batch_size)
        overrides.append(f"train.steps={max(1, math.ceil(args.total_timesteps / per_step))}")
    return overrides


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    setup_logging()
    overrides: list[str] = []
    run_guarded(lambda: overrides.extend(overrides_from_args(args)), args.debug)
    launch(args.config, overrides, dry_run=args.dry_run, resume=args.resume, debug=args.debug, overwrite=args.overwrite)


if __name__ == "__main__":
    main()
