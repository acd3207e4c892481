"""A run's policy as a folder people deploy: `scalerl export RUN_DIR --out DIR --dtype bf16|fp16|fp32`.

The source is a run folder (its newest checkpoint whose files match their manifest; damaged ones
are skipped and named, never moved: exporting reads only) or one checkpoint folder. The output is
written to `<out>.tmp` and renamed, so a stopped export leaves no half folder under `out`; it
holds the weights in the chosen dtype (safetensors), config.json, the tokenizer, a
generation_config.json with the EOS and pad tokens the run sampled with, and `scalerl_export.json`
(which checkpoint, which step, which dtype).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import torch

from scalerl.errors import ScaleRLError
from scalerl.trainer.checkpoint import MARKER, complete_checkpoints, verify_checkpoint

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_checkpoint(source: Path, warn: Callable[[str], None] = print) -> Path:
    """The checkpoint folder `source` names: itself (a checkpoint), or a run folder's newest intact one."""
    if (source / MARKER).is_file():
        if (reason := verify_checkpoint(source)) is not None:
            raise ScaleRLError(f"{source}: the checkpoint is damaged ({reason}); export an older one, or the run folder")
        return source
    found = complete_checkpoints(source / "checkpoints")
    if not found:
        raise ScaleRLError(f"{source}: neither a checkpoint (no {MARKER} file) nor a run folder with complete checkpoints "
                           "(checkpoints/step_N/); give a run folder of `scalerl train` or one of its checkpoints")
    for folder in reversed(found):
        if (reason := verify_checkpoint(folder)) is None:
            return folder
        warn(f"warning: {folder.name} is damaged ({reason}); exporting an older checkpoint")
    raise ScaleRLError(f"{source}: every one of its {len(found)} checkpoints is damaged")


def export_model(source: Path, out: Path, dtype: str = "bf16", *, overwrite: bool = False,
                 warn: Callable[[str], None] = print) -> Path:
    """Write the policy of `source` to `out` in `dtype`; returns the checkpoint folder it came from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if dtype not in DTYPES:
        raise ScaleRLError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ScaleRLError(f"--out {out} is not empty; add --overwrite to replace it, or choose another folder")
    folder = resolve_checkpoint(source, warn)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:  # as the run did (scalerl/models/loading.py)
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    step = json.loads((folder / "trainer_state.json").read_text()).get("step") if (folder / "trainer_state.json").is_file() else None
    (tmp / "scalerl_export.json").write_text(json.dumps({"checkpoint": str(folder.resolve()), "step": step, "dtype": dtype}, indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return folder
