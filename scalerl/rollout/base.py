"""The interface every rollout engine implements.

The Hugging Face engine (`hf.py`) samples with the training model itself; a vLLM engine, an
asynchronous producer process or a Ray actor implement the same protocol. What crosses it is plain
data: token ids in, a `Rollout` out (scalerl/types.py), and weights with their version.

Conventions every engine keeps (tests/rollout/sampler_contract.py checks them):
- rows are grouped per prompt, in order: prompt i's `params.n` completions are rows i·n … i·n+n−1;
- a completion ends at its first EOS, which is part of it (mask 1) and is followed by padding
  (mask 0, sampler log-prob 0); a row without EOS has `truncated` True and `max_new_tokens` tokens;
- `sampler_logprobs` are the log-probs of the distribution actually sampled from (temperature,
  top-k and top-p applied), which at top_k 0 and top_p 1 equal the training forward's log-probs at
  the same temperature;
- `seeds[i]` alone decides prompt i's random draws: the same seed gives the same completions
  whatever else is in the batch, so runs, resumes and engines are reproducible per request.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import torch

from scalerl.types import Rollout, SamplingParams


class Sampler(Protocol):
    def sample(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None) -> Rollout:
        """Sample `params.n` completions for every prompt; `seeds` has one seed per prompt (None only
        for greedy decoding, temperature 0, which draws nothing)."""
        ...

    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        """Sample from these weights (a state dict) from now on, and record `version` as the policy
        version of what is sampled next. An engine that shares the learner's modules receives None:
        its weights are already the learner's."""
        ...

    @property
    def version(self) -> int:
        """The policy version of the weights the engine samples with."""
        ...
