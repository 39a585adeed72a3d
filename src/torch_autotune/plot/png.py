"""The charts as a PNG: a matplotlib ``Figure`` with one panel per kind of data, and its file.

matplotlib is optional (``pip install "torch-autotune[plot]"``) and imported only when a PNG is
drawn; the figure is built on ``matplotlib.figure.Figure`` with the Agg canvas, never through
pyplot, so no global backend or figure state is touched. Importing this module imports neither
matplotlib nor torch, and nothing here prints. This module lays the panels out side by side
and writes the file; ``plot.panels`` draws each panel from what ``plot.data`` says it shows.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from torch_autotune.errors import PlotUnavailableError, ProfileFileError
from torch_autotune.files import write_atomically
from torch_autotune.plot.data import chart_title, chosen, effect_rows, measured, panels
from torch_autotune.plot.panels import draw_bench, draw_loader, draw_throughput
from torch_autotune.profile import Profile

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 120
PANEL_WIDTH_IN = 5.4
TITLE_CHARS_PER_IN = 8.5  # the title's bold 12 pt: one panel's width held a 55-character line
PANEL_HEIGHT_IN = 4.6
PLOT_HEIGHT_IN = 3.8  # the title, an axes of its own height, its ticks and labels
LEGEND_ROW_IN = 0.22  # a legend row at 8 pt, with its spacing
MIN_MATPLOTLIB = (3, 5)  # Figure(layout="constrained"), set_xticks(labels=...)


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
    evidence = measured(profile)
    _require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawn = panels(evidence)
    if not drawn:
        raise ProfileFileError("the profile's evidence holds no measurements to plot")
    bars = len(effect_rows(evidence.bench)) if evidence.bench is not None else 0
    height = max(PANEL_HEIGHT_IN, 2.2 + 0.22 * bars)
    figure = Figure(figsize=(PANEL_WIDTH_IN * len(drawn), height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: the explicit, non-interactive back end
    axes = figure.subplots(1, len(drawn), squeeze=False)[0]
    rows = 0  # of the longest legend
    for ax, panel in zip(axes, drawn, strict=True):
        ax.set_label(panel)
        if panel == "throughput":
            rows = max(rows, draw_throughput(ax, evidence, chosen(profile)))
        elif panel == "loader":
            rows = max(rows, draw_loader(ax, evidence, profile.settings.dataloader.num_workers))
        elif evidence.bench is not None:
            rows = max(rows, draw_bench(ax, evidence.bench))
    figure.set_figheight(max(height, PLOT_HEIGHT_IN + LEGEND_ROW_IN * rows))
    title = textwrap.fill(
        chart_title(profile), int(TITLE_CHARS_PER_IN * PANEL_WIDTH_IN * len(drawn))
    )
    figure.suptitle(title, fontsize=12, fontweight="bold")
    return figure


def save_png(profile: Profile, path: Path) -> Path:
    """Draw the charts of a measured profile into a PNG at ``path`` (120 dpi); return the path.

    The image is rendered in memory first and then written through a temporary file in the
    same directory and a rename, so a failure never leaves a partial file and never harms a
    file already at ``path``; the directories on the way are made (the command line's --plot
    refuses a missing one before it runs). Raises ProfileFileError when the profile was not
    measured, PlotUnavailableError without matplotlib, StoreError when the file cannot be
    written.
    """
    figure = build_figure(profile)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    write_atomically(path, buffer.getvalue(), make_parents=True)
    return path
