"""How the learner cuts a mini-batch into micro-batches: `train.micro_batch_size` rows at a time, in order,
or, with `train.micro_batch_tokens`, rows sorted by length and packed under a token budget.

By tokens: the units (rows; with prompt-level aggregation each prompt's group, which must stay whole) are
taken longest completion first and a micro-batch takes the next unit while its padded size, rows ×
(longest prompt + longest completion) among them, stays within the budget; a unit alone over the budget is
a micro-batch of its own. Each micro-batch drops the columns that are padding in all its rows (prompts are
left-padded, completions right-padded), so short rows are no longer computed at the batch's longest length.
The update does not depend on the split: every micro-batch's loss is divided by the whole mini-batch's
unit count (scalerl/learner/learner.py: `optimize`), so their gradients sum to the mini-batch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalerl.types import Rollout


@dataclass(frozen=True)
class Micro:
    rows: slice | torch.Tensor  # rows of the step's rollout: a slice, or a (b,) long index
    prompt_width: int | None = None  # prompt columns kept, the last ones (None: all)
    width: int | None = None  # completion columns kept, the first ones (None: all)

    @property
    def size(self) -> int:
        """Rows."""
        return self.rows.stop - self.rows.start if isinstance(self.rows, slice) else len(self.rows)

    def select(self, rollout: Rollout) -> Rollout:
        """The micro-batch's rows, less the columns that are padding in all of them."""
        mb = rollout.select(self.rows)
        if self.width is None:
            return mb
        keep = {"prompt_ids": slice(-self.prompt_width, None), "prompt_mask": slice(-self.prompt_width, None)}
        return Rollout(**{name: value[:, keep.get(name, slice(0, self.width))] if value.dim() == 2 and value.numel() else value
                          for name, value in vars(mb).items()})

    def cut(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """A per-row (B,) or per-token (B, T) target of the rollout, at this micro-batch's rows and columns."""
        if x is None:
            return None
        x = x[self.rows]
        return x[:, :self.width] if x.dim() == 2 and self.width is not None else x


def micro_batches(rollout: Rollout, rows: slice, *, size: int, tokens: int | None, whole_groups: bool) -> list[Micro]:
    """The micro-batches of the mini-batch `rows`: by `size` rows in order, or with a token budget `tokens`
    packed by length (see the module docstring; `whole_groups` keeps each run of equal group ids together)."""
    if tokens is None:
        return [Micro(slice(s, min(s + size, rows.stop))) for s in range(rows.start, rows.stop, size)]
    extent, prompt_len = rollout.completion_extent()[rows], rollout.prompt_mask[rows].sum(1)
    T = extent.shape[1]
    # the completion's width: one past its last real token (its real tokens may have gaps in multi-turn episodes)
    width = torch.where(extent.bool(), torch.arange(1, T + 1), 0).amax(1) if T else torch.zeros(len(extent), dtype=torch.long)
    index = torch.arange(rows.start, rows.stop)
    units = _units(rollout.group_ids[rows]) if whole_groups else [torch.tensor([i]) for i in range(len(index))]
    units.sort(key=lambda u: -int(width[u].max()))  # stable: equal lengths keep their order
    packs: list[list[torch.Tensor]] = []
    for unit in units:
        trial = [*packs[-1], unit] if packs else None
        if trial is not None and _padded(torch.cat(trial), prompt_len, width) <= tokens:
            packs[-1] = trial
        else:
            packs.append([unit])
    out = []
    for pack in packs:
        local = torch.cat(pack)
        out.append(Micro(index[local], int(prompt_len[local].max()), max(int(width[local].max()), 1)))
    return out


def _units(group_ids: torch.Tensor) -> list[torch.Tensor]:
    """(n,) local row indices of each run of equal consecutive group ids."""
    starts = [0] + [i for i in range(1, len(group_ids)) if group_ids[i] != group_ids[i - 1]] + [len(group_ids)]
    return [torch.arange(a, b) for a, b in zip(starts, starts[1:])]


def _padded(local: torch.Tensor, prompt_len: torch.Tensor, width: torch.Tensor) -> int:
    """Tokens the padded forward of these rows computes: rows × (longest prompt + longest completion)."""
    return len(local) * int(prompt_len[local].max() + width[local].max())


def split_to(micros: list[Micro], n: int) -> list[Micro]:
    """`micros` cut into `n` micro-batches (n ≥ len(micros), at most one row each): the one with the most rows
    halved until there are n. Every rank then runs the same number of forwards and backwards (the parallel
    strategies' collectives, FSDP2's all-gathers in each forward, pair up across ranks)."""
    micros = list(micros)
    while len(micros) < n:
        i = max(range(len(micros)), key=lambda k: micros[k].size)
        m = micros[i]
        if m.size < 2:
            raise ValueError(f"cannot cut {len(micros)} micro-batches of one row into {n}")
        half = m.size // 2
        idx = torch.arange(m.rows.start, m.rows.stop) if isinstance(m.rows, slice) else m.rows
        micros[i:i + 1] = [Micro(idx[:half], m.prompt_width, m.width), Micro(idx[half:], m.prompt_width, m.width)]
    return micros
