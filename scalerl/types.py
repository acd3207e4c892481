"""The shared vocabulary of every role: what a task is, what an engine samples, what the rollout
side hands the learner. Plain dataclasses over tensors; this module imports nothing of the project,
so every folder can depend on it and none on another one for these names.

    Task, Completion     the environment's side: a prompt and what the policy produced (text)
    SamplingParams       how an engine samples (per-request seeds are passed beside them)
    Rollout              an engine's batch of token rows, masks and sampler log-probs
    ScoredBatch          a Rollout with its rewards and the policy version that sampled it:
                         the one thing that crosses from the rollout side to the learner
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch is imported where a Rollout needs it, not at import: reward-function workers unpickle Task
# and Completion, and a worker that had to import torch first would miss a 1 s timeout.


def _empty() -> "torch.Tensor":
    import torch

    return torch.empty(0)


@dataclass(frozen=True)
class Task:
    """One prompt and what its verifier needs."""

    prompt: str
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """What the policy produced for a task, as the environment sees it.

    `text` is the decoded completion up to (not including) the end-of-sequence token; `finished` is
    False when generation stopped at `max_new_tokens` instead. In a multi-turn episode `text` and
    `token_ids` span every turn and observation (the EOS ending each earlier turn included), and
    `turns` is the transcript: policy turn, observation, ..., policy turn, each turn without its EOS;
    single-turn completions leave `turns` empty. `reward` is the reward an agent episode's own code returned
    (scalerl/envs/agent.py), None for every other completion and for an episode that failed.
    """

    text: str
    token_ids: tuple[int, ...]
    finished: bool
    turns: tuple[str, ...] = ()
    reward: float | None = None

    @property
    def final_turn(self) -> str:
        """The policy's last turn (for a single-turn completion, its text)."""
        return self.turns[-1] if self.turns else self.text


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1  # completions per prompt
    min_new_tokens: int = 0  # EOS is masked out of the first min_new_tokens tokens' distributions


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that is a pure function of `parts` (e.g. run seed, step, prompt index): the
    per-request seeds of the samplers, so that a resumed run, another engine or another world size
    draws the same numbers for the same request without any generator state to carry around."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class Rollout:
    """A batch of sampled completions; row i answers prompt `group_ids[i]` of the step.

    Prompts are left-padded and completions right-padded, so `cat(prompt_ids, completion_ids)` is
    the full sequence with all prompts ending in the same column.

    In a multi-turn episode the completion holds the policy's turns and the environment's
    observations in order: `completion_mask` is 1 only on the policy's own tokens (what is trained
    on, possibly with gaps), `completion_attention_mask` 1 on every real token, observations
    included (what the forward pass attends to). Single-turn rollouts leave the latter empty: it is
    then `completion_mask` itself.

    `teacher_logprobs` is filled by the rollout side only when it serves the distillation teacher:
    the learner then uses them in place of a teacher of its own.
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded
    prompt_mask: torch.Tensor  # (B, P) long, 1 on real prompt tokens
    completion_ids: torch.Tensor  # (B, T) long, pad after the end
    completion_mask: torch.Tensor  # (B, T) long, 1 on generated tokens up to and including EOS (every policy turn's)
    sampler_logprobs: torch.Tensor  # (B, T) float32, log-prob of each token under the sampling distribution
    truncated: torch.Tensor  # (B,) bool, stopped at max_new_tokens without EOS
    group_ids: torch.Tensor  # (B,) long, which prompt of the step each row belongs to
    completion_attention_mask: torch.Tensor = field(default_factory=_empty)  # (B, T) long, or empty
    # (B, T) float32, log π_teacher of each completion token (0 on padding) when the rollout side serves on-policy
    # distillation's teacher (algorithm.distill_teacher_placement=rollout), at the sampling temperature; else empty
    teacher_logprobs: torch.Tensor = field(default_factory=_empty)

    def completion_extent(self) -> torch.Tensor:
        """(B, T) long: 1 on every real completion-side token (policy and observations), 0 on padding."""
        return self.completion_attention_mask if self.completion_attention_mask.numel() else self.completion_mask

    def attention_mask(self) -> torch.Tensor:
        """(B, P+T) long: the attention mask of `cat(prompt_ids, completion_ids)`."""
        import torch

        return torch.cat([self.prompt_mask, self.completion_extent()], dim=1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: slice | torch.Tensor) -> "Rollout":
        """A sub-batch (a mini- or micro-batch) sharing storage with this one."""
        return Rollout(**{name: (value[rows] if value.numel() else value) for name, value in vars(self).items()})


@dataclass
class ScoredBatch:
    """One step's batch as the rollout side hands it to the learner.

    `policy_version` is the learner version whose weights the sampler held when it generated the
    batch: the learner compares it with its own to know whether the batch is on-policy (it never
    assumes so). `rollout.sampler_logprobs` are that sampler's log-probs, the behaviour policy of any
    off-policy correction; `rollout.teacher_logprobs`, when the rollout side serves the distillation
    teacher, are that teacher's. `rollout.completion_mask` already carries the rollout side's filters
    (zero-variance groups masked out). Rows are whole groups of `group_size` consecutive completions.
    """

    rollout: Rollout
    rewards: torch.Tensor  # (B,) float32, what the update uses (fused, capped, penalised)
    task_rewards: torch.Tensor  # (B,) float32, the environment's own score
    policy_version: int
    prompts: list[str]  # (B,) the prompt of each row, for dumps
    completions: list[str]  # (B,) decoded completions, for dumps
    generated_tokens: int  # completion tokens sampled, before any filtering
    metrics: dict[str, float] = field(default_factory=dict)  # the rollout side's own (reward components, filters)
    row_weights: torch.Tensor | None = None  # (B,) importance weights of replayed rows (PER), scaling their advantages; None: all 1

    def __len__(self) -> int:
        return len(self.rollout)


def as_score(value: Any) -> float:
    """A score returned by user code (an environment, a reward function) as a float; NaN for what is not a number
    (None, a string, a list), which the caller counts as a failure and names, like a NaN or an inf."""
    if isinstance(value, (str, bytes)):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")
