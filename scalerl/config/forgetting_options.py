"""Self-distillation against forgetting, as a mixin of `forgetting` in schema.py (which is at its size limit)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SelfDistillOptions(BaseModel):
    """forgetting.self_distill and its keys (scalerl/algorithms/forgetting.py: self_distill_loss)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # as schema.py's _Section

    self_distill: bool = Field(False, description="Self-distillation against forgetting (an alternative to EWC): a frozen copy of the starting "
                                                  "policy is the teacher on the anchor prompts of forgetting.data (their responses are not used): "
                                                  "every optimizer update samples completions of a few anchor prompts from the policy and adds "
                                                  "self_distill_weight x the per-token reverse KL to the teacher on them (logged as "
                                                  "self_distill/reverse_kl). Costs a second copy of the weights. Needs data.")
    self_distill_fraction: float = Field(0.05, gt=0, lt=1, description="self_distill: anchor prompts sampled per optimizer update, as a fraction "
                                                                       "of the mini-batch's completions (at least 1).")
    self_distill_weight: float = Field(1.0, gt=0, description="self_distill: weight of the reverse KL beside the RL loss.")

    @model_validator(mode="after")
    def _self_distill_needs_data(self) -> "SelfDistillOptions":
        if self.self_distill and getattr(self, "data", None) is None:
            raise ValueError("self_distill needs data (the earlier task's rows whose prompts the starting policy is the teacher on)")
        return self
