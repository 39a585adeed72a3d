"""Passes of training fed by the DataLoader, as ``probe.fed`` and ``probe.fed_threads`` run
them: one pass, its predicted time, and the passes run so far. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from torch_autotune.evidence import FedRecord

__all__ = [
    "FED_WITHIN",
    "MIN_STEPS",
    "PASS_S",
    "START_S",
    "Fed",
    "FedTrial",
    "Passes",
    "counts_trace",
    "fed_records",
    "fmt_rate",
    "pass_seconds",
    "rate_of",
    "round_text",
    "threads_text",
    "threads_trace",
    "warmup_steps",
]

FED_WITHIN = 0.02
"""A pass within this fraction of the best fed rate is as fast (the bench's ``MIN_EFFECT``)."""


@dataclass(frozen=True)
class FedTrial:
    """One fed pass: training at ``batch_size`` fed by ``num_workers`` workers, with
    ``threads`` CPU threads (None: the process's), in samples/s; or why it failed. ``round``:
    2 where it ran again to confirm the first round's choice (``probe.fed_rounds``)."""

    batch_size: int
    num_workers: int
    threads: int | None
    samples_per_s: float | None
    seconds: float = 0.0  # wall time of the pass, warm-up included
    error: str | None = None
    round: int = 1

    @property
    def ok(self) -> bool:
        return self.samples_per_s is not None


Fed = Callable[[int, int, "int | None"], FedTrial]
"""``fed(batch_size, num_workers, threads) -> FedTrial``: one pass of training fed by the
DataLoader."""


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
class Passes:
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
    chosen_threads: dict[int, int | None] = field(default_factory=dict)
    stop: str | None = None
    set_aside: set[tuple[int, int | None]] = field(default_factory=set)  # (workers, threads)

    @property
    def best(self) -> float | None:
        """The fastest pass, less those of the counts (and threads) the second round set aside
        (``set_aside``, ``probe.fed_rounds``): a lucky pass sets no bar for the batch."""
        rates = [
            rate_of(t)
            for t in self.trials
            if t.ok and (t.num_workers, t.threads) not in self.set_aside
        ]
        return max(rates) if rates else None

    def rate(self, count: int, batch_size: int) -> float | None:
        """The rate a pass with ``count`` workers at ``batch_size`` is expected at: as fed
        before at that batch, else the slower of its loader alone and the step alone there
        (``_step``), else as fed at another batch; None where none is known."""
        ran = [t for t in self.trials if t.ok and t.num_workers == count]
        here = [rate_of(t) for t in ran if t.batch_size == batch_size]
        if here:
            return max(here)
        known = [r for r in (self.loader_rates.get(count), self._step(batch_size)) if r]
        if known:
            return min(known)
        return max((rate_of(t) for t in ran), default=self.best)

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
        rate = self.rate(counts[0], batch_size) if counts else None
        return self.fits_at(batch_size, counts[0] if counts else 0, rate, passes)

    def fits_at(self, batch_size: int, workers: int, rate: float | None, passes: int = 1) -> bool:
        """Whether ``passes`` passes at ``batch_size`` with ``workers``, at ``rate`` samples/s
        (None: not predictable, fits while time is left), end in time."""
        if self.until is None:
            return True
        left = self.until - self.clock()
        if rate is None:
            return left > 0
        return passes * pass_seconds(batch_size, workers, rate) <= left

    def short(self, what: str) -> str:
        """Why ``what`` was not run: the time left was shorter than it was predicted to take."""
        left = 0.0 if self.until is None else max(0.0, self.until - self.clock())
        return f"{what} did not fit in the {left:.0f} s of the time budget left"

    def threads_of(self, workers: int) -> int | None:
        """The CPU threads passes with ``workers`` run at: the count the thread passes chose
        (``probe.fed_threads``), else the rules' beside that many workers."""
        if workers in self.chosen_threads:
            return self.chosen_threads[workers]
        return self.threads_for(workers)

    def feed(self, batch_size: int, workers: int) -> FedTrial:
        """One pass at ``batch_size`` with ``workers``, at ``threads_of(workers)``."""
        return self.feed_at(batch_size, workers, self.threads_of(workers))

    def feed_at(self, batch_size: int, workers: int, threads: int | None) -> FedTrial:
        """One pass at ``batch_size`` with ``workers`` and ``threads`` CPU threads (None: the
        process's)."""
        trial = self.fed(batch_size, workers, threads)
        self.trials.append(trial)
        return trial

    def feed_again(self, trial: FedTrial) -> FedTrial:
        """One more pass at ``trial``'s batch, workers and threads, recorded as the second
        round (``probe.fed_rounds``)."""
        again = replace(self.fed(trial.batch_size, trial.num_workers, trial.threads), round=2)
        self.trials.append(again)
        return again


def rate_of(trial: FedTrial) -> float:
    if trial.samples_per_s is None:
        raise ValueError(f"the pass at {trial.num_workers} worker(s) failed: it has no rate")
    return trial.samples_per_s


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "?"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}"


def batches_text(sizes: Sequence[int]) -> str:
    """'batches 1, 2 and 8', or 'batch 2': ``sizes``, ascending, as the reasons name them."""
    if len(sizes) == 1:
        return f"batch {sizes[0]}"
    return f"batches {', '.join(map(str, sizes[:-1]))} and {sizes[-1]}"


def round_text(trial: FedTrial) -> str:
    """' (second round)' for a pass of the second round (``probe.fed_rounds``), else ''."""
    return " (second round)" if trial.round == 2 else ""


def counts_trace(trials: Sequence[FedTrial], batch_size: int) -> str:
    """'0: 140, 1: 251 (1 thread), 2: failed (worker crashed: ...), 1: 240 (1 thread, second
    round)' for one batch size; torch's default threads named where a count was fed at fewer
    too, and the passes of the second round (``probe.fed_rounds``) said so."""
    mine = [t for t in trials if t.batch_size == batch_size]
    fewer = {t.num_workers for t in mine if t.threads is not None}
    parts = []
    for t in mine:
        named = t.threads is not None or t.num_workers in fewer
        notes = [threads_text(t.threads)] * named + ["second round"] * (t.round == 2)
        value = fmt_rate(t.samples_per_s) if t.ok else f"failed ({t.error})"
        parts.append(f"{t.num_workers}: {value}" + (f" ({', '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def threads_trace(trials: Sequence[FedTrial], default: int | None) -> str:
    """'torch's default (2 threads): 13,178, 1 thread: 205,000 (second round)': each pass's
    threads and rate, or why it failed."""
    return ", ".join(
        f"{threads_text(t.threads, default)}: "
        f"{fmt_rate(t.samples_per_s) if t.ok else f'failed ({t.error})'}{round_text(t)}"
        for t in trials
    )


def threads_text(threads: int | None, default: int | None = None) -> str:
    """'1 thread', '4 threads'; None: torch's default pool, of ``default`` threads where known."""
    if threads is None:
        return "torch's default threads" if default is None else f"torch's default ({_n(default)})"
    return _n(threads)


def _n(threads: int) -> str:
    return f"{threads} thread{'s' * (threads != 1)}"


def fed_records(trials: Sequence[FedTrial], *, dataloader: bool = True) -> tuple[FedRecord, ...]:
    """The passes as the evidence records them (``dataloader``: False for a workload's own
    batches, ``probe.own_threads``)."""
    return tuple(
        FedRecord(
            num_workers=t.num_workers,
            batch_size=t.batch_size,
            cpu_threads=t.threads,
            samples_per_s=t.samples_per_s,
            seconds=round(t.seconds, 3),
            error=t.error,
            round=t.round,
            dataloader=dataloader,
        )
        for t in trials
    )
