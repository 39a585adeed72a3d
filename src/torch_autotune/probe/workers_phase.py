"""The workers phase of a probe run: which DataLoader worker counts to measure, and when not
to measure them (the user set them, Windows, no dataset, no time left)."""

from __future__ import annotations

import os

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.seam import Progress
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import LoaderRecord, Profile

WORKERS_SHARE = 0.1  # of the budget, at most WORKERS_MAX_S, kept for the DataLoader measurement
WORKERS_MAX_S = 20.0
LOADER_BATCH_CAP = 256  # loader samples/s barely depend on the batch; huge batches take long


def _max_workers(profile: Profile) -> int:
    """Worker counts worth measuring: the usable CPUs (quota-aware) per training process on a
    GPU, half of them on the CPU, where workers compete with the training threads (G6).

    Never more CPUs than this process may run on: the workers are measured here, also when the
    profile describes a recorded machine with more of them (a test's snapshot, a machine you are
    not on), and torch warns about more workers than CPUs.
    """
    snapshot = profile.provenance.snapshot
    usable = min(snapshot.host.cpus_usable, _process_cpus() or snapshot.host.cpus_usable)
    if profile.device == "cpu":
        return max(1, usable // 2)
    gpus = [a for a in snapshot.accelerators if a.backend.value in ("cuda", "rocm", "mps")]
    return max(1, usable // max(1, len(gpus)))


def _process_cpus() -> int | None:
    """The CPUs this process may run on (its affinity; all of them where there is none)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count()


def measure_workers(
    *,
    workload: Workload,
    profile: Profile,
    batch_size: int,
    step_rate: float | None,
    budget: Budget,
    progress: Progress,
) -> tuple[int | None, tuple[LoaderRecord, ...], str | None]:
    """The DataLoader worker count to use, what each count measured, and why (None, (), why:
    not measured, the rules decide)."""
    snapshot = profile.provenance.snapshot
    if workload.dataset is None:
        return None, (), None
    if profile.provenance.preferences.num_workers is not None:
        return None, (), "set by the user: not measured"
    if snapshot.host.os_name == "windows":
        return None, (), "Windows keeps num_workers=0 (--workers N overrides it); not measured"
    if budget.left() <= 0:
        return None, (), "not measured: the time budget ran out"
    from torch_autotune.probe.workers import choose_workers

    progress("workers", "DataLoader worker counts")
    dl = profile.settings.dataloader
    loader_batch = min(batch_size, LOADER_BATCH_CAP)
    choice = choose_workers(
        workload.dataset,
        batch_size=loader_batch,
        max_workers=_max_workers(profile),
        step_rate_samples_per_s=step_rate,
        pin_memory=dl.pin_memory,
        persistent_workers=False,
        prefetch_factor=None,
        batches=8,
        timeout_s=30.0,
        collate_fn=workload.collate_fn,
        until=budget.deadline,
        clock=budget.clock,
    )
    records = tuple(
        LoaderRecord(num_workers=t.num_workers, samples_per_s=t.samples_per_s, error=t.error)
        for t in choice.trials
    )
    reason = choice.reason
    if loader_batch < batch_size:
        reason += f" (loaded in batches of {loader_batch}: samples/s hardly depend on the batch)"
    return choice.num_workers, records, reason
