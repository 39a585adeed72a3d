"""A simulated machine behind ``tune()``'s ``trials`` seam: recorded timings, simulated memory.

Every call advances a simulated clock by what the real step would take, so the orchestration
(search, time model, budget, steady points, compile) runs in milliseconds with the timing
effects a real accelerator showed (gpu-h100-2026-11 and the H100 run of this session):

- the very first step of the process pays start-up (CUDA context, allocator, first kernels);
- every new shape pays a warm-up (the cuDNN autotuner: 6-9 s for ResNet-50 on an H100);
- the first compiled step pays the compile (80 s for ResNet-50, 30 s for GPT-2 on an H100),
  later sizes on the same dynamic-batch compiled module pay almost nothing;
- a steady step costs ``fixed + per_sample * batch``;
- some sizes can be noisy: their timed blocks alternate around the true rate;
- with ``load_s`` set, loading costs that many seconds of one CPU a sample: the DataLoader
  alone (``load``) and training fed by it (``fed``) are simulated, and on a CPU machine
  (``shares_cpus``) the workers and the step share ``host_cpus`` cores. Without it, ``load``
  measures the workload's real DataLoader, and ``fed`` trains at the step's own rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from torch_autotune.api import tune
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.fed import FedTrial, pass_seconds
from torch_autotune.probe.loader import LoaderTrial, measure_loader
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.trials import MIN_BLOCKS, PointOutcome, StepSettings, spread
from torch_autotune.probe.workloads import Workload
from torch_autotune.profile import Profile

SNAPSHOT_DIR = Path(__file__).parent.parent / "fixtures" / "snapshots"


def recorded(name: str) -> HardwareSnapshot:
    """A recorded machine from ``tests/fixtures/snapshots``."""
    return HardwareSnapshot.model_validate_json((SNAPSHOT_DIR / f"{name}.json").read_text())


@dataclass
class Machine:
    """One simulated accelerator and its timings (seconds, bytes)."""

    limit: int = 1850  # the largest batch that fits (eager)
    compiled_limit: int | None = None  # the largest batch that fits compiled (None: limit)
    fixed_s: float = 0.012  # a step's fixed cost
    per_sample_s: float = 0.000235  # ResNet-50 bf16 on an H100: 4250 samples/s at large batch
    exponent: float = 1.0  # step = fixed + per_sample * batch ** exponent (< 1: a CPU)
    first_s: float = 14.0  # the process's first step, beyond a steady step
    new_shape_s: float = 0.2  # each new shape, beyond a steady step (autotuner off)
    autotune_s: float = 7.0  # each new shape with the cuDNN autotuner on
    compile_s: float = 80.0
    compiled_speedup: float = 1.23
    fixed_bytes: int = 2 << 30
    per_sample_bytes: int = 44 << 20
    memory_bytes: int = 80 << 30
    noise: dict[int, float] = field(default_factory=dict)  # batch -> relative amplitude
    load_s: float | None = None  # seconds of one CPU to load a sample (None: not simulated)
    host_cpus: int = 2  # the cores the DataLoader's workers (and a CPU step) run on
    shares_cpus: bool = False  # the step computes on the host CPUs too (a CPU machine)
    worker_start_s: float = 0.1  # starting one DataLoader worker
    leaves: int = 137
    now: float = 0.0
    started: bool = False
    compiled_once: bool = False
    shapes: set[int] = field(default_factory=set)  # sizes that ran (allocator warm)
    autotuned: set[int] = field(default_factory=set)  # sizes the cuDNN autotuner has timed
    log: list[str] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def step_s(self, batch_size: int, *, compiled: bool) -> float:
        step = self.fixed_s + self.per_sample_s * batch_size**self.exponent
        return step / self.compiled_speedup if compiled else step

    def fits(self, batch_size: int, *, compiled: bool) -> bool:
        limit = self.compiled_limit if compiled and self.compiled_limit else self.limit
        return batch_size <= limit

    def peak(self, batch_size: int) -> int:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def loader_rate(self, num_workers: int) -> float:
        """Samples/s of the DataLoader alone: one core per worker, the main process for 0."""
        assert self.load_s is not None
        return max(1, min(num_workers, self.host_cpus)) / self.load_s

    def fed_rate(
        self, batch_size: int, num_workers: int, threads: int | None, *, compiled: bool
    ) -> float:
        """Samples/s of training fed by the DataLoader. Without workers the main process loads,
        then steps. With them, the slowest of: the workers, the step, and (on a CPU) the cores
        that both share; the step runs on ``threads`` of them (None: all)."""
        step = self.step_s(batch_size, compiled=compiled) / batch_size  # wall s a sample
        load = self.load_s or 0.0
        if num_workers == 0:
            return 1 / (load + step)
        if not self.shares_cpus:
            return min(self.loader_rate(num_workers), 1 / step) if load else 1 / step
        cpus = self.host_cpus
        core_s = step * cpus  # the step's CPU time a sample, on all cores
        stepping = (threads or cpus) / core_s
        loading = self.loader_rate(num_workers) if load else math.inf
        return min(loading, stepping, cpus / (load + core_s))


class FakeTrials:
    """``Trials`` over a ``Machine``: what ``TrialRunner`` does, on simulated time."""

    def __init__(
        self,
        machine: Machine,
        settings: StepSettings,
        *,
        compiled: bool = False,
        workload: Workload | None = None,
    ) -> None:
        self.machine = machine
        self.settings = settings
        self.is_compiled = compiled
        self.benchmark = settings.cudnn_benchmark
        self.workload = workload

    # --- the protocol ---

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None:
        self.benchmark = (
            self.settings.cudnn_benchmark if cudnn_benchmark is None else cudnn_benchmark
        )

    def memory_limit(self) -> int:
        return self.machine.memory_bytes

    def leaf_modules(self) -> int:
        return self.machine.leaves

    def compiled(self, mode: str) -> FakeTrials:
        runner = FakeTrials(
            self.machine, self.settings.with_compile(mode), compiled=True, workload=self.workload
        )
        runner.benchmark = self.benchmark
        return runner

    def __call__(self, batch_size: int) -> TrialOutcome:
        m = self.machine
        m.log.append(f"trial {batch_size}{' compiled' if self.is_compiled else ''}")
        warmup = self._warmup(batch_size)
        if not m.fits(batch_size, compiled=self.is_compiled):
            m.advance(warmup)  # it fails in its first step
            return TrialOutcome(False)
        step = m.step_s(batch_size, compiled=self.is_compiled)
        m.advance(warmup + self.settings.steps * step)
        return TrialOutcome(
            True, m.peak(batch_size), warmup + self.settings.steps * step, warmup, step
        )

    def point(self, batch_size: int, *, until: float) -> PointOutcome:
        m = self.machine
        m.log.append(f"point {batch_size}{' compiled' if self.is_compiled else ''}")
        began = m.now
        warmup = self._warmup(batch_size)
        if not m.fits(batch_size, compiled=self.is_compiled):
            m.advance(warmup)
            return PointOutcome(batch_size, False, seconds=m.now - began)
        step = m.step_s(batch_size, compiled=self.is_compiled)
        m.advance(warmup + 2 * step)
        per_block = max(1, math.ceil(0.25 / step))
        amplitude = m.noise.get(batch_size, 0.0)
        rates: list[float] = [batch_size / step * (1 - amplitude)] if per_block == 1 else []
        while True:
            m.advance(per_block * step)
            sign = 1 if len(rates) % 2 else -1
            rates.append(batch_size / step * (1 + sign * amplitude))
            recent = rates[-MIN_BLOCKS:]
            if len(recent) == MIN_BLOCKS and spread(recent) <= 0.05:
                break
            if m.now + per_block * step > until:
                break
        recent = rates[-MIN_BLOCKS:]
        ordered = sorted(recent)
        return PointOutcome(
            batch_size,
            True,
            samples_per_s=ordered[len(ordered) // 2],
            relative_spread=spread(recent) if len(recent) > 1 else None,
            steady=len(recent) == MIN_BLOCKS and spread(recent) <= 0.05,
            warmup_s=warmup,
            step_s=step,
            blocks=len(rates),
            peak_memory_bytes=m.peak(batch_size),
            seconds=m.now - began,
        )

    def load(
        self, num_workers: int, batch_size: int, *, batches: int, timeout_s: float, seconds: float
    ) -> LoaderTrial:
        m = self.machine
        m.log.append(f"load {num_workers}")
        if m.load_s is None:
            assert self.workload is not None
            assert self.workload.dataset is not None
            return measure_loader(
                self.workload.dataset,
                batch_size=batch_size,
                num_workers=num_workers,
                batches=batches,
                timeout_s=timeout_s,
                collate_fn=self.workload.collate_fn,
                seconds=seconds,
            )
        rate = m.loader_rate(num_workers)
        start = m.worker_start_s * num_workers + max(1, num_workers) * batch_size / rate
        took = min(batches * batch_size / rate, max(seconds, batch_size / rate))
        m.advance(start + took)
        timed = max(1, round(took * rate / batch_size))
        return LoaderTrial(num_workers, rate, timed, timed * batch_size, took, start)

    def fed(
        self, batch_size: int, num_workers: int, threads: int | None, *, seconds: float
    ) -> FedTrial:
        m = self.machine
        m.log.append(f"fed {batch_size} {num_workers}")
        if not m.fits(batch_size, compiled=self.is_compiled):
            m.advance(self._warmup(batch_size))
            return FedTrial(batch_size, num_workers, threads, None, 0.0, "out of memory")
        rate = m.fed_rate(batch_size, num_workers, threads, compiled=self.is_compiled)
        took = self._warmup(batch_size) + pass_seconds(batch_size, num_workers, rate)
        m.advance(took)
        return FedTrial(batch_size, num_workers, threads, rate, took)

    # --- the simulated costs ---

    def _warmup(self, batch_size: int) -> float:
        m = self.machine
        warmup = 0.0
        if not m.started:
            m.started = True
            warmup += m.first_s
        if self.is_compiled and not m.compiled_once:
            m.compiled_once = True
            warmup += m.compile_s
        if self.benchmark and batch_size not in m.autotuned:  # cuDNN's cache is per shape
            m.autotuned.add(batch_size)
            warmup += m.autotune_s
        elif batch_size not in m.shapes:
            warmup += m.new_shape_s
        m.shapes.add(batch_size)
        return warmup


def cpu_machine(**timings: float) -> Machine:
    """This 2-core CPU with the small conv net: memory never limits below the cap; 300 MiB
    plus 2.3 MiB a sample (measured: 983 MiB at 256, 1575 MiB at 512)."""
    return Machine(
        limit=10**6,
        leaves=1,
        fixed_bytes=300 << 20,
        per_sample_bytes=int(2.3 * 2**20),
        **timings,  # type: ignore[arg-type]
    )


def mlp_machine() -> Machine:
    """The mlp workload on a CPU: 0.05 s a step plus 2 ms a sample. A loader at 0 workers
    keeps well ahead of it, so the workers phase measures 0 alone."""
    return cpu_machine(fixed_s=0.05, per_sample_s=0.002, first_s=0.3, autotune_s=0.0)


def tune_on(
    machine: Machine, workload: str | Workload, snapshot: HardwareSnapshot, **options: object
) -> Profile:
    """``tune()`` with its training steps and its clock on ``machine``. A workload with a
    dataset still measures real DataLoaders in the workers phase (``mlp_machine``: ms)."""

    def trials(workload: Workload, step: StepSettings) -> FakeTrials:
        return FakeTrials(machine, step, workload=workload)

    return tune(
        workload,
        snapshot=snapshot,
        clock=machine.clock,
        trials=trials,
        **options,  # type: ignore[arg-type]
    )


class Ticks:
    """Simulated time for real training steps: each reading is ``tick`` seconds after the
    last, so a run takes the same number of steps on any machine, however loaded."""

    def __init__(self, tick: float = 0.1) -> None:
        self.tick = tick
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def tune_ticking(
    workload: object = None, *, snapshot: HardwareSnapshot, tick: float = 0.1, **options: object
) -> Profile:
    """``tune()`` with real training steps (``TrialRunner``) on ``Ticks``: with a budget of
    30 s and ticks of 0.1 s, a few dozen real steps of the user's model."""
    from torch_autotune.probe.trials import TrialRunner

    clock = Ticks(tick)

    def trials(workload: Workload, step: StepSettings) -> TrialRunner:
        return TrialRunner(workload, step, clock=clock)

    return tune(
        workload,
        snapshot=snapshot,
        clock=clock,
        trials=trials,
        **options,  # type: ignore[arg-type]
    )
