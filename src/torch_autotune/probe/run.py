"""The whole job: detect, apply the rules, probe, and build the measured profile.

``tune()`` is the Python entry point (``autotune`` with no subcommand calls it). Phases, all on
one ``Budget`` (one clock, one deadline; each phase has a share and cannot overrun the run):

1. detection and a rules-only profile (what to probe with: device, AMP dtype, memory format,
   compile, optimizer options);
2. **search**: the largest batch that trains, in eager mode with the profile's other settings
   and without the cuDNN autotuner (its warm-up, 6-9 s per new shape for ResNet-50 on an
   H100, would cost a minute over a search); capped by the dataset, the user's maximum and, on
   the CPU, a size past which CPU throughput no longer grows. A size is skipped for time only
   when the time model (``timemodel``) predicts that it, plus measuring it afterwards, takes
   longer than what is left of the whole budget;
3. **throughput**: steady samples/s at the top candidate sizes (the largest with the memory
   margin of catalog K2, rounded to a multiple of 8 on Tensor-Core GPUs, and halvings of it),
   with the cuDNN autotuner as the profile sets it; a point runs until its timed blocks agree
   within 5% or its share of the time is spent, and a point that stays noisy is not used to
   pick the fastest batch;
4. **compile** (speed mode, where the rules allow torch.compile): one compiled module, the
   batch dimension marked dynamic so it compiles once, measured at the fastest eager size;
   compile stays in the profile only when it is faster beyond noise there, and its one-off
   cost is reported with the training time after which it pays off. When the predicted
   compile time does not fit, compile is decided by the rules and marked as not measured;
5. **confirm**: the recommended size runs once more with the final settings;
6. **workers**: DataLoader worker counts over the workload's dataset (Windows keeps 0);
7. the profile rebuilt with these measurements and their evidence.

Progress is reported through a callback, so the library never prints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from torch_autotune.errors import ProbeError, WorkloadError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.search import (
    TrialOutcome,
    apply_margin,
    confirm,
    find_max_batch_size,
    round_down,
)
from torch_autotune.probe.timemodel import StepTiming, TimeModel
from torch_autotune.probe.trials import (
    MAX_SPREAD,
    MIN_BLOCKS,
    PointOutcome,
    StepSettings,
    TrialRunner,
    preserved,
)
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import (
    CompileRecord,
    Evidence,
    LoaderRecord,
    Mode,
    PhaseRecord,
    Preferences,
    Profile,
    SearchTrialRecord,
    ThroughputRecord,
)
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.engine import build_profile

DEFAULT_BUDGET_S = 120.0
"""The budget on the CPU, and on a GPU where torch.compile is not measured."""
DEFAULT_COMPILE_BUDGET_S = 180.0
"""The budget where torch.compile is measured: a compile alone takes 30-80 s on an H100."""
CPU_CAP = 512  # on the CPU memory rarely limits; throughput flattens long before this
GPU_CAP = 1 << 16
FASTEST_WITHIN = 0.03  # "the smallest size within a few percent of the best"
THROUGHPUT_POINTS = 3  # the top candidate and two halvings of it
EXTRA_HALVINGS = 3  # further halvings while the smallest size is faster beyond noise
COMPILE_S_PER_MODULE = 0.6  # H100, 16 CPUs: ResNet-50 (137 leaf modules) 80 s, GPT-2 (76) 30 s
COMPILE_MIN_S = 15.0
COMPILE_NOISE = 0.03  # compile must be at least this much faster (and beyond the points' spread)
WORKERS_SHARE = 0.1  # of the budget, at most WORKERS_MAX_S, kept for the DataLoader measurement
WORKERS_MAX_S = 20.0
LOADER_BATCH_CAP = 256  # loader samples/s barely depend on the batch; huge batches take long
EXTRAPOLATE = 4  # a time prediction past 4x the largest measured size is checked first
CLOSE_ENOUGH = 1.25  # a time-limited search stops within 25% of the size refused for time
TIME_GUARD = "time-guard (not run)"

Progress = Callable[[str, str], None]
"""(phase, what is being tried); first ("budget", "120 s") once the budget is chosen."""


class Trials(Protocol):
    """The seam between the orchestration here and real training (``TrialRunner``)."""

    settings: StepSettings

    def __call__(self, batch_size: int) -> TrialOutcome: ...

    def point(self, batch_size: int, *, until: float) -> PointOutcome: ...

    def compiled(self, mode: str) -> Trials: ...

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None: ...

    def leaf_modules(self) -> int: ...

    def memory_limit(self) -> int | None: ...


class _OutOfTime(Exception):
    """The budget ran out before the next trial."""


@dataclass
class _Search:
    """The ``fits`` the search calls: guarded by RAM and by time, every trial recorded.

    A trial is not started when the time model predicts that it, plus one throughput point
    at that size afterwards, takes longer than what is left of the whole budget (less the
    DataLoader's share); it then counts as too big, so the search settles on the largest size
    that fits the time instead of stopping.
    """

    runner: Trials
    budget: Budget
    progress: Progress
    reserve_s: float
    model: TimeModel = field(default_factory=TimeModel)
    records: list[SearchTrialRecord] = field(default_factory=list)
    ram_budget_bytes: int | None = None  # CPU: never start a trial predicted to exceed it
    refused: str | None = None  # why the smallest size refused for time was refused
    calls: list[int | None] = field(default_factory=list)  # per search call: its record

    def predicted_peak(self, batch_size: int) -> int | None:
        """Peak memory at ``batch_size`` by the secant through the two largest readings."""
        points = sorted(
            (t.batch_size, t.peak_memory_bytes)
            for t in self.records
            if t.fits and t.peak_memory_bytes is not None
        )
        if len(points) < 2:
            return None
        (b1, m1), (b2, m2) = points[-2], points[-1]
        per_sample = max(0.0, (m2 - m1) / (b2 - b1))
        return int(m2 + per_sample * (batch_size - b2))

    def needed_s(self, batch_size: int) -> tuple[float, float] | None:
        """(the trial, the trial plus one throughput point after it), predicted; None: unknown."""
        steps = self.runner.settings.steps
        trial = self.model.predict(batch_size, steps)
        later = self.model.predict(batch_size, 2 + MIN_BLOCKS)
        if trial is None or later is None:
            return None
        return trial.seconds, trial.seconds + later.seconds

    def __call__(self, batch_size: int) -> TrialOutcome:
        count = len(self.records)
        outcome = self._decide(batch_size)
        self.calls.append(len(self.records) - 1 if len(self.records) > count else None)
        return outcome

    def _decide(self, batch_size: int) -> TrialOutcome:
        if self.budget.left_in_run() <= 0:
            raise _OutOfTime
        ran = [r.batch_size for r in self.records if r.fits]
        if ran and batch_size <= max(ran):  # monotone: known to fit, not run again
            return TrialOutcome(True)
        predicted = self.predicted_peak(batch_size)
        if self.ram_budget_bytes is not None and predicted and predicted > self.ram_budget_bytes:
            # Running out of host RAM does not raise: the kernel kills the process. A size
            # predicted to exceed the budget is treated as too big, and not run.
            self.records.append(_refused(batch_size, "ram-guard (not run)"))
            return TrialOutcome(False)
        failed = [r.batch_size for r in self.records if not r.fits and r.seconds is not None]
        if failed and batch_size >= min(failed):  # monotone: it cannot fit either
            self.records.append(_refused(batch_size, f"above {min(failed)}, which failed"))
            return TrialOutcome(False)
        refusal = self._time_refusal(batch_size)
        if refusal is not None:
            self.records.append(refusal)
            return TrialOutcome(False)
        return self._run(batch_size, "search")

    def _time_refusal(self, batch_size: int) -> SearchTrialRecord | None:
        """A record refusing ``batch_size`` for time, or None when it may run.

        A prediction more than ``EXTRAPOLATE`` times past the largest measured size is not
        trusted to refuse: a size in between runs first (step "time model"), and the
        prediction is made again from it. Next to a size refused for time, a size within
        ``CLOSE_ENOUGH`` of the largest that ran is not worth its time: the limit is soft.
        """
        while True:
            left = self.budget.left_in_run() - self.reserve_s
            refused = [r.batch_size for r in self.records if r.step == TIME_GUARD]
            ran = [r.batch_size for r in self.records if r.fits]
            if (
                refused
                and ran
                and batch_size > max(ran)
                and min(refused) <= CLOSE_ENOUGH * max(ran)
            ):
                return _refused(batch_size, TIME_GUARD, left_s=left)
            needed = self.needed_s(batch_size)
            if needed is None or needed[1] <= left:
                return None
            largest = self.model.largest() or batch_size
            between = EXTRAPOLATE * largest
            if batch_size <= between or not self._affordable(between, left):
                self._note_refusal(batch_size, needed, left)
                return _refused(batch_size, TIME_GUARD, predicted_s=needed[0], left_s=left)
            if not self._run(between, "time model").fits:
                return _refused(batch_size, f"above {between}, which failed")

    def _affordable(self, batch_size: int, left: float) -> bool:
        needed = self.needed_s(batch_size)
        return needed is None or needed[1] <= left

    def _run(self, batch_size: int, step: str) -> TrialOutcome:
        needed = self.needed_s(batch_size)
        left = self.budget.left_in_run() - self.reserve_s
        self.progress("search", f"batch {batch_size}")
        outcome = self.runner(batch_size)
        if outcome.fits and outcome.step_s is not None:
            self.model.learn(StepTiming(batch_size, outcome.warmup_s or 0.0, outcome.step_s))
        self.records.append(
            SearchTrialRecord(
                batch_size=batch_size,
                fits=outcome.fits,
                peak_memory_bytes=outcome.peak_memory_bytes,
                seconds=_seconds(outcome.seconds if outcome.fits else 0.0),
                step=step,
                warmup_s=_seconds(outcome.warmup_s),
                step_s=_seconds(outcome.step_s),
                predicted_s=None if needed is None else round(needed[0], 3),
                left_s=round(max(0.0, left), 3),
            )
        )
        return outcome

    def _note_refusal(self, batch_size: int, needed: tuple[float, float], left: float) -> None:
        smallest = min(
            (r.batch_size for r in self.records if r.step == TIME_GUARD),
            default=batch_size,
        )
        if batch_size <= smallest:
            self.refused = (
                f"batch {batch_size} was predicted to take {needed[0]:.1f} s, and "
                f"{needed[1]:.1f} s with its throughput measurement, more than the "
                f"{max(0.0, left):.1f} s left"
            )


def _refused(
    batch_size: int, step: str, *, predicted_s: float | None = None, left_s: float | None = None
) -> SearchTrialRecord:
    return SearchTrialRecord(
        batch_size=batch_size,
        fits=False,
        peak_memory_bytes=None,
        seconds=None,
        step=step,
        predicted_s=None if predicted_s is None else round(predicted_s, 3),
        left_s=None if left_s is None else round(max(0.0, left_s), 3),
    )


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(max(0.0, value), 4)


# --- phase 2: the search ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    largest: int | None
    limited_by: str
    reason: str


def _search(guarded: _Search, cap: int, limit: int | None, cap_reason: str) -> _Found:
    """The largest size that ran, what limited it (with the numbers), every trial recorded."""
    try:
        result = find_max_batch_size(guarded, cap=cap, memory_limit_bytes=limit)
        largest, limited_by = result.max_batch_size, result.limited_by
        # Name each search trial by the search's reason for it (start, model, predict, ...);
        # trials the guard ran on its own ("time model") and sizes it did not run keep theirs.
        for index, trial in zip(guarded.calls, result.trials, strict=True):
            if index is not None and guarded.records[index].step == "search":
                record = guarded.records[index].model_copy(update={"step": trial.step})
                guarded.records[index] = record
        ran = [t.batch_size for t in guarded.records if t.fits]
        largest = max(ran, default=largest)  # a size the guard ran may exceed the search's
    except _OutOfTime:
        ran = [t.batch_size for t in guarded.records if t.fits]
        largest, limited_by = (max(ran) if ran else None), "budget"
    above = [t for t in guarded.records if not t.fits and t.batch_size > (largest or 0)]
    bound = min(above, key=lambda t: t.batch_size) if above else None
    if bound is not None and limited_by == "memory":
        limited_by = {TIME_GUARD: "time", "ram-guard (not run)": "host RAM"}.get(
            bound.step, "memory"
        )
    if limited_by == "time" and guarded.budget.spent:
        limited_by = "budget"
    reasons = {
        "memory": f"batch {bound.batch_size if bound else '?'} ran out of memory",
        "host RAM": (
            f"batch {bound.batch_size if bound else '?'} was predicted to need more than the "
            f"{_gib(guarded.ram_budget_bytes)} of host RAM the probe may fill"
        ),
        "time": guarded.refused or "the next size did not fit in the time left",
        "budget": (
            f"{guarded.budget.elapsed():.0f} s of the {guarded.budget.total_s:.0f} s budget "
            "were spent"
        ),
        "cap": cap_reason,
        "start": "batch 1 ran out of memory",
    }
    return _Found(largest, limited_by, reasons.get(limited_by, limited_by))


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


# --- phase 3 and 4: throughput and compile ---------------------------------------------------


def _candidates(largest: int, limited_by: str, multiple: int, fixed_shapes: bool) -> list[int]:
    """The sizes worth measuring, largest first: the largest (with the K2 margin when memory
    limited it), rounded to ``multiple`` (K4), and two halvings of it."""
    top = largest
    if limited_by in ("memory", "host RAM"):
        top = apply_margin(largest, 0.1 if fixed_shapes else 0.2)  # catalog K2
    top = max(1, round_down(top, multiple))
    sizes = {max(1, round_down(top >> shift, multiple)) for shift in range(THROUGHPUT_POINTS)}
    return sorted(sizes, reverse=True)


def _record(point: PointOutcome, *, compiled: bool = False) -> ThroughputRecord | None:
    if not point.fits or not point.samples_per_s or not math.isfinite(point.samples_per_s):
        return None
    return ThroughputRecord(
        batch_size=point.batch_size,
        samples_per_s=point.samples_per_s,
        relative_spread=point.relative_spread if point.relative_spread is not None else 0.0,
        steady=point.steady,
        compiled=compiled,
        warmup_s=_seconds(point.warmup_s),
        blocks=point.blocks,
        peak_memory_bytes=point.peak_memory_bytes,
    )


def _measure_points(
    runner: Trials,
    sizes: Sequence[int],
    budget: Budget,
    progress: Progress,
    model: TimeModel,
) -> list[ThroughputRecord | int]:
    """A point per size, largest first, sharing the phase's time evenly; an int: that size
    did not fit in memory. A size whose shortest point (warm-up and three steps, predicted)
    does not fit in what is left of the phase is skipped; a smaller one may still fit."""
    results: list[ThroughputRecord | int] = []
    costs = [_point_cost(model, size) for size in sizes]
    for i, size in enumerate(sizes):
        left = budget.left()
        share = left * costs[i] / sum(costs[i:]) if sum(costs[i:]) > 0 else left / len(sizes)
        shortest = model.predict(size, 3)
        need = shortest.seconds if shortest is not None else 0.0
        if need > left or left <= 0:
            continue
        progress("throughput", f"batch {size}")
        point = runner.point(size, until=budget.now() + max(share, need))
        record = _record(point)
        results.append(size if record is None else record)
    return results


def _confirmation(point: ThroughputRecord) -> SearchTrialRecord:
    """The steady point of the recommended size, as the run that confirms it."""
    return SearchTrialRecord(
        batch_size=point.batch_size,
        fits=True,
        peak_memory_bytes=point.peak_memory_bytes,
        seconds=None,
        step="confirm (its throughput point)",
        warmup_s=point.warmup_s,
    )


def _point_cost(model: TimeModel, size: int) -> float:
    """The predicted seconds of a steady point at ``size``: what its share is weighed by."""
    predicted = model.predict(size, 1 + MIN_BLOCKS)
    return predicted.seconds if predicted is not None else 0.0


def fastest(records: Sequence[ThroughputRecord]) -> ThroughputRecord | None:
    """The smallest steady point within ``FASTEST_WITHIN`` of the best steady rate."""
    steady = [r for r in records if r.steady]
    if not steady:
        return None
    best = max(r.samples_per_s for r in steady)
    near = [r for r in steady if r.samples_per_s >= best * (1 - FASTEST_WITHIN)]
    return min(near, key=lambda r: r.batch_size)


def compile_seconds(leaf_modules: int) -> float:
    """The compile time to expect before any was measured (H100 figures, module docstring)."""
    return max(COMPILE_MIN_S, COMPILE_S_PER_MODULE * leaf_modules)


def payoff_minutes(compile_s: float, eager: float, compiled: float) -> float | None:
    """Minutes of training after which compiling has paid for itself (None: it never does).

    Eager training makes ``eager * t`` samples in ``t`` seconds, compiled ``compiled * (t - C)``:
    they are equal at ``t = C * compiled / (compiled - eager)``.
    """
    if compiled <= eager:
        return None
    return compile_s * compiled / (compiled - eager) / 60


@dataclass
class _CompileOutcome:
    record: CompileRecord
    point: ThroughputRecord | None  # the compiled point compared, when it ran
    runner: Trials  # the compiled runner (its compiled code is reused to confirm)
    points: list[ThroughputRecord]  # every compiled point that ran


def _measure_compile(
    runner: Trials,
    *,
    mode: str,
    eager: ThroughputRecord,
    sizes: Sequence[int],
    budget: Budget,
    progress: Progress,
    predicted_s: float,
) -> _CompileOutcome:
    """Compiled throughput at the fastest eager size (a smaller candidate if it does not fit
    there), then at the larger candidates on the same compiled code (a few seconds each: the
    compiled model may gain more from a larger batch than eager did); the fastest compiled
    point is judged against the fastest eager point."""
    compiled = runner.compiled(mode)
    failed: list[int] = []
    paid: float | None = None
    points: list[ThroughputRecord] = []
    below = [s for s in sizes if s <= eager.batch_size]
    above = sorted(s for s in sizes if s > eager.batch_size)
    for size in below:
        progress("compile", f"batch {size}" + ("" if failed else " (compiling)"))
        point = compiled.point(size, until=budget.deadline)
        if paid is None:
            paid = point.warmup_s if point.warmup_s is not None else point.seconds
        measured = _record(point, compiled=True)
        if measured is not None:
            points.append(measured)
            break
        failed.append(size)
    for size in above if points else []:
        if budget.left() <= 0:
            break
        progress("compile", f"batch {size}")
        measured = _record(compiled.point(size, until=budget.deadline), compiled=True)
        if measured is None:
            failed.append(size)
            break  # a larger size cannot fit either
        points.append(measured)
    base = CompileRecord(
        mode=mode,
        measured=True,
        kept=False,
        reason="",
        predicted_s=round(predicted_s, 1),
        compile_s=None if paid is None else round(paid, 1),
    )
    best = fastest(points) or (points[0] if points else None)
    if best is None:
        why = (
            f"the compiled model ran out of memory at batch {', '.join(map(str, failed))}"
            if failed
            else "the time budget ran out before the compiled model finished a step"
        )
        return _CompileOutcome(
            base.model_copy(update={"reason": f"compile off: {why}"}), None, compiled, points
        )
    judged = _judge_compile(base, eager, best, paid or 0.0)
    return _CompileOutcome(judged, best, compiled, points)


def _judge_compile(
    base: CompileRecord, eager: ThroughputRecord, point: ThroughputRecord, paid: float
) -> CompileRecord:
    """Keep compile only when its steady point beats eager beyond noise, and say so."""
    speedup = point.samples_per_s / eager.samples_per_s
    noise = max(COMPILE_NOISE, point.relative_spread, eager.relative_spread)
    kept = point.steady and speedup > 1 + noise
    minutes = payoff_minutes(paid, eager.samples_per_s, point.samples_per_s)
    numbers = (
        f"{speedup:.2f}x ({point.samples_per_s:,.0f} samples/s compiled at batch "
        f"{point.batch_size} against {eager.samples_per_s:,.0f} eager at batch "
        f"{eager.batch_size}), {paid:.0f} s to compile"
    )
    if kept:
        reason = f"compile measured faster: {numbers}"
        if minutes is not None:
            reason += f"; it pays off after {_minutes(minutes)} of training"
    elif not point.steady:
        reason = f"compile off: the compiled point stayed noisy, so {numbers} is not trusted"
    else:
        reason = (
            f"compile off: measured {numbers}, not faster beyond the {noise:.0%} noise; "
            "eager training avoids the compile time"
        )
    return base.model_copy(
        update={
            "kept": kept,
            "reason": reason,
            "batch_size": point.batch_size,
            "eager_samples_per_s": eager.samples_per_s,
            "compiled_samples_per_s": point.samples_per_s,
            "payoff_minutes": None if minutes is None else round(minutes, 2),
        }
    )


def _minutes(minutes: float) -> str:
    return f"{minutes * 60:.0f} s" if minutes < 1 else f"{minutes:.1f} minutes"


# --- helpers ---------------------------------------------------------------------------------


def _ram_budget(machine: HardwareSnapshot) -> int | None:
    """Host RAM a CPU probe may fill: 70% of what is available (or of the container limit)."""
    host = machine.host
    known = [v for v in (host.memory_available_bytes, host.memory_limit_bytes) if v]
    return int(0.7 * min(known)) if known else None


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
    budget: Budget,
    progress: Progress,
) -> tuple[int | None, tuple[LoaderRecord, ...], str | None]:
    snapshot = profile.provenance.snapshot
    if workload.dataset is None:
        return None, (), None
    if profile.provenance.preferences.num_workers is not None:
        return None, (), "set by the user: not measured"
    if snapshot.host.os_name == "windows":
        return None, (), "Windows keeps num_workers=0 (--workers N overrides it); not measured"
    if budget.left() <= 0:
        return None, (), "not measured: the time budget ran out"
    from torch_autotune.probe.loader import choose_workers

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


def _default_budget(rules_only: Profile) -> float:
    return DEFAULT_COMPILE_BUDGET_S if rules_only.settings.compile.enabled else DEFAULT_BUDGET_S


def tune(
    workload: str | Workload | None = None,
    *,
    snapshot: HardwareSnapshot | None = None,
    mode: Mode | str = Mode.SPEED,
    budget_s: float | None = None,
    max_batch_size: int | None = None,
    target_global_batch: int | None = None,
    fixed_shapes: bool = True,
    num_workers: int | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    trials: Callable[[Workload, StepSettings], Trials] | None = None,
) -> Profile:
    """Probe this machine with a workload and return the measured profile (not saved).

    ``workload`` is a built-in name ("conv", "resnet50", "transformer", "gpt2", "mlp"), a
    ``Workload``, or "package.module:factory". ``budget_s`` bounds the whole run (default
    120 s, 180 s where torch.compile is measured). The user's model, optimizer state, RNG and
    torch's global flags are as before when this returns or raises. ``trials`` replaces the
    real training steps (tests drive the orchestration with recorded timings through it).
    """
    import importlib.util

    from torch_autotune.detect import detect

    if trials is None and importlib.util.find_spec("torch") is None:
        raise ProbeError(
            "torch is not installed, so nothing can be probed; install the build for this "
            "machine (https://pytorch.org/get-started/locally/) and run autotune again"
        )
    report = progress or (lambda _phase, _what: None)
    started = clock()
    report("detect", "this machine")
    machine = snapshot or detect()
    chosen = _resolve(workload, machine)
    preferences = Preferences(
        mode=Mode(mode),
        model_kind=chosen.kind,
        fixed_shapes=fixed_shapes,
        optimizer="adamw",
        num_workers=num_workers,
    )
    rules_only = build_profile(machine, preferences=preferences)
    total = budget_s if budget_s is not None else _default_budget(rules_only)
    budget = Budget(total, clock, started=started)  # detection counts against it too
    report("budget", f"{total:g} s")
    settings = StepSettings.from_profile(rules_only)
    eager_settings = replace(settings, compile_mode=None)
    make = trials or (lambda w, s: TrialRunner(w, s, clock=clock))
    runner = make(chosen, eager_settings)
    run = _Run(chosen, machine, preferences, rules_only, settings, runner, budget, report)
    with preserved():
        return _probe(run, max_batch_size=max_batch_size, target_global_batch=target_global_batch)


def _resolve(workload: str | Workload | None, machine: HardwareSnapshot) -> Workload:
    """The workload asked for; by default the one sized for the device the rules choose."""
    if workload is not None:
        return resolve_workload(workload)
    device = build_profile(machine).settings.device
    return resolve_workload(None, device=device)


@dataclass
class _Plan:
    """What the run measures after the search, and the seconds set aside for each."""

    compile_mode: str | None
    compile_predicted_s: float
    compile_s: float
    workers_s: float
    confirm_s: float
    note: str | None  # why compile is not measured


def _plan(
    settings: StepSettings,
    runner: Trials,
    *,
    budget: Budget,
    model: TimeModel,
    top: int,
    workers_s: float,
) -> _Plan:
    confirm = model.predict(top, settings.steps)
    confirm_s = confirm.seconds if confirm else 0.0
    point = model.predict(top, 2 + MIN_BLOCKS)
    point_s = point.seconds if point else 0.0
    mode = settings.compile_mode
    if mode is None:
        return _Plan(None, 0.0, 0.0, workers_s, confirm_s, None)
    predicted = compile_seconds(runner.leaf_modules())
    compile_s = predicted + 2 * point_s
    left = budget.left_in_run() - workers_s - confirm_s
    if compile_s + THROUGHPUT_POINTS * point_s > left:
        note = (
            f"compiling was predicted to take about {predicted:.0f} s and {left:.0f} s were "
            "left after the search; give it more time with --budget"
        )
        return _Plan(None, predicted, 0.0, workers_s, confirm_s, note)
    return _Plan(mode, predicted, compile_s, workers_s, confirm_s, None)


@dataclass
class _Run:
    """One probe run after detection: the phases in order, and what each found."""

    workload: Workload
    machine: HardwareSnapshot
    preferences: Preferences
    rules_only: Profile
    settings: StepSettings
    runner: Trials
    budget: Budget
    report: Progress
    warnings: list[str] = field(default_factory=list)
    records: list[ThroughputRecord] = field(default_factory=list)
    compile: CompileRecord | None = None

    @property
    def workers_s(self) -> float:
        """Seconds kept for the DataLoader measurement (none when it will not run)."""
        if self.workload.dataset is None or self.preferences.num_workers is not None:
            return 0.0
        return min(WORKERS_MAX_S, WORKERS_SHARE * self.budget.total_s)

    def search(self, max_batch_size: int | None) -> tuple[_Search, _Found, int | None]:
        guarded = _Search(self.runner, self.budget, self.report, reserve_s=self.workers_s)
        device = self.settings.device
        caps = [(CPU_CAP if device == "cpu" else GPU_CAP, _cap_reason(device))]
        if max_batch_size is not None:
            caps.append((max_batch_size, f"the largest batch asked for ({max_batch_size})"))
        if self.workload.max_batch_size is not None:
            largest = self.workload.max_batch_size
            caps.append((largest, f"the workload's largest batch ({largest})"))
        cap, cap_reason = min(caps)
        if device == "cpu":
            guarded.ram_budget_bytes = _ram_budget(self.machine)
        with self.budget.phase("search"):
            self.runner.apply_flags(cudnn_benchmark=False)
            limit = self.runner.memory_limit() or guarded.ram_budget_bytes
            found = _search(guarded, cap, limit, cap_reason)
        name = self.workload.name
        if found.largest is None and found.limited_by in ("budget", "time"):
            raise ProbeError(
                f"the time budget ({self.budget.total_s:g} s) ran out before a single training "
                f"step of the {name} workload finished; give it more with --budget"
            )
        if found.largest is None:
            raise WorkloadError(
                f"the {name} workload does not train even at batch size 1 on {device}: it "
                "runs out of memory; use a smaller model or a larger device"
            )
        return guarded, found, limit

    def throughput(
        self, sizes: list[int], plan: _Plan, model: TimeModel, multiple: int
    ) -> ThroughputRecord | None:
        """Steady points at ``sizes``; the fastest steady one (None: none was steady)."""
        self.runner.apply_flags()
        left = self.budget.left_in_run() - plan.compile_s - plan.workers_s - plan.confirm_s
        with self.budget.phase("throughput", left):
            measured = _measure_points(self.runner, sizes, self.budget, self.report, model)
            measured += self._below(measured, model, multiple)
        self.records = [r for r in measured if isinstance(r, ThroughputRecord)]
        too_big = [r for r in measured if isinstance(r, int)]
        if too_big:
            self.warnings.append(
                f"batch {', '.join(map(str, too_big))} ran in the search but not with the "
                "cuDNN autotuner on (its workspaces need more memory); smaller sizes were "
                "measured"
            )
        best = fastest(self.records)
        if best is None and self.records:
            self.warnings.append(
                "no throughput point was steady (timed blocks kept differing by more than "
                f"{MAX_SPREAD:.0%}): the recommended batch is the largest that ran, not the "
                "fastest; run autotune again on a quieter machine"
            )
        return best

    def _below(
        self, measured: list[ThroughputRecord | int], model: TimeModel, multiple: int
    ) -> list[ThroughputRecord | int]:
        """Halvings below the smallest candidate while each is faster than the size above it
        beyond noise (on this 2-core CPU the small conv net ran 238, 292 and 371 samples/s at
        512, 256 and 128), up to ``EXTRA_HALVINGS`` of them, in the throughput phase's time.
        On a plateau this stops at once, so two runs do not drift to ever smaller sizes."""
        extra: list[ThroughputRecord | int] = []
        points = sorted(
            (r for r in measured if isinstance(r, ThroughputRecord) and r.steady),
            key=lambda r: r.batch_size,
        )
        for _ in range(EXTRA_HALVINGS):
            # go on while the smallest steady size beats the next larger beyond noise
            if len(points) < 2 or points[0].batch_size < 2 * multiple:
                break
            if points[0].samples_per_s <= points[1].samples_per_s * (1 + FASTEST_WITHIN):
                break
            size = round_down(points[0].batch_size // 2, multiple)
            more = _measure_points(self.runner, [size], self.budget, self.report, model)
            extra += more
            new = [r for r in more if isinstance(r, ThroughputRecord) and r.steady]
            if not new:
                break  # no time left for it, or it did not settle
            points.insert(0, new[0])
        return extra

    def compiled(
        self, best: ThroughputRecord | None, sizes: list[int], plan: _Plan
    ) -> tuple[ThroughputRecord | None, Trials]:
        """Measure torch.compile where planned: (the point to recommend, its runner)."""
        wanted = self.settings.compile_mode
        if wanted is None:
            return best, self.runner
        if plan.compile_mode is None or best is None:
            why = plan.note or "no steady eager throughput to compare it with"
            self.compile = CompileRecord(
                mode=wanted,
                measured=False,
                kept=True,
                reason=why,
                predicted_s=round(plan.compile_predicted_s, 1),
            )
            return best, self.runner
        left = self.budget.left_in_run() - plan.workers_s - plan.confirm_s
        with self.budget.phase("compile", left):
            outcome = _measure_compile(
                self.runner,
                mode=wanted,
                eager=best,
                sizes=sizes,
                budget=self.budget,
                progress=self.report,
                predicted_s=plan.compile_predicted_s,
            )
        self.compile = outcome.record
        self.records += outcome.points
        if outcome.record.kept and outcome.point is not None:
            return outcome.point, outcome.runner
        return best, self.runner

    def confirm(
        self, final: Trials, candidate: int, multiple: int, *, ran: set[int], predicted_s: float
    ) -> list[SearchTrialRecord]:
        """Run the candidate once more with the final settings; where the time left is too
        short and the candidate already ran with them, keep that run (and say so)."""
        if candidate in ran and predicted_s > self.budget.left_in_run():
            self.warnings.append(
                f"batch {candidate} was not run a second time: the time budget ran out (it ran "
                "once with these settings)"
            )
            return []
        with self.budget.phase("confirm"):
            self.report("confirm", f"batch {candidate}")
            confirmed = confirm(final, candidate, multiple=multiple)
        if confirmed.batch_size is None:
            raise ProbeError(
                f"batch {candidate} ran during the search but not when run again; memory is "
                "shared with another process? Re-run autotune when the GPU is free"
            )
        return [
            SearchTrialRecord(
                batch_size=t.batch_size,
                fits=t.fits,
                peak_memory_bytes=t.peak_memory_bytes,
                seconds=_seconds(t.seconds),
                step=t.step,
                warmup_s=_seconds(t.warmup_s),
                step_s=_seconds(t.step_s),
            )
            for t in confirmed.trials
        ]

    def workers(
        self, batch: int, step_rate: float | None
    ) -> tuple[int | None, tuple[LoaderRecord, ...], str | None]:
        with self.budget.phase("workers"):
            return _workers(
                workload=self.workload,
                profile=self.rules_only,
                batch_size=batch,
                step_rate=step_rate,
                budget=self.budget,
                progress=self.report,
            )


def _probe(run: _Run, *, max_batch_size: int | None, target_global_batch: int | None) -> Profile:
    """The phases after detection, in order (the module docstring), and the profile."""
    guarded, found, limit = run.search(max_batch_size)
    assert found.largest is not None  # search() raised otherwise
    multiple = _multiple(run.rules_only)
    sizes = _candidates(found.largest, found.limited_by, multiple, run.preferences.fixed_shapes)
    plan = _plan(
        run.settings,
        run.runner,
        budget=run.budget,
        model=guarded.model,
        top=sizes[0],
        workers_s=run.workers_s,
    )
    if plan.note:
        run.warnings.append(f"torch.compile not measured: {plan.note}")
    best = run.throughput(sizes, plan, guarded.model, multiple)
    best, final = run.compiled(best, sizes, plan)
    ran = [r.batch_size for r in run.records if not r.compiled]
    candidate = best.batch_size if best is not None else max(ran, default=sizes[0])
    same_settings = {r.batch_size for r in run.records if r.compiled == (final is not run.runner)}
    if final is run.runner:
        same_settings |= {t.batch_size for t in guarded.records if t.fits}
    if best is not None:  # the point ran after the search, with the final settings
        confirmed = [_confirmation(best)]
    else:
        confirmed = run.confirm(
            final, candidate, multiple, ran=same_settings, predicted_s=plan.confirm_s
        )
    batch = confirmed[-1].batch_size if confirmed else candidate
    step_rate = best.samples_per_s if best is not None and best.batch_size == batch else None
    workers, loader, workers_reason = run.workers(batch, step_rate)
    if run.budget.spent and found.limited_by != "budget":
        run.warnings.append(
            f"the run used {run.budget.elapsed():.0f} s of its {run.budget.total_s:.0f} s "
            "budget; more time (--budget) measures more"
        )
    accumulation = None
    if target_global_batch is not None:
        processes = max(1, len(run.machine.accelerators))
        accumulation = max(1, math.ceil(target_global_batch / (batch * processes)))
    evidence = Evidence(
        workload=run.workload.name,
        device=run.settings.device,
        max_batch_size=found.largest,
        fastest_batch_size=best.batch_size if best is not None else candidate,
        batch_size=batch,
        limited_by=found.limited_by,
        limit_reason=found.reason,
        search=(*guarded.records, *confirmed),
        throughput=tuple(run.records),
        loader=loader,
        workers_reason=workers_reason,
        budget_s=run.budget.total_s,
        elapsed_s=round(run.budget.elapsed(), 3),
        memory_limit_bytes=limit,
        phases=tuple(
            PhaseRecord(
                name=p.name,
                seconds=round(p.seconds, 3),
                allowed_s=None if p.allowed_s is None else round(max(0.0, p.allowed_s), 3),
            )
            for p in run.budget.phases
        ),
        compile=run.compile,
        warnings=tuple(run.warnings),
    )
    measured_compile = run.compile is not None and run.compile.measured
    measurements = Measurements(
        batch_size=batch,
        num_workers=workers,
        grad_accum_steps=accumulation,
        workers_reason=workers_reason if workers is not None else None,
        compile_enabled=run.compile.kept if run.compile is not None and measured_compile else None,
        compile_reason=None if run.compile is None else run.compile.reason,
    )
    return build_profile(run.machine, measurements, run.preferences, evidence=evidence)


def _cap_reason(device: str) -> str:
    if device == "cpu":
        return (
            f"the CPU cap of {CPU_CAP}: CPU throughput stops growing long before, and memory "
            "rarely limits (--max-batch-size raises or lowers it)"
        )
    return f"the cap of {GPU_CAP} (--max-batch-size sets another)"
