"""The workers phase of a probe run: which DataLoader worker counts to measure, when not to
measure them (the user set them, Windows, no dataset, no time left), and when the loader alone
is not enough and training must be fed by it to choose (``probe.fed``).

1. **The loader alone** (``probe.workers.search_workers``), at counts up to the CPUs of one
   training process (the profile's topology: the quota detection read, shared by the processes
   on the node; never more than this process's affinity allows), on a CPU-only machine too:
   it is quick, and where a count keeps ahead of the training step it decides.
2. **Loading and training together** (``probe.fed.choose_fed``) where the loader alone cannot
   decide: no count keeps ahead of the step (loading limits training), or the step's rate is
   unknown, or on a CPU wherever workers would be used, since there they take cores from the
   training step and a loader measured alone overstates what training gets, and on a CPU of
   more than one core, where the step's threads are fed too (``probe.fed_threads``). The
   worker count, on a CPU the threads, and, where loading limits training, the batch come
   from those passes; where none chose, ``probe.unfed`` says why, the count kept, and, on a
   CPU whose threads were not measured for want of time, a warning.
3. **No dataset** (objects in hand with an example batch): no worker count to measure; on a
   CPU of more than one core whose rules keep 0 workers, the threads are measured on the
   workload's own batches instead (``probe.own_threads``, ``own_threads_from``).

The time: the phase runs last and has what the earlier phases left. ``kept_seconds`` is what
they keep for it (``workers_seconds`` with a dataset): 10% of the budget, at most 20 s, on an
accelerator, where the loader alone usually decides; 20%, at most 40 s, on a CPU, where the
passes fed by the DataLoader take a few seconds each (a dataset of 4 ms a sample on 2 cores: 3
worker counts and 2 batch sizes, about 20 s) and the step's own points matter less once
loading limits training; without a dataset, 15%, at most 20 s, where its threads are measured
(a pass of 1.5 s or more each: torch's pool, its halvings and a second round).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from torch_autotune.evidence import (
    WORKERS_NO_DATASET,
    WORKERS_OUT_OF_TIME,
    FedRecord,
    FedWhy,
    SearchTrialRecord,
    ThroughputRecord,
)
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.fed import PASS_S, FedChoice, choose_fed, fed_order
from torch_autotune.probe.fed_passes import fed_records, threads_text
from torch_autotune.probe.fed_threads import MeasuredThreads
from torch_autotune.probe.own_threads import own_batches, own_threads_from
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import round_down
from torch_autotune.probe.unfed import short_pass, threads_warning, unfed_count, why_not
from torch_autotune.probe.workers import WorkerChoice, keeps_ahead, search_workers
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import LoaderRecord, Profile

WORKERS_SHARE = 0.1  # of the budget, at most WORKERS_MAX_S, kept for the DataLoader measurement
WORKERS_MAX_S = 20.0
CPU_WORKERS_SHARE = 0.2  # on a CPU, where training fed by the loader is measured too
CPU_WORKERS_MAX_S = 40.0
OWN_THREADS_SHARE = 0.15  # on a CPU without a dataset: the threads on its own batches alone
OWN_THREADS_MAX_S = 20.0
LOADER_BATCH_CAP = 64  # loader samples/s barely depend on the batch; large ones take long
MAIN_PROCESS_BATCH_CAP = 16  # without workers a batch is its samples and a collate, no IPC;
# a slow dataset loads far slower there (torch's threads: 300 ms a sample on a busy 2-CPU VM)
LOADER_BATCHES = 8  # timed batches of the loader alone, per count ...
LOADER_SECONDS = 3.0  # ... cut short after this long (a slow dataset in large batches)

ThreadsFor = Callable[[int], "int | None"]
"""``threads_for(num_workers)``: torch's CPU threads the profile sets beside that many
workers (rules G6; None: the process's own)."""


def workers_seconds(device: str, total_s: float) -> float:
    """Seconds the earlier phases keep for the workers phase where it measures the DataLoader
    (module docstring)."""
    if device == "cpu":
        return min(CPU_WORKERS_MAX_S, CPU_WORKERS_SHARE * total_s)
    return min(WORKERS_MAX_S, WORKERS_SHARE * total_s)


def kept_seconds(profile: Profile, workload: Workload, total_s: float) -> float:
    """Seconds the earlier phases keep for this run's workers phase: ``workers_seconds`` where
    it measures the DataLoader; without a dataset, the share of the threads on its own batches
    where they are measured (``own_threads_from``); none where it measures nothing."""
    if workload.dataset is None:
        own = own_threads_from(profile, workload, _default_threads(profile)) is not None
        return min(OWN_THREADS_MAX_S, OWN_THREADS_SHARE * total_s) if own else 0.0
    if profile.provenance.preferences.num_workers is not None:
        return 0.0
    return workers_seconds(profile.device, total_s)


def halvings(batch_size: int, multiple: int, floor: int, count: int = 3) -> tuple[int, ...]:
    """Up to ``count`` halvings of ``batch_size``, rounded down to ``multiple``, none below
    ``floor`` (the smallest batch the model trains at): the smaller sizes fed where loading
    limits training."""
    sizes: list[int] = []
    size = batch_size
    for _ in range(count):
        size = round_down(size // 2, multiple)
        if size < max(floor, 1) or size in sizes:
            break
        sizes.append(size)
    return tuple(sizes)


def _max_workers(profile: Profile) -> int:
    """Worker counts worth measuring: the CPUs of one training process (``Profile.topology``:
    the usable CPUs, quota-aware, shared by the processes on the node): all of them on the
    CPU in one process, where the passes fed by the loader measure what the workers take
    from the training step (G6), and one process's share where several train (F1).

    Never more CPUs than this process may run on, shared the same way: the workers are
    measured here, also when the profile describes a recorded machine with more of them (a
    test's snapshot, a machine you are not on), and torch warns about more workers than CPUs.
    """
    topology = profile.topology
    here = _process_cpus()
    if here is None:
        return topology.cpus_per_process
    return max(1, min(topology.cpus_per_process, here // topology.processes_per_node))


def _process_cpus() -> int | None:
    """The CPUs this process may run on (its affinity; all of them where there is none). A
    container's CPU quota comes with the snapshot: detection reads it (``cpus_usable``)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count()


@dataclass(frozen=True)
class WorkersOutcome:
    """What the phase decided: the worker count (None: not measured, the rules decide), the
    loader alone and the fed passes as measured, why, and the batch where the fed passes
    chose another than the step's (None: the step's stays) with why."""

    num_workers: int | None
    loader: tuple[LoaderRecord, ...] = ()
    reason: str | None = None
    fed: tuple[FedRecord, ...] = ()
    batch_size: int | None = None
    batch_reason: str | None = None
    threads: MeasuredThreads | None = None  # where fewer CPU threads than the rules' were fed
    warning: str | None = None  # what the phase was to measure and could not, for time
    batch_why: FedWhy | None = None  # why the passes chose the batch (``BatchChoice.fed_why``)


def step_rates(
    points: Sequence[ThroughputRecord], trials: Sequence[SearchTrialRecord], variant: str
) -> dict[int, float]:
    """The training step's own samples/s by batch, ``variant``'s: each throughput point's;
    where a size has none (the budget ran no point there), its fastest steady step in the
    search or the confirmation, one step each, which is better than knowing nothing: the
    fed passes compare with it, and predict their time from it."""
    rates = {
        t.batch_size: t.batch_size / t.step_s
        for t in sorted(trials, key=lambda t: -(t.step_s or 0.0))  # the fastest step last
        if t.variant == variant and t.fits and t.step_s
    }
    rates.update({p.batch_size: p.samples_per_s for p in points if p.variant == variant})
    return rates


def measure_workers(
    *,
    workload: Workload,
    profile: Profile,
    runner: Trials,
    batch_size: int,
    step_rates: Mapping[int, float],
    budget: Budget,
    progress: Progress,
    smaller: tuple[int, ...] = (),
    threads_for: ThreadsFor | None = None,
    larger: tuple[int, ...] = (),
) -> WorkersOutcome:
    """Long by design: the module docstring's steps in order, each an early return where it
    decides. The worker count (and, where loading limits training or fewer threads are chosen,
    the batch among ``batch_size``, ``smaller`` and ``larger``); ``runner`` measures."""
    if workload.dataset is None:
        return _own_batches(
            runner,
            profile,
            (batch_size, *smaller),
            larger,
            step_rates=step_rates,
            budget=budget,
            progress=progress,
            workload=workload,
        )
    if profile.provenance.preferences.num_workers is not None:
        return WorkersOutcome(None, reason="set by the user: not measured")
    if profile.provenance.snapshot.host.os_name == "windows":
        return WorkersOutcome(
            None, reason="Windows keeps num_workers=0 (--workers N overrides it); not measured"
        )
    if budget.left() <= 0:
        return WorkersOutcome(None, reason=WORKERS_OUT_OF_TIME)
    progress("workers", "DataLoader worker counts")
    most = _max_workers(profile)
    step_rate = step_rates.get(batch_size)
    choice = _alone(runner, batch_size, most, step_rate, budget)
    records, alone = _loader_said(choice, batch_size)
    default_threads = _default_threads(profile)
    if not _needs_feeding(choice, step_rate, profile.device, default_threads):
        return WorkersOutcome(choice.num_workers, records, alone)
    rates = {t.num_workers: t.samples_per_s for t in choice.trials if t.samples_per_s}
    failed = {t.num_workers for t in choice.trials if not t.ok}
    progress("workers", "training fed by the DataLoader")
    counts = [n for n in fed_order(most, rates) if n not in failed]
    fed = choose_fed(
        lambda b, n, t: runner.fed(b, n, t, seconds=PASS_S),
        sizes=(batch_size, *smaller),
        counts=counts,
        loader_rates=rates,
        step_rates=step_rates,
        threads_for=threads_for or (lambda _count: None),
        until=budget.deadline,
        clock=budget.clock,
        default_threads=default_threads,
        larger=larger,
    )
    alone += _other_threads(fed, threads_for or (lambda _count: None), default_threads)
    if fed.num_workers is not None:
        return _outcome(choice, records, alone, fed, batch_size=batch_size, fallback=None)
    # no pass chose: none fit in the time, or every one failed
    loader = rates.get(counts[0]) if counts else None
    short = short_pass(budget, (batch_size, *smaller)[-1], counts[:1] or [0], loader, step_rates)
    why = why_not(fed, short)
    fallback = unfed_count(choice, rates, most, step_rate, profile.device, why=why)
    outcome = _outcome(choice, records, alone, fed, batch_size=batch_size, fallback=fallback)
    return replace(outcome, warning=threads_warning(fed, default_threads, short))


def _loader_said(choice: WorkerChoice, batch_size: int) -> tuple[tuple[LoaderRecord, ...], str]:
    """The loader alone's records and its sentence, with the batches it loaded in."""
    records = tuple(
        LoaderRecord(num_workers=t.num_workers, samples_per_s=t.samples_per_s, error=t.error)
        for t in choice.trials
    )
    alone = choice.reason
    if min(batch_size, MAIN_PROCESS_BATCH_CAP) < batch_size:
        sizes = f"{min(batch_size, LOADER_BATCH_CAP)}, {MAIN_PROCESS_BATCH_CAP} without workers"
        alone += f" (loaded in batches of {sizes}: samples/s hardly depend on the batch)"
    return records, alone


def _other_threads(fed: FedChoice, threads_for: ThreadsFor, default_threads: int | None) -> str:
    """What the loader alone's sentence adds where the chosen pass trains at fewer threads than
    the throughput points ran at (torch's pool): the step's rate it compares with is theirs
    (the mlp on 2 busy cores: 193 samples/s at 2 threads, 2,468 fed at 1)."""
    if fed.num_workers is None or default_threads is None:
        return ""
    threads = fed.threads.threads if fed.threads is not None else threads_for(fed.num_workers)
    if threads is None or threads >= default_threads:
        return ""
    return (
        f" (the training step's rate there is its throughput points', timed at torch's default "
        f"{default_threads} threads; the profile trains at {threads_text(threads)})"
    )


def out_of_time_warning(budget: Budget, share_s: float) -> str:
    """The warning of a workers phase that had no time left (``WORKERS_OUT_OF_TIME``): the
    earlier phases ran past the ``share_s`` seconds kept for it (recorded on ``budget``)."""
    kept = "kept for it by the earlier phases"
    skip = budget.skip("their measurement", share_s, kept_s=0.0, warned=True, basis=kept)
    return (
        f"the DataLoader's workers were not measured: {skip.words()} did not fit, so the rules"
        " chose the count; more time (--budget) measures them"
    )


def _alone(
    runner: Trials, batch_size: int, most: int, step_rate: float | None, budget: Budget
) -> WorkerChoice:
    """The loader alone at counts up to ``most`` (``search_workers``)."""
    loader_batch = min(batch_size, LOADER_BATCH_CAP)
    return search_workers(
        lambda count: runner.load(
            count,
            loader_batch if count else min(loader_batch, MAIN_PROCESS_BATCH_CAP),
            batches=LOADER_BATCHES,
            timeout_s=30.0,
            seconds=LOADER_SECONDS,
        ),
        max_workers=most,
        step_rate_samples_per_s=step_rate,
        until=budget.deadline,
        clock=budget.clock,
    )


def _needs_feeding(
    choice: WorkerChoice, step_rate: float | None, device: str, default_threads: int | None
) -> bool:
    """Whether the loader alone cannot decide: no count keeps ahead of a known step rate
    (``keeps_ahead``: 0 workers only where loading in series costs at most 2%), or on a CPU
    the chosen count uses workers (they take cores from the step), or the step's threads
    are to be measured (``default_threads``: a CPU with more than one)."""
    chosen = next(t for t in choice.trials if t.num_workers == choice.num_workers and t.ok)
    rate = chosen.samples_per_s or 0.0
    ahead = step_rate is not None and keeps_ahead(choice.num_workers, rate, step_rate)
    cpu = device == "cpu" and (choice.num_workers > 0 or default_threads is not None)
    return not ahead or cpu


def _own_batches(
    runner: Trials,
    profile: Profile,
    sizes: tuple[int, ...],
    larger: tuple[int, ...],
    *,
    step_rates: Mapping[int, float],
    budget: Budget,
    progress: Progress,
    workload: Workload,
) -> WorkersOutcome:
    """No dataset: no worker count to measure; where ``own_threads_from`` says so, the threads
    on the workload's own batches (``probe.own_threads``) at the first of ``sizes`` (the
    points' batch), and, where fewer threads are chosen, the batch among ``sizes`` and
    ``larger`` at them."""
    default_threads = own_threads_from(profile, workload, _default_threads(profile))
    if default_threads is None:
        return WorkersOutcome(None, reason=WORKERS_NO_DATASET)
    own = own_batches(
        lambda b, n, t: runner.fed(b, n, t, seconds=PASS_S),
        sizes,
        default_threads=default_threads,
        rules_threads=profile.settings.cpu_threads,  # beside the rules' 0 workers
        step_rates=step_rates,
        budget=budget,
        progress=progress,
        larger=larger,
    )
    passes = fed_records(own.trials, dataloader=False)
    moved = own.batch_size if own.batch_size != sizes[0] else None
    why: FedWhy | None = "fewer threads" if own.batch_reason is not None else None
    outcome = WorkersOutcome(None, (), WORKERS_NO_DATASET, passes, moved, own.batch_reason)
    return replace(outcome, threads=own.threads, warning=own.warning, batch_why=why)


def _default_threads(profile: Profile) -> int | None:
    """On a CPU, the threads of torch's pool, where the passes fed by the DataLoader try fewer
    (``probe.fed_threads``): the process's own where ``tune`` read it (the snapshot's
    ``torch_num_threads``: OMP_NUM_THREADS or torch.set_num_threads may have changed it),
    else one per physical core (G1), no more than this process may run on; None elsewhere
    (the accelerator computes) and where there is one."""
    if profile.device != "cpu":
        return None
    snapshot = profile.provenance.snapshot
    threads = snapshot.software.torch_num_threads
    if threads is None:
        host, here = snapshot.host, _process_cpus()
        threads = host.cpu_cores_physical or host.cpu_cores_logical or 1
        threads = min(threads, here) if here is not None else threads
    return threads if threads > 1 else None


def _outcome(
    choice: WorkerChoice,
    records: tuple[LoaderRecord, ...],
    alone: str,
    fed: FedChoice,
    *,
    batch_size: int,
    fallback: tuple[int, str] | None,
) -> WorkersOutcome:
    """The phase's decision from the fed passes; without one, from the loader alone, or
    ``fallback`` (the count and why: ``_unfed``) where given."""
    passes = fed_records(fed.trials)
    if fed.num_workers is None:
        why = f"{alone} Training fed by the DataLoader was not measured: {fed.workers_reason}."
        if fallback is not None:
            why = f"{fallback[1]} The DataLoader alone, measured first: {why}"
            return WorkersOutcome(fallback[0], records, why, passes)
        return WorkersOutcome(choice.num_workers, records, why, passes)
    reason = f"{fed.workers_reason}. The DataLoader alone, measured first: {alone}"
    batch = fed.batch_size if fed.batch_size != batch_size else None
    outcome = WorkersOutcome(fed.num_workers, records, reason, passes, batch, fed.batch_reason)
    return replace(outcome, threads=fed.threads, batch_why=fed.batch_why)
