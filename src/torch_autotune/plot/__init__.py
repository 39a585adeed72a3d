"""Charts of what the probe and the bench measured: a PNG with matplotlib, or text in a terminal.

Three panels, each left out when the profile holds no data for it:

1. **Batch size.** Training throughput (samples/s, median of the repeats, the bar spans the
   relative spread) against batch size on a log2 axis, one series per variant that ran: the
   eager step, the compiled step, and training fed by the DataLoader at each worker count
   (one pass each, no spread; where a second round ran again to confirm the choice, the two
   passes' median and spread); the profile's batch (and where ``autotune bench`` or a hand
   edit changed it from the probe's, which); the largest size
   that ran; the sizes from the first larger one that did not (out of memory, over the CPU's
   --memory-limit, or not run because it was too slow for the budget or predicted beyond host
   RAM or the limit) as a shaded region, labelled with why, each reason at the smallest size
   it holds for where the sizes in it differ; and, when the trials
   read it, peak memory in GiB on a second axis with the memory the trials could use.
2. **DataLoader workers.** Loading throughput (samples/s) for each worker count tried, failed
   counts marked with their error, against the rate the training step consumes samples at the
   recommended batch size: the smallest count that keeps ahead of training is chosen.
3. **Bench.** Speedups against 1.00x (no change): the whole profile against the baseline, and
   each setting on alone (baseline + setting vs baseline) and in the profile (profile vs profile
   without it), the bar to the median, the whiskers to the lowest and highest round. Settings
   the bench dropped are hatched and labelled.

The package is built in layers: ``data`` turns a measured profile into rows, rates, marks and
labels (pure: no matplotlib, rich or torch); ``panels`` draws each panel on a matplotlib
``Axes``; ``png`` lays the panels out on a ``Figure`` and writes the file; ``text`` draws the
same data as rows of block characters on a rich ``Console``.
Importing the package imports neither matplotlib nor torch; matplotlib is optional
(``pip install "torch-autotune[plot]"``) and imported only when a PNG is drawn. Nothing here
prints except through the ``Console`` passed in.
"""

from __future__ import annotations

from torch_autotune.errors import PlotUnavailableError
from torch_autotune.plot.png import build_figure, matplotlib_available, save_png
from torch_autotune.plot.text import render_charts

__all__ = [
    "PlotUnavailableError",
    "build_figure",
    "matplotlib_available",
    "render_charts",
    "save_png",
]
