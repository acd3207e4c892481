"""The rollout side's two interfaces: `RolloutSide`, what the training job asks of whatever makes its
batches (an in-process `RolloutWorker`, or an `AsyncRollout` whose producer is a spawned process or
a Ray actor), and `Sampler`, what every rollout engine implements.

`RolloutSide` (tests/rollout/test_rollout_contract.py runs every implementation through it): a
scored batch for a step, weights with their version, a held-out evaluation, its own state and files
for checkpoints, and close. Nothing outside the rollout side reads its members.

`Sampler`:

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

from pathlib import Path
from typing import Mapping, Protocol, Sequence

import torch

from scalerl.types import Rollout, SamplingParams, ScoredBatch


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


class RolloutSide(Protocol):
    shares_weights: bool  # it samples with the learner's own modules: `sync_weights` receives None, only a version

    def produce(self, step: int) -> ScoredBatch:
        """Sample, score and filter the batch of `step` (each step once, in order). With
        algorithm.distill_teacher_placement=rollout it also fills `rollout.teacher_logprobs` (scalerl/types.py):
        the learner then has no teacher of its own and refuses a batch without them."""
        ...

    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        """Sample with these weights, as policy `version`, from the next batch on."""
        ...

    def evaluate(self, step: int) -> float:
        """The held-out pass rate of the newest weights after `step` steps (the same on every rank)."""
        ...

    def state_dict(self) -> dict:
        """What a resume needs to go on exactly: the data position, the reward pipeline's state, the policy version."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def save_files(self, folder: Path, rank: int) -> None:
        """This rank's files in a checkpoint folder (the replay buffer), beside `state_dict`."""
        ...

    def load_files(self, folder: Path, rank: int) -> None: ...

    def close(self) -> None: ...
