"""The batch-size search under a time budget: every trial guarded by host RAM and by the time
model, every trial recorded for the evidence, and what limited the search said with numbers.
No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import Trial, TrialOutcome, find_max_batch_size
from torch_autotune.probe.timemodel import StepTiming, TimeModel
from torch_autotune.probe.trials import MIN_BLOCKS
from torch_autotune.profile import EAGER, SearchTrialRecord

EXTRAPOLATE = 4  # a time prediction past 4x the largest measured size is checked first
CLOSE_ENOUGH = 1.25  # a time-limited search stops within 25% of the size refused for time
TIME_GUARD = "time-guard (not run)"
NEAR_TIME_GUARD = "time-guard (not run: within 25% of the largest that ran, beside a size refused)"
OVER_CAP = "over --memory-limit"  # CPU: it ran, and took more host RAM than the user's cap
OVER_CAP_PREDICTED = "over --memory-limit (not run)"  # CPU: predicted to take more than it


class OutOfTime(Exception):
    """The budget ran out before the next trial."""


@dataclass
class SearchGuard:
    """The ``fits`` the search calls: guarded by RAM and by time, every trial recorded.

    A trial is not started when the time model predicts that it, plus one throughput point
    at that size afterwards, takes longer than what is left of the whole budget (less the
    DataLoader's share); it then counts as too big, so the search settles on the largest size
    that fits the time instead of stopping.
    """

    runner: Trials
    budget: Budget
    progress: Progress
    reserve_s: float
    model: TimeModel = field(default_factory=TimeModel)
    records: list[SearchTrialRecord] = field(default_factory=list)
    ram_budget_bytes: int | None = None  # CPU: never start a trial predicted to exceed it
    ram_cap_bytes: int | None = None  # CPU: --memory-limit, on what a trial takes
    held: dict[int, int] = field(default_factory=dict)  # CPU: what the process held, by size
    refused: str | None = None  # why the smallest size refused for time was refused
    calls: list[int | None] = field(default_factory=list)  # per search call: its record
    start: int = 1  # the smallest batch the search tries
    variant: str = EAGER  # the variant the runner trains (``probe.variants``), for the records
    phase: str = "search"  # the phase the progress names

    def predicted_peak(self, batch_size: int) -> int | None:
        """Peak memory at ``batch_size`` by the secant through the two largest readings."""
        peaks = [(t.batch_size, t.peak_memory_bytes) for t in self.records if t.fits]
        predicted = _secant([(b, m) for b, m in peaks if m is not None], batch_size)
        return None if predicted is None else int(predicted)

    def over_cap(self, batch_size: int) -> bool:
        """CPU, --memory-limit: whether ``batch_size`` is predicted to take more host RAM than
        the cap, beyond what the process holds (the secant through the two largest growths
        measured); from its whole peak where no trial said what the process held (a simulated
        machine's)."""
        cap = self.ram_cap_bytes
        if cap is None:
            return False
        grown = sorted(
            (t.batch_size, t.peak_memory_bytes - self.held[t.batch_size])
            for t in self.records
            if t.fits and t.peak_memory_bytes is not None and t.batch_size in self.held
        )
        if len(grown) < 2:
            whole = None if self.held else self.predicted_peak(batch_size)
            return whole is not None and whole > cap
        growth = _secant(grown, batch_size)
        return growth is not None and growth > cap

    def needed_s(self, batch_size: int) -> tuple[float, float] | None:
        """(the trial, the trial plus one throughput point after it), predicted; None: unknown."""
        steps = self.runner.settings.steps
        trial = self.model.predict(batch_size, steps)
        later = self.model.predict(batch_size, 2 + MIN_BLOCKS)
        if trial is None or later is None:
            return None
        return trial.seconds, trial.seconds + later.seconds

    def __call__(self, batch_size: int) -> TrialOutcome:
        count = len(self.records)
        outcome = self._decide(batch_size)
        self.calls.append(len(self.records) - 1 if len(self.records) > count else None)
        return outcome

    def _decide(self, batch_size: int) -> TrialOutcome:
        if self.budget.left_in_run() <= 0:
            raise OutOfTime
        ran = [r.batch_size for r in self.records if r.fits]
        if ran and batch_size <= max(ran):  # monotone: known to fit, not run again
            same = [r for r in self.records if r.fits and r.batch_size == batch_size]
            return TrialOutcome(True, same[-1].peak_memory_bytes) if same else TrialOutcome(True)
        predicted = self.predicted_peak(batch_size)
        if self.ram_budget_bytes is not None and predicted and predicted > self.ram_budget_bytes:
            # Running out of host RAM does not raise: the kernel kills the process. A size
            # predicted to exceed the budget is treated as too big, and not run.
            self.refuse(refused_record(batch_size, "ram-guard (not run)"))
            return TrialOutcome(False)
        if self.over_cap(batch_size):
            self.refuse(refused_record(batch_size, OVER_CAP_PREDICTED))
            return TrialOutcome(False)
        failed = [r.batch_size for r in self.records if not r.fits and r.seconds is not None]
        if failed and batch_size >= min(failed):  # monotone: it cannot fit either
            self.refuse(refused_record(batch_size, f"above {min(failed)}, which failed"))
            return TrialOutcome(False)
        refusal = self._time_refusal(batch_size)
        if refusal is not None:
            self.refuse(refusal)
            return TrialOutcome(False)
        return self._run(batch_size, "search")

    def _time_refusal(self, batch_size: int) -> SearchTrialRecord | None:
        """A record refusing ``batch_size`` for time, or None when it may run.

        A prediction more than ``EXTRAPOLATE`` times past the largest measured size is not
        trusted to refuse: a size in between runs first (step "time model"), and the
        prediction is made again from it. Next to a size refused for time, a size within
        ``CLOSE_ENOUGH`` of the largest that ran is not worth its time: the limit is soft.
        """
        while True:
            left = self.budget.left_in_run() - self.reserve_s
            refused = [r.batch_size for r in self.records if r.step == TIME_GUARD]
            ran = [r.batch_size for r in self.records if r.fits]
            if (
                refused
                and ran
                and batch_size > max(ran)
                and min(refused) <= CLOSE_ENOUGH * max(ran)
            ):  # not refused by its own prediction: the step says by what
                needed = self.needed_s(batch_size)
                predicted = None if needed is None else needed[0]
                return refused_record(
                    batch_size, NEAR_TIME_GUARD, predicted_s=predicted, left_s=left
                )
            needed = self.needed_s(batch_size)
            if needed is None or needed[1] <= left:
                return None
            largest = self.model.largest() or batch_size
            between = EXTRAPOLATE * largest
            if batch_size <= between or not self._affordable(between, left):
                self._note_refusal(batch_size, needed, left)
                return refused_record(batch_size, TIME_GUARD, predicted_s=needed[0], left_s=left)
            if not self._run(between, "time model").fits:
                return refused_record(batch_size, f"above {between}, which failed")

    def refuse(self, record: SearchTrialRecord) -> None:
        """Record a size that did not run, under this guard's variant."""
        self.records.append(record.model_copy(update={"variant": self.variant}))

    def _affordable(self, batch_size: int, left: float) -> bool:
        needed = self.needed_s(batch_size)
        return needed is None or needed[1] <= left

    def run_once(self, batch_size: int, step: str) -> TrialOutcome:
        """Run ``batch_size`` now, whatever ran before (no shortcut, no guard), and record it:
        for the sizes below where the search may start (``probe.smallest``). ``OutOfTime``
        when the budget is spent."""
        if self.budget.left_in_run() <= 0:
            raise OutOfTime
        return self._run(batch_size, step)

    def _run(self, batch_size: int, step: str) -> TrialOutcome:
        needed = self.needed_s(batch_size)
        left = self.budget.left_in_run() - self.reserve_s
        self.progress(self.phase, f"batch {batch_size}")
        outcome = self.runner(batch_size)
        if outcome.held_bytes is not None:  # one baseline: a size over the cap says it too
            self.held[batch_size] = outcome.held_bytes
        if not outcome.fits and self.ram_cap_bytes and outcome.peak_memory_bytes is not None:
            step = OVER_CAP  # ran to a peak, so no error: it took more than the cap (the runner)
        if outcome.fits and outcome.step_s is not None:
            self.model.learn(StepTiming(batch_size, outcome.warmup_s or 0.0, outcome.step_s))
        self.records.append(
            SearchTrialRecord(
                batch_size=batch_size,
                fits=outcome.fits,
                peak_memory_bytes=outcome.peak_memory_bytes,
                seconds=rounded_seconds(outcome.seconds or 0.0),  # over the cap: it ran
                step=step,
                warmup_s=rounded_seconds(outcome.warmup_s),
                step_s=rounded_seconds(outcome.step_s),
                predicted_s=None if needed is None else round(needed[0], 3),
                left_s=round(max(0.0, left), 3),
                variant=self.variant,
            )
        )
        return outcome

    def _note_refusal(self, batch_size: int, needed: tuple[float, float], left: float) -> None:
        smallest = min(
            (r.batch_size for r in self.records if r.step == TIME_GUARD),
            default=batch_size,
        )
        if batch_size <= smallest:
            self.refused = (
                f"batch {batch_size} was predicted to take {needed[0]:.1f} s, and "
                f"{needed[1]:.1f} s with its throughput measurement, more than the "
                f"{max(0.0, left):.1f} s left"
            )


def refused_record(
    batch_size: int,
    step: str,
    *,
    predicted_s: float | None = None,
    left_s: float | None = None,
    error: str | None = None,
) -> SearchTrialRecord:
    """A size that did not train: refused before it ran (with the time model's numbers), or
    one whose step raised ``error``."""
    return SearchTrialRecord(
        batch_size=batch_size,
        fits=False,
        peak_memory_bytes=None,
        seconds=None,
        step=step,
        predicted_s=None if predicted_s is None else round(predicted_s, 3),
        left_s=None if left_s is None else round(max(0.0, left_s), 3),
        error=error,
    )


def trial_record(trial: Trial, variant: str) -> SearchTrialRecord:
    """A trial that ran outside a guarded search (a confirmation, a measurement of memory), as
    the evidence keeps it."""
    return SearchTrialRecord(
        batch_size=trial.batch_size,
        fits=trial.fits,
        peak_memory_bytes=trial.peak_memory_bytes,
        seconds=rounded_seconds(trial.seconds),
        step=trial.step,
        warmup_s=rounded_seconds(trial.warmup_s),
        step_s=rounded_seconds(trial.step_s),
        variant=variant,
    )


def rounded_seconds(value: float | None) -> float | None:
    return None if value is None else round(max(0.0, value), 4)


# --- phase 2: the search ---------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    largest: int | None
    limited_by: str
    reason: str


def search_with_guard(
    guarded: SearchGuard, cap: int, limit: int | None, cap_reason: str, *, floor: int | None = None
) -> Found:
    """The largest size that ran, what limited it (with the numbers), every trial recorded;
    a failed start is bisected down to ``floor`` (None: the start is the floor)."""
    try:
        start = min(guarded.start, cap)
        lowest = start if floor is None else min(floor, start)
        cautious = guarded.ram_cap_bytes is not None  # the CPU: a trial past the cap runs on
        result = find_max_batch_size(
            guarded, cap=cap, memory_limit_bytes=limit, start=start, floor=lowest, cautious=cautious
        )
        largest, limited_by = result.max_batch_size, result.limited_by
        # Name each search trial by the search's reason for it (start, model, predict, ...);
        # trials the guard ran on its own ("time model") and sizes it did not run keep theirs.
        for index, trial in zip(guarded.calls, result.trials, strict=True):
            if index is not None and guarded.records[index].step == "search":
                record = guarded.records[index].model_copy(update={"step": trial.step})
                guarded.records[index] = record
        ran = [t.batch_size for t in guarded.records if t.fits]
        largest = max(ran, default=largest)  # a size the guard ran may exceed the search's
    except OutOfTime:
        ran = [t.batch_size for t in guarded.records if t.fits]
        largest, limited_by = (max(ran) if ran else None), "budget"
    above = [t for t in guarded.records if not t.fits and t.batch_size > (largest or 0)]
    bound = min(above, key=lambda t: t.batch_size) if above else None
    if bound is not None and limited_by == "memory":  # the smallest size above: not run?
        step = bound.step  # TIME_GUARD, or NEAR_TIME_GUARD: not run for time either
        timed = step in (TIME_GUARD, NEAR_TIME_GUARD)  # --memory-limit's cap is memory's
        limited_by = "time" if timed else "host RAM" if step == "ram-guard (not run)" else "memory"
    if limited_by == "time" and guarded.budget.spent:
        limited_by = "budget"
    over = bound is not None and bound.step in (OVER_CAP, OVER_CAP_PREDICTED)
    reasons = {
        "memory": (
            f"batch {bound.batch_size}"
            f" {'took' if bound.step == OVER_CAP else 'was predicted to take'} more than the"
            f" {gib(guarded.ram_cap_bytes)} of host RAM the memory limit allows (--memory-limit,"
            " memory_limit_gib), beyond what the process held once its first trial had run"
            if bound is not None and over
            else f"batch {bound.batch_size if bound else '?'} ran out of memory"
        ),
        "host RAM": (
            f"batch {bound.batch_size if bound else '?'} was predicted to need more than"
            f" the {gib(guarded.ram_budget_bytes)} of host RAM the probe may fill"
        ),
        "time": _time_reason(guarded, bound),
        "budget": (
            f"{guarded.budget.elapsed():.0f} s of the {guarded.budget.total_s:.0f} s budget "
            "were spent"
        ),
        "cap": cap_reason,
        "start": f"batch {guarded.start} "
        + (
            _took(guarded, bound)
            if bound is not None and bound.step == OVER_CAP
            else "ran out of memory"
        ),
    }
    return Found(largest, limited_by, reasons.get(limited_by, limited_by))


def _took(guarded: SearchGuard, bound: SearchTrialRecord) -> str:
    """How far ``bound``, which ran, went over --memory-limit: its peak beyond what the process
    held (its whole peak where the runner did not say), against the cap."""
    cap, peak = guarded.ram_cap_bytes or 0, bound.peak_memory_bytes or 0
    held = guarded.held.get(bound.batch_size)
    said, allowed = apart(peak - (held or 0), cap)
    beyond = " beyond what the process held" if held is not None else ""
    return (
        f"took {said} of host RAM{beyond}, more than the {allowed} the memory limit allows"
        " (--memory-limit, memory_limit_gib)"
    )


def _time_reason(guarded: SearchGuard, bound: SearchTrialRecord | None) -> str:
    """Why time stopped the search: the size refused by its prediction, and the one above the
    largest that was not run beside it (``NEAR_TIME_GUARD``), where that is the bound."""
    refused = guarded.refused or "the next size did not fit in the time left"
    if bound is not None and bound.step == NEAR_TIME_GUARD:
        return (
            f"batch {bound.batch_size} was not run: it is within 25% of the largest that ran,"
            f" beside a size refused for time ({refused})"
        )
    return refused


def _secant(points: list[tuple[int, int]], batch_size: int) -> float | None:
    """Memory at ``batch_size`` by the secant through the two largest sizes of ``points``
    ((batch, bytes)), never falling with the batch; None below two points."""
    if len(points) < 2:
        return None
    (b1, m1), (b2, m2) = sorted(points)[-2:]
    return m2 + max(0.0, (m2 - m1) / (b2 - b1)) * (batch_size - b2)


def gib(value: int | None) -> str:
    """Bytes in GiB: one decimal from 1 GiB, two significant digits below (0.25, 0.01)."""
    if value is None:
        return "?"
    amount = value / 2**30
    return f"{amount:.1f} GiB" if amount >= 1 else f"{amount:.2g} GiB"


def apart(taken: int, limit: int) -> tuple[str, str]:
    """``taken`` and ``limit`` in words that differ where the bytes do: in GiB as ``gib`` says
    them, else in MiB with as many decimals as tell them apart (0.2 GiB over 0.2 GiB read as
    no more than the limit)."""
    said, allowed = gib(taken), gib(limit)
    digits = 0
    while said == allowed and taken != limit and digits < 6:
        said, allowed = (f"{value / 2**20:.{digits}f} MiB" for value in (taken, limit))
        digits += 1
    return said, allowed
