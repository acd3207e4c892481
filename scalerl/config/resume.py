"""A resumed run starts from its own saved config (`<run_dir>/config.yaml`), not from the defaults.

    scalerl train --name r --resume                         # exactly the run's config
    scalerl train --name r --resume --set train.steps=600   # ... with this change, recorded

`resume_config` builds it: the saved config <- the `--config` file's keys <- `--set` overrides.
`check_resume` refuses changes that cannot happen mid-run (the model, the environment, the batch
shape, the algorithm, the seed) with one line; the others are applied, printed and recorded by
`record_resumed_config`: config.yaml becomes the config in force (written atomically, and only once
the checkpoint has loaded) and `config_changes.jsonl` gets one line per resume that changed
something: {"resumed_at_step", "changes": {key: [old, new]}}.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from scalerl.config import Config, dump_config, load_config, parse_override, read_yaml_mapping
from scalerl.config.presets import TOP_LEVEL_REWARD_KEYS
from scalerl.errors import ScaleRLError
from scalerl.files import write_atomically

FIXED = ("model.", "env.", "algorithm.name", "algorithm.critic", "rollout.prompts_per_step", "rollout.group_size",
         "train.mini_batch_size", "train.epochs", "train.seed", "preset")
LOCATION = ("log.run_dir", "log.name")  # where the run is: given to find it, never a change
CHANGES_FILE = "config_changes.jsonl"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and other values are leaves."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def checkpoint_config(run_dir: Path) -> Path | None:
    """The config.yaml the newest checkpoint was saved with (scalerl/trainer/persist.py puts it in every checkpoint),
    when its manifest lists it with the same SHA-256; None when no checkpoint holds one. (The whole checkpoint is
    verified when it loads; this only finds the config to start from.)"""
    folders = [p for p in (run_dir / "checkpoints").glob("step_*") if re.fullmatch(r"step_\d{7}", p.name)] if run_dir.is_dir() else []
    for folder in sorted(folders, reverse=True):
        path = folder / "config.yaml"
        try:
            want = json.loads((folder / "manifest.json").read_text())["files"]["config.yaml"]["sha256"]
            if not path.is_symlink() and hashlib.sha256(path.read_bytes()).hexdigest() == want:
                return path
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no manifest, no config in it, or damaged: an older checkpoint may do
    return None


def saved_config_path(run_dir: Path) -> Path:
    """The run's config.yaml, or when it was lost, the one its newest checkpoint carries."""
    path = run_dir / "config.yaml"
    if path.is_file():
        return path
    if (kept := checkpoint_config(run_dir)) is not None:
        return kept
    raise ScaleRLError(f"--resume: {run_dir} holds no run to resume (no config.yaml, and no checkpoint with its config); "
                       "pass the same log.name (and log.run_dir) as the run you resume")


def saved_config(run_dir: Path) -> Config:
    return load_config(saved_config_path(run_dir))


def resume_items(config_path: Path | None, overrides: list[str]) -> dict[str, Any]:
    """The file's keys and the overrides as dotted keys, the source documents' top-level spellings
    (`reward_components`, `fusion_method`) as the keys they stand for: the saved config spells them so."""
    items = flatten(read_yaml_mapping(config_path, "model:, env:, ..."))
    items.update(parse_override(item) for item in overrides)
    for top, key in TOP_LEVEL_REWARD_KEYS.items():
        if top in items:
            if key in items:
                raise ScaleRLError(f"{top} and {key} are the same setting; give only one")
            items[key] = items.pop(top)
    return items


def resume_config(config_path: Path | None, overrides: list[str]) -> Config:
    """The config of `--resume`: the run's saved config with the file's keys and the overrides on top."""
    located = load_config(config_path, overrides)
    if located.log.name is None:
        raise ScaleRLError("--resume needs the run's name: add --name NAME (or set log.name)")
    run_dir = located.log.run_dir / located.log.name
    saved = saved_config_path(run_dir)  # a clear error when there is no run there
    items = resume_items(config_path, overrides)
    items.update({"log.run_dir": str(located.log.run_dir), "log.name": located.log.name})
    return load_config(saved, items)


def config_changes(old: Config, new: Config) -> dict[str, list[Any]]:
    """{dotted key: [old value, new value]} for every key whose value differs (the run's location aside)."""
    before, after = flatten(old.model_dump(mode="json")), flatten(new.model_dump(mode="json"))
    return {k: [before.get(k), after.get(k)] for k in sorted(before.keys() | after.keys())
            if before.get(k) != after.get(k) and k not in LOCATION}


def check_resume(config: Config, run_dir: Path) -> dict[str, list[Any]]:
    """The changes a resume makes to the run's saved config; a one-line error for one that cannot be made mid-run."""
    changes = config_changes(saved_config(run_dir), config)
    fixed = [k for k in changes if k.startswith(FIXED)]
    if fixed:
        key = fixed[0]
        old, new = changes[key]
        more = f" (and {len(fixed) - 1} more)" if len(fixed) > 1 else ""
        raise ScaleRLError(f"--resume: {key} cannot change mid-run ({old!r} -> {new!r}){more}; drop that override to resume "
                           f"{run_dir}, or start a new run under another --name")
    return changes


def record_resumed_config(config: Config, run_dir: Path, step: int) -> dict[str, list[Any]]:
    """After the checkpoint loaded: print the changes (`check_run_dir` already refused the fixed ones),
    make config.yaml the config in force, log them."""
    changes = config_changes(saved_config(run_dir), config)
    if not (run_dir / "config.yaml").is_file():  # lost: the run's record again, from the config in force
        write_atomically(run_dir / "config.yaml", dump_config(config))
    if not changes:
        return changes
    print("resume changes the run's config: " + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    write_atomically(run_dir / "config.yaml", dump_config(config))
    with open(run_dir / CHANGES_FILE, "a") as f:
        f.write(json.dumps({"resumed_at_step": step, "changes": changes}) + "\n")
    return changes
