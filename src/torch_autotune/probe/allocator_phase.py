"""The caching allocator's setting, measured (issue 21). No torch.

Rule J1 sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` on Linux with NVIDIA GPUs:
the allocator grows segments instead of leaving slivers it cannot use, so more of the GPU is
usable; PyTorch's own out-of-memory message recommends it, torchtitan always sets it, and no
one has published what it does to the largest batch of a fixed shape. It is read when CUDA
starts, so it cannot change inside this process: where memory stopped the search, a fresh
process (``probe.fresh``, through the seam's ``fresh``) runs with the profile's value if this
one did not start with it, or without it if this one did: a trial and a steady point at the
batch of this process's fastest point, then trials at the largest batch the search trained, the
first that did not fit, and a few percent beyond, until one does not fit. The setting is kept
where the largest batch with it is at least the one without it and its point is not slower
(within ``probe.judge``'s noise), else dropped, with the numbers either way. The fresh process
shares the GPU with this one's context, which counts against whichever arm it runs: against
the setting, where this process did not start with it.

Not measured (J1 decides, and says why): off CUDA or where J1 does not set it, where the
search did not stop for memory or no point was steady, for objects in hand (a fresh process
cannot have them) or ranks, or where the time left cannot pay for a process's start.
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
from torch_autotune.probe.search_phase import Searched
from torch_autotune.probe.trials import BLOCK_S, MIN_BLOCKS

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


@dataclass(frozen=True)
class _Arms:
    """Which process ran with the setting."""

    fresh_has_it: bool
    value: str


def measure_allocator(
    run: RunState, best: ThroughputRecord | None, searched: Searched, reserve_s: float
) -> AllocatorRecord | None:
    """The allocator's setting J1 wants against this process's, at the base's fastest point
    ``best`` (module docstring); None where it is not measured."""
    base, budget, largest, model = run.runner, run.budget, searched.largest, searched.guard.model
    wanted = run.rules_only.settings.environment.get(ALLOC_CONF)
    if base.settings.device != "cuda" or wanted is None or searched.found.limited_by != "memory":
        return None
    if best is None:
        return None
    point = model.predict(best.batch_size, 1 + MIN_BLOCKS)
    trial = model.predict(largest, base.settings.steps)
    if point is None or trial is None:
        return None
    above = _above(largest, run.search)
    needed = START_S + point.seconds + trial.seconds * (1 + len(above))
    if needed > SHARE * max(0.0, budget.left_in_run() - reserve_s):
        return None
    arms = _Arms(fresh_has_it=not _has_it(wanted), value=wanted)
    environment: dict[str, str | None] = {ALLOC_CONF: wanted if arms.fresh_has_it else None}
    environment[NEWER_CONF] = None  # read before ours from torch 2.9: the child has ours alone
    with budget.phase("allocator"):
        how = "with" if arms.fresh_has_it else "without"
        run.report("allocator", f"a fresh process {how} {wanted}")
        found = base.fresh(
            environment,
            batch=best.batch_size,
            above=above,
            seconds=max(2 * point.seconds, POINT_S),
            timeout_s=3 * needed,
        )
    if found is None:
        return None
    return _record(arms, found, best, largest)


def _has_it(wanted: str) -> bool:
    """Whether this process started with ``wanted`` (each of its options) under either name."""
    given = ",".join(os.environ.get(name, "") for name in (NEWER_CONF, ALLOC_CONF))
    options = {o.strip().lower() for o in given.split(",") if o.strip()}
    return {o.strip().lower() for o in wanted.split(",")} <= options


def _above(largest: int, search: list[SearchTrialRecord]) -> list[int]:
    """The largest the search trained, the first size above it that ran out of memory, and
    ``BEYOND`` it, in order."""
    failed = [
        t.batch_size
        for t in search  # the base's own trials that ran and ran out (not those refused)
        if not t.fits
        and t.seconds is not None
        and t.batch_size > largest
        and t.variant.partition(",")[0] == EAGER
    ]
    first = min(failed, default=largest + 1)
    beyond = [max(first + 1, math.ceil(largest * share)) for share in BEYOND]
    return sorted({largest, first, *beyond})


def _record(
    arms: _Arms, found: FreshOutcome, best: ThroughputRecord, largest: int
) -> AllocatorRecord:
    """The record of what both processes found, kept or not, and why."""
    if found.error is not None:
        why = f"not measured: the fresh process failed ({found.error}); kept as J1 sets it"
        return AllocatorRecord(value=arms.value, fresh_has_it=arms.fresh_has_it, reason=why)
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
        reason=_reason(arms, sizes, rates, best.batch_size),
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
    arms: _Arms, sizes: tuple[str, str], rate: tuple[float | None, float | None], batch: int
) -> str:
    """The numbers of both processes, and which ran in the fresh one."""
    fresh = "with it" if arms.fresh_has_it else "without it"

    def speed(value: float | None) -> str:
        return "not steady" if value is None else f"{value:,.0f} samples/s"

    return (
        f"measured, {fresh} in a fresh process (it is read when CUDA starts; that process "
        f"shares the GPU with this one's context): the largest batch that trained was "
        f"{sizes[0]} with it and {sizes[1]} without; at batch {batch}, {speed(rate[0])} with "
        f"it and {speed(rate[1])} without"
    )
