"""Two default jobs on the same cores: the wall time of each against the same job alone.

    python bench/concurrent_jobs.py [--rounds 3] [--fixed-rounds 1] [--save]

Runs `scalerl train` with no arguments but a run folder of its own (the embedded default job) alone and
then two at once, in rounds, for `train.threads` unset (the default: `scalerl/trainer/core_share.py`
lowers torch's threads to the cores other processes leave free) and `train.threads=<cores>` (fixed:
what the default did before). Prints the median wall time per job and the ratio to the same setting's
solo time; `--save` writes bench/results/concurrent_jobs_<date>.{json,md}. Run it alone on the machine.
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


def job(run_dir: str, name: str, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "scalerl.cli.main", "train", "--name", name, "--overwrite",
           "--set", f"log.run_dir={run_dir}", "--set", "log.console=none", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait(procs: list[subprocess.Popen], start: float) -> list[float]:
    times = [0.0] * len(procs)
    pending = dict(enumerate(procs))
    while pending:
        for i, p in list(pending.items()):
            if p.poll() is not None:
                times[i] = time.perf_counter() - start
                if p.returncode != 0:
                    raise SystemExit(f"job failed ({p.returncode}): {p.stderr.read()[-2000:]}")
                del pending[i]
        time.sleep(0.05)
    return times


def run(run_dir: str, concurrent: int, extra: list[str]) -> list[float]:
    start = time.perf_counter()
    return wait([job(run_dir, f"job{i}", extra) for i in range(concurrent)], start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (solo, pair) with train.threads unset")
    ap.add_argument("--fixed-rounds", type=int, default=1, help="rounds with train.threads fixed at the core count")
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: the default job's)")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    base = ["--set", f"train.steps={args.steps}"] if args.steps else []
    settings = {"auto": base, "fixed": base + ["--set", f"train.threads={cores}"]}
    rounds = {"auto": args.rounds, "fixed": args.fixed_rounds}
    times: dict[str, dict[str, list[float]]] = {k: {"solo": [], "pair": []} for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(max(rounds.values())):
            for name, extra in settings.items():
                if r >= rounds[name]:
                    continue
                order = ("solo", "pair") if r % 2 == 0 else ("pair", "solo")
                for kind in order:
                    t = run(tmp, 1 if kind == "solo" else 2, extra)
                    times[name][kind] += t
                    print(f"round {r} {name:5} {kind}: " + ", ".join(f"{x:.1f} s" for x in t), flush=True)
    rows = []
    for name in settings:
        solo, pair = statistics.median(times[name]["solo"]), statistics.median(times[name]["pair"])
        rows.append({"threads": "unset (auto)" if name == "auto" else f"{cores} (fixed)", "solo_s": solo, "pair_s": pair,
                     "ratio": pair / solo, "solo_runs": times[name]["solo"], "pair_runs": times[name]["pair"]})
    auto_solo, fixed_solo = rows[0]["solo_s"], rows[1]["solo_s"]
    lines = ["| train.threads | solo s (median) | each of two at once s (median) | × solo |", "|---|---|---|---|"]
    lines += [f"| {r['threads']} | {r['solo_s']:.1f} | {r['pair_s']:.1f} | {r['ratio']:.2f} |" for r in rows]
    lines.append(f"\nsolo auto / solo fixed: {auto_solo / fixed_solo:.2f}")
    print("\n".join(lines))
    if args.save:
        date = datetime.date.today().isoformat()
        cmd = "python bench/concurrent_jobs.py " + " ".join(sys.argv[1:])
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"concurrent_jobs_{date}.json").write_text(json.dumps(
            {"date": date, "command": cmd, "cores": cores, "rows": rows}, indent=1))
        (RESULTS / f"concurrent_jobs_{date}.md").write_text(
            f"# Two default jobs at once, {date}\n\n`{cmd}` ({cores} cores, alone on the machine; "
            f"rounds alternate solo and pair)\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
