"""The probe's runner for one rank of several: the model trains in DistributedDataParallel over
the job's data group, with the profile's DDP options (rules DP1-DP3).

A search trial runs each rank on its own gradients (``no_sync``): no collective happens inside
it, so a rank that runs out of memory leaves no other waiting in an all-reduce, and the ranks
agree on the outcome afterwards (``probe.ranks``). Its memory is DDP's all the same: the
buckets are allocated when the model is wrapped, and the gradients are views into them
(``gradient_as_bucket_view``) or beside them, as in training. A throughput point's first step,
which pays the warm-up, runs the same way and the ranks agree that it ran; its timed blocks then
all-reduce the gradients as training does, every rank running the same blocks
(``TrialRunner.agreed``). Training fed by the DataLoader runs each rank on its own gradients:
its step counts differ between ranks, which an all-reduce would hang on (a sharded model's
every step gathers from every rank, so it is not fed at all: the loader alone decides).

Before the model is wrapped, one forward and backward pass at the first trial's size finds the
parameters that get no gradient, which DDP refuses unless ``find_unused_parameters`` (DP3).
``alone()`` lets rank 0 train by itself, for the one-rank rate the scaling efficiency is
measured against (not where the model is sharded: FSDP2's forward gathers the parameters from
every rank).

Where the settings shard the model (FSDP2, rule DP4), ``fully_shard`` replaces DDP: a search
trial keeps each rank's gradients (``set_requires_gradient_sync(False)``), but its forward and
backward still all-gather the parameters, so every rank trains the same sizes together. A
step that ran out of memory leaves FSDP2 mid-step (its parameters gathered, its hooks half
run: the next step crashed the process in CI), so the model is built and sharded again after
a size that did not fit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import autocast, batch_to_device
from torch_autotune.errors import blame_user_code
from torch_autotune.probe.fed import FedTrial
from torch_autotune.probe.group import Group
from torch_autotune.probe.loop import FedRunner
from torch_autotune.probe.oom import is_out_of_memory
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.trials import BLOCK_S, MAX_SPREAD, PointOutcome, StepSettings
from torch_autotune.wrapping import parallelize

if TYPE_CHECKING:
    from typing_extensions import Self

    from torch_autotune.probe.workloads import Workload

__all__ = ["DdpRunner", "unused_parameters"]

_NOT_FED = (
    "not run: a sharded model (FSDP2) gathers its parameters from every rank at every step, "
    "and a pass fed by each rank's own loader runs as many steps as its loader allows"
)


class DdpRunner(FedRunner):
    """A ``FedRunner`` whose model trains in DDP over ``group.data`` (the module docstring)."""

    def __init__(
        self,
        workload: Workload,
        settings: StepSettings,
        *,
        clock: Callable[[], float] = time.perf_counter,
        base: DdpRunner | None = None,
        group: Group,
    ) -> None:
        super().__init__(workload, settings, clock=clock, base=base)
        self.group = group
        self._ddp: Any = None
        self._first: int | None = None  # the size it was built at: the unused-parameter pass
        self._alone = False
        self.unused_parameters: int | None = None if base is None else base.unused_parameters

    @property
    def ddp(self) -> Any:
        """The DistributedDataParallel module this runner trains (its base's, for a variant
        that wraps it again: torch.compile compiles the DDP module, as DDPOptimizer wants)."""
        base = self._base
        if self._ddp is None and isinstance(base, DdpRunner):
            return base.ddp
        return self._ddp

    def distribute(self, model: Any) -> Any:
        if self.settings.settings.fsdp.enabled:  # FSDP2 needs no unused parameters found
            self._ddp = parallelize(self.settings.settings, model, process_group=self.group.data)
            return self._ddp
        size = self._first or 1
        try:
            unused, failed = unused_parameters(self.workload, self.settings, model, size), None
        except Exception as error:  # out of memory, or an error at this size (BatchNorm at 1)
            unused, failed = 0, error
        # every rank learns how the pass went on every rank before the next collective: one
        # rank out of memory (a smaller GPU) must not leave the others waiting in this reduce
        worst = self.group.reduce(_how(failed), largest=True)
        if worst:
            self._first = None  # the next size builds the model again
            raise failed if failed is not None else _elsewhere(worst, size, self.settings.device)
        # the ranks see the same model; agreeing keeps one rank's odd result from hanging DDP
        self.unused_parameters = self.group.reduce(unused, largest=True)
        self._ddp = parallelize(
            self.settings.settings,
            model,
            process_group=self.group.data,
            find_unused_parameters=self.unused_parameters > 0,
        )
        return self._ddp

    def _stepper(self, batch_size: int, *, typical: bool = False) -> Callable[[], None]:
        if self._first is None:
            self._first = batch_size
        return super()._stepper(batch_size, typical=typical)

    def synced(self, on: bool) -> AbstractContextManager[object]:
        module = self.ddp
        if module is None or (on and not self._alone):
            return nullcontext()
        if self.settings.settings.fsdp.enabled:
            return _gradients_kept(module)
        no_sync: AbstractContextManager[object] = module.no_sync()
        return no_sync

    def __call__(self, batch_size: int) -> TrialOutcome:
        outcome = super().__call__(batch_size)
        if not outcome.fits and self.sharded:
            self.release_model()  # FSDP2 left mid-step: its next trial builds it again
        return outcome

    def point(
        self,
        batch_size: int,
        *,
        until: float,
        deadline: float | None = None,
        block_s: float = BLOCK_S,
        max_spread: float = MAX_SPREAD,
    ) -> PointOutcome:
        outcome = super().point(
            batch_size, until=until, deadline=deadline, block_s=block_s, max_spread=max_spread
        )
        if not outcome.fits and self.sharded:
            self.release_model()
        return outcome

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded (FSDP2): no rank can train it alone."""
        return self.settings.settings.fsdp.enabled

    def agreed(self, value: int, *, largest: bool) -> int:
        return value if self._alone else self.group.reduce(value, largest=largest)

    @contextmanager
    def alone(self) -> Iterator[None]:
        """This rank trains by itself: no collective, no all-reduce (the others wait). DDP
        broadcasts the buffers (BatchNorm's statistics) at the first forward after a step
        that all-reduced, ``no_sync`` or not: that flag is cleared for the while."""
        self._alone = True
        module = self.ddp
        before = getattr(module, "require_forward_param_sync", None)
        if before is not None:
            module.require_forward_param_sync = False
        try:
            with self.synced(False):
                yield
        finally:
            self._alone = False
            if before is not None:
                module.require_forward_param_sync = before

    def device_name(self) -> str:
        """What this rank trains on: its GPU's name, or the CPU."""
        if self.settings.device != "cuda":
            return self.settings.device
        import torch

        return f"{torch.cuda.get_device_name()} (cuda:{torch.cuda.current_device()})"

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        if self.sharded:  # every step gathers the parameters: the ranks must step together
            return FedTrial(batch_size, num_workers, threads, None, 0.0, _NOT_FED)
        self.model  # noqa: B018  # wrapped before no_sync is asked of it
        with self.synced(False):
            return super().fed(batch_size, num_workers, threads, seconds=seconds)

    def sibling(self, settings: StepSettings, *, base: Self | None) -> Self:
        return type(self)(self.workload, settings, clock=self.clock, base=base, group=self.group)

    def release_model(self) -> None:
        self._ddp = None
        super().release_model()


@contextmanager
def _gradients_kept(module: Any) -> Iterator[None]:
    """FSDP2's ``no_sync``: each rank keeps its own gradients (no reduce-scatter). Its forward
    and backward still all-gather the parameters: the ranks train the same sizes together."""
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def _how(failed: BaseException | None) -> int:
    """How a rank's first pass went, for the ranks to agree on: 0 it ran, 1 out of memory,
    2 it raised."""
    if failed is None:
        return 0
    return 1 if is_out_of_memory(failed) else 2


def _elsewhere(worst: int, size: int, device: str) -> BaseException:
    """What a rank whose first pass ran raises where another's did not (``worst``): out of
    memory as the other ran out, so that the size does not fit on any rank; else an error of
    the model's, as the other's was, which rank 0 handles where every rank raised."""
    where = f"on another rank, in DDP's first pass at batch {size}"
    if worst == 1:
        return (
            MemoryError(f"out of memory {where}")
            if device == "cpu"
            else RuntimeError(f"CUDA out of memory {where}")
        )
    error = RuntimeError(f"the model raised {where}")
    blame_user_code(error)
    return error


def unused_parameters(workload: Workload, settings: StepSettings, model: Any, size: int) -> int:
    """Parameters that need a gradient but got none in one forward and backward pass of
    ``model`` at ``size`` under the settings' autocast (their gradients are cleared after)."""
    batch = batch_to_device(settings.settings, _users(workload.make_batch, size))
    model.train()
    step = workload.train_step
    with autocast(settings.settings):  # a step of ours marks the user's errors itself
        ours = getattr(step, "marks_user_code", False)
        loss = step(model, batch) if ours else _users(step, model, batch)
    _users(loss.backward)
    wanted = [p for p in model.parameters() if p.requires_grad]
    unused = sum(1 for p in wanted if p.grad is None)
    model.zero_grad(set_to_none=True)
    return unused


def _users(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as error:  # the user's model, loss or data: theirs, as in a trial
        blame_user_code(error)
        raise
