"""`python -m scalerl.train`: the flag-style interface of the source documents.

    python -m scalerl.train --use_flash_attn 2 --gradient_checkpointing 1 --offload_optimizer 1 --adam_offload 1

Each flag maps onto one config key (see `FLAG_KEYS`); `--config` and `--set` work as in
`scalerl train`. On a machine without a CUDA GPU, flash attention falls back to sdpa and optimizer
offload saves nothing (the offloaded AdamW still runs), each with a one-line warning.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scalerl.cli.common import launch


_WORDS = {"true": 1, "yes": 1, "on": 1, "false": 0, "no": 0, "off": 0}


def _flag(value: str) -> int:
    """A <bool> flag's value as it is shown or written: 0, 1 (2 for --use_flash_attn), true/false, yes/no, on/off."""
    if value.strip().lower() in _WORDS:
        return _WORDS[value.strip().lower()]
    try:
        return int(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not 0, 1, true or false") from None


def overrides_from_flags(args: argparse.Namespace) -> list[str]:
    overrides = list(args.set)
    if args.use_flash_attn is not None:  # 1 and 2 both mean FlashAttention-2 (the only one transformers supports)
        overrides.append(f"model.attn_implementation={'flash_attention_2' if args.use_flash_attn else 'sdpa'}")
    if args.gradient_checkpointing is not None:
        overrides.append(f"model.gradient_checkpointing={bool(args.gradient_checkpointing)}")
    offload = [v for v in (args.offload_optimizer, args.adam_offload) if v is not None]
    if offload:
        overrides.append(f"optim.offload={any(offload)}")
    for flag, key in (("steps", "train.steps"), ("name", "log.name"), ("model_name", "model.path"), ("env_name", "env.name")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return overrides


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scalerl.train", description="Train a policy (flag-style interface).")
    ap.add_argument("--config", type=Path, default=None, help="YAML file of overrides.")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Override a config key (repeatable).")
    ap.add_argument("--use_flash_attn", type=_flag, default=None, help="1 or 2: FlashAttention-2 (CUDA only; sdpa elsewhere).")
    ap.add_argument("--gradient_checkpointing", type=_flag, default=None, help="1: recompute activations in backward.")
    ap.add_argument("--offload_optimizer", type=_flag, default=None, help="1: keep optimizer states in host memory.")
    ap.add_argument("--adam_offload", type=_flag, default=None, help="Same as --offload_optimizer.")
    ap.add_argument("--model_name", default=None, help="Model folder or hub id (model.path).")
    ap.add_argument("--env_name", default=None, help="Environment name or module:Class (env.name).")
    ap.add_argument("--steps", type=int, default=None, help="Training steps (train.steps).")
    ap.add_argument("--name", default=None, help="Run name (log.name).")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--debug", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    launch(args.config, overrides_from_flags(args), dry_run=args.dry_run, resume=args.resume, debug=args.debug)


if __name__ == "__main__":
    main()
