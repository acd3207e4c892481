"""How close is `scalerl plan`? Short pilots predict bigger runs, measured on this machine.

Cases (`--cases`, all by default), each a plan from pilot runs against the run it predicts, run here:
- size: pilots at two small sizes of the W2-shaped Llama (W2: hidden 512, 8 layers, MLP 3 × hidden,
  64 hidden units per layer; pilots hidden 128 / 2 layers and 192 / 3: 0.44M and 1.44M parameters)
  predict the mean step time of hidden 320 / 5 layers (6.7M, 4.6× the larger pilot) and W2 itself
  (27.3M, 19×); target ±10 %. The pilots differ in width: depth alone cannot tell a per-layer cost
  from a per-parameter one (scalerl/predict/step_cost.py);
- world: a 1-process pilot predicts `--nproc 2` under DDP and FSDP2 (gloo), the collective's
  bandwidth measured here by a 2-process gloo all-reduce of the gradients' size; target ±15 %;
- length: a pilot at 8 new tokens predicts 64; target ±15 %;
- total: a pilot of --total-pilot-steps (30) predicts the total wall time of a --total-steps (300)
  run of the same shape before it starts; target ±7 %.
In the size, length and total cases the (larger) pilot is run again after the runs it predicts, and
the change of its mean step time is the machine's drift over the case, printed beside the error.
Every run: `scalerl train` in a subprocess, random-init Llamas on the built-in character tokenizer,
GRPO β 0, --prompts × --group completions of exactly N new tokens (min_new_tokens = max_new_tokens),
precision.mode auto (the machine's choice, in each run's resolved.yaml), --threads torch threads (OMP_NUM_THREADS the
same), evaluation only at the end (8 tasks), no checkpoint. Each plan is made as `scalerl plan` makes it (the target's
rollout and update probed on this machine, calibrated by the pilots: scalerl/jobs/probe.py) and, for comparison,
from the terms fitted on the pilots alone (`--no-probe`). Measured step time: the mean logged interval per step after 2 warm-up steps (what the
plan predicts); error = (predicted − measured) / measured. Seeds: --seeds (pilot and target seeded alike).

    python bench/plan_accuracy.py --seeds 3 --save                                  # the full run
    python bench/plan_accuracy.py --cases length,size --pilot-steps 20 --target-steps 8 --seeds 1 --save   # short
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
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"

from scalerl.jobs.plan import plan_from_pilots  # noqa: E402
from scalerl.predict.memory import shape_of_model_path  # noqa: E402
from scalerl.predict.pilot import read_pilot  # noqa: E402

SIZES = {"0.44M": (128, 2), "1.44M": (192, 3), "6.7M (4.6x)": (320, 5), "27.3M (19x, W2)": (512, 8)}  # hidden, layers; MLP 3 × hidden
TARGETS = {"size": (10.0,), "world": (15.0,), "length": (15.0,), "total": (7.0,)}


def build(folder: Path, hidden: int, layers: int) -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from scalerl.models.paths import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def train(args, runs: Path, name: str, model: Path, steps: int, length: int, seed: int, nproc: int = 1, strategy: str = "ddp") -> Path:
    over = {"model.path": model, "rollout.prompts_per_step": args.prompts, "rollout.group_size": args.group,
            "rollout.max_new_tokens": length, "rollout.min_new_tokens": length, "algorithm.kl.beta": 0.0, "train.threads": args.threads,
            "train.steps": steps, "train.seed": seed, "eval.every": 0, "eval.max_tasks": 8, "checkpoint.save_final": False,
            "parallel.strategy": strategy, "log.run_dir": runs, "log.name": name, "log.console": "none", "log.tensorboard": False}
    cmd = [sys.executable, "-m", "scalerl.cli.main", "train", "--overwrite", *(a for k, v in over.items() for a in ("--set", f"{k}={v}")),
           *(["--nproc", str(nproc)] if nproc > 1 else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{name}: {out.stderr.strip()[-2000:]}")
    return runs / name


def measured_step(run: Path) -> float:
    return float(read_pilot(run).step_s.mean())


def gloo_bandwidth(params: int) -> float:
    """GB/s per process of a 2-process gloo all-reduce of `params` float32 values (ring: 2·(w−1)/w·n bytes sent)."""
    code = f"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones({params})
for _ in range(2): dist.all_reduce(x)
t = time.perf_counter()
for _ in range(5): dist.all_reduce(x)
dt = (time.perf_counter() - t) / 5
if dist.get_rank() == 0: print(2 * 0.5 * x.numel() * 4 / dt / 1e9)
dist.destroy_process_group()
"""
    script = Path(tempfile.mkdtemp()) / "bw.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return float(out.stdout.strip().splitlines()[-1])


def plan(pilots: list[Path], folder: Path, name: str, **options) -> tuple[dict, dict]:
    """The plan as `scalerl plan` makes it (the target probed on this machine, calibrated by the pilots), and the plan
    from the terms fitted on the pilots alone (`--no-probe`), for comparison."""
    common = {"model": shape_of_model_path(str(folder)), "model_name": name, "model_config": json.loads((folder / "config.json").read_text())}
    return plan_from_pilots(pilots, **common, **options), plan_from_pilots(pilots, **common, probe=False, **options)


def row(case: str, seed: int, what: str, plans: tuple[dict, dict], actual: float, key: str = "step_s", **extra) -> dict:
    probed, fitted = plans
    err = (probed[key] - actual) / actual
    lo, hi = probed["band"][key]
    return {"case": case, "seed": seed, "what": what, "predicted": probed[key], "measured": actual, "error": err,
            "band": [lo, hi], "inside_band": lo <= actual <= hi, "dominant": probed["dominant"], "probe": probed.get("probe"),
            "fit_only_predicted": fitted[key], "fit_only_error": (fitted[key] - actual) / actual, **extra}


def case_size(args, runs, models, seed):
    """Pilots, the targets, the pilots again: with --bracket the plan pools both passes of the pilots, so that a machine
    whose speed drifts over the case is priced at its mean (the prediction is then made after the targets ran)."""
    def pilots(tag):
        return [train(args, runs, f"size_pilot_{n}_{tag}_s{seed}", models[n][0], args.pilot_steps, args.length, seed) for n in ("0.44M", "1.44M")]

    before = [run for k in range(args.pilot_repeats) for run in pilots(f"before{k}")]  # each size N times, alternated, pooled
    targets = {name: train(args, runs, f"size_target_{models[name][1]}_s{seed}", models[name][0], args.target_steps, args.length, seed)
               for name in ("6.7M (4.6x)", "27.3M (19x, W2)")}
    after = pilots("after")
    drift = measured_step(after[1]) / measured_step(before[-1]) - 1
    out = []
    for name, target in targets.items():
        plans = plan(before + after if args.bracket else before, models[name][0], name, gpus=1, steps=args.target_steps)
        out.append(row("size", seed, name, plans, measured_step(target), machine_drift=drift, pilots_pooled="before+after" if args.bracket else "before"))
    return out


def case_world(args, runs, models, seed):
    folder, params = models["1.44M"]
    pilot = train(args, runs, f"world_pilot_s{seed}", folder, args.pilot_steps, args.length, seed)
    bw = gloo_bandwidth(params)
    out = []
    for strategy in ("ddp", "fsdp2"):
        plans = plan([pilot], folder, "1.44M", gpus=2, strategy=strategy, bandwidth_gbs=bw)
        target = train(args, runs, f"world_{strategy}_s{seed}", folder, args.target_steps, args.length, seed, nproc=2, strategy=strategy)
        out.append(row("world", seed, f"--nproc 2 {strategy}", plans, measured_step(target), bandwidth_gbs=bw))
    return out


def case_length(args, runs, models, seed):
    folder, params = models["1.44M"]
    pilot = train(args, runs, f"length_pilot_s{seed}", folder, args.pilot_steps, 8, seed)
    plans = plan([pilot], folder, "1.44M", gpus=1, completion_length=64, steps=args.target_steps)
    target = train(args, runs, f"length_target_s{seed}", folder, args.target_steps, 64, seed)
    again = train(args, runs, f"length_pilot_again_s{seed}", folder, args.pilot_steps, 8, seed)
    if args.bracket:
        plans = plan([pilot, again], folder, "1.44M", gpus=1, completion_length=64, steps=args.target_steps)
    return [row("length", seed, "8 -> 64 new tokens", plans, measured_step(target), machine_drift=measured_step(again) / measured_step(pilot) - 1,
                pilots_pooled="before+after" if args.bracket else "before")]


def case_total(args, runs, models, seed):
    folder, params = models["1.44M"]
    pilot = train(args, runs, f"total_pilot_s{seed}", folder, args.total_pilot_steps, args.length, seed)
    plans = plan([pilot], folder, "1.44M", gpus=1, steps=args.total_steps)
    long_run = train(args, runs, f"total_run_s{seed}", folder, args.total_steps, args.length, seed)
    again = train(args, runs, f"total_pilot_again_s{seed}", folder, args.total_pilot_steps, args.length, seed)
    actual = json.loads((long_run / "summary.json").read_text())["wall_time_s"]
    drift = measured_step(again) / measured_step(pilot) - 1
    return [row("total", seed, f"{args.total_steps}-step total from {args.total_pilot_steps} steps", plans, actual, key="total_s",
                machine_drift=drift)]


CASES = {"size": case_size, "world": case_world, "length": case_length, "total": case_total}


def markdown(report: dict) -> str:
    lines = [f"# `scalerl plan` accuracy, {report['date']}", "", f"`{report['command']}`", "", report["conditions"], "",
             "| case | seed | predicted run | predicted | measured | error | band | inside | target | dominant term | fit only (--no-probe) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        extra = f" (machine drift {r['machine_drift']:+.1%})" if "machine_drift" in r else ""
        lines.append(f"| {r['case']} | {r['seed']} | {r['what']} | {r['predicted']:.3f} s | {r['measured']:.3f} s | {r['error']:+.1%}{extra} | "
                     f"{r['band'][0]:.3f}-{r['band'][1]:.3f} | {'yes' if r['inside_band'] else 'no'} | ±{TARGETS[r['case']][0]:g} % | {r['dominant']} | "
                     f"{r['fit_only_predicted']:.3f} s ({r['fit_only_error']:+.1%}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="size,world,length,total")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pilot-steps", type=int, default=60)
    ap.add_argument("--target-steps", type=int, default=12)
    ap.add_argument("--total-pilot-steps", type=int, default=30)
    ap.add_argument("--total-steps", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pilot-repeats", type=int, default=1, help="size: run the two pilots this many times (alternated, before the "
                                                                   "targets) and plan from all of them")
    ap.add_argument("--bracket", action="store_true", help="size, length: fit on the pilots run before and after the targets "
                                                          "(a shared machine's drift averaged; the plan is then not made before the runs)")
    ap.add_argument("--conditions", default="alone on the machine", help="How the machine was loaded (written beside the figures).")
    ap.add_argument("--tag", default="", help="suffix of the results files (plan_accuracy_<date><tag>.md)")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for name, (hidden, layers) in SIZES.items():
            folder = Path(tmp) / f"model_{hidden}_{layers}"
            models[name] = (folder, build(folder, hidden, layers))
        runs = Path(tmp) / "runs"
        for seed in range(args.seeds):
            for case in args.cases.split(","):
                for r in CASES[case](args, runs, models, seed):
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    date = datetime.date.today().isoformat()
    cmd = "python bench/plan_accuracy.py " + " ".join(sys.argv[1:])
    report = {"date": date, "command": cmd, "conditions": f"{args.threads} torch thread(s) per process; {args.conditions}; "
              f"{time.perf_counter() - start:.0f} s in all", "args": vars(args), "rows": rows}
    print(markdown(report))
    if args.save:
        (RESULTS / f"plan_accuracy_{date}{args.tag}.json").write_text(json.dumps(report, indent=1))
        (RESULTS / f"plan_accuracy_{date}{args.tag}.md").write_text(markdown(report))


if __name__ == "__main__":
    main()
