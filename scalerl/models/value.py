"""Critics for PPO: a separate value model, or a value head on the policy's last hidden state."""

from __future__ import annotations

import torch
from torch import nn

from scalerl.models.loading import hub_kernels_kwargs
from scalerl.models.paths import resolve_model_path
from scalerl.types import Rollout


class ValueHead(nn.Module):
    """A scalar per position from a hidden state; zero-initialised so V starts at 0 everywhere."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)  # (B, T)


class ValueModel(nn.Module):
    """A separate critic: the policy checkpoint's backbone (no LM head) plus a value head.

    V_t is read at the position that predicts completion token t, i.e. the value of the state
    before y_t is generated, which is what GAE needs.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(hidden_size)

    @classmethod
    def from_pretrained(cls, path: str, *, trust_remote_code: bool = False, hub_kernels: bool = False) -> "ValueModel":
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        previous = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the checkpoint's LM head is unused here on purpose: no load report
        try:
            backbone = AutoModel.from_pretrained(resolve_model_path(path), dtype=torch.float32, trust_remote_code=trust_remote_code,
                                               **hub_kernels_kwargs(hub_kernels))
        finally:
            hf_logging.set_verbosity(previous)
        return cls(backbone, backbone.config.hidden_size)

    def forward(self, batch: Rollout) -> torch.Tensor:
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
        mask = batch.attention_mask()  # (B, P+T); a multi-turn episode's observations are context too
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        T = batch.completion_ids.shape[1]
        hidden = self.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
        return self.head(hidden[:, -(T + 1):-1])  # (B, T)
