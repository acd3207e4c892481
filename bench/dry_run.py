"""How long `scalerl train --dry-run` takes to answer, for the failures it is meant to catch in seconds.

    python bench/dry_run.py --repeats 3 --save

Each case runs the real console command in a fresh process (`python -P -m scalerl.cli.main train --dry-run ...`,
HF_HUB_OFFLINE=1, OMP_NUM_THREADS=1) from a scratch folder; wall seconds from process start to exit, medians of
`--repeats`. Saved to bench/results/dry_run_<date>.json.
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

ROOT = Path(__file__).resolve().parents[1]
ROWS = "".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(30))


def cases(folder: Path) -> dict[str, list[str]]:
    (folder / "bad.jsonl").write_text(ROWS + '{"prompt": "1+1=", "answer": \n')
    (folder / "nocol.jsonl").write_text('{"question": "1+1="}\n' * 70)
    (folder / "broken.py").write_text("import no_such_package_here\n")
    return {
        "the default job (passes)": [],
        "a bad JSONL row": ["--set", f"env.args.data_file={folder / 'bad.jsonl'}"],
        "a missing column": ["--set", "env.name=math", "--set", f"env.args.data_file={folder / 'nocol.jsonl'}",
                             "--set", "env.args.eval_size=5"],
        "an unreachable model id": ["--set", "model.path=nobody/no-such-model"],
        "a broken reward module": ["--set", "reward.components=[{name: mine, function: 'broken:score'}]"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        rows = []
        for name, extra in cases(folder).items():
            times, codes = [], set()
            for _ in range(args.repeats):
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, "-P", "-m", "scalerl.cli.main", "train", "--dry-run",
                                       "--set", f"log.run_dir={folder / 'runs'}", *extra],
                                      capture_output=True, text=True, env=env, cwd=folder, check=False)
                times.append(time.perf_counter() - start)
                codes.add(proc.returncode)
            line = proc.stderr.strip().splitlines()[-1] if proc.returncode else ""
            rows.append({"case": name, "median_s": round(statistics.median(times), 2), "runs_s": [round(t, 2) for t in times],
                         "exit": sorted(codes), "line": line})
            print(f"{name:28s} {rows[-1]['median_s']:5.2f} s  exit {sorted(codes)}  {line[:110]}")
    if args.save:
        out = ROOT / "bench" / "results" / f"dry_run_{datetime.date.today()}.json"
        out.write_text(json.dumps({"command": "python bench/dry_run.py --repeats %d --save" % args.repeats,
                                   "cpu": os.uname().machine, "rows": rows}, indent=1) + "\n")
        print(out)


if __name__ == "__main__":
    main()
