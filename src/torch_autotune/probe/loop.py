"""A real training loop at one ``TrainConfig``, timed: what ``autotune bench`` measures.

An arm trains with ``Settings``: the profile's, with the arm's value of every knob put in
(``knobs.train_settings``), and turns them into torch through ``apply`` as the user's script
and the search trials do (flags, prepared model, batches, autocast, GradScaler, optimizer
keyword arguments), one ``train_step`` at a time. Unlike a search trial, the loop trains from
the workload's DataLoader (when it has a dataset), so the worker count and pinning count as
they do in training: a batch is loaded, copied to the device (``non_blocking`` when pinned),
and trained on. TF32 and the thread count, where the config leaves them at ``None``, stay at
torch's defaults: the values the process had when the loop was made; the cuDNN autotuner is
on only where the config asks for it.

A measurement warms up (DataLoader workers start, torch.compile compiles, the cuDNN autotuner
times its kernels, the optimizer creates its state) and trains through the batches the workers
loaded ahead meanwhile, then trains for at least ``seconds`` and ``min_steps`` steps and
returns samples per second, timed by the one ``Timer``. With workers, steps are counted in
whole rounds of one batch per worker, so a window never counts part of a round that arrived
together as loaded for free. Models are built once per (memory format, compile mode) and
reused across rounds, so compilation is paid once, in the first warm-up.

``FedRunner`` is the probe's ``TrialRunner`` with the DataLoader measured too: alone, and
feeding training through this loop on the probe's own model (``probe.fed`` decides).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from torch_autotune.apply import (
    apply_flags,
    batch_to_device,
    global_flags,
    grad_scaler,
    optimizer_kwargs,
    prepare_model,
    restore_flags,
    tf32_api,
)
from torch_autotune.errors import blame_user_code
from torch_autotune.knobs import settings_config, train_settings
from torch_autotune.probe.fed import FedTrial, warmup_steps
from torch_autotune.probe.guard import apart
from torch_autotune.probe.loader import (
    LoaderTrial,
    loader_kwargs,
    measure_loader,
    shut_down,
    worker_deaths_between_batches,
    worker_failure,
)
from torch_autotune.probe.memory import grown_since, held_now
from torch_autotune.probe.oom import release_memory, run_guarded
from torch_autotune.probe.step import make_optimizer, train_step
from torch_autotune.probe.timing import Timer
from torch_autotune.probe.trials import TrialRunner
from torch_autotune.settings import Settings, torch_defaults

T = TypeVar("T")

if TYPE_CHECKING:
    from torch_autotune.bench_record import TrainConfig
    from torch_autotune.probe.fresh import FreshOutcome
    from torch_autotune.probe.workloads import Workload

WARMUP_STEPS = 3
_TORCH_PREFETCH = 2  # batches per worker when prefetch_factor is None (torch >= 2.0)
MIN_STEPS = 3
LOADER_TIMEOUT_S = 60.0

OVER_CHECK_S = 0.25  # seconds between two reads of the high-water mark in an arm's steps


class TrainingLoop:
    """``loop.measure(config, seconds)``: samples/s of real training at ``config``.

    ``settings``: what the knobs leave alone (default: torch's defaults on ``device``); the
    bench passes the tuned profile's. Raises ``ArmFailed`` when the config runs out of memory,
    takes more host RAM than ``memory_limit_bytes`` on the CPU (counted as a search trial's
    is, ``_beyond_baseline``; stopped between steps once over it), or a DataLoader worker
    dies or hangs; any
    other error (the user's model failing) propagates with its own traceback.
    """

    def __init__(
        self,
        workload: Workload,
        device: Literal["cuda", "mps", "cpu"],
        *,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.perf_counter,
        warmup_steps: int = WARMUP_STEPS,
        min_steps: int = MIN_STEPS,
        model: Any = None,
        drain_prefetch: bool = True,
        memory_limit_bytes: int | None = None,
    ) -> None:
        """``model``: one already on ``device`` and prepared, trained in every arm instead of
        one built per memory format and compile mode (the probe's own). ``drain_prefetch``:
        the warm-up also trains on the batches the workers load ahead (``_prefetched``)."""
        import torch

        self.workload = workload
        self.device = device
        self.timer = Timer(device, clock=clock)
        self.warmup_steps = warmup_steps
        self.min_steps = min_steps
        self._defaults = global_flags(torch)
        base = (settings or torch_defaults(device)).model_copy(update={"device": device})
        # An arm that sets TF32 sets it through the API this torch has, as a profile would.
        api = base.matmul.api or tf32_api(torch)
        self._base = base.model_copy(update={"matmul": base.matmul.model_copy(update={"api": api})})
        self._models: dict[tuple[str, str | None, float | None, bool], Any] = {}
        self._given = model
        self._drain = drain_prefetch
        self._cap = memory_limit_bytes if device == "cpu" else None  # CUDA: the allocator's
        self._held: int | None = None  # CPU under the cap: what the process held as it began
        self._settled = False  # CPU under the cap: the first arm ran, its baseline with it
        self._checked = -OVER_CHECK_S  # when ``_stop_if_over`` last read the high-water mark
        self._timed = False  # in the timed rounds (``_stop_if_over`` reads less often there)

    def settings(self, config: TrainConfig) -> Settings:
        """The settings one arm trains with: the base with every knob at ``config``'s value."""
        return train_settings(config, self._base)

    # --- state per arm ---------------------------------------------------------------------

    def _model(self, settings: Settings) -> Any:
        import torch

        if self._given is not None:
            return self._given
        key = (
            settings.memory_format,
            settings.compile.mode if settings.compile.enabled else None,
            settings.compile.memory_budget if settings.compile.enabled else None,
            settings.activation_checkpointing,
        )
        if key not in self._models:
            torch.manual_seed(0)  # the same weights in every arm
            model = self.workload.model_on(self.device)
            self._models[key] = prepare_model(settings, model)
        return self._models[key]

    def _batches(self, settings: Settings) -> Generator[Any, None, None]:
        """Batches on the device, endlessly: from the DataLoader, else the example batch."""
        dl = settings.dataloader
        pinned = dl.pin_memory and self.device == "cuda"
        batch_size = settings.batch.batch_size or 1
        dataset = self.workload.dataset
        if dataset is None:
            make = self.workload.typical_batch or self.workload.make_batch
            batch = batch_to_device(settings, _users(make, batch_size))
            while True:
                yield batch
        from torch.utils.data import DataLoader

        from torch_autotune.bench import ArmFailed

        if len(dataset) < batch_size:  # drop_last: empty epochs, one after another, forever
            raise ArmFailed(
                f"batch {batch_size} is larger than the dataset ({len(dataset)} samples): the"
                " DataLoader, which drops an incomplete last batch, yields none"
            )
        kwargs = loader_kwargs(
            batch_size=batch_size,
            num_workers=dl.num_workers,
            pin_memory=pinned,
            persistent_workers=False,
            prefetch_factor=dl.prefetch_factor,
            timeout_s=LOADER_TIMEOUT_S,
            worker_options=self.workload.worker_options,
        )
        if self.workload.collate_fn is not None:
            kwargs["collate_fn"] = self.workload.collate_fn
        loader = DataLoader(dataset, shuffle=False, drop_last=True, **kwargs)
        with worker_deaths_between_batches() as check:
            while True:  # epochs; the loader's workers stop when the generator is closed
                iterator = _users(iter, loader)  # starting the workers pickles the user's dataset
                try:
                    while (batch := _users(next, iterator, None)) is not None:
                        check()
                        yield batch_to_device(settings, batch, non_blocking=pinned)
                finally:
                    shut_down(iterator)

    # --- the measurement -------------------------------------------------------------------

    def _train(self, settings: Settings, seconds: float) -> float:
        model = self._model(settings)
        if self._cap is not None:  # the peak starts here: the model is the process's, held
            import torch

            self._held = held_now(torch, self.device)
        model.train()
        options = optimizer_kwargs(settings)  # ours: a failure there is a bug (exit 1)
        optimizer = _users(make_optimizer, self.workload, model, options)
        scaler = grad_scaler(settings)
        batches = self._batches(settings)
        try:

            def step() -> None:
                batch = next(batches)  # the user's dataset is marked inside (_batches)
                train_step(
                    self.workload,
                    batch,
                    settings,
                    model=model,
                    optimizer=optimizer,
                    scaler=scaler,
                )
                self._stop_if_over()

            # Whole rounds of one batch per worker: workers that start together deliver
            # their batches together, so a window that began or ended inside a round would
            # count some of a round's batches and none of its wait.
            per_round = max(1, settings.dataloader.num_workers) if self.workload.dataset else 1
            warm = self.warmup_steps + (_prefetched(settings) if self._drain else 0)

            def one_round() -> None:
                for _ in range(per_round):
                    step()

            for _ in range(-(-warm // per_round)):
                one_round()
            self._timed = True
            rounds, elapsed = self.timer.run_for(
                one_round, seconds=seconds, min_calls=-(-self.min_steps // per_round)
            )
        finally:
            self._timed = False
            batches.close()
        batch_size = settings.batch.batch_size or 1
        return rounds * per_round * batch_size / elapsed if elapsed > 0 else 0.0

    def _stop_if_over(self) -> None:
        """Between steps, on the CPU under the cap: stop the arm once it has taken more than
        the cap beyond what the process held as it began (the resident high-water mark, read
        without a reset): after every warm-up step, and in the timed rounds at most every
        ``OVER_CHECK_S`` (22 us a read on this 2-core CPU, 5% of a tiny MLP's 0.4 ms step).
        The loop's first arm is stopped past twice the cap: its baseline settles only after
        it, with what torch keeps after its first step."""
        cap, held, now = self._cap, self._held, time.monotonic()
        if cap is None or held is None or now - self._checked < OVER_CHECK_S:
            return  # in the timed rounds, read at most every OVER_CHECK_S
        self._checked = now if self._timed else -OVER_CHECK_S
        import torch

        taken = grown_since(torch, self.device, held)
        if taken is not None and taken > (cap if self._settled else 2 * cap):
            raise _OverCap

    def measure(self, config: TrainConfig, seconds: float) -> float:
        """Samples per second of training at ``config`` for at least ``seconds``."""
        import torch

        from torch_autotune.bench import ArmFailed

        settings = self.settings(config)
        self._held = None
        restore_flags(torch, self._defaults)  # torch's defaults, then what the arm sets
        apply_flags(settings)
        stopped = False
        try:
            rate, oom = run_guarded(lambda: self._train(settings, seconds))
        except _OverCap:
            rate, oom, stopped = None, None, True
        except RuntimeError as error:
            failure = worker_failure(error)
            if failure is None:
                raise
            raise ArmFailed(f"DataLoader {failure}") from None
        finally:
            restore_flags(torch, self._defaults)
        taken = grown_since(torch, self.device, self._held)  # read before the release
        release_memory(self.device)  # outside the except block: the failed step's frames are gone
        if oom is not None:
            raise ArmFailed(f"out of memory ({oom.kind}) at {config.describe()}")
        taken = self._beyond_baseline(taken, stopped)
        cap = self._cap  # on the CPU nothing raises: it is refused here
        if cap is not None and taken is not None and (stopped or taken > cap):
            said, allowed = apart(taken, cap)
            raise ArmFailed(
                f"{'was stopped: it had taken' if stopped else 'took'} {said} of host RAM beyond"
                f" what the process held, more than the {allowed} the memory limit allows"
                f" (--memory-limit, memory_limit_gib), at {config.describe()}"
            )
        if not rate:
            raise ArmFailed(f"no time measured at {config.describe()}: the clock did not move")
        return rate

    def _beyond_baseline(self, taken: int | None, stopped: bool) -> int | None:
        """What the arm took beyond the loop's baseline, counted as a search trial's is
        (``TrialRunner._baseline``): from what the process held as the arm began, and for the
        loop's first arm from what it held once that arm had run, if more (what torch's first
        step keeps for good: outside the limit in the search, outside it here)."""
        if self._cap is None or self._held is None or taken is None or self._settled:
            return taken
        import torch

        self._settled = True
        after = held_now(torch, self.device)  # the arm's optimizer and batches are let go
        if stopped or after is None:
            return taken
        return taken - max(0, after - self._held)


class _OverCap(Exception):
    """An arm stopped between steps: it took more host RAM than the cap (``measure``)."""


class FedRunner(TrialRunner):
    """A ``TrialRunner`` that also measures the workload's DataLoader: alone (``load``), and
    feeding training (``fed``), through the bench's loop on this runner's own model, so that
    the probe and ``autotune bench`` measure a worker count the same way."""

    def fresh(
        self,
        environment: dict[str, str | None],
        *,
        batch: int,
        above: list[int],
        seconds: float,
        timeout_s: float,
    ) -> FreshOutcome | None:
        """The seam's (``probe.fresh``): this runner's model let go first, and the base's it
        wraps (a compiled variant's weights are the base's), so that the fresh process has the
        device's memory but for this one's context; the fresh process trains the step alone
        (``TrialRunner``), as the search and the points here do."""
        from torch_autotune.probe.fresh import request_for, run_fresh

        rebuild = self.workload.rebuild
        if rebuild is None:
            return None
        self.release_model()
        if self._base is not None:  # built again when next needed, as this runner's is
            self._base.release_model()
        request = request_for(
            self.settings,
            rebuild,
            self.workload.min_batch_size,
            batch=batch,
            above=above,
            seconds=seconds,
        )
        return run_fresh(request, environment, timeout_s=timeout_s)

    def load(
        self, num_workers: int, batch_size: int, *, batches: int, timeout_s: float, seconds: float
    ) -> LoaderTrial:
        """The DataLoader alone (``probe.loader.measure_loader``), pinned as the settings say,
        its timed batches cut short after ``seconds``."""
        return measure_loader(
            self._dataset(),
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=self.settings.settings.dataloader.pin_memory,
            batches=batches,
            timeout_s=timeout_s,
            clock=self.clock,
            **self.workload.loading(),
            seconds=seconds,
        )

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        """Samples/s of training at ``batch_size`` fed by ``num_workers`` workers, with
        ``threads`` CPU threads (None: the process's), timed for ``seconds`` after a warm-up
        of one round of the workers' batches (``probe.fed.warmup_steps``); without workers,
        on a workload without a dataset, its own batch (``probe.own_threads``). A worker
        that died or hung, or out-of-memory, fails the pass; the user's errors propagate."""
        from torch_autotune.bench import ArmFailed

        if num_workers:
            self._dataset()
        settings = self.settings.settings
        loop = TrainingLoop(
            self.workload,
            settings.device,
            settings=settings,
            clock=self.clock,
            warmup_steps=warmup_steps(num_workers),
            model=self.model,
            drain_prefetch=False,
        )
        dl = settings.dataloader
        config = settings_config(settings).model_copy(
            update={
                "batch_size": batch_size,
                "num_workers": num_workers,
                "prefetch_factor": dl.prefetch_factor if num_workers else None,
                "cpu_threads": threads,
            }
        )
        began = self.clock()
        try:
            rate = loop.measure(config, seconds)
        except ArmFailed as failure:
            return FedTrial(
                batch_size, num_workers, threads, None, self.clock() - began, str(failure)
            )
        return FedTrial(batch_size, num_workers, threads, rate, self.clock() - began)

    def _dataset(self) -> Any:
        if self.workload.dataset is None:
            raise ValueError(f"the {self.workload.name} workload has no dataset to load")
        return self.workload.dataset


def _prefetched(settings: Settings) -> int:
    """Batches the workers load ahead (``prefetch_factor`` each, torch's 2 by default): the
    warm-up trains on them too. Workers start together and fill that queue while the first
    steps run; a timed window that began with it full would count those batches as loaded
    for free: 4 batches of 2 workers are a third more samples than a 2 s window holds at
    batch 32 and 200 samples/s."""
    dl = settings.dataloader
    return dl.num_workers * (dl.prefetch_factor or _TORCH_PREFETCH) if dl.num_workers else 0


def _users(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``, an exception marked as the user's: their optimizer factory, their data,
    their dataset read by the DataLoader (a worker that died of it is told apart by
    ``measure``)."""
    try:
        return call(*args)
    except Exception as error:
        blame_user_code(error)
        raise
