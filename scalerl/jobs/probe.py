"""Time a step's heavy parts at a given shape on this machine: what `scalerl plan` prices a target with.

The probe itself (`run_probe`: the model built from its config with random weights, the HF sampler's decode and the
learner's update, timed after a warm-up) lives in scalerl/trainer/step_probe.py, where precision.mode=auto uses it too;
this module runs it in one process or several.

It runs with the run's own code (`build_learner`, `HFSampler`, the strategy's wrapping and gathers). With `world` > 1
the probe runs as that many processes on this machine (torchrun; gloo on CPU, NCCL on GPUs), each with its
share of the run, so the strategy's collectives and the processes' contention for the machine are in the
times. Everything that depends on the shape in ways a pilot at another shape cannot show (the FLOP/s a matmul
of that width reaches, weights that no longer fit the caches, per-layer and per-collective overheads) is
thereby measured, not extrapolated; this is how auto-parallel planners cost a model before running it
(Alpa, Zheng et al. 2022; Galvatron, Miao et al. 2022, profile each layer on the device). What a probe does
not do (environments, rewards, logging, the trainer's loop) the pilots calibrate (scalerl/jobs/plan.py).

    python -m torch.distributed.run --standalone --nproc_per_node W -m scalerl.jobs.probe SPEC.json OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from scalerl.errors import ScaleRLError
from scalerl.trainer.step_probe import ProbeResult, ProbeSpec, run_probe

__all__ = ["ProbeResult", "ProbeSpec", "probe", "probe_alternated", "run_probe"]


def probe(spec: ProbeSpec, repeats: int = 3) -> ProbeResult:
    """`run_probe` here (one process) or in `spec.world` processes started by torchrun (rank 0's times)."""
    if spec.world == 1:
        try:
            return run_probe(spec, repeats)
        except ScaleRLError:
            raise
        except Exception as err:  # a model transformers cannot build from its config, out of memory, ...
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ScaleRLError(f"plan: the probe of a {spec.model.get('model_type', '?')} model failed ({first}); run with --no-probe to "
                               "price from the pilots alone") from err
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_file.write_text(json.dumps({**asdict(spec), "repeats": repeats}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(spec.world),
               "-m", "scalerl.jobs.probe", str(spec_file), str(out_file)]
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        if out.returncode != 0 or not out_file.is_file():
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise ScaleRLError(f"plan: the {spec.world}-process probe failed ({tail}); run with --no-probe to price from the pilots alone")
        times = json.loads(out_file.read_text())
    return ProbeResult(tuple(times["rollout_s"]), tuple(times["learn_s"]), times["sampled"], times["trained"])


def probe_alternated(specs: list[ProbeSpec], *, repeats: int = 3, rounds: int = 2) -> list[ProbeResult]:
    """Each distinct spec probed `rounds` times, the specs taken in turn (so that a machine's drift spreads over
    all of them), every round's timings pooled per spec."""
    distinct = {s.key(): s for s in specs}
    pooled: dict[str, list[ProbeResult]] = {k: [] for k in distinct}
    for _ in range(rounds):
        for key, spec in distinct.items():
            pooled[key].append(probe(spec, repeats))
    merged = {k: ProbeResult(tuple(x for r in v for x in r.rollout_s), tuple(x for r in v for x in r.learn_s), v[-1].sampled, v[-1].trained)
              for k, v in pooled.items()}
    return [merged[s.key()] for s in specs]


def main(argv: list[str]) -> None:
    spec_file, out_file = Path(argv[0]), Path(argv[1])
    raw = json.loads(spec_file.read_text())
    repeats = raw.pop("repeats")
    result = run_probe(ProbeSpec(**raw), repeats)
    if int(os.environ.get("RANK", "0")) == 0:
        out_file.write_text(json.dumps({"rollout_s": result.rollout_s, "learn_s": result.learn_s, "sampled": result.sampled,
                                        "trained": result.trained}))


if __name__ == "__main__":
    main(sys.argv[1:])
