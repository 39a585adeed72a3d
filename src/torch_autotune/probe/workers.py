"""Choose the DataLoader worker count that feeds training, by measuring the candidates.

``search_workers`` is the search, pure over an injected ``measure(num_workers)`` function;
``choose_workers`` wires it to ``probe.loader.measure_loader``, which measures one count.

The search (catalog F1, F2, G6; issue "measure DataLoader workers"):

1. Candidates are 0, 1, 2, 4, 8, ... below ``max_workers``, then ``max_workers`` itself
   (``max_workers`` is the usable CPUs, quota-aware, divided by the training processes on
   the node; the caller passes it). 0 workers (loading in the main process) is always tried:
   for small in-memory tensors it is often the fastest, since workers add pickling and IPC.
2. A candidate *helps* when it is more than 5% faster (``IMPROVEMENT``) than the best rate so
   far; a short single measurement is noisy by a few percent, so smaller gains are not
   trusted. The search stops after ``PATIENCE`` (2) candidates in a row that do not help (a
   failed candidate does not help). One non-helping candidate is not enough: on a 2-CPU
   machine 1 worker is often no faster than 0 (the main process just waits instead of
   loading) while 2 workers are twice as fast. While the best rate is below half the
   training step's (``FAR_BEHIND``), patience does not stop the search at all: on an H100
   host, ResNet-50's 224x224 images loaded at 970, 794 and 1,014 samples/s with 0, 1 and 2
   workers against a step of 4,972 samples/s, and the search stopped there, at 0 workers.
3. With a training step rate, the search also stops at the first count that *keeps ahead* of
   the step, and chooses it (it is the smallest that does). Workers load beside the step, so
   a count of them keeps ahead at the step rate times ``HEADROOM`` (1.1): 10% ahead, so loader
   jitter does not stall the step. 0 workers loads in the main process, in series with the
   step: a loader 1.1x the step's rate there leaves training at about half the step's rate
   (each sample waits for its load, then its step). So 0 keeps ahead only where loading takes
   at most ``SERIAL_SHARE`` (2%, the bench's threshold for slower) of the time of a step and
   its load together: a loader at least 49x the step's rate. GPT-2's tokens on an H100 host
   loaded at 48,709 samples/s against a step of 672 (72x, 1.4%): 0 workers.
4. Otherwise (no step rate, or no count keeps ahead: training is loader-bound) the choice is
   the smallest count within 5% of the best measured rate (``NEAR_BEST``): fewer workers cost
   less RAM and leave CPUs to the training process for the same throughput.

A worker that crashes (killed by a signal, out of shared memory, a segfault in a C extension)
or hangs (no batch within ``timeout_s``) fails its candidate, which is recorded in the trace
and never chosen; the search goes on. Any other exception comes from the user's dataset or
collate function and propagates. On Windows only 0 workers is measured unless the caller
passes ``candidates``: every worker there is a new interpreter (spawn) that takes seconds to
start, nearly one after another (catalog F4, F9).

Process safety: see ``probe.loader``. Importing this module does not import torch.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch_autotune.errors import WorkloadError
from torch_autotune.probe.loader import LoaderTrial, measure_loader

if TYPE_CHECKING:
    from torch.utils.data import Dataset  # noqa: TID251 (a type only: the search imports no torch)

__all__ = [
    "FAR_BEHIND",
    "HEADROOM",
    "IMPROVEMENT",
    "NEAR_BEST",
    "PATIENCE",
    "SERIAL_SHARE",
    "WorkerChoice",
    "choose_workers",
    "format_rate",
    "format_share",
    "keeps_ahead",
    "search_workers",
    "serial_share",
    "worker_candidates",
]

IMPROVEMENT = 1.05
"""A candidate helps when its rate exceeds the best so far by more than this factor."""
PATIENCE = 2
"""Candidates in a row that do not help (or fail) before the search stops."""
HEADROOM = 1.10
"""The loader must deliver this multiple of the training step rate to keep ahead of it."""
NEAR_BEST = 0.95
"""Without a step rate to beat, the smallest count reaching this fraction of the best wins."""
SERIAL_SHARE = 0.02
"""0 workers keeps ahead of the step where loading takes at most this share of the time of a
step and its load, which run in series (the bench's ``MIN_EFFECT``: 2% is "not slower")."""

Measure = Callable[[int], "LoaderTrial"]
"""Measures one worker count: ``measure(num_workers) -> LoaderTrial``."""


@dataclass(frozen=True)
class WorkerChoice:
    """The chosen ``num_workers``, every candidate tried in order, and why."""

    num_workers: int
    trials: tuple[LoaderTrial, ...]
    reason: str


# --- the search ----------------------------------------------------------------------------


def serial_share(loader_rate: float, step_rate: float) -> float:
    """The share of training time that loading takes where it runs in series with the step
    (0 workers): a sample costs ``1/step_rate + 1/loader_rate`` seconds."""
    return step_rate / (step_rate + loader_rate)


def keeps_ahead(num_workers: int, loader_rate: float, step_rate: float) -> bool:
    """Whether ``num_workers`` loading at ``loader_rate`` samples/s keeps the training step fed
    at ``step_rate``: workers load beside it (``HEADROOM`` ahead); the main process loads in
    series with it (at most ``SERIAL_SHARE`` of the time). Module docstring, rule 3."""
    if num_workers == 0:
        return serial_share(loader_rate, step_rate) <= SERIAL_SHARE
    return loader_rate >= step_rate * HEADROOM


def worker_candidates(max_workers: int) -> tuple[int, ...]:
    """0, 1, 2, 4, 8, ... below ``max_workers``, then ``max_workers`` (just 0 when it is <= 0)."""
    counts = [0]
    count = 1
    while count < max_workers:
        counts.append(count)
        count *= 2
    if max_workers >= 1:
        counts.append(max_workers)
    return tuple(counts)


def search_workers(
    measure: Measure,
    *,
    max_workers: int,
    step_rate_samples_per_s: float | None = None,
    candidates: Iterable[int] | None = None,
    windows: bool = False,
    until: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> WorkerChoice:
    """Measure worker counts in increasing order and choose one (the rules are in the module
    docstring). Pure: ``measure(num_workers)`` does the measuring.

    ``max_workers`` caps every candidate (a count <= 0 allows only 0). ``candidates``
    replaces the default sequence (counts above ``max_workers`` are dropped); on Windows
    (``windows=True``) the default is 0 alone. If every candidate fails and 0 was not among
    them, 0 is measured as well; if nothing runs, WorkloadError. With ``until`` (a time on
    ``clock``), a candidate is started only when one as long as the longest so far still ends
    by then; the first candidate always runs.
    """
    if step_rate_samples_per_s is not None and not (
        math.isfinite(step_rate_samples_per_s) and step_rate_samples_per_s > 0
    ):
        raise ValueError(f"step rate must be > 0 samples/s, got {step_rate_samples_per_s}")
    counts = _candidate_list(max_workers, candidates, windows=windows)
    trials, stop = _run_until_stop(measure, counts, step_rate_samples_per_s, until, clock)
    if not any(t.ok for t in trials) and 0 not in counts:
        trials.append(measure(0))
        stop = "every candidate failed, so 0 workers was measured as well"
    return _decide(tuple(trials), step_rate_samples_per_s, stop, windows and candidates is None)


def _candidate_list(
    max_workers: int, candidates: Iterable[int] | None, *, windows: bool
) -> tuple[int, ...]:
    """The counts to try, ascending and within [0, max_workers]."""
    if candidates is None:
        return (0,) if windows else worker_candidates(max_workers)
    chosen = sorted({c for c in candidates if 0 <= c <= max(max_workers, 0)})
    if not chosen:
        raise ValueError(f"no candidate in {list(candidates)} lies in [0, {max(max_workers, 0)}]")
    return tuple(chosen)


FAR_BEHIND = 0.5
"""While the best rate is below half the training step's, patience does not stop the search:
with per-sample costs this high (224x224 images on a 16-CPU H100 host), 1 and 2 workers can be
no faster than 0 (the main process hands tensors over to workers), while 8 are several times
faster."""


def _run_until_stop(
    measure: Measure,
    counts: Sequence[int],
    step_rate: float | None,
    until: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[LoaderTrial], str]:
    """Trials in order, and the sentence that says why the search stopped."""
    trials: list[LoaderTrial] = []
    best: float | None = None
    idle = 0
    longest = 0.0
    for count in counts:
        began = clock()
        if trials and until is not None and began + longest > until:
            return trials, (
                f"stopped before {count}: {max(0.0, until - began):.0f} s of the time budget "
                f"were left, less than the longest count so far took ({longest:.1f} s)"
            )
        trial = measure(count)
        longest = max(longest, clock() - began)
        trials.append(trial)
        rate = trial.samples_per_s
        if rate is not None and step_rate is not None and keeps_ahead(count, rate, step_rate):
            return trials, f"stopped at {count}: it keeps ahead of training"
        if rate is not None and (best is None or rate > best * IMPROVEMENT):
            best, idle = rate, 0
            continue
        best = best if rate is None or best is None else max(best, rate)
        idle += 1
        far_behind = step_rate is not None and (best or 0.0) < FAR_BEHIND * HEADROOM * step_rate
        if idle >= PATIENCE and count != counts[-1] and not far_behind:
            return trials, (
                f"stopped at {count}: {PATIENCE} counts in a row were no more than "
                f"{_percent(IMPROVEMENT - 1)} faster than the best"
            )
    return trials, "every candidate was measured"


def _decide(
    trials: tuple[LoaderTrial, ...], step_rate: float | None, stop: str, windows_default: bool
) -> WorkerChoice:
    """Choose among the trials that ran, and say why with the numbers."""
    ran = [t for t in trials if t.ok]
    if not ran:
        raise WorkloadError(
            "no worker count could load the dataset: "
            + "; ".join(f"{t.num_workers}: {t.error}" for t in trials)
        )
    best = max(_rate(t) for t in ran)
    ahead = (
        []
        if step_rate is None
        else [t for t in ran if keeps_ahead(t.num_workers, _rate(t), step_rate)]
    )
    if ahead:
        chosen = ahead[0]
        why = _why_ahead(chosen, step_rate)
    else:
        chosen = next(t for t in ran if _rate(t) >= best * NEAR_BEST)
        why = (
            f"the smallest count within {_percent(1 - NEAR_BEST)} of the best measured rate "
            f"({format_rate(best)} samples/s)"
        )
        if step_rate is not None:
            why += (
                f"; no count keeps ahead of the training step's {format_rate(step_rate)} "
                "samples/s, so loading limits training"
            )
            main = next((t for t in ran if t.num_workers == 0), None)
            if main is not None and _rate(main) >= step_rate * HEADROOM:
                why += (
                    f" (0 workers loads in series with the step: at "
                    f"{format_rate(_rate(main))} samples/s loading takes "
                    f"{format_share(serial_share(_rate(main), step_rate))} of training's time)"
                )
    if windows_default:
        why += (
            "; on Windows only 0 was measured: every worker is a spawned interpreter that "
            "takes seconds to start (catalog F4, F9); pass candidates to measure workers"
        )
    reason = (
        f"{chosen.num_workers} worker(s) at {format_rate(_rate(chosen))} samples/s: {why}. "
        f"Measured {_trace(trials)}; {stop}."
    )
    return WorkerChoice(chosen.num_workers, trials, reason)


def _why_ahead(chosen: LoaderTrial, step_rate: float | None) -> str:
    """Why the count that keeps ahead of the step does (``keeps_ahead``)."""
    rate = _rate(chosen)
    if chosen.num_workers == 0:
        share = format_share(serial_share(rate, step_rate or 0.0))
        return (
            f"loading in the main process, in series with the training step's "
            f"{format_rate(step_rate)} samples/s, takes {share} of training's time, at most "
            f"{_percent(SERIAL_SHARE)}"
        )
    return (
        f"the smallest count whose {format_rate(rate)} samples/s keeps "
        f"{_percent(HEADROOM - 1)} ahead of the training step's {format_rate(step_rate)} samples/s"
    )


def _rate(trial: LoaderTrial) -> float:
    """The rate of a trial that ran (samples/s); callers pass only trials that ran."""
    if trial.samples_per_s is None:
        raise ValueError(f"the trial at {trial.num_workers} worker(s) failed: it has no rate")
    return trial.samples_per_s


def _trace(trials: Sequence[LoaderTrial]) -> str:
    """'0: 512 samples/s, 1: failed (worker crashed: ...), 2: 1,020 samples/s'."""
    parts = [
        f"{t.num_workers}: {format_rate(t.samples_per_s)} samples/s"
        if t.ok
        else f"{t.num_workers}: failed ({t.error})"
        for t in trials
    ]
    return ", ".join(parts)


def format_rate(rate: float | None) -> str:
    """A rate in samples/s for people: thousands separated, one decimal below 100."""
    if rate is None:
        return "?"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def format_share(fraction: float) -> str:
    """A share of time for people: one decimal below 10% (1.4%, not 1%)."""
    return f"{fraction * 100:.1f}%" if fraction < 0.1 else _percent(fraction)


def choose_workers(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    max_workers: int,
    step_rate_samples_per_s: float | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    batches: int = 20,
    timeout_s: float = 20.0,
    candidates: Iterable[int] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    platform: str = sys.platform,
    until: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> WorkerChoice:
    """Choose ``num_workers`` for ``dataset`` by measuring real DataLoaders on this machine.

    Each candidate is measured once with ``measure_loader`` (``batches`` timed batches of
    ``batch_size``, ``timeout_s`` per batch) using the profile's ``pin_memory``,
    ``persistent_workers`` and ``prefetch_factor``; the search is ``search_workers``.
    ``step_rate_samples_per_s`` is the measured training step rate (samples/s); None means
    the loader alone is measured and the smallest count near the fastest wins.
    ``max_workers`` is the usable CPUs (quota-aware) per training process. On Windows
    (``platform`` "win32") only 0 is measured unless ``candidates`` is given.

    Process safety: the dataset must be picklable under spawn/forkserver (see the module
    docstring); the workers of each candidate are shut down before the next starts.
    """

    def measure(num_workers: int) -> LoaderTrial:
        return measure_loader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            batches=batches,
            timeout_s=timeout_s,
            collate_fn=collate_fn,
        )

    return search_workers(
        measure,
        max_workers=max_workers,
        step_rate_samples_per_s=step_rate_samples_per_s,
        candidates=candidates,
        windows=platform == "win32",
        until=until,
        clock=clock,
    )
