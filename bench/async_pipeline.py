"""Synchronous against asynchronous (PipelineRL-k) training on the default job (issue 15).

    python bench/async_pipeline.py --seeds 0 1 2 --save          # ~10 min on 2 cores; run it alone
    python bench/async_pipeline.py --seeds 0 1 2 --vllm --save   # + async k = 1 with the vLLM engine in the producer

Each run is `scalerl train` on the embedded default (300 steps, evaluated every 25) in a process of
its own: sync with train.threads = all cores; async k = 1, 4, 8 with the learner and the producer on
half the cores each and algorithm.tis_cap = 2. Runs alternate (seed-major, modes in turn). Reported
per mode, medians over seeds: completions/s over the training loop, wall time, final held-out pass
rate, and the time to reach the target pass rate (0.9 × sync's median final one), read from the
evaluations' `time/elapsed_s`. Figures and a PNG go to bench/results/async_pipeline_<date>.*.
`--vllm` adds async k = 1 with rollout.engine=vllm (vLLM's CPU build here; its engine start is in the
wall time, not in completions/s, which are over the training loop).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"sync": [], "async-k1": ["rollout.max_staleness=1"], "async-k4": ["rollout.max_staleness=4"],
         "async-k8": ["rollout.max_staleness=8"]}
VLLM = {"async-k1-vllm": ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=0.25"]}


def run(mode: str, seed: int, runs: Path, cores: int, modes: dict[str, list[str]]) -> dict:
    sets = ["eval.every=25", f"train.seed={seed}", f"log.run_dir={runs}", "log.console=none"]
    if mode == "sync":
        sets += [f"train.threads={cores}"]
    else:
        half = max(1, cores // 2)
        sets += ["rollout.mode=async", "algorithm.tis_cap=2", f"train.threads={max(1, cores - half)}",
                 f"rollout.producer_threads={half}", *modes[mode]]
    name = f"{mode}-s{seed}"
    args = [sys.executable, "-m", "scalerl.cli.main", "train", "--name", name]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": str(cores)}
    subprocess.run(args, check=True, cwd=ROOT, env=env, capture_output=True, text=True)
    rows = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((runs / name / "summary.json").read_text())
    evals = [(0.0, summary["pass_rate_before"])] + [(r["time/elapsed_s"], r["eval/pass_rate"]) for r in rows if "eval/pass_rate" in r]
    completions = sum(r["completions"] for r in rows)
    return {"mode": mode, "seed": seed, "wall_s": summary["wall_time_s"], "completions_per_s": completions / summary["train_time_s"],
            "loop_completions_per_s": completions / rows[-1]["time/elapsed_s"], "final_pass_rate": summary["pass_rate_after"],
            "evals": evals, "staleness_mean": statistics.mean(r["staleness"] for r in rows)}


def cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")] if info.is_file() else []
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} cores"


def time_to(evals: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, p in evals if p >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--vllm", action="store_true", help="also async k = 1 with the vLLM engine in the producer")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    modes = {**MODES, **(VLLM if args.vllm else {})}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for mode in modes:
                results.append(run(mode, seed, Path(tmp), args.cores, modes))
                r = results[-1]
                print(f"{mode:9s} seed {seed}: {r['loop_completions_per_s']:.1f} completions/s, wall {r['wall_s']:.1f} s, "
                      f"final pass {r['final_pass_rate']:.3f}, staleness {r['staleness_mean']:.2f}", flush=True)
    target = 0.9 * statistics.median(r["final_pass_rate"] for r in results if r["mode"] == "sync")
    table = []
    for mode in modes:
        rs = [r for r in results if r["mode"] == mode]
        reach = [time_to(r["evals"], target) for r in rs]
        table.append({"mode": mode, "completions_per_s": statistics.median(r["loop_completions_per_s"] for r in rs),
                      "wall_s": statistics.median(r["wall_s"] for r in rs),
                      "final_pass_rate": statistics.median(r["final_pass_rate"] for r in rs),
                      "time_to_target_s": statistics.median(reach) if all(t is not None for t in reach) else None,
                      "reached": sum(t is not None for t in reach), "runs": len(rs),
                      "staleness_mean": statistics.median(r["staleness_mean"] for r in rs)})
    lines = [f"# Sync vs async (PipelineRL-k), default job ({date.today()}, `python bench/async_pipeline.py --seeds "
             f"{' '.join(map(str, args.seeds))}{' --vllm' if args.vllm else ''} --save`, {args.cores} cores)", "",
             f"Machine: {cpu_model()}, alone. Target pass rate {target:.3f} (0.9 x sync's median final); medians over "
             f"{len(args.seeds)} seeds", "",
             "| mode | completions/s | wall s | final pass rate | time to target s (reached) | mean staleness |", "|---|---|---|---|---|---|"]
    sync = table[0]["completions_per_s"]
    for t in table:
        reach = f"{t['time_to_target_s']:.1f}" if t["time_to_target_s"] is not None else "—"
        lines.append(f"| {t['mode']} | {t['completions_per_s']:.1f} ({t['completions_per_s'] / sync:.2f}x) | {t['wall_s']:.1f} | "
                     f"{t['final_pass_rate']:.3f} | {reach} ({t['reached']}/{t['runs']}) | {t['staleness_mean']:.2f} |")
    print("\n".join(lines))
    if args.save:
        out = ROOT / "bench" / "results" / f"async_pipeline_{date.today()}"
        out.with_suffix(".json").write_text(json.dumps({"target": target, "table": table, "runs": results}, indent=1))
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        plot(results, target, out.with_suffix(".png"), list(modes))


def plot(results: list[dict], target: float, path: Path, modes: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = dict(zip(modes, ["black", "tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for r in results:
        t, p = zip(*r["evals"])
        ax.plot(t, p, color=colors[r["mode"]], alpha=0.7, label=r["mode"] if r["seed"] == results[0]["seed"] else None)
    ax.axhline(target, color="grey", linestyle=":", label="target")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("held-out pass rate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
