"""W2 (compute-bound) side by side: TRL's trl_grpo_w2.py and bench/scalerl_w2.py, alternating.

    bash bench/setup_trl.sh                 # once: .bench/trl-venv with TRL's exact versions
    python bench/w2_parity.py --runs 3 --extra-runs 1 --save

Per round: TRL --bf16 and ScaleRL precision.mode=standard (its bf16), both with eager attention
(`model.attn_implementation=eager`; TRL's script through bench/trl_w2_attn.py), and ScaleRL's the same with
`rollout.decode=compiled` (the decode step compiled in the first step, a warm-up both scripts leave out of the
median: the compile time is ScaleRL's `first_step_seconds`); then (for the first --extra-runs rounds) TRL fp32,
TRL --bf16, ScaleRL standard (both with transformers' default sdpa) and ScaleRL fp32. Prints every JSON line, the medians, ScaleRL's tokens/s over
TRL's best configuration, and the fraction of the 2048² matmul peak of the dtype it ran in
(`fraction_of_peak`) and of the bf16 peak (`fraction_of_bf16_peak`), both measured by each run itself;
`--save` writes bench/results/w2_parity_<date><--tag>.{json,md}. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from trl_parity import ROOT, last_json

CONFIGS = {  # name: (framework, arguments); the first EVERY run every round, the others --extra-runs rounds
    "trl bf16 eager": ("trl", ["eager", "--bf16"]),
    "scalerl standard eager": ("scalerl", ["--mode", "standard", "--set", "model.attn_implementation=eager"]),
    "scalerl standard eager compiled": ("scalerl", ["--mode", "standard", "--set", "model.attn_implementation=eager",
                                                    "--set", "rollout.decode=compiled"]),
    "trl fp32": ("trl", []),
    "trl bf16": ("trl", ["--bf16"]),
    "scalerl standard": ("scalerl", ["--mode", "standard"]),
    "scalerl fp32": ("scalerl", ["--mode", "fp32"]),
}
EVERY = 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="rounds of the first EVERY configurations")
    ap.add_argument("--extra-runs", type=int, default=1, help="rounds that also run the others")
    ap.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "bench")
    ap.add_argument("--trl-python", type=Path, default=ROOT / ".bench" / "trl-venv" / "bin" / "python")
    ap.add_argument("--tag", default="", help="appended to the results files' names (a second run on one date)")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    if not args.trl_python.exists():
        sys.exit(f"{args.trl_python} not found: run `bash bench/setup_trl.sh` first")
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for r in range(args.runs):
        for i, (name, (framework, extra)) in enumerate(CONFIGS.items()):
            if i >= EVERY and r >= args.extra_runs:
                continue
            trl_script = [str(ROOT / "bench" / "trl_w2_attn.py")] if extra[:1] == ["eager"] else ["trl_grpo_w2.py"]
            cmd = ([str(args.trl_python), *trl_script, *extra, "--no-probe"] if framework == "trl"
                   else [sys.executable, str(ROOT / "bench" / "scalerl_w2.py"), "--tiny-task", str(args.reference), *extra])
            row = last_json(cmd, args.reference if framework == "trl" else ROOT, None)
            peak = max(row["matmul_2048_gflops"]["before"]["bf16"]["median"], row["matmul_2048_gflops"]["after"]["bf16"]["median"]) \
                if framework == "trl" else row["bf16_matmul_peak_gflops"]
            row["fraction_of_bf16_peak"] = round(row["achieved_gflops"] / peak, 3)
            bf16 = "--bf16" in extra if framework == "trl" else "fp32" not in extra
            own = (max(row["matmul_2048_gflops"][w]["bf16" if bf16 else "fp32"]["median"] for w in ("before", "after"))
                   if framework == "trl" else row["bf16_matmul_peak_gflops" if bf16 else "fp32_matmul_peak_gflops"])
            row["fraction_of_peak"] = round(row["achieved_gflops"] / own, 3)  # of the 2048² peak of the dtype that ran
            results[name].append(row)
            print(json.dumps({"config": name, **{k: row[k] for k in ("seconds_per_step", "generated_tokens_per_second",
                                                                    "achieved_gflops", "fraction_of_peak", "fraction_of_bf16_peak")}}),
                  flush=True)
    keys = ("seconds_per_step", "generated_tokens_per_second", "achieved_gflops", "fraction_of_peak", "fraction_of_bf16_peak", "peak_rss_mb")
    medians = {name: {k: statistics.median(r[k] for r in rows) for k in keys} for name, rows in results.items() if rows}
    best_trl = max((n for n in medians if n.startswith("trl")), key=lambda n: medians[n]["generated_tokens_per_second"])
    lines = ["| config | runs | s/step | tokens/s | × TRL's best | GFLOP/s | of its dtype's peak | of bf16 peak | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, m in medians.items():
        ratio = m["generated_tokens_per_second"] / medians[best_trl]["generated_tokens_per_second"]
        lines.append(f"| {name} | {len(results[name])} | {m['seconds_per_step']:.2f} | {m['generated_tokens_per_second']:.0f} | {ratio:.2f} | "
                     f"{m['achieved_gflops']:.0f} | {m['fraction_of_peak']:.3f} | {m['fraction_of_bf16_peak']:.3f} | {m['peak_rss_mb']:.0f} |")
    lines.append("\nScaleRL's first step (a warm-up, left out of the medians; with `rollout.decode=compiled` it compiles): "
                 + ", ".join(f"{name} {statistics.median(r['first_step_seconds'] for r in rows):.1f} s"
                             for name, rows in results.items() if rows and name.startswith("scalerl")))
    for name in ("scalerl standard eager", "scalerl standard eager compiled"):
        split = results[name][-1]
        lines.append(f"\n{name}, last run's split (s, GFLOP/s, fraction of the bf16 peak): "
                     f"{split['split_seconds']}, {split['split_gflops']}, {split['split_fraction_of_its_dtype_peak']}")
    print("\n".join(lines))
    if args.save:
        date = datetime.date.today().isoformat()
        cmd = "python bench/w2_parity.py " + " ".join(sys.argv[1:])
        out = ROOT / "bench" / "results"
        (out / f"w2_parity_{date}{args.tag}.json").write_text(json.dumps({"date": date, "command": cmd, "best_trl": best_trl,
                                                                "medians": medians, "runs": results}, indent=1))
        (out / f"w2_parity_{date}{args.tag}.md").write_text(f"# W2 side by side, {date}\n\n`{cmd}` (2 threads, alone on the machine, "
                                                  "alternating; medians)\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
