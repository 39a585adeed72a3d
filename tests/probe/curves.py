"""Simulated memory curves: what a trial at each batch size would use, and whether it fits."""

from __future__ import annotations

import random
from dataclasses import dataclass

from torch_autotune.probe.search import TrialOutcome


@dataclass(frozen=True)
class MemoryCurve:
    """peak(b) = overhead + per_sample * b + step_bytes * (b // step_every), read with noise.

    ``fits`` is decided by the true peak (the allocator either has the memory or not); the
    reading the search sees is off by up to ``noise`` (a fraction) because workspaces and
    allocator rounding vary from run to run.
    """

    overhead: int
    per_sample: int
    limit_bytes: int
    noise: float = 0.0
    step_bytes: int = 0  # fragmentation: an extra block every step_every samples
    step_every: int = 1
    seed: int = 0

    def true_peak(self, batch_size: int) -> int:
        steps = self.step_bytes * (batch_size // self.step_every) if self.step_bytes else 0
        return self.overhead + self.per_sample * batch_size + steps

    def limit(self, cap: int) -> int:
        """The exact answer: the largest size in [1, cap] whose true peak fits (0 if none)."""
        lo, hi = 0, cap + 1
        while hi - lo > 1:  # true_peak is increasing, so bisection on it is exact
            mid = (lo + hi) // 2
            if self.true_peak(mid) <= self.limit_bytes:
                lo = mid
            else:
                hi = mid
        return lo

    def __call__(self, batch_size: int) -> TrialOutcome:
        peak = self.true_peak(batch_size)
        if peak > self.limit_bytes:
            return TrialOutcome(False)
        jitter = random.Random(self.seed * 1_000_003 + batch_size).uniform(-1, 1) * self.noise
        return TrialOutcome(True, max(1, round(peak * (1 + jitter))), seconds=batch_size * 1e-3)
