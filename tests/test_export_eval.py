"""`scalerl export` and `scalerl eval` on a real run of the built-in model."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli, tiny_overrides

from scalerl.rollout.evaluation import confidence_interval


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    runs = tmp_path_factory.mktemp("runs")
    train(load_config(overrides=tiny_overrides(runs, "r", **{"train.steps": 4, "checkpoint.every": 2, "optim.lr": 1e-3})))
    return runs / "r"


def test_export_writes_the_checkpoint_in_the_dtype_with_the_runs_eos(run, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "bf16"
    done = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(out), "--dtype", "bf16")
    assert done.returncode == 0, done.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    saved = load_file(run / "checkpoints" / "step_0000004" / "model.safetensors")
    assert all(torch.equal(p, saved[n].to(torch.bfloat16)) for n, p in model.state_dict().items() if n in saved)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id is not None
    assert json.loads((out / "scalerl_export.json").read_text())["step"] == 4
    again = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr and "\n" not in again.stderr.strip()


def test_export_skips_a_damaged_newest_checkpoint_without_moving_it(run, tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    weights = copy / "checkpoints" / "step_0000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    done = run_cli("-m", "scalerl.cli.main", "export", str(copy), "--out", str(tmp_path / "out"), "--dtype", "fp32")
    assert done.returncode == 0, done.stderr
    assert "step_0000004 is damaged" in done.stderr and "step_0000002" in done.stdout
    assert (copy / "checkpoints" / "step_0000004").is_dir()  # exporting only reads


def test_export_nf4_loads_as_4bit_linear_layers_close_to_the_checkpoint(run, tmp_path):
    pytest.importorskip("bitsandbytes", reason="--quantize nf4 needs bitsandbytes (pip install 'scalerl[compressed]')")
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "nf4"
    done = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(out), "--dtype", "fp32", "--quantize", "nf4",
                   env={"HF_HUB_OFFLINE": "1"})  # bitsandbytes' CPU backend looks for a hub kernel at import; nothing to fetch
    assert done.returncode == 0, done.stderr
    checkpoint = run / "checkpoints" / "step_0000004"
    # fp32 weights: 4.26 MB; NF4: 0.66 MB (4 bits per Linear weight, 8-bit absmax per 64, fp32 embeddings and head)
    assert (out / "model.safetensors").stat().st_size < 0.25 * (checkpoint / "model.safetensors").stat().st_size
    assert json.loads((out / "scalerl_export.json").read_text())["quantization"]["quant_type"] == "nf4"
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    config = model.config.quantization_config
    assert config.load_in_4bit and config.bnb_4bit_use_double_quant and config.bnb_4bit_compute_dtype == torch.float32
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert len(linears) == 4 * 7 and isinstance(model.lm_head, torch.nn.Linear) and "lm_head" not in linears
    for name, module in linears.items():  # the NF4 codes of these weights: relative error 0.090-0.095 measured
        state = module.weight.quant_state
        assert state.quant_type == "nf4" and state.nested and module.weight.dtype == torch.uint8
        weight = reference.get_submodule(name).weight.detach()
        assert 0.05 < float((F.dequantize_4bit(module.weight.data, state).float() - weight).norm() / weight.norm()) < 0.15
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id is not None
    batch = tokenizer(["12+7=", "3*4=", "45-19=", "8+8=", "99-3=", "6*7=", "20+22=", "7-9="], return_tensors="pt", padding=True)
    with torch.no_grad():
        logprobs = model(**batch).logits.float().log_softmax(-1)[batch.attention_mask.bool()]  # (N, V)
        expected = reference(**batch).logits.log_softmax(-1)[batch.attention_mask.bool()]  # (N, V)
    # measured: the top token agrees at all 46 positions, mean KL 0.012 nats (median 2e-5, one position 0.34: the same
    # top token at p 0.60 -> 0.90). At 128 wide a ~9 % error per weight moves such a small model's probabilities
    # visibly but rarely its choice; an unquantised fp32 export gives KL 0 exactly, so the lower bound sees a skip.
    kl = (expected.exp() * (expected - logprobs)).sum(-1).mean()
    assert (logprobs.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9 and 1e-5 < kl < 0.05


def test_export_quantize_errors_are_one_line(run, tmp_path, monkeypatch):
    import sys

    from scalerl.errors import ScaleRLError
    from scalerl.jobs.export import export_model

    bad = run_cli("-m", "scalerl.cli.main", "export", str(run), "--out", str(tmp_path / "q"), "--quantize", "int3")
    assert bad.returncode == 2 and "--quantize int3" in bad.stderr and "nf4" in bad.stderr and "\n" not in bad.stderr.strip()
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if it were not installed
    with pytest.raises(ScaleRLError, match=r"--quantize nf4 needs bitsandbytes: pip install 'scalerl\[compressed\]'") as err:
        export_model(run, tmp_path / "out", quantize="nf4")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_eval_of_a_run_gives_the_runs_own_last_pass_rate(run, tmp_path):
    out = tmp_path / "eval.json"
    done = run_cli("-m", "scalerl.cli.main", "eval", str(run), "--max-tasks", "16", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert result["pass_rate"] == pytest.approx(summary["pass_rate_after"]) and result["tasks"] == 16  # same greedy evaluation
    low, high = result["ci95"]
    assert low <= result["pass_rate"] <= high and result["interval"] == "wilson"
    bad = run_cli("-m", "scalerl.cli.main", "eval", str(run), "--samples", "4", "--temperature", "0")
    assert bad.returncode == 2 and "--temperature > 0" in bad.stderr


def test_confidence_intervals():
    # Wilson, 50 of 100: 0.5 ± 1.96·sqrt(0.25/100 + 1.96²/40000) / (1 + 1.96²/100)
    low, high = confidence_interval(torch.tensor([1.0] * 50 + [0.0] * 50, dtype=torch.float64), binary=True)
    assert (low, high) == pytest.approx((0.40383, 0.59617), abs=1e-5)
    # 0 of 20 still has an upper bound above 0
    assert confidence_interval(torch.zeros(20, dtype=torch.float64), binary=True)[1] == pytest.approx(0.16113, abs=1e-5)
    # normal over task means: mean 0.5, std 0.5345 (n = 8) → ± 1.96 · 0.5345 / sqrt(8)
    means = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.0, 1.0], dtype=torch.float64)
    assert confidence_interval(means, binary=False) == pytest.approx((0.5 - 1.96 * float(means.std()) / 8 ** 0.5,
                                                                       0.5 + 1.96 * float(means.std()) / 8 ** 0.5))
