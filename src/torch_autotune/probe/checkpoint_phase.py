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
block: ``wrapping.NotCheckpointable``) is said so, and so is a step that raises only
checkpointed (a block whose recompute differs from its forward: torch's ``CheckpointError``),
in the check or in the checkpointed model's own trials: the plain model trained, so the error
is checkpointing's, and the profile keeps it off. Errors of ours (``AutotuneError``) and
Ctrl-C go on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from torch_autotune.errors import AutotuneError, said_in_one_line
from torch_autotune.evidence import FedRecord
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.judge import NOISE, Judgement
from torch_autotune.probe.plan import plan
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import NOISE_CEILING, NOISE_FACTOR, RTOL, Agreement, tolerance
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.variant_phase import Bounds, VariantOutcome, measure_variant
from torch_autotune.probe.variants import Variant, search_settings, variant_record
from torch_autotune.profile import EAGER, Evidence, SearchTrialRecord, Settings, ThroughputRecord

__all__ = [
    "ALREADY",
    "CHECKPOINTED",
    "RecomputeOutcome",
    "checked_on",
    "checked_text",
    "checkpointed",
    "disagrees",
    "measure_checkpointing",
    "measure_recomputing",
    "raised_checkpointed",
    "why_not_measured",
    "with_plain_search",
]

CHECKPOINTED = "checkpointed"
"""The variant's name in the records."""

_Named = TypeVar("_Named", SearchTrialRecord, ThroughputRecord, FedRecord)


def checkpointed() -> Variant:
    """Activation checkpointing: a model of its own (the blocks of the base's stay as they
    are), less memory a sample, no one-off cost beyond building its models (the check's and
    its own: on an H200, 8-15 s each for GPT-2 large) and a new model's first step."""
    return Variant(
        CHECKPOINTED,
        (("activation_checkpointing", True),),
        fresh_model=True,
        builds=2,  # the check's model (``recompute_check``), then its own
        changes_memory=True,
        label="activation checkpointing",
        paid_for="to build and warm up",
        warmup_noun="the recompute",
        phase="checkpointing",
    )


@dataclass(frozen=True)
class RecomputeOutcome:
    """What became of a variant that recomputes to fit a larger batch (checkpointing, compile's
    memory budget): measured (``outcome``), kept with L2's ``reason``, or why it was not
    measured or not kept (``note``)."""

    outcome: VariantOutcome | None = None
    reason: str | None = None
    note: str | None = None


def measure_checkpointing(
    base: Trials,
    *,
    best: ThroughputRecord | None,
    points: Sequence[ThroughputRecord],
    limited_by: str,
    largest: int,
    sizes: list[int],
    model: TimeModel,
    bounds: Bounds,
    budget: Budget,
    progress: Progress,
    workers_s: float,
) -> RecomputeOutcome:
    """Checkpointing against ``best``, the fastest steady point of ``base`` (the eager runner
    whose search stopped at ``largest`` for ``limited_by``; ``points``: its points), at the
    candidates ``sizes`` and within what the plan leaves after the workers (module docstring)."""
    from torch_autotune.wrapping import NotCheckpointable

    if base.settings.settings.activation_checkpointing:
        return RecomputeOutcome()  # on already, as the user's settings asked
    unfit = why_not_measured(best, limited_by, sizes, "checkpointing", points)
    if unfit is not None or best is None:
        return RecomputeOutcome(note=f"not measured: {unfit}")
    checked: list[Agreement | None] = []

    def check() -> str | None:  # the recompute against the plain step, before measuring
        checked.append(_checked(base, bounds.floor, progress))
        return _refusal(checked[0])

    try:
        measured = measure_recomputing(
            base,
            checkpointed(),
            best=best,
            sizes=sizes,
            model=model,
            bounds=bounds,
            budget=budget,
            progress=progress,
            workers_s=workers_s,
            check=check,
        )
    except NotCheckpointable as refused:
        return RecomputeOutcome(note=f"not measured: {refused}")
    except AutotuneError:
        raise  # ours (a rank that failed, an interrupt): the run's to handle
    except Exception as error:  # after the check, only the checkpointed model trains
        if not checked:  # before the check's finding: the plain step's own error, or ours
            raise
        base.apply_flags()  # as the base's points trained (the checkpointed search turned some off)
        return RecomputeOutcome(note=raised_checkpointed(said_in_one_line(error)))
    judged = measured.outcome.judgement if measured.outcome is not None else None
    if measured.note is not None or measured.outcome is None or judged is None:
        return measured
    reason = (
        f"{_measured_faster(checked[0], bounds.floor, judged, best.batch_size)}; the largest "
        f"batch was {measured.outcome.largest} with it and {largest} without"
    )
    return replace(measured, reason=reason)


def _refusal(found: Agreement | None) -> str | None:
    """Why checkpointing is not measured after the check found ``found``; None where it is."""
    if found is not None and found.blocks == 0 and found.raised is None and not found.kinds:
        return ALREADY  # the same step twice: nothing to measure against (blocks alone were)
    if found is None or found.agrees:
        return None
    if found.raised and found.kinds:
        return f"not kept: a checkpointed block, trained alone, raised {found.raised}"
    return raised_checkpointed(found.raised) if found.raised else disagrees(found)


def _measured_faster(checked: Agreement | None, floor: int, judged: Judgement, best: int) -> str:
    """L2's reason where checkpointing is kept, less the largest batches: what the check at
    ``floor`` found, and the rate with it against the rate without it at batch ``best``."""
    return (
        f"{checked_text(checked, floor)}; measured faster: "
        f"{judged.samples_per_s / judged.base_samples_per_s:.2f}x ({judged.samples_per_s:,.0f}"
        f" samples/s at batch {judged.batch_size} with it against "
        f"{judged.base_samples_per_s:,.0f} at batch {best} without it)"
    )


def measure_recomputing(
    base: Trials,
    variant: Variant,
    *,
    best: ThroughputRecord,
    sizes: list[int],
    model: TimeModel,
    bounds: Bounds,
    budget: Budget,
    progress: Progress,
    workers_s: float,
    check: Callable[[], str | None] | None = None,
) -> RecomputeOutcome:
    """``variant``, which recomputes to fit a larger batch, against ``best`` (the fastest
    steady point without it, of a search whose candidates are ``sizes`` and time model
    ``model``), where the plan leaves it the time after the workers: its own search and points
    (``variant_phase``), after ``check`` (why it is not measured, or None to go on). Kept: the
    outcome alone, for the caller to write L2's reason; else why not (``note``)."""
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
        return RecomputeOutcome(note=f"not measured: {after.note}")
    reserve_s = after.workers_s + after.confirm_s
    with budget.phase(variant.phase, budget.left_in_run() - reserve_s):
        refused = check() if check is not None else None
        if refused is not None:
            return RecomputeOutcome(note=refused)
        outcome = measure_variant(
            base,
            variant,
            base_best=best,
            base_sizes=sizes,
            base_model=model,
            bounds=bounds,
            budget=budget,
            progress=progress,
            reserve_s=reserve_s,
        )
    judged = outcome.judgement
    if judged is None:
        return RecomputeOutcome(outcome, note=f"not kept: {outcome.failed}")
    if not judged.kept:  # the judgement's words, less its "... off: "
        return RecomputeOutcome(outcome, note=judged.reason.partition(" off: ")[2])
    return RecomputeOutcome(outcome)


def _checked(base: Trials, batch: int, progress: Progress) -> Agreement | None:
    """The recomputed step against the plain one at ``batch`` (the seam's ``recompute_check``)."""
    progress("checkpointing", f"batch {batch}, recomputed against the plain step")
    return base.recompute_check(batch)


ALREADY = (
    "not measured: the model's blocks are checkpointed already (a Hugging Face model's"
    " gradient_checkpointing_enable(), or blocks wrapped before tune()), so every point ran with"
    " it; the profile leaves the model as it is"
)
"""Why checkpointing is not measured where the check wrapped no block: the model came so."""


def raised_checkpointed(said: str) -> str:
    """Why checkpointing is not kept where its step raised ``said`` (the error's type and
    first line) and the plain step trained: an error of the model checkpointed."""
    return f"not kept: the checkpointed step raised {said}"


def disagrees(checked: Agreement) -> str:
    """Why checkpointing is not used where its recomputed step is not the plain one: where the
    plain step (or block) run twice differed beyond kernels' noise, that (``_unsteady``)."""
    if not checked.noise <= NOISE_CEILING:
        return _unsteady(checked)
    what = (
        f"a block recomputed differs from its plain forward and backward (trained alone:"
        f" {_one_of(checked.kinds)}) by {checked.largest_difference:.1e} (an output or"
        if checked.kinds
        else "a step with it differs from the plain step from the same weights by "
        f"{checked.largest_difference:.1e} (loss or"
    )
    return (
        f"not used: {what} a gradient, relative), more than {_held_to(checked)}: a"
        " checkpointed block's forward depends on more than its inputs (state it changes,"
        " randomness not from torch's generators)"
    )


def _unsteady(checked: Agreement) -> str:
    """Why checkpointing is not used where the plain step (or block) run twice, from the same
    weights and inputs and its generators seeded alike, differed by more than kernels' noise
    reaches: its forward changes from call to call, and a recompute is one call more."""
    what = "an output or a gradient" if checked.kinds else "loss or a gradient"
    on = "on the same inputs" if checked.kinds else "from the same weights and batch"
    by = (
        f"by {checked.noise:.1e} ({what}, relative)"
        if math.isfinite(checked.noise)
        else "without bound (tensors of another shape or number)"
    )
    return (
        f"not used: {_plain(checked)} run twice {on} differed {by}, more than the"
        f" {NOISE_CEILING:g} kernels' noise is taken to reach: a checkpointed block's forward"
        " depends on more than its inputs (state it changes, randomness not from torch's"
        " generators), and a recompute runs it once more, so the step with it cannot be the step"
        " without it"
    )


def _held_to(checked: Agreement) -> str:
    """The tolerance the check held ``checked`` to, and why, where the plain step (or block)
    run twice differed within kernels' noise (``search.tolerance``); ``RTOL`` alone where it
    did not differ."""
    noise, twice = checked.noise, f"{_plain(checked)} run twice"
    if noise == 0:
        return f"{RTOL:g}"
    if tolerance(noise) == RTOL:
        return (
            f"{RTOL:g} ({twice} differed by {noise:.1e}; {NOISE_FACTOR:g}x that is less than"
            f" {RTOL:g}, the least the check allows)"
        )
    return (
        f"{tolerance(noise):.1e} ({NOISE_FACTOR:g}x the {noise:.1e} by which {twice}"
        f" differed; at least {RTOL:g})"
    )


def _plain(checked: Agreement) -> str:
    """What ran twice for the noise: the plain step, or each kind's block alone."""
    if not checked.kinds:
        return "the plain step"
    return "the plain block" if checked.kinds == 1 else "the plain blocks"


def _noise_said(checked: Agreement) -> str:
    """Where the plain step (or block) run twice differed, by how much; nothing where not."""
    if checked.noise == 0:
        return ""
    return f", where {_plain(checked)} run twice differed by {checked.noise:.1e}"


def checked_text(checked: Agreement | None, batch: int) -> str:
    """What the check of the recomputed step found, for the reasons."""
    if checked is None:
        return (
            f"its recomputed step was not checked (the plain step at batch {batch} ran out of"
            " memory or took more than --memory-limit, and no block could be trained alone)"
        )
    if checked.kinds:
        alone = f"{_one_of(checked.kinds)} trained alone on the inputs it got in a step"
        return (
            f"its recomputed blocks matched their plain forward and backward ({alone} at batch"
            f" {batch}: outputs and gradients within {checked.largest_difference:.1e}, relative"
            f"{_noise_said(checked)}; the whole plain step ran out of memory, or took more than"
            " --memory-limit, in the check)"
        )
    return (
        f"its recomputed step matched the plain one at batch {batch} (loss and gradients "
        f"within {checked.largest_difference:.1e}, relative{_noise_said(checked)})"
    )


def _one_of(kinds: int) -> str:
    """The blocks the check trained alone: one of each kind."""
    return "one block" if kinds == 1 else f"one block of each of its {kinds} kinds"


def checked_on(base: Trials, floor: int, progress: Progress) -> Agreement | None:
    """Where ``base`` checkpoints from the start (the probe again, where not even the smallest
    batch trained without it), the recompute checked at ``floor`` before any point is kept
    (one block of each kind alone where the plain step does not fit); None where it could not
    be checked. Raises ``RecomputeDiffersError`` where the recompute differs or raised."""
    from torch_autotune.errors import RecomputeDiffersError

    found = _checked(base, floor, progress)
    refused = _refusal(found)
    if refused is not None and refused != ALREADY:
        raise RecomputeDiffersError(refused.partition(": ")[2])
    return found


def why_not_measured(
    best: ThroughputRecord | None,
    limited_by: str,
    sizes: list[int],
    what: str,
    points: Sequence[ThroughputRecord] = (),
) -> str | None:
    """Why ``what``, a variant that fits a larger batch by recomputing, cannot be faster here,
    so is not measured; None where it may be. ``best``: the fastest steady point without it,
    of a search that stopped for ``limited_by`` and whose candidates are ``sizes``; ``points``:
    that run's points, where the last doubling before ``best`` shows how much a larger batch
    still gains (a throughput curve flattens with the batch, so the next doubling gains less)."""
    if best is None:
        return "no throughput point without it was steady, to be compared with"
    if limited_by != "memory":
        return f"the batch is not memory-bound (limited by {limited_by})"
    if best.batch_size < sizes[0]:
        return (
            f"throughput stopped growing below the largest batch (the fastest point, "
            f"{best.batch_size}, is below the top candidate, {sizes[0]}), so the larger batch "
            f"{what} allows would not pay for its recompute"
        )
    below = [
        p
        for p in points
        if p.steady and p.variant == best.variant and p.batch_size < best.batch_size
    ]
    if not below:
        return None
    prior = max(below, key=lambda p: p.batch_size)
    doublings = math.log2(best.batch_size / prior.batch_size)
    gain = (best.samples_per_s / prior.samples_per_s) ** (1 / doublings) - 1
    if gain > NOISE:
        return None
    return (
        f"throughput grew {gain:.1%} a doubling of the batch up to the largest (batch "
        f"{prior.batch_size} to {best.batch_size}), within the {NOISE:.0%} noise, so the "
        f"larger batch {what} allows would not pay for its recompute"
    )


def with_plain_search(
    evidence: Evidence, plain: Sequence[SearchTrialRecord], settings: Settings
) -> Evidence:
    """The evidence of the probe run again checkpointed, where not even the smallest batch
    trained without it (``together``): the plain search's trials (``plain``, run with
    ``settings``) first, under their own names and settings; the run's base, which trained
    checkpointed, renamed ``CHECKPOINTED`` in every record that names it."""

    def renamed(name: str) -> str:
        base = name == EAGER or name.startswith(f"{EAGER},")
        return CHECKPOINTED + name.removeprefix(EAGER) if base else name

    def each(records: Sequence[_Named]) -> tuple[_Named, ...]:
        return tuple(r.model_copy(update={"variant": renamed(r.variant)}) for r in records)

    names = dict.fromkeys(t.variant for t in plain)
    ran = [variant_record(n, search_settings(settings)) for n in names]
    variants = [v.model_copy(update={"name": renamed(v.name)}) for v in evidence.variants]
    choice = evidence.batch_choice
    choice = choice and choice.model_copy(update={"variant": renamed(choice.variant)})
    return evidence.model_copy(
        update={
            "search": (*plain, *each(evidence.search)),
            "throughput": each(evidence.throughput),
            "fed": each(evidence.fed),
            "variants": (*ran, *variants)[:16],
            "batch_choice": choice
            and choice.model_copy(update={"variant": renamed(choice.variant)}),
        }
    )
