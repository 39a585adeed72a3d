"""Charts of what the probe and the bench measured: a PNG with matplotlib, or text in a terminal.

Three panels, each left out when the profile holds no data for it:

1. **Batch size.** Training throughput (samples/s, median of the repeats, the bar spans the
   relative spread) against batch size on a log2 axis; the recommended size; the largest size
   that ran; the first larger size that did not (out of memory, or not run because it was too
   slow for the budget or predicted beyond host RAM) as a shaded region; and, when the trials
   read it, peak memory in GiB on a second axis with the memory the trials could use.
2. **DataLoader workers.** Loading throughput (samples/s) for each worker count tried, failed
   counts marked with their error, against the rate the training step consumes samples at the
   recommended batch size: the smallest count that keeps ahead of training is chosen.
3. **Bench.** Speedups against 1.00x (no change): the whole profile against the baseline, and
   each setting on alone (baseline + setting vs baseline) and in the profile (profile vs profile
   without it), the bar to the median, the whiskers to the lowest and highest round. Settings
   the bench dropped are hatched and labelled.

matplotlib is optional (``pip install "torch-autotune[plot]"``) and imported only when a PNG is
drawn; the figure is built on ``matplotlib.figure.Figure`` with the Agg canvas, never through
pyplot, so no global backend or figure state is touched. Importing this module imports neither
matplotlib nor torch. Nothing here prints except through the rich ``Console`` passed in.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from rich.console import Console
from rich.text import Text

from torch_autotune.errors import PlotUnavailableError, ProfileFileError
from torch_autotune.files import write_atomically
from torch_autotune.profile import Evidence, Profile, SearchTrialRecord, target_accelerators

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.container import Container
    from matplotlib.figure import Figure

    from torch_autotune.bench import BenchEvidence, Effect

Handle: TypeAlias = "Artist | Container"  # what a legend entry is drawn from

__all__ = [
    "PlotUnavailableError",
    "build_figure",
    "matplotlib_available",
    "render_charts",
    "save_png",
]

GIB = 1 << 30
DPI = 120
PANEL_WIDTH_IN = 5.4
PANEL_HEIGHT_IN = 4.6
MIN_MATPLOTLIB = (3, 5)  # Figure(layout="constrained"), set_xticks(labels=...)

# Colours: blue, green and purple tell the series apart; red, for what failed or was dropped,
# always comes with a second cue (hatching, an x, a word) for readers who cannot see it.
BLUE, LIGHT_BLUE, GREEN, GREY = "#1f77b4", "#9ecae1", "#2ca02c", "#7f7f7f"
RED, PURPLE, DARK = "#d62728", "#9467bd", "#333333"


# --- what the panels show (pure, shared by the PNG and the terminal) -------------------------


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
    evidence = _measured(profile)
    torch_version = profile.provenance.torch_version or "unknown"
    return (
        f"{evidence.workload} on {evidence.device}: {hardware_name(profile)}, torch {torch_version}"
    )


def _measured(profile: Profile) -> Evidence:
    if profile.evidence is None:
        raise ProfileFileError(
            "not measured: this profile holds the rules' settings only, so there is nothing to "
            "plot; run autotune first (it measures batch sizes and DataLoader workers on this "
            "machine), and 'autotune bench' for the settings' effects"
        )
    return profile.evidence


def _panels(evidence: Evidence) -> list[str]:
    panels = []
    if evidence.throughput or evidence.search:
        panels.append("throughput")
    if evidence.loader:
        panels.append("loader")
    if evidence.bench is not None:
        panels.append("bench")
    return panels


# --- matplotlib -------------------------------------------------------------------------------


def _require_matplotlib() -> None:
    """Import matplotlib's Figure and Agg canvas, or raise PlotUnavailableError."""
    install = 'pip install "torch-autotune[plot]"'
    try:
        import matplotlib
        import matplotlib.backends.backend_agg
        import matplotlib.figure
    except ImportError as error:
        raise PlotUnavailableError(
            f"drawing a PNG needs matplotlib, which is not installed ({error}); install it "
            f"with {install}"
        ) from None
    release = tuple(int(p) for p in matplotlib.__version__.split(".")[:2] if p.isdigit())
    if release < MIN_MATPLOTLIB:
        raise PlotUnavailableError(
            f"matplotlib {matplotlib.__version__} is too old to draw the charts (3.5 or newer "
            f"is needed); upgrade it with {install}"
        )


def matplotlib_available() -> bool:
    """Whether ``save_png`` can draw here: matplotlib 3.5 or newer imports."""
    try:
        _require_matplotlib()
    except PlotUnavailableError:
        return False
    return True


def build_figure(profile: Profile) -> Figure:
    """The charts as a matplotlib Figure on an Agg canvas (one panel per kind of data).

    Panels are labelled for inspection (``ax.get_label()``): ``throughput`` (with a twin
    ``memory`` axis when peak memory was read), ``loader`` and ``bench``. Raises
    ProfileFileError for a profile that was not measured, PlotUnavailableError without
    matplotlib.
    """
    evidence = _measured(profile)
    _require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = _panels(evidence)
    if not panels:
        raise ProfileFileError("the profile's evidence holds no measurements to plot")
    bars = len(effect_rows(evidence.bench)) if evidence.bench is not None else 0
    height = max(PANEL_HEIGHT_IN, 2.2 + 0.22 * bars)
    figure = Figure(figsize=(PANEL_WIDTH_IN * len(panels), height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: the explicit, non-interactive back end
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels, strict=True):
        ax.set_label(panel)
        if panel == "throughput":
            _draw_throughput(ax, evidence)
        elif panel == "loader":
            _draw_loader(ax, evidence, profile.settings.dataloader.num_workers)
        elif evidence.bench is not None:
            _draw_bench(ax, evidence.bench)
    figure.suptitle(chart_title(profile), fontsize=12, fontweight="bold")
    return figure


def _legend_below(ax: Axes, handles: list[Handle], columns: int = 2) -> None:
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=columns,
        fontsize=8,
        frameon=False,
    )


def _draw_throughput(ax: Axes, evidence: Evidence) -> None:
    handles: list[Handle] = []
    records = sorted(evidence.throughput, key=lambda r: r.batch_size)
    if records:
        handles.append(
            ax.errorbar(
                [r.batch_size for r in records],
                [r.samples_per_s for r in records],
                # relative_spread is (max - min) / median: half of it either side
                yerr=[r.samples_per_s * r.relative_spread / 2 for r in records],
                fmt="o-",
                color=BLUE,
                capsize=3,
                zorder=3,
                label="training throughput (median, spread)",
            )
        )
    misfit = first_misfit(evidence)
    ran = [t.batch_size for t in evidence.search if t.fits]
    marked = [evidence.batch_size, evidence.max_batch_size, *(r.batch_size for r in records)]
    right = max([*marked, *ran, misfit[0] if misfit else 0]) * 1.5
    ticks = _spaced([*marked, *sorted(ran)])
    ax.set_xscale("log", base=2)
    ax.set_xlim(min([*marked, *ran]) / 1.5, right)
    ax.set_xticks(ticks, labels=[str(s) for s in ticks])
    ax.minorticks_off()
    ax.tick_params(axis="x", labelsize=8, labelrotation=45)
    handles.append(
        ax.axvline(
            evidence.batch_size,
            color=GREEN,
            linestyle="--",
            linewidth=1.5,
            gid="recommended",
            label=f"recommended: {evidence.batch_size}",
        )
    )
    if evidence.max_batch_size != evidence.batch_size:
        handles.append(
            ax.axvline(
                evidence.max_batch_size,
                color=GREY,
                linestyle=":",
                linewidth=1.5,
                gid="largest",
                label=f"largest that ran: {evidence.max_batch_size}",
            )
        )
    if misfit is not None:
        handles.append(
            ax.axvspan(
                misfit[0],
                right,
                color=RED,
                alpha=0.12,
                linewidth=0,
                gid="misfit",
                label=f"{misfit[0]} and up: {misfit[1]}",
            )
        )
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (log2)")
    ax.set_ylabel("samples/s")
    ax.set_title(f"Throughput by batch size (limited by {evidence.limited_by})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles += _draw_memory(ax, evidence)
    _legend_below(ax, handles)


def _spaced(sizes: list[int], octaves: float = 0.3) -> list[int]:
    """The sizes whose labels do not collide on a log2 axis, earlier ones first to be kept."""
    kept: list[int] = []
    for size in sizes:
        if all(abs(math.log2(size / other)) >= octaves for other in kept):
            kept.append(size)
    return sorted(kept)


def _draw_memory(ax: Axes, evidence: Evidence) -> list[Handle]:
    """Peak memory of the trials that ran, in GiB on a twin axis, and the device's limit."""
    peaks = sorted(
        (t.batch_size, t.peak_memory_bytes / GIB)
        for t in evidence.search
        if t.fits and t.peak_memory_bytes is not None
    )
    if not peaks:
        return []
    memory = ax.twinx()
    memory.set_label("memory")
    handles: list[Handle] = [
        *memory.plot(
            [b for b, _ in peaks],
            [m for _, m in peaks],
            "s",
            color=PURPLE,
            markersize=5,
            alpha=0.8,
            label="peak memory of a search trial",
        )
    ]
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


def _draw_loader(ax: Axes, evidence: Evidence, chosen: int) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    records = sorted(evidence.loader, key=lambda r: r.num_workers)
    measured = [r.samples_per_s for r in records if r.samples_per_s is not None]
    rate = step_rate(evidence)
    top = max([*measured, rate or 0.0, 1.0])
    handles: list[Handle] = []
    if any(r.num_workers != chosen and r.samples_per_s for r in records):
        handles.append(Patch(color=LIGHT_BLUE, label="measured"))
    for i, r in enumerate(records):
        if r.samples_per_s is None:
            ax.plot(i, 0, "x", color=RED, markersize=10, markeredgewidth=2, clip_on=False)
            error = r.error or "failed"
            ax.text(
                i,
                top * 0.04,
                _shorten(f"failed: {error}", 60),
                rotation=90,
                fontsize=7,
                color=RED,
                ha="center",
                va="bottom",
            )
            continue
        colour = GREEN if r.num_workers == chosen else LIGHT_BLUE
        ax.bar(i, r.samples_per_s, color=colour, width=0.65, gid=f"workers-{r.num_workers}")
        ax.text(i, r.samples_per_s, f"{r.samples_per_s:,.0f}", ha="center", va="bottom", fontsize=8)
    if any(r.num_workers == chosen and r.samples_per_s for r in records):
        handles.append(Patch(color=GREEN, label=f"chosen: {chosen}"))
    if any(r.samples_per_s is None for r in records):
        handles.append(
            Line2D([], [], marker="x", color=RED, linestyle="none", label="failed (error shown)")
        )
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
    _legend_below(ax, handles)


def _draw_bench(ax: Axes, bench: BenchEvidence) -> None:
    from matplotlib.patches import Patch

    rows = effect_rows(bench)
    colours = {"as tuned": DARK, "after drops": GREEN, "on alone": LIGHT_BLUE}
    colours["in the profile"] = BLUE
    positions, ticks, labels, y = [], [], [], 0.0
    previous = None
    for row in rows:
        if row.setting != previous:
            y += 0.5 if previous is not None else 0.0
            ticks.append(y + (0.2 if row.setting != "whole profile" or bench.final else 0.0))
            labels.append(row.label + (" (dropped)" if row.dropped else ""))
            previous = row.setting
        positions.append(y)
        y += 0.4
    extremes = [1.0]
    for row, at in zip(rows, positions, strict=True):
        e = row.effect
        if e is None:
            ax.text(1.0, at, "  not measured", va="center", fontsize=7, color=GREY)
            continue
        extremes += [e.low, e.high]
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
    low, high = min(extremes), max(extremes)
    pad = max(0.12 * (high - low), 0.05)
    ax.set_xlim(low - pad, high + pad)
    pad = max(0.0, (3.0 - (y + 0.3)) / 2)  # a few bars are not as thick as the panel
    ax.set_ylim(y - 0.1 + pad, -0.4 - pad)  # top to bottom in the order of the report
    ax.axvline(1.0, color="black", linewidth=1, gid="no-change")
    ax.set_yticks(ticks, labels=labels, fontsize=8)
    for label, text in zip(ax.get_yticklabels(), labels, strict=True):
        if text.endswith("(dropped)"):
            label.set_color(RED)
    ax.set_xlabel("speedup (1.00x = no change)")
    ax.set_title("Bench: what each setting is worth", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    handles: list[Handle] = [
        Patch(color=DARK, label="profile vs baseline"),
        Patch(color=LIGHT_BLUE, label="on alone: baseline + it vs baseline"),
        Patch(color=BLUE, label="in the profile: profile vs without it"),
    ]
    if bench.final is not None:
        handles.insert(1, Patch(color=GREEN, label="after drops vs baseline"))
    if any(row.dropped for row in rows):
        handles.append(Patch(facecolor=RED, alpha=0.55, edgecolor=RED, hatch="//", label="dropped"))
    _legend_below(ax, handles, columns=1)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def save_png(profile: Profile, path: Path) -> Path:
    """Draw the charts of a measured profile into a PNG at ``path`` (120 dpi); return the path.

    The image is rendered in memory first and then written through a temporary file in the
    same directory and a rename, so a failure never leaves a partial file and never harms a
    file already at ``path``. Raises ProfileFileError when the profile was not measured,
    PlotUnavailableError without matplotlib, StoreError when the file cannot be written.
    """
    figure = build_figure(profile)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    write_atomically(path, buffer.getvalue())
    return path


# --- the terminal -------------------------------------------------------------------------------

_EIGHTHS = " ▏▎▍▌▋▊▉"  # left-aligned blocks, 1/8 to 7/8 of a cell


def text_bar(fraction: float, cells: int) -> str:
    """A bar ``fraction`` of ``cells`` long in full and eighth blocks, padded to ``cells``."""
    eighths = round(max(0.0, min(1.0, fraction)) * cells * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(cells)


def _text_bar_left(fraction: float, cells: int) -> str:
    """A bar growing leftwards, right-aligned in ``cells`` (half-cell steps: ▐)."""
    halves = round(max(0.0, min(1.0, fraction)) * cells * 2)
    full, half = divmod(halves, 2)
    return ("▐" * half + "█" * full).rjust(cells)


def render_charts(profile: Profile, console: Console, width: int | None = None) -> None:
    """Print the charts as text: one row per batch size, per worker count, per bench arm.

    Bars are scaled to ``width`` (default: the console's); every mark is also a word, so the
    charts read the same without colour. Raises ProfileFileError when nothing was measured.
    """
    evidence = _measured(profile)
    width = width or console.width
    console.print(Text(chart_title(profile), style="bold"), no_wrap=True, overflow="ellipsis")
    if "throughput" in _panels(evidence):
        _print_batches(console, evidence, width)
    if evidence.loader:
        _print_loader(console, evidence, profile.settings.dataloader.num_workers, width)
    if evidence.bench is not None:
        _print_bench(console, evidence.bench, width)


def _line(console: Console, *parts: tuple[str, str]) -> None:
    console.print(Text.assemble(*parts), no_wrap=True, overflow="ellipsis", crop=True)


Styled = tuple[tuple[str, str], ...]  # (text, rich style) pieces of one line


@dataclass(frozen=True)
class _BarRow:
    label: str
    fraction: float | None  # of the longest bar; None: ``tail`` stands in the bar's place
    tail: Styled


def _print_bars(console: Console, rows: list[_BarRow], width: int, style: str = "cyan") -> None:
    """Labels, bars as wide as the width leaves after the longest label and tail, tails."""
    label_w = max(len(r.label) for r in rows)
    tails = [sum(len(text) for text, _ in r.tail) for r in rows if r.fraction is not None]
    cells = max(8, min(60, width - label_w - max(tails, default=0) - 1))
    for r in rows:
        bar = () if r.fraction is None else ((text_bar(r.fraction, cells), style),)
        _line(console, (r.label.ljust(label_w), ""), *bar, *r.tail)


def _print_batches(console: Console, evidence: Evidence, width: int) -> None:
    rows = batch_rows(evidence)
    console.print()
    _line(console, ("Throughput by batch size", "bold"), (" (samples/s, median and spread)", ""))
    digits = len(str(max(r.batch_size for r in rows)))
    top = max((r.samples_per_s or 0.0 for r in rows), default=0.0) or 1.0
    number_w = max((len(f"{r.samples_per_s:,.1f}/s") for r in rows if r.samples_per_s), default=0)
    bars = []
    for row in rows:
        label = f"  batch {row.batch_size:>{digits}}  "
        marks = (("  ◀ " + ", ".join(row.marks), "green"),) if row.marks else ()
        if row.samples_per_s is None:
            failed = row.status != "ran (not timed)"
            what = ("✗ " if failed else "") + row.status
            bars.append(_BarRow(label, None, ((what, "red" if failed else "dim"), *marks)))
            continue
        number = f"{row.samples_per_s:,.1f}/s".rjust(number_w)
        spread = f"  spread {(row.relative_spread or 0.0) * 100:.0f}%"
        bars.append(_BarRow(label, row.samples_per_s / top, ((f" {number}{spread}", ""), *marks)))
    _print_bars(console, bars, width)
    known = [(t.peak_memory_bytes, t.batch_size) for t in evidence.search if t.fits]
    peaks = [(peak, at) for peak, at in known if peak is not None]
    if peaks:
        peak, at = max(peaks)
        text = f"  peak memory {peak / GIB:.1f} GiB (batch {at})"
        if evidence.memory_limit_bytes is not None:
            text += f" of {evidence.memory_limit_bytes / GIB:.1f} GiB the trials could use"
        _line(console, (text, "dim"))


def _print_loader(console: Console, evidence: Evidence, chosen: int, width: int) -> None:
    records = sorted(evidence.loader, key=lambda r: r.num_workers)
    rate = step_rate(evidence)
    console.print()
    heading = " (samples/s loaded"
    heading += f"; training consumes {rate:,.1f}/s at batch {evidence.batch_size})" if rate else ")"
    _line(console, ("DataLoader by worker count", "bold"), (heading, ""))
    speeds = [r.samples_per_s for r in records if r.samples_per_s is not None]
    top = max([*speeds, rate or 0.0]) or 1.0
    number_w = max((len(f"{s:,.1f}/s") for s in speeds), default=0)
    digits = len(str(records[-1].num_workers))
    bars = []
    for r in records:
        label = f"  {r.num_workers:>{digits}} worker{'s' if r.num_workers != 1 else ' '}  "
        if r.samples_per_s is None:
            error = _shorten(r.error or "no reason recorded", max(20, width - len(label) - 10))
            bars.append(_BarRow(label, None, ((f"✗ failed: {error}", "red"),)))
            continue
        pace = ""
        if rate is not None:
            pace = "  ahead of training" if r.samples_per_s >= rate else "  behind training"
        number = f"{r.samples_per_s:,.1f}/s".rjust(number_w)
        mark = (("  ◀ chosen", "green"),) if r.num_workers == chosen else ()
        bars.append(_BarRow(label, r.samples_per_s / top, ((f" {number}{pace}", ""), *mark)))
    _print_bars(console, bars, width)


def _axis_labels(area: int, left: int, slow: float, fast: float) -> str:
    """'0.89x 1.00x     3.15x' over the bars: the ends and the axis, where they fit."""
    axis = [" "] * area
    hi, lo = f"{math.exp(fast):.2f}x", f"{math.exp(-slow):.2f}x"
    taken: list[tuple[int, int]] = []
    for wanted, word in ((left - 2, "1.00x"), (area - len(hi), hi), (0, lo)):
        start = max(0, min(wanted, area - len(word)))
        end = start + len(word)
        if all(end < a or start > b for a, b in taken):  # one space between words at least
            axis[start:end] = word
            taken.append((start, end))
    return "".join(axis)


def _print_bench(console: Console, bench: BenchEvidence, width: int) -> None:
    """One row per arm: a bar left (slower) or right (faster) of the 1.00x axis, log scale."""
    rows = effect_rows(bench)
    console.print()
    _line(console, ("Bench: speedup", "bold"), (" (1.00x: no change; log scale)", ""))
    _line(console, ("  on alone: baseline + it vs baseline; in the profile: vs without it", "dim"))
    arm_w = len("in the profile")
    tail_w = len(" 0.00x (0.00-0.00) within noise")
    room = width - 2 - arm_w - 2 - tail_w - 25  # at least 25 cells of bars
    label_w = min(28, max(len(r.label) for r in rows), max(11, room))
    head_w = 2 + label_w + 1 + arm_w + 1
    area = max(17, min(49, width - head_w - tail_w))
    logs = [math.log(v) for r in rows if r.effect for v in (r.effect.low, r.effect.high)]
    # The 1.00x axis splits the width in the ratio of the slowest and the fastest round (log
    # scale), which are at least 0.91x and 1.10x, so that a change of 2% never fills a side.
    slow, fast = max([-v for v in logs] + [math.log(1.1)]), max([*logs, math.log(1.1)])
    left = round((area - 1) * slow / (slow + fast))  # one scale on both sides
    right = area - 1 - left
    _line(console, (" " * head_w + _axis_labels(area, left, slow, fast), "dim"))
    previous = None
    for row in rows:
        first, previous = row.setting != previous, row.setting
        label = _shorten(row.label, label_w) if first else ("  ✗ dropped" if row.dropped else "")
        head = f"  {label.ljust(label_w)} {row.arm.ljust(arm_w)} "
        e = row.effect
        if e is None:
            _line(console, (head, ""), (" " * left + "│", ""), (" not measured", "dim"))
            continue
        share = math.log(e.speedup)
        bars = (
            _text_bar_left(-share / slow, left) if share < 0 else " " * left,
            text_bar(share / fast, right) if share >= 0 else " " * right,
        )
        style = "red" if row.dropped or e.verdict == "slower" else "cyan"
        _line(
            console,
            (head, "red" if row.dropped else ""),
            (bars[0], style),
            ("│", ""),
            (bars[1], style),
            (f" {e.speedup:.2f}x ({e.low:.2f}-{e.high:.2f}) ", ""),
            (e.verdict, {"faster": "green", "slower": "red"}.get(e.verdict, "")),
        )
