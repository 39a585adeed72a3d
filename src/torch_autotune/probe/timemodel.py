"""How long a training trial at an untried batch size will take, from the sizes that ran. No torch.

A trial's wall time has two parts that behave differently:

- the **warm-up** of its first step: CUDA context and allocator growth, the cuDNN autotuner
  timing its kernels for a new shape, torch.compile compiling, a DataLoader starting. It is paid
  once per new shape (the very first trial also pays the one-off costs of the process), and it
  does not grow with the batch the way a step does;
- the **steady step**: ``fixed + per_sample * batch``, the cost every later step pays.

The first real GPU run showed what goes wrong otherwise: a model that kept the largest seconds
per sample ever seen (always the first, smallest trial, where fixed costs and start-up dominate)
refused a trial of 587 samples with 120 s left after 545 had run in 0.26 s. So a prediction
here comes only from the steady step times of sizes that ran (an affine fit through the
nearest measured sizes), plus the warm-up a new shape has really paid in this run, and never
from a first step or a running maximum.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

__all__ = ["Prediction", "StepTiming", "TimeModel"]


@dataclass(frozen=True)
class StepTiming:
    """What one trial measured: its first step's extra cost and its steady step time."""

    batch_size: int
    warmup_s: float  # first step minus one steady step: what the new shape cost on top
    step_s: float  # one steady step (median of the timed steps)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        for name in ("warmup_s", "step_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0 s, got {value}")


@dataclass(frozen=True)
class Prediction:
    """Seconds a trial is predicted to take, and how that was worked out (for the evidence)."""

    seconds: float
    warmup_s: float
    step_s: float
    steps: int
    basis: str  # e.g. "affine through 256 and 512"


def _affine(points: list[tuple[int, float]], batch_size: int) -> tuple[float, str] | None:
    """``fixed + per_sample * batch`` through the measured sizes nearest ``batch_size``.

    Inside the measured range: the line through the two sizes that bracket it. Above it: the
    line through the two largest sizes, its slope kept between 0 and the largest size's own
    seconds per sample (a fixed part cannot be negative). Below the smallest size: that
    size's time (a smaller batch is not slower). Above a single size: None, unknown. Scaling
    one small size in proportion is the sticky seconds-per-sample that refused every size
    above 9 on the first GPU run: at batch 1 a step is almost all fixed cost.
    """
    sizes = [b for b, _ in points]
    if batch_size in sizes:
        return points[sizes.index(batch_size)][1], f"measured at {batch_size}"
    below = [p for p in points if p[0] < batch_size]
    above = [p for p in points if p[0] > batch_size]
    if not below:
        b, t = above[0]
        return t, f"not above the time at {b}"
    if above:
        (b1, t1), (b2, t2) = below[-1], above[0]
        return t1 + (t2 - t1) * (batch_size - b1) / (b2 - b1), f"between {b1} and {b2}"
    if len(below) < 2:
        return None
    (b1, t1), (b2, t2) = below[-2], below[-1]
    slope = min(max(0.0, (t2 - t1) / (b2 - b1)), t2 / b2)
    return t2 + slope * (batch_size - b2), f"affine through {b1} and {b2}"


@dataclass
class TimeModel:
    """Learns ``StepTiming``s of one way of training (settings fixed) and predicts trials.

    ``predict(batch, steps)`` is the warm-up a new shape pays plus ``steps`` steady steps.
    The warm-up of a new shape is interpolated from the warm-ups of the trials after the first
    (the first also paid the process's one-off start-up); before any such trial it is taken
    to be one steady step. ``None`` until a trial has run: nothing is known yet.
    """

    timings: dict[int, StepTiming] = field(default_factory=dict)
    first: StepTiming | None = None

    def learn(self, timing: StepTiming) -> None:
        if self.first is None:
            self.first = timing
        self.timings[timing.batch_size] = timing

    @property
    def known(self) -> bool:
        return bool(self.timings)

    def step_seconds(self, batch_size: int) -> tuple[float, str] | None:
        if not self.timings:
            return None
        points = sorted((b, t.step_s) for b, t in self.timings.items())
        return _affine(points, batch_size) if points else None

    def warmup_seconds(self, batch_size: int) -> float:
        """The warm-up a new shape of ``batch_size`` pays, from this run's later trials.

        Between two of them: interpolated. Outside them: the median of them (warm-ups do
        not follow the step time: on an H100 the cuDNN autotuner took 5.9 s at batch 256 and
        8.9 s at 1536 for steps of 0.06 and 0.36 s). Before any later trial: one steady step.
        """
        later = sorted(
            (t.batch_size, t.warmup_s) for t in self.timings.values() if t is not self.first
        )
        if not later:
            step = self.step_seconds(batch_size)
            return step[0] if step else 0.0
        below = [p for p in later if p[0] <= batch_size]
        above = [p for p in later if p[0] > batch_size]
        if below and above:
            between = _affine([below[-1], above[0]], batch_size)
            if between is not None:
                return between[0]
        return statistics.median(w for _, w in later)

    def largest(self) -> int | None:
        """The largest batch size measured so far."""
        return max(self.timings, default=None)

    def predict(self, batch_size: int, steps: int, *, new_shape: bool = True) -> Prediction | None:
        """Seconds for ``steps`` steps at ``batch_size`` (warm-up included for a new shape)."""
        fitted = self.step_seconds(batch_size)
        if fitted is None:
            return None
        step_s, basis = fitted
        warmup = self.warmup_seconds(batch_size) if new_shape else 0.0
        return Prediction(warmup + steps * step_s, warmup, step_s, steps, basis)
