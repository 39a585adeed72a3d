"""The three panels of the PNG, each drawn on a matplotlib ``Axes`` that ``plot.png`` lays out.

``draw_throughput`` (batch size), ``draw_loader`` (DataLoader workers) and ``draw_bench`` take
the axes and the evidence; what each shows (rows, rates, marks, labels) comes from
``plot.data``, and each panel is built from named steps: its series, its axis, its marks, its
legend. Artists carry a ``gid`` where tests and readers look them up (``recommended``,
``misfit``, ``step-rate``, ``no-change``...). matplotlib is imported at module level only for
type checking; the legend's patches and lines are imported when a panel is drawn, so
importing this module imports neither matplotlib nor torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeAlias

from torch_autotune.plot.data import (
    GIB,
    STEP_KINDS,
    Chosen,
    effect_rows,
    first_misfit,
    memory_peaks,
    misfit_band,
    shorten,
    step_rate,
    throughput_series,
)
from torch_autotune.profile import Evidence

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.container import Container

    from torch_autotune.bench import BenchEvidence, Effect
    from torch_autotune.plot.data import EffectRow

Handle: TypeAlias = "Artist | Container"  # what a legend entry is drawn from

# Colours: blue, green and purple tell the series apart; red, for what failed or was dropped,
# always comes with a second cue (hatching, an x, a word) for readers who cannot see it.
BLUE, LIGHT_BLUE, GREEN, GREY = "#1f77b4", "#9ecae1", "#2ca02c", "#7f7f7f"
RED, PURPLE, DARK = "#d62728", "#9467bd", "#333333"
ORANGE, BROWN, TEAL, PINK = "#ff7f0e", "#8c564b", "#17becf", "#e377c2"
# One colour and marker per kind of series; fed series, dashed, cycle through their own.
_SERIES_LOOKS = {
    "eager": (BLUE, "o"),
    "compiled": (ORANGE, "s"),
    "memory-budgeted": (PURPLE, "^"),
    "checkpointed": (GREEN, "D"),
}
_FED_COLOURS = (BROWN, TEAL, PINK)
_SERIES_LABELS = {
    "eager": "training throughput, eager (median, spread)",
    "compiled": "training throughput, compiled (median, spread)",
    "memory-budgeted": "training throughput, memory budget (median, spread)",
    "checkpointed": "training throughput, activation checkpointing (median, spread)",
}
_MEMORY_LOOKS = {
    "eager": ("s", ""),
    "compiled": ("x", ", compiled"),
    "memory-budgeted": ("^", ", memory budget"),
    "checkpointed": ("D", ", checkpointed"),
}


LEGEND_GAP_FONTSIZES = 5.5
"""The legend's distance below the axes, in the legend's font sizes (8 pt): past the rotated
tick labels and the axis label, however tall the axes."""
LEGEND_COLUMN_CHARS = 38
"""The longest legend label two columns hold side by side within a panel's width, at the
legend's font size: past it, one column (two cropped the labels and the title)."""


def _legend_below(ax: Axes, handles: list[Handle], columns: int = 2) -> int:
    """The legend under the panel, in ``columns`` (one where a label is too long for two);
    the rows it takes, which the figure's height makes room for (``png.build_figure``)."""
    widest = max((len(str(h.get_label())) for h in handles), default=0)
    columns = 1 if widest > LEGEND_COLUMN_CHARS else columns
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        borderaxespad=LEGEND_GAP_FONTSIZES,  # below the rotated tick labels and the axis label
        ncol=columns,
        fontsize=8,
        frameon=False,
    )
    return -(-len(handles) // columns)


# --- batch size ---------------------------------------------------------------------------------


def draw_throughput(ax: Axes, evidence: Evidence, mark: Chosen) -> int:
    """The batch-size panel: throughput against size, the sizes that matter (``mark``: the
    profile's batch), peak memory; the rows of its legend."""
    handles = _throughput_series(ax, evidence)
    right = _batch_axis(ax, evidence, mark.batch_size)
    handles += _size_marks(ax, evidence, right, mark)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (log2)")
    ax.set_ylabel("samples/s")
    ax.set_title(f"Throughput by batch size (limited by {evidence.limited_by})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles += _draw_memory(ax, evidence)
    return _legend_below(ax, handles)


def _throughput_series(ax: Axes, evidence: Evidence) -> list[Handle]:
    """One line per series (``plot.data.throughput_series``: eager, compiled, training fed by
    the DataLoader at each worker count), samples/s against the batch, the bars spanning a
    point's relative spread (none: no bar; a fed point is one pass, or two rounds)."""
    handles: list[Handle] = []
    for i, series in enumerate(throughput_series(evidence)):
        colour, marker = _SERIES_LOOKS.get(series.kind, (BROWN, "^"))
        points = series.points
        handles.append(
            ax.errorbar(
                [p.batch_size for p in points],
                [p.samples_per_s for p in points],
                # relative_spread is (max - min) / median: half of it either side
                yerr=[p.samples_per_s * (p.relative_spread or 0.0) / 2 for p in points],
                fmt=f"{marker}-" if series.kind != "fed" else f"{marker}--",
                color=colour if series.kind != "fed" else _FED_COLOURS[i % len(_FED_COLOURS)],
                capsize=3,
                zorder=3,
                gid=f"series: {series.name}",
                label=_series_label(series.name),
            )
        )
    return handles


def _series_label(name: str) -> str:
    """The legend's words for a series: 'training fed by the DataLoader: 2 workers'."""
    if name in _SERIES_LABELS:
        return _SERIES_LABELS[name]
    if name.startswith("own batches, "):  # no dataset: ``probe.own_threads``
        return "training on its own batches: " + name.removeprefix("own batches, ")
    return "training fed by the DataLoader: " + name.removeprefix("fed, ")


def _batch_axis(ax: Axes, evidence: Evidence, batch: int) -> float:
    """A log2 axis over every size that ran or was marked, labelled where labels fit; returns
    its right end, half an octave past the largest size (the first misfit included)."""
    misfit = first_misfit(evidence)
    ran = [t.batch_size for t in evidence.search if t.fits]
    timed = sorted({p.batch_size for s in throughput_series(evidence) for p in s.points})
    marked = [batch, evidence.max_batch_size, *timed]
    right = max([*marked, *ran, misfit[0] if misfit else 0]) * 1.5
    ticks = _spaced([*marked, *sorted(ran)])
    ax.set_xscale("log", base=2)
    ax.set_xlim(min([*marked, *ran]) / 1.5, right)
    ax.set_xticks(ticks, labels=[str(s) for s in ticks])
    ax.minorticks_off()
    ax.tick_params(axis="x", labelsize=8, labelrotation=45)
    return right


def _spaced(sizes: list[int], octaves: float = 0.3) -> list[int]:
    """The sizes whose labels do not collide on a log2 axis, earlier ones first to be kept."""
    kept: list[int] = []
    for size in sizes:
        if all(abs(math.log2(size / other)) >= octaves for other in kept):
            kept.append(size)
    return sorted(kept)


def _size_marks(ax: Axes, evidence: Evidence, right: float, mark: Chosen) -> list[Handle]:
    """The profile's batch (``mark``: 'recommended: 32 (the bench changed it from 512)'), the
    largest that ran, and the first misfit shaded up to ``right``."""
    why = f" ({'; '.join(mark.marks[1:])})" if len(mark.marks) > 1 else ""
    marks: list[Handle] = [
        ax.axvline(
            mark.batch_size,
            color=GREEN,
            linestyle="--",
            linewidth=1.5,
            gid="recommended",
            label=f"{mark.marks[0]}: {mark.batch_size}{why}",
        )
    ]
    if evidence.max_batch_size != mark.batch_size:
        marks.append(
            ax.axvline(
                evidence.max_batch_size,
                color=GREY,
                linestyle=":",
                linewidth=1.5,
                gid="largest",
                label=f"largest that ran: {evidence.max_batch_size}",
            )
        )
    misfit = first_misfit(evidence)
    if misfit is not None:
        marks.append(
            ax.axvspan(
                misfit[0],
                right,
                color=RED,
                alpha=0.12,
                linewidth=0,
                gid="misfit",
                label=misfit_band(evidence),
            )
        )
    return marks


def _draw_memory(ax: Axes, evidence: Evidence) -> list[Handle]:
    """Peak memory of the trials that ran, in GiB on a twin axis, and the device's limit."""
    peaks = memory_peaks(evidence)
    if not peaks:
        return []
    memory = ax.twinx()
    memory.set_label("memory")
    handles: list[Handle] = []
    for kind in STEP_KINDS:  # one curve a kind: checkpointing moves the curve, not a point
        mine = memory_peaks(evidence, kind)
        if not mine:
            continue
        marker, suffix = _MEMORY_LOOKS[kind]
        handles += memory.plot(
            [b for b, _ in mine],
            [m for _, m in mine],
            marker,
            color=PURPLE,
            markersize=5,
            alpha=0.8,
            label=f"peak memory of a search trial{suffix}",
        )
    top = max(m for _, m in peaks)
    if evidence.memory_limit_bytes is not None:
        limit = evidence.memory_limit_bytes / GIB
        top = max(top, limit)
        handles.append(
            memory.axhline(
                limit,
                color=PURPLE,
                linestyle="-.",
                linewidth=1.2,
                gid="memory-limit",
                label=f"memory the trials could use: {limit:.1f} GiB",
            )
        )
    memory.set_ylim(0, top * 1.12)
    memory.set_ylabel("peak memory (GiB)", color=PURPLE)
    memory.tick_params(axis="y", colors=PURPLE, labelsize=8)
    return handles


# --- DataLoader workers -------------------------------------------------------------------------


def draw_loader(ax: Axes, evidence: Evidence, chosen: int) -> int:
    """The DataLoader panel: a bar per worker count tried, against the training step's rate."""
    records = sorted(evidence.loader, key=lambda r: r.num_workers)
    rates = [r.samples_per_s for r in records if r.samples_per_s is not None]
    rate = step_rate(evidence)
    top = max([*rates, rate or 0.0, 1.0])
    for i, r in enumerate(records):
        if r.samples_per_s is None:
            _failed_count(ax, i, r.error or "failed", top)
            continue
        colour = GREEN if r.num_workers == chosen else LIGHT_BLUE
        ax.bar(i, r.samples_per_s, color=colour, width=0.65, gid=f"workers-{r.num_workers}")
        ax.text(i, r.samples_per_s, f"{r.samples_per_s:,.0f}", ha="center", va="bottom", fontsize=8)
    handles = _loader_legend(evidence, chosen)
    if rate is not None:
        handles.append(
            ax.axhline(
                rate,
                color=DARK,
                linestyle="--",
                linewidth=1.2,
                gid="step-rate",
                label=f"training consumes {rate:,.0f}/s (batch {evidence.batch_size})",
            )
        )
    ax.set_xticks(range(len(records)), labels=[str(r.num_workers) for r in records])
    pad = max(0.0, (3 - len(records)) / 2)  # a lone bar is not as wide as the panel
    ax.set_xlim(-0.6 - pad, len(records) - 0.4 + pad)
    ax.set_ylim(0, top * 1.15)
    ax.set_xlabel("DataLoader workers")
    ax.set_ylabel("samples/s loaded")
    ax.set_title("DataLoader: keeps ahead of training?", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return _legend_below(ax, handles)


def _failed_count(ax: Axes, at: int, error: str, top: float) -> None:
    """A worker count that failed: an x on the axis and its error written upwards."""
    ax.plot(at, 0, "x", color=RED, markersize=10, markeredgewidth=2, clip_on=False)
    ax.text(
        at,
        top * 0.04,
        shorten(f"failed: {error}", 60),
        rotation=90,
        fontsize=7,
        color=RED,
        ha="center",
        va="bottom",
    )


def _loader_legend(evidence: Evidence, chosen: int) -> list[Handle]:
    """Legend entries for the kinds of bar drawn: measured, chosen, failed."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    records = evidence.loader
    handles: list[Handle] = []
    if any(r.num_workers != chosen and r.samples_per_s for r in records):
        handles.append(Patch(color=LIGHT_BLUE, label="measured"))
    if any(r.num_workers == chosen and r.samples_per_s for r in records):
        handles.append(Patch(color=GREEN, label=f"chosen: {chosen}"))
    if any(r.samples_per_s is None for r in records):
        handles.append(
            Line2D([], [], marker="x", color=RED, linestyle="none", label="failed (error shown)")
        )
    return handles


# --- bench --------------------------------------------------------------------------------------


def draw_bench(ax: Axes, bench: BenchEvidence) -> int:
    """The bench panel: a horizontal bar per arm from 1.00x, grouped by setting, top down."""
    rows = effect_rows(bench)
    positions, ticks, labels, end = _bench_layout(rows)
    extremes = [1.0]
    for row, at in zip(rows, positions, strict=True):
        if row.effect is None:
            ax.text(
                1.0,
                at,
                f"  {row.note}",
                va="center",
                fontsize=7,
                color=GREY,
                gid=f"{row.setting}: {row.arm}",
            )
            continue
        extremes += [row.effect.low, row.effect.high]
        _effect_bar(ax, row, row.effect, at)
    low, high = min(extremes), max(extremes)
    pad = max(0.12 * (high - low), 0.05)
    ax.set_xlim(low - pad, high + pad)
    pad = max(0.0, (3.0 - (end + 0.3)) / 2)  # a few bars are not as thick as the panel
    ax.set_ylim(end - 0.1 + pad, -0.4 - pad)  # top to bottom in the order of the report
    ax.axvline(1.0, color="black", linewidth=1, gid="no-change")
    ax.set_yticks(ticks, labels=labels, fontsize=8)
    for label, text in zip(ax.get_yticklabels(), labels, strict=True):
        if text.endswith("(dropped)"):
            label.set_color(RED)
    ax.set_xlabel("speedup (1.00x = no change)")
    ax.set_title("Bench: what each setting is worth", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _legend_below(ax, _bench_legend(bench, rows), columns=1)


def _bench_layout(rows: list[EffectRow]) -> tuple[list[float], list[float], list[str], float]:
    """Where each bar sits (0.4 apart, 0.5 more between settings), one tick and label per
    setting, and where the last bar ends."""
    after_drops = sum(row.setting == "whole profile" for row in rows) > 1
    positions: list[float] = []
    ticks: list[float] = []
    labels: list[str] = []
    y = 0.0
    previous = None
    for row in rows:
        if row.setting != previous:
            y += 0.5 if previous is not None else 0.0
            ticks.append(y + (0.2 if row.setting != "whole profile" or after_drops else 0.0))
            labels.append(row.label + (" (dropped)" if row.dropped else ""))
            previous = row.setting
        positions.append(y)
        y += 0.4
    return positions, ticks, labels, y


def _effect_bar(ax: Axes, row: EffectRow, e: Effect, at: float) -> None:
    """One arm (``e``, the effect ``row`` measured): a bar from 1.00x to the median, whiskers
    to the lowest and highest round, the value beside it."""
    colours = {"as tuned": DARK, "after drops": GREEN, "on alone": LIGHT_BLUE}
    colours["in the profile"] = BLUE
    ax.barh(
        at,
        e.speedup - 1.0,
        left=1.0,
        height=0.34,
        color=RED if row.dropped else colours[row.arm],
        alpha=0.55 if row.dropped else 1.0,
        edgecolor=RED if row.dropped else "none",
        hatch="//" if row.dropped else None,
        xerr=[[e.speedup - e.low], [e.high - e.speedup]],
        error_kw={"ecolor": DARK, "capsize": 2, "linewidth": 0.8},
        gid=f"{row.setting}: {row.arm}",
    )
    slower = e.verdict == "slower"  # labelled on the left; noise around 1.00x on the right
    ax.annotate(
        f"{e.speedup:.2f}x",
        (min(e.low, 1.0) if slower else max(e.high, 1.0), at),
        xytext=(-3 if slower else 3, 0),
        textcoords="offset points",
        va="center",
        fontsize=7,
        ha="right" if slower else "left",
    )


def _bench_legend(bench: BenchEvidence, rows: list[EffectRow]) -> list[Handle]:
    """Legend entries for the arms, after drops when the bench dropped a setting, and dropped."""
    from matplotlib.patches import Patch

    handles: list[Handle] = [
        Patch(color=DARK, label="profile vs baseline"),
        Patch(color=LIGHT_BLUE, label="on alone: baseline + it vs baseline"),
        Patch(color=BLUE, label="in the profile: profile vs without it"),
    ]
    if bench.final is not None:
        handles.insert(1, Patch(color=GREEN, label="after drops vs baseline"))
    if any(row.dropped for row in rows):
        handles.append(Patch(facecolor=RED, alpha=0.55, edgecolor=RED, hatch="//", label="dropped"))
    return handles
