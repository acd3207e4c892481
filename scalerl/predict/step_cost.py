"""One cost model of a training step, shared by the live time estimate (time_estimate.py) and `scalerl plan`.

Per process and step (the work a run records each step, scalerl/trainer/step.py):

    step + interval ≈ a_r + b_r · S  +  a_l + b_l · T  +  o                          (StepCost)

    S   sampled positions: completions × the batch's longest completion (what the sampler decoded)
    T   trained positions: completions × (prompt + completion) (what the learner ran)
    a_r + b_r·S   the rollout (sample, score, filter);  a_l + b_l·T   the learning (old/ref log-probs, the
    epochs, publishing the weights);  o   the rest of the logged interval (health checks, logging)

Within a run the shape does not change, so the time estimate fits (a, b) on the steps seen
(`StepCost.fit`). Across shapes (`ShapeCost`, what `scalerl plan` fits on pilot runs) the same
coefficients are written in the shape's terms, so that a pilot on a small model, few processes or
short completions prices a bigger one:

    b_r·S = g_c · 2P·S  +  g_m · W·L  +  g_t · L·n     generation: compute-bound part at 1/g_c FLOP/s (2 FLOPs per
          + g_kv · K                                   parameter per decoded position), memory-bound part per byte
                                                       of weights read per decode step (W bytes, L = S / completions
                                                       decode steps), an overhead per layer (n layers) and decode
                                                       step (the sampling loop, a layer's kernel launches), and the
                                                       KV cache read per decode step: K = completions · kv · Σ_k (p + k)
                                                       bytes over the decode steps k = 1..L−1 (kv bytes per row and
                                                       cached position over all layers, p the padded prompt), which
                                                       grows with the square of the length
    b_l·T = f · 6P·T  +  e · T·h·n                     training FLOPs (forward and backward, Kaplan et al. 2020's
                                                       6 per parameter per position) at the achieved 1/f FLOP/s, and
                                                       the work that grows with the width h, not its square: the
                                                       layers' elementwise ops and a narrow matmul's lower FLOP/s
                                                       (per-parameter cost f·(1 + h0/h) is f·6PT + e·T·h·n, as P ≈ 13h²n)
    a_l  += bytes / bandwidth                          communication per strategy (`comm_bytes`)
    a_r, a_l, o                                        the per-step fixed overhead

The KV term's coefficient is measured, not fitted, where the pilots recorded it: the HF engine times
each decode step against its cache length (`DecodeClock`, `time/decode_s_per_position` in
metrics.jsonl), so one pilot at short completions prices long ones; a pilot without the record
(the vLLM engine) leaves it to the fit below like the other terms.

The terms are fitted by non-negative least squares over every pilot's steps pooled. A term whose
column the pilots do not vary apart from the others (by more than SEPARABLE, 10 %: one pilot at
one shape cannot tell a fixed part from a per-token one) is left out, in a
stated order: the memory-bound generation term first when the pilots' batches are compute-bound
(rows per decode step ≥ BALANCE_ROWS of their device), the compute-bound one first otherwise;
then the fixed parts, then the per-layer terms (so a single pilot prices its work proportionally,
as the time estimate does, and two pilots of different widths fit the FLOPs and the width terms:
depth alone cannot tell a per-layer cost from a per-parameter one, so pilots should differ in width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_SPREAD = 0.02  # relative spread of positions below which a fixed part cannot be told from a per-token one
SEPARABLE = 0.1  # share of a term's column the others must leave unexplained for the pilots to tell it apart
BALANCE_ROWS = {"cpu": 4, "cuda": 256}  # rows per decode step above which generation is compute-bound (FLOP/s ÷ bytes/s × bytes per weight / 2)


@dataclass(frozen=True)
class LinearCost:
    """seconds ≈ fixed + per_position · positions."""

    fixed: float
    per_position: float

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> "LinearCost":
        if x.std() <= MIN_SPREAD * max(x.mean(), 1e-12) or len(x) < 3:
            return cls(0.0, y.mean() / max(x.mean(), 1e-12))
        slope, intercept = np.polyfit(x, y, 1)
        if slope < 0:
            return cls(float(y.mean()), 0.0)
        if intercept < 0:
            return cls(0.0, float((x * y).sum() / (x * x).sum()))
        return cls(float(intercept), float(slope))

    def total(self, positions: np.ndarray) -> float:
        return float(self.fixed * len(positions) + self.per_position * positions.sum())


@dataclass(frozen=True)
class StepCost:
    """A step's seconds at one shape: rollout and learning as lines in their positions, plus the interval's rest."""

    rollout: LinearCost
    learn: LinearCost
    other_s: float

    @classmethod
    def fit(cls, sampled: np.ndarray, rollout_s: np.ndarray, trained: np.ndarray, learn_s: np.ndarray, other_s: np.ndarray) -> "StepCost":
        return cls(LinearCost.fit(sampled, rollout_s), LinearCost.fit(trained, learn_s), float(np.mean(other_s)))

    def seconds(self, sampled: float, trained: float) -> float:
        return self.rollout.fixed + self.rollout.per_position * sampled + self.learn.fixed + self.learn.per_position * trained + self.other_s

    def total(self, sampled: np.ndarray, trained: np.ndarray) -> float:
        """Seconds of len(sampled) steps with these positions each."""
        return self.rollout.total(sampled) + self.learn.total(trained) + len(sampled) * self.other_s


@dataclass(frozen=True)
class Shape:
    """What a step's cost depends on, per process: the model (P parameters; weights read at `weight_bytes` per
    parameter while sampling, gradients of `grad_bytes`), the work (completions, decode steps, trained positions)
    and how processes share it (world size, strategy, optimizer updates per step, dynamic sharding's mean sync
    interval)."""

    params: float
    weight_bytes: float
    grad_bytes: float
    completions: float
    decode_steps: float  # the longest completion of a batch: the sampler's sequential steps
    trained: float  # positions per process
    world: int = 1
    strategy: str = "ddp"
    updates: int = 1
    sync_interval: float = 1.0
    hidden: int = 1
    layers: int = 1
    kv_bytes: float = 0.0  # KV cache bytes per row and cached position, all layers (2 · layers · kv heads · head dim · bytes)

    @property
    def sampled(self) -> float:
        return self.completions * self.decode_steps

    @property
    def kv_read(self) -> float:
        """K: the KV cache bytes the decode steps read, completions · kv · Σ_{k=1}^{L−1} (p + k), p the padded prompt."""
        steps, prompt = max(self.decode_steps - 1, 0.0), max(self.trained / max(self.completions, 1e-12) - self.decode_steps, 0.0)
        return self.completions * self.kv_bytes * (steps * prompt + steps * (steps + 1) / 2)


def comm_bytes(shape: Shape) -> float:
    """Bytes each process sends per step (ring collectives: an all-reduce of n bytes moves 2(w−1)/w · n, an
    all-gather or a reduce-scatter (w−1)/w · n): DDP and none all-reduce the gradients once per update; FSDP2
    all-gathers the parameters for the forward and again for the backward and reduce-scatters the gradients,
    per update; dynamic sharding all-reduces the weights every sync interval (its groups' mean, an
    approximation: which share of the parameters each group holds is known only once the model is loaded)."""
    w = shape.world
    if w <= 1:
        return 0.0
    share = (w - 1) / w
    grads, weights = shape.params * shape.grad_bytes, shape.params * shape.weight_bytes
    if shape.strategy == "fsdp2":
        return shape.updates * share * (2 * weights + grads)
    if shape.strategy == "dynamic":
        return 2 * share * weights / max(shape.sync_interval, 1.0)
    return shape.updates * 2 * share * grads


TERMS = ("rollout fixed", "generation compute (2·P·S FLOPs)", "generation memory (weight bytes × decode steps)",
         "generation per layer and decode step", "generation KV cache (bytes read)", "learning fixed", "training compute (6·P·T FLOPs)",
         "training width (T·h·layers)", "communication")


def rollout_columns(shape: Shape) -> list[float]:
    return [1.0, 2 * shape.params * shape.sampled, shape.weight_bytes * shape.params * shape.decode_steps, shape.decode_steps * shape.layers,
            shape.kv_read]


def learn_columns(shape: Shape) -> list[float]:
    return [1.0, 6 * shape.params * shape.trained, shape.trained * shape.hidden * shape.layers, comm_bytes(shape)]


@dataclass(frozen=True)
class ShapeCost:
    """Seconds per second-of-work coefficients of `TERMS` (a coefficient 0: the term was left out or fitted 0),
    the interval's rest `other_s`, and what was left out and why."""

    rollout: tuple[float, ...]  # fixed s, s per generation FLOP, s per weight byte read, s per decode step, s per KV byte read
    learn: tuple[float, ...]  # fixed s, s per training FLOP, s per position × width × layer, s per byte sent
    other_s: float
    left_out: tuple[str, ...] = ()

    def parts(self, shape: Shape) -> dict[str, float]:
        """Seconds of each term of one step at `shape`."""
        values = [c * x for c, x in zip(self.rollout, rollout_columns(shape))] + [c * x for c, x in zip(self.learn, learn_columns(shape))]
        return {**dict(zip(TERMS, values)), "other (logging, health checks)": self.other_s}

    def seconds(self, shape: Shape) -> float:
        return sum(self.parts(shape).values())

    def at(self, shape: Shape) -> StepCost:
        """The within-run model at `shape`: the same step, as lines in its sampled and trained positions."""
        r, c = self.rollout, rollout_columns(shape)
        per_sampled = r[1] * 2 * shape.params + (r[2] * c[2] + r[3] * c[3] + r[4] * c[4]) / max(shape.sampled, 1e-12)
        learn = LinearCost(self.learn[0] + self.learn[3] * comm_bytes(shape),
                           self.learn[1] * 6 * shape.params + self.learn[2] * shape.hidden * shape.layers)
        return StepCost(LinearCost(r[0], per_sampled), learn, self.other_s)

    @property
    def achieved_flops(self) -> float | None:
        """Training FLOP/s achieved (1 / the training coefficient); None when the term was left out."""
        return 1 / self.learn[1] if self.learn[1] > 0 else None


def nnls(x: np.ndarray, y: np.ndarray, drop_order: list[int]) -> tuple[np.ndarray, list[int]]:
    """Least squares y ≈ x·c with c ≥ 0 over the columns the data tell apart: a column whose part not explained
    by the other kept ones is under SEPARABLE of its size, or whose coefficient comes out
    negative, is dropped, in `drop_order`. Returns (c with 0 for the dropped, the dropped columns)."""
    keep = [j for j in range(x.shape[1]) if np.any(x[:, j] != 0)]
    dropped = [j for j in range(x.shape[1]) if j not in keep]
    for j in drop_order:
        if j not in keep or len(keep) == 1:
            continue
        others = [k for k in keep if k != j]
        col = x[:, j]
        resid = col - x[:, others] @ np.linalg.lstsq(x[:, others], col, rcond=None)[0]
        if np.linalg.norm(resid) <= SEPARABLE * np.linalg.norm(col):
            keep.remove(j)
            dropped.append(j)
    while True:
        coef = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        negative = [k for k, c in zip(keep, coef) if c < 0]
        if not negative or len(keep) == 1:
            break
        worst = next((j for j in drop_order if j in negative), negative[0])
        keep.remove(worst)
        dropped.append(worst)
    out = np.zeros(x.shape[1])
    out[keep] = np.maximum(coef, 0.0)
    return out, dropped


def fit_shape_cost(shapes: list[Shape], rollout_s: np.ndarray, learn_s: np.ndarray, other_s: np.ndarray, *,
                   compute_bound: bool, bandwidth: float | None = None, kv_s_per_byte: float | None = None) -> ShapeCost:
    """`ShapeCost` by `nnls` over step records (one `Shape` and three timings per step, every pilot pooled).
    `bandwidth` (bytes/s): the communication priced at it instead of fitted; `kv_s_per_byte`: the KV cache term's
    coefficient as measured by the pilots (`DecodeClock`), taken out of the rollout's time before the fit."""
    xr = np.array([rollout_columns(s) for s in shapes])
    xl = np.array([learn_columns(s) for s in shapes])
    # the generation term the device's balance does not favour goes first, then the fixed parts, then the per-layer terms
    if kv_s_per_byte is not None:
        cr, dropped_r = nnls(xr[:, :4], rollout_s - kv_s_per_byte * xr[:, 4], [2, 0, 3, 1] if compute_bound else [1, 0, 3, 2])
        cr = np.append(cr, kv_s_per_byte)
    else:
        cr, dropped_r = nnls(xr, rollout_s, [4, 2, 0, 3, 1] if compute_bound else [4, 1, 0, 3, 2])
    comm = xl[:, 3] / bandwidth if bandwidth else np.zeros(len(shapes))
    cl, dropped_l = nnls(xl[:, :3] if bandwidth else xl, learn_s - comm, [0, 2, 1] if bandwidth else [3, 0, 2, 1])
    learn = (*cl[:3], 1 / bandwidth) if bandwidth else tuple(cl)
    names = [TERMS[j] for j in dropped_r] + [TERMS[5 + j] for j in dropped_l]
    return ShapeCost(tuple(float(c) for c in cr), tuple(float(c) for c in learn), float(np.mean(other_s)),
                     tuple(n for n in names if not (n == "communication" and not np.any(xl[:, 3]))))


def relative_band(predicted: np.ndarray, measured: np.ndarray, pilot: np.ndarray) -> float:
    """The band's relative half-width (≈ 95 %) of a mean step time: the steps' own scatter around the fit (over
    the steps' count), each pilot's mean misfit (what the fit cannot explain across shapes) and each pilot's
    drift (its second half's mean against its first), combined in quadrature, times 2."""
    rel = measured / predicted - 1
    misfit, drift = [], []
    for k in np.unique(pilot):
        r = rel[pilot == k]
        misfit.append(float(r.mean()))
        half = len(r) // 2
        if half >= 2:
            m = measured[pilot == k]
            drift.append(float(m[half:].mean() / m[:half].mean() - 1) / 2)
    var = float(rel.var()) / len(rel) + float(np.mean(np.square(misfit))) + (float(np.mean(np.square(drift))) if drift else 0.0)
    return 2 * math.sqrt(var)
