"""A simulated machine behind the probe's ``Trials`` seam: recorded timings, simulated memory,
a simulated clock. No torch.

``detect.RecordedMachine`` stands in for a machine you are not on when the rules decide; this
stands in for its accelerator when the probe measures. ``tune()`` takes it through its
``trials`` and ``clock`` seams, and the whole probe (search, time model, budget, steady points,
compile, workers) runs in milliseconds, on the timings a real machine showed::

    from torch_autotune import load_snapshot, tune
    from torch_autotune.probe.presets import preset

    machine = preset("h100-resnet50")
    profile = tune("resnet50", snapshot=load_snapshot("h100.json"),
                   trials=machine.trials, clock=machine.clock)

Every call advances the simulated clock by what the real step would take, with the timing
effects a real accelerator showed (the H100 runs of ``benchmarks/results/h100-2026-11-23``):

- the very first step of the process pays start-up (CUDA context, allocator, first kernels);
- every new shape pays a warm-up (the cuDNN autotuner: 6-9 s for ResNet-50 on an H100);
- the first compiled step pays the compile (53 s for ResNet-50, 33 s for GPT-2 on an H100),
  later sizes on the same dynamic-batch compiled module pay almost nothing; a compile under an
  activation memory budget is a compile of its own, and pays it again;
- a steady step costs ``fixed + per_sample * batch ** exponent``; compiled, that over the
  compiled speedup;
- a batch fits up to a limit (eager, and compiled where it needs more memory); the peak a
  trial reads grows linearly with the batch;
- some sizes can be noisy: their timed blocks alternate around the true rate;
- a fresh process (``fresh``) trains the runner's own settings, at their limit; with J1's
  allocator setting and ``allocator`` set, that limit moves as ``allocator`` moves the eager
  one, and each step takes its factor longer;
- with ``load_s`` set, loading costs that many seconds of one CPU a sample: the DataLoader
  alone (``load``) and training fed by it (``fed``) are simulated, and on a CPU machine
  (``shares_cpus``) the workers and the step share ``host_cpus`` cores. Without it, ``load``
  measures the workload's real DataLoader, and ``fed`` trains at the step's own rate.

The worker counts the probe tries are still bounded by the CPUs of the process that runs it
(``probe.workers_phase``), also for a recorded machine: on a laptop with 2 CPUs, the 16-CPU
H100's loading runs on 2 workers and limits training, and the batch follows (the tests patch
``workers_phase._process_cpus`` to the preset's ``host_cpus`` for the recorded run's shape).
``probe.presets`` holds recorded machines: the ResNet-50 and GPT-2 runs on an H100 and the conv
net on a 2-core CPU. A test holds ``SimulatedTrials`` to the seam, method by method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch_autotune.probe.fed import FedTrial, pass_seconds
from torch_autotune.probe.fresh import FreshOutcome
from torch_autotune.probe.loader import LoaderTrial, measure_loader
from torch_autotune.probe.search import Agreement, TrialOutcome
from torch_autotune.probe.trials import MIN_BLOCKS, PointOutcome, StepSettings, spread

if TYPE_CHECKING:
    from torch_autotune.probe.seam import Trials
    from torch_autotune.probe.variants import Variant
    from torch_autotune.probe.workloads import Workload

__all__ = ["SimulatedMachine", "SimulatedTrials"]

MIB = 1 << 20
GIB = 1 << 30
AGREES = Agreement(agrees=True, largest_difference=0.0, blocks=1)
BLOCKS_AGREE = Agreement(agrees=True, largest_difference=0.0, blocks=1, kinds=1)


@dataclass
class SimulatedMachine:
    """One simulated accelerator, its timings (seconds) and memory (bytes), and its clock.

    The defaults are ResNet-50 in bf16 on an H100 as the first GPU run measured it (4,250
    samples/s at large batches, 14 s to start, 7 s of cuDNN autotuning a shape, 80 s to
    compile); ``probe.presets`` holds the later recorded runs. ``now``, ``started``,
    ``compiled_once``, ``shapes``, ``autotuned`` and ``log`` are the process's state: what
    has run so far.
    """

    limit: int = 1850  # the largest batch that fits (eager)
    compiled_limit: int | None = None  # the largest batch that fits compiled (None: limit)
    fixed_s: float = 0.012  # a step's fixed cost
    per_sample_s: float = 0.000235  # ResNet-50 bf16 on an H100: 4250 samples/s at large batch
    exponent: float = 1.0  # step = fixed + per_sample * batch ** exponent (> 1: a CPU's caches)
    first_s: float = 14.0  # the process's first step, beyond a steady step
    new_shape_s: float = 0.2  # each new shape, beyond a steady step (autotuner off)
    autotune_s: float = 7.0  # each new shape with the cuDNN autotuner on
    compile_s: float = 80.0
    compiled_speedup: float = 1.23
    checkpointed_limit: int | None = None  # the largest batch with activation checkpointing
    recompute_factor: float = 1.33  # a checkpointed step: about one forward more (issue 21)
    budgeted_limit: int | None = None  # the largest batch compiled under a memory budget
    budget_factor: float = 1.1  # a budgeted compiled step: the cheap ops recomputed
    foreach_bytes: int = 0  # what torch's foreach optimizer step holds beyond the fused one's
    recompute: Agreement | None = AGREES  # the checkpointed step's check (None: no room)
    recompute_blocks: Agreement | None = BLOCKS_AGREE  # where the plain step does not fit
    allocator: tuple[int, float] | None = None  # with J1's setting: eager limit, step factor
    fixed_bytes: int = 2 * GIB
    per_sample_bytes: int = 44 * MIB
    memory_bytes: int | None = 80 * GIB  # what the trials may use (None: unknown, a CPU)
    noise: dict[int, float] = field(default_factory=dict)  # batch -> relative amplitude
    load_s: float | None = None  # seconds of one CPU to load a sample (None: not simulated)
    host_cpus: int = 2  # the cores the DataLoader's workers (and a CPU step) run on
    shares_cpus: bool = False  # the step computes on the host CPUs too (a CPU machine)
    worker_start_s: float = 0.1  # starting one DataLoader worker
    receive_s: float = 0.0  # the main process's time a sample to take it from a worker (the
    # queue, unpickling): beside a tiny model's step, more than the step itself
    thread_sync_s: float = 0.0  # a CPU step's cost per thread beyond the first (the pool's
    # synchronisation: on a tiny model or a busy CPU, more than the work the threads split)
    leaves: int = 137  # leaf modules: what the compile time is predicted from
    build_s: float = 0.0  # building a model of its own (checkpointing's check and variant)
    now: float = 0.0
    started: bool = False
    compiled_once: bool = False
    budgets_compiled: set[float] = field(default_factory=set)  # memory budgets compiled under
    shapes: set[int] = field(default_factory=set)  # sizes that ran (allocator warm)
    autotuned: set[int] = field(default_factory=set)  # sizes the cuDNN autotuner has timed
    log: list[str] = field(default_factory=list)  # "trial 64", "point 832 compiled", ...

    def clock(self) -> float:
        """Seconds on the simulated clock: what ``tune(clock=...)`` reads."""
        return self.now

    def trials(self, workload: Workload, settings: StepSettings) -> SimulatedTrials:
        """The runner for ``workload`` with ``settings``: what ``tune(trials=...)`` calls."""
        return SimulatedTrials(self, settings, workload=workload)

    def restart(self) -> None:
        """A fresh process on the same machine: clock at 0, nothing warm, an empty log."""
        self.now, self.started, self.compiled_once = 0.0, False, False
        self.shapes, self.autotuned, self.budgets_compiled, self.log = set(), set(), set(), []

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def step_s(
        self,
        batch_size: int,
        *,
        compiled: bool,
        checkpointed: bool = False,
        budgeted: bool = False,
    ) -> float:
        """Seconds of one steady training step (a checkpointed one recomputes its forward, a
        budgeted compiled one the cheap ops its budget did not keep)."""
        step = self.fixed_s + self.per_sample_s * math.pow(batch_size, self.exponent)
        step = step * self.recompute_factor if checkpointed else step
        step = step * self.budget_factor if budgeted else step
        step = step / self.compiled_speedup if compiled else step
        return step + self._sync_s(None)

    def _sync_s(self, threads: int | None) -> float:
        """What a step's pool of ``threads`` (None: all the host's) costs to synchronise."""
        if not self.shares_cpus:
            return 0.0
        return self.thread_sync_s * ((threads or self.host_cpus) - 1)

    def _cpu_step_s(self, batch_size: int, threads: int | None, how: dict[str, bool]) -> float:
        """A step on ``threads`` of the host's cores (None: all): their share of the work,
        and their synchronisation."""
        work = (self.step_s(batch_size, **how) - self._sync_s(None)) * self.host_cpus
        return work / (threads or self.host_cpus) + self._sync_s(threads)

    def _limit(self, *, compiled: bool, checkpointed: bool, budgeted: bool = False) -> int:
        if checkpointed and self.checkpointed_limit:
            return self.checkpointed_limit
        if compiled and budgeted and self.budgeted_limit:
            return self.budgeted_limit
        return self.compiled_limit if compiled and self.compiled_limit else self.limit

    def fits(
        self, batch_size: int, *, compiled: bool, checkpointed: bool = False, budgeted: bool = False
    ) -> bool:
        limit = self._limit(compiled=compiled, checkpointed=checkpointed, budgeted=budgeted)
        return batch_size <= limit

    def peak(
        self,
        batch_size: int,
        *,
        compiled: bool = False,
        checkpointed: bool = False,
        budgeted: bool = False,
    ) -> int:
        """The allocator's peak in bytes of a trial at ``batch_size``: compiled (or
        checkpointed), where it fits fewer (more) samples, each needs more (less) in proportion."""
        limit = self._limit(compiled=compiled, checkpointed=checkpointed, budgeted=budgeted)
        per_sample = self.per_sample_bytes * max(self.limit, 1) // max(limit, 1)
        return self.fixed_bytes + per_sample * batch_size

    def loader_rate(self, num_workers: int) -> float:
        """Samples/s of the DataLoader alone: one core per worker, the main process for 0."""
        if self.load_s is None:
            raise ValueError("loading is not simulated on this machine (load_s is None)")
        return max(1, min(num_workers, self.host_cpus)) / self.load_s

    def fed_rate(
        self,
        batch_size: int,
        num_workers: int,
        threads: int | None,
        *,
        compiled: bool,
        checkpointed: bool = False,
        budgeted: bool = False,
    ) -> float:
        """Samples/s of training fed by the DataLoader. Without workers the main process loads,
        then steps. With them, the slowest of: the workers, the step, and (on a CPU) the cores
        that both share; the step runs on ``threads`` of them (None: all)."""
        how = {"compiled": compiled, "checkpointed": checkpointed, "budgeted": budgeted}
        step = self.step_s(batch_size, **how) / batch_size
        load = self.load_s or 0.0
        if self.shares_cpus:
            step = self._cpu_step_s(batch_size, threads, how) / batch_size
        if num_workers == 0:
            return 1 / (load + step)
        step += self.receive_s
        if not self.shares_cpus:
            return min(self.loader_rate(num_workers), 1 / step) if load else 1 / step
        cpus = self.host_cpus
        core_s = step * (threads or cpus)  # the step's CPU time a sample, on its threads
        loading = self.loader_rate(num_workers) if load else math.inf
        return min(loading, 1 / step, cpus / (load + core_s))


class SimulatedTrials:
    """``probe.seam.Trials`` over a ``SimulatedMachine``: what ``probe.loop.FedRunner`` does
    with real training, on simulated time."""

    def __init__(
        self,
        machine: SimulatedMachine,
        settings: StepSettings,
        *,
        compiled: bool = False,
        workload: Workload | None = None,
    ) -> None:
        self.machine, self.settings, self.workload = machine, settings, workload
        self.is_compiled, self.benchmark = compiled, settings.cudnn_benchmark
        checkpointed = settings.settings.activation_checkpointing
        self.budget = settings.settings.compile.memory_budget if compiled else None
        budgeted = self.budget is not None
        self._how = {"compiled": compiled, "checkpointed": checkpointed, "budgeted": budgeted}
        self.released = 0  # times the probe let go of this runner's model

    # --- the seam ---

    def apply_flags(self, *, cudnn_benchmark: bool | None = None) -> None:
        flag = cudnn_benchmark
        self.benchmark = self.settings.cudnn_benchmark if flag is None else flag

    def memory_limit(self) -> int | None:
        cap = self.settings.memory_limit_bytes
        known = [b for b in (self.machine.memory_bytes, cap) if b is not None]
        return min(known) if known else None

    def _fits(self, batch_size: int) -> bool:
        """Whether ``batch_size`` trains: within the machine's limit, its peak within the cap
        (``--memory-limit``, as the allocator's fraction holds it), and a foreach optimizer's
        step within what the largest batch that fits holds."""
        m, cap = self.machine, self.settings.memory_limit_bytes
        if not m.fits(batch_size, **self._how):
            return False
        held = m.peak(m._limit(**self._how), **self._how)
        return (cap is None or self._peak(batch_size) <= cap) and self._peak(batch_size) <= held

    def _peak(self, batch_size: int) -> int:
        """The trial's peak: the step's, or the foreach optimizer's step where that is higher
        (activations are freed by then, the intermediates of the update are not)."""
        m, peak = self.machine, self.machine.peak(batch_size, **self._how)
        foreach = not self.settings.settings.optimizer.fused and m.foreach_bytes
        return max(peak, m.fixed_bytes + m.foreach_bytes) if foreach else peak

    def leaf_modules(self) -> int:
        return self.machine.leaves

    @property
    def built_s(self) -> float | None:
        return self.machine.build_s

    def release_model(self) -> None:
        self.released += 1

    def fresh(
        self,
        environment: dict[str, str | None],
        *,
        batch: int,
        above: list[int],
        seconds: float,
        timeout_s: float,
    ) -> FreshOutcome | None:
        """A fresh process of this runner's settings, with the allocator's setting
        (``environment`` sets it) where the machine has one, else without: the limit of this
        runner's settings (compiled, checkpointed, budgeted), moved with the setting as the
        machine's ``allocator`` moves the eager one, and its step times the ``allocator``'s
        factor; a compiled runner compiles again there."""
        m = self.machine
        compile_s = m.compile_s if self.is_compiled else 0.0
        m.advance(min(timeout_s, 30.0 + compile_s + seconds))  # its start, point and trials
        limit, factor = m._limit(**self._how), 1.0
        if any(environment.values()) and m.allocator:
            moved, factor = m.allocator
            limit = limit * moved // m.limit if m.limit else limit  # no eager limit to scale
        fits = {size: size <= limit for size in [batch, *above]}
        rate = batch / (m.step_s(batch, **self._how) * factor) if fits[batch] else None
        return FreshOutcome(fits, rate, next(iter(environment.values()), None))

    def recompute_check(self, batch_size: int) -> Agreement | None:
        """The machine's check of the step (``recompute``) at every size where the plain step
        fits, else its check of the blocks alone (``recompute_blocks``)."""
        self.machine.advance(self.machine.build_s)  # its model of its own
        if self.machine.fits(batch_size, compiled=False):
            return self.machine.recompute
        return self.machine.recompute_blocks

    def variant(self, variant: Variant) -> SimulatedTrials:
        settings = self.settings.with_variant(variant)
        self.machine.advance(self.machine.build_s if variant.fresh_model else 0.0)
        runner = SimulatedTrials(
            self.machine,
            settings,
            compiled=settings.settings.compile.enabled,
            workload=self.workload,
        )
        runner.benchmark = self.benchmark
        return runner

    def __call__(self, batch_size: int) -> TrialOutcome:
        m = self.machine
        m.log.append(f"trial {batch_size}{' compiled' if self.is_compiled else ''}")
        warmup = self._warmup(batch_size)
        if not self._fits(batch_size):
            m.advance(warmup)  # it fails in its first step; on the CPU over the cap, at its peak
            cap, peak = self.settings.memory_limit_bytes, self._peak(batch_size)
            over = self.settings.settings.device == "cpu" and cap is not None and peak > cap
            return TrialOutcome(False, peak if over else None)
        step = m.step_s(batch_size, **self._how)
        m.advance(warmup + self.settings.steps * step)
        return TrialOutcome(
            True,
            self._peak(batch_size),
            warmup + self.settings.steps * step,
            warmup,
            step,
        )

    def point(
        self, batch_size: int, *, until: float, deadline: float | None = None
    ) -> PointOutcome:
        m, hard = self.machine, math.inf if deadline is None else deadline
        m.log.append(f"point {batch_size}{' compiled' if self.is_compiled else ''}")
        began, warmup = m.now, self._warmup(batch_size)
        if not self._fits(batch_size):
            m.advance(warmup)
            return PointOutcome(batch_size, False, seconds=m.now - began)
        step, peak = m.step_s(batch_size, **self._how), self._peak(batch_size)
        m.advance(warmup + step)
        if m.now >= hard and not (self.is_compiled or self.benchmark):  # ``one_off_warmup``
            return PointOutcome(batch_size, True, peak_memory_bytes=peak, seconds=m.now - began)
        m.advance(step)
        per_block, amplitude = max(1, math.ceil(0.25 / step)), m.noise.get(batch_size, 0.0)
        sized = [batch_size / step * (1 - amplitude)]  # the sizing step, where it is a block
        rates: list[float] = sized if per_block == 1 else []
        fit, steady, ran = (hard - m.now) / step, False, 0
        count = per_block if fit >= per_block else max(0, int(fit))  # the first: to the deadline
        while count and not steady and (not ran or m.now + count * step <= min(until, hard)):
            m.advance(count * step)
            sign = 1 if len(rates) % 2 else -1
            rates.append(batch_size / step * (1 + sign * amplitude))
            recent = rates[-MIN_BLOCKS:]
            steady = len(recent) == MIN_BLOCKS and spread(recent) <= 0.05
            count, ran = per_block, ran + 1
        recent = (rates or sized)[-MIN_BLOCKS:]
        return PointOutcome(
            batch_size,
            True,
            samples_per_s=sorted(recent)[len(recent) // 2],
            relative_spread=spread(recent) if len(recent) > 1 else None,
            steady=steady,
            warmup_s=warmup,
            step_s=step,
            blocks=len(rates or sized),
            peak_memory_bytes=peak,
            seconds=m.now - began,
        )

    def load(
        self, num_workers: int, batch_size: int, *, batches: int, timeout_s: float, seconds: float
    ) -> LoaderTrial:
        m = self.machine
        m.log.append(f"load {num_workers}")
        if m.load_s is None:  # the workload's real DataLoader, on this machine's clock
            if self.workload is None or self.workload.dataset is None:
                raise ValueError("loading is not simulated and the workload has no dataset")
            return measure_loader(
                self.workload.dataset,
                batch_size=batch_size,
                num_workers=num_workers,
                batches=batches,
                timeout_s=timeout_s,
                seconds=seconds,
                **self.workload.loading(),
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
        if not self._fits(batch_size):
            m.advance(self._warmup(batch_size))
            return FedTrial(batch_size, num_workers, threads, None, 0.0, "out of memory")
        rate = m.fed_rate(batch_size, num_workers, threads, **self._how)
        took = self._warmup(batch_size) + pass_seconds(batch_size, num_workers, rate)
        m.advance(took)
        return FedTrial(batch_size, num_workers, threads, rate, took)

    # --- the simulated costs ---

    def _warmup(self, batch_size: int) -> float:
        m, warmup = self.machine, 0.0
        if not m.started:
            m.started = True
            warmup += m.first_s
        if self.is_compiled and self.budget is None and not m.compiled_once:
            m.compiled_once = True
            warmup += m.compile_s
        elif self.budget is not None and self.budget not in m.budgets_compiled:
            m.budgets_compiled.add(self.budget)  # a backend of its own: compiled again
            warmup += m.compile_s
        if self.benchmark and batch_size not in m.autotuned:  # cuDNN's cache is per shape
            m.autotuned.add(batch_size)
            warmup += m.autotune_s
        elif batch_size not in m.shapes:
            warmup += m.new_shape_s
        m.shapes.add(batch_size)
        return warmup


if TYPE_CHECKING:  # mypy holds the simulation to the seam as a type, a test does by signature
    _SEAM: type[Trials] = SimulatedTrials
