"""Every objective end to end on the arithmetic environment, and KL control inside real runs."""

from __future__ import annotations

import math
import os

import pytest
import torch

from conftest import tiny_overrides
from scalerl.algorithms.kl_control import progressive_beta
from scalerl.algorithms.rollout_correction import RolloutCorrection
from scalerl.config import load_config
from scalerl.jsonl import read_metrics
from scalerl.trainer import loop

# one thread on a pytest-xdist worker (the other worker has the second core), two alone
LEARN = {"rollout.prompts_per_step": 8, "rollout.group_size": 8, "train.steps": 50,
         "train.threads": 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2, "eval.every": 0,
         "eval.max_tasks": 200}


@pytest.mark.slow
@pytest.mark.parametrize("choice", [  # GRPO, the default, learns in tests/trainer/test_training.py (through the real CLI)
    {"algorithm.name": "cispo"},
    {"algorithm.name": "rloo"},
    {"algorithm.name": "reinforce_pp"},
    {"algorithm.name": "ppo"},
    {"algorithm.name": "ppo", "algorithm.critic": "head", "algorithm.kl.beta": 0.02, "algorithm.kl.in_reward": True},
    {"preset": "scalerl"},
], ids=["cispo", "rloo", "reinforce_pp", "ppo", "ppo-head-kl-in-reward", "preset-scalerl"])
def test_each_objective_raises_reward_and_pass_rate(runs, choice):
    summary = loop.train(load_config(overrides=tiny_overrides(runs, "learn", **{**LEARN, **choice})))
    rows = read_metrics(runs / "learn")
    first, last = (sum(r["reward_mean"] for r in part) / len(part) for part in (rows[:15], rows[-15:]))
    assert last > first, (first, last)
    assert summary["pass_rate_after"] > summary["pass_rate_before"] + 0.05, summary  # before: 0.325
    if choice.get("algorithm.name") == "ppo":
        assert all(r["value_loss"] is not None for r in rows)
    if "preset" in choice:
        assert all(0.0 <= r["zero_variance_frac"] <= 1.0 for r in rows) and "retired_prompts" in rows[-1]


def _run(runs, name, **extra):
    loop.train(load_config(overrides=tiny_overrides(runs, name, **{"train.steps": 10, "eval.every": 0, **extra})))
    return read_metrics(runs / name)


def test_progressive_beta_is_logged_every_step(runs):
    rows = _run(runs, "prog", **{"algorithm.kl.schedule": "progressive", "algorithm.kl.beta": 0.1,
                                 "algorithm.kl.beta_min": 0.02, "algorithm.kl.beta_target": 0.2})
    expected = [progressive_beta(s - 1, 10, beta_init=0.1, beta_min=0.02, beta_target=0.2) for s in range(1, 11)]
    assert [r["beta"] for r in rows] == pytest.approx(expected)
    assert all(r["kl"] is not None and r["kl"] >= 0 for r in rows)


def test_adaptive_beta_follows_the_measured_kl(runs):
    # Target far above anything a few steps can reach: e = -0.2 each step, so β shrinks by (1 - 0.2·n/horizon).
    rows = _run(runs, "adapt", **{"algorithm.kl.schedule": "adaptive", "algorithm.kl.beta": 0.1,
                                  "algorithm.kl.target_kl": 100.0, "algorithm.kl.horizon": 160, "optim.lr": 1e-3})
    n = 16  # completions per step
    expected = [0.1 * (1 - 0.2 * n / 160) ** (s - 1) for s in range(1, 11)]
    assert [r["beta"] for r in rows] == pytest.approx(expected, rel=1e-6)


def test_max_kl_guard_damps_the_learning_rate(runs):
    rows = _run(runs, "guard", **{"algorithm.kl.max_kl": 1e-4, "optim.lr": 1e-3})
    assert rows[0]["kl_before"] == pytest.approx(0.0, abs=1e-6) and rows[0]["kl_guard_scale"] == 1.0  # π = π_ref at first
    later = [r for r in rows[1:] if r["kl_before"] > 1e-4]
    assert later, "the policy never moved past max_kl"
    for r in later:
        assert r["kl_guard_scale"] == pytest.approx(1e-4 / r["kl_before"], rel=1e-3)
    assert math.isfinite(rows[-1]["loss"])


def test_adaptive_beta_follows_the_sequence_level_kl(runs):
    rows = _run(runs, "adapt-seq", **{"algorithm.kl.schedule": "adaptive", "algorithm.kl.beta": 0.1, "algorithm.kl.level": "sequence",
                                      "algorithm.kl.target_kl": 0.05, "algorithm.kl.horizon": 160, "optim.lr": 1e-3})
    n = 16  # completions per step
    for prev, nxt in zip(rows, rows[1:]):
        error = min(max(prev["kl_seq"] / 0.05 - 1, -0.2), 0.2)
        assert nxt["beta"] == pytest.approx(prev["beta"] * (1 + error * n / 160), rel=1e-6)


@pytest.mark.parametrize("level, key", [("token", "kl"), ("sequence", "kl_seq")])
def test_max_kl_guard_measures_kl_at_the_configured_level(runs, level, key):
    """One epoch, one micro-batch: the loss's forward runs on the pre-update policy, so the guard's
    KL equals the logged KL of the same level."""
    rows = _run(runs, f"guard-{level}", **{"algorithm.kl.max_kl": 10.0, "algorithm.kl.level": level, "optim.lr": 1e-3})
    assert max(r[key] for r in rows) > 1e-3
    assert [r["kl_before"] for r in rows] == pytest.approx([r[key] for r in rows], rel=1e-4, abs=1e-6)


def test_entropy_bonus_lowers_the_loss_by_coef_times_entropy(runs):
    """Same seed, same first batch: with token-level aggregation the loss moves by exactly −coef·H̄."""
    base = _run(runs, "h0", **{"train.steps": 1})[0]
    bonus = _run(runs, "h1", **{"train.steps": 1, "algorithm.entropy_coef": 0.01})[0]
    assert bonus["entropy"] == pytest.approx(base["entropy"], rel=1e-6)
    assert bonus["loss"] == pytest.approx(base["loss"] - 0.01 * base["entropy"], abs=1e-6)


def test_ppo_with_a_reward_model_uses_its_scores(runs, tmp_path):
    """reward.model replaces the environment's reward; the environment's verdict is still logged."""
    from scalerl.rewards.reward_model import load_reward_model

    model, tokenizer = load_reward_model("builtin")
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    rows = _run(runs, "ppo-rm", **{"train.steps": 2, "algorithm.name": "ppo", "reward.model": str(tmp_path / "rm")})
    assert all("task_reward_mean" in r and r["value_loss"] is not None for r in rows)
    assert any(r["reward_mean"] != r["task_reward_mean"] for r in rows)  # an untrained head's scores, not 0/1 checks


@pytest.mark.parametrize("overrides, expected", [
    ({"algorithm.importance_level": "sequence", "algorithm.clip_eps_low": 3e-4, "algorithm.clip_eps_high": 4e-4},
     {"importance_level": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "policy_loss": "clip"}),
    ({"algorithm.delta": 1.5}, {"delta": 1.5}),
    ({"algorithm.off_policy_mask": 0.5, "algorithm.tis_cap": 2.0}, {"off_policy_mask": 0.5, "tis_cap": 2.0}),
    ({"algorithm.loss_agg": "constant"}, {"loss_agg": "constant", "max_new_tokens": 8, "normalizer": 16 * 8}),
    ({"algorithm.kl.beta": 0.1, "algorithm.kl.with_ratio": True, "algorithm.kl.estimator": "k2"},
     {"kl_with_ratio": True, "beta": 0.1, "kl_estimator": "k2"}),
    ({"algorithm.name": "cispo", "algorithm.eps_max": 3.0}, {"policy_loss": "cispo", "eps_max": 3.0}),
    ({"algorithm.name": "ppo", "algorithm.vf_coef": 0.25, "algorithm.value_clip": None}, {"vf_coef": 0.25, "value_clip": None}),
    ({"algorithm.entropy_coef": 0.01, "algorithm.loss_agg": "sequence"}, {"entropy_coef": 0.01, "loss_agg": "sequence", "normalizer": 16}),
    ({"algorithm.policy_loss": "sapo", "algorithm.sapo_tau_neg": 2.0, "algorithm.loss_agg": "sequence"},
     {"policy_loss": "sapo", "policy_params": {"tau_pos": 1.0, "tau_neg": 2.0}}),
    ({"algorithm.policy_loss": "vespo", "algorithm.vespo_k_pos": 1.5},
     {"policy_loss": "vespo", "policy_params": {"k_pos": 1.5, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}}),
    ({"algorithm.policy_loss": "gmpo", "algorithm.clip_eps_low": 0.4, "algorithm.clip_eps_high": 0.4},
     {"policy_loss": "gmpo", "clip_eps_low": 0.4}),
    ({"algorithm.policy_loss": "clip_cov", "algorithm.cov_ratio": 0.1},
     {"policy_loss": "clip_cov", "policy_params": {"ratio": 0.1, "cov_low": 1.0, "cov_high": 5.0}}),
    ({"algorithm.policy_loss": "kl_cov", "algorithm.kl_cov_coef": 0.5},
     {"policy_loss": "kl_cov", "policy_params": {"ratio": 2e-4, "kl_coef": 0.5}}),
    ({"algorithm.loss_agg": "sequence_sum"}, {"loss_agg": "sequence_sum", "normalizer": 16}),
    ({"algorithm.top_entropy_quantile": 0.2}, {"top_entropy_quantile": 0.2}),
    ({"algorithm.name": "cispo", "algorithm.importance_level": "sequence"}, {"policy_loss": "cispo", "importance_level": "sequence"}),
    ({"algorithm.kl.beta": 0.1, "algorithm.kl.estimator": "k3+"}, {"kl_estimator": "k3+"}),
    ({"algorithm.name": "cispo", "algorithm.eps_min": 0.5}, {"policy_loss": "cispo", "policy_params": {"eps_min": 0.5}}),
    ({"algorithm.rollout_correction": "icepop", "algorithm.rollout_rs_low": 0.8},
     {"rollout_correction": RolloutCorrection("icepop", cap=2.0, low=0.8, high=2.0)}),
], ids=["gspo", "delta", "off-policy-mask", "dr-grpo-constant", "kl-with-ratio", "cispo", "ppo-value", "entropy", "sapo", "vespo",
        "gmpo", "clip-cov", "kl-cov", "luspo-sequence-sum", "top-entropy", "cispo-sequence", "k3-plus", "cispo-eps-min", "rollout-correction"])
def test_config_variants_reach_the_objective(runs, monkeypatch, overrides, expected):
    """Each objective setting in the config arrives at `rl_objective` as its keyword, and the step trains."""
    from scalerl.distributed.context import DistContext
    from scalerl.learner import learner as learner_module

    seen = []
    real = learner_module.rl_objective
    monkeypatch.setattr(learner_module, "rl_objective", lambda inputs, **kw: seen.append(kw) or real(inputs, **kw))
    config = load_config(overrides=tiny_overrides(runs, "variant", **overrides))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    assert seen and all(kw[k] == v for kw in seen for k, v in expected.items()), seen[0]
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])


def test_mask_truncated_completions_trains_on_no_token_of_a_cut_completion(runs, monkeypatch):
    from scalerl.distributed.context import DistContext
    from scalerl.learner import learner as learner_module

    masks = []
    real = learner_module.rl_objective
    monkeypatch.setattr(learner_module, "rl_objective", lambda inputs, **kw: masks.append(inputs.loss_mask) or real(inputs, **kw))
    config = load_config(overrides=tiny_overrides(runs, "cut", **{"algorithm.mask_truncated_completions": True, "rollout.max_new_tokens": 3}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    batch, _ = loop.train_step(rollout, learner, 1, learner.ctx)
    truncated = batch.rollout.truncated
    assert 0 < int(truncated.sum()) < len(truncated)  # 3 tokens: some sums end in time, some are cut
    [mask] = masks
    assert (mask[truncated] == 0).all() and (mask[~truncated].sum(1) > 0).all()


def test_mask_truncated_sequence_normaliser_counts_every_completion_as_trl(runs, monkeypatch):
    """loss_agg=sequence with mask_truncated_completions: the trainer divides by every completion,
    truncated ones included (TRL's grpo: mean over all B), so its loss is rl_objective's default one."""
    from scalerl.distributed.context import DistContext
    from scalerl.learner import learner as learner_module

    calls = []
    real = learner_module.rl_objective
    monkeypatch.setattr(learner_module, "rl_objective", lambda inputs, **kw: calls.append((inputs, kw)) or real(inputs, **kw))
    config = load_config(overrides=tiny_overrides(runs, "cutseq", **{"algorithm.mask_truncated_completions": True,
                                                                      "rollout.max_new_tokens": 3, "algorithm.loss_agg": "sequence"}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    batch, _ = loop.train_step(rollout, learner, 1, learner.ctx)
    [(inputs, kw)] = calls
    truncated = batch.rollout.truncated
    assert 0 < int(truncated.sum()) < len(truncated)
    assert kw["normalizer"] == len(truncated)  # 16 completions, not the 16 − truncated that keep tokens
    with torch.no_grad():
        trainer_loss = real(inputs, **kw)[0]
        default_loss = real(inputs, **{k: v for k, v in kw.items() if k != "normalizer"})[0]
    assert trainer_loss.item() == pytest.approx(default_loss.item(), rel=1e-6)


def test_adaptive_entropy_coefficient_is_steered_and_applied(runs, monkeypatch):
    """algorithm.entropy_target: each update's rl_objective gets the adaptive coefficient, which moves by
    entropy_coef_step after each update toward the target (up while the entropy is at or below it)."""
    from scalerl.distributed.context import DistContext
    from scalerl.learner import learner as learner_module

    coefs = []
    real = learner_module.rl_objective
    monkeypatch.setattr(learner_module, "rl_objective", lambda inputs, **kw: coefs.append(kw["entropy_coef"]) or real(inputs, **kw))
    # a target far above any entropy of the built-in model (its vocabulary is small): the coefficient only rises
    config = load_config(overrides=tiny_overrides(runs, "entropy", **{"algorithm.entropy_coef": 0.01, "algorithm.entropy_target": 50.0,
                                                                       "algorithm.entropy_coef_step": 0.02, "train.steps": 3}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    metrics = [loop.train_step(rollout, learner, step, learner.ctx)[1] for step in (1, 2, 3)]
    assert coefs == pytest.approx([0.01, 0.03, 0.05])  # 0.01, then + 0.02 after each update
    assert [m["entropy_coef"] for m in metrics] == pytest.approx([0.03, 0.05, 0.07])
    # a target below the entropy: the bonus is switched off and the coefficient falls to 0
    learner.state.entropy_coef, learner.state.last_entropy = None, None
    monkeypatch.setattr(learner, "algo", learner.algo.model_copy(update={"entropy_target": 1e-6}))
    coefs.clear()
    loop.train_step(rollout, learner, 4, learner.ctx)
    loop.train_step(rollout, learner, 5, learner.ctx)
    assert coefs == pytest.approx([0.01, 0.0]) and learner.state.entropy_coef == pytest.approx(0.0)


def test_policy_loss_and_rollout_correction_diagnostics_reach_the_step_metrics(runs):
    from scalerl.distributed.context import DistContext

    config = load_config(overrides=tiny_overrides(runs, "diag", **{"algorithm.policy_loss": "sapo", "algorithm.rollout_correction": "geo_mis_token_tis",
                                                                    "algorithm.top_entropy_quantile": 0.5}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    assert 0 < metrics["sapo_gate"] <= 1 and 0 < metrics["top_entropy_frac"] <= 1
    assert {"rollout_corr/ratio_p50", "rollout_corr/masked_frac", "rollout_corr/is_clip_frac", "rollout_corr/sampler_kl_k3"} <= set(metrics)
    assert 0.5 < metrics["rollout_corr/ratio_p50"] < 2  # the sampler is the same model: ratios near 1


def test_on_policy_distillation_uses_the_teacher_per_token(runs, tmp_path, monkeypatch):
    """algorithm.distill_teacher: a teacher that differs from the student gives per-token advantages
    log π_teacher − log π_student (B, T) and a non-zero distill/reverse_kl; a teacher equal to the student gives 0."""
    from scalerl.distributed.context import DistContext
    from scalerl.learner import learner as learner_module
    from scalerl.models.loading import load_model

    from scalerl.config.schema import ModelConfig

    teacher = load_model(ModelConfig(), torch.device("cpu"))
    with torch.no_grad():
        teacher.get_output_embeddings().weight.mul_(3.0)  # sharper: a different distribution
    teacher.save_pretrained(tmp_path / "teacher")
    seen = []
    real = learner_module.rl_objective
    monkeypatch.setattr(learner_module, "rl_objective", lambda inputs, **kw: seen.append(inputs.advantages) or real(inputs, **kw))
    config = load_config(overrides=tiny_overrides(runs, "distill", **{"algorithm.distill_teacher": str(tmp_path / "teacher")}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    batch, metrics = loop.train_step(rollout, learner, 1, learner.ctx)
    [adv] = seen
    assert adv.dim() == 2 and adv.abs().sum() > 0 and metrics["distill/reverse_kl"] != 0.0
    seen.clear()
    same = load_config(overrides=tiny_overrides(runs, "distill-same", **{"algorithm.distill_teacher": "builtin"}))
    rollout, learner, _ = loop.build_roles(same, DistContext(), resume=False)
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    assert seen[0].abs().max().item() < 1e-4 and abs(metrics["distill/reverse_kl"]) < 1e-4
