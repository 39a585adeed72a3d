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
from collections.abc import Callable
from dataclasses import dataclass, field

from torch_autotune.bounds import MAX_BATCH_SIZE, MAX_GLOBAL_BATCH, MAX_WORKERS
from torch_autotune.errors import ProbeError, WorkloadError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.guard import Found, SearchGuard, rounded_seconds, search_with_guard
from torch_autotune.probe.points import (
    FASTEST_WITHIN,
    THROUGHPUT_POINTS,
    candidates,
    compile_seconds,
    confirmation,
    fastest,
    measure_compile,
    measure_points,
)
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import (
    confirm,
    round_down,
)
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.trials import (
    MAX_SPREAD,
    MIN_BLOCKS,
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
EXTRA_HALVINGS = 3  # further halvings while the smallest size is faster beyond noise
WORKERS_SHARE = 0.1  # of the budget, at most WORKERS_MAX_S, kept for the DataLoader measurement
WORKERS_MAX_S = 20.0
LOADER_BATCH_CAP = 256  # loader samples/s barely depend on the batch; huge batches take long

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

    _check_arguments(budget_s, max_batch_size, target_global_batch, num_workers)
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
    eager_settings = settings.with_compile(None)
    make = trials or (lambda w, s: TrialRunner(w, s, clock=clock))
    runner = make(chosen, eager_settings)
    run = _Run(chosen, machine, preferences, rules_only, settings, runner, budget, report)
    with preserved():
        return _probe(run, max_batch_size=max_batch_size, target_global_batch=target_global_batch)


def _check_arguments(
    budget_s: float | None,
    max_batch_size: int | None,
    target_global_batch: int | None,
    num_workers: int | None,
) -> None:
    """ValueError for a number no run can use: a budget that is not finite and positive, a
    count outside what a machine can have (``torch_autotune.bounds``)."""
    if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"budget_s must be a finite number of seconds > 0, got {budget_s}")
    for name, value, low, high in (
        ("max_batch_size", max_batch_size, 1, MAX_BATCH_SIZE),
        ("target_global_batch", target_global_batch, 1, MAX_GLOBAL_BATCH),
        ("num_workers", num_workers, 0, MAX_WORKERS),
    ):
        if value is not None and not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


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

    def search(self, max_batch_size: int | None) -> tuple[SearchGuard, Found, int | None]:
        guarded = SearchGuard(self.runner, self.budget, self.report, reserve_s=self.workers_s)
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
            found = search_with_guard(guarded, cap, limit, cap_reason)
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
            measured = measure_points(self.runner, sizes, self.budget, self.report, model)
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
            more = measure_points(self.runner, [size], self.budget, self.report, model)
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
            outcome = measure_compile(
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
                seconds=rounded_seconds(t.seconds),
                step=t.step,
                warmup_s=rounded_seconds(t.warmup_s),
                step_s=rounded_seconds(t.step_s),
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
    sizes = candidates(found.largest, found.limited_by, multiple, run.preferences.fixed_shapes)
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
        confirmed = [confirmation(best)]
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
