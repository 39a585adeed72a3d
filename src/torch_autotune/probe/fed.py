"""Loading and training measured together: the worker count, and the batch, where the DataLoader
limits training. Pure: no torch; ``fed(batch_size, num_workers, threads)`` does the measuring.

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
   and ``PASS_S`` seconds: at batch 512 and 60 samples/s, a minute).
2. **Batch.** Where the best fed rate stays below the training step's own (loading limits
   training), smaller sizes are fed by the best count while they keep within ``FED_WITHIN``
   of the best: a smaller batch trains as fast there, on less memory. Otherwise the batch
   stays the one the step ran fastest at, and only the worker count comes from these passes.
   The batch's reason says why training ran below the step alone, by the chosen count's
   loader alone (``workers.keeps_ahead``): loading limits training where it does not keep
   ahead; else it takes the step's CPU time (0 workers: in series with the step, its share of
   the time; workers: the cores they run on).
   Where that batch itself was not fed (its passes would not fit in the time left), a smaller
   one is chosen only if it fed within 2% of the most the larger could train at (its step
   alone, or the loader alone where slower): a step of 1.2 s at any batch fed batch 1 at
   0.8 samples/s where batch 8 trained at 6.7 alone, and batch 1 was recommended. The step's
   rate is a throughput point's, else the steps the search and the confirmation timed.
3. **The choice.** The plain alternative stands unless another count fed training faster
   beyond ``FED_WITHIN`` (2%, the bench's own threshold for "slower", ``bench.MIN_EFFECT``);
   then the fewest workers within 2% of the best. One pass on a busy machine moves by more
   than two counts differ, and the costs are not alike: keeping the plain count where fewer
   measured as fast costs some RAM, while trusting such a tie cost 0.56x on this 2-CPU VM
   (2 workers fed 228 samples/s and 1 fed 231 while a neighbour held a core; the bench,
   later, measured 2 at 1.8x of 1). The batch is then the smallest these workers fed within
   2% of the best pass of all. So the choice is never slower than the plain alternative
   beyond 2%, and within 4% of every pass measured.

A pass is started only when it is predicted to end by ``until`` (``pass_seconds``, at the
rate that count was fed at before, else the slower of its loader alone and the step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from torch_autotune.probe.workers import HEADROOM, format_share, keeps_ahead, serial_share

__all__ = [
    "FED_WITHIN",
    "Fed",
    "FedChoice",
    "FedTrial",
    "choose_fed",
    "fed_order",
    "pass_seconds",
    "warmup_steps",
]

FED_WITHIN = 0.02
"""A pass within this fraction of the best fed rate is as fast (the bench's ``MIN_EFFECT``)."""


@dataclass(frozen=True)
class FedTrial:
    """One fed pass: training at ``batch_size`` fed by ``num_workers`` workers, with
    ``threads`` CPU threads (None: the process's), in samples/s; or why it failed."""

    batch_size: int
    num_workers: int
    threads: int | None
    samples_per_s: float | None
    seconds: float = 0.0  # wall time of the pass, warm-up included
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.samples_per_s is not None


Fed = Callable[[int, int, "int | None"], FedTrial]
"""``fed(batch_size, num_workers, threads) -> FedTrial``: one pass of training fed by the
DataLoader."""


@dataclass(frozen=True)
class FedChoice:
    """The worker count and batch the fed passes chose (None: no pass ran, ``workers_reason``
    says why), every pass in order, and why."""

    num_workers: int | None
    batch_size: int | None
    trials: tuple[FedTrial, ...]
    workers_reason: str
    batch_reason: str | None  # None: the batch the step chose stays


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
) -> FedChoice:
    """Feed training from each count of ``counts``, then from the best one at other ``sizes``
    where loading limits training; choose (module docstring). ``sizes``: the batch the step
    ran fastest at, then smaller ones, descending. ``loader_rates``: samples/s of each count
    measured alone; ``step_rates``: the step's own samples/s at the sizes it was measured at.
    No choice (``num_workers`` None) when no pass fits in the time left before ``until``, or
    every pass failed."""
    run = _Passes(
        fed=fed,
        threads_for=threads_for,
        until=until,
        clock=clock,
        loader_rates=loader_rates,
        step_rates=step_rates,
        step_rate=step_rates.get(sizes[0]),
    )
    passes = min(len(counts), 2)  # the plain alternative and the loader's best, at least
    at = next((b for b in sizes if run.fits(b, counts, passes)), None)
    if at is None and run.fits(sizes[-1], counts):
        at = sizes[-1]  # the plain alternative at least
    if at is None:
        return FedChoice(None, None, (), "no pass fit in the time left", None)
    for count in counts:
        alone = loader_rates.get(count)
        if alone is not None and run.best is not None and alone < run.best:
            run.skipped.append(count)
        elif not run.fits(at, [count]):
            run.stop = run.short(f"a pass with {count} worker(s)")
            break
        else:
            run.feed(at, count)
    if run.best is None:
        failed = "; ".join(f"{t.num_workers}: {t.error}" for t in run.trials)
        why = f"every pass failed ({failed})" if failed else "no pass fit in the time left"
        return FedChoice(None, None, tuple(run.trials), why, None)
    workers = _pick_workers([t for t in run.trials if t.batch_size == at], counts[0])
    step_limits = run.step_rate is not None and run.best >= run.step_rate * (1 - FED_WITHIN)
    if step_limits or (at != sizes[0] and not _as_fast_as_the_step_could_be(run, sizes[0])):
        # The step limits: its batch. Or no pass fed the step's own batch (it would not fit in
        # the time left), and the smaller batch fed slower than that batch could train at
        # (its step alone, or its loader alone where that is slower): nothing measured says it
        # is as fast, so the step's batch stays.
        chosen = next(t for t in run.trials if (t.batch_size, t.num_workers) == (at, workers))
        reason = _workers_reason(run, chosen, at, loader_rates) + _unfed(sizes[0], at)
        return FedChoice(workers, sizes[0], tuple(run.trials), reason, None)
    _feed_sizes(run, at, sizes, workers, step_rates)
    chosen = _pick_batch(run, at, workers)
    return FedChoice(
        chosen.num_workers,
        chosen.batch_size,
        tuple(run.trials),
        _workers_reason(run, chosen, at, loader_rates),
        _batch_reason(run, chosen, sizes[0]),
    )


def _unfed(recommended: int, at: int) -> str:
    """What the workers' reason adds where the batch recommended was not fed itself."""
    if at == recommended:
        return ""
    return (
        f"; batch {recommended}, the one recommended, was not fed (its passes would not fit in"
        f" the time left): the count is the one measured at {at}"
    )


def _as_fast_as_the_step_could_be(run: _Passes, batch_size: int) -> bool:
    """Whether the best pass is within ``FED_WITHIN`` of the most that training at
    ``batch_size``, never fed, could reach: its step alone, or the fastest loader alone where
    that is slower (feeding never makes either faster); False where neither is known."""
    assert run.best is not None
    bounds = [
        r
        for r in (run.step_rates.get(batch_size), max(run.loader_rates.values(), default=None))
        if r
    ]
    return bool(bounds) and run.best >= min(bounds) * (1 - FED_WITHIN)


def _feed_sizes(
    run: _Passes, at: int, sizes: Sequence[int], workers: int, step_rates: Mapping[int, float]
) -> None:
    """Where loading limits training: the larger sizes, up to the step's fastest, while the
    step alone may be what limits at ``at`` and each is faster; then the smaller sizes while
    each keeps within ``FED_WITHIN`` of the best (one whose step alone is slower than that
    cannot: feeding never makes the step faster)."""
    assert run.best is not None
    step_at = step_rates.get(at)
    if step_at is None or step_at < run.best * HEADROOM:
        for size in sorted(b for b in sizes if b > at):
            before = run.best
            if not run.fits(size, [workers]):
                run.stop = run.short(f"a pass at batch {size}")
                return
            trial = run.feed(size, workers)
            if not trial.ok or _rate(trial) <= before * (1 + FED_WITHIN):
                break
    for size in sorted((b for b in sizes if b < at), reverse=True):
        step = step_rates.get(size)
        if step is not None and step < run.best * (1 - FED_WITHIN):
            run.notes.append(
                f"batch {size} not fed: the step alone ran at {_fmt(step)} samples/s there"
            )
            return
        if not run.fits(size, [workers]):
            run.stop = run.short(f"a pass at batch {size}")
            return
        trial = run.feed(size, workers)
        if not trial.ok or _rate(trial) < run.best * (1 - FED_WITHIN):
            return


MIN_STEPS = 3  # timed steps of a pass, at least
PASS_S = 1.5  # timed seconds of a pass, at least
START_S = 0.5  # starting the workers of a pass (fork: a fraction of this; spawn: more)


def warmup_steps(num_workers: int) -> int:
    """Untimed steps of a pass: one round of the workers' first batches (one step without
    workers). The model is warm (the points trained it), so no step is slow enough for the
    workers to fill their queue ahead of a data-bound step, which a timed window would then
    count as loaded for free; they deliver a round every batch-time from the start."""
    return max(1, num_workers)


def pass_seconds(batch_size: int, num_workers: int, rate: float) -> float:
    """Predicted wall time of one pass at ``rate`` samples/s: starting the workers, the
    warm-up (``warmup_steps``), then ``PASS_S`` and at least ``MIN_STEPS`` steps, in whole
    rounds of one batch per worker."""
    step = batch_size / rate
    per_round = max(1, num_workers)
    timed = -(-MIN_STEPS // per_round) * per_round * step
    warmup = warmup_steps(num_workers) * step
    return (START_S if num_workers else 0.0) + warmup + max(PASS_S, timed)


@dataclass
class _Passes:
    """The passes run so far, the best rate among them, and whether another fits in time."""

    fed: Fed
    threads_for: Callable[[int], int | None]
    until: float | None
    clock: Callable[[], float]
    loader_rates: Mapping[int, float]
    step_rates: Mapping[int, float]
    step_rate: float | None  # at the step's fastest batch
    trials: list[FedTrial] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stop: str | None = None

    @property
    def best(self) -> float | None:
        rates = [_rate(t) for t in self.trials if t.ok]
        return max(rates) if rates else None

    def rate(self, count: int, batch_size: int) -> float | None:
        """The rate a pass with ``count`` workers at ``batch_size`` is expected at: as fed
        before at that batch, else the slower of its loader alone and the step alone there
        (``_step``), else as fed at another batch; None where none is known."""
        ran = [t for t in self.trials if t.ok and t.num_workers == count]
        here = [_rate(t) for t in ran if t.batch_size == batch_size]
        if here:
            return max(here)
        known = [r for r in (self.loader_rates.get(count), self._step(batch_size)) if r]
        if known:
            return min(known)
        return max((_rate(t) for t in ran), default=self.best)

    def _step(self, batch_size: int) -> float | None:
        """The step alone's samples/s at ``batch_size``: as measured there, else a batch that
        many at the step time of the next larger size measured (a smaller batch takes no
        longer a step; a step of 1.2 s at any size trains batch 1 at 1/8 of batch 8's rate,
        not at the same rate)."""
        if batch_size in self.step_rates:
            return self.step_rates[batch_size]
        larger = sorted(b for b in self.step_rates if b > batch_size)
        return batch_size * self.step_rates[larger[0]] / larger[0] if larger else None

    def fits(self, batch_size: int, counts: Sequence[int], passes: int = 1) -> bool:
        """Whether ``passes`` passes at ``batch_size`` with the first of ``counts`` end in time
        (a rate that cannot be predicted fits while time is left)."""
        if self.until is None:
            return True
        left = self.until - self.clock()
        rate = self.rate(counts[0], batch_size) if counts else None
        if rate is None:
            return left > 0
        return passes * pass_seconds(batch_size, counts[0], rate) <= left

    def short(self, what: str) -> str:
        """Why ``what`` was not run: the time left was shorter than it was predicted to take."""
        left = 0.0 if self.until is None else max(0.0, self.until - self.clock())
        return f"{what} did not fit in the {left:.0f} s of the time budget left"

    def feed(self, batch_size: int, workers: int) -> FedTrial:
        trial = self.fed(batch_size, workers, self.threads_for(workers))
        self.trials.append(trial)
        return trial


def _pick_workers(trials: Sequence[FedTrial], plain: int) -> int:
    """The ``plain`` count (as many workers as usable CPUs) unless another fed training faster
    beyond ``FED_WITHIN``; then the fewest workers within ``FED_WITHIN`` of the best."""
    ran = [t for t in trials if t.ok]
    best = max(_rate(t) for t in ran)
    first = next((t for t in ran if t.num_workers == plain), None)
    if first is not None and best <= _rate(first) * (1 + FED_WITHIN):
        return plain
    return min(t.num_workers for t in ran if _rate(t) >= best * (1 - FED_WITHIN))


def _pick_batch(run: _Passes, at: int, workers: int) -> FedTrial:
    """The smallest batch ``workers`` fed within ``FED_WITHIN`` of the best pass of all; else
    their pass at ``at``."""
    assert run.best is not None
    mine = [t for t in run.trials if t.ok and t.num_workers == workers]
    near = [t for t in mine if _rate(t) >= run.best * (1 - FED_WITHIN)]
    if near:
        return min(near, key=lambda t: t.batch_size)
    return next(t for t in mine if t.batch_size == at)


def _rate(trial: FedTrial) -> float:
    if trial.samples_per_s is None:
        raise ValueError(f"the pass at {trial.num_workers} worker(s) failed: it has no rate")
    return trial.samples_per_s


def _fmt(rate: float | None) -> str:
    if rate is None:
        return "?"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}"


def _trace(trials: Sequence[FedTrial], batch_size: int) -> str:
    """'0: 140, 1: 251 (1 thread), 2: failed (worker crashed: ...)' for one batch size."""
    parts = []
    for t in trials:
        if t.batch_size != batch_size:
            continue
        threads = "" if t.threads is None else f" ({t.threads} thread{'s' * (t.threads != 1)})"
        value = f"{_fmt(t.samples_per_s)}{threads}" if t.ok else f"failed ({t.error})"
        parts.append(f"{t.num_workers}: {value}")
    return ", ".join(parts)


def _workers_reason(
    run: _Passes, chosen: FedTrial, batch_size: int, loader_rates: Mapping[int, float]
) -> str:
    at = {t.num_workers: _rate(t) for t in run.trials if t.ok and t.batch_size == batch_size}
    mine, fastest = at[chosen.num_workers], max(at.values())
    plain = run.trials[0].num_workers  # the first pass: as many workers as usable CPUs
    if mine >= fastest:
        where = "the fastest of"
    elif chosen.num_workers == plain:
        where = (
            f"no other count faster beyond {FED_WITHIN:.0%} (the fastest: "
            f"{_fmt(fastest)} samples/s), so the plain alternative, as many workers as usable "
            "CPUs, stands, of"
        )
    else:
        where = f"within {FED_WITHIN:.0%} of the fastest ({_fmt(fastest)} samples/s) of"
    text = (
        f"{chosen.num_workers} worker(s): training fed by the DataLoader ran at {_fmt(mine)} "
        f"samples/s with them at batch {batch_size}, {where} the counts measured with "
        "loading and training together (samples/s, with the CPU threads the profile sets "
        f"beside each count): {_trace(run.trials, batch_size)}"
    )
    if run.skipped:
        skipped = ", ".join(f"{n} ({_fmt(loader_rates[n])})" for n in run.skipped)
        text += f"; not fed, as their loader alone was slower than that: {skipped} samples/s"
    if run.stop is not None:
        text += f"; {run.stop}"
    return text


def _batch_reason(run: _Passes, chosen: FedTrial, batch_size: int) -> str:
    trace = ", ".join(
        f"{t.batch_size}: {_fmt(t.samples_per_s) if t.ok else 'failed'}"
        for t in run.trials
        if t.num_workers == chosen.num_workers
    )
    if run.step_rate is None:
        below = f"the step alone was not timed at batch {batch_size}, the batch chosen for it"
    else:
        below = (
            f"training fed by the DataLoader runs below the step alone (at best "
            f"{_fmt(run.best)} samples/s; the step alone ran at {_fmt(run.step_rate)} samples/s "
            f"at batch {batch_size}, the batch chosen for it): {_why_below(run, chosen)}"
        )
    text = (
        f"{chosen.batch_size}: {below}, so the batch is the smallest within {FED_WITHIN:.0%} of "
        f"the best rate of training fed by {chosen.num_workers} worker(s): {trace} samples/s"
    )
    for note in run.notes:
        text += f"; {note}"
    if all(t.batch_size != batch_size for t in run.trials):
        text += f"; batch {batch_size} itself was not fed: its passes would not fit in the time"
    if run.stop is not None:
        text += f"; {run.stop}"
    return text


def _why_below(run: _Passes, chosen: FedTrial) -> str:
    """What the chosen count's loader alone says of the loss against the step alone: loading
    limits training where it does not keep ahead of the step (``workers.keeps_ahead``); else
    it takes the step's CPU time (in series with it, or on the cores its workers use)."""
    step, loaded = run.step_rate, run.loader_rates.get(chosen.num_workers)
    if step is None or loaded is None:
        return "its DataLoader alone was not measured at that count"
    ratio = loaded / step
    times = f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"
    alone = f"{_fmt(loaded)} samples/s alone, {times} the step"
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
