"""Real training steps at one batch size: the ``fits`` the search calls, and the timer.

A trial is the step the user's training loop will run, repeated so optimizer state exists:
forward under the profile's autocast dtype, loss, backward (through the GradScaler for fp16),
optimizer step, zero_grad; with the profile's memory format and compile setting. Peak memory is
read from the allocator, reset before each trial. Out-of-memory is recognised by ``oom`` and
cleaned up outside the ``except`` block; any other error propagates with the user's traceback.

``preserved`` puts back everything the probe touches: the model's parameters and buffers, the
optimizer's state, every RNG, and torch's global flags, whether the probe succeeds, fails or is
interrupted.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import make_scaler
from torch_autotune.errors import blame_user_code
from torch_autotune.probe.oom import release_memory, run_guarded
from torch_autotune.probe.search import TrialOutcome

if TYPE_CHECKING:
    from torch_autotune.probe.workloads import Workload
    from torch_autotune.profile import Profile

DEFAULT_STEPS = 3  # Lightning's steps_per_trial; >= 2 so the optimizer's state exists (K1)


@dataclass(frozen=True)
class StepSettings:
    """How a trial trains: the parts of a profile that change memory and speed."""

    device: str = "cpu"
    autocast_dtype: str | None = None  # "float16" / "bfloat16"; None: no autocast
    grad_scaler: bool = False
    channels_last: bool = False
    compile_mode: str | None = None  # None: eager
    optimizer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    steps: int = DEFAULT_STEPS
    cudnn_benchmark: bool = False  # the cuDNN autotuner (times kernels for every new shape)
    tf32: bool | None = None  # None: torch's default; else through ``matmul_api``
    matmul_api: str | None = None

    @classmethod
    def from_profile(cls, profile: Profile, steps: int = DEFAULT_STEPS) -> StepSettings:
        s = profile.settings
        return cls(
            device=s.device,
            autocast_dtype=s.precision.dtype if s.precision.autocast else None,
            grad_scaler=s.precision.grad_scaler,
            channels_last=s.memory_format == "channels_last",
            compile_mode=s.compile.mode if s.compile.enabled else None,
            optimizer_kwargs=profile.optimizer_kwargs(),
            steps=steps,
            cudnn_benchmark=s.backends.cudnn_benchmark,
            tf32=s.matmul.tf32 if s.matmul.api is not None else None,
            matmul_api=s.matmul.api,
        )

    def describe(self) -> str:
        """'bfloat16 autocast, channels_last, compiled (default), cuDNN autotuner'."""
        parts = [f"{self.autocast_dtype} autocast" if self.autocast_dtype else "float32"]
        if self.grad_scaler:
            parts.append("GradScaler")
        if self.channels_last:
            parts.append("channels_last")
        parts.append(f"compiled ({self.compile_mode})" if self.compile_mode else "eager")
        if self.cudnn_benchmark:
            parts.append("cuDNN autotuner")
        return ", ".join(parts)


# --- putting things back -------------------------------------------------------------------------


def global_flags(torch: Any) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic.warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "num_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9: read the new API only (catalog B2)
        flags["fp32_precision"] = (
            matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.rnn.fp32_precision,
        )
    else:
        flags["allow_tf32"] = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    return flags


def restore_flags(torch: Any, flags: dict[str, Any]) -> None:
    torch.backends.cudnn.benchmark = flags["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn.deterministic"]
    torch.use_deterministic_algorithms(
        flags["deterministic"], warn_only=flags["deterministic.warn_only"]
    )
    torch.set_num_threads(flags["num_threads"])
    if "fp32_precision" in flags:
        matmul, conv, rnn = flags["fp32_precision"]
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = conv
        torch.backends.cudnn.rnn.fp32_precision = rnn
    else:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags["allow_tf32"]
        torch.set_float32_matmul_precision(flags["float32_matmul_precision"])


def _rng_states(torch: Any) -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.random.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # never start CUDA just to save its generators
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _restore_rng(torch: Any, states: dict[str, Any]) -> None:
    torch.random.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])


def _cpu_copy(state: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a state dict with tensors cloned to the CPU (the GPU stays free)."""
    import torch

    def clone(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu", copy=True)
        if isinstance(value, dict):
            return {k: clone(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(clone(v) for v in value)
        return copy.deepcopy(value)

    return {key: clone(value) for key, value in state.items()}


@contextmanager
def preserved(model: Any = None, optimizer: Any = None) -> Iterator[None]:
    """Put back the model's weights, the optimizer's state, every RNG and torch's global flags
    on the way out, however the block ends (success, error, KeyboardInterrupt)."""
    import torch

    flags = global_flags(torch)
    rng = _rng_states(torch)
    model_state = None if model is None else _cpu_copy(model.state_dict())
    optimizer_state = None if optimizer is None else _cpu_copy(optimizer.state_dict())
    try:
        yield
    finally:
        if model is not None and model_state is not None:
            model.load_state_dict(model_state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        _restore_rng(torch, rng)
        restore_flags(torch, flags)


# --- the trial -----------------------------------------------------------------------------------


def _peak_reset(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def process_peak_rss() -> int | None:
    """The process's resident-set high-water mark in bytes (Unix), None where unknown.

    The CPU allocator keeps no peak of its own. The high-water mark never goes down, so it is
    the peak of the largest trial run so far: the search grows the batch, so for the trials
    that matter it is that trial's peak (plus the interpreter and torch themselves).
    """
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS bytes, Linux KiB


def _peak_read(torch: Any, device: str) -> int | None:
    """Peak bytes the allocator held during the trial (reserved: what can run out)."""
    if device == "cuda":
        return int(torch.cuda.max_memory_reserved())
    if device == "mps":
        return int(torch.mps.driver_allocated_memory())  # no peak counter on MPS: the current
    return process_peak_rss()


def device_memory_limit(device: str) -> int | None:
    """Bytes the trials may use on the device: what is free plus what torch already holds.

    ``mem_get_info`` counts other processes and the CUDA context (catalog D4, K5); None off
    CUDA, where the search falls back to doubling.
    """
    if device != "cuda":
        return None
    import torch

    free, _total = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved())


def sync_device(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


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


MIN_BLOCKS = 3  # a point is steady when this many timed blocks in a row agree
BLOCK_S = 0.25  # each block trains for about this long
MAX_SPREAD = 0.05  # ... within 5% of their median


def spread(rates: Sequence[float]) -> float:
    """(max - min) / median; 0 for fewer than two rates."""
    if len(rates) < 2:
        return 0.0
    middle = statistics.median(rates)
    return (max(rates) - min(rates)) / middle if middle > 0 else math.inf


class TrialRunner:
    """Real training steps at one batch size: ``runner(batch_size)`` (a search trial) and
    ``runner.point(batch_size, until=...)`` (steady throughput).

    The model is built once (``workload.make_model()``), moved to the device and put in the
    profile's memory format; ``compiled(mode)`` gives a runner of the same model under
    ``torch.compile`` with the batch dimension marked dynamic, so that it compiles once and
    every later batch size reuses the compiled code (on an H100, ResNet-50: 80 s to compile,
    then 0.2 s for each new size; a static compile recompiles at the second size). Each trial
    makes a fresh optimizer, so its state is created inside the trial, as in the first steps
    of real training. Global flags (cuDNN autotuner, TF32) are set by ``apply_flags``; the
    caller restores them (``preserved``).
    """

    def __init__(
        self,
        workload: Workload,
        settings: StepSettings,
        *,
        clock: Callable[[], float] = time.perf_counter,
        eager: TrialRunner | None = None,
    ) -> None:
        self.workload = workload
        self.settings = settings
        self.clock = clock
        self._eager = eager
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            import torch

            if self._eager is not None:
                self._model = torch.compile(self._eager.model, mode=self.settings.compile_mode)
            else:
                model = self.workload.make_model().to(self.settings.device)
                if self.settings.channels_last:
                    model = model.to(memory_format=torch.channels_last)
                if self.settings.compile_mode is not None:
                    model = torch.compile(model, mode=self.settings.compile_mode)
                self._model = model
        return self._model

    def memory_limit(self) -> int | None:
        """Bytes the trials may use on the device (``device_memory_limit``)."""
        return device_memory_limit(self.settings.device)

    def leaf_modules(self) -> int:
        """Modules without children in the model: what torch.compile has to trace."""
        return sum(1 for module in self.model.modules() if not next(module.children(), None))

    def compiled(self, mode: str) -> TrialRunner:
        """A runner of this (eager) runner's model under ``torch.compile(mode=mode)``."""
        return TrialRunner(
            self.workload, replace(self.settings, compile_mode=mode), clock=self.clock, eager=self
        )

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None:
        """Set the cuDNN autotuner and TF32 as the settings say, the autotuner overridden by
        ``cudnn_benchmark`` when given; the caller restores them (``preserved``)."""
        import torch

        from torch_autotune.apply import apply_matmul

        benchmark = self.settings.cudnn_benchmark if cudnn_benchmark is None else cudnn_benchmark
        torch.backends.cudnn.benchmark = benchmark
        if self.settings.tf32 is not None:
            apply_matmul(torch, self.settings.matmul_api, self.settings.tf32)

    def _inputs(self, batch_size: int) -> tuple[Any, Any]:
        import torch

        inputs, targets = self.workload.make_batch(batch_size)
        device = self.settings.device
        if self.settings.channels_last and inputs.dim() == 4:
            inputs = inputs.to(device, memory_format=torch.channels_last)
        else:
            inputs = inputs.to(device)
        targets = targets.to(device)
        if self._eager is not None:
            mark_dynamic_batch(torch, inputs, targets)
        return inputs, targets

    def _stepper(self, batch_size: int) -> Callable[[], None]:
        """One training step at ``batch_size`` per call, synchronised with the device."""
        import torch

        s = self.settings
        model = self.model
        model.train()
        scaler = make_scaler(torch, s.device, enabled=s.grad_scaler)
        try:
            optimizer = make_optimizer(self.workload, model, s.optimizer_kwargs)
            batch = self._inputs(batch_size)
        except Exception as error:  # the user's optimizer factory or data
            blame_user_code(error)
            raise

        def step() -> None:
            train_step(
                torch,
                self.workload,
                batch,
                model=model,
                optimizer=optimizer,
                scaler=scaler,
                device=s.device,
                dtype=s.autocast_dtype,
            )
            sync_device(torch, s.device)

        return step

    def _timed(self, step: Callable[[], None], count: int = 1) -> float:
        started = self.clock()
        for _ in range(count):
            step()
        return self.clock() - started

    def steps(self, batch_size: int) -> tuple[float, float]:
        """Run ``settings.steps`` steps; (first step's extra seconds, median later step)."""
        import torch

        sync_device(torch, self.settings.device)
        step = self._stepper(batch_size)
        first = self._timed(step)
        later = [self._timed(step) for _ in range(max(1, self.settings.steps - 1))]
        steady = statistics.median(later)
        return max(0.0, first - steady), steady

    def __call__(self, batch_size: int) -> TrialOutcome:
        import torch

        device = self.settings.device
        _peak_reset(torch, device)
        timed, oom = run_guarded(lambda: self.steps(batch_size))
        peak = None if oom is not None else _peak_read(torch, device)
        release_memory(device)  # outside any except block: the failed step's frames are gone
        if oom is not None or timed is None:
            return TrialOutcome(False)
        warmup, step = timed
        return TrialOutcome(
            True, peak, warmup + self.settings.steps * step, warmup_s=warmup, step_s=step
        )

    def point(
        self,
        batch_size: int,
        *,
        until: float,
        block_s: float = BLOCK_S,
        max_spread: float = MAX_SPREAD,
    ) -> PointOutcome:
        """Train at ``batch_size`` until ``MIN_BLOCKS`` timed blocks in a row agree within
        ``max_spread``, or until the clock reaches ``until`` (then the point is not steady).

        Two untimed steps come first: the first pays the new shape's warm-up (compile, the
        cuDNN autotuner), the second measures a steady step to size the blocks.
        """
        import torch

        device = self.settings.device
        began = self.clock()
        _peak_reset(torch, device)
        result, oom = run_guarded(lambda: self._point(batch_size, until, block_s, max_spread))
        peak = None if oom is not None else _peak_read(torch, device)
        release_memory(device)
        if oom is not None or result is None:
            return PointOutcome(batch_size, False, seconds=self.clock() - began)
        return replace(result, peak_memory_bytes=peak, seconds=self.clock() - began)

    def _point(
        self, batch_size: int, until: float, block_s: float, max_spread: float
    ) -> PointOutcome:
        import torch

        sync_device(torch, self.settings.device)
        step = self._stepper(batch_size)
        first = self._timed(step)
        one = max(self._timed(step), 1e-9)
        per_block = max(1, math.ceil(block_s / one))
        # A step as long as a block is a block: on a slow device it is the first one.
        rates: list[float] = [batch_size / one] if per_block == 1 else []
        while True:
            elapsed = self._timed(step, per_block)
            if elapsed > 0:
                rates.append(per_block * batch_size / elapsed)
            recent = rates[-MIN_BLOCKS:]
            if len(recent) == MIN_BLOCKS and spread(recent) <= max_spread:
                break
            if self.clock() + max(elapsed, one) > until or len(rates) >= 1000:
                break
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


def mark_dynamic_batch(torch: Any, *tensors: Any) -> None:
    """Mark dim 0 of ``tensors`` dynamic for torch.compile, so a compiled model compiles once
    for every batch size (``maybe_mark_dynamic``: no error where the model specialises it)."""
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None) or torch._dynamo.mark_dynamic
    for tensor in tensors:
        if tensor.dim() > 0:
            mark(tensor, 0)


def make_optimizer(workload: Workload, model: Any, options: Mapping[str, Any]) -> Any:
    """The workload's optimizer over ``model``'s parameters with ``options`` (``fused=True``),
    or without them when the user's optimizer factory takes none."""
    kwargs = dict(options)
    accepts = getattr(workload, "optimizer_accepts", None)
    if kwargs and accepts is not None and not accepts(**kwargs):
        kwargs = {}
    return workload.make_optimizer(model.parameters(), **kwargs)


def train_step(
    torch: Any,
    workload: Workload,
    batch: tuple[Any, Any],
    *,
    model: Any,
    optimizer: Any,
    scaler: Any,
    device: str,
    dtype: str | None,
) -> None:
    """One step as the user's loop runs it: forward and loss under autocast (``dtype`` None:
    off), backward through the scaler, optimizer step, zero_grad."""
    inputs, targets = batch
    autocast_dtype = getattr(torch, dtype) if dtype else None
    try:
        with torch.autocast(device_type=device, dtype=autocast_dtype, enabled=dtype is not None):
            loss = workload.loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    except Exception as error:  # the user's model, loss or optimizer: marked, re-raised as is
        blame_user_code(error)
        raise
