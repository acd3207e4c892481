"""A run's policy as a folder people deploy: `scalerl export RUN_DIR --out DIR --dtype bf16|fp16|fp32 [--quantize nf4]`.

The source is a run folder (its newest checkpoint whose files match their manifest; damaged ones
are skipped and named, never moved: exporting reads only) or one checkpoint folder. The output is
written to `<out>.tmp` and renamed, so a stopped export leaves no half folder under `out`; it
holds the weights in the chosen dtype (safetensors), config.json, the tokenizer, a
generation_config.json with the EOS and pad tokens the run sampled with, and `scalerl_export.json`
(which checkpoint, which step, which dtype, which quantisation).

A LoRA run's checkpoint (`model.lora`) holds peft's adapter folder: exported as it is (adapters in
`--dtype`, the base named in adapter_config.json; `from_pretrained` with peft loads both), or with
`--merge-lora` as a plain model whose weights are W + (alpha / r) B A (merged in float32, then cast or
quantised).

`--quantize nf4` stores the decoder's Linear weights as 4-bit NormalFloat (QLoRA, Dettmers et al. 2023)
through transformers' bitsandbytes integration: blocks of 64 weights share one absmax, and the absmaxes
are themselves quantised to 8 bits ("double quantisation", about 0.37 bit per weight less on large
layers, for a negligible error); the embeddings, norms and LM head stay in `--dtype`, as transformers
leaves them, and `--dtype` is also the compute dtype recorded in `quantization_config`. Quantising runs
on the CPU (bitsandbytes' CPU backend), so an export never competes with a training run for GPU
memory; the folder loads with `from_pretrained` (tested on the CPU) wherever bitsandbytes and
accelerate are installed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from scalerl.errors import ScaleRLError
from scalerl.trainer.checkpoint import MARKER, complete_checkpoints, verify_checkpoint

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
QUANTIZE = ("nf4",)


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


def nf4_options(dtype: str) -> tuple[dict, dict]:
    """`from_pretrained` keyword arguments that quantise to NF4 on the CPU, and what scalerl_export.json records.

    Raises ScaleRLError (one line) where bitsandbytes or accelerate is missing or cannot quantise here."""
    try:
        # at import its CPU backend asks the hub for a fused 4-bit kernel (kernels-community) and warns when it
        # cannot have it; it then uses its own kernels, which is all an export needs
        logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
        import bitsandbytes
        import bitsandbytes.functional as F
    except ImportError:
        raise ScaleRLError("--quantize nf4 needs bitsandbytes: pip install 'scalerl[compressed]'; or export without --quantize") from None
    try:
        import accelerate  # noqa: F401  (transformers loads 4-bit weights through it)
    except ImportError:
        raise ScaleRLError("--quantize nf4 needs accelerate (transformers loads 4-bit models through it): pip install accelerate; "
                           "or export without --quantize") from None
    try:  # a build without a CPU backend fails here rather than halfway through the model
        F.quantize_4bit(torch.ones(64), quant_type="nf4")
    except (RuntimeError, NotImplementedError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ScaleRLError(f"--quantize nf4: bitsandbytes {bitsandbytes.__version__} cannot quantise on this CPU ({first}); "
                           "pip install -U 'scalerl[compressed]', or export without --quantize") from err
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=DTYPES[dtype],
                                bnb_4bit_use_double_quant=True)
    record = {"method": "bitsandbytes", "version": bitsandbytes.__version__, "quant_type": "nf4", "double_quant": True,
              "compute_dtype": dtype, "unquantised": f"embeddings, norms and LM head ({dtype})"}
    return {"quantization_config": config, "device_map": "cpu"}, record


def load_policy(folder: Path, dtype: str, load: dict, *, merge_lora: bool, quantize: str | None, scratch: Path):
    """The checkpoint's policy in `dtype` (`load`: nf4_options' quantisation). A LoRA checkpoint (peft's adapter
    folder, scalerl/models/lora.py) with `merge_lora`: the adapters folded into the base weights
    (W + (alpha / r) B A, in float32 before the cast), which a quantised export needs; without it None
    (the checkpoint is exported as its adapter folder, `write_adapters`)."""
    from transformers import AutoModelForCausalLM

    lora = (folder / "adapter_config.json").is_file()
    if merge_lora and not lora:
        raise ScaleRLError(f"--merge-lora: {folder} holds no LoRA adapters (no adapter_config.json): the run trained the whole "
                           "model; export it without --merge-lora")
    if lora and quantize and not merge_lora:
        raise ScaleRLError(f"--quantize {quantize} of a LoRA checkpoint needs --merge-lora (the adapters are merged into the base, "
                           "then quantised)")
    if not merge_lora:
        return None if lora else AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype], **load)
    from scalerl.models.lora import import_peft

    peft = import_peft("--merge-lora needs the peft library: pip install 'scalerl[lora]'")

    base_path = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    try:
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise ScaleRLError(f"--merge-lora: cannot load the base model {base_path!r} that {folder / 'adapter_config.json'} names "
                           f"({str(err).splitlines()[0][:160]}); put it back there, or fix base_model_name_or_path") from None
    merged = peft.PeftModel.from_pretrained(base, folder).merge_and_unload()
    if not quantize:
        return merged.to(DTYPES[dtype])
    merged.save_pretrained(scratch)  # quantisation happens as transformers loads: from the merged float32 weights
    return AutoModelForCausalLM.from_pretrained(scratch, dtype=DTYPES[dtype], **load)


def write_adapters(folder: Path, tmp: Path, dtype: str) -> None:
    """A LoRA checkpoint's adapter folder in `dtype`: peft's adapter_config.json (naming the base model) and
    adapter_model.safetensors; `from_pretrained` (with peft installed) loads base + adapters from it."""
    from safetensors.torch import load_file, save_file

    tmp.mkdir(parents=True)
    shutil.copy2(folder / "adapter_config.json", tmp / "adapter_config.json")
    adapters = load_file(folder / "adapter_model.safetensors")
    save_file({k: v.to(DTYPES[dtype]).contiguous() for k, v in adapters.items()}, tmp / "adapter_model.safetensors",
              metadata={"format": "pt"})


def export_model(source: Path, out: Path, dtype: str = "bf16", *, quantize: str | None = None, merge_lora: bool = False,
                 overwrite: bool = False, warn: Callable[[str], None] = print) -> Path:
    """Write the policy of `source` to `out` in `dtype` (its Linear layers in 4-bit NF4 with `quantize="nf4"`;
    a LoRA run's adapters merged into the base with `merge_lora`, else exported as the adapter folder);
    returns the checkpoint folder it came from."""
    from transformers import AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if dtype not in DTYPES:
        raise ScaleRLError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    if quantize is not None and quantize not in QUANTIZE:
        raise ScaleRLError(f"--quantize {quantize}: use nf4 (4-bit NormalFloat through bitsandbytes), or leave it out")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ScaleRLError(f"--out {out} is not empty; add --overwrite to replace it, or choose another folder")
    load, quantization = nf4_options(dtype) if quantize == "nf4" else ({}, None)
    folder = resolve_checkpoint(source, warn)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = load_policy(folder, dtype, load, merge_lora=merge_lora, quantize=quantize, scratch=tmp.with_name(out.name + ".merged"))
    shutil.rmtree(tmp.with_name(out.name + ".merged"), ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:  # as the run did (scalerl/models/loading.py)
        tokenizer.pad_token = tokenizer.eos_token
    generation = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if model is None:
        write_adapters(folder, tmp, dtype)
    else:
        model.generation_config = generation
        model.save_pretrained(tmp)
    generation.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    step = json.loads((folder / "trainer_state.json").read_text()).get("step") if (folder / "trainer_state.json").is_file() else None
    record = {"checkpoint": str(folder.resolve()), "step": step, "dtype": dtype, "quantize": quantize, "quantization": quantization,
              "lora": "merged" if merge_lora else "adapters" if (folder / "adapter_config.json").is_file() else None}
    (tmp / "scalerl_export.json").write_text(json.dumps(record, indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return folder
