"""Dynamic sharding against full synchronisation: bytes communicated and held-out pass rate, 2 gloo ranks.

    python bench/dynamic_sharding.py [--seeds 0 1 2] [--steps 300] [--save]

The default job (arithmetic, built-in model) under `scalerl train --nproc 2`, with the global batch of
the one-process default (rollout.prompts_per_step=8 per rank), one thread per rank, for
parallel.strategy=ddp (every gradient all-reduced every update) and parallel.strategy=dynamic (the
source's default param_groups: attention outputs, norms and the last FFN projection every 2 steps,
the other decoder weights every 5, embeddings and the head every 10; all of them on the first and
last step and before every evaluation and checkpoint). Seeds alternate the two. Prints, per run,
the sum of `comm/bytes` over the steps of rank 0 (payload, not wire bytes) and the held-out pass
rate after the last step; then the medians, the byte reduction and the pass-rate difference.
`--save` writes bench/results/dynamic_sharding_<date>.{json,md}. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
STRATEGIES = ("ddp", "dynamic")


def run(run_dir: str, strategy: str, seed: int, steps: int) -> dict:
    name = f"{strategy}_{seed}"
    cmd = [sys.executable, "-m", "scalerl.cli.main", "train", "--nproc", "2", "--name", name, "--overwrite",
           "--set", f"log.run_dir={run_dir}", "--set", "log.console=none", "--set", f"parallel.strategy={strategy}",
           "--set", f"train.seed={seed}", "--set", f"train.steps={steps}", "--set", "rollout.prompts_per_step=8",
           "--set", "train.threads=1"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr[-3000:]}")
    folder = Path(run_dir) / name
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())
    groups = sorted({k for r in rows for k in r if k.startswith("comm/bytes/")})
    return {"strategy": strategy, "seed": seed, "steps": len(rows), "wall_s": wall,
            "comm_bytes": sum(r["comm/bytes"] for r in rows),
            "comm_bytes_by_group": {g[len("comm/bytes/"):]: sum(r.get(g, 0.0) for r in rows) for g in groups},
            "pass_rate_before": summary["pass_rate_before"], "pass_rate_after": summary["pass_rate_after"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as run_dir:
        for i, seed in enumerate(args.seeds):
            for strategy in (STRATEGIES if i % 2 == 0 else STRATEGIES[::-1]):  # alternate which goes first
                runs.append(run(run_dir, strategy, seed, args.steps))
                r = runs[-1]
                print(f"{strategy:8} seed {seed}: {r['comm_bytes'] / 2**20:9.1f} MiB communicated, pass rate "
                      f"{r['pass_rate_before']:.3f} -> {r['pass_rate_after']:.3f}, {r['wall_s']:.0f} s", flush=True)
    med = {s: {k: statistics.median(r[k] for r in runs if r["strategy"] == s) for k in ("comm_bytes", "pass_rate_after", "wall_s")}
           for s in STRATEGIES}
    reduction = 1 - med["dynamic"]["comm_bytes"] / med["ddp"]["comm_bytes"]
    by_seed = {r["seed"]: {} for r in runs}
    for r in runs:
        by_seed[r["seed"]][r["strategy"]] = r["pass_rate_after"]
    diffs = [v["dynamic"] - v["ddp"] for v in by_seed.values()]
    print(f"medians: ddp {med['ddp']['comm_bytes'] / 2**20:.1f} MiB, pass {med['ddp']['pass_rate_after']:.3f}; dynamic "
          f"{med['dynamic']['comm_bytes'] / 2**20:.1f} MiB, pass {med['dynamic']['pass_rate_after']:.3f}; bytes {reduction:.1%} less; "
          f"pass-rate difference per seed (dynamic - ddp): {', '.join(f'{d:+.3f}' for d in diffs)}")
    if args.save:
        date = datetime.date.today().isoformat()
        RESULTS.mkdir(exist_ok=True)
        out = {"date": date, "command": "python bench/dynamic_sharding.py " + " ".join(sys.argv[1:]), "runs": runs, "medians": med,
               "byte_reduction": reduction, "pass_rate_diff_per_seed": diffs, "cpu": os.cpu_count()}
        (RESULTS / f"dynamic_sharding_{date}.json").write_text(json.dumps(out, indent=1))
        lines = [f"# Dynamic sharding against full sync, {date}", "", f"`{out['command']}`: 2 gloo ranks (`scalerl train --nproc 2`), "
                 f"the default job, {args.steps} steps, 8 prompts x 8 completions per rank, 1 thread per rank.", "",
                 "| strategy | seed | MiB communicated (rank 0, payload) | pass rate before → after | wall s |", "|---|---|---|---|---|"]
        lines += [f"| {r['strategy']} | {r['seed']} | {r['comm_bytes'] / 2**20:.1f} | {r['pass_rate_before']:.3f} → "
                  f"{r['pass_rate_after']:.3f} | {r['wall_s']:.0f} |" for r in runs]
        lines += ["", f"Medians: ddp {med['ddp']['comm_bytes'] / 2**20:.1f} MiB, dynamic {med['dynamic']['comm_bytes'] / 2**20:.1f} MiB: "
                  f"**{reduction:.1%} fewer bytes**. Pass rate after, dynamic − ddp per seed: {', '.join(f'{d:+.3f}' for d in diffs)} "
                  f"(medians {med['dynamic']['pass_rate_after']:.3f} vs {med['ddp']['pass_rate_after']:.3f})."]
        groups = runs[[r["strategy"] for r in runs].index("dynamic")]["comm_bytes_by_group"]
        lines += ["", "Bytes by group (first dynamic run): " + ", ".join(f"{g} {b / 2**20:.1f} MiB" for g, b in groups.items())]
        (RESULTS / f"dynamic_sharding_{date}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
