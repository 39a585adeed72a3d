"""A real training loop at one ``TrainConfig``, timed: what ``autotune bench`` measures.

Unlike a search trial, the loop trains from the workload's DataLoader (when it has a dataset),
so the worker count and pinning count as they do in training: a batch is loaded, copied to
the device (``non_blocking`` when pinned), and trained on, with the config's autocast dtype,
GradScaler, memory format, compile mode, fused optimizer, cuDNN autotuner, TF32 and thread
count. Global flags the config leaves at ``None`` stay at torch's defaults: the values the
process had when the loop was made.

A measurement warms up (DataLoader workers start, torch.compile compiles, the cuDNN autotuner
times its kernels, the optimizer creates its state), then trains for at least ``seconds`` and
``min_steps`` steps and returns samples per second, synchronised with the device. Models are
built once per (memory format, compile mode) and reused across rounds, so compilation is paid
once, in the first warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from torch_autotune.apply import make_scaler
from torch_autotune.errors import blame_user_code
from torch_autotune.probe.loader import loader_kwargs, shut_down, worker_failure
from torch_autotune.probe.oom import release_memory, run_guarded
from torch_autotune.probe.trials import (
    global_flags,
    make_optimizer,
    mark_dynamic_batch,
    restore_flags,
    sync_device,
    train_step,
)

if TYPE_CHECKING:
    from torch_autotune.bench import TrainConfig
    from torch_autotune.probe.workloads import Workload

WARMUP_STEPS = 3
MIN_STEPS = 3
LOADER_TIMEOUT_S = 60.0


class TrainingLoop:
    """``loop.measure(config, seconds)``: samples/s of real training at ``config``.

    Raises ``ArmFailed`` when the config runs out of memory or a DataLoader worker dies or
    hangs; any other error (the user's model failing) propagates with its own traceback.
    """

    def __init__(
        self,
        workload: Workload,
        device: str,
        *,
        clock: Callable[[], float] = time.perf_counter,
        warmup_steps: int = WARMUP_STEPS,
        min_steps: int = MIN_STEPS,
    ) -> None:
        import torch

        self.workload = workload
        self.device = device
        self.clock = clock
        self.warmup_steps = warmup_steps
        self.min_steps = min_steps
        self._defaults = global_flags(torch)
        self._models: dict[tuple[bool, str | None], Any] = {}

    # --- state per config ------------------------------------------------------------------

    def _model(self, config: TrainConfig) -> Any:
        import torch

        key = (config.channels_last, config.compile_mode)
        if key not in self._models:
            torch.manual_seed(0)  # the same weights in every arm
            model = self.workload.make_model().to(self.device)
            if config.channels_last:
                model = model.to(memory_format=torch.channels_last)
            if config.compile_mode is not None:
                model = torch.compile(model, mode=config.compile_mode)
            self._models[key] = model
        return self._models[key]

    def _apply_flags(self, config: TrainConfig) -> None:
        """torch's defaults, then what the config sets."""
        import torch

        from torch_autotune.apply import apply_matmul

        restore_flags(torch, self._defaults)
        if config.cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = config.cudnn_benchmark
        if config.tf32 is not None:
            api = (
                "fp32_precision" if hasattr(torch.backends.cuda.matmul, "fp32_precision") else None
            )
            apply_matmul(torch, api or "allow_tf32", config.tf32)
        if config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)

    def _batches(self, config: TrainConfig) -> Generator[tuple[Any, Any], None, None]:
        """Batches on the device, endlessly: from the DataLoader, else the example batch."""
        import torch

        non_blocking = config.pin_memory and self.device == "cuda"
        memory_format = torch.channels_last if config.channels_last else torch.contiguous_format

        def to_device(inputs: Any, targets: Any) -> tuple[Any, Any]:
            if inputs.dim() == 4:
                inputs = inputs.to(
                    self.device, non_blocking=non_blocking, memory_format=memory_format
                )
            else:
                inputs = inputs.to(self.device, non_blocking=non_blocking)
            targets = targets.to(self.device, non_blocking=non_blocking)
            if config.compile_mode is not None:
                # One compile for every batch size of the arms (as in the probe): a static
                # compile recompiles at the second size, 60-80 s for ResNet-50 on an H100.
                mark_dynamic_batch(torch, inputs, targets)
            return inputs, targets

        dataset = self.workload.dataset
        if dataset is None:
            batch = to_device(*self.workload.make_batch(config.batch_size))
            while True:
                yield batch
        from torch.utils.data import DataLoader

        kwargs = loader_kwargs(
            batch_size=config.batch_size,
            num_workers=config.num_workers,
            pin_memory=config.pin_memory and self.device == "cuda",
            persistent_workers=False,
            prefetch_factor=config.prefetch_factor,
            timeout_s=LOADER_TIMEOUT_S,
        )
        loader = DataLoader(dataset, shuffle=False, drop_last=True, **kwargs)
        while True:  # epochs; the loader's workers stop when the generator is closed
            iterator = iter(loader)
            try:
                for inputs, targets in iterator:
                    yield to_device(inputs, targets)
            finally:
                shut_down(iterator)

    # --- the measurement -------------------------------------------------------------------

    def _train(self, config: TrainConfig, seconds: float) -> float:
        import torch

        model = self._model(config)
        model.train()
        options = {"fused": True} if config.fused_optimizer else {}
        try:
            optimizer = make_optimizer(self.workload, model, options)
        except Exception as error:  # the user's optimizer factory
            blame_user_code(error)
            raise
        dtype = None if config.precision == "float32" else config.precision
        scaler = make_scaler(torch, self.device, enabled=config.precision == "float16")
        batches = self._batches(config)
        try:

            def step() -> None:
                try:
                    batch = next(batches)
                except Exception as error:  # the user's dataset (a dead worker is told apart)
                    blame_user_code(error)
                    raise
                train_step(
                    torch,
                    self.workload,
                    batch,
                    model=model,
                    optimizer=optimizer,
                    scaler=scaler,
                    device=self.device,
                    dtype=dtype,
                )

            for _ in range(self.warmup_steps):
                step()
            sync_device(torch, self.device)
            started = self.clock()
            steps = 0
            while steps < self.min_steps or self.clock() - started < seconds:
                step()
                steps += 1
            sync_device(torch, self.device)
            elapsed = self.clock() - started
        finally:
            batches.close()
        return steps * config.batch_size / elapsed if elapsed > 0 else 0.0

    def measure(self, config: TrainConfig, seconds: float) -> float:
        """Samples per second of training at ``config`` for at least ``seconds``."""
        import torch

        from torch_autotune.bench import ArmFailed

        self._apply_flags(config)
        try:
            rate, oom = run_guarded(lambda: self._train(config, seconds))
        except RuntimeError as error:
            failure = worker_failure(error)
            if failure is None:
                raise
            raise ArmFailed(f"DataLoader {failure}") from None
        finally:
            restore_flags(torch, self._defaults)
        release_memory(self.device)  # outside the except block: the failed step's frames are gone
        if oom is not None:
            raise ArmFailed(f"out of memory ({oom.kind}) at {config.describe()}")
        if not rate:
            raise ArmFailed(f"no time measured at {config.describe()}: the clock did not move")
        return rate
