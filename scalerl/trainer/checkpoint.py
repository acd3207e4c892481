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
import hashlib
import hmac
import io
import json
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError

MARKER = "COMPLETE"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
KEY_ENV = "SCALERL_CHECKPOINT_KEY"
NO_MANIFEST = f"it has no {MANIFEST}"
_UNLISTED = {MANIFEST, MARKER, SIGNATURE}  # the files of a checkpoint's top level that the manifest does not list
_SHA256 = re.compile(r"[0-9a-f]{64}")  # fullmatch
_NAME = re.compile(r"^step_(\d{7})$")
_LEFTOVER = re.compile(r"^step_\d{7}(\.tmp|\.deleting)?$")  # a killed save or deletion (or an unmarked folder)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    _fsync_dir(folder.parent)
    shutil.rmtree(doomed)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: Path) -> None:
    """manifest.json: the size and SHA-256 of every file in the folder (the marker comes after it)."""
    files = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).as_posix() not in _UNLISTED}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def signing_key() -> bytes | None:
    """The key of `SCALERL_CHECKPOINT_KEY` (None when unset): saves sign their manifest with it, loads require it."""
    key = os.environ.get(KEY_ENV)
    if key is None:
        return None
    if not key:
        raise ScaleRLError(f"{KEY_ENV} is set but empty: set it to a secret (e.g. `openssl rand -hex 32`) to sign "
                           "checkpoints, or unset it")
    return key.encode()


def _signature(key: bytes, manifest: bytes) -> str:
    return hmac.new(key, manifest, hashlib.sha256).hexdigest()


def sign_manifest(folder: Path, key: bytes) -> None:
    """manifest.sig: the HMAC-SHA256 of manifest.json under `key`, in hex."""
    (folder / SIGNATURE).write_text(_signature(key, (folder / MANIFEST).read_bytes()) + "\n")


def _check_signature(folder: Path, manifest: bytes, key: bytes) -> None:
    """ScaleRLError naming the folder unless manifest.sig is the HMAC of `manifest` under `key`."""
    sig = folder / SIGNATURE
    if not sig.is_file() or sig.is_symlink():
        raise ScaleRLError(f"checkpoint {folder} has no {SIGNATURE} and {KEY_ENV} is set: it was saved without the key "
                           "or its signature was removed; nothing in it was read (resume from it only if you trust it, "
                           f"with {KEY_ENV} unset)")
    with open(sig, "rb") as f:
        got = f.read(256).strip()
    if not hmac.compare_digest(got, _signature(key, manifest).encode()):
        raise ScaleRLError(f"checkpoint {folder}: {SIGNATURE} does not match {MANIFEST} under {KEY_ENV}: the checkpoint "
                           "was changed after it was signed, or signed with another key; nothing in it was read")


def _listed(manifest: bytes) -> dict[str, tuple[int, str]] | None:
    """The manifest's files (relative path → (bytes, sha256)), or None when it is not what a save writes."""
    try:
        files = json.loads(manifest)["files"]
        listed = {}
        for name, want in files.items():
            parts = PurePosixPath(name).parts
            if (not parts or name.startswith("/") or "\\" in name or "\0" in name
                    or any(part in (".", "..") for part in parts) or name in _UNLISTED):
                return None
            size, sha = want["bytes"], want["sha256"]
            if type(size) is not int or size < 0 or not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                return None
            listed[PurePosixPath(name).as_posix()] = (size, sha)
        return listed
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return None


def _contents(folder: Path) -> tuple[set[str], set[str]] | str:
    """Every plain file and folder below `folder` (relative paths), or why it holds something else."""
    files, dirs, todo = set(), set(), [folder]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                rel = Path(entry.path).relative_to(folder).as_posix()
                if entry.is_symlink():
                    return f"{rel} is a symbolic link, a save writes none"
                if entry.is_dir(follow_symlinks=False):
                    dirs.add(rel)
                    todo.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    files.add(rel)
                else:
                    return f"{rel} is not a regular file"
    return files, dirs


def verify_checkpoint(folder: Path) -> str | None:
    """Why the checkpoint cannot be trusted, or None when it holds exactly the files of its manifest, with
    their sizes and SHA-256 of save time. Nothing else in the folder is opened before this says None:
    `NO_MANIFEST` without a manifest; a missing, resized, changed or added file, a link, a damaged manifest.
    With `SCALERL_CHECKPOINT_KEY` set, a missing or wrong `manifest.sig` is a ScaleRLError (not damage: a
    forgery, or another key; the folder is left as it is)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return NO_MANIFEST
    if manifest.is_symlink():
        return f"{MANIFEST} is a symbolic link, a save writes none"
    key = signing_key()
    data = manifest.read_bytes()
    if key is not None:
        _check_signature(folder, data, key)
    files = _listed(data)
    if files is None:
        return f"{MANIFEST} is damaged"
    found = _contents(folder)
    if isinstance(found, str):
        return found
    present, dirs = found
    for name, (size, sha) in files.items():
        path = folder / name
        if name not in present:
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were saved"
        if _sha256(path) != sha:
            return f"{name} does not match its SHA-256 of save time"
    extra = sorted(present - set(files) - _UNLISTED)
    holding = {str(parent) for name in files for parent in PurePosixPath(name).parents}
    extra += sorted(f"{d}/" for d in dirs - holding)
    if extra:
        return f"{extra[0]} is not in {MANIFEST} (added after the save)"
    return None


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
        _fsync_dir(root)

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


# What DCP writes into `.metadata` (torch 2.13, any strategy or world size): its metadata dataclasses, the file
# layer's _StorageInfo, torch.Size, dtypes (as `torch.<name>`), layouts (through torch.serialization._get_layout,
# a name lookup) and memory formats (an enum of the metadata module), and the save's folder as a PosixPath
# (`pathlib._local` from Python 3.13 on). Sets and OrderedDicts for the containers a pickle may name.
_METADATA_GLOBALS = {
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),
    ("builtins", "set"), ("builtins", "frozenset"), ("collections", "OrderedDict"),
}
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only what DCP writes into `.metadata` (`_METADATA_GLOBALS`, torch's dtypes,
    layouts and memory formats); any other global is refused before it is imported or called."""

    def __init__(self, file: BinaryIO, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(vars(torch).get(name), _TORCH_CONSTANTS):  # no getattr: nothing imported
            return vars(torch)[name]
        raise _refused(self.path, f"the global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _refused(self.path, "a persistent id")


def _refused(where: Path | str, what: str) -> ScaleRLError:
    return ScaleRLError(f"checkpoint file {where} refused: it names {what}, which a checkpoint never holds (a checkpoint "
                        "is data, nothing in it may name code to run); it was planted or forged: do not resume from it")


def read_dcp_metadata(path: Path) -> Metadata:
    """DCP's `.metadata` through `_MetadataUnpickler`; ScaleRLError naming the file when it names anything else,
    is not DCP's Metadata, or points its shards outside its folder."""
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, path).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
            raise ScaleRLError(f"checkpoint file {path} is not DCP metadata ({type(err).__name__}: "
                               f"{str(err).splitlines()[0][:160] if str(err) else ''})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise ScaleRLError(f"checkpoint file {path} is not DCP metadata (it holds a {type(metadata).__name__})")
    for info in metadata.storage_data.values():  # the shards DCP will open: plain names inside dcp/
        name = getattr(info, "relative_path", None)
        if (not isinstance(info, _StorageInfo) or not isinstance(name, str) or name in ("", ".", "..")
                or any(c in name for c in "/\\\0")):
            raise ScaleRLError(f"checkpoint file {path} refused: it names the shard {name!r}, not a file of its folder")
    return metadata


class DataOnlyReader(FileSystemReader):
    """DCP's file-system reader, except that `.metadata` goes through `read_dcp_metadata` instead of `pickle.load`
    (DCP reads tensors with `torch.load(weights_only=True)` itself; non-tensor entries go through `DataOnlyPlanner`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._read: dict[int | None, Metadata] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        super().reset(checkpoint_id)
        self._read = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:  # as FileSystemReader.read_metadata of torch 2.13
        rank = kwargs.get("rank")
        if rank not in self._read:  # read once: the caller reads it first, so that a refusal is its own error
            metadata = read_dcp_metadata(Path(self._get_metadata_path(rank)))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            self._read[rank] = metadata
        return self._read[rank]


class DataOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that non-tensor entries (e.g. the optimizer's param_groups, saved by
    `torch.save`) load with `torch.load(weights_only=True)`, not DCP's `weights_only=False`."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:  # as DefaultLoadPlanner.load_bytes of torch 2.13
        fqn = read_item.dest_index.fqn
        shard = self.metadata.storage_data[read_item.storage_index].relative_path  # checked by read_dcp_metadata
        obj = _load_data(value, f"{self.folder / shard} (its entry {fqn})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _load_data(source: Path | BinaryIO, where: str) -> Any:
    """`torch.load(weights_only=True)` (tensors, numbers, strings, containers; no code); a pickle naming anything
    else is a one-line ScaleRLError naming `where` (the file) and what was refused."""
    try:
        return torch.load(source, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        detail = re.search(r"WeightsUnpickler error: ([^\n]*)", str(err))
        raise _refused(where, f"the global {found.group(1)}" if found else
                       f"what torch's weights-only unpickler refuses ({detail.group(1)[:160] if detail else 'no detail'})") from None


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
        optimizer.load_state_dict(_load_data(folder / "optimizer.pt", str(folder / "optimizer.pt")))
    state = json.loads((folder / "trainer_state.json").read_text())
    # A rank the saving run did not have (resumed with more ranks) has no stream: None, the caller seeds it.
    saved_ranks = state.get("world_size", 1)
    rng_file = folder / f"rng_rank{ctx.rank}.pt"
    rng = _load_data(rng_file, str(rng_file)) if ctx.rank < saved_ranks else None
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
            _fsync_dir(root)
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
