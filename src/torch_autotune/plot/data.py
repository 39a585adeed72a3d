"""What the charts show, as plain data: rows, rates, marks and labels from a measured profile.

Shared by the PNG (``plot.png``) and the terminal (``plot.text``), so both draw the same
numbers and say the same words. Pure: this module imports neither matplotlib, rich nor torch,
draws nothing and prints nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch_autotune.errors import ProfileFileError
from torch_autotune.profile import Evidence, Profile, SearchTrialRecord, target_accelerators

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
    marks: tuple[str, ...]  # "recommended", "fastest", "largest that ran"


@dataclass(frozen=True)
class EffectRow:
    """One bar of the bench panel."""

    setting: str  # "whole profile" or the setting's name
    label: str  # "batch_size 32→106"
    arm: str  # "as tuned", "after drops", "on alone", "in the profile"
    effect: Effect | None
    dropped: bool


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
    """Why a size did not fit, in words: it ran out of memory, or the probe did not run it."""
    if "time-guard" in trial.step:
        return "not run (too slow for the time budget)"
    if "ram-guard" in trial.step:
        return "not run (predicted beyond host RAM)"
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


def batch_rows(evidence: Evidence) -> list[BatchRow]:
    """Every timed size, the recommended and largest sizes, and the first size that did not fit."""
    timed = {r.batch_size: r for r in evidence.throughput}
    misfit = first_misfit(evidence)
    sizes = set(timed) | {evidence.batch_size, evidence.max_batch_size}
    if misfit is not None:
        sizes.add(misfit[0])
    rows = []
    for size in sorted(sizes):
        marks = []
        if size == evidence.batch_size:
            marks.append("recommended")
        elif size == evidence.fastest_batch_size:
            marks.append("fastest")
        if size == evidence.max_batch_size:
            marks.append("largest that ran")
        record = timed.get(size)
        if record is not None:
            rows.append(
                BatchRow(size, record.samples_per_s, record.relative_spread, "timed", tuple(marks))
            )
        elif misfit is not None and size == misfit[0]:
            rows.append(BatchRow(size, None, None, misfit[1], tuple(marks)))
        else:
            rows.append(BatchRow(size, None, None, "ran (not timed)", tuple(marks)))
    return rows


def memory_peaks(evidence: Evidence) -> list[tuple[int, float]]:
    """(batch size, peak memory in GiB) of each search trial that ran and read its peak, sorted."""
    return sorted(
        (t.batch_size, t.peak_memory_bytes / GIB)
        for t in evidence.search
        if t.fits and t.peak_memory_bytes is not None
    )


def step_rate(evidence: Evidence) -> float | None:
    """Samples/s the training step consumes at the recommended batch size (None: not timed)."""
    return next(
        (r.samples_per_s for r in evidence.throughput if r.batch_size == evidence.batch_size), None
    )


def effect_rows(bench: BenchEvidence) -> list[EffectRow]:
    """The whole profile against the baseline, then each setting on alone and in the profile."""
    rows = [EffectRow("whole profile", "whole profile", "as tuned", bench.tuned, False)]
    if bench.final is not None:
        rows.append(EffectRow("whole profile", "whole profile", "after drops", bench.final, False))
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
