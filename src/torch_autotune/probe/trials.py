"""Real training steps at one batch size: the ``fits`` the search calls, and steady points.

A trial is the step the user's training loop will run, repeated so optimizer state exists:
forward under the profile's autocast, loss, backward (through the GradScaler for fp16),
optimizer step, zero_grad; with the profile's memory format and compile setting. Every one of
those is ``torch_autotune.apply`` applied to the profile's ``Settings``, as in the user's
script, and ``probe.step.train_step`` is that step, for the bench's loop too. Steps are timed
by the one ``Timer`` (``probe.timing``). Peak memory is read from the allocator, reset before
each trial. Out-of-memory is recognised by ``oom`` and cleaned up outside the ``except``
block; any other error propagates with the user's traceback. ``probe.state.preserved`` puts
back what the probe touches.

Several training processes (``probe.ddp``) train the same steps in DistributedDataParallel:
the runner's hooks ``distribute``, ``synced`` and ``agreed`` are where they differ from one.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import (
    apply_flags,
    batch_to_device,
    compile_model,
    grad_scaler,
    optimizer_kwargs,
    prepare_model,
)
from torch_autotune.errors import blame_user_code
from torch_autotune.evidence import STEADY_BLOCKS
from torch_autotune.probe.memory import (
    device_memory_limit,
    grown_since,
    held_now,
    peak_read,
    peak_reset,
)
from torch_autotune.probe.oom import release_memory, run_guarded
from torch_autotune.probe.search import Agreement, TrialOutcome
from torch_autotune.probe.step import make_optimizer, train_step
from torch_autotune.probe.timing import Timer
from torch_autotune.settings import Compile, Settings, torch_defaults

if TYPE_CHECKING:
    from typing_extensions import Self

    from torch_autotune.probe.variants import Variant
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.profile import Profile

DEFAULT_STEPS = 3  # Lightning's steps_per_trial; >= 2 so the optimizer's state exists (K1)


@dataclass(frozen=True)
class StepSettings:
    """How a trial trains: a profile's ``Settings``, and how many steps a trial runs."""

    settings: Settings = field(default_factory=torch_defaults)
    steps: int = DEFAULT_STEPS
    memory_limit_bytes: int | None = None  # --memory-limit: the device memory a trial may use

    @classmethod
    def from_profile(cls, profile: Profile, steps: int = DEFAULT_STEPS) -> StepSettings:
        limit = profile.provenance.preferences.memory_limit_bytes
        return cls(profile.settings, steps, limit)

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def compile_mode(self) -> str | None:
        """torch.compile's mode; None: eager."""
        return self.settings.compile.mode if self.settings.compile.enabled else None

    @property
    def cudnn_benchmark(self) -> bool:
        """The cuDNN autotuner (times kernels for every new shape)."""
        return self.settings.backends.cudnn_benchmark

    def with_variant(self, variant: Variant) -> StepSettings:
        """The same steps with ``variant``'s settings (``probe.variants``)."""
        return replace(self, settings=variant.settings(self.settings))


# --- the trial -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PointOutcome:
    """Steady throughput at one batch size (``fits`` False: it ran out of memory)."""

    batch_size: int
    fits: bool
    samples_per_s: float | None = None  # median over the timed blocks
    relative_spread: float | None = None  # (max - min) / median of the last ``MIN_BLOCKS``
    steady: bool = False  # the last blocks agreed within ``max_spread``
    warmup_s: float | None = None  # first step minus a steady step (compile, autotuner, ...)
    step_s: float | None = None  # one steady step
    blocks: int = 0
    peak_memory_bytes: int | None = None
    seconds: float = 0.0  # wall time of the whole point, warm-up included


MIN_BLOCKS = STEADY_BLOCKS  # a point is steady when this many timed blocks in a row agree
BLOCK_S = 0.25  # each block trains for about this long
MAX_SPREAD = 0.05  # ... within 5% of their median


def spread(rates: Sequence[float]) -> float:
    """(max - min) / median; 0 for fewer than two rates."""
    if len(rates) < 2:
        return 0.0
    middle = statistics.median(rates)
    return (max(rates) - min(rates)) / middle if middle > 0 else math.inf


def one_off_warmup(settings: StepSettings) -> bool:
    """Whether a new shape's first step pays more than a step: a compile, or the cuDNN
    autotuner on a GPU (seconds, for steps of a fraction of one); on a CPU, eager, it is one."""
    return settings.settings.compile.enabled or (
        settings.device == "cuda" and settings.cudnn_benchmark
    )


class TrialRunner:
    """Real training steps at one batch size: ``runner(batch_size)`` (a search trial) and
    ``runner.point(batch_size, until=...)`` (steady throughput).

    The model is built once on the device (``workload.model_on``) and prepared as
    the settings say (``apply.prepare_model``); ``variant(v)`` gives a runner of a variant
    (``probe.variants``): on the same model, prepared again with the variant's settings (under
    ``torch.compile``, the batch dimension marked dynamic, so that it compiles once and every
    later batch size reuses the compiled code), or on a model of its own where the variant
    needs one (the base's is released first, so two never share the device). Each trial makes
    a fresh optimizer, so its state is created inside the trial, as in the first steps of real
    training. Global flags (cuDNN autotuner, TF32) are set by ``apply_flags``; the caller
    restores them (``preserved``).
    """

    def __init__(
        self,
        workload: Workload,
        settings: StepSettings,
        *,
        clock: Callable[[], float] = time.perf_counter,
        base: TrialRunner | None = None,
    ) -> None:
        self.workload = workload
        self.settings = settings
        self.clock = clock
        self._base = base
        self._model: Any = None
        self._timer: Timer | None = None
        self.built_s: float | None = None  # the seam's: its model's last build, in seconds
        # CPU under --memory-limit: what the process held once its first trial had run
        # (``__call__``), the one baseline every trial's peak is held to
        self.baseline_bytes: int | None = None

    @property
    def timer(self) -> Timer:
        """The timer on the trials' device (made when the first step is timed)."""
        if self._timer is None:
            self._timer = Timer(self.settings.device, clock=self.clock)
        return self._timer

    @property
    def model(self) -> Any:
        if self._model is None:
            settings = self.settings.settings
            if self._base is not None:  # already on the device, prepared as the base's
                self._model = prepare_model(settings, self._base.model)
            else:  # the memory format, then the process group's wrapper, then compile
                began = self.clock()
                model = self.workload.model_on(self.settings.device)
                self.built_s = self.clock() - began
                eager = settings.model_copy(update={"compile": Compile()})
                self._model = compile_model(settings, self.distribute(prepare_model(eager, model)))
        return self._model

    def distribute(self, model: Any) -> Any:
        """The model as the training processes train it: as it is in one process; a runner
        of several (``probe.ddp``) wraps it in DistributedDataParallel."""
        return model

    def synced(self, on: bool) -> AbstractContextManager[object]:
        """A context where the gradients are averaged across the training processes (``on``)
        or each process keeps its own (no communication: what a search trial measures, so
        that a rank that runs out of memory leaves none waiting). One process: nothing."""
        return nullcontext()

    def agreed(self, value: int, *, largest: bool) -> int:
        """``value`` as every training process agrees on it: the largest (``largest``) or the
        smallest of theirs. One process: its own."""
        return value

    def memory_limit(self) -> int | None:
        """Bytes the trials may use on the device (``device_memory_limit``), within the cap."""
        return device_memory_limit(self.settings.device, self.settings.memory_limit_bytes)

    def leaf_modules(self) -> int:
        """Modules without children in the model: what torch.compile has to trace."""
        return sum(1 for module in self.model.modules() if not next(module.children(), None))

    def variant(self, variant: Variant) -> Self:
        """A runner of ``variant``, of this runner's class (the class docstring)."""
        if variant.fresh_model:
            self.release_model()
        settings = self.settings.with_variant(variant)
        runner = self.sibling(settings, base=None if variant.fresh_model else self)
        runner.baseline_bytes = self.baseline_bytes  # the same process: the same baseline
        return runner

    def sibling(self, settings: StepSettings, *, base: Self | None) -> Self:
        """A runner of this class with ``settings``, on ``base``'s model where given."""
        return type(self)(self.workload, settings, clock=self.clock, base=base)

    def recompute_check(self, batch_size: int, *, keep_model: bool = False) -> Agreement | None:
        """The seam's (``probe.recompute``), on a model of its own: this runner's is let go
        first, so that a model that barely fits is not on the device twice (``keep_model``:
        not, where other processes hold theirs in step with it: a job's ranks). Where the
        plain step runs out of memory, or on the CPU takes more than --memory-limit (nothing
        raises there), one block of each kind alone."""
        import torch

        from torch_autotune.probe.recompute import (
            checkpointed_blocks_agree,
            checkpointed_step_agrees,
        )

        if not keep_model:
            self.release_model()
        device, cap = self.settings.device, self.settings.memory_limit_bytes
        held: list[int | None] = [None]

        def built() -> Any:  # what the process holds once the check's model is built: a
            model = self.workload.make_model()  # search trial's growth is beyond its model
            if cap is not None:
                held[0] = held_now(torch, device)
            return model

        workload = replace(self.workload, make_model=built)
        for check in (checkpointed_step_agrees, checkpointed_blocks_agree):
            held[0] = None
            checked, oom = run_guarded(partial(check, workload, self.settings, batch_size))
            taken = grown_since(torch, device, held[0])
            release_memory(device)
            if oom is None and (cap is None or taken is None or taken <= cap):
                return checked
        return None

    def release_model(self) -> None:
        """Let go of the model (it is built again when next needed) and the memory it held."""
        self._model = None
        release_memory(self.settings.device)

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None:
        """Set the cuDNN autotuner and TF32 as the settings say, the autotuner overridden by
        ``cudnn_benchmark`` when given; the caller restores them (``preserved``). The thread
        count stays the process's."""
        apply_flags(self.settings.settings, cudnn_benchmark=cudnn_benchmark, threads=False)

    def _stepper(self, batch_size: int, *, typical: bool = False) -> Callable[[], None]:
        """One training step at ``batch_size`` per call, synchronised with the device; on the
        workload's largest batches (a search trial), or on batches as training draws them
        (``typical``: a throughput point)."""
        settings = self.settings.settings
        model = self.model
        model.train()
        scaler = grad_scaler(settings)
        options = optimizer_kwargs(settings)  # ours, like the scaler and batch_to_device: a
        try:  # failure there is a bug of torch-autotune (exit 1), never the user's (exit 5)
            optimizer = make_optimizer(self.workload, model, options)
            make = (self.workload.typical_batch if typical else None) or self.workload.make_batch
            made = make(batch_size)
        except Exception as error:  # the user's optimizer factory or data
            blame_user_code(error)
            raise
        batch = batch_to_device(settings, made)
        timer = self.timer

        def step() -> None:
            train_step(
                self.workload, batch, settings, model=model, optimizer=optimizer, scaler=scaler
            )
            timer.sync()

        return step

    def steps(self, batch_size: int) -> tuple[float, float]:
        """Run ``settings.steps`` steps, each process on its own gradients (``synced``);
        (first step's extra seconds, median later step)."""
        self.timer.sync()
        step = self._stepper(batch_size)
        with self.synced(False):
            first = self.timer.seconds(step)
            later = [self.timer.seconds(step) for _ in range(max(1, self.settings.steps - 1))]
        steady = statistics.median(later)
        return max(0.0, first - steady), steady

    def __call__(self, batch_size: int) -> TrialOutcome:
        """A trial: ``settings.steps`` steps at ``batch_size``; on the CPU under --memory-limit
        its peak is held to the runner's one baseline plus the cap (``_baseline``)."""
        import torch

        device = self.settings.device
        own = peak_reset(torch, device)  # held: after the reset, what the process holds now
        held = peak_read(torch, device) if own and device == "cpu" else None
        timed, oom = run_guarded(lambda: self.steps(batch_size))
        peak = None if oom is not None else peak_read(torch, device)
        release_memory(device)  # outside any except block: the failed step's frames are gone
        if oom is not None or timed is None:
            return TrialOutcome(False)
        warmup, step = timed
        cap = self.settings.memory_limit_bytes
        held = self._baseline(torch, held) if cap is not None else held
        if cap is not None and peak is not None and held is not None and peak - held > cap:
            # took more than --memory-limit: as on a capped GPU, with the time it took
            return TrialOutcome(False, peak, warmup + self.settings.steps * step, held_bytes=held)
        return TrialOutcome(
            True,
            peak,
            warmup + self.settings.steps * step,
            warmup_s=warmup,
            step_s=step,
            held_bytes=held,
        )

    def _baseline(self, torch: Any, held: int | None) -> int | None:
        """What the process held once its first trial had run (``held``: as it began, the
        least): the model, and what torch's first step keeps for good (about 0.1 GiB for a
        small convnet), outside --memory-limit as the CUDA context is on a GPU. One for every
        trial: each one's growth from its own start let later trials peak past the limit."""
        if held is None:  # no peak of the trial's own (the mark cannot be reset)
            return None
        if self.baseline_bytes is None:
            self.baseline_bytes = max(held, held_now(torch, self.settings.device) or held)
        return self.baseline_bytes

    def point(
        self,
        batch_size: int,
        *,
        until: float,
        deadline: float | None = None,
        block_s: float = BLOCK_S,
        max_spread: float = MAX_SPREAD,
    ) -> PointOutcome:
        """Train at ``batch_size`` until ``MIN_BLOCKS`` timed blocks in a row agree within
        ``max_spread``, or until the next block would end past ``until`` (its share of its phase;
        then the point is not steady). Two steps come first: the first pays the new shape's warm-up
        (compile, the cuDNN autotuner), the second, timed, sizes the blocks (where a step is as long
        as a block, it is the first block). The first block runs whatever ``until`` says (a warm-up
        that spent the point's share still gets its one block), but only against ``deadline`` (the
        phase's end, None: none), which no block is begun past and no block ends past: the first
        block is cut to the steps that end by then, and where none does, the sizing step stands as
        its one block. Where the warm-up ran past the deadline, no step is timed (no rate), but
        where it paid more than a step (``one_off_warmup``: the cuDNN autotuner's 8.1 s on an H100,
        for steps of 0.2 s) the sizing step runs, the point's one block.
        """
        import torch

        device = self.settings.device
        began = self.clock()
        peak_reset(torch, device)
        warm, oom = run_guarded(lambda: self._warm(batch_size))
        # Every process ran its first step, or none goes on: the steps after it communicate.
        if self.agreed(int(oom is None and warm is not None), largest=False) and warm:
            result, oom = run_guarded(
                lambda: self._point(
                    batch_size,
                    warm,
                    (until, math.inf if deadline is None else deadline),
                    block_s=block_s,
                    max_spread=max_spread,
                )
            )
        else:
            result = None
        peak = None if oom is not None else peak_read(torch, device)
        release_memory(device)
        if oom is not None or result is None:
            return PointOutcome(batch_size, False, seconds=self.clock() - began)
        return replace(result, peak_memory_bytes=peak, seconds=self.clock() - began)

    def _warm(self, batch_size: int) -> tuple[Callable[[], None], float]:
        """The point's first step, which pays the new shape's warm-up (compile, the cuDNN
        autotuner, the optimizer's state), each process on its own gradients; (the step,
        its seconds)."""
        self.timer.sync()
        step = self._stepper(batch_size, typical=True)
        with self.synced(False):
            return step, self.timer.seconds(step)

    def _point(
        self,
        batch_size: int,
        warm: tuple[Callable[[], None], float],
        ends: tuple[float, float],
        *,
        block_s: float,
        max_spread: float,
    ) -> PointOutcome:
        """``point``'s blocks; ``ends``: (``until``, ``deadline``)."""
        (step, first), (until, deadline) = warm, ends
        past = self.clock() >= deadline and not one_off_warmup(self.settings)
        if self.agreed(int(past), largest=True):  # its warm-up ran to it: see ``point``
            return PointOutcome(batch_size, True)
        one = max(self.timer.seconds(step), 1e-9)
        per_block = self.agreed(max(1, math.ceil(block_s / one)), largest=True)
        # A step as long as a block is a block: on a slow device it is the first one.
        rates: list[float] = [batch_size / one] if per_block == 1 else []
        block, ran = per_block * one, 0  # the next block's seconds, as the last ran
        while True:  # every process runs the same blocks: they stop together
            recent = rates[-MIN_BLOCKS:]
            steady = len(recent) == MIN_BLOCKS and spread(recent) <= max_spread
            if ran:  # a later block: none begun that ends past the point's share or the deadline
                count = per_block
                late = self.clock() + max(block, one) > min(until, deadline) or ran >= 1000
            else:  # the first: whatever the share, cut to the steps that end by the deadline
                fit = (deadline - self.clock()) / one
                count = per_block if fit >= per_block else max(0, int(fit))
                late = count < 1
            if self.agreed(2 * late + (not steady), largest=True) != 1:
                break  # all steady, or one out of time
            count = self.agreed(count, largest=False)
            elapsed, ran = self.timer.seconds(step, count), ran + 1
            block = elapsed * per_block / count
            if elapsed > 0:
                rates.append(count * batch_size / elapsed)
        rates = rates or [batch_size / one]  # no step of its first block ended by the deadline
        recent = rates[-MIN_BLOCKS:]
        return PointOutcome(
            batch_size,
            True,
            samples_per_s=statistics.median(recent) if recent else None,
            relative_spread=spread(recent) if len(recent) >= 2 else None,
            steady=len(recent) == MIN_BLOCKS and spread(recent) <= max_spread,
            warmup_s=max(0.0, first - one),
            step_s=one,
            blocks=len(rates),
        )
