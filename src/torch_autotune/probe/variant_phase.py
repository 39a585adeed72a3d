"""One variant measured against the base (``probe.variants``): its own search where it changes
memory, its steady points, and one A/B judgement (``probe.judge``). No torch.

A variant that changes how much memory a batch needs gets a search of its own, on its own
memory curve and its own time model, with the base search's bounds (the cap, the device's
memory, host RAM): it starts at the base's smallest candidate, which fits unless the variant
needs several times the memory, so a variant that needs more memory (compile) measures sizes
that fit it, and one that needs less (activation checkpointing) reaches sizes the base could
not. Its first trial pays its one-off cost (the compile). Its points are then measured at its
own candidates (K2's margin and K4's multiple, as the base's); a variant that does not change
memory is measured at the base's candidates. Its fastest steady point is judged against the
base's fastest steady point.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch_autotune.errors import AutotuneError
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.guard import SearchGuard, search_with_guard
from torch_autotune.probe.judge import Judgement, judge
from torch_autotune.probe.points import Room, candidates, fastest, measure_points, room_in
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.variants import Variant, search_name, search_settings, variant_record
from torch_autotune.profile import CompileRecord, SearchTrialRecord, ThroughputRecord, VariantRecord


@dataclass(frozen=True)
class Bounds:
    """What bounds every search of a run: the largest batch it may try and why, the device's
    memory (None: unknown), host RAM (on the CPU), the smallest batch the model trains at,
    the multiple sizes are rounded to (K4), and whether shapes are fixed (K2's margin)."""

    cap: int
    cap_reason: str
    memory_limit: int | None
    ram_budget_bytes: int | None
    floor: int
    multiple: int
    fixed_shapes: bool


@dataclass
class VariantOutcome:
    """What measuring one variant found."""

    variant: Variant
    runner: Trials  # the variant's runner (its compiled code is reused to confirm)
    judgement: Judgement | None  # None: no point of it ran (``failed`` says why)
    point: ThroughputRecord | None  # its fastest steady point, where it ran one
    points: list[ThroughputRecord] = field(default_factory=list)
    search: list[SearchTrialRecord] = field(default_factory=list)
    ran_as: list[VariantRecord] = field(default_factory=list)
    paid_s: float | None = None  # its one-off cost, as its first step paid it
    failed: str | None = None
    largest: int | None = None  # the largest batch its own search trained (None: no search)
    limited_by: str | None = None  # what limited that search
    sizes: list[int] = field(default_factory=list)  # its candidates, largest first
    model: TimeModel | None = None  # its own search's time model (None: no search)
    room: Room | None = None  # where K2's margin was kept in memory: ``points.room_in``


def measure_variant(
    base: Trials,
    variant: Variant,
    *,
    base_best: ThroughputRecord,
    base_sizes: Sequence[int],
    base_model: TimeModel,
    bounds: Bounds,
    budget: Budget,
    progress: Progress,
    reserve_s: float,
) -> VariantOutcome:
    """Measure ``variant`` against ``base_best``, the base's fastest steady point (module
    docstring); ``reserve_s``: seconds kept for the phases after this one. Where its training
    raises, its model is let go (on every rank of a job) before the error goes on."""
    runner = base.variant(variant)
    with _let_go_on_error(runner):
        settings = runner.settings.settings
        outcome = VariantOutcome(variant, runner, None, None)
        outcome.ran_as.append(variant_record(variant.name, settings))
        sizes, model = list(base_sizes), base_model
        if variant.changes_memory:
            searched = _search(
                runner,
                variant,
                bounds=bounds,
                budget=budget,
                progress=progress,
                reserve_s=reserve_s,
                start=min(base_sizes),
            )
            outcome.search = searched.records
            outcome.ran_as.append(variant_record(searched.variant, search_settings(settings)))
            outcome.paid_s = next((r.warmup_s for r in searched.records if r.fits), None)
            largest = max((r.batch_size for r in searched.records if r.fits), default=None)
            if largest is None:
                outcome.failed = _failure(variant, _out_of_memory(searched.records), budget)
                return outcome
            limited = outcome.limited_by = searched.limited_by
            outcome.largest = largest
            fixed, floor = bounds.fixed_shapes, bounds.floor
            room = outcome.room = room_in(searched.records, runner.memory_limit(), limited, fixed)
            sizes = candidates(largest, limited, bounds.multiple, fixed, floor=floor, room=room)
            model = outcome.model = searched.model
        outcome.sizes = sizes
        runner.apply_flags()
        measured = measure_points(
            runner, sizes, budget, progress, model, variant=variant.name, phase=variant.phase
        )
        outcome.points = [r for r in measured if isinstance(r, ThroughputRecord)]
        if outcome.paid_s is None and outcome.points:
            outcome.paid_s = outcome.points[0].warmup_s
        best = fastest(outcome.points) or (outcome.points[0] if outcome.points else None)
        if best is None:
            failed = [r for r in measured if isinstance(r, int)]
            outcome.failed = _failure(variant, failed, budget, "ran no throughput point")
            return outcome
        outcome.point = best
        outcome.judgement = judge(variant, base_best, best, outcome.paid_s or 0.0)
        if not outcome.judgement.kept:  # never trained again: off the device for what follows
            runner.release_model()  # (a fresh process's trials share this GPU)
        return outcome


@contextmanager
def _let_go_on_error(runner: Trials) -> Iterator[None]:
    """Where the variant's training raises, its model is let go before the error goes on (an
    error of ours ends the run as it is)."""
    try:
        yield
    except AutotuneError:
        raise
    except Exception:
        runner.release_model()
        raise


@dataclass
class _Searched:
    records: list[SearchTrialRecord]
    limited_by: str
    variant: str
    model: TimeModel


def _search(
    runner: Trials,
    variant: Variant,
    *,
    bounds: Bounds,
    budget: Budget,
    progress: Progress,
    reserve_s: float,
    start: int,
) -> _Searched:
    """The variant's own search (module docstring), without the cuDNN autotuner as the base's."""
    name = search_name(variant, runner.settings.settings)
    guard = SearchGuard(runner, budget, progress, reserve_s=reserve_s, variant=name)
    guard.phase = variant.phase
    guard.ram_budget_bytes = bounds.ram_budget_bytes
    if bounds.ram_budget_bytes is not None:  # the CPU's: --memory-limit caps what a trial takes
        guard.ram_cap_bytes = runner.settings.memory_limit_bytes
    guard.start = max(bounds.floor, min(start, bounds.cap))
    runner.apply_flags(cudnn_benchmark=False)
    found = search_with_guard(
        guard, bounds.cap, bounds.memory_limit, bounds.cap_reason, floor=bounds.floor
    )
    return _Searched(guard.records, found.limited_by, name, guard.model)


def _out_of_memory(records: Sequence[SearchTrialRecord]) -> list[int]:
    """The sizes of a search that ran and did not fit (not those refused without running)."""
    return [r.batch_size for r in records if r.seconds is not None and not r.fits]


def _failure(
    variant: Variant, failed: Sequence[int], budget: Budget, none: str = "finished no step"
) -> str:
    """Why ``variant`` has no point (``none`` says what did not happen: it finished no step,
    or ran no throughput point): out of memory at ``failed``, or out of time: its phase's
    share of the budget, where the run had time left for the phases after it."""
    if failed:
        sizes = ", ".join(map(str, failed))
        return f"the {variant.name} model ran out of memory at batch {sizes}"
    left = budget.left_in_run()
    if left < 1:
        return f"the {variant.name} model {none} before the time budget ran out"
    return (
        f"the {variant.name} model {none} in its phase's share of the time budget"
        f" ({left:.0f} s of it were left, kept for the phases after it)"
    )


def compile_record(mode: str, predicted_s: float, outcome: VariantOutcome) -> CompileRecord:
    """The profile's record of the compile variant: its judgement, or why it has none."""
    paid = None if outcome.paid_s is None else round(outcome.paid_s, 1)
    base = CompileRecord(
        mode=mode,
        measured=True,
        kept=False,
        reason=f"compile off: {outcome.failed}",
        predicted_s=round(predicted_s, 1),
        compile_s=paid,
    )
    judged = outcome.judgement
    if judged is None:
        return base
    return base.model_copy(
        update={
            "kept": judged.kept,
            "reason": judged.reason,
            "batch_size": judged.batch_size,
            "eager_samples_per_s": judged.base_samples_per_s,
            "compiled_samples_per_s": judged.samples_per_s,
            "payoff_minutes": judged.payoff_minutes,
        }
    )
