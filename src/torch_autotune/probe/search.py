"""Find the largest batch size that trains, from a ``fits(batch_size)`` predicate. No torch here.

Peak memory grows about linearly with the batch size (a fixed part for weights, optimizer state
and workspaces, plus activations per sample), so a couple of small trials predict where memory
runs out. The search:

1. runs ``start`` (1 by default) and a second small size, and fits ``peak = fixed + k * batch``
   through the two largest sizes that ran (a local secant, so a curve that bends is followed);
2. tries the predicted limit, then the size just above or below it, which usually brackets the
   limit in two trials;
3. bisects whatever bracket is left. Whenever a prediction fails to halve the bracket, the next
   trial is a plain bisection, so a curve the model cannot follow (fragmentation steps, noisy
   readings) costs at most twice the trials of bisection, never an endless walk.

Without a memory limit or memory readings it falls back to doubling, then bisecting. Whatever
the curve, the answer is exact for a monotone ``fits`` (every size up to the limit fits), and it
is always a size that ran: ``max_batch_size`` is the largest size whose trial succeeded.

Margin and rounding are separate steps (``apply_margin``, ``round_down``), and ``confirm`` runs
the size finally recommended once more before it is handed out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial at one batch size found."""

    fits: bool
    peak_memory_bytes: int | None = None  # allocator peak during the trial, when known
    seconds: float | None = None  # wall time of the whole trial, when measured
    warmup_s: float | None = None  # its first step's cost beyond a steady step
    step_s: float | None = None  # one steady step
    held_bytes: int | None = (
        None  # CPU: what the process held as it began, where its peak is its own
    )


@dataclass(frozen=True)
class Agreement:
    """What one check found (the seam's ``recompute_check``): how a step with activation
    checkpointing compared with the plain one from the same weights and batch
    (``probe.recompute``): ``agrees`` within ``tolerance(noise)``, and the largest relative
    difference of the loss and of any gradient; or, where the checkpointed step raised though
    the plain one trained, what it raised (``raised``: its type and first line; nothing
    compared, so it does not agree and differs without bound). ``kinds``: where the plain step
    did not fit, the check trained one block of each kind alone instead, plain against
    recomputed, and this many kinds were compared (0: the whole step was). ``noise``: the
    largest relative difference of the plain step (or block) run twice from the same weights
    and inputs, its generators seeded alike: 0 where its kernels are deterministic (the CPU);
    on a GPU, attention's backward sums in no fixed order."""

    agrees: bool
    largest_difference: float
    blocks: int  # blocks checkpointed (1: a Hugging Face model's own)
    raised: str | None = None
    kinds: int = 0
    noise: float = 0.0


RTOL = 1e-3
"""Relative tolerance between a checkpointed step's loss and gradients and the plain step's,
where the plain step run twice differs by little or nothing: float32 kernels reorder sums
between a forward and its recompute (cuDNN, matmul splits), by far less than this
(``probe.recompute`` holds the steps to ``tolerance(noise)``, never less)."""

NOISE_FACTOR = 4.0
"""How many times the plain step's own run-to-run difference the checkpointed step may differ
by. The checkpointed step against the first plain step is one more draw of the noise the
second plain step drew (the same kernels on the same weights and batch; the recompute adds one
forward), and the largest difference over millions of values moves little between draws: two
draws rarely differ by 2x, and 4x leaves as much again. A recompute that is wrong (a block
that changes state, randomness not from torch's generators) differs by 0.1 to 1. On an H200 a
1.1B decoder's checkpointed step differed from its plain step by 1.3e-2 in bfloat16, which the
check then held to 1e-3 and refused; what its plain step run twice differs by there has not
been measured yet."""

NOISE_CEILING = 0.05
"""The most the plain step run twice may differ by and still be taken for its kernels' noise:
about 4x the 1.3e-2 by which the checkpointed step differed on an H200. Beyond it the plain
step's forward itself depends on more than its weights and batch (a block that changes state
at each call: the second plain step is its second call). Widening the tolerance by it would let
the same fault in the recompute through, and no tolerance makes it right: a recompute runs the
block once more, so what it computes is not what training without it computes. The check then
refuses checkpointing, however close the recompute came to the first plain step
(``within_tolerance``)."""


def tolerance(noise: float) -> float:
    """The largest relative difference the checkpointed step may show where the plain step run
    twice differed by ``noise``: ``NOISE_FACTOR`` times that noise, at least ``RTOL``; ``RTOL``
    where the noise is above ``NOISE_CEILING`` (or not finite), not kernels' noise (the check
    refuses there whatever the difference: ``within_tolerance``)."""
    if not noise <= NOISE_CEILING:
        return RTOL
    return max(RTOL, NOISE_FACTOR * noise)


def within_tolerance(largest: float, noise: float) -> bool:
    """Whether a checkpointed step (or block) that differs from the plain one by ``largest``
    agrees with it, where the plain one run twice differed by ``noise``: within
    ``tolerance(noise)``, and never where that noise is beyond ``NOISE_CEILING`` (the plain
    forward changes from call to call: its recompute cannot be the step it replaces)."""
    return noise <= NOISE_CEILING and largest <= tolerance(noise)


@dataclass(frozen=True)
class Trial:
    """One size tried, in the order tried, with why it was chosen."""

    batch_size: int
    fits: bool
    peak_memory_bytes: int | None
    seconds: float | None
    step: str  # "start", "model", "predict", "double", "bisect"
    warmup_s: float | None = None
    step_s: float | None = None


@dataclass(frozen=True)
class SearchResult:
    """The largest size that ran, and every trial on the way."""

    max_batch_size: int | None  # None: not even the smallest size fits
    trials: tuple[Trial, ...]
    limited_by: str  # "memory" (a larger size failed), "cap", or "start" (the smallest failed)

    @property
    def trial_count(self) -> int:
        return len(self.trials)


Fits = Callable[[int], TrialOutcome]


def trial_of(batch_size: int, outcome: TrialOutcome, step: str) -> Trial:
    """The trial ``outcome`` was, at ``batch_size``, run for ``step``."""
    return Trial(
        batch_size,
        outcome.fits,
        outcome.peak_memory_bytes,
        outcome.seconds,
        step,
        outcome.warmup_s,
        outcome.step_s,
    )


class _Bracket:
    """Trials so far, and the bracket [lo, hi): lo ran, hi failed (cap + 1: nothing failed)."""

    def __init__(self, fits: Fits, cap: int) -> None:
        self.fits = fits
        self.cap = cap
        self.lo = 0
        self.hi = cap + 1
        self.trials: list[Trial] = []

    @property
    def open(self) -> bool:
        return self.hi - self.lo > 1

    def run(self, batch_size: int, step: str) -> bool:
        outcome = self.fits(batch_size)
        self.trials.append(trial_of(batch_size, outcome, step))
        if outcome.fits:
            self.lo = max(self.lo, batch_size)
        else:
            self.hi = min(self.hi, batch_size)
        return outcome.fits

    def memory_points(self) -> list[tuple[int, int]]:
        """(batch size, peak bytes) of the sizes that ran with a reading, ascending."""
        return sorted(
            {
                t.batch_size: t.peak_memory_bytes
                for t in self.trials
                if t.fits and t.peak_memory_bytes is not None
            }.items()
        )

    def bisect(self) -> None:
        while self.open:
            self.run((self.lo + self.hi) // 2, "bisect")


def _predict(points: list[tuple[int, int]], limit: int) -> int | None:
    """Where the secant through the two largest readings reaches ``limit``; None if it cannot."""
    if len(points) < 2:
        return None
    (b1, m1), (b2, m2) = points[-2], points[-1]
    per_sample = (m2 - m1) / (b2 - b1)
    if per_sample <= 0:
        return None  # flat or falling readings: noise, nothing to extrapolate
    return math.floor(b2 + (limit - m2) / per_sample)


def _gallop(bracket: _Bracket, size: int, ran: bool) -> None:
    """From the predicted size, step away from it until the limit is bracketed.

    Upwards the first step is 1 (an exact prediction is confirmed at once); a failed prediction
    is off by more than that, so downwards the first step is 2% of the size. Then the step
    doubles, so a poor prediction costs logarithmically many trials.
    """
    step = 1 if ran else max(1, round(size * 0.02))
    first = True
    while bracket.open:
        if ran:  # the limit is at or above lo: walk up until a size fails
            ran = bracket.run(min(bracket.lo + step, bracket.hi - 1), "verify")
            if not ran:
                return
        else:  # the limit is below hi: walk down until a size runs
            ran = bracket.run(max(bracket.hi - step, bracket.lo + 1), "verify")
            if ran:
                return
        step = max(2, round(size * 0.02)) if first else step * 2
        first = False


def _model_size(bracket: _Bracket, limit: int) -> int:
    """The size of the search's second trial: 8 (twice the start from 4 up), and no more than
    the largest the start's peak says is within ``limit`` (``peak(b) <= peak(lo) * b / lo``,
    for a fixed part that is not negative), never below twice the start."""
    lo, peak = bracket.memory_points()[-1]
    within = lo * limit // peak if peak > 0 else 8
    return max(2 * lo, min(8, within))


def _predict_and_verify(bracket: _Bracket, limit: int, rounds: int = 3) -> None:
    """Try the predicted limit; while predictions run, refit through the newest reading (a
    secant through sizes near the limit is far more accurate than one through 1 and 8) and try
    again; then gallop from the last prediction until the limit is bracketed."""
    size, ran = 0, False
    for _ in range(rounds):
        predicted = _predict(bracket.memory_points(), limit)
        if predicted is None or not bracket.open:
            break
        size = min(max(predicted, bracket.lo + 1), bracket.hi - 1)
        ran = bracket.run(size, "predict")
        if not ran:
            break
    if size:
        _gallop(bracket, size, ran)


def find_max_batch_size(
    fits: Fits,
    *,
    cap: int,
    memory_limit_bytes: int | None = None,
    start: int = 1,
    floor: int = 1,
    cautious: bool = False,
) -> SearchResult:
    """The largest batch size in [floor, cap] for which ``fits`` succeeds, found in few trials.

    ``fits(batch_size)`` runs a real trial (it must be monotone: if a size fits, every smaller
    size fits). ``memory_limit_bytes`` is the memory the trials may use; with it and peak-memory
    readings the search predicts the limit instead of doubling. ``cap`` bounds the answer
    (dataset size, a user maximum, host RAM on the CPU) and is never exceeded. ``floor`` is
    the smallest size worth trying (a model that cannot train on fewer samples): a failed
    ``start`` is bisected down to it, never below.
    """
    if cap < 1:
        raise ValueError(f"cap must be at least 1, got {cap}")
    if not 1 <= floor <= start <= cap:
        raise ValueError(f"start must be in [floor, cap], got {start} (floor {floor})")
    bracket = _Bracket(fits, cap)
    if not bracket.run(start, "start"):
        bracket.lo = floor - 1  # nothing at or above the floor ran yet
        bracket.bisect()  # the limit is below the start: plain bisection of [floor, start)
        largest = bracket.lo if bracket.lo >= floor else None
        limited = "start" if largest is None else "memory"
        return SearchResult(largest, tuple(bracket.trials), limited)

    if memory_limit_bytes is not None and bracket.memory_points() and bracket.open:
        # A second, larger size gives the memory model its slope: 8 (twice the start from 4
        # up); ``cautious`` (the CPU under --memory-limit, where a size past the limit runs
        # to its end instead of raising at once), no more than the start's peak says is
        # within the limit, never below twice the start.
        second = _model_size(bracket, memory_limit_bytes) if cautious else max(2 * bracket.lo, 8)
        bracket.run(min(bracket.hi - 1, second), "model")
        _predict_and_verify(bracket, memory_limit_bytes)
    while bracket.open and bracket.hi > cap:  # no failure seen yet: double towards the cap
        bracket.run(min(2 * bracket.lo, cap), "double")
    bracket.bisect()
    limited_by = "cap" if bracket.lo == cap else "memory"
    return SearchResult(bracket.lo, tuple(bracket.trials), limited_by)


def doubling_then_bisect(fits: Fits, *, cap: int, start: int = 1) -> SearchResult:
    """The usual strategy (Lightning's 'binsearch'): double until failure, then bisect.

    Kept as the baseline the benchmark compares ``find_max_batch_size`` against.
    """
    return find_max_batch_size(fits, cap=cap, memory_limit_bytes=None, start=start)


def apply_margin(batch_size: int, margin: float) -> int:
    """Leave ``margin`` (a fraction, e.g. 0.1) of the largest size as headroom; at least 1.

    Rules catalog K2: 10% for fixed shapes, about 20% when shapes vary or CUDA graphs are on.
    """
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    return max(1, math.floor(batch_size * (1 - margin)))


def round_down(batch_size: int, multiple: int) -> int:
    """Round down to a multiple (8 on Tensor-Core GPUs, catalog K4); sizes below it stay."""
    if multiple < 1:
        raise ValueError(f"multiple must be at least 1, got {multiple}")
    return batch_size if batch_size < multiple else batch_size - batch_size % multiple


@dataclass(frozen=True)
class Confirmed:
    """The size to recommend, after it ran once more."""

    batch_size: int | None  # None: nothing at or below the candidate ran
    trials: tuple[Trial, ...]


def confirm(fits: Fits, candidate: int, *, multiple: int = 1, floor: int = 1) -> Confirmed:
    """Run ``candidate`` once more before handing it out; step down (keeping the multiple, and
    not below ``floor``) if it no longer fits, so the size returned is always one that just
    ran."""
    trials: list[Trial] = []
    size = candidate
    while size >= floor:
        outcome = fits(size)
        trials.append(trial_of(size, outcome, "confirm"))
        if outcome.fits:
            return Confirmed(size, tuple(trials))
        smaller = round_down(size - 1, multiple) if size - 1 >= multiple else size - 1
        size = smaller
    return Confirmed(None, tuple(trials))
