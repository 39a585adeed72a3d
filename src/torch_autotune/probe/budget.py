"""One clock and one time budget for a whole probe run, shared by every phase. No torch.

``tune()`` makes one ``Budget`` and hands it to the search, the throughput points, the compile
measurement, the confirmation and the DataLoader measurement. Each phase runs inside
``budget.phase(name, seconds)``: its deadline is ``seconds`` from its start (never past the
end of the whole budget), so a phase cannot eat the time of the phases after it, and what a
phase leaves unused is there for the next one. ``budget.phases`` records how long each phase
took, for the summary, and ``budget.skipped`` what the run left out because it did not fit
in the time left (``Skip``): the warnings that ask for a longer budget are built from those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch_autotune.evidence import PhaseRecord

if TYPE_CHECKING:
    from torch_autotune.profile import Profile

DEFAULT_BUDGET_S = 120.0
"""The budget on the CPU, and on a GPU where torch.compile is not measured."""
DEFAULT_COMPILE_BUDGET_S = 180.0
"""The budget where torch.compile is measured: a compile alone takes 30-80 s on an H100."""


def default_budget_s(rules_only: Profile) -> float:
    """The run's budget when none is given: longer where torch.compile is measured."""
    return DEFAULT_COMPILE_BUDGET_S if rules_only.settings.compile.enabled else DEFAULT_BUDGET_S


__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_COMPILE_BUDGET_S",
    "SPENT",
    "Budget",
    "PhaseTime",
    "Skip",
    "default_budget_s",
]

Clock = Callable[[], float]

SPENT = 0.9
"""A run has spent its budget when this fraction of it is gone (``limited_by: budget``)."""


@dataclass(frozen=True)
class PhaseTime:
    """How long one phase of the run took."""

    name: str
    seconds: float
    allowed_s: float | None  # the phase's own share; None: up to the end of the budget


@dataclass
class Skip:
    """Something the run left out for time: it was predicted to take ``predicted_s``, and of
    the ``left_s`` seconds left in the run, ``kept_s`` were kept for later phases, so less
    than ``predicted_s`` was there for it. ``warned``: a warning of its own says so (the
    run's closing warning names the others)."""

    what: str
    predicted_s: float
    left_s: float
    kept_s: float
    warned: bool = False
    basis: str = "predicted"  # what ``predicted_s`` is: a prediction, or a share kept for it

    def words(self) -> str:
        """The skip with its numbers, as the warnings write it."""
        kept = f"{self.kept_s:.1f} s" if round(self.kept_s, 1) else "none"
        return (
            f"{self.what} ({self.predicted_s:.1f} s {self.basis}, {self.left_s:.1f} s of the run "
            f"left, {kept} of them kept for later phases)"
        )


class Budget:
    """``total_s`` seconds from now on ``clock``; phases with deadlines of their own."""

    def __init__(self, total_s: float, clock: Clock, *, started: float | None = None) -> None:
        """``started``: when the run began on ``clock`` (default: now)."""
        if not (math.isfinite(total_s) and total_s > 0):
            raise ValueError(f"the time budget must be a finite number of seconds > 0: {total_s}")
        self.total_s = total_s
        self.clock = clock
        self.started = clock() if started is None else started
        self.end = self.started + total_s
        self.deadline = self.end  # the current phase's
        self.phases: list[PhaseTime] = []
        self.skipped: list[Skip] = []

    def now(self) -> float:
        return self.clock()

    def elapsed(self) -> float:
        return max(0.0, self.clock() - self.started)

    def left(self) -> float:
        """Seconds until the current phase's deadline (0 when it has passed)."""
        return max(0.0, self.deadline - self.clock())

    def left_in_run(self) -> float:
        """Seconds until the end of the whole budget."""
        return max(0.0, self.end - self.clock())

    def affords(self, seconds: float) -> bool:
        """Whether ``seconds`` of work started now ends by the current phase's deadline."""
        return self.clock() + seconds <= self.deadline

    def skip(
        self,
        what: str,
        predicted_s: float,
        *,
        kept_s: float | None = None,
        warned: bool = False,
        basis: str = "predicted",
    ) -> Skip:
        """Record that ``what``, predicted to take ``predicted_s`` (``basis``), is left out for
        time, and return the record. ``kept_s``: seconds of the run kept for later phases
        (default: those past the current phase's deadline)."""
        left = self.left_in_run()
        kept = left - self.left() if kept_s is None else kept_s
        skip = Skip(what, max(0.0, predicted_s), left, min(left, max(0.0, kept)), warned, basis)
        self.skipped.append(skip)
        return skip

    @property
    def spent(self) -> bool:
        """At least ``SPENT`` of the whole budget is gone."""
        return self.elapsed() >= SPENT * self.total_s

    @contextmanager
    def phase(self, name: str, seconds: float | None = None) -> Iterator[Budget]:
        """Run a phase with ``seconds`` of its own (None: up to the end of the budget)."""
        began = self.clock()
        outer = self.deadline
        self.deadline = self.end if seconds is None else min(self.end, began + max(0.0, seconds))
        try:
            yield self
        finally:
            self.deadline = outer
            self.phases.append(PhaseTime(name, max(0.0, self.clock() - began), seconds))

    def records(self) -> tuple[PhaseRecord, ...]:
        """The phases as the evidence records them (seconds to the millisecond)."""
        return tuple(
            PhaseRecord(
                name=p.name,
                seconds=round(p.seconds, 3),
                allowed_s=None if p.allowed_s is None else round(max(0.0, p.allowed_s), 3),
            )
            for p in self.phases
        )
