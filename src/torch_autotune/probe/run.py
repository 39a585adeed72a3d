"""The whole job: detect, apply the rules, probe, and build the measured profile.

``tune()`` is the Python entry point (``autotune`` with no subcommand calls it). Phases:

1. detection and a rules-only profile (what to probe with: device, AMP dtype, memory format,
   compile, optimizer options);
2. the largest batch that trains (``search``), capped by the dataset, the user's maximum and, on
   the CPU, a size past which CPU throughput no longer grows;
3. throughput at a few sizes up to it, and the fastest: the smallest size within 3% of the best;
4. the recommended size: the fastest, with the memory margin of catalog K2 when memory was the
   limit, rounded down to a multiple of 8 on Tensor-Core GPUs, then run once more;
5. DataLoader workers measured over the workload's dataset (Windows keeps 0);
6. the profile rebuilt with these measurements and their evidence.

A time budget bounds the whole run; phases that would overrun it are skipped and the profile
says so. Progress is reported through a callback, so the library never prints.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch_autotune.errors import ProbeError, WorkloadError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.search import (
    SearchResult,
    Trial,
    TrialOutcome,
    apply_margin,
    confirm,
    find_max_batch_size,
    round_down,
)
from torch_autotune.probe.trials import (
    StepSettings,
    TrialRunner,
    device_memory_limit,
    preserved,
)
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import (
    Evidence,
    LoaderRecord,
    Mode,
    Preferences,
    Profile,
    SearchTrialRecord,
    ThroughputRecord,
)
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.engine import build_profile

DEFAULT_BUDGET_S = 120.0
CPU_CAP = 512  # on the CPU memory rarely limits; throughput flattens long before this
FASTEST_WITHIN = 0.03  # "the smallest size within a few percent of the best"

Progress = Callable[[str, str], None]  # (phase, what is being tried)


class _OutOfTime(Exception):
    """The budget ran out before the next trial."""


@dataclass
class _Clocked:
    """A trial runner that records every outcome and never starts a trial it cannot afford.

    A trial's cost is predicted from the seconds per sample of the trials so far (the step
    time grows with the batch), so the run ends inside its budget instead of overrunning it
    by one enormous trial.
    """

    runner: TrialRunner
    deadline: float
    clock: Callable[[], float]
    progress: Progress
    phase: str
    trials: list[Trial]
    seconds_per_sample: float | None = None
    ram_budget_bytes: int | None = None  # CPU: never start a trial predicted to exceed it

    def predicted_seconds(self, batch_size: int) -> float:
        if self.seconds_per_sample is None:
            return 0.0
        return 1.5 * self.seconds_per_sample * batch_size * self.runner.settings.steps

    def affordable(self, batch_size: int) -> bool:
        return self.clock() + self.predicted_seconds(batch_size) <= self.deadline

    def learn(self, batch_size: int, seconds: float | None) -> None:
        timed_steps = self.runner.settings.steps - 1
        if seconds and timed_steps > 0:
            rate = seconds / (batch_size * timed_steps)
            self.seconds_per_sample = max(rate, self.seconds_per_sample or 0.0)

    def predicted_peak(self, batch_size: int) -> int | None:
        """Peak memory at ``batch_size`` by the secant through the two largest readings."""
        points = sorted(
            (t.batch_size, t.peak_memory_bytes)
            for t in self.trials
            if t.fits and t.peak_memory_bytes is not None
        )
        if len(points) < 2:
            return None
        (b1, m1), (b2, m2) = points[-2], points[-1]
        per_sample = max(0.0, (m2 - m1) / (b2 - b1))
        return int(m2 + per_sample * (batch_size - b2))

    def __call__(self, batch_size: int) -> TrialOutcome:
        if self.clock() > self.deadline:
            raise _OutOfTime
        predicted = self.predicted_peak(batch_size)
        if self.ram_budget_bytes is not None and predicted and predicted > self.ram_budget_bytes:
            # Running out of host RAM does not raise: the kernel kills the process. A size
            # predicted to exceed the budget is treated as too big, and not run.
            self.trials.append(Trial(batch_size, False, None, None, "ram-guard (not run)"))
            return TrialOutcome(False)
        if not self.affordable(batch_size):
            # Too slow for the time left counts as too big: the search then settles on the
            # largest size that fits the budget instead of stopping at the last one it ran.
            self.trials.append(Trial(batch_size, False, None, None, "time-guard (not run)"))
            return TrialOutcome(False)
        self.progress(self.phase, f"batch {batch_size}")
        outcome = self.runner(batch_size)
        self.learn(batch_size, outcome.seconds)
        self.trials.append(
            Trial(batch_size, outcome.fits, outcome.peak_memory_bytes, outcome.seconds, self.phase)
        )
        return outcome


def _search(clocked: _Clocked, cap: int, limit: int | None) -> tuple[int | None, str, list[Trial]]:
    """The largest size that ran, what limited it, and every trial (guarded ones included).

    The limit is "memory" or "cap" as the search found it, "budget" when the next size up was
    too slow for the time left, "host RAM" when it was predicted not to fit in RAM.
    """
    try:
        result: SearchResult = find_max_batch_size(clocked, cap=cap, memory_limit_bytes=limit)
        largest, limited_by = result.max_batch_size, result.limited_by
        # Both lists have one entry per trial, in order: keep the search's reason for each
        # size (start, model, predict, ...) unless the size was guarded and not run.
        clocked.trials[:] = [
            mine if "not run" in mine.step else replace(mine, step=theirs.step)
            for mine, theirs in zip(clocked.trials, result.trials, strict=True)
        ]
    except _OutOfTime:
        ran = [t.batch_size for t in clocked.trials if t.fits]
        largest, limited_by = (max(ran) if ran else None), "budget"
    above = [t for t in clocked.trials if not t.fits and t.batch_size > (largest or 0)]
    if above and limited_by == "memory":
        bound = min(above, key=lambda t: t.batch_size).step
        limited_by = {"time-guard (not run)": "budget", "ram-guard (not run)": "host RAM"}.get(
            bound, limited_by
        )
    return largest, limited_by, list(clocked.trials)


def _throughput(
    clocked: _Clocked, max_batch: int, multiple: int, repeats: int
) -> list[ThroughputRecord]:
    """Samples per second at the largest size and up to three halvings of it, cheapest first,
    each measured ``repeats`` times while the budget allows."""
    sizes = sorted({max(1, round_down(max_batch >> shift, multiple)) for shift in range(4)})
    records: list[ThroughputRecord] = []
    for size in sizes:
        samples: list[float] = []
        for _ in range(repeats):
            if not clocked.affordable(size):
                break
            clocked.progress("throughput", f"batch {size}")
            seconds = clocked.runner.steps(size)
            clocked.learn(size, seconds)
            if seconds > 0:
                samples.append(size * (clocked.runner.settings.steps - 1) / seconds)
        if samples:
            median = statistics.median(samples)
            spread = (max(samples) - min(samples)) / median if median else 0.0
            records.append(
                ThroughputRecord(batch_size=size, samples_per_s=median, relative_spread=spread)
            )
    return records


def _ram_budget(machine: HardwareSnapshot) -> int | None:
    """Host RAM a CPU probe may fill: 70% of what is available (or of the container limit)."""
    host = machine.host
    known = [v for v in (host.memory_available_bytes, host.memory_limit_bytes) if v]
    return int(0.7 * min(known)) if known else None


def _fastest(records: list[ThroughputRecord], max_batch: int) -> int:
    if not records:
        return max_batch
    best = max(r.samples_per_s for r in records)
    return min(r.batch_size for r in records if r.samples_per_s >= best * (1 - FASTEST_WITHIN))


def _multiple(profile: Profile) -> int:
    """Catalog K4: multiples of 8 on NVIDIA Tensor-Core GPUs with AMP or TF32."""
    snapshot = profile.provenance.snapshot
    gpus = [a for a in snapshot.accelerators if a.backend.value == "cuda"]
    uses_tc = profile.settings.precision.autocast or profile.settings.matmul.tf32
    tensor_cores = bool(gpus) and all(a.tensor_cores for a in gpus)
    return 8 if profile.settings.device == "cuda" and tensor_cores and uses_tc else 1


def _max_workers(profile: Profile) -> int:
    """Worker counts worth measuring: the usable CPUs (quota-aware) per training process on a
    GPU, half of them on the CPU, where workers compete with the training threads (G6)."""
    snapshot = profile.provenance.snapshot
    usable = snapshot.host.cpus_usable
    if profile.device == "cpu":
        return max(1, usable // 2)
    gpus = [a for a in snapshot.accelerators if a.backend.value in ("cuda", "rocm", "mps")]
    return max(1, usable // max(1, len(gpus)))


def _workers(
    *,
    workload: Workload,
    profile: Profile,
    batch_size: int,
    step_rate: float | None,
    deadline: float,
    clock: Callable[[], float],
    progress: Progress,
) -> tuple[int | None, tuple[LoaderRecord, ...], str | None]:
    snapshot = profile.provenance.snapshot
    if workload.dataset is None:
        return None, (), None
    if profile.provenance.preferences.num_workers is not None:
        return None, (), "set by the user: not measured"
    if snapshot.host.os_name == "windows":
        return None, (), "Windows keeps num_workers=0 (--workers N overrides it); not measured"
    if clock() > deadline:
        return None, (), "not measured: the time budget ran out"
    from torch_autotune.probe.loader import choose_workers

    progress("workers", "DataLoader worker counts")
    dl = profile.settings.dataloader
    choice = choose_workers(
        workload.dataset,
        batch_size=batch_size,
        max_workers=_max_workers(profile),
        step_rate_samples_per_s=step_rate,
        pin_memory=dl.pin_memory,
        persistent_workers=False,
        prefetch_factor=None,
        batches=8,
        timeout_s=30.0,
    )
    records = tuple(
        LoaderRecord(num_workers=t.num_workers, samples_per_s=t.samples_per_s, error=t.error)
        for t in choice.trials
    )
    return choice.num_workers, records, choice.reason


def tune(
    workload: str | Workload | None = None,
    *,
    snapshot: HardwareSnapshot | None = None,
    mode: Mode | str = Mode.SPEED,
    budget_s: float = DEFAULT_BUDGET_S,
    max_batch_size: int | None = None,
    target_global_batch: int | None = None,
    fixed_shapes: bool = True,
    num_workers: int | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Profile:
    """Probe this machine with a workload and return the measured profile (not saved).

    ``workload`` is a built-in name ("conv", "transformer", "mlp"), a ``Workload``, or
    "package.module:factory". The user's model, optimizer state, RNG and torch's global flags
    are as before when this returns or raises.
    """
    import importlib.util

    from torch_autotune.detect import detect

    if importlib.util.find_spec("torch") is None:
        raise ProbeError(
            "torch is not installed, so nothing can be probed; install the build for this "
            "machine (https://pytorch.org/get-started/locally/) and run autotune again"
        )
    report = progress or (lambda _phase, _what: None)
    started = clock()
    chosen = resolve_workload(workload)
    report("detect", "this machine")
    machine = snapshot or detect()
    preferences = Preferences(
        mode=Mode(mode),
        model_kind=chosen.kind,
        fixed_shapes=fixed_shapes,
        optimizer="adamw",
        num_workers=num_workers,
    )
    rules_only = build_profile(machine, preferences=preferences)
    settings = StepSettings.from_profile(rules_only)
    runner = TrialRunner(chosen, settings, clock=clock)
    # The search may use half the budget, throughput measurements the next quarter, and the
    # DataLoader the rest.
    clocked = _Clocked(runner, started + 0.5 * budget_s, clock, report, "search", [])
    if settings.device == "cpu":
        clocked.ram_budget_bytes = _ram_budget(machine)
    caps = [CPU_CAP if settings.device == "cpu" else 1 << 16]
    caps += [c for c in (max_batch_size, chosen.max_batch_size) if c is not None]
    with preserved():
        limit = device_memory_limit(settings.device) or clocked.ram_budget_bytes
        largest, limited_by, trials = _search(clocked, min(caps), limit)
        if largest is None and limited_by == "budget":
            raise ProbeError(
                f"the time budget ({budget_s:g} s) ran out before a single training step of "
                f"the {chosen.name} workload finished; give it more with --budget"
            )
        if largest is None:
            raise WorkloadError(
                f"the {chosen.name} workload does not train even at batch size 1 on "
                f"{settings.device}: it runs out of memory; use a smaller model or a larger "
                "device"
            )
        multiple = _multiple(rules_only)
        clocked.phase, clocked.deadline = "throughput", started + 0.75 * budget_s
        records = _throughput(clocked, largest, multiple, repeats=3)
        fastest = _fastest(records, largest)
        candidate = fastest
        if limited_by == "memory":
            margin = 0.1 if fixed_shapes else 0.2  # catalog K2
            candidate = min(candidate, apply_margin(largest, margin))
        candidate = max(1, round_down(candidate, multiple))
        report("confirm", f"batch {candidate}")
        confirmed = confirm(runner, candidate, multiple=multiple)
        trials += confirmed.trials
        if confirmed.batch_size is None:
            raise ProbeError(
                f"batch {candidate} ran during the search but not when run again; memory is "
                "shared with another process? Re-run autotune when the GPU is free"
            )
        batch = confirmed.batch_size
        step_rate = next((r.samples_per_s for r in records if r.batch_size == batch), None)
        workers, loader, workers_reason = _workers(
            workload=chosen,
            profile=rules_only,
            batch_size=batch,
            step_rate=step_rate,
            deadline=started + 0.95 * budget_s,
            clock=clock,
            progress=report,
        )
    accumulation = None
    if target_global_batch is not None:
        processes = max(1, len(rules_only.provenance.snapshot.accelerators))
        accumulation = max(1, math.ceil(target_global_batch / (batch * processes)))
    evidence = Evidence(
        workload=chosen.name,
        device=settings.device,
        max_batch_size=largest,
        fastest_batch_size=fastest,
        batch_size=batch,
        limited_by=limited_by,
        search=tuple(_record(t) for t in trials),
        throughput=tuple(records),
        loader=loader,
        workers_reason=workers_reason,
        budget_s=budget_s,
        elapsed_s=round(max(0.0, clock() - started), 3),
        memory_limit_bytes=limit,
    )
    measurements = Measurements(
        batch_size=batch,
        num_workers=workers,
        grad_accum_steps=accumulation,
        workers_reason=workers_reason if workers is not None else None,
    )
    return build_profile(machine, measurements, preferences, evidence=evidence)


def _record(trial: Trial) -> SearchTrialRecord:
    return SearchTrialRecord(
        batch_size=trial.batch_size,
        fits=trial.fits,
        peak_memory_bytes=trial.peak_memory_bytes,
        seconds=None if trial.seconds is None else max(0.0, trial.seconds),
        step=trial.step,
    )
