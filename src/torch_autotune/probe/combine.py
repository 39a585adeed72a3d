"""What the ranks of a job measured, combined into one outcome of the seam (``probe.ranks``):
a size fits only where it fit on every rank, a step takes the slowest rank's time, the group
trains every rank's samples, the DataLoader feeds the group as fast as its slowest rank. Pure:
no torch, no process group.
"""

from __future__ import annotations

from torch_autotune.probe.fed import FedTrial
from torch_autotune.probe.loader import LoaderTrial
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.trials import PointOutcome

__all__ = ["combine_fed", "combine_loads", "combine_points", "combine_trials"]


def _most(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def combine_trials(found: list[TrialOutcome]) -> TrialOutcome:
    """A search trial over every rank: it fits only where it fit on each; the largest peak,
    the slowest time (DDP steps at the pace of its slowest rank).

    On the CPU under ``--memory-limit``, a rank's trial that took more than the cap fails with
    its peak, where one that ran out of memory has none: the job's trial failed over the cap
    only where every rank that failed did, with the largest such peak. What the ranks held as
    they began (``held_bytes``) is given as the largest peak less the largest growth over it,
    so that the cap reads the rank that grew most and the RAM budget the fullest rank."""
    failed = [t for t in found if not t.fits]
    if failed:
        over = [t.peak_memory_bytes for t in failed]
        return TrialOutcome(False, max(over) if None not in over else None)  # type: ignore[type-var]
    peaks = [t.peak_memory_bytes for t in found]
    peak = max(peaks) if None not in peaks else None  # type: ignore[type-var]
    grown = [
        t.peak_memory_bytes - t.held_bytes
        for t in found
        if t.peak_memory_bytes is not None and t.held_bytes is not None
    ]
    held = peak - max(grown) if peak is not None and len(grown) == len(found) else None
    return TrialOutcome(
        True,
        peak,
        _most([t.seconds for t in found]),
        warmup_s=_most([t.warmup_s for t in found]),
        step_s=_most([t.step_s for t in found]),
        held_bytes=held,
    )


def combine_points(found: list[PointOutcome]) -> PointOutcome:
    """A throughput point over every rank: the group's samples/s (the sum of the ranks': each
    trains its own batch in the same synchronised steps), steady only where every rank's was,
    the widest spread, the slowest step, the largest peak."""
    first = found[0]
    if not all(p.fits for p in found):
        return PointOutcome(first.batch_size, False, seconds=max(p.seconds for p in found))
    rates = [p.samples_per_s for p in found]
    peaks = [p.peak_memory_bytes for p in found]
    return PointOutcome(
        first.batch_size,
        True,
        samples_per_s=sum(r for r in rates if r is not None) if None not in rates else None,
        relative_spread=_most([p.relative_spread for p in found]),
        steady=all(p.steady for p in found),
        warmup_s=_most([p.warmup_s for p in found]),
        step_s=_most([p.step_s for p in found]),
        blocks=max(p.blocks for p in found),
        peak_memory_bytes=max(peaks) if None not in peaks else None,  # type: ignore[type-var]
        seconds=max(p.seconds for p in found),
    )


def combine_loads(found: list[LoaderTrial]) -> LoaderTrial:
    """The DataLoader measured on every rank at once (they share the node's CPUs): the group
    is fed as fast as its slowest rank's loader, times the ranks."""
    failed = [t for t in found if not t.ok]
    if failed:
        return failed[0]
    slowest = min(found, key=lambda t: t.samples_per_s or 0.0)
    return LoaderTrial(
        slowest.num_workers,
        (slowest.samples_per_s or 0.0) * len(found),
        sum(t.batches for t in found),
        sum(t.samples for t in found),
        max(t.seconds for t in found),
        startup_s=_most([t.startup_s for t in found]),
    )


def combine_fed(found: list[FedTrial]) -> FedTrial:
    """Training fed by the DataLoader on every rank at once: the slowest rank's rate, times the
    ranks (DDP trains at its slowest rank's pace)."""
    failed = [t for t in found if not t.ok]
    if failed:
        return failed[0]
    slowest = min(found, key=lambda t: t.samples_per_s or 0.0)
    rate = (slowest.samples_per_s or 0.0) * len(found)
    return FedTrial(
        slowest.batch_size,
        slowest.num_workers,
        slowest.threads,
        rate,
        max(t.seconds for t in found),
    )
