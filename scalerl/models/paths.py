"""Where a model comes from: the built-in folder, a local folder or a hub id (no torch import)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from scalerl.errors import ScaleRLError

BUILTIN = "builtin"


def builtin_model_dir() -> Path:
    """The tiny Llama shipped inside the package (built by scripts/build_base_model.py)."""
    return Path(str(resources.files("scalerl.models") / "builtin"))


def resolve_model_path(path: str, field: str = "model.path") -> str:
    """A local folder, the built-in model, or a hub id; a missing local-looking path is an error."""
    if path == BUILTIN:
        return str(builtin_model_dir())
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ScaleRLError(f"{field}: {path} has no config.json; point it at a Hugging Face model folder (save_pretrained output)")
        return str(local)
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1 or local.suffix in {".safetensors", ".bin", ".pt"}
    if looks_local or local.exists():
        raise ScaleRLError(f"{field}: {path} is not a model folder; give a folder with config.json and weights, or 'builtin'")
    return path  # a hub id such as Qwen/Qwen2.5-0.5B
