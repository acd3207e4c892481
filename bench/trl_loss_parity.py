"""rl_objective against TRL 1.16's own GRPOTrainer._compute_loss, on the same fixed tensors.

TRL's loss is a method of a 3,400-line trainer, so this script does not build one: it makes the
object with `object.__new__(GRPOTrainer)`, sets only the attributes `_compute_loss` reads, and
stubs `_get_per_token_logps_and_entropies` to return fixed log-probs and entropies (leaves with
grad), so no model runs and TRL's real loss code does. For each TRL configuration it prints
TRL's loss, ours, and the largest difference in the gradients with respect to the log-probs
and the entropies.

    .bench/trl-venv/bin/python bench/trl_loss_parity.py [--save]

Mapping: TRL loss_type grpo = our loss_agg "sequence"; bnpo = "token"; dr_grpo = "constant" with
max_new_tokens = max_completion_length; dapo/cispo (normalised by num_items_in_batch) = "token"
with normalizer = num_items_in_batch; TRL's cispo cap epsilon_high = our eps_max; TRL's
vllm_importance_sampling_mode="token_truncate" with clip_max C = our tis_cap. TRL builds the
importance_sampling_ratio tensor while generating, not in _compute_loss: the script builds it
with TRL's formula, exp((old − sampler)·mask) clamped to [clip_min, clip_max].
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trl import GRPOTrainer  # noqa: E402  (the TRL venv's own)

from scalerl.algorithms.objective import ObjectiveInputs, rl_objective  # noqa: E402

B, T = 6, 7


class _Accelerator:
    """What _compute_loss asks of accelerate on one process."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def fixed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1, 0, 6])  # uneven, one completion with no trained token
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    logps = -torch.rand(B, T, generator=g) * 3  # (B, T)
    return {
        "mask": mask,
        "logps": logps,
        "old": logps + 0.4 * torch.randn(B, T, generator=g),  # ratios well away from 1: clipping happens
        "sampler": logps + 0.4 * torch.randn(B, T, generator=g) + 0.1,
        "ref": logps + 0.3 * torch.randn(B, T, generator=g),
        "entropy": torch.rand(B, T, generator=g) * 2,
        "adv": torch.tensor([1.0, -0.7, 0.4, -1.3, 0.9, -0.2]),  # (B,)
    }


def trl_trainer(cfg: dict, logps: torch.Tensor, entropy: torch.Tensor) -> GRPOTrainer:
    t = object.__new__(GRPOTrainer)
    args = SimpleNamespace(delta=cfg.get("delta"), use_bias_correction_kl=cfg.get("use_bias_correction_kl", False),
                           steps_per_generation=cfg.get("accumulation", 1), entropy_target=0.0,
                           sapo_temperature_pos=cfg.get("sapo_temperature_pos", 1.0),
                           sapo_temperature_neg=cfg.get("sapo_temperature_neg", 1.05),
                           vespo_k_pos=cfg.get("vespo_k_pos", 2.0), vespo_lambda_pos=cfg.get("vespo_lambda_pos", 3.0),
                           vespo_k_neg=cfg.get("vespo_k_neg", 3.0), vespo_lambda_neg=cfg.get("vespo_lambda_neg", 2.0))
    eps = cfg.get("epsilon", 0.2)
    t.__dict__.update(
        args=args, loss_type=cfg["loss_type"], beta=cfg.get("beta", 0.0), epsilon_low=eps,
        epsilon_high=cfg.get("epsilon_high", eps),
        importance_sampling_level=cfg.get("importance_sampling_level", "token"),
        off_policy_mask_threshold=cfg.get("off_policy_mask_threshold"),
        top_entropy_quantile=cfg.get("top_entropy_quantile", 1.0),
        aux_loss_enabled=False, use_vllm=cfg.get("tis_cap") is not None,
        vllm_importance_sampling_correction=cfg.get("tis_cap") is not None, max_completion_length=T,
        entropy_coef=cfg.get("entropy_coef", 0.0), use_adaptive_entropy=False,
        _entropy_bonus_enabled=cfg.get("entropy_coef", 0.0) != 0.0,
        current_gradient_accumulation_steps=cfg.get("accumulation", 1),
        model=SimpleNamespace(training=True), accelerator=_Accelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropy, None)
    t.vllm_importance_sampling_mode = "token_truncate"
    return t


def trl_loss(cfg: dict, d: dict, num_items=None) -> tuple[float, torch.Tensor, torch.Tensor]:
    logps, entropy = d["logps"].clone().requires_grad_(True), d["entropy"].clone().requires_grad_(True)
    b = len(d["mask"])
    inputs = {
        "prompt_ids": torch.zeros(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
        "completion_ids": torch.zeros(b, T, dtype=torch.long), "completion_mask": d["mask"],
        "advantages": d["adv"], "old_per_token_logps": d["old"], "ref_per_token_logps": d["ref"],
        "num_items_in_batch": d["mask"].sum() if num_items is None else num_items,
    }
    if cfg.get("with_sampler"):
        inputs["sampling_per_token_logps"] = d["sampler"]
    if cfg.get("tis_cap") is not None:  # TRL's generation-side token_truncate ratio (clip_min None)
        diff = torch.nan_to_num((d["old"] - d["sampler"]) * d["mask"], nan=0.0)
        inputs["importance_sampling_ratio"] = torch.clamp(torch.exp(diff), min=None, max=cfg["tis_cap"])
    loss = trl_trainer(cfg, logps, entropy)._compute_loss(None, inputs)
    loss.backward()
    return loss.item(), logps.grad, entropy.grad


def our_loss(kw: dict, d: dict) -> tuple[float, torch.Tensor, torch.Tensor]:
    logps, entropy = d["logps"].clone().requires_grad_(True), d["entropy"].clone().requires_grad_(True)
    with_sampler = kw.pop("with_sampler", False)
    inputs = ObjectiveInputs(logps, d["old"], d["adv"], d["mask"], ref_logprobs=d["ref"], entropy=entropy,
                             sampler_logprobs=d["sampler"] if with_sampler else None)
    loss, _ = rl_objective(inputs, **kw)
    loss.backward()
    return loss.item(), logps.grad, entropy.grad


SAPO = dict(tau_pos=1.0, tau_neg=1.05)  # TRL's defaults
VESPO = dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)

# (name, TRL config, our keyword arguments)
CASES = [
    ("grpo", dict(loss_type="grpo"), dict(loss_agg="sequence")),
    ("bnpo", dict(loss_type="bnpo"), dict(loss_agg="token")),
    ("dr_grpo", dict(loss_type="dr_grpo"), dict(loss_agg="constant", max_new_tokens=T)),
    ("dapo (eps_high 0.28)", dict(loss_type="dapo", epsilon_high=0.28),
     dict(loss_agg="token", clip_eps_high=0.28, normalizer="N")),
    ("grpo, importance_sampling_level=sequence", dict(loss_type="grpo", importance_sampling_level="sequence"),
     dict(loss_agg="sequence", importance_level="sequence")),
    ("bnpo, importance_sampling_level=sequence", dict(loss_type="bnpo", importance_sampling_level="sequence"),
     dict(loss_agg="token", importance_level="sequence")),
    ("bnpo, delta=1.3", dict(loss_type="bnpo", delta=1.3), dict(loss_agg="token", delta=1.3)),
    ("bnpo, off_policy_mask_threshold=0.05 (sampler given)",
     dict(loss_type="bnpo", off_policy_mask_threshold=0.05, with_sampler=True),
     dict(loss_agg="token", off_policy_mask=0.05, with_sampler=True)),
    ("bnpo, off_policy_mask_threshold=0.05 (no sampler: old)",
     dict(loss_type="bnpo", off_policy_mask_threshold=0.05), dict(loss_agg="token", off_policy_mask=0.05)),
    ("bnpo, beta=0.04", dict(loss_type="bnpo", beta=0.04), dict(loss_agg="token", beta=0.04)),
    ("grpo, beta=0.04, use_bias_correction_kl", dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=True),
     dict(loss_agg="sequence", beta=0.04, kl_with_ratio=True)),
    ("bnpo, beta=0.04, use_bias_correction_kl, delta=1.3",
     dict(loss_type="bnpo", beta=0.04, use_bias_correction_kl=True, delta=1.3),
     dict(loss_agg="token", beta=0.04, kl_with_ratio=True, delta=1.3)),
    ("grpo, entropy_coef=0.01", dict(loss_type="grpo", entropy_coef=0.01),
     dict(loss_agg="sequence", entropy_coef=0.01)),
    ("dr_grpo, entropy_coef=0.01", dict(loss_type="dr_grpo", entropy_coef=0.01),
     dict(loss_agg="constant", max_new_tokens=T, entropy_coef=0.01)),
    ("cispo (epsilon_high=1.5)", dict(loss_type="cispo", epsilon_high=1.5),
     dict(loss_agg="token", policy_loss="cispo", eps_max=1.5, normalizer="N")),
    ("cispo, importance_sampling_level=sequence", dict(loss_type="cispo", epsilon_high=1.5,
                                                       importance_sampling_level="sequence"),
     dict(loss_agg="token", policy_loss="cispo", eps_max=1.5, importance_level="sequence", normalizer="N")),
    ("bnpo, vLLM IS token_truncate C=1.2", dict(loss_type="bnpo", tis_cap=1.2, with_sampler=True),
     dict(loss_agg="token", tis_cap=1.2, with_sampler=True)),
    # SAPO: TRL reduces it as grpo (a sequence mean)
    ("sapo", dict(loss_type="sapo"), dict(loss_agg="sequence", policy_loss="sapo", policy_params=SAPO)),
    ("sapo, tau 0.8/1.6, beta=0.04", dict(loss_type="sapo", sapo_temperature_pos=0.8, sapo_temperature_neg=1.6, beta=0.04),
     dict(loss_agg="sequence", policy_loss="sapo", policy_params=dict(tau_pos=0.8, tau_neg=1.6), beta=0.04)),
    ("sapo, importance_sampling_level=sequence", dict(loss_type="sapo", importance_sampling_level="sequence"),
     dict(loss_agg="sequence", policy_loss="sapo", policy_params=SAPO, importance_level="sequence")),
    ("sapo, TIS C=1.2, OPM, entropy", dict(loss_type="sapo", tis_cap=1.2, with_sampler=True, off_policy_mask_threshold=0.05,
                                           entropy_coef=0.01),
     dict(loss_agg="sequence", policy_loss="sapo", policy_params=SAPO, tis_cap=1.2, with_sampler=True, off_policy_mask=0.05,
          entropy_coef=0.01)),
    # VESPO: TRL reduces it as dapo (num_items_in_batch); vLLM IS goes into φ
    ("vespo", dict(loss_type="vespo"), dict(loss_agg="token", policy_loss="vespo", policy_params=VESPO, normalizer="N")),
    ("vespo, k 1.5/2.5, lambda 2/4, beta=0.04",
     dict(loss_type="vespo", vespo_k_pos=1.5, vespo_k_neg=2.5, vespo_lambda_pos=2.0, vespo_lambda_neg=4.0, beta=0.04),
     dict(loss_agg="token", policy_loss="vespo", normalizer="N", beta=0.04,
          policy_params=dict(k_pos=1.5, k_neg=2.5, lambda_pos=2.0, lambda_neg=4.0))),
    ("vespo, vLLM IS token_truncate C=1.2", dict(loss_type="vespo", tis_cap=1.2, with_sampler=True),
     dict(loss_agg="token", policy_loss="vespo", policy_params=VESPO, normalizer="N", tis_cap=1.2, with_sampler=True)),
    # LUSPO: the clip surrogate summed per completion, averaged over completions
    ("luspo", dict(loss_type="luspo"), dict(loss_agg="sequence_sum")),
    ("luspo, importance_sampling_level=sequence, beta=0.04",
     dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.04),
     dict(loss_agg="sequence_sum", importance_level="sequence", beta=0.04)),
    ("luspo, delta=1.3, entropy_coef=0.01", dict(loss_type="luspo", delta=1.3, entropy_coef=0.01),
     dict(loss_agg="sequence_sum", delta=1.3, entropy_coef=0.01)),
    # top_entropy_quantile: the policy term on the top share of tokens by entropy, the bonus on them too
    ("grpo, top_entropy_quantile=0.5", dict(loss_type="grpo", top_entropy_quantile=0.5),
     dict(loss_agg="sequence", top_entropy_quantile=0.5)),
    ("bnpo, top_entropy_quantile=0.3, entropy_coef=0.01, beta=0.04",
     dict(loss_type="bnpo", top_entropy_quantile=0.3, entropy_coef=0.01, beta=0.04),
     dict(loss_agg="token", top_entropy_quantile=0.3, entropy_coef=0.01, beta=0.04)),
    ("sapo, top_entropy_quantile=0.5, entropy_coef=0.01", dict(loss_type="sapo", top_entropy_quantile=0.5, entropy_coef=0.01),
     dict(loss_agg="sequence", policy_loss="sapo", policy_params=SAPO, top_entropy_quantile=0.5, entropy_coef=0.01)),
    ("vespo, top_entropy_quantile=0.5", dict(loss_type="vespo", top_entropy_quantile=0.5),
     dict(loss_agg="token", policy_loss="vespo", policy_params=VESPO, normalizer="N", top_entropy_quantile=0.5)),
    ("luspo, top_entropy_quantile=0.5, TIS C=1.2", dict(loss_type="luspo", top_entropy_quantile=0.5, tis_cap=1.2, with_sampler=True),
     dict(loss_agg="sequence_sum", top_entropy_quantile=0.5, tis_cap=1.2, with_sampler=True)),
    ("grpo, all of: sequence IS, delta, OPM, TIS, KL bias, entropy",
     dict(loss_type="grpo", importance_sampling_level="sequence", delta=1.3, off_policy_mask_threshold=0.05,
          tis_cap=1.2, with_sampler=True, beta=0.04, use_bias_correction_kl=True, entropy_coef=0.01),
     dict(loss_agg="sequence", importance_level="sequence", delta=1.3, off_policy_mask=0.05, tis_cap=1.2,
          with_sampler=True, beta=0.04, kl_with_ratio=True, entropy_coef=0.01)),
]


# Gradient accumulation (no entropy bonus: TRL's is a per-micro-batch mean, ours the mini-batch's
# token mean; and not bnpo, which TRL divides by each micro-batch's own token count: see objective.py)
SPLIT_CASES = [
    ("grpo", dict(loss_type="grpo"), dict(loss_agg="sequence")),
    ("sapo, beta=0.04", dict(loss_type="sapo", beta=0.04), dict(loss_agg="sequence", policy_loss="sapo", policy_params=SAPO, beta=0.04)),
    ("vespo", dict(loss_type="vespo"), dict(loss_agg="token", policy_loss="vespo", policy_params=VESPO)),
    ("luspo, sequence IS", dict(loss_type="luspo", importance_sampling_level="sequence"),
     dict(loss_agg="sequence_sum", importance_level="sequence")),
    ("sapo, top_entropy_quantile=0.5", dict(loss_type="sapo", top_entropy_quantile=0.5),
     dict(loss_agg="sequence", policy_loss="sapo", policy_params=SAPO, top_entropy_quantile=0.5)),
]


def _max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """Largest |a − b|; a gradient that is None on one side (no entropy term) counts as zeros."""
    if a is None and b is None:
        return 0.0
    a, b = (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)
    return (a - b).abs().max().item()


def _half(d: dict, rows: slice) -> dict:
    return {k: v[rows] for k, v in d.items()}


def split_losses(cfg: dict, kw: dict, d: dict) -> tuple[float, float, float]:
    """Gradient accumulation over two micro-batches of 3 completions: TRL with
    current_gradient_accumulation_steps=2 (steps_per_generation=2 for the num_items_in_batch
    losses), ours with the whole batch's units as `normalizer`; losses and gradients summed."""
    cfg = dict(cfg, accumulation=2)
    t_total, o_total, t_grads, o_grads = 0.0, 0.0, [], []
    units = {"sequence": B, "sequence_sum": B, "token": d["mask"].sum()}[kw["loss_agg"]]
    for rows in (slice(0, 3), slice(3, 6)):
        h = _half(d, rows)
        t_loss, t_glp, _ = trl_loss(cfg, h, num_items=d["mask"].sum())
        o_loss, o_glp, _ = our_loss(dict(kw, normalizer=units), h)
        t_total, o_total = t_total + t_loss, o_total + o_loss
        t_grads.append(t_glp), o_grads.append(o_glp)
    return t_total, o_total, _max_diff(torch.cat(t_grads), torch.cat(o_grads))


def parity_rows() -> list[tuple[str, float, float, float]]:
    """(case, TRL loss, our loss, largest gradient difference) for every case, in float64."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # differences then show real mismatches, not rounding
    try:
        d = fixed_batch()
        rows = []
        for name, cfg, kw in CASES:
            kw = {k: (d["mask"].sum() if isinstance(v, str) and v == "N" else v) for k, v in kw.items()}  # "N": num_items_in_batch
            t_loss, t_glp, t_gh = trl_loss(cfg, d)
            o_loss, o_glp, o_gh = our_loss(dict(kw), d)
            rows.append((name, t_loss, o_loss, max(_max_diff(t_glp, o_glp), _max_diff(t_gh, o_gh))))
        for name, cfg, kw in SPLIT_CASES:
            rows.append((f"{name}, 2 micro-batches accumulated", *split_losses(cfg, kw, d)))
        return rows
    finally:
        torch.set_default_dtype(dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write bench/results/trl_loss_parity_<date>.md")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args()
    import trl

    lines = [f"TRL {trl.__version__}, torch {torch.__version__}; B={B}, T={T}, lengths 7,3,5,1,0,6, float64.", "",
             "| TRL configuration | TRL loss | rl_objective loss | abs diff | max abs grad diff (logprobs, entropy) |",
             "|---|---:|---:|---:|---:|"]
    worst = 0.0
    for name, t_loss, o_loss, gdiff in parity_rows():
        worst = max(worst, abs(t_loss - o_loss), gdiff)
        lines.append(f"| {name} | {t_loss:.10f} | {o_loss:.10f} | {abs(t_loss - o_loss):.1e} | {gdiff:.1e} |")
    lines += ["", f"largest difference: {worst:.1e}"]
    print("\n".join(lines))
    if args.save:
        out = ROOT / "bench" / "results" / f"trl_loss_parity_{args.date}.md"
        header = ["# rl_objective vs TRL GRPOTrainer._compute_loss", "",
                  "`.bench/trl-venv/bin/python bench/trl_loss_parity.py --save`", "",
                  "(see its docstring for the loss_type mapping)", ""]
        out.write_text("\n".join(header + lines) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    if worst > 1e-9:
        sys.exit(f"mismatch: {worst:.1e}")


if __name__ == "__main__":
    main()
