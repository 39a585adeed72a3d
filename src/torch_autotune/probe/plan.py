"""The bounds of a probe run and its plan after the search: the largest batch tried and why,
the host RAM a CPU probe may fill, and the seconds set aside for each phase after the search
(the multiple batch sizes are rounded to is the profile's, ``Profile.topology``). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.points import THROUGHPUT_POINTS
from torch_autotune.probe.seam import Trials
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.trials import MIN_BLOCKS
from torch_autotune.probe.variants import Variant

CPU_CAP = 512  # on the CPU memory rarely limits; throughput flattens long before this
GPU_CAP = 1 << 16


def cap_reason(device: str) -> str:
    """Why the device's own cap bounds the search, for the evidence."""
    if device == "cpu":
        return (
            f"the CPU cap of {CPU_CAP}: CPU throughput stops growing long before, and memory "
            "rarely limits (--max-batch-size raises or lowers it)"
        )
    return f"the cap of {GPU_CAP} (--max-batch-size sets another)"


def ram_budget(machine: HardwareSnapshot) -> int | None:
    """Host RAM a CPU probe may fill: 70% of what is available (or of the container limit)."""
    host = machine.host
    known = [v for v in (host.memory_available_bytes, host.memory_limit_bytes) if v]
    return int(0.7 * min(known)) if known else None


VARIANT_SEARCH_TRIALS = 5  # a variant's own search: its start, the model, a prediction, ...


@dataclass
class Plan:
    """What the run measures after the search, and the seconds set aside for each."""

    variant: Variant | None  # the variant measured (None: none is)
    predicted_s: float  # its one-off cost, predicted
    variant_s: float  # seconds set aside for it
    workers_s: float
    confirm_s: float
    note: str | None  # why a variant the rules want is not measured

    def throughput_s(self, left_s: float, model: TimeModel, smallest: int) -> float:
        """The throughput phase's seconds of the ``left_s`` left in the run: less what the
        variant, the workers and the confirmation keep. Where that is too short for the
        shortest point (a warm-up and three steps, predicted) of the ``smallest`` candidate,
        the confirmation's seconds are the phase's too: a point that runs confirms the batch
        it recommends and no confirmation runs after it (``probe.run``), so they would be left
        unused (a busy 2-core CPU: 24 s of a 60 s run, no point, batch 512 not chosen for its
        speed)."""
        share = left_s - self.variant_s - self.workers_s
        shortest = model.predict(smallest, 3)
        need = shortest.seconds if shortest is not None else 0.0
        return share if share - self.confirm_s < need else share - self.confirm_s


def plan(
    variant: Variant | None,
    runner: Trials,
    *,
    budget: Budget,
    model: TimeModel,
    top: int,
    steps: int,
    workers_s: float,
) -> Plan:
    """The plan after a search whose top candidate is ``top``: ``variant`` measured only where
    its predicted one-off cost, its own search (where it changes memory) and its points fit in
    what is left after the workers and the confirmation."""
    confirm = model.predict(top, steps)
    confirm_s = confirm.seconds if confirm else 0.0
    point = model.predict(top, 2 + MIN_BLOCKS)
    point_s = point.seconds if point else 0.0
    if variant is None:
        return Plan(None, 0.0, 0.0, workers_s, confirm_s, None)
    predicted = variant.warmup_s(runner.leaf_modules()) + variant.builds * (runner.built_s or 0.0)
    variant_s = predicted + 2 * point_s
    if variant.changes_memory:
        variant_s += VARIANT_SEARCH_TRIALS * confirm_s
    left = budget.left_in_run() - workers_s - confirm_s
    if variant_s + THROUGHPUT_POINTS * point_s > left:
        note = (
            f"{variant.label} was predicted to take about {predicted:.0f} s {variant.paid_for}"
            f" and {variant_s - predicted:.0f} s to measure, and {max(0.0, left):.0f} s were left"
            " for it; give it more time with --budget"
        )
        return Plan(None, predicted, 0.0, workers_s, confirm_s, note)
    return Plan(variant, predicted, variant_s, workers_s, confirm_s, None)
