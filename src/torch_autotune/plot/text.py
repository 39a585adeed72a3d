"""The charts as text for a terminal: one row per batch size, per worker count, per bench arm.

Bars are drawn in Unicode block characters scaled to the console's width, and every mark is
also a word, so the charts read the same without colour. Output goes only to the rich
``Console`` passed in; nothing here imports matplotlib or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from torch_autotune.plot.data import (
    GIB,
    STEP_KINDS,
    Chosen,
    batch_rows,
    chart_title,
    chosen,
    effect_rows,
    loader_pace,
    measured,
    memory_peaks,
    panels,
    shorten,
    step_rate,
)
from torch_autotune.profile import Evidence, Profile, Source

if TYPE_CHECKING:
    from torch_autotune.bench import BenchEvidence


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
    evidence = measured(profile)
    width = width or console.width
    console.print(Text(chart_title(profile), style="bold"), no_wrap=True, overflow="ellipsis")
    if "throughput" in panels(evidence):
        _print_batches(console, evidence, chosen(profile), width)
    if evidence.loader:
        workers = profile.decision("dataloader.num_workers")
        by_hand = workers is not None and workers.source is Source.USER  # the file's, edited
        mark = "set by hand" if by_hand else "chosen"
        _print_loader(console, evidence, profile.settings.dataloader.num_workers, width, mark)
    if evidence.bench is not None:
        _print_bench(console, evidence.bench, width)


def _line(console: Console, *parts: tuple[str, str]) -> None:
    console.print(Text.assemble(*parts), no_wrap=True, overflow="ellipsis", crop=True)


Styled = tuple[tuple[str, str], ...]  # (text, rich style) pieces of one line


_SERIES_STYLES = ("cyan", "magenta", "yellow", "blue")  # eager, compiled, fed, ...


@dataclass(frozen=True)
class _BarRow:
    label: str
    fraction: float | None  # of the longest bar; None: ``tail`` stands in the bar's place
    tail: Styled
    style: str = "cyan"  # the bar's


def _print_bars(console: Console, rows: list[_BarRow], width: int) -> None:
    """Labels, bars as wide as the width leaves after the longest label and tail, tails."""
    label_w = max(len(r.label) for r in rows)
    tails = [sum(len(text) for text, _ in r.tail) for r in rows if r.fraction is not None]
    cells = max(8, min(60, width - label_w - max(tails, default=0) - 1))
    for r in rows:
        bar = () if r.fraction is None else ((text_bar(r.fraction, cells), r.style),)
        _line(console, (r.label.ljust(label_w), ""), *bar, *r.tail)


def _print_batches(console: Console, evidence: Evidence, mark: Chosen, width: int) -> None:
    """A row per point of each series, named where there are several (eager, compiled, fed by
    the DataLoader), each series in its own colour, and the sizes marked (``mark``: the
    profile's batch, workers and threads)."""
    rows = batch_rows(evidence, mark)
    console.print()
    _line(console, ("Throughput by batch size", "bold"), (" (samples/s, median and spread)", ""))
    digits = len(str(max(r.batch_size for r in rows)))
    names = list(dict.fromkeys(r.series for r in rows if r.series is not None))
    name_w = max(map(len, names)) + 1 if len(names) > 1 else 0
    top = max((r.samples_per_s or 0.0 for r in rows), default=0.0) or 1.0
    number_w = max((len(f"{r.samples_per_s:,.1f}/s") for r in rows if r.samples_per_s), default=0)
    bars = []
    for row in rows:
        series = (row.series or "").ljust(name_w) if name_w else ""
        label = f"  batch {row.batch_size:>{digits}} {series} "
        marks = (("  ◀ " + ", ".join(row.marks), "green"),) if row.marks else ()
        if row.samples_per_s is None:
            failed = not row.status.startswith("ran")
            what = ("✗ " if failed else "") + row.status
            bars.append(_BarRow(label, None, ((what, "red" if failed else "dim"), *marks)))
            continue
        number = f"{row.samples_per_s:,.1f}/s".rjust(number_w)
        spread = (
            "  one pass"
            if row.relative_spread is None
            else f"  spread {row.relative_spread * 100:.0f}%"
        )
        style = _SERIES_STYLES[names.index(row.series or names[0]) % len(_SERIES_STYLES)]
        bars.append(
            _BarRow(label, row.samples_per_s / top, ((f" {number}{spread}", ""), *marks), style)
        )
    _print_bars(console, bars, width)
    for kind in STEP_KINDS:  # a line a curve: checkpointing moves the whole curve
        peaks = memory_peaks(evidence, kind)
        if not peaks:
            continue
        at, peak_gib = max(peaks, key=lambda p: (p[1], p[0]))  # the highest, at the largest size
        text = (
            f"  peak memory {peak_gib:.1f} GiB (batch {at}{'' if kind == 'eager' else ', ' + kind})"
        )
        if evidence.memory_limit_bytes is not None:
            text += f" of {evidence.memory_limit_bytes / GIB:.1f} GiB the trials could use"
        _line(console, (text, "dim"))


def _print_loader(
    console: Console, evidence: Evidence, chosen: int, width: int, mark_word: str = "chosen"
) -> None:
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
            error = shorten(r.error or "no reason recorded", max(20, width - len(label) - 10))
            bars.append(_BarRow(label, None, ((f"✗ failed: {error}", "red"),)))
            continue
        pace = ""
        if rate is not None:
            pace = f"  {loader_pace(r.num_workers, r.samples_per_s, rate)}"
        number = f"{r.samples_per_s:,.1f}/s".rjust(number_w)
        mark = ((f"  ◀ {mark_word}", "green"),) if r.num_workers == chosen else ()
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
        label = shorten(row.label, label_w) if first else ("  ✗ dropped" if row.dropped else "")
        head = f"  {label.ljust(label_w)} {row.arm.ljust(arm_w)} "
        e = row.effect
        if e is None:
            _line(console, (head, ""), (" " * left + "│", ""), (f" {row.note}", "dim"))
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
