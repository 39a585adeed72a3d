"""The optimizer's memory, measured where it decides the batch (issue 21): the fused Adam/AdamW
step against torch's default (foreach) at the largest batch the search trained. No torch.

The foreach step works on lists of tensors and holds intermediates as large as the parameters
while it runs (``exp_avg_sq``'s square root, the update), where the fused kernel updates each
tensor in place: for a model of a billion parameters, gigabytes at the step. Whether that
decides the batch depends on where the step's peak is: at a large batch the activations of
backward dwarf it, at the small batches of a model that barely fits, the optimizer's step is the
peak. So it is measured only where memory stopped the search, the profile fuses the optimizer
(rule I2) and the foreach step could cost more than ``DECIDES`` of the batch: its extra, about
a quarter of what the trials' peaks hold whatever the batch (Adam's parameters, gradients and
two moments in float32: four copies), measured in samples of the trials' memory per sample.
Then one trial with the foreach optimizer at the largest batch the search trained fused, on
the same model, within a small share of the time left; where it runs out of memory, the fused
step runs there again as the control (a device shared since the search would fail both). Its
outcome (it fit or ran out, and both peaks) is the evidence's ``optimizer_memory``, and I2
says it.
"""

from __future__ import annotations

from torch_autotune.evidence import EAGER, OptimizerMemoryRecord, SearchTrialRecord
from torch_autotune.probe.findings import RunState
from torch_autotune.probe.guard import trial_record
from torch_autotune.probe.search import TrialOutcome, trial_of
from torch_autotune.probe.search_phase import Searched
from torch_autotune.probe.variants import Variant

__all__ = ["DECIDES", "FOREACH", "SHARE", "foreach", "may_decide", "measure_optimizer_memory"]

FOREACH = "foreach"
"""The variant's name in the records."""

SHARE = 0.1
"""The most of the time left in the run the trial may be predicted to take."""

DECIDES = 0.02
"""The share of the largest batch the foreach step's extra memory must be worth to be measured
(ResNet-50 on an H100: half a GiB, 11 of 1,850 samples, is not; a 1B model under 24 GiB is)."""


def foreach() -> Variant:
    """torch's default optimizer implementation (foreach) on the base's model."""
    return Variant(
        FOREACH,
        (("optimizer.fused", False),),
        changes_memory=True,
        label="the fused optimizer",
        phase="optimizer",
    )


def measure_optimizer_memory(
    run: RunState, searched: Searched
) -> tuple[OptimizerMemoryRecord | None, list[SearchTrialRecord]]:
    """The foreach step at the largest batch ``searched`` trained (module docstring): (what it
    found, its trial's record), or (None, []) where it is not measured: the optimizer is not
    fused, memory did not stop the search, or the trial would take more than ``SHARE`` of the
    time left."""
    base, search, budget, progress = run.runner, run.search, run.budget, run.report
    largest, limited_by, model = searched.largest, searched.found.limited_by, searched.guard.model
    if not base.settings.settings.optimizer.fused or limited_by != "memory":
        return None, []
    if not may_decide(search, largest):
        return None, []
    predicted = model.predict(largest, base.settings.steps)
    if predicted is None or predicted.seconds > SHARE * budget.left_in_run():
        return None, []
    fused = [t for t in search if t.fits and t.batch_size == largest]
    runner = base.variant(foreach())
    with budget.phase("optimizer"):
        progress("optimizer", f"batch {largest}, torch's default (foreach) optimizer")
        outcome = runner(largest)
        records = [_trial(largest, outcome, "optimizer memory (foreach)", FOREACH)]
        if not outcome.fits:  # the control: fused there again, as the device is now
            progress("optimizer", f"batch {largest}, fused again")
            again = base(largest)
            records.append(_trial(largest, again, "optimizer memory (fused again)", EAGER))
            if not again.fits:  # the device changed, not the optimizer: nothing to say
                return None, records
    record = OptimizerMemoryRecord(
        batch_size=largest,
        fused_peak_bytes=fused[-1].peak_memory_bytes if fused else None,
        foreach_fits=outcome.fits,
        foreach_peak_bytes=outcome.peak_memory_bytes if outcome.fits else None,
    )
    return record, records


def _trial(size: int, outcome: TrialOutcome, step: str, variant: str) -> SearchTrialRecord:
    return trial_record(trial_of(size, outcome, step), variant)


def may_decide(search: list[SearchTrialRecord], largest: int) -> bool:
    """Whether the foreach step's extra memory could cost ``DECIDES`` of ``largest``: from the
    peaks of the smallest and the largest trial that fit (module docstring); False where the
    trials read no peaks."""
    read = sorted(
        (t.batch_size, t.peak_memory_bytes)
        for t in search
        if t.fits and t.peak_memory_bytes is not None and t.batch_size <= largest
    )
    if len(read) < 2 or read[0][0] == read[-1][0]:
        return False
    (small, low), (large, high) = read[0], read[-1]
    per_sample = (high - low) / (large - small)
    fixed = low - per_sample * small
    if per_sample <= 0:
        return fixed > 0
    return fixed / 4 / per_sample >= DECIDES * largest
