"""Micro-batches by token budget (scalerl/learner/micro_batches.py) on a hand-made batch: longest first,
packed under the budget, each without its all-padding columns, whole groups for prompt-level aggregation,
and as many micro-batches on every rank."""

from __future__ import annotations

import torch

from scalerl.learner.micro_batches import Micro, micro_batches, split_to
from scalerl.types import Rollout

# 6 rows, prompts left-padded to 4, completions right-padded to 6; groups of two
PROMPT_LEN = [2, 2, 4, 4, 3, 3]
COMPLETION_LEN = [1, 6, 2, 3, 5, 1]


def _batch() -> Rollout:
    B, P, T = 6, 4, 6
    prompt_mask = torch.tensor([[0] * (P - n) + [1] * n for n in PROMPT_LEN])
    completion_mask = torch.tensor([[1] * n + [0] * (T - n) for n in COMPLETION_LEN])
    ids = torch.arange(B * (P + T)).view(B, P + T) + 3
    return Rollout(prompt_ids=ids[:, :P] * prompt_mask, prompt_mask=prompt_mask, completion_ids=ids[:, P:] * completion_mask,
                   completion_mask=completion_mask, sampler_logprobs=-completion_mask.float(), truncated=torch.zeros(B, dtype=torch.bool),
                   group_ids=torch.tensor([0, 0, 1, 1, 2, 2]))


def _rows(m: Micro) -> list[int]:
    return m.rows.tolist()


def test_rows_packed_longest_first_under_the_budget():
    batch = _batch()
    micros = micro_batches(batch, slice(0, 6), size=6, tokens=16, whole_groups=False)
    # longest completion first: rows 1 (6), 4 (5), 3 (3), 2 (2), 0 (1), 5 (1). Padded size rows × (longest prompt + longest
    # completion): [1] 1·8 = 8, [1, 4] 2·(3 + 6) = 18 > 16 → [4] 1·8; [4, 3] 2·(4 + 5) = 18 → [3] 7; [3, 2] 2·(4 + 3) = 14;
    # [3, 2, 0] 3·7 = 21 → [0] 3; [0, 5] 2·(3 + 1) = 8
    assert [_rows(m) for m in micros] == [[1], [4], [3, 2], [0, 5]]
    assert [(m.prompt_width, m.width) for m in micros] == [(2, 6), (3, 5), (4, 3), (3, 1)]
    mb = micros[3].select(batch)  # rows 0 and 5 without their all-padding columns
    assert mb.prompt_ids.shape == (2, 3) and mb.completion_ids.shape == (2, 1) and mb.sampler_logprobs.shape == (2, 1)
    assert torch.equal(mb.prompt_ids[0], batch.prompt_ids[0, 1:]) and torch.equal(mb.completion_ids, batch.completion_ids[[0, 5], :1])
    per_token = torch.arange(36.0).view(6, 6)
    assert torch.equal(micros[2].cut(per_token), per_token[[3, 2], :3]) and torch.equal(micros[2].cut(torch.arange(6)), torch.tensor([3, 2]))
    # a budget over the whole batch's padded size: one micro-batch, all rows
    assert [sorted(_rows(m)) for m in micro_batches(batch, slice(0, 6), size=6, tokens=60, whole_groups=False)] == [list(range(6))]


def test_prompt_level_aggregation_keeps_groups_whole():
    micros = micro_batches(_batch(), slice(0, 6), size=6, tokens=16, whole_groups=True)
    # groups by their longest completion: {0, 1} (6), {4, 5} (5), {2, 3} (3); each pair fills the budget: 2·(2 + 6), 2·(3 + 5)
    assert [_rows(m) for m in micros] == [[0, 1], [4, 5], [2, 3]]


def test_rows_by_count_keep_todays_slices():
    assert [m.rows for m in micro_batches(_batch(), slice(2, 6), size=2, tokens=None, whole_groups=False)] == [slice(2, 4), slice(4, 6)]


def test_every_rank_runs_as_many_micro_batches():
    micros = micro_batches(_batch(), slice(0, 6), size=6, tokens=16, whole_groups=False)
    more = split_to(micros, 6)
    assert len(more) == 6 and sorted(r for m in more for r in _rows(m)) == list(range(6))


def test_a_budget_and_a_row_count_are_refused_together():
    import pytest

    from scalerl.config import load_config
    from scalerl.errors import ScaleRLError

    with pytest.raises(ScaleRLError, match="train.micro_batch_tokens and train.micro_batch_size are both set"):
        load_config(overrides={"train.micro_batch_tokens": 512, "train.micro_batch_size": 4})
    assert load_config(overrides={"train.micro_batch_tokens": 512}).plan.micro_batch_tokens == 512
