"""Reward models: the Bradley–Terry loss by hand, preference files, encoding/scoring invariances,
a tiny training run whose saved folder reloads with plain transformers, and `scalerl train-rm`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import run_cli
from scalerl.errors import ScaleRLError
from scalerl.rewards.reward_model import (
    Preference, RewardModelScorer, bradley_terry_loss, encode_pairs, load_preferences, load_reward_model,
    pairwise_accuracy, save_reward_model, score_texts, sequence_scores, split_pairs, train_epoch, train_reward_model,
)
from scalerl.rewards.rm_config import load_rm_config, shipped_preferences


def _write_pairs(path, pairs):
    path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n" for p in pairs))
    return path


@pytest.fixture(scope="module")
def rm():
    """The built-in model with a fresh, seeded score head, in eval mode: (model, tokenizer)."""
    torch.manual_seed(0)
    model, tokenizer = load_reward_model("builtin")
    return model.eval(), tokenizer


# --- the loss -------------------------------------------------------------------------------------


def test_bradley_terry_loss_by_hand():
    chosen = torch.tensor([2.0, 0.0, 1.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 3.0], requires_grad=True)
    loss, stats = bradley_terry_loss(chosen, rejected)
    # Margins d = (2, 0, -2). -log σ(d) = log(1 + e^-d) = 0.126928, 0.693147, 2.126928;
    # mean = 2.947003 / 3 = 0.982334.
    assert loss.item() == pytest.approx(0.982334, abs=1e-6)
    assert loss.item() == pytest.approx(sum(math.log1p(math.exp(-d)) for d in (2, 0, -2)) / 3)
    # Only the first pair is strictly right (a tie counts as wrong): 1/3; mean margin (2 + 0 - 2) / 3 = 0.
    assert stats["accuracy"].item() == pytest.approx(1 / 3)
    assert stats["margin"].item() == pytest.approx(0.0)
    assert not stats["accuracy"].requires_grad
    loss.backward()
    # dL/dr_c = -(1/3)(1 - σ(d)) = -(1/3)(0.119203, 0.5, 0.880797) = (-0.039734, -0.166667, -0.293599):
    # descent raises every chosen score, most where the pair is most wrong; rejected gets the opposite.
    assert chosen.grad.tolist() == pytest.approx([-0.039734, -0.166667, -0.293599], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([0.039734, 0.166667, 0.293599], abs=1e-6)


def test_bradley_terry_loss_is_finite_for_huge_margins():
    # -log σ(-1000) = 1000 exactly in float32 with logsigmoid (a naive log(sigmoid) would give inf).
    loss, _ = bradley_terry_loss(torch.tensor([0.0]), torch.tensor([1000.0]))
    assert loss.item() == pytest.approx(1000.0)


# --- preference files -----------------------------------------------------------------------------


def test_load_preferences_reads_the_shipped_set():
    pairs = load_preferences(shipped_preferences())
    assert len(pairs) == 1500
    assert pairs[0] == Preference("70+82=", "152", "194")
    for p in pairs:  # chosen is the exact sum, rejected a wrong one in [0, 198]
        a, b = map(int, p.prompt.removesuffix("=").split("+"))
        assert int(p.chosen) == a + b != int(p.rejected) and 0 <= int(p.rejected) <= 198
    assert len({p.prompt for p in pairs}) == 1500  # one pair per prompt: no prompt is on both sides of a split


@pytest.mark.parametrize("content, needles", [
    ('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n\n{"prompt": "1+2=", "chosen": "3"\n', [":3:", "not valid JSON"]),
    ('{"prompt": "1+1=", "chosen": "2"}\n', [":1:", "'rejected' is missing"]),
    ('{"prompt": "1+1=", "chosen": 2, "rejected": "3"}\n', [":1:", "'chosen' is not a string"]),
    ('["1+1=", "2", "3"]\n', [":1:", "JSON object"]),
    ("\n\n", ["holds no rows"]),
])
def test_load_preferences_errors_name_file_and_line(tmp_path, content, needles):
    path = tmp_path / "prefs.jsonl"
    path.write_text(content)
    with pytest.raises(ScaleRLError) as err:
        load_preferences(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for needle in needles:
        assert needle in message, message


def test_load_preferences_missing_file(tmp_path):
    with pytest.raises(ScaleRLError, match="nope.jsonl does not exist"):
        load_preferences(tmp_path / "nope.jsonl")


def test_split_is_seeded_and_disjoint():
    pairs = [Preference(f"{i}+0=", str(i), str(i + 1)) for i in range(50)]
    train, held_out = split_pairs(pairs, 0.1, seed=3)
    assert len(held_out) == 5 and len(train) == 45 and not set(train) & set(held_out)  # ceil(0.1 * 50) = 5
    assert split_pairs(pairs, 0.1, seed=3) == (train, held_out)
    with pytest.raises(ScaleRLError, match="no training pairs"):
        split_pairs(pairs[:1], 0.5, seed=0)


# --- encoding and scoring -------------------------------------------------------------------------


def test_encode_pairs_appends_eos_and_pads_on_the_right(rm):
    _, tok = rm
    ids, mask = encode_pairs(tok, ["1+2=", "10+20="], ["3", "30"], max_length=64, finished=[True, False])
    # Character tokenizer: <s>=1, </s>=2, <pad>=0; digits 0-9 are ids 4-13, '+' 14, '=' 15.
    # Row 0: <s> 1 + 2 = 3 </s> (7 tokens) then 1 pad; row 1: <s> 1 0 + 2 0 = 3 0 (9 tokens, no EOS: unfinished).
    assert ids.tolist() == [[1, 5, 14, 6, 15, 7, 2, 0, 0], [1, 5, 4, 14, 6, 4, 15, 7, 4]]
    assert mask.tolist() == [[1] * 7 + [0] * 2, [1] * 9]
    # Too long: the last max_length tokens are kept (the completion and its EOS are what is judged).
    ids, mask = encode_pairs(tok, ["1+2="], ["3"], max_length=4)
    assert ids.tolist() == [[6, 15, 7, 2]]


def test_scores_do_not_depend_on_batching_or_padding(rm):
    model, tok = rm
    prompts = ["1+2=", "10+20=", "99+99=", "5+7="]
    completions = ["3", "30", "198", "13"]
    batched = score_texts(model, tok, prompts, completions, batch_size=4, max_length=64)  # (4,) padded to the longest
    one_by_one = torch.cat([score_texts(model, tok, [p], [c], batch_size=1, max_length=64) for p, c in zip(prompts, completions)])
    assert batched.shape == (4,) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=0)
    # Ten extra pad columns change nothing: the score is read at the last real token.
    ids, mask = encode_pairs(tok, prompts, completions, max_length=64)
    wide_ids = torch.cat([ids, torch.full((4, 10), tok.pad_token_id)], dim=1)
    wide_mask = torch.cat([mask, torch.zeros(4, 10, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(sequence_scores(model, wide_ids, wide_mask), batched, atol=1e-5, rtol=0)
    # The EOS is part of what is scored: an unfinished completion gets another score.
    unfinished = score_texts(model, tok, prompts[:1], completions[:1], batch_size=1, max_length=64, finished=[False])
    assert unfinished.item() != pytest.approx(batched[0].item())


def test_scorer_normalizations(tmp_path, rm):
    model, tok = rm
    save_reward_model(tmp_path / "rm", model, tok, {})
    prompts, completions = ["1+2=", "1+2=", "4+4="], ["3", "4", "8"]
    raw = RewardModelScorer(str(tmp_path / "rm"), batch_size=2).score(prompts, completions)
    torch.testing.assert_close(raw, score_texts(model, tok, prompts, completions, batch_size=3, max_length=64), atol=1e-5, rtol=0)
    torch.testing.assert_close(RewardModelScorer(str(tmp_path / "rm"), normalize="sigmoid").score(prompts, completions), torch.sigmoid(raw))
    whitened = RewardModelScorer(str(tmp_path / "rm"), normalize="batch").score(prompts, completions)
    # (r - mean) / (std + 1e-6) over the three scores: mean 0, same order as the raw scores.
    torch.testing.assert_close(whitened, (raw - raw.mean()) / (raw.std(unbiased=False) + 1e-6), atol=1e-3, rtol=1e-3)
    assert whitened.mean().item() == pytest.approx(0.0, abs=1e-4) and whitened.argsort().tolist() == raw.argsort().tolist()
    with pytest.raises(ValueError, match="normalization"):
        RewardModelScorer(str(tmp_path / "rm"), normalize="zscore")


# --- training -------------------------------------------------------------------------------------


def test_tiny_training_run_learns_and_its_folder_reloads_with_transformers(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    data = _write_pairs(tmp_path / "prefs.jsonl", load_preferences(shipped_preferences())[:400])
    config = load_rm_config(None, {"data": str(data), "out": str(tmp_path / "rm"), "epochs": 2, "batch_size": 16,
                                   "lr": 5e-4, "eval_fraction": 0.25, "threads": 1})
    summary = train_reward_model(config, log=lambda _: None)
    assert summary["train_pairs"] == 300 and summary["eval_pairs"] == 100
    assert summary["eval_accuracy_after"] >= summary["eval_accuracy_before"] + 0.05, summary
    assert json.loads((tmp_path / "rm" / "summary.json").read_text())["eval_accuracy_after"] == summary["eval_accuracy_after"]
    assert not (tmp_path / "rm.tmp").exists()
    # Plain transformers, one row at a time, no padding, EOS appended by hand: the same held-out accuracy.
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "rm")
    _, held_out = split_pairs(load_preferences(data), 0.25, seed=0)

    def hf_score(prompt, completion):
        ids = torch.tensor([tok(prompt + completion)["input_ids"] + [tok.eos_token_id]])
        with torch.no_grad():
            return model(input_ids=ids).logits[0, 0].item()

    right = sum(hf_score(p.prompt, p.chosen) > hf_score(p.prompt, p.rejected) for p in held_out)
    assert right / len(held_out) == summary["eval_accuracy_after"]
    # An existing non-empty folder is refused before any training, unless overwrite.
    with pytest.raises(ScaleRLError, match="--overwrite"):
        train_reward_model(config, log=lambda _: None)


def test_saved_model_scores_like_the_in_memory_model(tmp_path):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model, tok = load_reward_model("builtin")
    pairs = load_preferences(shipped_preferences())[:64]
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    stats = train_epoch(model, tok, opt, pairs, batch_size=16, max_length=64)
    assert set(stats) == {"loss", "accuracy", "margin"}
    model.eval()
    save_reward_model(tmp_path / "rm", model, tok, {"note": "test"})
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    prompts, completions = [p.prompt for p in pairs], [p.rejected for p in pairs]
    torch.testing.assert_close(score_texts(reloaded, tok, prompts, completions, batch_size=32, max_length=64),
                               score_texts(model, tok, prompts, completions, batch_size=32, max_length=64), atol=1e-5, rtol=0)
    assert pairwise_accuracy(reloaded, tok, pairs, batch_size=64, max_length=64) == pairwise_accuracy(model, tok, pairs, batch_size=64, max_length=64)


# --- config and CLI -------------------------------------------------------------------------------


def test_config_from_yaml_and_overrides(tmp_path):
    cfg = tmp_path / "rm.yaml"
    cfg.write_text("epochs: 3\nlr: 1.0e-4\n")
    config = load_rm_config(cfg, ["lr=2e-4", f"out={tmp_path / 'x'}"])
    assert config.epochs == 3 and config.lr == 2e-4 and config.out == tmp_path / "x"
    assert config.model == "builtin" and config.data == shipped_preferences()
    with pytest.raises(ScaleRLError, match="epoch: unknown key; allowed: model, data"):
        load_rm_config(None, ["epoch=3"])
    with pytest.raises(ScaleRLError, match="eval_fraction"):
        load_rm_config(None, ["eval_fraction=1"])


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    _one_line_error(run_cli("-m", "scalerl.cli.main", "train-rm", "--set", f"data={tmp_path / 'missing.jsonl'}", timeout=60),
                    "data", "missing.jsonl", "does not exist")
    _one_line_error(run_cli("-m", "scalerl.cli.main", "train-rm", "--set", "batch_size=0", timeout=60), "batch_size")


@pytest.mark.slow
def test_cli_train_rm_runs_and_refuses_to_overwrite(tmp_path):
    data = _write_pairs(tmp_path / "prefs.jsonl", load_preferences(shipped_preferences())[:100])
    out = tmp_path / "rm"
    args = ["-m", "scalerl.cli.main", "train-rm", "--set", f"data={data}", "--set", "epochs=1", "--set", "threads=1", "--out", str(out)]
    proc = run_cli(*args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout and (out / "config.json").is_file() and (out / "summary.json").is_file()
    _one_line_error(run_cli(*args, timeout=120), "exists", "--overwrite")
    assert run_cli(*args, "--overwrite", timeout=120).returncode == 0


def test_warmup_cosine_schedule_by_hand():
    from scalerl.rewards.reward_model import warmup_cosine

    f = warmup_cosine(20)  # warm-up W = ceil(0.1 * 20) = 2 steps, then cosine over the remaining 18
    # steps 0, 1: 1/2, 2/2; step 2: cos(0) -> 1; step 11: 0.5 (1 + cos(π 9/18)) = 0.5; step 20: 0.5 (1 + cos π) = 0.
    assert [f(0), f(1), f(2), f(11), f(20)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
