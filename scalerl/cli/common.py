"""What every entry point shares: logging setup, and turning errors into one line and exit code 2."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from scalerl.errors import ScaleRLError


def setup_logging() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no weight-loading bars or notices
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")


def run_guarded(fn: Callable[[], Any], debug: bool) -> None:
    """Run `fn`; a ScaleRLError becomes `error: <message>` on stderr and exit code 2 (traceback
    only with --debug). Anything else is a bug in ScaleRL and keeps its traceback."""
    try:
        fn()
    except ScaleRLError as err:
        if debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted; resume with --resume", file=sys.stderr)
        raise SystemExit(130) from None


def launch(config_path: Path | None, overrides: list[str], *, dry_run: bool, resume: bool, debug: bool) -> None:
    """Build the config, then print it (--dry-run) or train."""
    from scalerl.checks import check_config
    from scalerl.config import dump_config, load_config

    def go() -> None:
        config = check_config(load_config(config_path, overrides))
        if dry_run:
            print(dump_config(config), end="")
            return
        from scalerl.trainer.loop import train  # torch is imported only now

        train(config, resume=resume)

    setup_logging()
    run_guarded(go, debug)
