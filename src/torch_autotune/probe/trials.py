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
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import make_scaler
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
        )


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


class TrialRunner:
    """``runner(batch_size)`` trains a few real steps and says whether they fit in memory.

    The model is built once (``workload.make_model()``), moved to the device, put in the
    profile's memory format and compiled; each trial makes a fresh optimizer, so its state is
    created inside the trial, as in the first steps of real training.
    """

    def __init__(
        self,
        workload: Workload,
        settings: StepSettings,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.workload = workload
        self.settings = settings
        self.clock = clock
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            import torch

            model = self.workload.make_model().to(self.settings.device)
            if self.settings.channels_last:
                model = model.to(memory_format=torch.channels_last)
            if self.settings.compile_mode is not None:
                model = torch.compile(model, mode=self.settings.compile_mode)
            self._model = model
        return self._model

    def _inputs(self, batch_size: int) -> tuple[Any, Any]:
        import torch

        inputs, targets = self.workload.make_batch(batch_size)
        device = self.settings.device
        if self.settings.channels_last and inputs.dim() == 4:
            inputs = inputs.to(device, memory_format=torch.channels_last)
        else:
            inputs = inputs.to(device)
        return inputs, targets.to(device)

    def steps(self, batch_size: int) -> float:
        """Run the training steps; return the seconds of all but the first (warm-up) step."""
        import torch

        s = self.settings
        model = self.model
        model.train()
        optimizer = make_optimizer(self.workload, model, s.optimizer_kwargs)
        scaler = make_scaler(torch, s.device, enabled=s.grad_scaler)
        inputs, targets = self._inputs(batch_size)
        started = 0.0
        for step in range(s.steps):
            if step == 1:
                sync_device(torch, s.device)
                started = self.clock()
            train_step(
                torch,
                self.workload,
                (inputs, targets),
                model=model,
                optimizer=optimizer,
                scaler=scaler,
                device=s.device,
                dtype=s.autocast_dtype,
            )
        sync_device(torch, s.device)
        return self.clock() - started if s.steps > 1 else 0.0

    def __call__(self, batch_size: int) -> TrialOutcome:
        import torch

        device = self.settings.device
        _peak_reset(torch, device)
        seconds, oom = run_guarded(lambda: self.steps(batch_size))
        peak = None if oom is not None else _peak_read(torch, device)
        release_memory(device)  # outside any except block: the failed step's frames are gone
        if oom is not None:
            return TrialOutcome(False)
        return TrialOutcome(True, peak, seconds)


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
    with torch.autocast(device_type=device, dtype=autocast_dtype, enabled=dtype is not None):
        loss = workload.loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
