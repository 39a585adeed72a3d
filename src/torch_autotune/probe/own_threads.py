"""The CPU threads of a workload without a dataset, measured on its own batches. Pure: no torch;
``fed(batch_size, 0, threads)`` trains the workload's own batch, in memory, at ``threads``.

Objects in hand with an example batch, or a factory without a dataset, have no DataLoader, so
the passes fed by one (``probe.fed``, which measure the threads on a CPU: ``probe.fed_threads``)
never run, and the thread count was the rules' guess: torch's default pool, one thread per
physical core. That is the most compute a large model can use and the worst a small one can
get: a tiny MLP on this 2-core VM trained at 13,178 samples/s at torch's 2 threads and at
205,000 at 1. So on a CPU of more than one core the threads are measured here, on the batch the
points chose, with the passes' own machinery:

1. **The plain alternative** first: training at the rules' threads (torch's default pool), what
   a loop of the user's own gets without a setting.
2. **Fewer threads**, halved from it down to 1, each while it trains faster than the last
   (``fed_threads.feed_fewer_threads``), each only where it is predicted to end in the time
   left (at the slowest the fewer threads could make it).
3. **The choice** (``fed_threads.pick_pass``): the plain alternative stands unless fewer threads
   trained faster beyond ``FED_WITHIN``; then the fewest within it of the best, and only where a
   second round in the reverse order bears it out (``fed_rounds.second_round``: the slower of
   the challenger's two passes against the faster of the plain alternative's).

The batch stays the points' (measured at torch's threads); the threads' reason gives every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch_autotune.probe.fed_passes import (
    FED_WITHIN,
    Fed,
    FedTrial,
    Passes,
    fmt_rate,
    rate_of,
    round_text,
    threads_text,
)
from torch_autotune.probe.fed_rounds import SecondRound, second_round
from torch_autotune.probe.fed_threads import MeasuredThreads, feed_fewer_threads, pick_pass

__all__ = ["OWN_BATCHES", "OwnThreads", "measure_own_threads"]

OWN_BATCHES = "its own batches in memory (no dataset, so no DataLoader)"


@dataclass(frozen=True)
class OwnThreads:
    """The passes on the workload's own batches, and the threads chosen from them (None: no
    pass trained: every one failed, or none fit in the time left)."""

    trials: tuple[FedTrial, ...]
    threads: MeasuredThreads | None


def measure_own_threads(
    fed: Fed,
    *,
    batch_size: int,
    default_threads: int,
    rules_threads: int | None,
    step_rates: Mapping[int, float],
    until: float | None,
    clock: Callable[[], float],
) -> OwnThreads:
    """Steps 1 to 3 of the module docstring at ``batch_size``. ``default_threads``: what
    torch's pool (``rules_threads`` None) stands for here; ``step_rates``: the points'
    samples/s, which predict a pass's time."""
    run = Passes(
        fed=fed,
        threads_for=lambda _workers: rules_threads,
        until=until,
        clock=clock,
        loader_rates={},
        step_rates=step_rates,
        step_rate=step_rates.get(batch_size),
    )
    if not run.fits(batch_size, [0]):
        return OwnThreads((), None)
    plain = run.feed(batch_size, 0)
    if not plain.ok:
        return OwnThreads(tuple(run.trials), None)
    feed_fewer_threads(run, batch_size, default_threads, counted=False)
    picked = pick_pass(run, run.trials, 0)
    second = second_round(run, picked, 0, named=threads_text(picked.threads, default_threads))
    return OwnThreads(tuple(run.trials), _measured(run, second, plain, default_threads))


def _measured(
    run: Passes, second: SecondRound, plain: FedTrial, default_threads: int
) -> MeasuredThreads:
    """The threads chosen after the second round, and why, with every pass."""
    chosen, batch_size = second.chosen, plain.batch_size
    which = threads_text(chosen.threads, default_threads)
    rules = threads_text(plain.threads, default_threads)
    if chosen.threads != plain.threads:
        verdict = (
            f"{which}: training on {OWN_BATCHES} at batch {batch_size} ran at "
            f"{fmt_rate(chosen.samples_per_s)} samples/s with it, against "
            f"{fmt_rate(rate_of(plain))} with {rules}, the rules' count"
        )
    elif second.kept:
        verdict = f"{which}, the rules' count, the plain alternative on {OWN_BATCHES}"
    elif len(run.trials) == 1:
        why = run.stop or "no pass at fewer threads ran"
        verdict = f"{which}, the rules' count, measured on {OWN_BATCHES} alone: {why}"
    else:
        verdict = (
            f"{which}, the rules' count: on {OWN_BATCHES}, no fewer threads trained faster "
            f"beyond {FED_WITHIN:.0%}"
        )
    then = f"; {second.text}" if second.text else ""
    trace = ", ".join(
        f"{threads_text(t.threads, default_threads)}: "
        f"{fmt_rate(t.samples_per_s) if t.ok else f'failed ({t.error})'}{round_text(t)}"
        for t in run.trials
    )
    return MeasuredThreads(
        chosen.threads, f"{verdict}{then} (at batch {batch_size}, samples/s: {trace})"
    )
