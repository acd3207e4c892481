"""On-policy distillation's teacher served by the rollout side (algorithm.distill_teacher_placement=rollout).

The worker that sampled a batch scores it with the frozen teacher and ships log π_teacher of every
completion token in `Rollout.teacher_logprobs` (scalerl/types.py): the learner then needs no copy of
the teacher, and in async mode the teacher's forward runs in the producer process, beside sampling,
not on the learner's critical path. The forward is the learner's own (`CompletionModel`, the
sampling temperature, the learner's precision and micro-batch size), so both placements give the
same advantages to round-off (tests/rollout/test_teacher_placement.py).
"""

from __future__ import annotations

from typing import Callable, ContextManager

import torch

from scalerl.models.logprobs import CompletionModel
from scalerl.types import Rollout


class TeacherScorer:
    def __init__(self, teacher: torch.nn.Module, *, temperature: float, fp32_head: bool, micro_batch_size: int,
                 autocast: Callable[[], ContextManager]):
        """`teacher`: the frozen model (scalerl/models/build.py: build_teacher); the rest as the learner's frozen forward."""
        self.model = CompletionModel(teacher.eval())
        self.temperature, self.fp32_head, self.micro_batch_size, self.autocast = temperature, fp32_head, micro_batch_size, autocast

    @torch.no_grad()
    def __call__(self, batch: Rollout) -> torch.Tensor:
        """(B, T) float32: log π_teacher(y_t | x, y_<t) at the sampling temperature, 0 off the completion's tokens."""
        parts = []
        for start in range(0, len(batch), self.micro_batch_size):
            mb = batch.select(slice(start, start + self.micro_batch_size))
            with self.autocast():
                parts.append(self.model(mb, temperature=self.temperature, fp32_head=self.fp32_head).logprobs.float())
        logprobs = torch.cat(parts)  # (B, T)
        return torch.where(batch.completion_extent().bool(), logprobs, torch.zeros_like(logprobs))
