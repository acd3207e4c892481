"""Where a model comes from: the built-in folder, a local folder or a hub id, and whether a local
folder holds what loading needs (a config.json object, complete weights, tokenizer files). No
torch import: the config checks run these before anything heavy loads."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError

BUILTIN = "builtin"
# What a tokenizer is built from: a `tokenizers` file, a sentencepiece / tiktoken model, or the
# vocabulary of a slow tokenizer. tokenizer_config.json alone builds an empty one (or fails).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")
# Names model configs give their context length (Llama/Qwen, GPT-2, others).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def builtin_model_dir() -> Path:
    """The tiny Llama shipped inside the package (built by scripts/build_base_model.py)."""
    return Path(str(resources.files("scalerl.models") / "builtin"))


def resolve_model_path(path: str, field: str = "model.path") -> str:
    """A local folder, the built-in model, or a hub id; a missing local-looking path is an error."""
    if path == BUILTIN:
        return str(builtin_model_dir())
    try:
        local = Path(path).expanduser()
    except RuntimeError:  # ~user of no such user: local-looking, so reported below
        local = Path(path)
    # os.path's tests, not Path's: they answer False where Path's raise (a name too long, say).
    if os.path.isdir(local):
        if not os.path.isfile(local / "config.json"):
            if (base := adapter_base(local)) is not None:
                raise ScaleRLError(f"{field}: {path} is a LoRA adapter folder (peft's adapter_config.json; its base model: {base}); "
                                   "training starts from a whole model: give the base (the run's model.lora adds new adapters), "
                                   "or `scalerl export RUN --merge-lora` for one folder with the adapters merged")
            raise ScaleRLError(f"{field}: {path} has no config.json; point it at a Hugging Face model folder (save_pretrained output)")
        read_model_config(local, field)
        return str(local)
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1 or local.suffix in {".safetensors", ".bin", ".pt"}
    if looks_local or os.path.exists(local):
        raise ScaleRLError(f"{field}: {path} is not a model folder; give a folder with config.json and weights, or 'builtin'")
    return path  # a hub id such as Qwen/Qwen2.5-0.5B


def adapter_base(folder: Path | str) -> str | None:
    """The base model a peft adapter folder names (adapter_config.json without config.json: a LoRA run's checkpoint,
    or its `scalerl export` without --merge-lora), None for any other path."""
    local = Path(folder)
    if not os.path.isfile(local / "adapter_config.json") or os.path.isfile(local / "config.json"):
        return None
    try:
        tree = json.loads((local / "adapter_config.json").read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ScaleRLError(f"{local / 'adapter_config.json'} is not valid JSON ({type(err).__name__}); restore the adapter folder") from None
    base = tree.get("base_model_name_or_path") if isinstance(tree, dict) else None
    if not isinstance(base, str) or not base:
        raise ScaleRLError(f"{local / 'adapter_config.json'} names no base_model_name_or_path; write the base model's folder there")
    return base


def read_model_config(folder: Path | str, field: str) -> dict[str, Any]:
    """The folder's config.json, which must be UTF-8 JSON holding an object."""
    path = Path(folder) / "config.json"
    try:
        tree = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ScaleRLError(f"{field}: {path} is not valid JSON ({type(err).__name__}); restore the model's config.json") from None
    if not isinstance(tree, dict):
        raise ScaleRLError(f"{field}: {path} holds a JSON {type(tree).__name__}, not an object; restore the model's config.json")
    return tree


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot load in full (a header it does not have, or data cut short), or None.

    Layout: 8 bytes little-endian header length N, N bytes of JSON {tensor: {data_offsets: [begin,
    end], ...}}, then the data; the file is complete when it reaches 8 + N + the largest end."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if size < 8 or n > size - 8:
            return f"is cut short or not a safetensors file ({size} bytes, too few for its header)"
        try:
            header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, TypeError, IndexError):
            return "has a damaged header"
    if isinstance(end, int) and size < 8 + n + end:
        return f"is cut short ({size} bytes; its header describes {8 + n + end})"
    return None


def check_weights(folder: Path | str, field: str) -> None:
    """Every .safetensors file in the folder is complete, and every shard its index names is there."""
    folder = Path(folder)
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_problem(path)
        if problem is not None:
            raise ScaleRLError(f"{field}: {path} {problem}; the copy or download did not finish: fetch the weights again")
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_bytes())["weight_map"].values())
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ScaleRLError(f"{field}: {index} is not a valid weight index; fetch the weights again") from None
        missing = sorted(str(s) for s in shards if not (folder / str(s)).is_file())
        if missing:
            raise ScaleRLError(f"{field}: {index} names shards that are missing ({', '.join(missing[:3])}); fetch the weights again")


def has_tokenizer_files(folder: Path | str) -> bool:
    folder = Path(folder)
    return any((folder / name).is_file() for name in TOKENIZER_FILES) or \
        any(p.suffix in TOKENIZER_SUFFIXES for p in folder.iterdir() if p.is_file())


def max_positions(model_config: dict[str, Any]) -> int | None:
    """The longest sequence (prompt and completion) the model's config allows, or None if it does not say."""
    for key in POSITION_KEYS:
        value = model_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
