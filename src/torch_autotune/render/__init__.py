"""Text a person reads in a terminal: a machine, a profile, a run, a bench, and the progress
of a run. No hardware and no decisions here: only ``rich`` and the data model.

``machine``  the snapshot, a profile, the difference of two profiles
``console``  the consoles (whole lines in a pipe) and the progress lines
``results``  the summary of a run and of a bench
"""

from torch_autotune.render.bench_results import bench_summary, render_bench
from torch_autotune.render.console import (
    UNWRAPPED_WIDTH,
    is_terminal,
    make_console,
    progress_reporter,
)
from torch_autotune.render.machine import gib, render_diff, render_profile, render_snapshot
from torch_autotune.render.results import render_run, saved_note

__all__ = [
    "UNWRAPPED_WIDTH",
    "bench_summary",
    "gib",
    "is_terminal",
    "make_console",
    "progress_reporter",
    "render_bench",
    "render_diff",
    "render_profile",
    "render_run",
    "render_snapshot",
    "saved_note",
]
