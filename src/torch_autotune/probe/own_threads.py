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

4. **The batch at those threads.** Where fewer threads are chosen, the points' rates (at torch's
   pool) and the batch they chose do not hold at them (a conv net on 2 busy cores: batch 128
   fastest at 2 threads, 32 at 1, 1.6x faster than 128 there; a tiny LM: batch 2 chosen at 2
   threads, 61 samples/s at 1, where 32 ran 117), so the ``larger`` sizes the search ran run
   at them too, doubling up while each trains faster beyond ``FED_WITHIN``
   (``fed_threads.feed_larger``), then the ``smaller`` ones, each while within ``FED_WITHIN``
   of the best, and the batch is the smallest within it of the best rate at those threads
   (``OwnThreads.batch_reason``).

The threads' reason gives every pass; the batch's, the sizes and passes at the threads
chosen. Where not even the plain alternative's pass fits in the time left, the rules' count
stands, and a warning says what did not fit (``own_batches``), as the passes fed by a
DataLoader do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.fed_passes import (
    FED_WITHIN,
    Fed,
    FedTrial,
    Passes,
    fmt_rate,
    pass_seconds,
    rate_of,
    round_text,
    threads_text,
    threads_trace,
)
from torch_autotune.probe.fed_rounds import SecondRound, second_round
from torch_autotune.probe.fed_threads import (
    MeasuredThreads,
    feed_fewer_threads,
    feed_larger,
    pick_pass,
    sizes_ran,
)
from torch_autotune.probe.seam import Progress
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import Profile

__all__ = ["OWN_BATCHES", "OwnThreads", "measure_own_threads", "own_batches", "own_threads_from"]

OWN_BATCHES = "its own batches in memory (no dataset, so no DataLoader)"


@dataclass(frozen=True)
class OwnThreads:
    """The passes on the workload's own batches, and the threads chosen from them (None: no
    pass trained: every one failed, or none fit in the time left)."""

    trials: tuple[FedTrial, ...]
    threads: MeasuredThreads | None
    batch_size: int | None = None  # step 4: the batch at fewer threads chosen, and why
    batch_reason: str | None = None
    warning: str | None = None  # no pass fit in the time left: the rules' count stands


def own_threads_from(
    profile: Profile, workload: Workload, default_threads: int | None
) -> int | None:
    """``default_threads`` (torch's pool here; None: one thread, or not a CPU), where the
    threads of ``workload`` are measured on its own batches: no dataset (with one, the passes
    fed by its DataLoader measure them), one process, and rules that keep 0 workers (so the
    rules' threads, halved from, are the count beside what it trains with; beside workers it
    cannot run, they are not) and more than one thread. None where they are not measured."""
    if workload.dataset is not None or default_threads is None:
        return None
    rules = profile.settings
    if profile.topology.world_size > 1 or rules.dataloader.num_workers != 0:
        return None
    return default_threads if (rules.cpu_threads or default_threads) > 1 else None


def own_batches(
    fed: Fed,
    sizes: Sequence[int],
    *,
    default_threads: int,
    rules_threads: int | None,
    step_rates: Mapping[int, float],
    budget: Budget,
    progress: Progress,
    larger: Sequence[int] = (),
) -> OwnThreads:
    """``measure_own_threads`` at the first of ``sizes`` (the points' batch) in the time
    ``budget``'s phase has left, the others and ``larger`` where fewer threads are chosen;
    where not even
    the plain alternative's pass fit (predicted at the step's rate, where known), the
    warning that says so, recorded on ``budget``."""
    if budget.left() > 0:
        progress("workers", "CPU threads on the workload's own batches")
        own = measure_own_threads(
            fed,
            batch_size=sizes[0],
            smaller=sizes[1:],
            larger=larger,
            default_threads=default_threads,
            rules_threads=rules_threads,
            step_rates=step_rates,
            until=budget.deadline,
            clock=budget.clock,
        )
        if own.trials:
            return own
    rate = step_rates.get(sizes[0])
    predicted = pass_seconds(sizes[0], 0, rate) if rate else 0.0
    what = f"a pass of training on its own batches at batch {sizes[0]}"
    skip = budget.skip(what, predicted, kept_s=0.0, warned=True)
    return OwnThreads(
        (),
        None,
        warning=(
            "the CPU threads were not measured (with no dataset, they are measured on the "
            f"workload's own batches): {skip.words()} did not fit, so the rules chose them; "
            "more time (--budget) measures them"
        ),
    )


def measure_own_threads(
    fed: Fed,
    *,
    batch_size: int,
    default_threads: int,
    rules_threads: int | None,
    step_rates: Mapping[int, float],
    until: float | None,
    clock: Callable[[], float],
    smaller: Sequence[int] = (),
    larger: Sequence[int] = (),
) -> OwnThreads:
    """The module docstring at ``batch_size``, then the ``larger`` sizes (ascending) and the
    ``smaller`` ones (descending) where fewer threads are chosen. ``default_threads``: what
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
    measured = _measured(run, second, plain, default_threads)
    if second.chosen.threads == plain.threads:
        return OwnThreads(tuple(run.trials), measured)
    run.chosen_threads[0] = second.chosen.threads
    run.stop = None  # what stopped the thread counts is no reason for the sizes
    faster = feed_larger(run, larger, 0)  # then no smaller size can be as fast
    retimed = _retimed_batch(run, second.chosen, () if faster else smaller, default_threads)
    return OwnThreads(tuple(run.trials), measured, *retimed)


def _retimed_batch(
    run: Passes, chosen: FedTrial, smaller: Sequence[int], default_threads: int
) -> tuple[int, str]:
    """Step 4 of the module docstring, after the larger sizes: the smaller ones, then the
    batch and why (where no other size ran at ``chosen``'s threads, its own, said as it ran at
    them)."""
    for size in smaller:
        if not run.fits(size, [0]):
            run.stop = run.short(f"a pass at batch {size}")
            break
        trial = run.feed(size, 0)
        best = run.best
        if not trial.ok or best is None or rate_of(trial) < best * (1 - FED_WITHIN):
            break
    mine = [t for t in run.trials if t.ok and t.threads == chosen.threads]
    which = threads_text(chosen.threads)
    points = (
        f"the step's throughput points ran at {threads_text(None, default_threads)} and chose "
        f"batch {chosen.batch_size}; training on {OWN_BATCHES} trains at {which} (cpu_threads)"
    )
    ran = [t for t in run.trials if t.threads == chosen.threads]
    if len({t.batch_size for t in mine}) < 2:  # the batch stays; said as it ran at them
        why = f": {run.stop}" if run.stop else ""
        failed = (
            ""
            if len(ran) == len(mine)
            else " (the trace: "
            + ", ".join(f"{t.batch_size}: failed" for t in ran if not t.ok)
            + ")"
        )
        return chosen.batch_size, (
            f"{chosen.batch_size}: {points}, where it ran at {fmt_rate(chosen.samples_per_s)} "
            f"samples/s; no other batch trained at {which}{failed}{why}"
        )
    best_rate = max(rate_of(t) for t in mine)
    pick = min((t for t in mine if rate_of(t) >= best_rate * (1 - FED_WITHIN)), key=_size)
    trace = ", ".join(
        f"{t.batch_size}: {fmt_rate(t.samples_per_s) if t.ok else 'failed'}{round_text(t)}"
        for t in ran
    )
    reason = (
        f"{pick.batch_size}: {points}, where {sizes_ran(run.trials, (0, chosen.threads))} ran, so "
        f"the batch is the smallest within {FED_WITHIN:.0%} of the best rate at {which}: "
        f"{trace} samples/s"
    )
    return pick.batch_size, reason + (f"; {run.stop}" if run.stop else "")


def _size(trial: FedTrial) -> int:
    return trial.batch_size


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
    trace = threads_trace(run.trials, default_threads)
    return MeasuredThreads(
        chosen.threads, f"{verdict}{then} (at batch {batch_size}, samples/s: {trace})"
    )
