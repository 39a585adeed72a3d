"""Loading and training measured together: the worker count, and the batch, where the DataLoader
limits training or the passes choose fewer CPU threads than the step's points ran at. Pure: no
torch; ``fed(batch_size, num_workers, threads)`` does the measuring.

A DataLoader measured alone says how fast it loads, not how fast training runs while it loads.
On a CPU the workers and the training step share the cores: on a 2-core machine a dataset of
4 ms a sample loaded 2.0x faster with 2 workers than with 0, and the tuned profile that chose 0
from the loader alone trained at 0.51x the speed of a plain 2-worker loop. So where loading
limits training (no worker count keeps ahead of the step), and on a CPU wherever workers are
used, the choice comes from *fed* passes: the real training step, fed by the real DataLoader,
with the CPU threads the profile sets beside that many workers.

1. **Workers.** The plain alternative a user would try, as many workers as usable CPUs
   (``max_workers``), runs first; then the other counts the loader ran, fastest loader first.
   A count whose loader alone delivered less than the best fed rate so far is not run: feeding
   training never makes it load faster. They run at the batch the training step ran fastest
   at, or at the largest of its halvings where all of them fit in the time left (a pass is a
   warm-up through the batches the workers loaded ahead, then at least ``MIN_STEPS`` steps
   and ``PASS_S`` seconds: at batch 512 and 60 samples/s, a minute). On a CPU, fewer threads
   than the rules' are fed then too (``probe.fed_threads``).
2. **Batch.** Where the best fed rate stays below the training step's own (loading limits
   training), smaller sizes are fed by the best count while they keep within ``FED_WITHIN``
   of the best: a smaller batch trains as fast there, on less memory. Where the pass chosen
   (step 3) trains at fewer CPU threads than the step's points ran at (torch's pool:
   ``_retimed``), the points' rates, and the batch they chose, do not hold at its threads, so
   the sizes are fed at them however fast the step ran alone: the larger ones, past the
   step's fastest up to the search's largest (``fed_threads.feed_larger``), while each is
   faster, then the smaller ones while each keeps within ``FED_WITHIN`` of the best (a tiny
   LM on 2 busy cores: batch 2 chosen at 2 threads, 61 samples/s at 1, where 32 ran 117).
   Otherwise the batch stays the step's fastest; only the worker count comes from these
   passes. The batch's reason says why (``BatchChoice.fed_why``): the threads the sizes were
   fed at; or why training ran below the step alone, by the chosen count's loader alone
   (``workers.keeps_ahead``): loading limits training where it does not keep ahead; else it
   takes the step's CPU time (0 workers: in series with the step; workers: their cores).
   Where that batch itself was not fed (its passes would not fit in the time left), a smaller
   one is chosen only if it fed within 2% of the most the larger could train at (its step
   alone, or the loader alone where slower): a step of 1.2 s at any batch fed batch 1 at
   0.8 samples/s where batch 8 trained at 6.7 alone, and batch 1 was recommended. The step's
   rate is a throughput point's, else the search's and the confirmation's steps.
3. **The choice.** The plain alternative stands unless another count fed training faster
   beyond ``FED_WITHIN`` (2%, the bench's own threshold for "slower", ``bench.MIN_EFFECT``);
   then the fewest workers within 2% of the best. One pass on a busy machine moves by more
   than two counts differ, and the costs are not alike: keeping the plain count where fewer
   measured as fast costs some RAM, while trusting such a tie cost 0.56x on this 2-CPU VM
   (2 workers fed 228 samples/s and 1 fed 231 while a neighbour held a core; the bench,
   later, measured 2 at 1.8x of 1). One pass moves by more than 2% too (the same pass fed
   937 to 2,490 samples/s in four rounds on this VM), so before the choice leaves the plain
   alternative a second round runs (``probe.fed_rounds``): the pass chosen, then the plain
   alternative, once more each, at the same batch, workers and threads; the choice moves only
   where the slower of the chosen pass's two still fed faster than the faster of the plain
   alternative's beyond 2%, else the plain alternative stands. Where the two passes do not
   fit in the time left, the first round's choice stays, and its reason says it rests on one
   pass each. The batch is then the smallest these workers fed within 2% of the best pass of
   all, less those the second round set aside: never slower than the plain alternative
   beyond 2%, within 4% of every pass but those (where each feeds at one rate, none is).

A pass starts only where predicted to end by ``until`` (``pass_seconds``, at the rate that
count fed at before, else the slower of its loader alone and the step)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import inf

from torch_autotune.evidence import FedWhy
from torch_autotune.probe.fed_passes import (
    FED_WITHIN,
    PASS_S,
    Fed,
    FedTrial,
    Passes,
    counts_trace,
    fmt_rate,
    pass_seconds,
    rate_of,
    round_text,
    threads_text,
    warmup_steps,
)
from torch_autotune.probe.fed_rounds import SecondRound, second_round
from torch_autotune.probe.fed_threads import (
    MeasuredThreads,
    feed_fewer_threads,
    feed_larger,
    measured_threads,
    pick_pass,
    sizes_ran,
)
from torch_autotune.probe.workers import HEADROOM, format_share, keeps_ahead, serial_share

__all__ = [
    "FED_WITHIN",
    "PASS_S",
    "Fed",
    "FedChoice",
    "FedTrial",
    "choose_fed",
    "fed_order",
    "pass_seconds",
    "warmup_steps",
]


@dataclass(frozen=True)
class FedChoice:
    """The worker count and batch the fed passes chose (None: no pass ran, ``workers_reason``
    says why), every pass in order, and why."""

    num_workers: int | None
    batch_size: int | None
    trials: tuple[FedTrial, ...]
    workers_reason: str
    batch_reason: str | None  # None: the batch the step chose stays
    threads: MeasuredThreads | None = None  # where fewer threads than the rules' were fed
    batch_why: FedWhy | None = None  # what ``batch_reason`` gives as why (``BatchChoice``)


def fed_order(max_workers: int, loader_rates: Mapping[int, float]) -> list[int]:
    """The counts to feed training with, in order: ``max_workers`` (the plain alternative),
    then the other counts the loader ran, its fastest first."""
    others = sorted(
        (n for n in loader_rates if n != max_workers), key=lambda n: (-loader_rates[n], n)
    )
    return [max_workers, *others]


def choose_fed(
    fed: Fed,
    *,
    sizes: Sequence[int],
    counts: Sequence[int],
    loader_rates: Mapping[int, float],
    step_rates: Mapping[int, float],
    threads_for: Callable[[int], int | None],
    until: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    default_threads: int | None = None,
    larger: Sequence[int] = (),
) -> FedChoice:
    """Feed training from each count of ``counts``, then from the best one at other ``sizes``
    where loading limits training; choose (module docstring). ``sizes``: the batch the step
    ran fastest at, then smaller ones, descending; ``larger``: sizes the search ran above it,
    ascending, fed at fewer threads than the points ran at. ``loader_rates``: samples/s of
    each count alone; ``step_rates``: the step's own samples/s where it was measured.
    ``default_threads``: on a CPU, what ``threads_for``'s None (torch's pool) stands for, and
    fewer threads are fed too (``probe.fed_threads``); None: the rules' threads only.
    No choice (``num_workers`` None) when no pass fits in the time left before ``until``, or
    every pass failed."""
    run = Passes(
        fed=fed,
        threads_for=threads_for,
        until=until,
        clock=clock,
        loader_rates=loader_rates,
        step_rates=step_rates,
        step_rate=step_rates.get(sizes[0]),
    )
    at = _feed_counts(run, sizes, counts)
    if at is None or run.best is None:
        failed = "; ".join(f"{t.num_workers}: {t.error}" for t in run.trials)
        why = f"every pass failed ({failed})" if failed else "no pass fit in the time left"
        return FedChoice(None, None, tuple(run.trials), why, None)
    second, threads = _choose_pass(run, at, counts[0], default_threads)
    picked, workers = second.chosen, second.chosen.num_workers
    retimed = _retimed(picked, default_threads)
    step_limits = run.step_rate is not None and run.best >= run.step_rate * (1 - FED_WITHIN)
    if (step_limits and retimed is None) or (
        at != sizes[0]
        and run.best < (_could_train(run, sizes[0]) or (inf, ""))[0] * (1 - FED_WITHIN)
    ):
        # The step limits: its batch. Or no pass fed the step's own batch (it would not fit in
        # the time left), and the smaller batch fed slower than that batch could train at
        # (``_could_train``): nothing measured says it is as fast, so the step's batch stays.
        reason = _workers_reason(run, picked, at, loader_rates, second) + _unfed(sizes[0], at)
        trials = tuple(run.trials)
        return FedChoice(workers, sizes[0], trials, reason, None, threads)
    decided = (at, run.best)  # the passes at ``at`` that found the step does not limit
    if retimed is None:
        _feed_sizes(run, at, sizes, workers, step_rates)
    else:  # the points' rates do not hold at fewer threads; larger, where the step limits
        _feed_sizes(run, at, sizes, workers, {}, larger=larger if step_limits else ())
    chosen = _pick_batch(run, at, workers)
    why, batch_reason = _batch_reason(
        run, chosen, sizes[0], retimed if step_limits else None, decided=decided
    )
    return FedChoice(
        chosen.num_workers,
        chosen.batch_size,
        tuple(run.trials),
        _workers_reason(run, chosen, at, loader_rates, second),
        batch_reason,
        threads,
        why,
    )


def _choose_pass(
    run: Passes, at: int, plain: int, default_threads: int | None
) -> tuple[SecondRound, MeasuredThreads | None]:
    """The pass chosen at batch ``at`` (step 3 of the module docstring), after the threads
    were fed where ``default_threads`` is given, with the threads' decision (None: the rules'
    threads only); ``plain``: the plain alternative's worker count."""
    if default_threads is not None:
        feed_fewer_threads(run, at, default_threads)
    picked = pick_pass(run, [t for t in run.trials if t.batch_size == at], plain)
    second = second_round(run, picked, plain)
    run.chosen_threads[second.chosen.num_workers] = second.chosen.threads
    if default_threads is None:
        return second, None
    return second, measured_threads(run, second.chosen, default_threads, kept=second.kept)


def _retimed(picked: FedTrial, default_threads: int | None) -> int | None:
    """The threads the step's points ran at (torch's pool, ``default_threads``), where the
    pass chosen trains at fewer: the points' rates, and the batch they chose, do not hold at
    its threads (a conv net on 2 busy cores: batch 128 fastest at 2 threads, 32 at 1, 1.6x
    faster than 128 there), so the smaller sizes are fed at them too. None elsewhere."""
    if picked.threads is None or default_threads is None:
        return None
    return default_threads if picked.threads < default_threads else None


def _feed_counts(run: Passes, sizes: Sequence[int], counts: Sequence[int]) -> int | None:
    """Feed each of ``counts`` at the rules' threads (step 1 of the module docstring), at the
    largest of ``sizes`` where two passes fit in the time left (the plain alternative and
    the loader's best), else the smallest where one does; return that batch (None: none fit,
    nothing ran)."""
    passes = min(len(counts), 2)
    at = next((b for b in sizes if run.fits(b, counts, passes)), None)
    if at is None and run.fits(sizes[-1], counts):
        at = sizes[-1]  # the plain alternative at least
    if at is None:
        return None
    for count in counts:
        alone = run.loader_rates.get(count)
        if alone is not None and run.best is not None and alone < run.best:
            run.skipped.append(count)
        elif not run.fits(at, [count]):
            run.stop = run.short(f"a pass with {count} worker(s)")
            break
        else:
            run.feed(at, count)
    return at


def _unfed(recommended: int, at: int) -> str:
    """What the workers' reason adds where the batch recommended was not fed itself."""
    if at == recommended:
        return ""
    return (
        f"; batch {recommended}, the one recommended, was not fed (its passes would not fit in"
        f" the time left): the count is the one measured at {at}"
    )


def _could_train(run: Passes, batch_size: int) -> tuple[float, str] | None:
    """The most that training at ``batch_size``, never fed, could reach, and what bounds it:
    its step alone, or the fastest loader alone where slower (feeding never makes either
    faster); None where neither is known."""
    step, loader = run.step_rates.get(batch_size), max(run.loader_rates.values(), default=None)
    bounds = [(r, what) for r, what in ((step, "its step"), (loader, "the loader")) if r]
    return min(bounds) if bounds else None


def _feed_sizes(
    run: Passes,
    at: int,
    sizes: Sequence[int],
    workers: int,
    step_rates: Mapping[int, float],
    *,
    larger: Sequence[int] = (),
) -> None:
    """Where loading limits training: the larger sizes, up to the step's fastest, while the
    step alone may be what limits at ``at`` and each is faster, and on to ``larger``
    (``feed_larger``: none smaller where one of those was faster); then the smaller sizes
    while each keeps within ``FED_WITHIN`` of the best (one whose step alone is slower than
    that cannot: feeding never makes the step faster)."""
    assert run.best is not None
    step_at = step_rates.get(at)
    if step_at is None or step_at < run.best * HEADROOM:
        for size in sorted(b for b in sizes if b > at):
            before = run.best
            if not run.fits(size, [workers]):
                run.stop = run.short(f"a pass at batch {size}")
                return
            trial = run.feed(size, workers)
            if not trial.ok or rate_of(trial) <= before * (1 + FED_WITHIN):
                break
        else:
            if feed_larger(run, larger, workers):
                return
    for size in sorted((b for b in sizes if b < at), reverse=True):
        step = step_rates.get(size)
        if step is not None and step < run.best * (1 - FED_WITHIN):
            run.notes.append(
                f"batch {size} not fed: the step alone ran at {fmt_rate(step)} samples/s there"
            )
            return
        if not run.fits(size, [workers]):
            run.stop = run.short(f"a pass at batch {size}")
            return
        trial = run.feed(size, workers)
        if not trial.ok or rate_of(trial) < run.best * (1 - FED_WITHIN):
            return


def _pick_batch(run: Passes, at: int, workers: int) -> FedTrial:
    """The smallest batch ``workers`` fed within ``FED_WITHIN`` of the best pass of all; else
    their pass at ``at``."""
    assert run.best is not None
    threads = run.threads_of(workers)
    mine = [t for t in run.trials if t.ok and (t.num_workers, t.threads) == (workers, threads)]
    near = [t for t in mine if rate_of(t) >= run.best * (1 - FED_WITHIN)]
    if near:
        return min(near, key=lambda t: t.batch_size)
    return next(t for t in mine if t.batch_size == at)


def _workers_reason(
    run: Passes,
    chosen: FedTrial,
    batch_size: int,
    loader_rates: Mapping[int, float],
    second: SecondRound,
) -> str:
    at = [t for t in run.trials if t.ok and t.batch_size == batch_size]
    fastest = max(rate_of(t) for t in at)
    mine = max(rate_of(t) for t in at if (t.num_workers, t.threads) == _pair(chosen))
    plain = run.trials[0]  # the first pass: as many workers as usable CPUs, the rules' threads
    if second.kept:
        where = (
            "the plain alternative, as many workers as usable CPUs, which stands as the second "
            "round did not bear out a faster count, of"
        )
    elif mine >= fastest:
        where = "the fastest of"
    elif _pair(chosen) == _pair(plain):
        where = (
            f"no other count faster beyond {FED_WITHIN:.0%} (the fastest: "
            f"{fmt_rate(fastest)} samples/s), so the plain alternative, as many workers as usable "
            "CPUs, stands, of"
        )
    else:
        where = f"within {FED_WITHIN:.0%} of the fastest ({fmt_rate(fastest)} samples/s) of"
    fewer = any(t.threads != run.threads_for(t.num_workers) for t in at)
    threads = "" if not fewer else f" at {threads_text(chosen.threads)}"
    text = (
        f"{chosen.num_workers} worker(s){threads}: training fed by the DataLoader ran at "
        f"{fmt_rate(mine)} samples/s with them at batch {batch_size}, {where} the counts "
        "measured with loading and training together (samples/s, with the CPU threads the "
        f"profile sets beside each count{', and fewer' * fewer}): "
        f"{counts_trace(run.trials, batch_size)}"
    )
    if second.text:
        text += f"; {second.text}"
    if run.skipped:
        skipped = ", ".join(f"{n} ({fmt_rate(loader_rates[n])})" for n in run.skipped)
        text += f"; not fed, as their loader alone was slower than that: {skipped} samples/s"
    if run.stop is not None:
        text += f"; {run.stop}"
    return text


def _pair(trial: FedTrial) -> tuple[int, int | None]:
    return trial.num_workers, trial.threads


def _batch_reason(
    run: Passes,
    chosen: FedTrial,
    batch_size: int,
    retimed: int | None,
    *,
    decided: tuple[int, float],
) -> tuple[FedWhy, str]:
    """Why the passes chose ``chosen``'s batch (``BatchChoice.fed_why``), and the reason that
    says so with the passes: ``retimed``, the threads the step's points ran at where the pass
    chosen trains at fewer and the step limits (None: it does not, or they are the same);
    ``decided``: the batch fed first and its best rate, which found the step does not limit
    (a smaller batch fed later may beat the step alone: its best is not what decided)."""
    why: FedWhy
    trace = ", ".join(
        f"{t.batch_size}: {fmt_rate(t.samples_per_s) if t.ok else 'failed'}{round_text(t)}"
        for t in run.trials
        if _pair(t) == _pair(chosen)
    )
    if retimed is not None and run.step_rate is not None:
        why = "fewer threads"
        below = (
            f"the step alone ran at {fmt_rate(run.step_rate)} samples/s at batch {batch_size}, "
            f"the batch chosen for it, at {threads_text(None, retimed)}; training fed by the "
            f"DataLoader trains at {threads_text(chosen.threads)} (cpu_threads), where "
            f"{sizes_ran(run.trials, _pair(chosen))} were fed"
        )
    elif run.step_rate is None:
        why = "step not timed"
        below = f"the step alone was not timed at batch {batch_size}, the batch chosen for it"
    else:
        why = "below the step"
        below = (
            f"training fed by the DataLoader runs below the step alone (at best "
            f"{fmt_rate(decided[1])} samples/s fed at batch {decided[0]}; the step alone ran at "
            f"{fmt_rate(run.step_rate)} samples/s at batch {batch_size}, the batch chosen for "
            f"it): {_why_below(run, chosen)}"
        )
    many = len({t.batch_size for t in run.trials if t.ok and _pair(t) == _pair(chosen)}) > 1
    fed_by = f"training fed by {chosen.num_workers} worker(s)"
    which = f"the smallest within {FED_WITHIN:.0%} of the best rate of {fed_by}"
    which = which if many else f"the only size {fed_by} ran at, with no other to compare"
    text = f"{chosen.batch_size}: {below}, so the batch is {which}: {trace} samples/s"
    for note in run.notes:
        text += f"; {note}"
    bound = _could_train(run, batch_size)
    if all(t.batch_size != batch_size for t in run.trials) and bound is not None:
        text += (
            f"; batch {batch_size} itself was not fed: its passes would not fit in the time, and"
            f" the passes fed within {FED_WITHIN:.0%} of the most it could train at, "
            f"{fmt_rate(bound[0])} samples/s ({bound[1]} alone)"
        )
    if run.stop is not None:
        text += f"; {run.stop}"
    return why, text


def _why_below(run: Passes, chosen: FedTrial) -> str:
    """What the chosen count's loader alone says of the loss against the step alone: loading
    limits training where it does not keep ahead of the step (``workers.keeps_ahead``); else
    it takes the step's CPU time (in series with it, or on the cores its workers use)."""
    step, loaded = run.step_rate, run.loader_rates.get(chosen.num_workers)
    if step is None or loaded is None:
        return "its DataLoader alone was not measured at that count"
    ratio = loaded / step
    times = f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"
    alone = f"{fmt_rate(loaded)} samples/s alone, {times} the step"
    if chosen.num_workers == 0:
        share = format_share(serial_share(loaded, step))
        limits = "loading limits training: " if loaded < step else ""
        return (
            f"{limits}in the main process, loading ({alone}) runs in series with the step and"
            f" takes {share} of training's time"
        )
    if not keeps_ahead(chosen.num_workers, loaded, step):
        return f"loading limits training: {chosen.num_workers} worker(s) loaded {alone}"
    return (
        f"loading keeps ahead of the step ({chosen.num_workers} worker(s): {alone}), so it does"
        " not limit training: its workers take CPU time from the step"
    )
