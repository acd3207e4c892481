"""`scalerl continual ROOT --watch DIR`: a policy that keeps learning from new data, validated and rolled back.

    a new JSONL file of tasks in DIR (sorted by name; each one once)
      → online evaluation: the current policy's greedy pass rate on the new tasks       (event continual_new_data)
      → incremental RL: a segment of continual.steps_per_batch steps of the run's recipe on them (a normal run
        in ROOT/segments/NNNN, env.args[continual.data_arg] = the file), from the current policy; with
        replay.kind set, its buffer carries over from the segment before (replay.init_from)
      → validation, once continual.validate_every_s seconds (8 hours) or validate_every_steps steps have passed
        since the last: the pass rate on the environment's held-out set, and KL(current ‖ validated) on its
        prompts (completions sampled from the current policy; the mean over them of Σ_t log π_cur − log π_val)
          KL > continual.max_kl (1.2) or pass rate < validated − max_regression: roll back, the current policy
          becomes the validated one again                                            (event continual_rollback)
          otherwise the current policy is the new validated one                       (event continual_validated)

ROOT/continual.json (rewritten atomically after each file) holds the files done, the current and the
validated policy (checkpoint folders) with the validated pass rate, and the clocks; a stopped loop goes
on from it. Events go to ROOT/events.jsonl.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from scalerl.config import Config, dump_config, load_config
from scalerl.errors import ScaleRLError
from scalerl.monitor.events import Event, EventLog
from scalerl.files import write_atomically

STATE_FILE = "continual.json"


@dataclass
class ContinualState:
    current: str  # the policy new data trains from: model.path at first, then a segment's final checkpoint
    validated: str  # the last validated policy (what a rollback returns to)
    validated_pass_rate: float
    files: list[str] = field(default_factory=list)  # the data files done, in order
    segments: int = 0
    steps_since_validation: int = 0
    validated_at: float = field(default_factory=time.time)
    total_steps: int = 0


def _save_state(root: Path, state: ContinualState) -> None:
    write_atomically(root / STATE_FILE, json.dumps(asdict(state), indent=1))


def _policy(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(path).eval(), tokenizer


def score(config: Config, path: str, env_args: dict[str, Any], tasks: str = "eval") -> float:
    """Greedy pass rate of the policy at `path` on the environment's `tasks` ('eval' or 'train') with `env_args`."""
    from scalerl.envs.registry import build_env
    from scalerl.rollout.hf import HFSampler
    from scalerl.rollout.evaluation import task_scores
    from scalerl.types import SamplingParams

    env = build_env(config.env.name, env_args)
    chosen = (env.eval_tasks() if tasks == "eval" else env.train_tasks())[: config.eval.max_tasks]
    model, tokenizer = _policy(path)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    params = SamplingParams(max_new_tokens=config.eval.max_new_tokens or config.rollout.max_new_tokens, temperature=0.0)
    return float(task_scores(env, chosen, sampler, tokenizer, params, None, batch_size=config.eval.batch_size).mean())


@torch.no_grad()
def sequence_kl(config: Config, current: str, baseline: str, seed: int) -> float:
    """Mean over completions sampled from `current` on the held-out prompts of Σ_t (log π_cur − log π_base)."""
    from scalerl.models.logprobs import CompletionModel
    from scalerl.envs.registry import build_env
    from scalerl.rollout.hf import HFSampler
    from scalerl.types import SamplingParams, derive_seed

    env = build_env(config.env.name, config.env.args)
    tasks = env.eval_tasks()[: config.eval.max_tasks]
    model, tokenizer = _policy(current)
    base, _ = _policy(baseline)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    prompts = [tokenizer(t.prompt)["input_ids"] for t in tasks]
    params = SamplingParams(max_new_tokens=config.rollout.max_new_tokens, temperature=1.0)
    rollout = sampler.sample(prompts, params, seeds=[derive_seed(seed, "continual-kl", i) for i in range(len(tasks))])
    mask = rollout.completion_mask.float()
    cur = CompletionModel(model)(rollout).logprobs
    ref = CompletionModel(base)(rollout).logprobs
    return float(((cur - ref) * mask).sum(1).mean())


class Continual:
    """The loop of the module docstring over one ROOT folder; `process(file)` handles one new data file."""

    def __init__(self, root: Path, config: Config, printer: Callable[[str], None] = print):
        self.root, self.config, self.printer = root, config, printer
        root.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(root, write=True, printer=printer)
        if (root / STATE_FILE).is_file():
            self.state = ContinualState(**json.loads((root / STATE_FILE).read_text()))
        else:
            start = config.model.path if config.model.path != "builtin" else _builtin_path()
            self.state = ContinualState(current=start, validated=start, validated_pass_rate=score(config, start, config.env.args))
            (root / "config.yaml").write_text(dump_config(config))
            _save_state(root, self.state)
            self._event("continual_start", "info", f"validated baseline {start}: held-out pass rate {self.state.validated_pass_rate:.3f}")

    def _event(self, rule: str, severity: str, message: str, **values: Any) -> None:
        self.events.emit(Event(step=self.state.total_steps, rule=rule, severity=severity, message=message, values=values))

    def pending(self, folder: Path) -> list[Path]:
        return [p for p in sorted(folder.glob("*.jsonl")) if str(p.resolve()) not in self.state.files]

    def process(self, data: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate on, train on and (when due) validate after one new data file; returns what happened."""
        from scalerl.trainer.loop import train

        cfg, st = self.config, self.state
        data_args = {**cfg.env.args, cfg.continual.data_arg: str(data.resolve())}
        online = score(cfg, st.current, data_args, tasks="train")
        self._event("continual_new_data", "info", f"{data.name}: the current policy passes {online:.3f} of its tasks", pass_rate=online)
        st.segments += 1
        name = f"{st.segments:04d}"
        previous = Path(st.current)
        replay = {"replay.init_from": str(previous / "replay_rank0")} if cfg.replay.kind != "none" and (previous / "replay_rank0").is_dir() else {}
        seg = load_config(self.root / "config.yaml", overrides={
            "model.path": st.current, "env.args": data_args, "train.steps": cfg.continual.steps_per_batch,
            "log.run_dir": str(self.root / "segments"), "log.name": name, "checkpoint.save_final": True, **replay, **(overrides or {})})
        summary = train(seg)
        st.current = str(max((self.root / "segments" / name / "checkpoints").glob("step_*")))
        st.total_steps += seg.train.steps
        st.steps_since_validation += seg.train.steps
        st.files.append(str(data.resolve()))
        result = {"file": str(data), "online_pass_rate": online, "segment": name, "pass_rate_after": summary["pass_rate_after"]}
        if self._validation_due():
            result.update(self.validate())
        _save_state(self.root, st)
        return result

    def _validation_due(self) -> bool:
        c, st = self.config.continual, self.state
        by_steps = c.validate_every_steps is not None and st.steps_since_validation >= c.validate_every_steps
        return by_steps or time.time() - st.validated_at >= c.validate_every_s

    def validate(self) -> dict[str, Any]:
        """Pass rate and KL against the validated policy; roll back or promote (see the module docstring)."""
        cfg, st, c = self.config, self.state, self.config.continual
        rate = score(cfg, st.current, cfg.env.args)
        kl = sequence_kl(cfg, st.current, st.validated, cfg.train.seed + st.segments)
        st.steps_since_validation, st.validated_at = 0, time.time()
        values = {"pass_rate": rate, "validated_pass_rate": st.validated_pass_rate, "kl": kl}
        if kl > c.max_kl or rate < st.validated_pass_rate - c.max_regression:
            why = (f"KL {kl:.3f} from the validated policy > {c.max_kl}" if kl > c.max_kl else
                   f"held-out pass rate {rate:.3f} < validated {st.validated_pass_rate:.3f} - {c.max_regression}")
            self._event("continual_rollback", "warning", f"{why}; back to {st.validated}", action="rollback", **values)
            st.current = st.validated
            return {"validation": "rollback", **values}
        st.validated, st.validated_pass_rate = st.current, rate
        self._event("continual_validated", "info", f"held-out pass rate {rate:.3f}, KL {kl:.3f}: {st.current} validated", **values)
        return {"validation": "validated", **values}

    def close(self) -> None:
        self.events.close()


def _builtin_path() -> str:
    from scalerl.models.paths import resolve_model_path

    return resolve_model_path("builtin")


def run_continual(root: Path, config: Config, watch: Path, *, once: bool, poll_s: float, printer: Callable[[str], None] = print) -> None:
    """Process every new file in `watch`, then (unless `once`) poll for more every `poll_s` seconds."""
    if not watch.is_dir():
        raise ScaleRLError(f"--watch {watch} is not a folder; give the folder new JSONL data files arrive in")
    loop = Continual(root, config, printer)
    try:
        while True:
            for path in loop.pending(watch):
                printer(json.dumps(loop.process(path)))
            if once:
                return
            time.sleep(poll_s)
    finally:
        loop.close()
