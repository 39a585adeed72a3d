"""The probe's first phase: the largest batch the base trains (``probe.variants.BASE``), in
eager mode with the profile's other settings and without the cuDNN autotuner (its warm-up,
6-9 s per new shape for ResNet-50 on an H100, would cost a minute over a search). No torch.

The search is bounded by the dataset, the user's maximum and, on the CPU, a size past which
CPU throughput no longer grows (``plan.CPU_CAP``), and by host RAM there; it starts at the
smallest batch the model trains at (``probe.smallest``). The bounds it found are the bounds of
every later search (``variant_phase.Bounds``). Where the settings checkpoint from the start
(the probe again, where not even the smallest batch trained without it), the recompute is
checked at the smallest batch once its trial trained, before the search runs any other size
with it and within the search's time (``checkpoint_phase.checked_on``): a recompute that is not
the step ends the run before a batch more trains with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_autotune.errors import DoesNotFitError, ProbeError, WorkloadError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.checkpoint_phase import checked_on
from torch_autotune.probe.guard import OVER_CAP, Found, OutOfTime, SearchGuard, search_with_guard
from torch_autotune.probe.plan import CPU_CAP, GPU_CAP, cap_reason, ram_budget
from torch_autotune.probe.seam import Progress, Trials
from torch_autotune.probe.search import Agreement
from torch_autotune.probe.smallest import Smallest, smallest_batch
from torch_autotune.probe.variant_phase import Bounds
from torch_autotune.probe.variants import BASE, search_name
from torch_autotune.probe.workloads import Workload


@dataclass
class Searched:
    """What the search found: its guard (trials and time model), the largest batch and what
    limited it, the bounds of later searches, and the smallest batch the model trains at."""

    guard: SearchGuard
    found: Found
    bounds: Bounds
    smallest: Smallest
    # where checkpointing is on from the start: the recompute's check, and the batch it ran at
    checked: tuple[Agreement | None, int] | None = None

    @property
    def largest(self) -> int:
        assert self.found.largest is not None  # search() raised otherwise
        return self.found.largest


def search(
    runner: Trials,
    workload: Workload,
    machine: HardwareSnapshot,
    budget: Budget,
    report: Progress,
    *,
    reserve_s: float,
    max_batch_size: int | None,
    multiple: int,
    fixed_shapes: bool,
) -> Searched:
    """The base's largest batch (module docstring); ``reserve_s``: seconds kept for the
    DataLoader measurement. Raises when not even the smallest batch trains."""
    settings = runner.settings.settings
    variant = search_name(BASE, settings)
    guarded = SearchGuard(runner, budget, report, reserve_s=reserve_s, variant=variant)
    device, limit = settings.device, None  # the CPU's: from what the first trial left held
    cap, why = _cap(device, max_batch_size, workload)
    name, start = workload.name, workload.min_batch_size
    if start > cap:
        raise WorkloadError(
            f"the {name} workload's smallest batch ({start}) is above the largest it may try: {why}"
        )
    if device == "cpu":  # host RAM is the CPU's memory: --memory-limit caps what a trial takes
        guarded.ram_cap_bytes = runner.settings.memory_limit_bytes
        guarded.ram_budget_bytes = ram_budget(machine)
    smallest = Smallest(1, None)
    on = settings.activation_checkpointing  # its recompute checked before it is measured
    checked: tuple[Agreement | None, int] | None = None
    with budget.phase("search"):
        runner.apply_flags(cudnn_benchmark=False)
        try:
            smallest = smallest_batch(guarded, start, cap, name=name)
        except OutOfTime:
            found = Found(None, "budget", "the budget was spent before the first trial")
        else:
            guarded.start = smallest.size
            checked = _checked_first(guarded, smallest.size, name) if on else None
            limit = runner.memory_limit() or _capped_peak(guarded)
            found = search_with_guard(guarded, cap, limit, why)
    if found.largest is None and found.limited_by in ("budget", "time"):
        raise ProbeError(
            f"the time budget ({budget.total_s:g} s) ran out before a single training "
            f"step of the {name} workload finished; give it more with --budget"
        )
    if found.largest is None:
        raise _does_not_fit(guarded, found, name, device)
    bounds = Bounds(
        cap=cap,
        cap_reason=why,
        memory_limit=limit,
        ram_budget_bytes=guarded.ram_budget_bytes,
        floor=smallest.size,
        multiple=multiple,
        fixed_shapes=fixed_shapes,
    )
    return Searched(guarded, found, bounds, smallest, checked)


def _checked_first(
    guarded: SearchGuard, floor: int, name: str
) -> tuple[Agreement | None, int] | None:
    """Where the settings checkpoint from the start: the recompute checked at ``floor``, the
    smallest batch, once its trial trained and before the search runs any other size
    (``checkpoint_phase.checked_on``), within the budget. None where ``floor`` did not train
    (nothing fits: the search says so). Raises ``ProbeError`` where the check, predicted to
    take as long as that trial took, does not fit in what is left of the budget."""
    trial = next((r for r in guarded.records if r.fits and r.batch_size == floor), None)
    if trial is None:
        return None
    budget, needed = guarded.budget, trial.seconds or 0.0
    if needed > budget.left_in_run():
        raise ProbeError(
            f"the time budget ({budget.total_s:g} s) ran out before activation checkpointing's"
            f" recompute could be checked against the plain step of the {name} workload at batch"
            f" {floor} ({needed:.1f} s predicted, {budget.left_in_run():.1f} s left), and it is"
            " used only once checked; give it more with --budget"
        )
    return checked_on(guarded.runner, floor, guarded.progress), floor


def _does_not_fit(guarded: SearchGuard, found: Found, name: str, device: str) -> DoesNotFitError:
    """Not even the smallest batch trained: it ran out of memory, or, on the CPU, it took more
    than --memory-limit (``over_cap``)."""
    over = any(r.step == OVER_CAP for r in guarded.records)
    return DoesNotFitError(
        f"the {name} workload does not train even at batch size {guarded.start} on"
        f" {device}: " + (f"{found.reason} (raise it)" if over else "it runs out of memory"),
        batch_size=guarded.start,
        over_cap=over,
        trials=tuple(guarded.records),
        took=found.reason if over else None,
    )


def _capped_peak(guarded: SearchGuard) -> int | None:
    """The CPU's: the peak a trial may reach, which the memory-guided search predicts against
    and the evidence records. Under --memory-limit, the runner's baseline (what the process
    held once its first trial had run, which every trial that fit says, and against which
    each trial's peak was held to the cap) plus the cap (the cap alone where no trial said
    what the process held), within the host RAM the probe may fill; else that host RAM."""
    cap, ram = guarded.ram_cap_bytes, guarded.ram_budget_bytes
    if cap is None:
        return ram
    held = guarded.held[max(guarded.held)] if guarded.held else 0
    return held + cap if ram is None else min(held + cap, ram)


def _cap(device: str, asked: int | None, workload: Workload) -> tuple[int, str]:
    """The largest batch the search may try, and why: the device's cap, the user's maximum
    or the workload's largest batch (its own, its dataset's samples, or each rank's share of
    them), whichever is smallest."""
    caps = [(CPU_CAP if device == "cpu" else GPU_CAP, cap_reason(device))]
    if asked is not None:
        caps.append((asked, f"the largest batch asked for ({asked})"))
    own = workload.max_batch_size
    if own is not None:
        caps.append((own, f"the workload's largest batch ({own})"))
    ranks, dataset = workload.ranks_sharing_data, workload.dataset
    if ranks > 1 and own is not None and dataset is not None:
        caps[-1] = (
            own,
            f"each rank's share of the dataset's {len(dataset)} samples over {ranks} ranks ({own})",
        )
    return min(caps)
