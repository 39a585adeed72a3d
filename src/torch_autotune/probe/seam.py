"""The seam between the probe's orchestration and real training steps. No torch.

``FedRunner`` (``probe.loop``: ``probe.trials.TrialRunner`` and the workload's DataLoader) is
the real implementation; ``probe.simulated.SimulatedTrials`` is a simulated machine with
recorded timings, which tests (and anyone) pass through ``tune(trials=..., clock=...)``. A
change here fails a test until the simulation follows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch_autotune.probe.fed import FedTrial
from torch_autotune.probe.fresh import FreshOutcome
from torch_autotune.probe.loader import LoaderTrial
from torch_autotune.probe.search import Agreement, TrialOutcome
from torch_autotune.probe.trials import PointOutcome, StepSettings
from torch_autotune.probe.variants import Variant

__all__ = ["Agreement", "Progress", "Trials"]

Progress = Callable[[str, str], None]
"""(phase, what is being tried); first ("budget", "120 s") once the budget is chosen."""


class Trials(Protocol):
    """The seam between the orchestration here and real training (``TrialRunner``)."""

    settings: StepSettings

    def __call__(self, batch_size: int) -> TrialOutcome: ...

    def point(
        self, batch_size: int, *, until: float, deadline: float | None = None
    ) -> PointOutcome:
        """A steady point (``TrialRunner.point``): its blocks stop at ``until``, its share;
        its first block, whatever the share, is cut only against ``deadline``, the phase's
        end (None: none)."""
        ...

    def variant(self, variant: Variant) -> Trials:
        """A runner of ``variant`` (``probe.variants``): this runner's settings with its
        changes, on this runner's model (wrapped, as torch.compile wraps it) or, where the
        variant needs one, on a model of its own."""
        ...

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None: ...

    def leaf_modules(self) -> int: ...

    @property
    def built_s(self) -> float | None:
        """Seconds its model took to build from the workload, last time (None: not built):
        what a variant with a model of its own pays again (``probe.plan``)."""
        ...

    def release_model(self) -> None:
        """Let go of this runner's model (built again when next needed) and its memory."""
        ...

    def memory_limit(self) -> int | None: ...

    def recompute_check(self, batch_size: int) -> Agreement | None:
        """One step with activation checkpointing against one without, from the same weights
        and batch (``probe.recompute``); None where the plain step ran out of memory. Raises
        ``wrapping.NotCheckpointable`` where the model cannot be checkpointed."""
        ...

    def fresh(
        self,
        environment: dict[str, str | None],
        *,
        batch: int,
        above: list[int],
        seconds: float,
        timeout_s: float,
    ) -> FreshOutcome | None:
        """This runner's trials in a fresh process with ``environment`` (``probe.fresh``); None
        where its workload cannot be built again there (objects in hand, ranks)."""
        ...

    def load(
        self, num_workers: int, batch_size: int, *, batches: int, timeout_s: float, seconds: float
    ) -> LoaderTrial:
        """The workload's DataLoader alone with ``num_workers`` workers."""
        ...

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        """Training at ``batch_size`` fed by ``num_workers`` DataLoader workers (0 workers of a
        workload without a dataset: its own batches, ``probe.own_threads``)."""
        ...
