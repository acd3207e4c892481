"""A replay buffer on disk: groups in chunk files, priorities in one .npy, `meta.json` committing them.

Folder layout (one buffer per folder):

    meta.json                          what the buffer is and which files hold it (written last)
    chunk_00000.g000007.safetensors    slots [0, C) of the ring, written by save generation 7
    chunk_00001.g000003.safetensors    slots [C, 2C), unchanged since generation 3
    priorities.g000007.npy             (capacity,) float64, the sum tree's leaves (|δ_i| + ε)^α

A chunk holds up to C = `chunk_size` consecutive slots. Slots fill in order, so a chunk's filled
slots are always a prefix of it; the groups of a chunk are ragged and stored flat, without padding:
each tensor field is the concatenation of its groups' flattened tensors (completion fields (G·T,)
each), and `sizes` (n, 5) int64 holds each group's [P, G, T, prompt bytes, policy version] to
split them again. Prompts are UTF-8 in `prompt_utf8` (uint8).

The commit rule: a save never touches a file that the committed `meta.json` names. Every file it
writes has a new name (its generation), written to `name.tmp`, fsynced, then `os.replace`d into
place; only after all of them (and an fsync of the folder) is `meta.json` replaced the same way.
A crash before that replace leaves the previous save intact and loadable; a crash after it leaves
the new one, whose files were all durable before it was named. Files the new meta no longer names
are deleted after the commit (a crash there only leaves garbage, which the next save removes).
Unchanged chunks keep their files, so a save rewrites only the chunks that received groups since the
last save to the same folder; the priorities and the meta are small and always rewritten.
`meta.json` records each file's SHA-256; a load checks every file against it.

A buffer is data: a load reads `meta.json` as JSON, the chunks as safetensors and the priorities with
`np.load(allow_pickle=False)`; nothing is unpickled (a file holding a pickle is refused as damaged), and
the files `meta.json` names must be this layout's names inside the folder (no path leaves it).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from scalerl.errors import ScaleRLError
from scalerl.replay.group import LAYOUT, TENSOR_FIELDS, ReplayGroup
from scalerl.files import fsync_dir, write_atomically

SCHEMA = 1
META = "meta.json"
_GENERATION = re.compile(r"\.g(\d{6,})\.")
_OURS = re.compile(r"^((chunk_\d{5,}\.g\d{6,}\.safetensors|priorities\.g\d{6,}\.npy)(\.tmp)?|meta\.json\.tmp)$")
_CHUNK_FILE = re.compile(r"chunk_\d{5,}\.g\d{6,}\.safetensors")  # the names meta.json may give (fullmatch)
_PRIORITIES_FILE = re.compile(r"priorities\.g\d{6,}\.npy")
_FLAT_DTYPES = {**{name: dtype for name, (dtype, _) in LAYOUT.items()}, "prompt_utf8": torch.uint8, "sizes": torch.long}


def chunk_name(index: int, generation: int) -> str:
    return f"chunk_{index:05d}.g{generation:06d}.safetensors"


def encode_chunk(groups: list[ReplayGroup]) -> dict[str, torch.Tensor]:
    """A chunk's groups as flat tensors (see the module docstring); `decode_chunk` inverts it."""
    prompts = [g.prompt.encode("utf-8") for g in groups]
    tensors = {name: torch.cat([getattr(g, name).reshape(-1) for g in groups]) for name in TENSOR_FIELDS}
    tensors["prompt_utf8"] = torch.from_numpy(np.frombuffer(b"".join(prompts), dtype=np.uint8).copy())
    tensors["sizes"] = torch.tensor([[len(g.prompt_ids), *g.completion_ids.shape, len(b), g.policy_version]
                                     for g, b in zip(groups, prompts)], dtype=torch.long).reshape(-1, 5)  # (n, 5)
    return tensors


def decode_chunk(tensors: dict[str, torch.Tensor], path: Path) -> list[ReplayGroup]:
    """The groups of a chunk; ScaleRLError naming `path` when its tensors do not fit together."""
    if set(tensors) != set(_FLAT_DTYPES) or any(tensors[k].dtype != d for k, d in _FLAT_DTYPES.items()):
        raise _damaged(path, f"its tensors are {sorted(tensors)}, expected {sorted(_FLAT_DTYPES)} with their dtypes")
    sizes = tensors["sizes"]
    if sizes.dim() != 2 or sizes.shape[1] != 5 or bool((sizes[:, :4] < 0).any()):
        raise _damaged(path, f"`sizes` has shape {tuple(sizes.shape)}, expected (n, 5) of non-negative sizes")
    p, g, t, nbytes, version = sizes.T.tolist()
    per_dims = {"P": p, "G": g, "GT": [a * b for a, b in zip(g, t)]}
    lengths = {"prompt_utf8": nbytes, **{name: per_dims[dims] for name, (_, dims) in LAYOUT.items()}}
    pieces = {}
    for name, parts in lengths.items():
        flat = tensors[name]
        if flat.dim() != 1 or flat.numel() != sum(parts):
            raise _damaged(path, f"`{name}` holds {flat.numel()} values, its groups' sizes add up to {sum(parts)}")
        pieces[name] = torch.split(flat, parts)
    groups = []
    for i in range(len(p)):
        fields = {name: pieces[name][i].clone() for name in TENSOR_FIELDS}
        for name, (_, dims) in LAYOUT.items():
            if dims == "GT":
                fields[name] = fields[name].reshape(g[i], t[i])  # (G, T)
        try:
            prompt = bytes(pieces["prompt_utf8"][i].numpy()).decode("utf-8")
        except UnicodeDecodeError as err:
            raise _damaged(path, f"group {i}'s prompt is not UTF-8 ({err.reason})") from err
        groups.append(ReplayGroup(**fields, policy_version=version[i], prompt=prompt))
    return groups


def _damaged(path: Path, why: str) -> ScaleRLError:
    return ScaleRLError(f"replay buffer file {path} is damaged: {why}; restore {path.parent} from a backup or "
                        f"delete it to start with an empty buffer")


def atomic_write(path: Path, data: bytes) -> str:
    """Write `data` to `path` through `path.tmp` (fsynced, then renamed over); returns its SHA-256.
    The caller fsyncs the folder to make the rename itself durable."""
    write_atomically(path, data, sync_folder=False)
    return hashlib.sha256(data).hexdigest()


def committed_generation(folder: Path) -> int | None:
    """The generation of the save `meta.json` in `folder` commits; None when there is none readable."""
    try:
        return int(json.loads((folder / META).read_text())["generation"])
    except (OSError, ValueError, KeyError, TypeError):  # missing or unreadable: the folder holds no save of ours
        return None


def newest_generation(folder: Path) -> int:
    """The highest generation any file in `folder` is named with (0 when none), so a new save's names
    never collide with a file some `meta.json`, even a damaged one, may name."""
    found = [int(m.group(1)) for p in folder.iterdir() if (m := _GENERATION.search(p.name))] if folder.is_dir() else []
    return max(found, default=0)


def write_folder(folder: Path, *, meta: dict[str, Any], generation: int, write: dict[int, list[ReplayGroup]],
                 kept: dict[int, dict[str, Any]], priorities: np.ndarray) -> tuple[dict[int, dict[str, Any]], list[Path]]:
    """Commit one save: the chunks in `write` (index → its groups) as new files, the entries in `kept`
    (index → its entry in the committed meta) as they are, `priorities`, then `meta` plus the file list.
    Returns the chunk entries now committed and the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    entries, written = dict(kept), []
    for index, groups in sorted(write.items()):
        path = folder / chunk_name(index, generation)
        sha = atomic_write(path, save_tensors(encode_chunk(groups)))
        entries[index] = {"index": index, "file": path.name, "groups": len(groups), "sha256": sha}
        written.append(path)
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(priorities, dtype=np.float64), allow_pickle=False)
    prio_path = folder / f"priorities.g{generation:06d}.npy"
    prio = {"file": prio_path.name, "sha256": atomic_write(prio_path, buffer.getvalue())}
    fsync_dir(folder)  # every file the new meta names is durable before the meta names it
    full = {"schema": SCHEMA, "generation": generation, **meta, "priorities": prio,
            "chunks": [entries[i] for i in sorted(entries)]}
    atomic_write(folder / META, json.dumps(full, indent=1).encode())
    fsync_dir(folder)
    named = {META, prio["file"], *(e["file"] for e in entries.values())}
    for path in folder.iterdir():  # after the commit: the previous save's files and any crashed save's leftovers
        if _OURS.match(path.name) and path.name not in named:
            path.unlink(missing_ok=True)
    return entries, [*written, prio_path, folder / META]


def _read_checked(path: Path, sha256: str) -> bytes:
    if not path.is_file():
        raise ScaleRLError(f"replay buffer file {path} is missing (meta.json names it); restore {path.parent} "
                           f"from a backup or delete it to start with an empty buffer")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise _damaged(path, "its SHA-256 differs from the one meta.json recorded")
    return data


def read_meta(folder: Path) -> dict[str, Any]:
    """The committed `meta.json` of `folder`; ScaleRLError when it is missing, garbled or of another schema."""
    path = folder / META
    if not path.is_file():
        raise ScaleRLError(f"no replay buffer in {folder}: {path} is missing; pass the folder a buffer was saved "
                           f"to, or start with an empty buffer")
    try:
        meta = json.loads(path.read_text())
        schema, buffer, state, _ = meta["schema"], meta["buffer"], meta["state"], int(meta["generation"])
        capacity, chunk_size, size = int(buffer["capacity"]), int(buffer["chunk_size"]), int(state["size"])
        entries = [(int(e["index"]), str(e["file"]), int(e["groups"]), str(e["sha256"])) for e in meta["chunks"]]
        if not all(isinstance(meta["priorities"][key], str) for key in ("file", "sha256")):
            raise TypeError("priorities.file and priorities.sha256 must be strings")
        named = [(_PRIORITIES_FILE, meta["priorities"]["file"]), *((_CHUNK_FILE, e[1]) for e in entries)]
        if bad := [name for pattern, name in named if not pattern.fullmatch(name)]:
            raise ValueError(f"it names {bad[0]!r}, not a file name this layout writes")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _damaged(path, f"it is not the JSON a save writes ({type(err).__name__}: {err})") from err
    if schema != SCHEMA:
        raise ScaleRLError(f"replay buffer {path} has schema {schema}, this scalerl reads schema {SCHEMA}; "
                           f"start with an empty buffer or load it with the scalerl that wrote it")
    if capacity < 1 or chunk_size < 1 or not 0 <= size <= capacity:
        raise _damaged(path, f"capacity {capacity}, chunk_size {chunk_size} and size {size} do not fit together")
    if [e[0] for e in entries] != list(range(-(-size // chunk_size))):
        raise _damaged(path, f"its {len(entries)} chunks do not cover the {size} groups it says it holds")
    return meta


def read_folder(folder: Path) -> tuple[dict[str, Any], list[ReplayGroup], np.ndarray]:
    """What the committed save in `folder` holds: its meta, its groups in slot order (slots 0 .. size-1)
    and the (capacity,) priorities. Every file is checked against its recorded SHA-256 and shape."""
    meta = read_meta(folder)
    chunk_size, size = int(meta["buffer"]["chunk_size"]), int(meta["state"]["size"])
    groups: list[ReplayGroup] = []
    for entry in meta["chunks"]:
        path = folder / entry["file"]
        data = _read_checked(path, entry["sha256"])
        try:
            tensors = load_tensors(data)
        except SafetensorError as err:
            raise _damaged(path, f"it is not a safetensors file ({err})") from err
        chunk = decode_chunk(tensors, path)
        want = min(chunk_size, size - entry["index"] * chunk_size)
        if len(chunk) != want or entry["groups"] != want:
            raise _damaged(path, f"it holds {len(chunk)} groups, meta.json says {entry['groups']}, expected {want}")
        groups += chunk
    path = folder / meta["priorities"]["file"]
    data = _read_checked(path, meta["priorities"]["sha256"])
    try:
        leaves = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as err:
        if "pickle" in str(err) or "Object arrays" in str(err):  # numpy would suggest allow_pickle: never for a buffer
            raise _damaged(path, "it holds a pickle, which a buffer never does (refused unread)") from None
        raise _damaged(path, f"it is not a .npy file ({err})") from err
    capacity = int(meta["buffer"]["capacity"])
    if leaves.shape != (capacity,) or leaves.dtype != np.float64:
        raise _damaged(path, f"it holds {leaves.dtype} of shape {leaves.shape}, expected float64 of shape ({capacity},)")
    return meta, groups, leaves
