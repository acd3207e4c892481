"""LoRA through peft (`model.lora`): what trains, the reference without a copy, checkpoints of adapters, the estimate."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.models.loading import load_model
from scalerl.models.paths import resolve_model_path
from scalerl.predict.memory import ModelShape, estimate_memory, lora_tensors, shape_of_model_path
from scalerl.trainer import loop

pytest.importorskip("peft", reason="model.lora needs the peft library (pip install 'scalerl[lora]')")

LORA = {"model.lora.r": 4, "optim.lr": 1e-3, "algorithm.kl.beta": 0.05}


def _roles(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **{**LORA, **extra}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    return config, rollout, learner


def _logprobs(forward, batch):
    with torch.no_grad():
        return forward(batch).logprobs


def test_only_adapters_train_and_the_reference_is_the_base_with_adapters_off(runs):
    config, rollout, learner = _roles(runs, "lora-ref")
    trainable = [n for n, p in learner.policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear on the built-in model: 7 linear layers x 4 decoder layers, an A and a B each
    assert len(trainable) == 2 * 7 * 4 == len(learner.optimizer.param_groups[0]["params"])
    assert learner.reference is None  # no second copy of the weights

    from scalerl.models.logprobs import CompletionModel

    base = CompletionModel(load_model(config.model, torch.device("cpu")).eval())
    batch = rollout.produce(1).rollout
    # B starts at 0: policy, reference and the base give the same log-probs before any update
    assert torch.allclose(_logprobs(learner.policy_forward, batch), _logprobs(base, batch), atol=1e-6)
    for step in (1, 2, 3):
        learner.learn(rollout.produce(step), step)
    moved = _logprobs(learner.policy_forward, batch)
    reference = _logprobs(learner.reference_forward, batch)
    assert torch.allclose(reference, _logprobs(base, batch), atol=1e-6)  # the adapters are off: still the base
    assert (moved - reference).abs().max() > 1e-3  # while the policy (adapters on) has learned
    assert torch.is_grad_enabled()


def test_a_lora_checkpoint_holds_the_adapters_and_loads_with_from_pretrained(runs):
    from transformers import AutoModelForCausalLM

    from scalerl.models.logprobs import CompletionModel

    loop.train(load_config(overrides=tiny_overrides(runs, "lora-ckpt", **{**LORA, "train.steps": 3, "checkpoint.every": 3})))
    folder = runs / "lora-ckpt" / "checkpoints" / "step_0000003"
    assert not (folder / "model.safetensors").exists() and (folder / "adapter_model.safetensors").is_file()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    # the base is not in the checkpoint: its DCP shards and export hold the adapters (~ 1/10 of the model here)
    stored = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    full = shape_of_model_path("builtin").params * 4
    assert stored < full / 2, (stored, full)
    # transformers (with peft) loads base + adapters from the checkpoint folder; an adapter B moved off 0
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert any(n.endswith("lora_B.default.weight") and p.abs().max() > 0 for n, p in model.named_parameters())
    assert isinstance(CompletionModel(model), CompletionModel)


def test_export_merges_the_adapters_or_writes_the_adapter_folder(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    loop.train(load_config(overrides=tiny_overrides(runs, "lora-export", **{**LORA, "train.steps": 3, "checkpoint.every": 3})))
    run = runs / "lora-export"
    ids = torch.tensor([[5, 9, 12, 7, 3, 20]])
    with torch.no_grad():
        trained = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_0000003").eval()(ids).logits  # base + adapters
        merged_out, adapters_out = tmp_path / "merged", tmp_path / "adapters"
        for out, extra in ((merged_out, ["--merge-lora"]), (adapters_out, [])):
            done = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(out), "--dtype", "fp32", *extra)
            assert done.returncode == 0, done.stderr
        merged = AutoModelForCausalLM.from_pretrained(merged_out).eval()
        assert not any("lora" in n for n, _ in merged.named_parameters())  # a plain model: W + (alpha/r) B A
        assert torch.allclose(merged(ids).logits, trained, atol=1e-5)
        assert (adapters_out / "adapter_model.safetensors").is_file() and not (adapters_out / "model.safetensors").exists()
        assert torch.allclose(AutoModelForCausalLM.from_pretrained(adapters_out).eval()(ids).logits, trained, atol=1e-6)
        base = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin")).eval()
        assert (base(ids).logits - trained).abs().max() > 1e-4  # the adapters did move the policy
    full = runs / "full"
    loop.train(load_config(overrides=tiny_overrides(runs, "full", **{"train.steps": 2, "checkpoint.every": 2})))
    done = run_cli("-m", "scalerl.cli.main", "export", str(full), "--out", str(tmp_path / "x"), "--merge-lora")
    assert done.returncode == 2 and "holds no LoRA adapters" in done.stderr and "\n" not in done.stderr.strip()


def test_the_estimate_of_a_lora_run_matches_the_learner_and_the_hand_count(runs):
    s = ModelShape(vocab=10, hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4)
    # r = 2 on q_proj (8 x 8): A 2x8 + B 8x2 = 32; on v_proj (4 x 8): A 2x8 + B 4x2 = 24; 56 per layer, 112 in all
    assert sum(math.prod(t) for t in lora_tensors(s, 2, ["q_proj", "v_proj"])) == 112
    m = estimate_memory(s, micro_batch=1, prompt_len=1, completion_len=1, rollout_sequences=1, reference=True, lora=(2, ["q_proj", "v_proj"]))
    assert m["weights"] == m["gradients"] == 112 * 4 and m["optimizer"] == 112 * 8
    assert m["frozen_base"] == 1352 * 4 and m["reference"] == 0  # the base is the reference
    with pytest.raises(Exception, match="target_modules"):
        lora_tensors(s, 2, ["attn"])

    _config, _rollout, learner = _roles(runs, "lora-estimate")
    measured = learner.component_bytes(expected=True)
    est = estimate_memory(shape_of_model_path("builtin"), micro_batch=1, prompt_len=1, completion_len=1, rollout_sequences=1,
                          reference=True, lora=(4, "all-linear"))
    for key in ("weights", "gradients", "optimizer", "reference"):
        assert measured[key] == est[key], key
    frozen = sum(p.numel() * p.element_size() for p in learner.policy.parameters() if not p.requires_grad)
    assert frozen == est["frozen_base"]

    # the non-finite response's restore point copies the adapters and their moments, not the frozen base
    with_point = estimate_memory(shape_of_model_path("builtin"), micro_batch=1, prompt_len=1, completion_len=1, rollout_sequences=1,
                                 reference=True, lora=(4, "all-linear"), restore_point=True)
    assert with_point["restore_point"] == with_point["host"] == est["weights"] + est["optimizer"] == learner.restore_point_bytes()
    learner.learn(_rollout.produce(1), 1)
    learner.restore_point(1)
    snap = learner.kept_snapshot
    assert set(snap.policy) == {n for n, p in learner.policy.named_parameters() if p.requires_grad}
    moments = sum(t.numel() * t.element_size() for s in snap.optimizer["state"].values() for k, t in s.items() if k != "step")
    assert sum(t.numel() * t.element_size() for t in snap.policy.values()) + moments == with_point["restore_point"]
    kept = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    learner.learn(_rollout.produce(2), 2)
    learner.restore(snap)
    assert all(torch.equal(kept[n], p) for n, p in learner.policy.named_parameters())


def test_lora_config_errors_are_one_line():
    from scalerl.errors import ScaleRLError

    with pytest.raises(ScaleRLError, match="model.lora with parallel.strategy=fsdp2"):
        load_config(overrides={"model.lora.r": 4, "parallel.strategy": "fsdp2"})
    with pytest.raises(ScaleRLError, match="model.lora.r"):
        load_config(overrides={"model.lora.r": -1})


@pytest.mark.slow
def test_lora_training_raises_the_pass_rate(runs):
    """60 steps of LoRA r=8 on the built-in model through the CLI (measured here: held-out 0.325 -> 0.500)."""
    proc = run_cli("-m", "scalerl.cli.main", "train", "--steps", "60", "--name", "lora-learn", "--set", f"log.run_dir={runs}",
                   "--set", "rollout.prompts_per_step=8", "--set", "eval.every=30", "--set", "model.lora.r=8",
                   "--set", "optim.lr=1e-3", "--set", "log.console=none")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((runs / "lora-learn" / "summary.json").read_text())
    assert summary["pass_rate_after"] > summary["pass_rate_before"] + 0.1, summary


def test_a_lora_runs_adapters_evaluate_as_base_plus_adapters_and_refuse_to_start_training(runs, tmp_path):
    """A LoRA run's checkpoint and its export without --merge-lora are peft adapter folders (no config.json):
    `Trainer.evaluate()` and `scalerl eval` load them as the base with the adapters merged (the same numbers as
    from_pretrained's base + adapters, the same pass rate as the --merge-lora export); as a training run's model.path
    such a folder is refused in one line that names its base."""
    from transformers import AutoModelForCausalLM

    from scalerl import Trainer
    from scalerl.config import ModelConfig

    trainer = Trainer(config=tiny_overrides(runs, "lora-eval", **{**LORA, "train.steps": 3, "checkpoint.every": 3}))
    trainer.train()
    checkpoint = trainer.checkpoint()
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "config.json").exists()
    ids = torch.tensor([[5, 9, 12, 7, 3, 20]])
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(checkpoint).eval()(ids).logits  # peft: base + adapters
        loaded = load_model(ModelConfig(path=str(checkpoint)), torch.device("cpu")).eval()
        assert not any("lora" in n for n, _ in loaded.named_parameters())  # merged: a plain model
        torch.testing.assert_close(loaded(ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert trainer.evaluate(max_tasks=16) == trainer.summary["pass_rate_after"]  # the run's own final evaluation
    scores = {}
    for name, extra in (("adapters", []), ("merged", ["--merge-lora"])):
        assert run_cli("-m", "scalerl.cli.main", "export", str(trainer.run_dir), "--out", str(tmp_path / name), "--dtype", "fp32",
                       *extra).returncode == 0
        done = run_cli("-m", "scalerl.cli.main", "eval", str(tmp_path / name), "--max-tasks", "16", "--json", str(tmp_path / f"{name}.json"))
        assert done.returncode == 0, done.stderr
        scores[name] = json.loads((tmp_path / f"{name}.json").read_text())["pass_rate"]
    assert scores["adapters"] == scores["merged"]
    done = run_cli("-m", "scalerl.cli.main", "train", "--set", f"model.path={tmp_path / 'adapters'}", "--dry-run")
    assert done.returncode == 2 and "is a LoRA adapter folder (peft's adapter_config.json; its base model: " in done.stderr
    assert "give the base" in done.stderr and "\n" not in done.stderr.strip()


def test_importing_peft_asks_the_hub_for_no_kernel():
    """Importing peft imports bitsandbytes, whose CPU backend (on a CPU with AVX512-BF16) fetches a kernel from the Hub
    through kernels.get_kernel at import, and warns where it cannot: ScaleRL's import refuses the fetch, quietly. In a
    fresh interpreter, where bitsandbytes is not imported yet; the fake records any call that gets through."""
    pytest.importorskip("kernels")
    code = ("import kernels, sys\ncalls = []\n"
            "def fake(*args, **kwargs):\n    calls.append(args)\n    raise RuntimeError('fake hub')\n"
            "kernels.get_kernel = fake\n"
            "assert 'bitsandbytes' not in sys.modules\n"
            "from scalerl.models.lora import import_peft\nimport_peft()\n"
            "print('calls', len(calls), 'restored', kernels.get_kernel is fake)\n")
    done = run_cli("-c", code, process=True)
    assert done.returncode == 0, done.stderr
    assert "calls 0 restored True" in done.stdout and "kernels-community" not in done.stderr, (done.stdout, done.stderr)
