"""The reward of a step from several components: score each, contain failures, fuse, report.

    inputs → component k scores s_k (B,) → non-finite / failed entries := fallback_k (counted)
           → weights (configured, or `fusion.dynamic_weights`) → r = Σ_k w_k s_k (B,)
             (with normalize_components: s_k standardised within each group first, GDPO)

Failure containment: a component that raises, overruns its timeout, dies, returns a wrong-length
list or a non-list gives every completion of the batch its `fallback`; a None, NaN, ±inf or
non-number entry gives that completion the fallback. Nothing is raised to the trainer. Each step
reports `reward/<name>_failures` (completions that got the fallback); the first failure of each
kind per component is logged with its traceback or message (logging.warning), later ones are only
counted. Reward-model and environment components are not contained: an exception there is a bug
of the run, not of user code, and stops it.

Metrics per step: `reward/<name>_mean` (the component's mean score after fallbacks),
`reward/<name>_failures`, `reward/weight/<name>` (the weight it had in the fusion), and for a
function component `reward/<name>_restarts` (its worker processes replaced since the previous
step: a timeout, a death during a call, which also shows in the failures, or a death between
calls, which loses no scores) and `reward/<name>_hangs` (1 when its worker answered nothing within
`timeout_s` this step and was replaced: the health guard reports it as a `hang` event).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from scalerl.rewards.components import Component, RewardInputs
from scalerl.rewards.failures import first_line
from scalerl.rewards.fusion import (
    DynamicState,
    dynamic_weights,
    group_spread,
    normalize_within_groups,
    weighted_sum,
)
from scalerl.rewards.safe_call import RewardCallError
from scalerl.rewards.sources import PYTHON, in_process

if TYPE_CHECKING:
    from scalerl.config import RewardConfig

log = logging.getLogger(__name__)


class RewardScorer:
    """K components and their fusion; `score` for training steps, `evaluate` for held-out scoring."""

    def __init__(self, components: list[Component], *, weights: list[float], fallbacks: list[float], fusion: str,
                 group_size: int, ceilings: list[float | None] | None = None, floors: list[float | None] | None = None,
                 eps: float = 0.05, mean_ema: float = 0.1, weight_ema: float = 0.0, normalize_components: bool = False):
        if fusion not in ("weighted_sum", "dynamic_weight"):
            raise ValueError(f"unknown fusion {fusion!r}; use weighted_sum or dynamic_weight")
        k = len(components)
        self.components, self.fusion, self.group_size = components, fusion, group_size
        self.base = torch.tensor(weights, dtype=torch.float64)  # (K,)
        self.fallbacks = fallbacks
        nan = float("nan")
        self.ceiling = torch.tensor([nan if c is None else c for c in (ceilings or [None] * k)], dtype=torch.float64)
        self.floor = torch.tensor([nan if f is None else f for f in (floors or [None] * k)], dtype=torch.float64)
        self.eps, self.mean_ema, self.weight_ema = eps, mean_ema, weight_ema
        self.normalize_components = normalize_components  # GDPO: each component standardised within its group before the sum
        self.state: DynamicState | None = None
        self._reported: set[tuple[str, str]] = set()
        self._restarts_seen = [getattr(c, "restarts", None) for c in components]  # None: no worker process
        self.hangs = [0.0] * k  # per component: its worker answered nothing within timeout_s in the last call
        self.last_scores: dict[str, torch.Tensor] = {}  # name -> (B,) scores of the last step, for sample dumps
        self.first_failure: dict[str, str] = {}  # name -> its first failure in one line (scalerl/rewards/failures.py)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def _warn_once(self, comp: Component, kind: str, message: str, fallback: float) -> None:
        if (comp.name, kind) in self._reported:
            return
        self._reported.add((comp.name, kind))
        log.warning("reward component '%s' (%s) failed [%s]; affected completions get the fallback %g "
                    "(reported once per kind, counted in reward/%s_failures):\n%s",
                    comp.name, comp.source, kind, fallback, comp.name, message)

    def submit(self, inputs: RewardInputs) -> None:
        """Start every function component's call in its worker process, so that they run at the same
        time as each other and as whatever the caller does next (the environment's scoring);
        `score` collects them. `inputs.env_scores` is not needed yet."""
        for comp in self.components:
            comp.submit(inputs)

    def component_scores(self, inputs: RewardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores (K, B) float32 with failures replaced by the fallback, failures (K,) counts)."""
        b = len(inputs.completions)
        rows, failures = [], []
        self.hangs = [0.0] * len(self.components)
        for k, (comp, fallback) in enumerate(zip(self.components, self.fallbacks)):
            whole_call_failed = False
            try:
                raw = comp.score(inputs)
            except RewardCallError as err:  # user code failed as a whole: contained, counted, reported once
                self._warn_once(comp, err.kind, err.message, fallback)
                self.hangs[k] = float(err.kind == "timeout")
                self.first_failure.setdefault(comp.name, f"{err.kind}: {first_line(err.message)}")
                raw, whole_call_failed = torch.full((b,), float("nan")), True
            bad = ~torch.isfinite(raw)  # (B,)
            if bad.any() and not whole_call_failed:
                i = int(bad.nonzero()[0])
                what = (f"{comp.source} returned {int(bad.sum())} None/NaN/inf or non-number scores among {b}, the first for "
                        f"item {i} (completion {inputs.completions[i][:60]!r})")
                self._warn_once(comp, "invalid", what, fallback)
                self.first_failure.setdefault(comp.name, what)
            rows.append(torch.where(bad, torch.full_like(raw, fallback), raw))
            failures.append(float(bad.sum()))
        return torch.stack(rows), torch.tensor(failures, dtype=torch.float64)

    def weights(self, scores: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """(K,) this step's weights; dynamic_weight updates the running state from the step's
        statistics, summed over ranks first (`ctx.sum`, `ctx.gather_lists`) so every rank agrees."""
        if self.fusion == "weighted_sum":
            return self.base.clone()
        k, b = scores.shape
        d = scores.double()
        local = torch.stack([group_spread(d, self.group_size) * (b // self.group_size), d.sum(1)])  # (2, K)
        counts = torch.tensor([b // self.group_size, b], dtype=torch.float64)
        if ctx is not None:
            local, counts = ctx.sum(local), ctx.sum(counts)
            extremes = ctx.gather_lists([(d.max(1).values.tolist(), d.min(1).values.tolist())])
        else:
            extremes = [(d.max(1).values.tolist(), d.min(1).values.tolist())]
        batch_max = torch.tensor([max(e[0][i] for e in extremes) for i in range(k)], dtype=torch.float64)
        batch_min = torch.tensor([min(e[1][i] for e in extremes) for i in range(k)], dtype=torch.float64)
        weights, self.state = dynamic_weights(
            self.base, local[0] / counts[0], local[1] / counts[1], batch_max, batch_min, self.state,
            ceiling=self.ceiling, floor=self.floor, eps=self.eps, mean_ema=self.mean_ema, weight_ema=self.weight_ema)
        return weights

    def score(self, inputs: RewardInputs, ctx: Any = None) -> tuple[torch.Tensor, dict[str, float]]:
        """(rewards (B,) float32, metrics) for one training step."""
        scores, failures = self.component_scores(inputs)  # (K, B), (K,)
        weights = self.weights(scores, ctx)
        self.last_scores = dict(zip(self.names, scores))
        restarts = torch.tensor(self._new_restarts(), dtype=torch.float64)  # (K,)
        hangs = torch.tensor(self.hangs, dtype=torch.float64)  # (K,)
        sums = torch.cat([scores.double().sum(1), failures, restarts, hangs, torch.tensor([float(scores.shape[1])], dtype=torch.float64)])  # over ranks
        if ctx is not None:
            sums = ctx.sum(sums)
        k = len(self.components)
        metrics: dict[str, float] = {}
        for i, name in enumerate(self.names):
            metrics[f"reward/{name}_mean"] = float(sums[i] / sums[-1])
            metrics[f"reward/{name}_failures"] = float(sums[k + i])
            if self._restarts_seen[i] is not None:
                metrics[f"reward/{name}_restarts"] = float(sums[2 * k + i])
                metrics[f"reward/{name}_hangs"] = float(sums[3 * k + i])
            metrics[f"reward/weight/{name}"] = float(weights[i])
        fused = normalize_within_groups(scores, self.group_size) if self.normalize_components else scores
        return weighted_sum(fused, weights.float()), metrics

    def _new_restarts(self) -> list[float]:
        """Per component, worker restarts since the previous training step (0 without a worker)."""
        out = []
        for i, comp in enumerate(self.components):
            seen = self._restarts_seen[i]
            if seen is None:
                out.append(0.0)
                continue
            self._restarts_seen[i] = comp.restarts
            out.append(float(comp.restarts - seen))
        return out

    def evaluate(self, inputs: RewardInputs) -> torch.Tensor:
        """(B,) rewards with the configured weights, leaving the dynamic state untouched: held-out
        numbers stay comparable from one evaluation to the next."""
        scores, _ = self.component_scores(inputs)
        return weighted_sum(scores, self.base.float())

    def state_dict(self) -> dict[str, Any]:
        return {"dynamic": None if self.state is None else self.state.to_dict(), "names": self.names}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["names"] != self.names:
            log.warning("reward components changed since the checkpoint (%s -> %s): dynamic weights start afresh",
                        state["names"], self.names)
            return
        self.state = None if state["dynamic"] is None else DynamicState.from_dict(state["dynamic"])

    def close(self) -> None:
        for comp in self.components:
            comp.close()


def build_reward_scorer(reward: "RewardConfig", *, group_size: int, device: torch.device | str,
                        functions: Mapping[str, Callable] | None = None) -> RewardScorer | None:
    """The scorer for `reward` config: its components, or `reward.model` alone as one component
    named reward_model with weight 1 (exactly the reward model's score); None: the environment's reward.
    `functions`: the Python API's callables, by the NAME of their components' `function: python:NAME`."""
    from scalerl.rewards.components import (
        CallableComponent,
        EnvComponent,
        FunctionComponent,
        ModelComponent,
    )

    if not reward.components:
        if reward.model is None:
            return None
        only = ModelComponent("reward_model", reward.model, device, batch_size=reward.batch_size, normalize=reward.normalize)
        return RewardScorer([only], weights=[1.0], fallbacks=[0.0], fusion="weighted_sum", group_size=group_size)
    components: list[Component] = []
    try:
        for c in reward.components:
            if c.env:
                components.append(EnvComponent(c.name))
            elif c.model is not None:
                components.append(ModelComponent(c.name, c.model, device, batch_size=reward.batch_size, normalize=c.normalize))
            elif c.function.startswith(PYTHON):
                components.append(CallableComponent(c.name, c.function, in_process(c.function, functions), timeout_s=c.timeout_s))
            else:
                components.append(FunctionComponent(c.name, c.function, timeout_s=c.timeout_s))
    except BaseException:
        for comp in components:  # no worker process outlives a failed setup
            comp.close()
        raise
    cs, dyn = reward.components, reward.dynamic
    return RewardScorer(components, weights=[c.weight for c in cs], fallbacks=[c.fallback for c in cs], fusion=reward.fusion,
                        group_size=group_size, ceilings=[c.ceiling for c in cs], floors=[c.floor for c in cs],
                        eps=dyn.eps, mean_ema=dyn.mean_ema, weight_ema=dyn.weight_ema,
                        normalize_components=reward.normalize_components)
