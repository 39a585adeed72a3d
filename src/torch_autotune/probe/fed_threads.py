"""Fewer CPU threads than the rules set, fed by the DataLoader, and the pass the fed passes
choose. Pure: no torch; ``probe.fed`` runs these after feeding each worker count.

On a CPU the rules give torch's compute pool the CPUs the workers leave (G6): torch's default,
one thread per physical core, without workers. That is the most compute a large model can use,
and the worst a small one can get: a tiny MLP on this 2-core VM trained at 13,178 samples/s
with 0 workers at torch's 2 threads and at 205,000 with 0 workers at 1 thread (the pool's
synchronisation outweighs the work it splits, and a busy neighbour's core stalls every step).
The profile chose 2 workers at 99,498, and trained at 0.55x of a plain loop at 1 thread. No
rule knows where that turns over; it is measured:

1. After each count was fed at the rules' threads, the counts that could still win (their
   loader alone was faster than the best pass so far; feeding never loads faster), fastest
   pass first, are fed at half the threads, then half again while each is faster than the
   last, down to 1.
2. **The choice** (``pick_pass``): the plain alternative (as many workers as usable CPUs, at
   the rules' threads) stands unless another pass fed training faster beyond ``FED_WITHIN``;
   then the fewest workers within ``FED_WITHIN`` of the best, at the rules' threads where they
   are as fast, else the fewest threads among those passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch_autotune.probe.fed_passes import (
    FED_WITHIN,
    FedTrial,
    Passes,
    batches_text,
    fmt_rate,
    rate_of,
    threads_text,
    threads_trace,
)

__all__ = [
    "MeasuredThreads",
    "doublings",
    "feed_fewer_threads",
    "feed_larger",
    "measured_threads",
    "pick_pass",
    "sizes_ran",
]


@dataclass(frozen=True)
class MeasuredThreads:
    """The CPU threads the passes fed by the DataLoader chose (None: torch's default pool),
    and why, with the rates (``threads_reason``)."""

    threads: int | None
    reason: str


def halved(threads: int) -> list[int]:
    """The thread counts below ``threads`` by halving, down to 1: 8 -> [4, 2, 1], 3 -> [1]."""
    counts: list[int] = []
    while threads > 1:
        threads //= 2
        counts.append(threads)
    return counts


def feed_fewer_threads(run: Passes, at: int, default_threads: int, *, counted: bool = True) -> None:
    """Step 1 of the module docstring at batch ``at``. ``default_threads``: what the rules'
    None (torch's default pool) stands for here; ``counted``: a pass that did not fit names its
    worker count (not where there is no DataLoader: ``probe.own_threads``)."""
    first = [t for t in run.trials if t.ok and t.batch_size == at]
    for trial in sorted(first, key=lambda t: -rate_of(t)):
        count = trial.num_workers
        alone = run.loader_rates.get(count)
        best = run.best
        if best is None or (alone is not None and alone <= best):
            continue
        last = trial
        for threads in halved(trial.threads or default_threads):
            # as slow as the threads are fewer, at worst: 8 threads to 1, an eighth
            slowest = rate_of(last) * threads / (last.threads or default_threads)
            if not run.fits_at(at, count, slowest):
                workers = f"with {count} worker(s) " if counted else ""
                run.stop = run.short(f"a pass {workers}at {threads_text(threads)}")
                return
            fed = run.feed_at(at, count, threads)
            if not fed.ok or rate_of(fed) <= rate_of(last):
                break
            last = fed


def doublings(batch_size: int, largest: int | None) -> tuple[int, ...]:
    """The sizes above ``batch_size`` by doubling, none above ``largest`` (the top candidate:
    the largest batch the search ran, less K2's margin in memory; every size below it fits;
    None: none): 2 up to 12 -> (4, 8)."""
    sizes: list[int] = []
    size = batch_size * 2
    while largest is not None and batch_size > 0 and size <= largest:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


def feed_larger(run: Passes, larger: Sequence[int], workers: int) -> bool:
    """Where the pass chosen trains at fewer threads than the step's points ran at: the
    ``larger`` sizes (ascending, ``doublings``) at them, with ``workers``, from the largest
    batch fed there, each while the one before trained faster than the best before it beyond
    ``FED_WITHIN``, and each only where it is predicted to end in the time left (at that one's
    rate: a larger batch that trains faster ends sooner). The points' batch, chosen at torch's
    pool, is no bound there: a tiny LM on 2 busy cores trained its points' batch 2 at 61
    samples/s at 1 thread, and batch 32 at 117. True where one trained faster (beyond
    ``FED_WITHIN``): no smaller size can then be within it of the best."""
    pair = (workers, run.threads_of(workers))
    ran = [t for t in run.trials if t.ok and (t.num_workers, t.threads) == pair]
    if not ran:
        return False
    last, faster = max(ran, key=lambda t: (t.batch_size, rate_of(t))), False
    for size in [b for b in larger if b > last.batch_size]:
        if not run.fits_at(size, workers, rate_of(last)):
            run.stop = run.short(f"a pass at batch {size}")
            break
        before = run.best
        last = run.feed(size, workers)
        if not last.ok or before is None or rate_of(last) <= before * (1 + FED_WITHIN):
            break
        faster = True
    return faster


def sizes_ran(trials: Sequence[FedTrial], pair: tuple[int, int | None]) -> str:
    """'batches 1, 2 and 8' (or 'batch 2'): the sizes that trained with ``pair``'s workers and
    threads, ascending (a failed pass is in the reason's trace, not among them)."""
    return batches_text(
        sorted({t.batch_size for t in trials if t.ok and (t.num_workers, t.threads) == pair})
    )


def pick_pass(run: Passes, trials: Sequence[FedTrial], plain: int) -> FedTrial:
    """The pass chosen among ``trials`` (one batch): step 2 of the module docstring."""
    ran = [t for t in trials if t.ok]
    best = max(rate_of(t) for t in ran)
    first = next((t for t in ran if t.num_workers == plain), None)  # at the rules' threads
    if first is not None and best <= rate_of(first) * (1 + FED_WITHIN):
        return first
    near = [t for t in ran if rate_of(t) >= best * (1 - FED_WITHIN)]
    return min(
        near,
        key=lambda t: (
            t.num_workers,
            t.threads != run.threads_for(t.num_workers),
            t.threads or 0,
        ),
    )


def measured_threads(
    run: Passes, chosen: FedTrial, default_threads: int, *, kept: bool = False
) -> MeasuredThreads | None:
    """``chosen``'s thread count and why, where fewer threads than the rules' were fed at its
    batch (None where none were). ``kept``: ``chosen`` is the plain alternative's pass, kept
    where the second round did not bear out the first round's choice (``probe.fed_rounds``)."""
    count, at = chosen.num_workers, chosen.batch_size
    rules = run.threads_for(count)
    mine = [t for t in run.trials if t.num_workers == count and t.batch_size == at]
    if all(t.threads == rules for t in mine):
        others = [t for t in run.trials if t.batch_size == at]
        if all(t.threads == run.threads_for(t.num_workers) for t in others):
            return None
        which = threads_text(chosen.threads, default_threads)
        if kept:
            return MeasuredThreads(
                chosen.threads,
                f"{which}, the rules' count beside {count} worker(s), the plain alternative, "
                "which stands as the second round did not bear out a faster pass (the "
                "DataLoader workers' decision gives every pass)",
            )
        return MeasuredThreads(
            chosen.threads,
            f"{which}, the rules' count beside "
            f"{count} worker(s), which fed training fastest at batch {at} at "
            f"{fmt_rate(chosen.samples_per_s)} samples/s; no other count fed faster at fewer "
            "threads (the DataLoader workers' decision gives every pass)",
        )
    trace = threads_trace(mine, default_threads)
    which = threads_text(chosen.threads, default_threads)
    if chosen.threads == rules and kept:
        verdict = (
            f"{which}, the rules' count beside the plain alternative's workers, which stand as "
            "the second round did not bear out a faster pass"
        )
    elif chosen.threads == rules:
        verdict = f"{which}, the rules' count: no fewer fed training faster beyond {FED_WITHIN:.0%}"
    else:
        verdict = (
            f"{which}: training fed by {count} worker(s) at batch {at} ran at "
            f"{fmt_rate(chosen.samples_per_s)} samples/s with them, against "
            f"{_rate_at(mine, rules)} with {threads_text(rules, default_threads)}, the rules' count"
        )
    reason = f"{verdict} (measured with {count} worker(s) at batch {at}, samples/s: {trace})"
    return MeasuredThreads(chosen.threads, reason)


def _rate_at(trials: Sequence[FedTrial], threads: int | None) -> str:
    rates = [rate_of(t) for t in trials if t.ok and t.threads == threads]
    return fmt_rate(max(rates)) if rates else "? (failed)"
