"""Rollout with vLLM: the offline `vllm.LLM` engine, inside the trainer's process.

The engine holds its own copy of the weights (loaded from a model folder at start, then replaced in
place by `sync_weights`), so the rollout worker hands it a state dict after every update. How each
convention of the `Sampler` contract (rollout/base.py) is met:

- **Rows and padding** are built as in hf.py: prompts left-padded and repeated per row, completions
  right-padded with the pad id, the mask 1 through the first stop token, log-probs 0 on padding.
- **Stop tokens**: `stop_token_ids` are the stop ids (EOS, and a chat template's end of turn); vLLM
  ends a request on the first one and keeps it in `token_ids`. `min_tokens` masks them out of the
  first tokens' distributions, like `min_new_tokens` in hf.py. No tokenizer runs in the engine
  (`skip_tokenizer_init`): token ids go in (`TokensPrompt`) and come out.
- **Sampler log-probs** are those of the distribution sampled from: `logprobs_mode=
  "processed_logprobs"` makes vLLM return the log-softmax of the logits after min_tokens,
  temperature, top-k and top-p (the default, `raw_logprobs`, is the unscaled model distribution,
  which at temperature ≠ 1 differs from the trainer's forward at the same temperature).
  `logprobs=0` asks for the sampled token's alone.
- **Per-request seeds**: each prompt is one request with `n` samples and `seed`; vLLM gives sample j
  a generator of its own seeded seed + j. The prompt's seed is hashed first (`derive_seed`), so
  that neighbouring seeds (s and s + 1) do not share all but one of their streams. Greedy decoding
  (temperature 0) draws nothing and needs no seeds; vLLM refuses n > 1 for it, so each prompt is
  sent n times.
- **Weights**: `sync_weights` runs vLLM's in-place reload (`collective_rpc("reload_weights")`, the
  worker's `model_runner.reload_weights` → model_loader/reload): the model's own `load_weights`
  takes Hugging Face names (fusing q/k/v and gate/up as at load time) and the processed tensors
  are copied back into the engine's storage, so the engine keeps running. Then the prefix cache is
  reset: its blocks hold keys and values computed with the old weights.
- **Precision**: the engine runs in `dtype` (the learner's compute dtype: float32 for
  precision.mode=fp32, bfloat16 otherwise; fp8 matmuls of `aggressive` are not reproduced).
  The ScaleRL recipe's FP32 LM head (`precision_policy.fp32_lm_head`) is honoured in part: below
  float32 the engine gets `hf_overrides={"head_dtype": "float32"}`, so the head's matmul and the
  softmax run in float32, but on vLLM's copy of the head weights in the engine dtype and on the
  decoder's hidden state in that dtype, whereas the trainer's head uses its float32 master weights.
  In float32 nothing differs.

In-process: `VLLM_ENABLE_V1_MULTIPROCESSING=0` with the "uni" executor puts the engine core and its
worker in this process (a state dict then reaches the worker without being serialised). vLLM's
CPU worker changes the process as it starts; what it changes that the trainer relies on is put
back (`_process_left_as_found`): the random states it reseeds, `torch.set_num_threads` (which it
replaces by a no-op) and `LD_PRELOAD` (tcmalloc and libgomp, which every later child process, the
sandboxed reward functions included, would load). Sampling also keeps the global RNG untouched:
vLLM's CPU sampler draws its unused per-row seeds from it. One engine per process; with several
trainer ranks use the HF engine (setup.build_sampler refuses).

Hangs: the engine runs in this process, so a generate call or a weight reload that stops making
progress cannot be interrupted or restarted from here. A watchdog thread (`Overrun`,
scalerl/distributed/watchdog.py) prints one line to stderr when one runs past
`health.hang.deadline_s`, naming the call; the run then keeps waiting for it (Ctrl-C stops it after
the step, with a checkpoint). Use `rollout.mode: async` to run the engine in a producer process whose
heartbeat the learner watches.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import torch

from scalerl.distributed.watchdog import Overrun
from scalerl.rollout.hf import left_pad
from scalerl.types import Rollout, SamplingParams, derive_seed

GiB = 1 << 30


@contextlib.contextmanager
def _rng_left_as_found(device: torch.device) -> Iterator[None]:
    """Python's, numpy's and torch's global random states (CPU, and `device` when a GPU) as they were."""
    py, npy = random.getstate(), np.random.get_state()
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


@contextlib.contextmanager
def _process_left_as_found(device: torch.device) -> Iterator[None]:
    """Undo what building vLLM's engine changes in the trainer's process (see the module docstring)."""
    set_num_threads, preload = torch.set_num_threads, os.environ.get("LD_PRELOAD")
    try:
        with _rng_left_as_found(device):
            yield
    finally:
        torch.set_num_threads = set_num_threads
        if preload is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = preload


def engine_dtype(autocast_dtype: str | None, weights_dtype: str) -> str:
    """What the engine computes in: the learner's autocast dtype, else its weights' dtype."""
    return autocast_dtype or weights_dtype


def save_model_folder(model: torch.nn.Module, tokenizer, folder: Path) -> Path:
    """The policy as a Hugging Face folder (config, safetensors, tokenizer) for the engine to load."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class VLLMSampler:
    """Samples with a vLLM engine built from a Hugging Face model folder; receives state dicts."""

    def __init__(self, model_dir: str | Path, *, pad_id: int, stop_ids: int | Sequence[int], device: torch.device,
                 dtype: str = "float32", fp32_head: bool = True, kv_cache_gb: float = 1.0, max_model_len: int | None = None,
                 enforce_eager: bool = True, gpu_memory_utilization: float = 0.3, max_num_seqs: int = 256, seed: int = 0,
                 block_size: int | None = None, deadline_s: float | None = None):
        """`dtype`: the engine's compute dtype (`engine_dtype`); `fp32_head`: the LM head's matmul in float32 below
        float32 (see the module docstring); `kv_cache_gb`: the KV cache, allocated at start; `gpu_memory_utilization`:
        on a GPU, the share of its memory the engine may take beside the learner (on CPU the explicit KV size rules);
        `block_size`: the KV cache's block (vLLM's default for the device when None; the prefix cache reuses whole blocks);
        `deadline_s`: a generate call or weight reload running longer is reported on stderr (None: never)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core and worker in this process (read by vLLM lazily)
        from vllm import LLM

        stops = [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)
        self.pad_id, self.eos_id, self.device = pad_id, stops[0], device
        self.stop_ids = stops
        self._version = 0
        self.dtype, self.deadline_s = dtype, deadline_s
        extra = {"block_size": block_size} if block_size else {}
        with _process_left_as_found(device):
            self.llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                           max_model_len=max_model_len, kv_cache_memory_bytes=int(kv_cache_gb * GiB),
                           gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
                           logprobs_mode="processed_logprobs", distributed_executor_backend="uni",
                           hf_overrides={"head_dtype": "float32"} if fp32_head and dtype != "float32" else {}, **extra)

    @property
    def version(self) -> int:
        return self._version

    @torch.no_grad()
    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        if weights is not None:  # None: only the version (a resume's bookkeeping; the state dict follows)
            with self._watched(f"vLLM engine's weight reload (version {version})"):
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
            self.llm.reset_prefix_cache()  # cached prompt blocks hold keys and values of the old weights
        self._version = version

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()

    def _watched(self, part: str) -> contextlib.AbstractContextManager:
        if self.deadline_s is None:
            return contextlib.nullcontext()
        return Overrun(part, self.deadline_s, lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))

    def _requests(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None):
        """(prompts, vLLM sampling params) in row order: one request of n samples per prompt, or, greedy, n of one."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        common = dict(max_tokens=params.max_new_tokens, min_tokens=params.min_new_tokens, stop_token_ids=self.stop_ids,
                      logprobs=0, detokenize=False)
        if params.temperature == 0:
            greedy = VSamplingParams(n=1, temperature=0.0, **common)
            return [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids for _ in range(params.n)], greedy
        if seeds is None:
            raise ValueError(f"VLLMSampler.sample: temperature {params.temperature} draws random tokens and needs `seeds`, "
                             "one per prompt (only greedy decoding, temperature 0, goes without)")
        if len(seeds) != len(prompt_ids):
            raise ValueError(f"VLLMSampler.sample: `seeds` has {len(seeds)} seeds for {len(prompt_ids)} prompts; give one per prompt")
        per_prompt = [VSamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                      seed=derive_seed(int(seed), "vllm"), **common) for seed in seeds]
        return [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids], per_prompt

    @torch.no_grad()
    def sample(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None) -> Rollout:
        n = params.n
        prompts, sampling = self._requests(prompt_ids, params, seeds)
        with _rng_left_as_found(self.device), self._watched(f"vLLM engine's generate call ({len(prompts)} requests)"):
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        rows = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]  # row i·n+j: prompt i's sample j
        T = max(len(c.token_ids) for c in rows)
        completion = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        logps = torch.zeros((len(rows), T), dtype=torch.float32)
        for r, c in enumerate(rows):
            tokens = list(c.token_ids)
            completion[r, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            logps[r, :len(tokens)] = torch.tensor([position[t].logprob for position, t in zip(c.logprobs, tokens)])
        ids, mask = left_pad(prompt_ids, self.pad_id)
        ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
        # A token is part of the completion if no stop token came strictly before it.
        is_stop = torch.isin(completion, torch.tensor(self.stop_ids)).long()
        completion_mask = ((is_stop.cumsum(1) - is_stop) == 0).long()  # (B, T)
        to = self.device
        return Rollout(
            prompt_ids=ids.to(to),
            prompt_mask=mask.to(to),
            completion_ids=completion.to(to),
            completion_mask=completion_mask.to(to),
            sampler_logprobs=(logps * completion_mask).to(to),
            truncated=(is_stop.sum(1) == 0).to(to),
            group_ids=torch.arange(len(prompt_ids)).repeat_interleave(n).to(to),
        )
