"""scalerl.trl: TRL's GRPO quick start runs on ScaleRL by changing its imports; what does not map is refused."""

from __future__ import annotations

import json

import pytest

from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir
from scalerl.trl import GRPOConfig, GRPOTrainer, scalerl_overrides


def test_trls_quick_start_runs_five_steps_with_its_imports_changed(tmp_path):
    """TRL's documented quick start ("GRPO Trainer"), with `from scalerl.trl import ...`, a local model folder, a
    local dataset, and a batch small enough for a CPU test (TRL's defaults sample 8 x 256 tokens per prompt)."""
    from datasets import Dataset

    from scalerl.trl import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": f"spell {w}"} for w in "one two three four five six seven eight".split()])

    def reward_num_unique_chars(completions, **kwargs):
        return [len(set(c)) for c in completions]

    training_args = GRPOConfig(output_dir=str(tmp_path / "Qwen2-0.5B-GRPO"), max_steps=5, per_device_train_batch_size=8,
                               num_generations=4, max_completion_length=8, bf16=False)
    trainer = GRPOTrainer(model=str(builtin_model_dir()), reward_funcs=reward_num_unique_chars, args=training_args,
                          train_dataset=dataset)
    summary = trainer.train()

    assert summary["steps"] == 5
    config = trainer.trainer.config
    assert (config.rollout.prompts_per_step, config.rollout.group_size, config.rollout.max_new_tokens) == (2, 4, 8)
    assert (config.optim.lr, config.algorithm.kl.beta, config.model.gradient_checkpointing) == (1e-6, 0.0, True)  # TRL's defaults
    assert config.log.run_dir / config.log.name == tmp_path / "Qwen2-0.5B-GRPO"
    metrics = [json.loads(line) for line in (tmp_path / "Qwen2-0.5B-GRPO" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/reward_num_unique_chars_mean" in m]
    assert len(steps) == 5
    assert all(m["reward/reward_num_unique_chars_failures"] == 0 for m in steps)
    assert all(m["reward/reward_num_unique_chars_mean"] > 0 for m in steps)  # the function scored real completions
    assert trainer.evaluate()["eval_reward"] > 0
    saved = trainer.save_model()
    assert (saved / "config.json").is_file() and saved == tmp_path / "Qwen2-0.5B-GRPO" / "model"


def test_an_unmappable_field_is_refused_in_one_line_naming_it():
    for kwargs, needle in [({"min_p": 0.1}, "GRPOConfig.min_p=0.1: ScaleRL has no equivalent"),
                           ({"dataloader_prefetch_factor": 4}, "GRPOConfig.dataloader_prefetch_factor: ScaleRL does not know"),
                           ({"max_prompt_length": 128}, "GRPOConfig.max_prompt_length=128"),
                           ({"tf32": True}, "GRPOConfig.tf32=True: ScaleRL has no equivalent")]:  # fp32 stays full precision
        with pytest.raises(ScaleRLError) as err:
            GRPOConfig(output_dir="out", **kwargs)
        assert needle in str(err.value) and "\n" not in str(err.value)
    for kwargs, needle in [({"loss_type": "sapo"}, "GRPOConfig.loss_type='sapo'"),
                           ({"use_vllm": True}, ("GRPOConfig.vllm_mode='server': with use_vllm=True, ScaleRL runs vLLM inside the "
                                                 "trainer, not as a server: set vllm_mode='colocate'")),
                           ({"save_strategy": "epoch"}, "GRPOConfig.save_strategy='epoch'"),
                           ({"report_to": "comet_ml"}, "GRPOConfig.report_to='comet_ml'"),
                           ({"per_device_train_batch_size": 6}, "not a multiple of num_generations=8")]:
        with pytest.raises(ScaleRLError) as err:
            scalerl_overrides(GRPOConfig(output_dir="out", **kwargs), rows=16)
        assert needle in str(err.value) and "\n" not in str(err.value)
    # the default of an unmapped field is accepted (it asks for nothing ScaleRL does not do)
    GRPOConfig(output_dir="out", min_p=None, repetition_penalty=1.0, max_prompt_length=512)
    GRPOConfig(output_dir="out", optim="adamw_torch_fused", tf32=False)  # what ScaleRL does anyway: fused AdamW, no TF32


def test_trainer_arguments_trl_has_and_scalerl_does_not_are_refused(tmp_path):
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    with pytest.raises(ScaleRLError, match=r"GRPOTrainer\(callbacks=...\)"):
        GRPOTrainer(model="builtin", reward_funcs=len, args=GRPOConfig(output_dir=str(tmp_path / "o")), train_dataset=rows, callbacks=[1])
    with pytest.raises(ScaleRLError, match=r"reward_funcs\[0\]='some/reward-model'"):
        GRPOTrainer(model="builtin", reward_funcs="some/reward-model", args=GRPOConfig(output_dir=str(tmp_path / "o")), train_dataset=rows)


def test_batch_sizes_and_steps_follow_trls_arithmetic():
    # 4 completions per micro-batch, 2 micro-batches per optimizer step, 4 micro-batches per sampling: 16 completions
    # = 4 prompts x 4 generations per sampling step, 16 / 8 = 2 optimizer steps each, so max_steps=10 is 5 sampling steps
    keys = scalerl_overrides(GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                                        num_generations=4, max_steps=10, warmup_ratio=0.1), rows=100)
    assert (keys["rollout.prompts_per_step"], keys["train.micro_batch_size"], keys["train.mini_batch_size"]) == (4, 4, 8)
    assert keys["train.steps"] == 5 and keys["optim.warmup_steps"] == 1  # 10 % of 10 optimizer steps
    # epochs: 8 x 1 / 8 = 1 prompt per step; 3 epochs of 10 prompts = 30 steps
    assert scalerl_overrides(GRPOConfig(), rows=10)["train.steps"] == 30


def test_the_loss_and_clipping_fields_map_to_scalerls_objective():
    keys = scalerl_overrides(GRPOConfig(loss_type="dr_grpo", epsilon=0.1, epsilon_high=0.28, scale_rewards=False, beta=0.04,
                                        importance_sampling_level="sequence", mask_truncated_completions=True), rows=16)
    assert (keys["algorithm.loss_agg"], keys["algorithm.clip_eps_low"], keys["algorithm.clip_eps_high"]) == ("constant", 0.1, 0.28)
    assert (keys["algorithm.scale_rewards"], keys["algorithm.kl.beta"], keys["algorithm.importance_level"]) == ("none", 0.04, "sequence")
    assert keys["algorithm.mask_truncated_completions"] is True
    cispo = scalerl_overrides(GRPOConfig(loss_type="cispo", epsilon_high=5.0), rows=16)
    assert (cispo["algorithm.name"], cispo["algorithm.eps_max"]) == ("cispo", 5.0)
    assert scalerl_overrides(GRPOConfig(bf16=True), rows=16)["precision.mode"] == "standard"
    assert scalerl_overrides(GRPOConfig(bf16=False), rows=16)["precision.mode"] == "fp32"


def test_a_reward_function_is_called_by_keyword_as_trl_calls_it():
    """TRL calls f(prompts=..., completions=..., **columns): a function that names only `completions` works, in process
    (the Python API) and in a worker process (`function: module:function`), which both go through call_function."""
    from scalerl.rewards.safe_call import call_function

    def reward_num_unique_chars(completions, **kwargs):
        return [len(set(c)) for c in completions]

    assert call_function(reward_num_unique_chars, "f", ["p", "q"], ["aab", "x"], {"col": [1, 2]}, 1.0) == [2.0, 1.0]
