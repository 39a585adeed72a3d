"""Where memory limits the batch, the variant that recomputes to fit a larger one (rule L2):
compile's activation memory budget where compile was kept (``probe.compile_budget``), else
activation checkpointing (``probe.checkpoint_phase``). No torch.

One of them, never both: where compile is kept, a checkpointed model would cost a compile of
its own and brings the hazards of checkpointing inside a compiled graph, and the budget trades
the same memory for recompute inside the graphs compile already builds; where compile is not
kept (eager, or compile lost to it), the budget means nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.checkpoint_phase import RecomputeOutcome, measure_checkpointing
from torch_autotune.probe.compile_budget import measure_compile_budget
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search_phase import Searched
from torch_autotune.probe.variant_phase import VariantOutcome
from torch_autotune.profile import ThroughputRecord

__all__ = ["COMPILE_KEPT", "COMPILE_UNMEASURED", "Decisions", "Recomputed", "measure_recompute"]

COMPILE_KEPT = (
    "not measured: the probe kept compile, and compile's own activation memory budget is what "
    "a compiled model tries in its place (a checkpointed model would cost a compile of its own)"
)
"""Why checkpointing is not measured where compile was kept."""

COMPILE_UNMEASURED = (
    "not measured: the profile keeps compile without measuring it (the compile did not fit the"
    " time budget), and a checkpointed model under compile is not what the probe measures"
)
"""Why checkpointing is not measured where compile stays on unmeasured."""


class Decisions(TypedDict):
    """What the profile keeps of the phase (``probe.run.ProbeResult``'s fields)."""

    checkpointing_reason: str | None
    checkpointing_note: str | None
    memory_budget: float | None
    memory_budget_reason: str | None


@dataclass(frozen=True)
class Recomputed:
    """What the phase found: the point to recommend and its runner (the ones it was given
    where nothing was kept), the variant kept, and rule L2's words for each lever: why it was
    kept, or why not measured or not kept."""

    best: ThroughputRecord | None
    final: Trials
    measured: VariantOutcome | None = None  # the variant measured, kept or not
    kept: bool = False
    checkpointing_reason: str | None = None
    checkpointing_note: str | None = None
    memory_budget: float | None = None  # compile's, where it was kept
    memory_budget_reason: str | None = None  # why kept, or why not measured or not kept

    def decisions(self) -> Decisions:
        """Rule L2's words and compile's budget, by the names ``ProbeResult`` holds them."""
        return Decisions(
            checkpointing_reason=self.checkpointing_reason,
            checkpointing_note=self.checkpointing_note,
            memory_budget=self.memory_budget,
            memory_budget_reason=self.memory_budget_reason,
        )


def measure_recompute(
    base: Trials,
    *,
    best: ThroughputRecord | None,
    points: Sequence[ThroughputRecord],
    final: Trials,
    compiled: VariantOutcome | None,
    sizes: list[int],
    searched: Searched,
    budget: Budget,
    progress: Progress,
    workers_s: float,
    release: tuple[int, int] | None,
    compile_unmeasured: bool,
) -> Recomputed:
    """The budget against ``compiled`` (the compile variant kept, whose point is ``best`` and
    runner ``final``), or where none was kept, checkpointing against ``best``, the fastest
    of ``base``'s ``points``, at the candidates ``sizes`` of its search ``searched``; neither
    where compile stays on without being measured (``compile_unmeasured``)."""
    if compiled is not None:
        measured = measure_compile_budget(
            base,
            compiled,
            bounds=searched.bounds,
            budget=budget,
            progress=progress,
            workers_s=workers_s,
            release=release,
        )
        found = _kept(measured, best, final)
        value = found.final.settings.settings.compile.memory_budget if found.kept else None
        why = measured.reason or measured.note
        return replace(
            found, checkpointing_note=COMPILE_KEPT, memory_budget=value, memory_budget_reason=why
        )
    if compile_unmeasured:
        return Recomputed(best, final, checkpointing_note=COMPILE_UNMEASURED)
    measured = measure_checkpointing(
        base,
        best=best,
        points=points,
        limited_by=searched.found.limited_by,
        largest=searched.largest,
        sizes=sizes,
        model=searched.guard.model,
        bounds=searched.bounds,
        budget=budget,
        progress=progress,
        workers_s=workers_s,
    )
    found = _kept(measured, best, final)
    return replace(found, checkpointing_reason=measured.reason, checkpointing_note=measured.note)


def _kept(measured: RecomputeOutcome, best: ThroughputRecord | None, final: Trials) -> Recomputed:
    """The variant's point and runner where it was kept, else ``best`` and ``final``; with
    what was measured."""
    outcome = measured.outcome
    if measured.reason is None or outcome is None or outcome.point is None:
        return Recomputed(best, final, outcome)
    return Recomputed(outcome.point, outcome.runner, outcome, kept=True)
