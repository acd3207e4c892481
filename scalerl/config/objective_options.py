"""The objective options added with the newer policy losses (scalerl/algorithms/policy_losses.py)
and entropy control, as mixins of the algorithm sections in schema.py: `PolicyLossOptions` for the
clipped objectives (grpo, rloo, reinforce_pp, ppo), `EntropyOptions` for every objective."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # as schema.py's _Section


class PolicyLossOptions(_Options):
    """algorithm.policy_loss and its own keys."""

    policy_loss: Literal["clip", "sapo", "vespo", "gmpo", "clip_cov", "kl_cov"] = Field(
        "clip", description="clip: PPO's clipped surrogate; sapo: soft temperature gate (TRL/verl sapo); vespo: gamma-weighted sequence ratio (TRL vespo); "
                            "gmpo: geometric-mean ratio clipped in log space (verl geo_mean; clips are in log space, the paper uses 0.4); clip_cov / kl_cov: "
                            "the clip surrogate without / the unclipped one with a penalty on the highest-covariance tokens (verl clip_cov, kl_cov).")
    sapo_tau_pos: float = Field(1.0, gt=0, description="sapo: gate temperature for positive advantages.")
    sapo_tau_neg: float = Field(1.05, gt=0, description="sapo: gate temperature for negative advantages (larger damps them sooner).")
    vespo_k_pos: float = Field(2.0, ge=0, description="vespo: shape k of the gamma weight for non-negative advantages.")
    vespo_lambda_pos: float = Field(3.0, gt=0, description="vespo: rate lambda of the gamma weight for non-negative advantages.")
    vespo_k_neg: float = Field(3.0, ge=0, description="vespo: shape k for negative advantages.")
    vespo_lambda_neg: float = Field(2.0, gt=0, description="vespo: rate lambda for negative advantages.")
    cov_ratio: float = Field(2e-4, gt=0, le=1, description="clip_cov / kl_cov: share of trained tokens treated (at least one).")
    clip_cov_low: float = Field(1.0, description="clip_cov: a token is a candidate when its covariance is above this ...")
    clip_cov_high: float = Field(5.0, description="clip_cov: ... and below this.")
    kl_cov_coef: float = Field(1.0, ge=0, description="kl_cov: weight of |log ratio| on the selected tokens.")

    @property
    def policy_params(self) -> dict[str, float]:
        """The chosen policy loss's own keywords for rl_objective's `policy_params`."""
        return {"sapo": dict(tau_pos=self.sapo_tau_pos, tau_neg=self.sapo_tau_neg),
                "vespo": dict(k_pos=self.vespo_k_pos, lambda_pos=self.vespo_lambda_pos, k_neg=self.vespo_k_neg, lambda_neg=self.vespo_lambda_neg),
                "clip_cov": dict(ratio=self.cov_ratio, cov_low=self.clip_cov_low, cov_high=self.clip_cov_high),
                "kl_cov": dict(ratio=self.cov_ratio, kl_coef=self.kl_cov_coef)}.get(self.policy_loss, {})

    @model_validator(mode="after")
    def _check_policy_loss(self) -> "PolicyLossOptions":
        if getattr(self, "delta", None) is not None and self.policy_loss not in ("clip", "clip_cov"):
            raise ValueError(f"algorithm.delta with algorithm.policy_loss={self.policy_loss}: delta caps the clip surrogate; use policy_loss clip or clip_cov, or delta=null")
        if getattr(self, "importance_level", "token") == "sequence" and self.policy_loss in ("vespo", "gmpo", "clip_cov", "kl_cov"):
            raise ValueError(f"algorithm.importance_level=sequence with algorithm.policy_loss={self.policy_loss}: it builds its own ratio; use importance_level=token")
        if self.clip_cov_low >= self.clip_cov_high:
            raise ValueError(f"algorithm.clip_cov_low ({self.clip_cov_low}) must be below algorithm.clip_cov_high ({self.clip_cov_high})")
        return self


class EntropyOptions(_Options):
    """Which tokens the policy term trains on, by entropy, and the entropy bonus's controller."""

    top_entropy_quantile: float = Field(1.0, gt=0, le=1, description="Train the policy term only on this share of each micro-batch's trained tokens, those "
                                                                     "of highest entropy (TRL's top_entropy_quantile, 'Beyond the 80/20 rule': 0.2); 1 keeps all.")
    entropy_target: float | None = Field(None, gt=0, description="Adaptive entropy bonus toward this mean per-token entropy (TRL's entropy_target): after "
                                                                "each update the coefficient rises by entropy_coef_step while the entropy is at or below "
                                                                "the target, falls otherwise, and is applied only while at or below it; entropy_coef is its start.")
    entropy_coef_step: float = Field(0.005, gt=0, description="entropy_target: change of the coefficient per update (TRL's entropy_coef_delta).")
    entropy_coef_max: float = Field(1.0, gt=0, description="entropy_target: largest coefficient (it never falls below 0).")


class RolloutCorrectionOptions(_Options):
    """Named rollout-correction presets (scalerl/algorithms/rollout_correction.py, after verl's rollout_corr)."""

    rollout_correction: Literal["token_tis", "seq_tis", "icepop", "seq_mis", "geo_mis", "k3_mis", "geo_mis_token_tis", "geo_mis_seq_tis",
                                "seq_mis_seq_tis"] | None = Field(
        None, description="Correction for tokens sampled by another policy (engine, stale copy), against its log-probs: *_tis: truncated IS weights "
                          "pi_old/pi_sampler per token or per completion, capped at rollout_is_cap; icepop: drop tokens whose ratio leaves "
                          "[rollout_rs_low, rollout_rs_high]; seq_mis / geo_mis: drop completions whose ratio / geometric-mean ratio leaves it; k3_mis: "
                          "drop completions whose mean k3 drift exceeds rollout_rs_high; combinations as named. Metrics rollout_corr/*. null: none.")
    rollout_is_cap: float = Field(2.0, gt=0, description="rollout_correction *_tis: cap C of the importance weights.")
    rollout_rs_low: float = Field(0.5, gt=0, description="rollout_correction masks: lower end of the kept ratio band.")
    rollout_rs_high: float = Field(2.0, gt=0, description="rollout_correction masks: upper end of the band (k3_mis: largest mean k3).")

    @model_validator(mode="after")
    def _check_rollout_correction(self) -> "RolloutCorrectionOptions":
        if self.rollout_correction is not None and getattr(self, "tis_cap", None) is not None:
            raise ValueError(f"algorithm.rollout_correction={self.rollout_correction} with algorithm.tis_cap: both weight by pi_old/pi_sampler; "
                             "use one (rollout_correction=token_tis is tis_cap's weights)")
        if self.rollout_correction is not None and getattr(self, "policy_loss", "clip") == "vespo":
            raise ValueError("algorithm.rollout_correction with algorithm.policy_loss=vespo: vespo puts the sampler correction into its own "
                             "weight; use tis_cap")
        if self.rollout_rs_low >= self.rollout_rs_high:
            raise ValueError(f"algorithm.rollout_rs_low ({self.rollout_rs_low}) must be below algorithm.rollout_rs_high ({self.rollout_rs_high})")
        return self


class DistillOptions(_Options):
    """On-policy distillation (scalerl/algorithms/advantages.py: distillation_advantages)."""

    distill_teacher: str | None = Field(None, description="On-policy distillation: a teacher causal LM (a local folder with the student's tokenizer, or "
                                                          "'builtin') whose per-token log-probs on the student's own samples give the advantage "
                                                          "distill_coef x (log pi_teacher - log pi_student), plus distill_task_coef x the task advantage.")
    distill_coef: float = Field(1.0, gt=0, description="distill_teacher: weight of the per-token reverse-KL advantage.")
    distill_task_coef: float = Field(0.0, ge=0, description="distill_teacher: weight of the task reward's advantage mixed in (0: pure distillation).")
    distill_teacher_placement: Literal["learner", "rollout"] = Field(
        "learner", description="distill_teacher: where the teacher runs. learner: the learner holds a frozen copy and scores each batch; "
                               "rollout: the rollout side (the in-process worker, or the async producer process) scores its samples and "
                               "ships the teacher's log-probs in the batch, so the learner holds no teacher.")

    @model_validator(mode="after")
    def _check_distill(self) -> "DistillOptions":
        if self.distill_teacher_placement != "learner" and self.distill_teacher is None:
            raise ValueError(f"algorithm.distill_teacher_placement={self.distill_teacher_placement} without algorithm.distill_teacher: "
                             "name the teacher, or leave the placement at learner")
        return self
