"""One probe run: measure a workload on this machine with the rules-only profile's settings.

``measure()`` only measures: ``torch_autotune.api.tune()`` detects the machine, builds the
rules-only profile (what to probe with: device, AMP dtype, memory format, compile, optimizer
options), calls it, and builds the measured profile from the ``ProbeResult``. Phases, all on
one ``Budget`` (one clock, one deadline; each phase has a share and cannot overrun the run;
detection, before them, counts against it too):

1. **search**: the largest batch that trains, in eager mode with the profile's other settings
   and without the cuDNN autotuner (its warm-up, 6-9 s per new shape for ResNet-50 on an
   H100, would cost a minute over a search); capped by the dataset, the user's maximum and, on
   the CPU, a size past which CPU throughput no longer grows. A size is skipped for time only
   when the time model (``timemodel``) predicts that it, plus measuring it afterwards, takes
   longer than what is left of the whole budget;
2. **throughput**: steady samples/s at the top candidate sizes (the largest, less catalog K2's
   margin where memory or host RAM limited it, rounded to a multiple of 8 on Tensor-Core GPUs,
   and halvings of it), with the cuDNN autotuner as the profile sets it; a point runs until its
   timed blocks agree within 5% or its share of the time is spent, and a point that stays noisy
   is not used to pick the fastest batch;
3. **compile** (speed mode, where the rules allow torch.compile): one compiled module, the
   batch dimension marked dynamic so it compiles once, with a search and candidates of its own
   (``probe.variant_phase``); kept only when faster beyond noise, its one-off cost reported
   with the training time after which it pays off; where the predicted compile time does not
   fit, decided by the rules and marked as not measured. **recompute**
   (``probe.recompute_phase``), where memory limited the search: compile's activation memory
   budget where compile was kept, else activation checkpointing, each with a search of its
   own, kept only where its fastest point beats the fastest without it (L2); then the
   allocator's setting in a fresh process (``probe.allocator_phase``);
4. **confirm**: the recommended size's point (none steady: ``points.unsteady_choice``) confirms it;
5. **workers**: DataLoader worker counts (Windows keeps 0): the loader alone, then, where it
   cannot decide, training fed by it, whose passes choose the batch where loading limits it or
   fewer CPU threads are chosen (up to the search's largest, ``largest``).

Progress is reported through a callback, so the library never prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from torch_autotune.errors import ProbeError
from torch_autotune.evidence import WORKERS_OUT_OF_TIME
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.allocator_phase import measure_allocator
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.fed_threads import MeasuredThreads, doublings
from torch_autotune.probe.findings import run_evidence
from torch_autotune.probe.guard import trial_record
from torch_autotune.probe.loop import FedRunner
from torch_autotune.probe.memory import memory_capped
from torch_autotune.probe.oom import long_lived_objects_frozen
from torch_autotune.probe.optimizer_memory import measure_optimizer_memory
from torch_autotune.probe.plan import Plan, plan
from torch_autotune.probe.points import (
    Room,
    affordable,
    batch_choice,
    candidates,
    confirmation,
    fastest,
    fed_choice,
    halvings_below,
    measure_points,
    room_in,
    throughput_warnings,
    unconfirmed,
    unsteady_choice,
)
from torch_autotune.probe.recompute_phase import Recomputed, measure_recompute
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import Agreement, confirm
from torch_autotune.probe.search_phase import Searched, search
from torch_autotune.probe.smallest import Smallest
from torch_autotune.probe.state import preserved
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.variant_phase import VariantOutcome, compile_record, measure_variant
from torch_autotune.probe.variants import (
    BASE,
    compiled,
    search_name,
    search_settings,
    variant_record,
)
from torch_autotune.probe.workers_phase import (
    ThreadsFor,
    WorkersOutcome,
    halvings,
    kept_seconds,
    measure_workers,
    out_of_time_warning,
    step_rates,
)
from torch_autotune.probe.workloads import Workload
from torch_autotune.probe.workloads.copies import parked
from torch_autotune.profile import (
    EAGER,
    AllocatorRecord,
    CompileRecord,
    Evidence,
    OptimizerMemoryRecord,
    Preferences,
    Profile,
    SearchTrialRecord,
    ThroughputRecord,
    VariantRecord,
    torch_release,
)
from torch_autotune.settings import memory_settings


@dataclass(frozen=True)
class ProbeResult:
    """What one probe run measured: the evidence for the profile, and the worker count the
    DataLoader measurement chose (None: not measured, the rules decide)."""

    evidence: Evidence
    num_workers: int | None
    checkpointing_reason: str | None = None  # rule L2's, where checkpointing was kept
    checkpointing_note: str | None = None  # why it was not measured or not kept
    memory_budget: float | None = None  # compile's activation memory budget, where kept
    memory_budget_reason: str | None = None  # L2's: why kept, or why not measured or not kept
    recompute_checked: tuple[Agreement | None, int] | None = None  # the search's ``checked``
    threads: MeasuredThreads | None = None  # CPU threads fed by the DataLoader (fed_threads)


def measure(
    workload: Workload,
    rules_only: Profile,
    *,
    budget_s: float,
    started: float,
    max_batch_size: int | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    trials: Callable[[Workload, StepSettings], Trials] | None = None,
    threads_for: ThreadsFor | None = None,
) -> ProbeResult:
    """Probe ``workload`` with the settings of ``rules_only`` (the rules-only profile of the
    machine, with the preferences it was made with); return what was measured.

    ``budget_s`` bounds the whole run, which began at ``started`` on ``clock`` (detection
    counts against it too). The user's model, optimizer state, RNG and torch's global flags
    are as before when this returns or raises. ``trials`` replaces the real training steps
    (tests drive the orchestration with recorded timings through it). ``threads_for(n)``: the
    CPU threads the profile sets beside ``n`` DataLoader workers, for the passes of training
    fed by the DataLoader (default: the process's own).
    """
    report = progress or (lambda _phase, _what: None)
    budget = Budget(budget_s, clock, started=started)
    settings = StepSettings.from_profile(rules_only)
    make = trials or (lambda w, s: FedRunner(w, s, clock=clock))
    runner = make(workload, settings.with_variant(BASE))
    machine = rules_only.provenance.snapshot
    preferences = rules_only.provenance.preferences
    run = _Run(workload, machine, preferences, rules_only, settings, runner, budget, report)
    run.threads_for = threads_for
    # the real runner's device held to --memory-limit; a simulated one holds it itself
    cap = None if trials is not None else settings.memory_limit_bytes
    capped = memory_capped(settings.device, cap)
    with preserved(), long_lived_objects_frozen(), parked(workload.make_model), capped:
        return _probe(run, max_batch_size=max_batch_size)


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
    search: list[SearchTrialRecord] = field(default_factory=list)
    variants: dict[str, VariantRecord] = field(default_factory=dict)
    compile: CompileRecord | None = None
    optimizer_memory: OptimizerMemoryRecord | None = None
    allocator: AllocatorRecord | None = None
    smallest: Smallest = field(default_factory=lambda: Smallest(1, None))
    threads_for: ThreadsFor | None = None
    limit: int | None = None  # bytes the trials could use on the device
    kept: VariantOutcome | None = None  # the variant kept, where one was
    largest: int | None = None  # the largest batch that ran in the chosen point's search
    top: int | None = None  # its top candidate, less K2's margin (the passes' larger sizes)
    recomputed: Recomputed | None = None  # rule L2's phase, where it ran

    @property
    def floor(self) -> int:
        """The smallest batch the model trains at: no size below it is measured."""
        return self.smallest.size

    @property
    def workers_s(self) -> float:
        """Seconds kept for the workers phase (none when it will not run)."""
        return kept_seconds(self.rules_only, self.workload, self.budget.total_s)

    def searched(self, max_batch_size: int | None) -> Searched:
        """The search phase (``probe.search_phase``), and what the later phases keep of it."""
        searched = search(
            self.runner,
            self.workload,
            self.machine,
            self.budget,
            self.report,
            reserve_s=self.workers_s,
            max_batch_size=max_batch_size,
            multiple=self.rules_only.topology.batch_multiple,
            fixed_shapes=self.preferences.fixed_shapes,
        )
        self.smallest, self.limit = searched.smallest, searched.bounds.memory_limit
        self.search = list(searched.guard.records)
        base = self.runner.settings.settings
        self.ran_as(variant_record(search_name(BASE, base), search_settings(base)))
        return searched

    def ran_as(self, *records: VariantRecord) -> None:
        """Keep the settings each variant ran with, for the evidence."""
        self.variants.update((r.name, r) for r in records)

    def ran_with(self, settings: StepSettings) -> set[int]:
        """Batch sizes that ran with ``settings``' values of the settings that change memory."""
        memory = memory_settings(settings.settings)
        names = {name for name, r in self.variants.items() if r.settings == memory}
        ran = {t.batch_size for t in self.search if t.fits and t.variant in names}
        return ran | {r.batch_size for r in self.records if r.variant in names}

    def throughput(
        self, sizes: list[int], plan: Plan, model: TimeModel, multiple: int
    ) -> ThroughputRecord | None:
        """Steady points at ``sizes``; the fastest steady one (None: none was steady)."""
        self.runner.apply_flags()
        self.ran_as(variant_record(EAGER, self.runner.settings.settings))
        left = plan.throughput_s(self.budget.left_in_run(), model, sizes[-1])
        with self.budget.phase("throughput", left):
            skipped = len(self.budget.skipped)
            kept, dropped = affordable(sizes, model, self.budget, self.settings.device)
            measured = measure_points(self.runner, kept, self.budget, self.report, model)
            measured += halvings_below(
                self.runner,
                measured,
                budget=self.budget,
                progress=self.report,
                model=model,
                multiple=multiple,
                floor=self.floor,
            )
        self.records = [r for r in measured if isinstance(r, ThroughputRecord)]
        self.warnings += throughput_warnings(
            measured,
            dropped=[size for size in sizes if size not in kept],
            affordable_skip=dropped,
            skips=[s for s in self.budget.skipped[skipped:] if s is not dropped],
        )
        return fastest(self.records)

    def variant(
        self, best: ThroughputRecord | None, sizes: list[int], plan: Plan, searched: Searched
    ) -> tuple[ThroughputRecord | None, Trials]:
        """Measure the planned variant against ``best``: (the point to recommend, its runner)."""
        mode = self.settings.compile_mode  # compile is the one variant the rules ask for yet
        if mode is None:
            return best, self.runner
        if plan.variant is None or best is None:
            why = plan.note or "no steady eager throughput to compare it with"
            self.compile = CompileRecord(
                mode=mode,
                measured=False,
                kept=True,
                reason=why,
                predicted_s=round(plan.predicted_s, 1),
            )
            return best, self.runner
        left = self.budget.left_in_run() - plan.workers_s - plan.confirm_s
        with self.budget.phase(plan.variant.phase, left):
            outcome = measure_variant(
                self.runner,
                plan.variant,
                base_best=best,
                base_sizes=sizes,
                base_model=searched.guard.model,
                bounds=searched.bounds,
                budget=self.budget,
                progress=self.report,
                reserve_s=plan.workers_s + plan.confirm_s,
            )
        self.merge(outcome)
        self.compile = compile_record(mode, plan.predicted_s, outcome)
        if outcome.judgement is not None and outcome.judgement.kept and outcome.point:
            self.kept = outcome
            return outcome.point, outcome.runner
        return best, self.runner

    def merge(self, outcome: VariantOutcome | None) -> None:
        """Keep what measuring a variant ran: its settings, its search and its points."""
        if outcome is not None:
            self.ran_as(*outcome.ran_as)
            self.search += outcome.search
            self.records += outcome.points

    def recompute(
        self, best: ThroughputRecord | None, final: Trials, sizes: list[int], searched: Searched
    ) -> tuple[ThroughputRecord | None, Trials]:
        """Rule L2's phase (``probe.recompute_phase``): (the point to recommend, its runner)."""
        done = self.recomputed = measure_recompute(
            self.runner,
            best=best,
            points=self.records,
            final=final,
            compiled=self.kept,
            sizes=sizes,
            searched=searched,
            budget=self.budget,
            progress=self.report,
            workers_s=self.workers_s,
            release=torch_release(self.machine.software.torch_version),
            compile_unmeasured=self.compile is not None and not self.compile.measured,
        )
        self.merge(done.measured)
        self.kept = done.measured if done.kept else self.kept
        return done.best, done.final

    def candidates_of(
        self, best: ThroughputRecord | None, searched: Searched, sizes: list[int], room: Room | None
    ) -> tuple[int, str, int, Room | None]:
        """(the largest batch, what limited it, the top candidate, its room in memory) of the
        search whose candidates ``best`` came from: the kept variant's own, or the base's."""
        kept = self.kept
        if kept is not None and best is kept.point and kept.largest is not None:
            return kept.largest, kept.limited_by or "", kept.sizes[0], kept.room
        return searched.largest, searched.found.limited_by, sizes[0], room

    def confirm(
        self,
        final: Trials,
        variant: str,
        candidate: int,
        multiple: int,
        *,
        predicted_s: float,
    ) -> list[SearchTrialRecord]:
        """Run the candidate once more with the final settings (``variant``); where the time
        left is too short and the candidate already ran with the settings that change memory,
        keep that run (and say so): ``points.unconfirmed``."""
        if candidate in self.ran_with(final.settings):
            skipped = unconfirmed(self.budget, candidate, predicted_s, kept_s=self.workers_s)
            if skipped is not None:
                self.warnings.append(skipped)
                return []
        with self.budget.phase("confirm"):
            self.report("confirm", f"batch {candidate}")
            confirmed = confirm(final, candidate, multiple=multiple, floor=self.floor)
        if confirmed.batch_size is None:
            raise ProbeError(
                f"batch {candidate} ran during the search but not when run again; memory is "
                "shared with another process? Re-run autotune when the GPU is free"
            )
        return [trial_record(t, variant) for t in confirmed.trials]

    def workers(
        self, final: Trials, variant: str, batch: int, multiple: int, ran: list[SearchTrialRecord]
    ) -> WorkersOutcome:
        """The workers, fed by ``final`` at ``batch`` (``ran``: its trial); the batch (<= top)."""
        with self.budget.phase("workers"):
            outcome = measure_workers(
                workload=self.workload,
                profile=self.rules_only,
                runner=final,
                batch_size=batch,
                step_rates=step_rates(self.records, [*self.search, *ran], variant),
                budget=self.budget,
                progress=self.report,
                smaller=halvings(batch, multiple, self.floor),
                threads_for=self.threads_for,
                larger=doublings(batch, self.top),  # K2's margin held: the top candidate
            )
        if outcome.reason == WORKERS_OUT_OF_TIME:
            self.warnings.append(out_of_time_warning(self.budget, self.workers_s))
        if outcome.warning is not None:
            self.warnings.append(outcome.warning)
        fed = tuple(r.model_copy(update={"variant": variant}) for r in outcome.fed)
        return replace(outcome, batch_size=outcome.batch_size or batch, fed=fed)


def _probe(run: _Run, *, max_batch_size: int | None) -> ProbeResult:
    """The phases after detection, in order (the module docstring), and what they found."""
    step = run.rules_only.topology.batch_multiple  # K4
    fixed = run.preferences.fixed_shapes
    searched = run.searched(max_batch_size)
    found = searched.found
    run.optimizer_memory, foreach = measure_optimizer_memory(run, searched)
    run.search += foreach
    room = room_in(searched.guard.records, run.runner.memory_limit(), found.limited_by, fixed)
    sizes = candidates(searched.largest, found.limited_by, step, fixed, floor=run.floor, room=room)
    mode = run.settings.compile_mode
    after = plan(
        compiled(mode) if mode is not None else None,
        run.runner,
        budget=run.budget,
        model=searched.guard.model,
        top=sizes[0],
        steps=run.settings.steps,
        workers_s=run.workers_s,
    )
    if after.note:
        run.warnings.append(f"torch.compile not measured: {after.note}")
    best = run.throughput(sizes, after, searched.guard.model, step)
    best, final = run.variant(best, sizes, after, searched)
    best, final = run.recompute(best, final, sizes, searched)
    kept = run.kept if final is not run.runner else None  # the variant the profile trains
    run.allocator = measure_allocator(run, best, kept, searched, after.workers_s + after.confirm_s)
    variant = best.variant if best is not None and final is not run.runner else EAGER
    point = best or unsteady_choice(run.records)  # none steady: the fastest, as it ran
    candidate = point.batch_size if point is not None else sizes[0]
    if point is not None and (point is best or final is run.runner):  # with the final settings
        confirmed = [confirmation(point)]
    else:
        confirmed = run.confirm(final, variant, candidate, step, predicted_s=after.confirm_s)
    run.largest, limited_by, run.top, room = run.candidates_of(best, searched, sizes, room)
    choice = batch_choice(
        largest=run.largest,
        limited_by=limited_by,
        fixed_shapes=fixed,
        top=run.top,
        multiple=step,
        best=best,
        records=run.records,
        confirmed=confirmed,
        candidate=candidate,
        room=room,
    )
    at = confirmed[-1].batch_size if confirmed else candidate
    workers = run.workers(final, variant, at, step, confirmed)
    batch = workers.batch_size or candidate  # the step's, or the fed passes' where data-bound
    if workers.batch_reason is not None:  # the passes chose, for ``workers.batch_why``
        choice = fed_choice(choice, workers.batch_why)
    run.search += confirmed
    evidence = run_evidence(run, found, batch=batch, fastest=candidate, choice=choice)
    loader = {"loader": workers.loader, "workers_reason": workers.reason, "fed": workers.fed}
    made = evidence.model_copy(update={**loader, "fed_reason": workers.batch_reason})
    l2 = (run.recomputed or Recomputed(best, final)).decisions()
    return ProbeResult(
        made, workers.num_workers, recompute_checked=searched.checked, threads=workers.threads, **l2
    )
