"""A checkpoint is data: what is trusted before anything in a checkpoint folder is read, and how it is read.

- The manifest (`manifest.json`: every file's size and SHA-256) is verified before anything else in the
  folder is opened, and the folder must hold exactly its files (`verify_checkpoint`); with
  `SCALERL_CHECKPOINT_KEY` set, `manifest.sig` (an HMAC-SHA256 of the manifest) must match too.
- DCP's `.metadata` is read by an unpickler that builds only the classes DCP writes there
  (`read_dcp_metadata`, `DataOnlyReader`); non-tensor entries of the shards, RNG states and legacy optimizer
  files by `torch.load(weights_only=True)` (`DataOnlyPlanner`, `load_data`). Anything naming code is a
  one-line error naming the file, never run.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import pickle
import re
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from scalerl.errors import ScaleRLError

MARKER = "COMPLETE"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
KEY_ENV = "SCALERL_CHECKPOINT_KEY"
NO_MANIFEST = f"it has no {MANIFEST}"
_UNLISTED = {MANIFEST, MARKER, SIGNATURE}  # the files of a checkpoint's top level that the manifest does not list
_SHA256 = re.compile(r"[0-9a-f]{64}")  # fullmatch


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
        obj = load_data(value, f"{self.folder / shard} (its entry {fqn})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def load_data(source: Path | BinaryIO, where: str) -> Any:
    """`torch.load(weights_only=True)` (tensors, numbers, strings, containers; no code); a pickle naming anything
    else is a one-line ScaleRLError naming `where` (the file) and what was refused."""
    try:
        return torch.load(source, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        detail = re.search(r"WeightsUnpickler error: ([^\n]*)", str(err))
        raise _refused(where, f"the global {found.group(1)}" if found else
                       f"what torch's weights-only unpickler refuses ({detail.group(1)[:160] if detail else 'no detail'})") from None


