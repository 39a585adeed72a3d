"""What the charts show, as plain data: rows, rates, marks and labels from a measured profile.

Shared by the PNG (``plot.png``) and the terminal (``plot.text``), so both draw the same
numbers and say the same words. Pure: this module imports neither matplotlib, rich nor torch,
draws nothing and prints nothing.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch_autotune.errors import ProfileFileError
from torch_autotune.probe.points import FASTEST_WITHIN
from torch_autotune.probe.workers import format_share, keeps_ahead, serial_share
from torch_autotune.profile import (
    Evidence,
    Profile,
    SearchTrialRecord,
    Source,
    target_accelerators,
)

if TYPE_CHECKING:
    from torch_autotune.bench import BenchEvidence, Effect

GIB = 1 << 30


@dataclass(frozen=True)
class BatchRow:
    """One batch size: its throughput (None: not timed, or did not fit) and why it matters."""

    batch_size: int
    samples_per_s: float | None
    relative_spread: float | None
    status: str  # "timed", "ran (not timed)", "out of memory", "not run (...)"
    marks: tuple[str, ...]  # "recommended", "fastest" (``fastest_marks``), "largest that ran"
    series: str | None = None  # the series of its point ("eager", ...); None: not timed


@dataclass(frozen=True)
class Point:
    """One throughput point of a series: samples/s at a batch size."""

    batch_size: int
    samples_per_s: float
    relative_spread: float | None  # (max - min) / median of its blocks; None: one pass
    steady: bool  # its blocks agreed: a point the batch may be chosen from


@dataclass(frozen=True)
class Series:
    """The points of one variant, by batch size: the eager step, the compiled step, the step
    with activation checkpointing, or training fed by the DataLoader with one worker count."""

    name: str  # "eager", "compiled", "checkpointed", "fed, 2 workers, 1 thread, compiled"
    kind: str  # "eager", "compiled", "memory-budgeted", "checkpointed" or "fed"
    points: tuple[Point, ...]
    fed_by: tuple[int, int | None] | None = None  # a fed series': (workers, CPU threads)


@dataclass(frozen=True)
class Chosen:
    """What the profile trains with, which the charts mark: its batch with the words that mark
    it, and the DataLoader workers and CPU threads that pick its fed series (None workers: none
    given, the fastest fed pass at the batch stands for it; None threads: torch's default)."""

    batch_size: int
    num_workers: int | None = None
    cpu_threads: int | None = None
    marks: tuple[str, ...] = ("recommended",)  # and why it is not the probe's, where it is not


def chosen(profile: Profile) -> Chosen:
    """The batch, workers and threads of ``profile`` the charts mark (``Chosen``). The batch
    is the profile's (the probe's where the profile sets none), which ``autotune bench`` or a
    hand edit may have changed from the one the probe chose: its marks then say which."""
    evidence = measured(profile)
    settings = profile.settings
    batch = settings.batch.batch_size or evidence.batch_size
    workers, threads = settings.dataloader.num_workers, settings.cpu_threads
    if batch == evidence.batch_size:
        return Chosen(batch, workers, threads)
    decision = profile.decision("batch.batch_size")
    marks = ("recommended", f"the probe chose {evidence.batch_size}")
    if decision is not None and decision.source is Source.USER:
        marks = ("set by hand", marks[1])
    elif decision is not None and decision.rule in ("M1", "M2"):
        marks = ("recommended", f"the bench changed it from {evidence.batch_size}")
    return Chosen(batch, workers, threads, marks)


STEP_KINDS = ("eager", "compiled", "memory-budgeted", "checkpointed")
"""The series of the training step, in the order they are drawn."""


def _chosen_kind(evidence: Evidence) -> str:
    """The series the recommended batch's point came from (eager where none was chosen)."""
    choice = evidence.batch_choice
    return "eager" if choice is None else evidence.kind_of(choice.variant)


@dataclass(frozen=True)
class EffectRow:
    """One bar of the bench panel."""

    setting: str  # "whole profile" or the setting's name
    label: str  # "batch_size 32→106"
    arm: str  # "as tuned", "after drops", "on alone", "in the profile"
    effect: Effect | None
    dropped: bool
    note: str = "not measured"  # in the bar's place where ``effect`` is None


def measured(profile: Profile) -> Evidence:
    """The profile's evidence; ProfileFileError when the profile holds the rules' settings only."""
    if profile.evidence is None:
        raise ProfileFileError(
            "not measured: this profile holds the rules' settings only, so there is nothing to "
            "plot; run autotune first (it measures batch sizes and DataLoader workers on this "
            "machine), and 'autotune bench' for the settings' effects"
        )
    return profile.evidence


def panels(evidence: Evidence) -> list[str]:
    """The panels there is data for, in order: 'throughput', 'loader', 'bench'."""
    found = []
    if evidence.throughput or evidence.search:
        found.append("throughput")
    if evidence.loader:
        found.append("loader")
    if evidence.bench is not None:
        found.append("bench")
    return found


def _why_not(trial: SearchTrialRecord) -> str:
    """Why a size did not fit, in words: it ran out of memory, took more host RAM than
    --memory-limit (the CPU's), or the probe did not run it."""
    if "time-guard" in trial.step:
        return "not run (too slow for the time budget)"
    if "ram-guard" in trial.step:
        return "not run (predicted beyond host RAM)"
    if trial.step.startswith("over --memory-limit"):  # the CPU's: it took more than the cap
        return (
            "not run (predicted over --memory-limit)"
            if "not run" in trial.step
            else ("over --memory-limit")
        )
    if "not run" in trial.step:
        return "not run"
    return "out of memory"


def first_misfit(evidence: Evidence) -> tuple[int, str] | None:
    """The smallest size above the largest that ran which did not fit, and why; None if the
    search stopped for another reason (a cap) with no larger size tried."""
    above = [t for t in evidence.search if not t.fits and t.batch_size > evidence.max_batch_size]
    if not above:
        return None
    trial = min(above, key=lambda t: t.batch_size)
    return trial.batch_size, _why_not(trial)


def misfit_band(evidence: Evidence) -> str | None:
    """What the band from the first misfit up says of the sizes in it: '832 and up: out of
    memory' where every size there that was tried did not fit for the same reason; where they
    differ, each reason at the smallest size it holds for ('55 and up: 55 not run (predicted
    over --memory-limit), 56 over --memory-limit'), so that no size that ran is said not to
    have run. None where there is no misfit."""
    above = sorted(
        (t for t in evidence.search if not t.fits and t.batch_size > evidence.max_batch_size),
        key=lambda t: t.batch_size,
    )
    if not above:
        return None
    reasons: dict[str, int] = {}
    for trial in above:
        reasons.setdefault(_why_not(trial), trial.batch_size)
    first = above[0].batch_size
    if len(reasons) == 1:
        return f"{first} and up: {next(iter(reasons))}"
    return f"{first} and up: " + ", ".join(f"{size} {why}" for why, size in reasons.items())


def throughput_series(evidence: Evidence) -> list[Series]:
    """One series per variant that ran points, in this order: the eager step, the compiled
    step, and training fed by the DataLoader, one series per worker count (and thread count);
    a variant with no point that ran is left out."""
    chosen = _chosen_kind(evidence)  # the fed passes ran as the choice did
    series = []
    for name in STEP_KINDS:
        points = [
            Point(r.batch_size, r.samples_per_s, r.relative_spread, r.steady)
            for r in evidence.throughput
            if evidence.kind_of(r.variant) == name
        ]
        if points:
            series.append(Series(name, name, tuple(sorted(points, key=_size))))
    fed: dict[tuple[int, int | None], dict[int, list[float]]] = {}
    for f in evidence.fed:
        if f.samples_per_s is not None:
            by_size = fed.setdefault((f.num_workers, f.cpu_threads), {})
            by_size.setdefault(f.batch_size, []).append(f.samples_per_s)
    own = not any(f.dataloader for f in evidence.fed)  # no dataset: its own batches
    for (workers, threads), rates in sorted(fed.items(), key=lambda i: (i[0][0], i[0][1] or 0)):
        name = "own batches" if own else f"fed, {workers} worker{'s' if workers != 1 else ''}"
        threads_named = f"{threads} thread{'s' if threads != 1 else ''}"
        name += f", {threads_named}" if threads is not None else ", default threads" * own
        name += f", {chosen}" if chosen != "eager" else ""
        fed_points = tuple(_fed_point(size, rates[size]) for size in sorted(rates))
        series.append(Series(name, "fed", fed_points, (workers, threads)))
    return series


def _fed_point(batch_size: int, rates: list[float]) -> Point:
    """The passes fed at one batch with one worker and thread count as one point: one pass
    (no spread), or the two rounds of ``probe.fed_rounds``, their median and spread, as the
    step's points give theirs."""
    if len(rates) == 1:
        return Point(batch_size, rates[0], None, True)
    middle = statistics.median(rates)
    return Point(batch_size, middle, (max(rates) - min(rates)) / middle, True)


def _size(point: Point) -> int:
    return point.batch_size


def recommended_series(evidence: Evidence, mark: Chosen | None = None) -> str | None:
    """The name of the series the recommended batch was chosen from: compiled where the chosen
    point ran compiled, a fed series where the passes fed by the DataLoader chose it (the one of
    the profile's workers and CPU threads in ``mark``, else of its workers, else the fastest
    at that size), else eager; None where no series has a point at the recommended batch."""
    mark = mark or Chosen(evidence.batch_size)
    choice = evidence.batch_choice
    at = [
        (s, p)
        for s in throughput_series(evidence)
        for p in s.points
        if p.batch_size == mark.batch_size
    ]
    if choice is not None and choice.fed:
        fed = [(s, p) for s, p in at if s.fed_by is not None]
        mine = [(s, p) for s, p in fed if s.fed_by == (mark.num_workers, mark.cpu_threads)]
        workers = [(s, p) for s, p in fed if s.fed_by and s.fed_by[0] == mark.num_workers]
        best = max(mine or workers or fed, key=lambda sp: sp[1].samples_per_s, default=None)
        return None if best is None else best[0].name
    kind = _chosen_kind(evidence)
    return next((s.name for s, _ in at if s.kind == kind), None)


def fastest_measured(evidence: Evidence) -> int | None:
    """The fastest batch where steady points measured one (None: none did, or it was not)."""
    choice = evidence.batch_choice
    if choice is None:  # evidence of an earlier release: a steady point at that size
        steady = {r.batch_size for r in evidence.throughput if r.steady}
        return evidence.fastest_batch_size if evidence.fastest_batch_size in steady else None
    return evidence.fastest_batch_size if choice.chosen_by == "fastest point" else None


def fastest_marks(evidence: Evidence) -> dict[int, str]:
    """The step's sizes marked, of the kind the batch was chosen from (``_chosen_kind``): the
    fastest steady point's, 'fastest'; where the step chose a smaller size within
    ``FASTEST_WITHIN`` of it (``fastest_measured``), that one's, 'within 3% of the fastest'
    (a size further below it, of an earlier release, is left unmarked). Empty where no
    steady point measured the fastest."""
    at = fastest_measured(evidence)
    kind = _chosen_kind(evidence)
    steady = [
        p for s in throughput_series(evidence) if s.kind == kind for p in s.points if p.steady
    ]
    if at is None or not steady:
        return {}
    best = max(steady, key=lambda p: (p.samples_per_s, -p.batch_size))
    mine = max((p.samples_per_s for p in steady if p.batch_size == at), default=0.0)
    if best.batch_size == at or mine >= best.samples_per_s:
        return {at: "fastest"}
    marks = {best.batch_size: "fastest"}
    if mine >= best.samples_per_s * (1 - FASTEST_WITHIN):
        marks[at] = f"within {FASTEST_WITHIN:.0%} of the fastest"
    return marks


def batch_rows(evidence: Evidence, mark: Chosen | None = None) -> list[BatchRow]:
    """A row per point of each series (``throughput_series``), and one for the profile's
    batch, the largest size and the first size that did not fit where no point stands for
    them; sorted by size, the series in their order. ``mark``: the profile's (``chosen``;
    default, the probe's batch), whose batch it marks and whose workers and CPU threads mark
    the fed pass where the fed passes chose the batch."""
    mark = mark or Chosen(evidence.batch_size)
    misfit = first_misfit(evidence)
    picked = recommended_series(evidence, mark)
    fastest = fastest_marks(evidence)  # points of the step, compiled if the choice was
    kind = _chosen_kind(evidence)
    rows: list[tuple[int, int, BatchRow]] = []
    for order, series in enumerate(throughput_series(evidence)):
        for p in series.points:
            marks: tuple[str, ...] = ()
            if p.batch_size == mark.batch_size and series.name == picked:
                marks = mark.marks
            elif p.batch_size in fastest and series.kind == kind:
                marks = (fastest[p.batch_size],)
            row = BatchRow(p.batch_size, p.samples_per_s, p.relative_spread, "timed", marks)
            rows.append((p.batch_size, order, replace(row, series=series.name)))
    timed = {size for size, _, _ in rows}
    if picked is None:
        rows.append((mark.batch_size, -1, _untimed(evidence, mark.batch_size, mark.marks)))
    if evidence.max_batch_size not in timed and evidence.max_batch_size != mark.batch_size:
        rows.append((evidence.max_batch_size, -1, _untimed(evidence, evidence.max_batch_size, ())))
    if misfit is not None and misfit[0] not in timed:
        rows.append((misfit[0], -1, BatchRow(misfit[0], None, None, misfit[1], ())))
    rows.sort(key=lambda r: (r[0], r[1]))
    largest = next(i for i, (size, _, _) in enumerate(rows) if size == evidence.max_batch_size)
    row = rows[largest][2]
    rows[largest] = (0, 0, replace(row, marks=(*row.marks, "largest that ran")))
    return [row for _, _, row in rows]


def _untimed(evidence: Evidence, size: int, marks: tuple[str, ...]) -> BatchRow:
    """A size no point timed: it ran in the probe's search, or in the bench's arms only (the
    baseline's batch, say, where the bench took the profile's back to it)."""
    probed = any(t.fits and t.batch_size == size for t in evidence.search)
    bench = evidence.bench
    only_bench = not probed and bench is not None and size in bench.ran()
    status = "ran in the bench (not timed by the probe)" if only_bench else "ran (not timed)"
    return BatchRow(size, None, None, status, marks)


def memory_peaks(evidence: Evidence, kind: str | None = None) -> list[tuple[int, float]]:
    """(batch size, peak memory in GiB) of each search trial that ran and read its peak, sorted;
    of the series ``kind`` only (``Evidence.kind_of``) where given."""
    return sorted(
        (t.batch_size, t.peak_memory_bytes / GIB)
        for t in evidence.search
        if t.fits
        and t.peak_memory_bytes is not None
        and (kind is None or evidence.kind_of(t.variant) == kind)
    )


def step_rate(evidence: Evidence) -> float | None:
    """Samples/s the training step consumes at the recommended batch size, of the series the
    batch was chosen from (None: the step was not timed at that size)."""
    kind = _chosen_kind(evidence)
    at = [r for r in evidence.throughput if r.batch_size == evidence.batch_size]
    same = [r for r in at if evidence.kind_of(r.variant) == kind]
    return next((r.samples_per_s for r in same or at), None)


def loader_pace(num_workers: int, loaded: float, step: float) -> str:
    """Whether ``num_workers`` loading at ``loaded`` samples/s keeps ahead of a step of ``step``
    samples/s, by the probe's own test (``probe.workers.keeps_ahead``): 0 workers loads in
    series with the step, so a loader faster than the step can still cost training time."""
    if keeps_ahead(num_workers, loaded, step):
        return "ahead of training"
    if num_workers == 0 and loaded >= step:
        share = format_share(serial_share(loaded, step))
        return f"not ahead: in series with training, {share} of its time"
    return "behind training"


def effect_rows(bench: BenchEvidence) -> list[EffectRow]:
    """The whole profile against the baseline, as tuned and after the drops (where every
    setting was dropped, a row that says it is the baseline itself, with no bar), then each
    setting on alone and in the profile."""
    rows = [EffectRow("whole profile", "whole profile", "as tuned", bench.tuned, False)]
    if bench.final is not None:
        rows.append(EffectRow("whole profile", "whole profile", "after drops", bench.final, False))
    elif bench.final_is_baseline:
        itself = "the baseline itself"  # no arm compared it with itself
        rows.append(EffectRow("whole profile", "whole profile", "after drops", None, False, itself))
    for s in bench.settings:
        label = f"{s.setting} {s.baseline_value}→{s.tuned_value}"
        dropped = s.outcome == "dropped"
        rows.append(EffectRow(s.setting, label, "on alone", s.on_alone, dropped))
        rows.append(EffectRow(s.setting, label, "in the profile", s.off_alone, dropped))
    return rows


def hardware_name(profile: Profile) -> str:
    """'8× NVIDIA A100-SXM4-80GB', or the CPU model and how many CPUs the probe could use."""
    snapshot = profile.provenance.snapshot
    counts = Counter(a.name for a in target_accelerators(profile.settings, snapshot))
    if counts:
        return ", ".join(f"{n}× {name}" if n > 1 else name for name, n in sorted(counts.items()))
    host = snapshot.host
    return f"{host.cpu_model or 'unknown CPU'} ({host.cpus_usable} CPUs usable)"


def chart_title(profile: Profile) -> str:
    """'conv on cuda: NVIDIA H100 80GB HBM3, torch 2.8.0+cu128'."""
    evidence = measured(profile)
    torch_version = profile.provenance.torch_version or "unknown"
    return (
        f"{evidence.workload} on {evidence.device}: {hardware_name(profile)}, torch {torch_version}"
    )


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis where it is longer."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
