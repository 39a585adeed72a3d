"""Activation checkpointing measured against the run without it (rule L2), where memory limits
the batch. No torch.

Checkpointing frees each repeated block's activations after its forward and recomputes them in
backward: a larger batch fits, and each step costs about one forward more (Hugging Face
measures about 20% slower). It is faster only where the larger batch it allows gains more
than the recompute costs, which no rule can tell: it is a variant (``probe.variants``) with a
model of its own and a search of its own (``probe.variant_phase``), judged against the fastest
point without it, and kept only where faster beyond noise. It is measured where the base's
search stopped for memory and its fastest point is its top candidate (throughput still grew
with the batch: elsewhere a larger batch cannot fit, or does not help), where compile was not
kept (checkpointing a compiled model costs a compile of its own), and where the plan leaves it
the time. A model it cannot checkpoint (BatchNorm in its blocks, no repeated
block: ``wrapping.NotCheckpointable``) is said so.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.plan import plan
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import RTOL, Agreement
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.variant_phase import Bounds, VariantOutcome, measure_variant
from torch_autotune.probe.variants import Variant
from torch_autotune.profile import ThroughputRecord

__all__ = [
    "CHECKPOINTED",
    "CheckpointingOutcome",
    "checked_text",
    "checkpointed",
    "disagrees",
    "measure_checkpointing",
]

CHECKPOINTED = "checkpointed"
"""The variant's name in the records."""


def checkpointed() -> Variant:
    """Activation checkpointing: a model of its own (the blocks of the base's stay as they
    are), less memory a sample, no one-off cost beyond a new model's first step."""
    return Variant(
        CHECKPOINTED,
        (("activation_checkpointing", True),),
        fresh_model=True,
        changes_memory=True,
        label="activation checkpointing",
        paid_for="to build and warm up",
        warmup_noun="the recompute",
        phase="checkpointing",
    )


@dataclass(frozen=True)
class CheckpointingOutcome:
    """What became of checkpointing: measured (``outcome``), kept with L2's ``reason``, or
    why it was not measured or not kept (``note``)."""

    outcome: VariantOutcome | None = None
    reason: str | None = None
    note: str | None = None


def measure_checkpointing(
    base: Trials,
    *,
    best: ThroughputRecord | None,
    limited_by: str,
    largest: int,
    sizes: list[int],
    model: TimeModel,
    bounds: Bounds,
    budget: Budget,
    progress: Progress,
    workers_s: float,
) -> CheckpointingOutcome:
    """Checkpointing against ``best``, the fastest steady point of ``base`` (the eager runner
    whose search stopped at ``largest`` for ``limited_by``), at the candidates ``sizes`` and
    within what the plan leaves after the workers (module docstring)."""
    from torch_autotune.wrapping import NotCheckpointable

    if base.settings.settings.activation_checkpointing:
        return CheckpointingOutcome()  # on already, as the user's settings asked
    unfit = _why_not(best, limited_by, sizes)
    if unfit is not None or best is None:
        return CheckpointingOutcome(note=f"not measured: {unfit}")
    variant = checkpointed()
    after = plan(
        variant,
        base,
        budget=budget,
        model=model,
        top=sizes[0],
        steps=base.settings.steps,
        workers_s=workers_s,
    )
    if after.variant is None:
        return CheckpointingOutcome(note=f"not measured: {after.note}")
    left = budget.left_in_run() - after.workers_s - after.confirm_s
    try:
        with budget.phase(variant.phase, left):
            checked = _checked(base, bounds.floor, progress)
            if checked is not None and not checked.agrees:
                return CheckpointingOutcome(note=disagrees(checked))
            outcome = measure_variant(
                base,
                variant,
                base_best=best,
                base_sizes=sizes,
                base_model=model,
                bounds=bounds,
                budget=budget,
                progress=progress,
                reserve_s=after.workers_s + after.confirm_s,
            )
    except NotCheckpointable as refused:
        return CheckpointingOutcome(note=f"not measured: {refused}")
    return _verdict(outcome, best, largest, checked_text(checked, bounds.floor))


def _verdict(
    outcome: VariantOutcome, best: ThroughputRecord, largest: int, checked: str
) -> CheckpointingOutcome:
    """Kept with L2's reason where its judgement kept it, else why not (``checked``: what the
    check of its recompute found)."""
    judged = outcome.judgement
    if judged is None:
        return CheckpointingOutcome(outcome, note=f"not kept: {outcome.failed}")
    if not judged.kept:  # the judgement's words, less its "activation checkpointing off: "
        return CheckpointingOutcome(outcome, note=judged.reason.partition(" off: ")[2])
    reason = (
        f"{checked}; measured faster: {judged.samples_per_s / judged.base_samples_per_s:.2f}x "
        f"({judged.samples_per_s:,.0f} samples/s at batch {judged.batch_size} with it against "
        f"{judged.base_samples_per_s:,.0f} at batch {best.batch_size} without it); the largest "
        f"batch was {outcome.largest} with it and {largest} without"
    )
    return CheckpointingOutcome(outcome, reason=reason)


def _checked(base: Trials, batch: int, progress: Progress) -> Agreement | None:
    """The recomputed step against the plain one at ``batch`` (the seam's ``recompute_check``)."""
    progress("checkpointing", f"batch {batch}, recomputed against the plain step")
    return base.recompute_check(batch)


def disagrees(checked: Agreement) -> str:
    """Why checkpointing is not used where its recomputed step is not the plain one."""
    return (
        f"not used: a step with it differs from the plain step from the same weights by "
        f"{checked.largest_difference:.1e} (loss or a gradient, relative), more than {RTOL:g}:"
        " a checkpointed block's forward depends on more than its inputs (state it changes,"
        " randomness not from torch's generators)"
    )


def checked_text(checked: Agreement | None, batch: int) -> str:
    """What the check of the recomputed step found, for the reasons."""
    if checked is None:
        return (
            f"its recomputed step was not checked (the plain step at batch {batch} ran out of"
            " memory)"
        )
    return (
        f"its recomputed step matched the plain one at batch {batch} (loss and gradients "
        f"within {checked.largest_difference:.1e}, relative)"
    )


def _why_not(best: ThroughputRecord | None, limited_by: str, sizes: list[int]) -> str | None:
    """Why checkpointing cannot be faster here, so is not measured; None where it may be."""
    if best is None:
        return "no throughput point without it was steady, to be compared with"
    if limited_by != "memory":
        return f"the batch is not memory-bound (limited by {limited_by})"
    if best.batch_size < sizes[0]:
        return (
            f"throughput stopped growing below the largest batch (the fastest point, "
            f"{best.batch_size}, is below the top candidate, {sizes[0]}), so the larger batch "
            "checkpointing allows would not pay for its recompute"
        )
    return None
