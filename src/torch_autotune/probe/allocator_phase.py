"""The caching allocator's setting, measured (issue 21). No torch.

Rule J1 sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` on Linux with NVIDIA GPUs:
the allocator grows segments instead of leaving slivers it cannot use, so more of the GPU is
usable; PyTorch's own out-of-memory message recommends it, torchtitan always sets it, and no
one has published what it does to the largest batch of a fixed shape. It is read when CUDA
starts, so it cannot change inside this process: where memory stopped the search, a fresh
process (``probe.fresh``, through the seam's ``fresh``) runs with the profile's value if this
one did not start with it, or without it if this one did: a trial and a steady point at the
batch of the profile's fastest point, then trials at the largest batch the search trained, the
first that did not fit, and a few percent beyond, until one does not fit. The setting is kept
where the largest batch with it is at least the one without it and its point is not slower
(within ``probe.judge``'s noise), else dropped, with the numbers either way. The fresh process
shares the GPU with this one's context, which counts against whichever arm it runs: against
the setting, where this process did not start with it.

It is measured with the settings the profile trains with: where the probe kept a variant
(compile, compile's memory budget, activation checkpointing), the fresh process trains that
variant (its settings cross as JSON, and the child prepares its model as they say: it pays the
compile again), at the variant's fastest point and at the sizes of the variant's own search;
the memory a batch needs is the variant's, not eager training's.

Where J1 sets it and it is not measured, the record says why (``not measured: ...``) and J1
keeps it with that reason: the search did not stop for memory, no point was steady, objects in
hand (a fresh process cannot have them) or ranks, or the time left cannot pay for the fresh
process. Off CUDA, or where J1 does not set it, there is no record: J1 says why it is not set.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

from torch_autotune.evidence import EAGER, AllocatorRecord, SearchTrialRecord, ThroughputRecord
from torch_autotune.probe.findings import RunState
from torch_autotune.probe.fresh import FreshOutcome
from torch_autotune.probe.judge import NOISE
from torch_autotune.probe.seam import Trials
from torch_autotune.probe.search_phase import Searched
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.trials import BLOCK_S, MIN_BLOCKS
from torch_autotune.probe.variant_phase import VariantOutcome
from torch_autotune.settings import Settings

__all__ = ["ALLOC_CONF", "START_S", "measure_allocator"]

ALLOC_CONF: Literal["PYTORCH_CUDA_ALLOC_CONF"] = "PYTORCH_CUDA_ALLOC_CONF"
START_S = 30.0
"""A fresh process's start before its first trial: Python, torch, CUDA's context, the model."""
SHARE = 0.25
"""The most of the time left in the run it may be predicted to take."""
POINT_S = 2 * (MIN_BLOCKS + 1) * BLOCK_S + 1.0
"""The least the fresh process's point may take: two untimed steps and its timed blocks."""
NEWER_CONF = "PYTORCH_ALLOC_CONF"
"""The allocator's variable under its device-neutral name (torch 2.9 on), read before ours."""
BEYOND = (1.05, 1.1)
"""Sizes beyond the first that did not fit, as shares of the largest that did."""
RANKS = "a fresh process of one rank is not the job's (its ranks start together)"
"""Why not measured where the seam's ``fresh`` declines after the workload could be rebuilt."""


@dataclass(frozen=True)
class _Arms:
    """Which process ran with the setting."""

    fresh_has_it: bool
    value: str


@dataclass(frozen=True)
class _Point:
    """What the fresh process repeats: the runner of the profile's settings (the base's, or the
    variant's the probe kept), its fastest point, the largest batch its own search trained and
    what limited that search, the search's trials (the base's among the run's, named
    ``variant``), its time model, and the one-off cost a new process pays again (the compile)."""

    runner: Trials
    best: ThroughputRecord | None
    largest: int | None
    limited_by: str
    search: list[SearchTrialRecord]
    variant: str
    model: TimeModel | None
    once_s: float = 0.0

    @property
    def how(self) -> str:
        """How it trains, in words: "eager", "compiled", "checkpointed", ..."""
        return _trained_as(self.runner.settings.settings)


@dataclass(frozen=True)
class _Plan:
    """What the fresh process is asked for (the point ``best``, the largest batch of its search,
    the sizes ``above``), and how long it is predicted to take."""

    best: ThroughputRecord
    largest: int
    point_s: float
    above: list[int]
    needed_s: float


def measure_allocator(
    run: RunState,
    best: ThroughputRecord | None,
    kept: VariantOutcome | None,
    searched: Searched,
    reserve_s: float,
) -> AllocatorRecord | None:
    """The allocator's setting J1 wants against this process's, at ``best``, the fastest point
    of the profile's settings: the base's (``searched``), or those of ``kept``, the variant the
    probe kept (module docstring); ``reserve_s``: seconds kept for the phases after this one.
    None where J1 does not set it; where it is not measured, a record that says why."""
    wanted = run.rules_only.settings.environment.get(ALLOC_CONF)
    if run.runner.settings.device != "cuda" or wanted is None:
        return None
    arms = _Arms(fresh_has_it=not _has_it(wanted), value=wanted)
    at = _point(run, best, kept, searched)
    plan = _plan(run, at, reserve_s)
    if isinstance(plan, str):
        return _unmeasured(arms, plan)
    environment: dict[str, str | None] = {ALLOC_CONF: wanted if arms.fresh_has_it else None}
    environment[NEWER_CONF] = None  # read before ours from torch 2.9: the child has ours alone
    with run.budget.phase("allocator"):
        how = "with" if arms.fresh_has_it else "without"
        run.report("allocator", f"a fresh process {how} {wanted}, {at.how}")
        found = at.runner.fresh(
            environment,
            batch=plan.best.batch_size,
            above=plan.above,
            seconds=max(2 * plan.point_s, POINT_S),
            timeout_s=3 * plan.needed_s,
        )
    if found is None:
        return _unmeasured(arms, RANKS)
    return _record(arms, found, plan.best, plan.largest, at.how)


def _trained_as(settings: Settings) -> str:
    """How ``settings`` train, in words: compiled (under a memory budget), checkpointed, both,
    or neither ("eager")."""
    ways = []
    if settings.compile.enabled:
        budget = settings.compile.memory_budget
        ways.append(
            "compiled" if budget is None else f"compiled under a memory budget of {budget:g}"
        )
    if settings.activation_checkpointing:
        ways.append("checkpointed")
    return " and ".join(ways) or "eager"


def _point(
    run: RunState, best: ThroughputRecord | None, kept: VariantOutcome | None, searched: Searched
) -> _Point:
    """The point of the profile's settings: the base's search and ``best``, or ``kept``'s."""
    if kept is None:
        found, model = searched.found, searched.guard.model
        return _Point(run.runner, best, found.largest, found.limited_by, run.search, EAGER, model)
    once = kept.paid_s
    if once is None:  # no step of it ran before its points: as the plan predicted it
        once = kept.variant.warmup_s(kept.runner.leaf_modules())
    limited_by = kept.limited_by or "no search of its own"
    search, name = kept.search, kept.variant.name
    return _Point(kept.runner, best, kept.largest, limited_by, search, name, kept.model, once)


def _plan(run: RunState, at: _Point, reserve_s: float) -> _Plan | str:
    """What the fresh process runs at ``at``, or why it is not measured (module docstring)."""
    if at.limited_by != "memory" or at.largest is None:
        return f"the batch is not memory-bound (limited by {at.limited_by})"
    if at.best is None:
        return "no throughput point was steady, to be compared with one in a fresh process"
    compiled = run.compile
    if compiled is not None and compiled.kept and not compiled.measured and at.variant == EAGER:
        return (
            "the profile compiles without compile measured here (it did not fit the time), so"
            " no point of the profile's settings ran to be compared with a fresh process's"
        )
    if run.workload.rebuild is None:
        return (
            "objects in hand cannot be rebuilt in a fresh process (a workload given by name or "
            "as module:factory can be)"
        )
    steps = at.runner.settings.steps
    point = at.model.predict(at.best.batch_size, 1 + MIN_BLOCKS) if at.model else None
    trial = at.model.predict(at.largest, steps) if at.model else None
    if point is None or trial is None:
        return "the fresh process's time could not be predicted from the search's trials"
    above = _above(at.largest, at.search, at.variant)
    needed = START_S + at.once_s + point.seconds + trial.seconds * (1 + len(above))
    left = max(0.0, run.budget.left_in_run() - reserve_s)
    if needed > SHARE * left:
        paid = ", its compile" if at.runner.settings.settings.compile.enabled else ""
        return (
            f"a fresh process was predicted to take about {needed:.0f} s (its start{paid}, a "
            f"point and {1 + len(above)} trials), more than {SHARE:.0%} of the {left:.0f} s "
            "left; give it more time with --budget"
        )
    return _Plan(at.best, at.largest, point.seconds, above, needed)


def _unmeasured(arms: _Arms, why: str) -> AllocatorRecord:
    """The record of a setting J1 keeps without a measurement, and why."""
    reason = f"not measured: {why}"
    return AllocatorRecord(value=arms.value, fresh_has_it=arms.fresh_has_it, reason=reason)


def _has_it(wanted: str) -> bool:
    """Whether this process started with ``wanted`` (each of its options) under either name."""
    given = ",".join(os.environ.get(name, "") for name in (NEWER_CONF, ALLOC_CONF))
    options = {o.strip().lower() for o in given.split(",") if o.strip()}
    return {o.strip().lower() for o in wanted.split(",")} <= options


def _above(largest: int, search: list[SearchTrialRecord], variant: str = EAGER) -> list[int]:
    """The largest ``variant``'s search trained, the first size above it that ran out of
    memory, and ``BEYOND`` it, in order."""
    failed = [
        t.batch_size
        for t in search  # the variant's own trials that ran and ran out (not those refused)
        if not t.fits
        and t.seconds is not None
        and t.batch_size > largest
        and t.variant.partition(",")[0] == variant
    ]
    first = min(failed, default=largest + 1)
    beyond = [max(first + 1, math.ceil(largest * share)) for share in BEYOND]
    return sorted({largest, first, *beyond})


def _record(
    arms: _Arms, found: FreshOutcome, best: ThroughputRecord, largest: int, how: str
) -> AllocatorRecord:
    """The record of what both processes found, training ``how``, kept or not, and why."""
    if found.error is not None:
        return _unmeasured(arms, f"the fresh process failed ({found.error})")
    here, there = (largest, best.samples_per_s), (found.largest, found.samples_per_s)
    with_it, without = (there, here) if arms.fresh_has_it else (here, there)
    said = {True: _fresh_sizes(found, largest), False: str(largest)}
    sizes = (said[arms.fresh_has_it], said[not arms.fresh_has_it])
    rates = (with_it[1], without[1])
    return AllocatorRecord(
        value=arms.value,
        fresh_has_it=arms.fresh_has_it,
        measured=True,
        batch_size=best.batch_size,
        largest_with=with_it[0],
        largest_without=without[0],
        samples_per_s_with=with_it[1],
        samples_per_s_without=without[1],
        kept=_kept(with_it[0], without[0], *rates),
        reason=_reason(arms, sizes, rates, best.batch_size, how),
    )


def _fresh_sizes(found: FreshOutcome, largest: int) -> str:
    """What the fresh process's trials say of its largest batch, beside this one's."""
    fits = sorted(found.fits.items())
    failed = [size for size, fit in fits if not fit]
    if found.largest is None or found.largest < largest:
        return f"below {largest} ({min(failed, default=largest)} ran out of memory)"
    if not failed:
        return f"at least {found.largest} (every size tried trained)"
    return f"{found.largest} ({min(failed)} ran out of memory)"


def _kept(
    largest_with: int | None,
    largest_without: int | None,
    rate_with: float | None,
    rate_without: float | None,
) -> bool:
    """Kept where it trains at least the largest batch without it, and raises it or is not
    slower (a point that was not steady in either process does not count against it)."""
    if largest_with is None:
        return False
    if largest_without is None:  # without it, not even the point's batch trained
        return True
    if largest_with < largest_without:
        return False
    if largest_with > largest_without or rate_with is None or rate_without is None:
        return True
    return rate_with >= (1 - NOISE) * rate_without


def _reason(
    arms: _Arms,
    sizes: tuple[str, str],
    rate: tuple[float | None, float | None],
    batch: int,
    how: str,
) -> str:
    """The numbers of both processes, which ran in the fresh one, and how both trained."""
    fresh = "with it" if arms.fresh_has_it else "without it"

    def speed(value: float | None) -> str:
        return "not steady" if value is None else f"{value:,.0f} samples/s"

    return (
        f"measured, {fresh} in a fresh process (it is read when CUDA starts; that process "
        f"shares the GPU with this one's context): the largest batch that trained {how} was "
        f"{sizes[0]} with it and {sizes[1]} without; at batch {batch}, {speed(rate[0])} with "
        f"it and {speed(rate[1])} without"
    )
