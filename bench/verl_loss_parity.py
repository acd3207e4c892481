"""rl_objective against verl's own policy-loss and KL functions, run side by side on the same tensors.

verl's core_algos.py imports its whole trainer stack, so this script does not import the package: it
reads verl's source from a fetched snapshot (a git directory, `--verl`, default the mirror the
`fetch` tool makes of github:volcengine/verl), takes out only the functions it compares against
(`agg_loss`, `compute_policy_loss_vanilla`, `_sapo`, `_geo_mean`, `_clip_cov`, `_kl_cov`,
`kl_penalty`, `kl_penalty_forward`, and `masked_sum` / `masked_mean` from verl/utils/
torch_functional.py), and runs them unmodified, their decorators dropped and their config a plain
attribute object. No code of verl's is stored in this repository.

    /work/main/.venv/bin/python bench/verl_loss_parity.py [--verl GITDIR] [--save]

Mapping: verl's dual-clip clip_ratio_c = our δ (policy_loss clip); sapo (verl aggregates it by
seq-mean-token-mean, dividing by the completions that have tokens) = policy_loss sapo, loss_agg
sequence with that count as normalizer; geo_mean = gmpo with loss_agg sequence; clip_cov and
kl_cov (token-mean) = clip_cov and kl_cov with loss_agg token (clip_cov draws torch.randperm: both
sides run after the same torch.manual_seed); kl_penalty k1/k2/low_var_kl/abs/k3+ = kl_estimate
k1/k2/k3/abs/k3+. verl divides by (count + 1e-8), so agreement is to ~1e-8 relative, not 1e-16.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scalerl.algorithms.kl import kl_estimate  # noqa: E402
from scalerl.algorithms.losses import aggregation_units  # noqa: E402
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective  # noqa: E402

MIRROR = Path("/work/.mirror/volcengine+verl/repo")
WANTED = ["agg_loss", "compute_policy_loss_vanilla", "compute_policy_loss_sapo", "compute_policy_loss_geo_mean",
          "compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov", "kl_penalty", "kl_penalty_forward"]
RC_WANTED = ["_parse_rollout_rs_thresholds", "compute_rollout_rejection_mask", "compute_rs_metrics",
             "compute_rollout_correction_weights", "compute_is_metrics"]
B, T = 6, 7


class _Config(dict):
    """verl's ActorConfig as far as the loss functions read it: attributes and .get."""

    __getattr__ = dict.get


class _AlgoConfig:  # verl asserts the config is not one of these
    pass


def _functions(source: str, names: list[str]) -> str:
    """The source of the named top-level functions, without their decorators."""
    lines, out = source.splitlines(), []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            out.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
    missing = set(names) - {n.name for n in ast.parse("\n\n".join(out)).body}
    if missing:
        sys.exit(f"verl's source has no {sorted(missing)}: a different verl version?")
    return "\n\n".join(out)


def load_verl(gitdir: Path) -> tuple[SimpleNamespace, str]:
    """verl's functions, executed from its source at HEAD of `gitdir`; and that commit."""
    show = (lambda path: subprocess.run(["git", "-C", str(gitdir), "show", f"HEAD:{path}"], check=True,
                                        capture_output=True, text=True).stdout)
    commit = subprocess.run(["git", "-C", str(gitdir), "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    tf_ns: dict[str, Any] = {"torch": torch}
    exec(_functions(show("verl/utils/torch_functional.py"), ["masked_sum", "masked_mean"]), tf_ns)
    ns: dict[str, Any] = {"torch": torch, "Optional": Optional, "Any": Any, "verl_F": SimpleNamespace(**tf_ns),
                          "ActorConfig": _Config, "AlgoConfig": _AlgoConfig}
    exec(_functions(show("verl/trainer/ppo/core_algos.py"), WANTED), ns)
    rc_source = show("verl/trainer/ppo/rollout_corr_helper.py")
    rc_ns: dict[str, Any] = {"torch": torch, "math": __import__("math"), "Optional": Optional, "Any": Any, "verl_F": ns["verl_F"]}
    for node in ast.parse(rc_source).body:  # its module constants (SAFETY_BOUND, the option sets)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            exec(ast.get_source_segment(rc_source, node), rc_ns)
    exec(_functions(rc_source, RC_WANTED), rc_ns)
    return SimpleNamespace(**{n: ns[n] for n in WANTED}, **{n: rc_ns[n] for n in RC_WANTED}), commit


def fixed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1, 0, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    return {"mask": mask, "logps": logps, "old": logps + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64),
            "ref": logps + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
            "adv": torch.tensor([1.0, -0.7, 0.4, -1.3, 0.9, -0.2], dtype=torch.float64)}


def _ours(d: dict, seed: int = 0, **kw) -> tuple[float, torch.Tensor]:
    lp = d["logps"].clone().requires_grad_(True)
    torch.manual_seed(seed)
    loss, _ = rl_objective(ObjectiveInputs(lp, d["old"], d["adv"], d["mask"]), **kw)
    loss.backward()
    return loss.item(), lp.grad


def _theirs(fn, d: dict, cfg: _Config, seed: int = 0, **kw) -> tuple[float, torch.Tensor]:
    lp = d["logps"].clone().requires_grad_(True)
    torch.manual_seed(seed)
    adv = d["adv"][:, None].expand(B, T).contiguous()  # verl's advantages are per token
    loss, _ = fn(old_log_prob=d["old"], log_prob=lp, advantages=adv, response_mask=d["mask"], config=cfg, **kw)
    loss.backward()
    return loss.item(), lp.grad


def _cfg(**kw) -> _Config:
    cov = SimpleNamespace(clip_cov_ratio=kw.pop("cov_ratio", 2e-4), clip_cov_lb=kw.pop("lb", 1.0), clip_cov_ub=kw.pop("ub", 5.0),
                          kl_cov_ratio=kw.pop("kl_cov_ratio", 2e-4), ppo_kl_coef=kw.pop("ppo_kl_coef", 1.0))
    return _Config({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                    "policy_loss": cov, "global_batch_info": {}, **kw})


def parity_rows(verl: SimpleNamespace) -> list[tuple[str, float, float, float]]:
    """(case, verl's loss, ours, largest gradient difference), float64."""
    d = fixed_batch()
    seqs = aggregation_units(d["mask"], "sequence")  # verl's seq-mean counts the completions with tokens
    rows = []

    def row(name, theirs, ours):
        rows.append((name, theirs[0], ours[0], (theirs[1] - ours[1]).abs().max().item()))

    for c in (1.3, 3.0):
        row(f"dual-clip c={c} (vanilla, token-mean) = delta", _theirs(verl.compute_policy_loss_vanilla, d, _cfg(clip_ratio_c=c)),
            _ours(d, delta=c))
    row("vanilla, eps 0.2/0.28, c=3 = clip-higher + delta",
        _theirs(verl.compute_policy_loss_vanilla, d, _cfg(clip_ratio_high=0.28)), _ours(d, clip_eps_high=0.28, delta=3.0))
    for tp, tn in ((1.0, 1.05), (0.7, 2.0)):
        row(f"sapo tau {tp}/{tn} (seq-mean-token-mean)", _theirs(verl.compute_policy_loss_sapo, d, _cfg(tau_pos=tp, tau_neg=tn)),
            _ours(d, policy_loss="sapo", policy_params=dict(tau_pos=tp, tau_neg=tn), loss_agg="sequence", normalizer=seqs))
    for eps in (0.2, 0.4):
        row(f"geo_mean eps {eps} = gmpo", _theirs(verl.compute_policy_loss_geo_mean, d, _cfg(clip_ratio_low=eps, clip_ratio_high=eps)),
            _ours(d, policy_loss="gmpo", clip_eps_low=eps, clip_eps_high=eps, loss_agg="sequence"))
    for seed in (0, 1, 2):
        row(f"clip_cov ratio 0.2, band (0, 5), seed {seed}",
            _theirs(verl.compute_policy_loss_clip_cov, d, _cfg(cov_ratio=0.2, lb=0.0, ub=5.0), seed=seed),
            _ours(d, seed=seed, policy_loss="clip_cov", policy_params=dict(ratio=0.2, cov_low=0.0, cov_high=5.0)))
    for ratio, coef in ((2e-4, 1.0), (0.2, 1.0), (0.3, 0.5)):
        row(f"kl_cov ratio {ratio}, coef {coef}", _theirs(verl.compute_policy_loss_kl_cov, d, _cfg(kl_cov_ratio=ratio, ppo_kl_coef=coef)),
            _ours(d, policy_loss="kl_cov", policy_params=dict(ratio=ratio, kl_coef=coef)))
    # (verl's value, verl's gradient, ours). At the snapshot read, verl's kl_penalty("k3+") passes "k3+" on to
    # kl_penalty_forward, which knows only "k3" and raises; its stated rule (k3's value, k2's gradient) is
    # therefore checked against its "k3" value and its "k2" gradient.
    for value, grad, ours in (("k1", "k1", "k1"), ("k2", "k2", "k2"), ("low_var_kl", "low_var_kl", "k3"), ("abs", "abs", "abs"),
                              ("k3", "k2", "k3+")):
        lp1, lp2 = d["logps"].clone().requires_grad_(True), d["logps"].clone().requires_grad_(True)
        (verl.kl_penalty(lp1, d["ref"], grad) * d["mask"]).sum().backward()
        (kl_estimate(lp2, d["ref"], ours) * d["mask"]).sum().backward()
        a, b = (verl.kl_penalty(d["logps"], d["ref"], value) * d["mask"]), (kl_estimate(d["logps"], d["ref"], ours) * d["mask"])
        name = f"kl_penalty {value}" + (f" (gradient of {grad})" if grad != value else "")
        rows.append((f"{name} = kl_estimate {ours} (sum)", a.sum().item(), b.sum().item(),
                     max((lp1.grad - lp2.grad).abs().max().item(), (a - b).abs().max().item())))
    rows += rollout_correction_rows(verl, d)
    return rows


def rollout_correction_rows(verl: SimpleNamespace, d: dict) -> list[tuple[str, float, float, float]]:
    """IS weights and rejection masks (scalerl/algorithms/rollout_correction.py) against verl's
    compute_rollout_correction_weights / compute_rollout_rejection_mask, π_old = d["old"],
    π_sampler = d["logps"] (their drift is what the presets correct). The row's "loss" is the sum of
    weights (or of kept tokens); the difference column is the largest elementwise one."""
    from scalerl.algorithms.rollout_correction import is_weights, rejection_mask

    old, sampler, mask = d["old"], d["logps"], d["mask"]
    rows = []
    for level, cap in (("token", 2.0), ("token", 1.2), ("sequence", 2.0), ("sequence", 5.0)):
        theirs, _ = verl.compute_rollout_correction_weights(old - sampler, mask, rollout_is=level, rollout_is_threshold=cap)
        ours = is_weights(old, sampler, mask, level=level, cap=cap)
        rows.append((f"rollout IS {level}, cap {cap}", theirs.sum().item(), ours.sum().item(), (theirs - ours).abs().max().item()))
    for mode, low, high in (("token_k1", 0.5, 2.0), ("token_k1", 0.8, 1.25), ("seq_sum_k1", 0.5, 2.0), ("seq_mean_k1", 0.8, 1.25),
                            ("seq_mean_k1", 0.9, 1.1), ("seq_mean_k3", None, 0.1), ("token_k2", None, 0.1), ("seq_max_k3", None, 0.2),
                            ("seq_sum_k3", None, 0.3)):
        threshold = high if low is None else f"{low}_{high}"
        theirs, _ = verl.compute_rollout_rejection_mask(old - sampler, mask, rollout_rs=mode, rollout_rs_threshold=threshold)
        ours = rejection_mask(old, sampler, mask, mode=mode, low=low or 0.5, high=high)
        rows.append((f"rollout RS {mode} {threshold} (kept tokens)", theirs.sum().item(), ours.sum().item(), (theirs - ours).abs().max().item()))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verl", type=Path, default=MIRROR, help="git directory of a verl snapshot")
    ap.add_argument("--save", action="store_true", help="write bench/results/verl_loss_parity_<date>.md")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args()
    verl, commit = load_verl(args.verl)
    lines = [f"verl {commit}, torch {torch.__version__}; B={B}, T={T}, lengths 7,3,5,1,0,6, float64.", "",
             "| verl function / configuration | verl loss | rl_objective loss | rel diff | max abs grad diff |",
             "|---|---:|---:|---:|---:|"]
    worst = 0.0
    for name, theirs, ours, gdiff in parity_rows(verl):
        rel = abs(theirs - ours) / max(abs(theirs), 1e-12)
        worst = max(worst, rel, gdiff)
        lines.append(f"| {name} | {theirs:.10f} | {ours:.10f} | {rel:.1e} | {gdiff:.1e} |")
    lines += ["", f"largest difference: {worst:.1e}"]
    print("\n".join(lines))
    if args.save:
        out = ROOT / "bench" / "results" / f"verl_loss_parity_{args.date}.md"
        header = ["# rl_objective vs verl's core_algos policy losses and KL penalties", "",
                  "`/work/main/.venv/bin/python bench/verl_loss_parity.py --save` (verl read from a fetched snapshot)", "",
                  "(see its docstring for the mapping)", ""]
        out.write_text("\n".join(header + lines) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    if worst > 1e-6:
        sys.exit(f"mismatch: {worst:.1e}")


if __name__ == "__main__":
    main()
