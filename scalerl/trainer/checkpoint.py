"""Crash-consistent checkpoints: a complete one is never lost, a partial or damaged one is never loaded.

A save writes everything into `checkpoints/step_NNNNNNN.tmp/`, then `manifest.json` (every file's
size and SHA-256), fsyncs every file, writes the `COMPLETE` marker last, renames the folder to
`step_NNNNNNN` and fsyncs the parent. Only folders with the marker count. A save that fails (a
full disk) removes its `.tmp` folder and raises a one-line error with the space it needed; the
previous checkpoint is untouched. Deletion (rotation, keeping `keep_last`, only after the new one
is complete) first renames a folder to `step_NNNNNNN.deleting`, so no marked folder is ever partial.

Resume takes the newest checkpoint that verifies: its files are exactly those of its manifest, with
their sizes and hashes (see "A checkpoint is data" below). A damaged one (truncated weights, a lost
DCP shard, a garbled trainer_state.json, a file added) is renamed `step_NNNNNNN.damaged`, kept for
inspection, and named in a warning; the run resumes from the next older one. One that verifies but
does not load is a one-line error (another run's config). Leftover `.tmp` and `.deleting` folders of
a killed run are removed on resume.

Contents:
- `dcp/`: the weights and optimizer state (and a critic's) through `torch.distributed.checkpoint`:
  each rank writes its own shards, the coordinator writes `.metadata` last (DCP's own commit), keys
  are the modules' plain parameter names, so a run saved with N ranks under any strategy resumes
  with M (DCP reshards on load). This is what resume reads.
- the policy in Hugging Face format (safetensors + config.json + tokenizer, loadable with
  `from_pretrained`), consolidated from the shards by rank 0, and `critic.safetensors` for PPO's
  critic: what people deploy or evaluate. A LoRA run (`model.lora`) holds only its adapters, in
  both: `adapter_model.safetensors` + `adapter_config.json` (peft's format, naming the base model;
  `from_pretrained` loads base and adapters when peft is installed, `scalerl export --merge-lora`
  merges them).
- `rng_rank<R>.pt` per rank, and `trainer_state.json` (step, the rollout side's state: data
  position, reward state, policy version; the learner's: version, updates taken, which is the lr
  schedule's position, health responses, β controller; the health monitor's).
On a multi-node run the run folder must be on a filesystem every node sees.
Checkpoints of earlier versions (`optimizer.pt`, no `dcp/`) still load, at world size 1.

A checkpoint is data: people resume from checkpoints they did not write, so nothing in one may run.
- The manifest is checked before anything in the folder is opened: every file it lists has its size
  and SHA-256, and the folder holds nothing it does not list (besides `manifest.json`, `manifest.sig`
  and `COMPLETE`; no link, no special file). A checkpoint without a manifest (one of before manifests,
  or one whose manifest was deleted) is never opened: `load_newest_intact` moves it to
  `step_NNNNNNN.unverified` with a warning. To trust one you know, write its manifest yourself
  (`write_manifest(folder)`).
- Nothing in it is unpickled by a general unpickler. DCP's `.metadata` (a pickle) goes through
  `_MetadataUnpickler`, which admits only what DCP writes there (its metadata classes, `_StorageInfo`,
  `torch.Size`, torch's dtypes, layouts and memory formats, `PosixPath`, sets); any other global is a
  one-line ScaleRLError naming the file and the global, and its shard names must be plain file names
  in `dcp/`. DCP's non-tensor entries (the optimizer's param_groups) and tensors, the RNG files and a
  legacy `optimizer.pt` load through `torch.load(weights_only=True)`; the weights are safetensors, the
  replay buffer safetensors + `.npy` without pickle (scalerl/replay/storage.py), the rest JSON.
- Signing (optional): with the environment variable `SCALERL_CHECKPOINT_KEY` set to a secret, a save
  also writes `manifest.sig`, the HMAC-SHA256 of `manifest.json` under that key, and a load (resume,
  export) refuses in one line, naming the folder, a checkpoint whose `manifest.sig` is missing or does
  not match, before reading anything else; the checkpoint is left where it is. This stops a manifest
  re-hashed to match a planted file. Without the key nothing is signed and `manifest.sig` is ignored.
"""

from __future__ import annotations

import contextvars
import errno
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError
from scalerl.files import fsync_dir
from scalerl.trainer.checkpoint_trust import (  # noqa: F401 - MARKER, MANIFEST, write_manifest: the format's names, used by export and tests
    KEY_ENV,
    MANIFEST,
    MARKER,
    NO_MANIFEST,
    SIGNATURE,
    DataOnlyPlanner,
    DataOnlyReader,
    load_data,
    sign_manifest,
    signing_key,
    verify_checkpoint,
    write_manifest,
)

_NAME = re.compile(r"^step_(\d{7})$")
_LEFTOVER = re.compile(r"^step_\d{7}(\.tmp|\.deleting)?$")  # a killed save or deletion (or an unmarked folder)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(folder)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def remove_partial(root: Path) -> list[Path]:
    """Delete what a killed save or deletion left (`.tmp`, `.deleting`, unmarked `step_N`); returns it.
    `.damaged` folders (set aside by `load_newest_intact`) are kept for the user to inspect."""
    if not root.is_dir():
        return []
    complete = set(complete_checkpoints(root))
    partial = [p for p in root.iterdir() if p.is_dir() and p not in complete and _LEFTOVER.match(p.name)]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def delete_checkpoint(folder: Path) -> None:
    """Rename out of the way first (atomic; the folder stops counting as complete), then delete."""
    doomed = folder.with_name(folder.name + ".deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(folder, doomed)
    fsync_dir(folder.parent)
    shutil.rmtree(doomed)


def _expected_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, nn.Module]) -> int:
    """About what a save writes: the weights twice (shards and the export) and the optimizer state."""
    tensors = [*model.state_dict().values(), *(t for module in extra.values() for t in module.state_dict().values())]
    tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return 2 * sum(t.numel() * t.element_size() for t in tensors)


# What a checkpoint holds: the trained parameters. With LoRA (scalerl/models/lora.py) the frozen base is left
# out (it is reloaded from model.path) and the checkpoint holds the adapters; otherwise every parameter trains.
TRAINED = StateDictOptions(ignore_frozen_params=True)
# Loading: DCP fills exactly the trained parameters' keys of this run (a key it lacks is DCP's error), so the
# frozen ones, absent by design, must not make the module's load strict.
TRAINED_LOAD = StateDictOptions(ignore_frozen_params=True, strict=False)


def _modules(model: nn.Module, extra: dict[str, nn.Module]) -> nn.Module:
    """One module holding the policy and the extra modules (e.g. the critic), so that every optimizer
    parameter has a name; names are `policy.<hf name>` and `<extra>.<name>` whatever the strategy."""
    return nn.ModuleDict({"policy": model, **extra})


def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, nn.Module],
                   tensors: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every rank's part of the weights and optimizer state, keyed by parameter name (DCP's input), and
    `tensors`: further named tensors of the learner (e.g. EWC's anchors and Fisher), which DCP loads in place."""
    weights, optim = get_state_dict(_modules(model, extra), optimizer, options=TRAINED)
    return {"model": weights, "optim": optim, **({"tensors": tensors} if tensors else {})}


def _unwrapped(fn: Callable[[], Any]) -> Any:
    """Run a DCP call; its CheckpointException (a BaseException that wraps each rank's error) becomes the
    first rank's own error, so a full disk is an OSError and a damaged shard an ordinary exception."""
    try:
        with warnings.catch_warnings():  # one process: DCP says each time that it runs without a process group
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            return fn()
    except dcp.api.CheckpointException as err:
        exc, _trace = next(iter(err.failures.values()))
        raise exc from None


def _full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """The consolidated weights on rank 0's CPU (a collective: every rank calls it; others get {})."""
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))


def _save_failed(err: Exception, tmp: Path, root: Path, step: int, needed: int) -> ScaleRLError:
    """Remove the partial folder; the one-line error says what failed, the space needed and what is still intact."""
    shutil.rmtree(tmp, ignore_errors=True)
    free = shutil.disk_usage(root).free if root.exists() else 0
    previous = latest_checkpoint(root)
    kept = f"the checkpoint of step {int(previous.name[5:])} is intact" if previous else "no earlier checkpoint exists"
    if (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or free < needed:
        reason = "No space left on device"  # torch.save says only "unexpected pos ..." when the disk fills
    else:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0][:200]
    return ScaleRLError(f"checkpoint of step {step} not saved in {root}: {reason}; it needs about {needed / 2**20:.1f} MiB, "
                        f"{free / 2**20:.1f} MiB are free; {kept} (free space, then resume with --resume)")


def save_checkpoint(
    root: Path, step: int, *, ctx: DistContext, model: torch.nn.Module, tokenizer: Any,
    optimizer: torch.optim.Optimizer, rng: dict[str, torch.Tensor],
    trainer_state: dict[str, Any], keep_last: int, extra_modules: dict[str, nn.Module] | None = None,
    tensors: dict[str, Any] | None = None, rank_files: Callable[[Path], None] | None = None,
) -> Path:
    """Save on every rank (collective). `model`: the policy's Hugging Face module (sharded or not, never
    a DDP wrapper); `extra_modules`: e.g. {"critic": critic}, unwrapped too; `tensors`: a nested dict of
    further tensors (saved in the DCP shards only); `rank_files(folder)`: this rank's own further files
    (e.g. its replay buffer), written into the checkpoint before the manifest covers them."""
    final = root / f"step_{step:07d}"
    tmp = root / f"step_{step:07d}.tmp"
    extra_modules = extra_modules or {}
    key = signing_key()  # an empty SCALERL_CHECKPOINT_KEY fails here, before anything is written

    def begin() -> None:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()

    def shards() -> None:  # every rank: its shards (DCP's coordinator, rank 0, commits .metadata), its RNG streams
        _unwrapped(lambda: dcp.save(_sharded_state(model, optimizer, extra_modules, tensors), checkpoint_id=tmp / "dcp",
                                    no_dist=not ctx.active))
        torch.save(rng, tmp / f"rng_rank{ctx.rank}.pt")
        if rank_files is not None:
            rank_files(tmp)

    exports: dict[str, dict[str, torch.Tensor]] = {}

    def gather() -> None:  # every rank takes part; rank 0 receives the consolidated weights
        exports.update({name: _full_weights(module) for name, module in {"policy": model, **extra_modules}.items()})

    def finish() -> None:
        _write_main(tmp, step, model, tokenizer, {**trainer_state, "world_size": ctx.world_size}, exports, key)
        if final.exists():  # re-saving a step (e.g. the final save right after a periodic one)
            delete_checkpoint(final)
        os.rename(tmp, final)
        fsync_dir(root)

    for phase in (begin if ctx.is_main else None, shards, gather, finish if ctx.is_main else None):
        if (error := _on_all_ranks(ctx, phase)) is not None:
            if ctx.is_main:
                raise _save_failed(error, tmp, root, step, _expected_bytes(model, optimizer, extra_modules))
            raise ScaleRLError(f"checkpoint of step {step} not saved (rank 0 says why)")
    if ctx.is_main:
        for old in complete_checkpoints(root)[:-keep_last]:
            delete_checkpoint(old)
    ctx.barrier()
    return final


def _on_all_ranks(ctx: DistContext, fn: Callable[[], None] | None) -> Exception | None:
    """Run this rank's part (None: nothing), then agree: the error of this rank, a stand-in when
    another rank failed, or None when all succeeded. Every rank takes the same branch afterwards."""
    error = None
    try:
        if fn is not None:
            fn()
    except Exception as err:  # noqa: BLE001 - any failure of a save is reported, and its partial folder removed
        error = err
    if any(ctx.gather_lists([error is not None])):
        return error or RuntimeError("another rank failed to write its part")
    return None


def _write_main(tmp: Path, step: int, model: torch.nn.Module, tokenizer: Any, trainer_state: dict[str, Any],
                exports: dict[str, dict[str, torch.Tensor]], key: bytes | None = None) -> None:
    """Rank 0's files (the consolidated exports), then the manifest (and its signature under `key`), fsynced,
    then the marker, fsynced."""
    model.save_pretrained(tmp, state_dict=exports.pop("policy"))
    tokenizer.save_pretrained(tmp)
    for name, state in exports.items():  # e.g. PPO's critic, as `critic.safetensors`
        save_file({k: v.contiguous() for k, v in state.items()}, tmp / f"{name}.safetensors")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
    write_manifest(tmp)
    if key is not None:
        sign_manifest(tmp, key)
    _fsync_tree(tmp)
    (tmp / MARKER).write_text(f"{step}\n")
    _fsync_tree(tmp)


def load_model_weights(model: torch.nn.Module, folder: Path, skip: set[str] = frozenset()) -> None:
    """Load the model's *.safetensors of a checkpoint strictly, allowing only tied duplicates to be absent."""
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        if shard.stem not in skip:
            state.update(load_file(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    all_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    tied = all_names - {n for n, _ in model.named_parameters()}
    if unexpected or set(missing) - tied:
        raise ScaleRLError(f"checkpoint {folder} does not match the model (missing {sorted(set(missing) - tied)[:3]}, "
                           f"unexpected {unexpected[:3]}); resume with the same model.path")


# The folder `load_newest_intact` has just verified (its `load` runs inside), so `load_checkpoint` does not hash it again.
_VERIFIED: contextvars.ContextVar[Path | None] = contextvars.ContextVar("scalerl_verified_checkpoint", default=None)


def load_checkpoint(folder: Path, *, ctx: DistContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra_modules: dict[str, torch.nn.Module] | None = None, tensors: dict[str, Any] | None = None
                    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore model, optimizer (and extra modules such as a critic, and `tensors`) in place from the DCP shards,
    at any world size and strategy (on every rank: a collective); returns (trainer_state, this rank's RNG states).
    The folder is verified against its manifest first (unless `load_newest_intact` just did): ScaleRLError when
    it does not verify, before anything in it is opened."""
    if _VERIFIED.get() != folder and (reason := verify_checkpoint(folder)) is not None:
        raise ScaleRLError(f"checkpoint {folder} not loaded: {reason}")
    extra_modules = extra_modules or {}
    if (folder / "dcp").is_dir():
        state = _sharded_state(model, optimizer, extra_modules, tensors)  # the layout to fill: this run's shards
        reader = DataOnlyReader(folder / "dcp")
        reader.read_metadata()  # here, not inside DCP (which would log a refusal and try rank-local metadata)
        _unwrapped(lambda: dcp.load(state, storage_reader=reader, planner=DataOnlyPlanner(folder / "dcp"),
                                    no_dist=not ctx.active))
        set_state_dict(_modules(model, extra_modules), optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=TRAINED_LOAD)
    else:  # a checkpoint of an earlier version: one process's files
        load_model_weights(model, folder, skip=set(extra_modules))
        for name, module in extra_modules.items():
            module.load_state_dict(load_file(folder / f"{name}.safetensors"))
        optimizer.load_state_dict(load_data(folder / "optimizer.pt", str(folder / "optimizer.pt")))
    state = json.loads((folder / "trainer_state.json").read_text())
    # A rank the saving run did not have (resumed with more ranks) has no stream: None, the caller seeds it.
    saved_ranks = state.get("world_size", 1)
    rng_file = folder / f"rng_rank{ctx.rank}.pt"
    rng = load_data(rng_file, str(rng_file)) if ctx.rank < saved_ranks else None
    return state, rng


T = TypeVar("T")


def load_newest_intact(root: Path, ctx: DistContext, load: Callable[[Path], T], warn: Callable[[str], None]) -> T | None:
    """`load(folder)` of the newest complete checkpoint that verifies and loads; None without one.

    Each is verified against its manifest before `load` opens anything in it. One that fails (on any
    rank) is renamed `<name>.damaged` by rank 0 and named in a `warn` line, and the next older one is
    tried: the newest intact one wins, never a damaged one. One without a manifest is never opened:
    renamed `<name>.unverified`, with a warning, the same way. When every one was set aside (the model
    may hold part of one by then) it is a one-line error, not a silent restart. A checkpoint whose
    files match their manifest but that does not load is not damaged: it belongs to another config,
    or was forged with a matching manifest (a one-line error, the checkpoint left as it is), and so is
    a wrong signature when `SCALERL_CHECKPOINT_KEY` is set."""
    found = list(reversed(complete_checkpoints(root)))
    for folder in found:
        reason = verify_checkpoint(folder)
        result = None
        if reason is None:
            token = _VERIFIED.set(folder)
            try:
                result = load(folder)
            except ScaleRLError:
                raise  # the run's model does not match (a wrong --resume), or a file names code to run: not damage
            except Exception as err:  # noqa: BLE001 - whatever a file that loads badly raises (safetensors, JSON)
                what = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
                raise ScaleRLError(f"checkpoint {folder} is intact but does not load into this run ({what}); "
                                   "resume with the run's own config (drop the overrides that changed it)") from None
            finally:
                _VERIFIED.reset(token)
        reasons = ctx.gather_lists([reason])
        if not any(reasons):
            return result
        reason = next(r for r in reasons if r)
        suffix = ".unverified" if reason == NO_MANIFEST else ".damaged"
        if ctx.is_main:
            aside = folder.with_name(folder.name + suffix)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(folder, aside)
            fsync_dir(root)
        ctx.barrier()
        if suffix == ".unverified":
            warn(f"warning: checkpoint {folder.name} has no {MANIFEST}, so it cannot be verified and nothing in it was "
                 f"read; moved it to {folder.name}.unverified and will resume from the next older intact one")
        else:
            warn(f"warning: checkpoint {folder.name} is damaged ({reason}); moved it to {folder.name}.damaged and "
                 "will resume from the next older intact one")
    if found:
        raise ScaleRLError(f"no intact checkpoint in {root}: all {len(found)} were set aside (moved to *.damaged or "
                           "*.unverified); start the run again with --overwrite")
    return None
