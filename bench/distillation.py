"""On-policy distillation against GRPO, from the same start, on the default job (issue 37).

The teacher is the default job's own trained checkpoint: `scalerl train` with the embedded default
(300 steps, seed 0), trained here first (or `--teacher FOLDER` reuses one). Then, for each seed, the
same default job from the same built-in start is trained twice, evaluating the held-out greedy pass
rate every `--eval-every` steps:

    grpo     the default job as it is (the task reward's group-relative advantage)
    distill  the default job with algorithm.distill_teacher=<teacher>: the per-token advantage
             log π_teacher − log π_student on the student's own samples, no task reward

    distill+task  (`--configs`) the same plus the task reward's advantage (algorithm.distill_task_coef 1)

The criterion: the first evaluated step at which a run reaches >= `--fraction` (0.9) of the teacher's
held-out pass rate, and the first at which the mean of the last 3 evaluations does (one greedy
evaluation of 200 tasks varies by about ±0.035); distillation should get there in fewer steps than
GRPO. `--save` writes bench/results/<--save-as>_<date>.{json,md}.

    python bench/distillation.py --seeds 0 1 2 --steps 300 --eval-every 10 --threads 1 --save
    python bench/distillation.py --configs distill+task --teacher RUN/checkpoints/step_0000300 --teacher-pass-rate 0.725 \
        --save --save-as distillation_task
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(name: str, overrides: dict, tmp: Path, threads: int) -> dict:
    """One default job with `overrides`; its summary and the pass-rate curve [(step, pass rate)]."""
    from scalerl.config import load_config
    from scalerl.jsonl import read_metrics
    from scalerl.trainer.loop import train as run

    config = load_config(overrides={"train.threads": threads, "log.run_dir": str(tmp), "log.name": name, "log.console": "none",
                                    "checkpoint.save_final": False, **overrides})
    summary = run(config)
    rows = read_metrics(Path(summary["run_dir"]))
    curve = [(0, summary["pass_rate_before"])] + [(r["step"], r["eval/pass_rate"]) for r in rows if "eval/pass_rate" in r]
    return {"summary": summary, "curve": curve}


def train_teacher(tmp: Path, threads: int) -> tuple[Path, float]:
    """The default job (seed 0, 300 steps) with its final checkpoint: (its Hugging Face folder, its held-out pass rate)."""
    from scalerl.config import load_config
    from scalerl.trainer.loop import train as run

    config = load_config(overrides={"train.threads": threads, "log.run_dir": str(tmp), "log.name": "teacher", "log.console": "none"})
    summary = run(config)
    [folder] = sorted((Path(summary["run_dir"]) / "checkpoints").glob("step_*"))
    return folder, summary["pass_rate_after"]


def steps_to(curve: list, target: float, window: int = 1) -> int | None:
    """The first evaluated step at which the mean pass rate of the last `window` evaluations is >= target; None if none is."""
    rates = [rate for _, rate in curve]
    return next((curve[i][0] for i in range(window - 1, len(curve)) if sum(rates[i - window + 1: i + 1]) / window >= target), None)


def table(report: dict) -> str:
    """Per run: the pass rate after, the first step at >= target (one evaluation; and the mean of the last 3, which
    one lucky greedy evaluation of 200 tasks cannot reach alone), the wall time; then the medians per configuration."""
    target = report["target_pass_rate"]
    lines = [f"| run | seed | pass rate after | first step >= {target:.3f} | first step, mean of 3 evals >= {target:.3f} | wall time |",
             "|---|---|---|---|---|---|"]

    def shown(step):
        return step if step is not None else "not reached"

    for r in report["runs"]:
        lines.append(f"| {r['config']} | {r['seed']} | {r['pass_rate_after']:.3f} | {shown(steps_to(r['curve'], target))} | "
                     f"{shown(steps_to(r['curve'], target, 3))} | {r['wall_time_s']:.0f} s |")
    for name in dict.fromkeys(r["config"] for r in report["runs"]):
        rows = [r for r in report["runs"] if r["config"] == name]
        medians = []
        for window in (1, 3):
            reached = [steps_to(r["curve"], target, window) for r in rows]
            medians.append(statistics.median(reached) if None not in reached else "–")
        lines.append(f"| **{name}, median** | | {statistics.median(r['pass_rate_after'] for r in rows):.3f} | {medians[0]} | {medians[1]} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--teacher", type=Path, default=None, help="a trained default job's checkpoint folder (default: train one first)")
    ap.add_argument("--teacher-pass-rate", type=float, default=None, help="with --teacher: its held-out pass rate")
    ap.add_argument("--configs", nargs="+", default=["grpo", "distill"], choices=["grpo", "distill", "distill+task"],
                    help="distill+task: the distillation advantage plus the task reward's (distill_task_coef 1)")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--save-as", default="distillation", help="--save writes bench/results/<this>_<date>.{json,md}")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.teacher is None:
            teacher, teacher_rate = train_teacher(Path(tmp), args.threads)
        else:
            teacher, teacher_rate = args.teacher, args.teacher_pass_rate
        target = args.fraction * teacher_rate
        print(json.dumps({"teacher": str(teacher), "teacher_pass_rate": teacher_rate, "target": target}), flush=True)
        configs = {"grpo": {}, "distill": {"algorithm.distill_teacher": str(teacher)},
                   "distill+task": {"algorithm.distill_teacher": str(teacher), "algorithm.distill_task_coef": 1.0}}
        for seed in args.seeds:  # seeds outermost, so a slow spell of the machine hits both alike
            for name in args.configs:
                overrides = configs[name]
                out = train(f"{name}-s{seed}", {**overrides, "train.seed": seed, "train.steps": args.steps, "eval.every": args.eval_every},
                            Path(tmp), args.threads)
                s = out["summary"]
                row = {"config": name, "seed": seed, "steps": args.steps, "pass_rate_before": s["pass_rate_before"],
                       "pass_rate_after": s["pass_rate_after"], "steps_to_target": steps_to(out["curve"], target),
                       "steps_to_target_mean3": steps_to(out["curve"], target, 3),
                       "wall_time_s": round(s["wall_time_s"], 1), "curve": out["curve"]}
                runs.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    report = {"date": datetime.date.today().isoformat(), "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "teacher": "the default job (scalerl train, seed 0, 300 steps), final checkpoint", "teacher_pass_rate": teacher_rate,
              "target_pass_rate": target, "runs": runs}
    print(table(report))
    if args.save:
        out = ROOT / "bench" / "results" / f"{args.save_as}_{report['date']}"
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(
            f"# On-policy distillation vs GRPO from the same start ({report['date']})\n\n"
            f"`python bench/distillation.py --seeds {' '.join(map(str, args.seeds))} --steps {args.steps} "
            f"--eval-every {args.eval_every} --threads {args.threads} --configs {' '.join(args.configs)}"
            f"{'' if args.teacher is None else f' --teacher FOLDER --teacher-pass-rate {teacher_rate}'} --save`\n\n"
            f"Teacher: {report['teacher']}, held-out greedy pass rate {teacher_rate:.3f}; target {args.fraction:.0%} of it = "
            f"{target:.3f}. Student: the built-in start, as GRPO's.\n\n{table(report)}\n")
        print(f"wrote {out}.{{json,md}}", file=sys.stderr)


if __name__ == "__main__":
    main()
