"""Where no pass of training fed by the DataLoader chose (``probe.fed.choose_fed``: none fit in
the time left, or every one failed): what did not fit, recorded on the budget once; the worker
count kept instead, where it is not the loader alone's; and, on a CPU whose threads the passes
were to measure, the warning that they were not, for want of time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.fed import FedChoice
from torch_autotune.probe.fed_passes import pass_seconds
from torch_autotune.probe.workers import (
    HEADROOM,
    WorkerChoice,
    format_rate,
    format_share,
    keeps_ahead,
    serial_share,
)


def short_pass(
    budget: Budget,
    batch_size: int,
    count: Sequence[int],
    loader: float | None,
    step_rates: Mapping[int, float],
) -> Callable[[], str]:
    """Why no pass fed by the DataLoader ran: the shortest, one pass of the first ``count``
    at the smallest ``batch_size``, did not fit in the time left, predicted at the slower of
    its ``loader`` alone and the step alone (``probe.fed_passes.Passes.rate``), as words;
    recorded on ``budget`` the first time they are asked for (where they are used), once
    however many sentences use them."""
    step = step_rates.get(batch_size)
    larger = sorted(b for b in step_rates if b > batch_size)
    if step is None and larger:
        step = batch_size * step_rates[larger[0]] / larger[0]
    known = [r for r in (loader, step) if r]
    predicted = pass_seconds(batch_size, count[0], min(known)) if known else 0.0
    what = f"a pass of training fed by {count[0]} worker(s) at batch {batch_size}"
    return cache(lambda: budget.skip(what, predicted, kept_s=0.0, warned=True).words())


def unfed_count(
    choice: WorkerChoice,
    rates: Mapping[int, float],
    most: int,
    step: float | None,
    device: str,
    *,
    why: Callable[[], str],
) -> tuple[int, str] | None:
    """The count to keep, and why, where no pass fed by the DataLoader chose (``why()``: for
    want of time, what did not fit, or that every pass failed), when it is not the loader
    alone's choice: the usable CPUs, the plain alternative, where loading limits training and
    the loader alone never reached them; on a CPU, 0 where its loading keeps 10% ahead of the
    step, though in series with it, since a worker takes a core from the step there (G6)."""
    if step is None:
        return None
    if not any(keeps_ahead(n, r, step) for n, r in rates.items()):
        if most in {t.num_workers for t in choice.trials}:
            return None
        return most, (
            f"{most} worker(s), as many as usable CPUs, the plain alternative, not measured"
            f"{why()}; no count the loader alone reached keeps ahead of the training step."
        )
    main = rates.get(0)
    if device != "cpu" or choice.num_workers == 0 or main is None or main < step * HEADROOM:
        return None
    return 0, (
        f"0 worker(s): on a CPU workers take cores from the training step, and training fed by "
        f"the DataLoader was not measured{why()}; in the main process, loading at "
        f"{format_rate(main)} samples/s takes "
        f"{format_share(serial_share(main, step))} of training's time, in series with the step."
    )


def why_not(fed: FedChoice, short: Callable[[], str]) -> Callable[[], str]:
    """Why training fed by the DataLoader was not measured: every pass failed (``fed`` ran
    some: the reason's end lists them), else none fit in the time (``short()``: what did not
    fit, recorded on the budget once, when first said)."""
    if fed.trials:
        return lambda: ": every pass of it failed (below)"
    return lambda: f" for want of time ({short()} did not fit; give autotune more with --budget)"


def threads_warning(
    fed: FedChoice, default_threads: int | None, short: Callable[[], str]
) -> str | None:
    """The warning where the passes fed by the DataLoader were to measure the CPU threads
    (``default_threads``: torch's pool on a CPU of more than one) and none ran for want of
    time (``short()``: what did not fit); None where they were not to, where some ran (every
    one failed: the workers' reason says so), or where one chose."""
    if default_threads is None or fed.num_workers is not None or fed.trials:
        return None
    return (
        "the CPU threads were not measured (with a dataset, they are measured on passes of "
        f"training fed by the DataLoader): {short()} did not fit, so the rules chose them; "
        "more time (--budget) measures them"
    )
