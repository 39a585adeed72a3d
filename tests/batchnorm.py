"""A profile as the probe leaves it for a model with BatchNorm: batch 1 raised, batch 2 trained,
so its training loader drops an epoch's last batch (``Profile.drops_last``). Built from the
profile's own settings, without tuning: the evidence holds what ``drops_last`` reads and the
search that ran its batch (a valid profile, which the store keeps)."""

from __future__ import annotations

from torch_autotune.evidence import Evidence, SearchTrialRecord, WorkloadDetails
from torch_autotune.profile import Profile

BATCH_1_RAISED = (
    "batch 1 raised ValueError: Expected more than 1 value per channel when training, got input"
    " size torch.Size([1, 64]); batch 2 trained, so the search started at 2 (--min-batch-size"
    " sets the start). An epoch's last batch below 2 raises it too:"
    " profile.dataloader_kwargs() sets drop_last=True"
)


def with_batch_one_raising(profile: Profile, batch_size: int = 512) -> Profile:
    """``profile`` measured at ``batch_size`` on a model whose batch 1 raised (BatchNorm)."""
    details = WorkloadDetails(
        source="objects",
        model="BNNet",
        batch="{features: 32 float32, labels: int64}",
        min_batch_size=2,
        min_batch_reason=BATCH_1_RAISED,
    )
    evidence = Evidence(
        workload="BNNet",
        device=profile.settings.device,
        max_batch_size=batch_size,
        fastest_batch_size=batch_size,
        batch_size=batch_size,
        limited_by="cap",
        search=(
            SearchTrialRecord(
                batch_size=1,
                fits=False,
                peak_memory_bytes=None,
                seconds=None,
                step="start",
                error=BATCH_1_RAISED.split("; ", 1)[0].removeprefix("batch 1 raised "),
            ),
            SearchTrialRecord(
                batch_size=2, fits=True, peak_memory_bytes=None, seconds=0.1, step="smallest"
            ),
            SearchTrialRecord(
                batch_size=batch_size, fits=True, peak_memory_bytes=None, seconds=0.1, step="double"
            ),
        ),
        throughput=(),
        budget_s=30.0,
        elapsed_s=1.0,
        details=details,
    )
    batch = profile.settings.batch.model_copy(update={"batch_size": batch_size})
    settings = profile.settings.model_copy(update={"batch": batch})
    return profile.model_copy(update={"evidence": evidence, "settings": settings})
