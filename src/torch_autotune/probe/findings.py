"""What a probe run found, as the profile's evidence: every trial, point and phase, what limited
the search, how the batch was chosen, the settings each variant ran with. No torch.
"""

from __future__ import annotations

from typing import Protocol

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.guard import Found
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.smallest import Smallest, workload_details
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import (
    AllocatorRecord,
    BatchChoice,
    CompileRecord,
    Evidence,
    OptimizerMemoryRecord,
    Profile,
    SearchTrialRecord,
    ThroughputRecord,
    VariantRecord,
)

__all__ = ["RunState", "epoch_note", "run_evidence"]


class RunState(Protocol):
    """What a probe run holds (``probe.run._Run``): what its phases read, and what they found
    when they are done."""

    rules_only: Profile
    runner: Trials
    workload: Workload
    settings: StepSettings
    budget: Budget
    warnings: list[str]
    search: list[SearchTrialRecord]
    records: list[ThroughputRecord]
    variants: dict[str, VariantRecord]
    compile: CompileRecord | None
    optimizer_memory: OptimizerMemoryRecord | None
    allocator: AllocatorRecord | None
    smallest: Smallest
    limit: int | None

    @property
    def report(self) -> Progress:
        """Where the phases say what they try."""
        ...


def run_evidence(
    run: RunState, found: Found, *, batch: int, fastest: int, choice: BatchChoice
) -> Evidence:
    """What the run measured, as the profile's evidence (the DataLoader's part added after)."""
    assert found.largest is not None
    details = workload_details(run.workload, run.smallest)
    note = epoch_note(run.workload, batch, drops_last=bool(details and details.raised_below))
    if note is not None:
        run.warnings.append(note)
    unused = run.budget.left_in_run()  # a skip that fits in it was a phase's share's, not the run's
    unsaid = [s.words() for s in run.budget.skipped if not s.warned and s.predicted_s > unused]
    if unsaid:  # what the time left could not hold, and no warning of its own said
        run.warnings.append(
            f"the run used {run.budget.elapsed():.0f} s of its {run.budget.total_s:.0f} s "
            f"budget and left out for time: {'; '.join(unsaid)}; more time (--budget) measures "
            "more"
        )
    return Evidence(
        workload=run.workload.name,
        device=run.settings.device,
        max_batch_size=found.largest,
        fastest_batch_size=fastest,
        batch_size=batch,
        limited_by=found.limited_by,
        limit_reason=found.reason,
        search=tuple(run.search),
        throughput=tuple(run.records),
        budget_s=run.budget.total_s,
        elapsed_s=round(run.budget.elapsed(), 3),
        memory_limit_bytes=run.limit,
        phases=run.budget.records(),
        compile=run.compile,
        optimizer_memory=run.optimizer_memory,
        allocator=run.allocator,
        warnings=tuple(run.warnings),
        details=details,
        batch_choice=choice,
        variants=tuple(run.variants.values()),
    )


def epoch_note(workload: Workload, batch: int, *, drops_last: bool) -> str | None:
    """What the batch leaves of an epoch where it is more than half of the samples each
    process draws (its dataset, shared by the ranks): one optimizer step an epoch, and with
    ``drop_last`` none at all on a training set smaller than the batch (a split of the data it
    was tuned on). None where an epoch has two steps or more."""
    dataset = workload.dataset
    if dataset is None:
        return None
    samples = -(-len(dataset) // max(workload.ranks_sharing_data, 1))
    if batch * 2 <= samples:
        return None
    whose = "each rank draws" if workload.ranks_sharing_data > 1 else "the dataset holds"
    note = (
        f"batch {batch} is more than half of the {samples} samples {whose}: an epoch has one "
        "optimizer step of it"
    )
    if drops_last:
        note += (
            " and, with drop_last (batch 1 does not train, so the profile drops an epoch's last "
            f"batch), a training set of fewer than {batch} samples has none"
        )
    cap = "--max-batch-size, or tune()'s max_batch_size"
    return f"{note}; tune on the data you train on, or cap the batch ({cap})"
