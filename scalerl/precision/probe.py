"""precision.mode=auto: bf16 compute (`standard`: bf16 autocast over fp32 master weights) where this device
runs the model's matmuls faster in bf16 than in fp32, fp32 otherwise; and a warning when an explicit bf16
mode is slower here than fp32 would be.

On a GPU the compute capability decides: 8.0 and above (A100, H100, RTX 30xx+) have bf16 tensor cores
that run at least twice fp32's rate, below it bf16 is emulated or absent. On a CPU it depends on the
chip (AMX Xeons ~6x fp32, an EPYC with AVX-512 BF16 ~4x at 2048², Xeons with AVX-512 BF16 but no AMX
half of fp32: issue 38) and on the model: at small widths autocast's per-op casts of the weights cost
more than the faster matmul saves. So a short probe times the model's MLP matmul, (512 tokens × hidden)
by (hidden × intermediate), as autocast runs it (casts of both operands included) and in fp32,
alternately, the fastest of each (other processes only ever slow a run down: on this project's shared
2-core EPYC a median once read 1.1 vs 1.8 GFLOP/s where the quiet machine runs 330 vs 180). Where bf16's
matmul is not `MARGIN` times faster, fp32 (near a tie fp32 keeps full precision). Where it is, the matmul
alone does not decide: a small model's step is bound by per-operator costs that bf16 adds to (casts) and
by matmuls of a few rows (a decode step's), so a single process then times the run's own step in both
(`StepTimes`, scalerl/trainer/step_probe.py: the sampler's decode and the learner's update on random
weights, at the run's rows, with at most `STEP_PROBE_LAYERS` of its layers; not where that step is FLOP-bound,
there the matmul's ratio is the step's) and bf16 is chosen only when
that step is `MARGIN` times faster. On the reference benchmark's 1M-parameter model (shared/bench) the
matmul reads 1.36x on this project's EPYC while the whole step is ~5 % slower in bf16, and peaks 50 MB higher.

Both measurements are cached per machine, torch version, thread count and shape, in
`~/.cache/scalerl/precision_probe.json` (`SCALERL_CACHE_DIR` moves it), so a run's later starts (a resume)
choose the same without measuring again. `SCALERL_PRECISION_RATES=fp32:180,bf16:90` gives the matmul rates
and `SCALERL_PRECISION_STEP=fp32:0.050,bf16:0.055` the step's seconds instead of measuring them (a
reproducible choice on a shared machine; the test suite pins fp32 this way, tests/conftest.py); with the
first given and not the second, the matmul decides.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from scalerl.errors import ScaleRLError

PROBE_ROWS = 512  # tokens of the probe's activation: a short micro-batch
MARGIN = 1.1  # bf16 must be this many times faster than fp32 to be chosen
AMPERE = (8, 0)  # the first CUDA capability with bf16 tensor cores


@dataclass(frozen=True)
class Rates:
    """The probe's matmul rates on this device, GFLOP/s."""

    fp32: float
    bf16: float
    shape: tuple[int, int, int]  # (rows, in, out) of the matmul timed
    cached: bool = False
    given: str | None = None  # the environment variable that gave them instead of a measurement

    @property
    def speedup(self) -> float:
        """bf16's rate over fp32's: bf16 can be chosen from MARGIN on."""
        return self.bf16 / self.fp32

    def text(self) -> str:
        m, k, n = self.shape
        return f"bf16 {self.bf16:.1f} vs fp32 {self.fp32:.1f} GFLOP/s on a {m}x{k}x{n} matmul{_origin(self.cached, self.given)}"


def _origin(cached: bool, given: str | None) -> str:
    return f" (given by {given})" if given else " (cached)" if cached else ""


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one probed step of the run's shape (scalerl/trainer/step_probe.py) in fp32 and under bf16 autocast."""

    fp32: float
    bf16: float
    cached: bool = False
    given: str | None = None  # the environment variable that gave them instead of a measurement

    def text(self) -> str:
        return f"fp32 {self.fp32 * 1e3:.1f} vs bf16 {self.bf16 * 1e3:.1f} ms per probed step of this run's shape{_origin(self.cached, self.given)}"


def choose_mode(device: torch.device, rates: Rates | None, capability: tuple[int, int] | None = None,
                step: StepTimes | None = None) -> tuple[str, str]:
    """(precision.mode, why) for precision.mode=auto: `rates` on a CPU (the matmul probe's) and, where the matmul
    favours bf16, `step` (the step probe's; None: not probed, the matmul decides), `capability` on a GPU."""
    if device.type == "cuda":
        cc = f"compute capability {capability[0]}.{capability[1]}"
        if capability >= AMPERE:
            return "standard", f"{cc} has bf16 tensor cores"
        return "fp32", f"{cc}: no bf16 tensor cores"
    matmul = rates.speedup
    if matmul < MARGIN:
        return "fp32", f"bf16 matmuls {'only ' if matmul >= 1 else ''}{matmul:.2f}x fp32's here ({rates.text()}; bf16 needs {MARGIN:g}x)"
    if step is None:
        return "standard", f"bf16 matmuls {matmul:.2f}x faster here ({rates.text()})"
    speedup = step.fp32 / step.bf16
    if speedup >= MARGIN:
        return "standard", f"bf16 {speedup:.2f}x faster on this run's step here ({step.text()}; matmuls {matmul:.2f}x)"
    return "fp32", (f"bf16 matmuls {matmul:.2f}x faster but this run's step only {speedup:.2f}x ({step.text()}; "
                    f"bf16 needs {MARGIN:g}x)")


def slower_warning(mode: str, rates: Rates | None, step: StepTimes | None = None) -> str | None:
    """One line when an explicit mode computes in bf16 and this CPU runs bf16 slower than fp32: its matmuls (`rates`),
    or else this run's step where a probe of it is at hand (`step`: cached by an earlier `auto` start, or given); else None."""
    if rates is None or mode not in ("standard", "compressed"):
        return None
    if rates.bf16 < rates.fp32:
        slower = f"bf16 matmuls run slower than fp32 on this machine ({rates.text()})"
    elif step is not None and step.bf16 > step.fp32:
        slower = (f"bf16 matmuls are {rates.speedup:.2f}x faster here but this run's step is slower in bf16 "
                  f"({step.fp32 / step.bf16:.2f}x: {step.text()})")
    else:
        return None
    return f"warning: precision.mode={mode} computes in bf16, and {slower}; precision.mode=auto or fp32 would be faster"


def probe_shape(hidden: int, intermediate: int) -> tuple[int, int, int]:
    return (PROBE_ROWS, hidden, intermediate)


def measure(shape: tuple[int, int, int], *, budget_s: float = 2.0) -> Rates:
    """Time x (m, k) @ w (n, k)ᵀ in fp32 and under bf16 autocast (the casts included), alternately; the fastest of each."""
    m, k, n = shape
    x, w = torch.randn(m, k), torch.randn(n, k)

    def once(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            F.linear(x, w)
        return time.perf_counter() - start

    first = once(False) + once(True)  # warm-up, and the size of one round
    rounds = max(3, min(25, int(budget_s / max(first, 1e-6))))
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for bf16 in (False, True):
            times[bf16].append(once(bf16))
    flops = 2 * m * k * n / 1e9
    return Rates(fp32=flops / min(times[False]), bf16=flops / min(times[True]), shape=shape)


def cache_path() -> Path:
    return Path(os.environ.get("SCALERL_CACHE_DIR") or Path.home() / ".cache" / "scalerl") / "precision_probe.json"


def _machine_key(shape: tuple[int, int, int] | None) -> str:
    """Machine, torch version, threads and the matmul's shape (None: without it)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    key = f"{platform.node()}|{cpu}|torch {torch.__version__}|threads {torch.get_num_threads()}"
    return key if shape is None else f"{key}|{'x'.join(map(str, shape))}"


def _given(name: str, unit: str, example: str) -> dict[str, float] | None:
    """{"fp32": x, "bf16": y} from the environment variable `name` (fp32:X,bf16:Y), or None when it is not set."""
    if not (given := os.environ.get(name)):
        return None
    try:
        values = dict(part.split(":") for part in given.split(","))
        parsed = {"fp32": float(values["fp32"]), "bf16": float(values["bf16"])}
    except (ValueError, KeyError):
        raise ScaleRLError(f"{name}={given!r}: write fp32:<{unit}>,bf16:<{unit}>, e.g. {example}") from None
    if not all(math.isfinite(v) and v > 0 for v in parsed.values()):
        raise ScaleRLError(f"{name}={given!r}: both values must be positive {unit}, e.g. {example}")
    return parsed


def _cached(key: str, measure_both: Callable[[], tuple[float, float] | None],
            announce: Callable[[], None] | None = None) -> tuple[float, float, bool] | None:
    """(fp32, bf16, cached): from the cache under `key`, or measured (`announce` called first) and cached; None where
    `measure_both` could not measure (nothing is cached then). A cache that cannot be read or written is measured
    around, silently: the probe is a speed hint, not state."""
    path = cache_path()
    try:
        entry = json.loads(path.read_text())[key]
        return entry["fp32"], entry["bf16"], True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if announce is not None:
        announce()
    if (measured := measure_both()) is None:
        return None
    fp32, bf16 = measured
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        table[key] = {"fp32": fp32, "bf16": bf16, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    except OSError:
        pass
    return fp32, bf16, False


def cpu_rates(shape: tuple[int, int, int], announce: Callable[[], None] | None = None) -> Rates:
    """The matmul probe's rates for this machine and shape: given (SCALERL_PRECISION_RATES), cached or measured
    (`announce` called before measuring)."""
    if (given := _given("SCALERL_PRECISION_RATES", "GFLOP/s", "fp32:180,bf16:90")) is not None:
        return Rates(fp32=given["fp32"], bf16=given["bf16"], shape=shape, given="SCALERL_PRECISION_RATES")

    def both() -> tuple[float, float]:
        rates = measure(shape)
        return rates.fp32, rates.bf16

    fp32, bf16, cached = _cached(_machine_key(shape), both, announce)
    return Rates(fp32=fp32, bf16=bf16, shape=shape, cached=cached)


def cpu_step_times(shape_key: str, measure_both: Callable[[], tuple[float, float] | None],
                   announce: Callable[[], None] | None = None) -> StepTimes | None:
    """The step probe's seconds (fp32, bf16) for this machine and the run's shape (`shape_key`): given
    (SCALERL_PRECISION_STEP), cached, or measured by `measure_both` (`announce` called first; None: it could not
    probe; then None).
    None too where only SCALERL_PRECISION_RATES is given: the pinned matmul rates decide."""
    if (given := _given("SCALERL_PRECISION_STEP", "seconds", "fp32:0.050,bf16:0.055")) is not None:
        return StepTimes(fp32=given["fp32"], bf16=given["bf16"], given="SCALERL_PRECISION_STEP")
    if os.environ.get("SCALERL_PRECISION_RATES"):
        return None
    found = _cached(f"step|{_machine_key(None)}|{shape_key}", measure_both, announce)
    return None if found is None else StepTimes(*found)
