"""The DataLoader measured alone and feeding real training on this CPU (``probe.loop.FedRunner``),
and whole rounds in the bench's loop, with a small CPU-heavy dataset.

The datasets are module-level classes so that workers can unpickle them under spawn too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch.utils.data import Dataset

from torch_autotune.bench import TrainConfig
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe import loop as loop_module
from torch_autotune.probe.fed import FED_WITHIN
from torch_autotune.probe.loop import FedRunner, TrainingLoop
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.workloads import CpuHeavyDataset, Workload, resolve_workload


class SlowItems(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """64 samples of 16 features that take 5 ms each to load (a sleep: no CPU taken)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.005)
        return torch.full((16,), float(index)), torch.tensor(index % 4)


def _small_conv() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )


def _heavy() -> Workload:
    """A small conv net on CpuHeavyDataset images of 16x16: a few ms of CPU a sample."""
    return Workload(
        name="heavy",
        kind="conv",
        make_model=_small_conv,
        make_optimizer=lambda model, **kw: torch.optim.SGD(model.parameters(), lr=0.1, **kw),
        make_batch=lambda n: (torch.randn(n, 3, 16, 16), torch.randint(0, 10, (n,))),
        dataset=CpuHeavyDataset(256, image_size=16, source_size=24, passes=2),
        train_step=resolve_workload("conv").train_step,
    )


def _slow() -> Workload:
    """The mlp workload loading ``SlowItems``."""
    workload = resolve_workload("mlp")
    return Workload(
        name="slow",
        kind="mlp",
        make_model=workload.make_model,
        make_optimizer=workload.make_optimizer,
        make_batch=workload.make_batch,
        dataset=SlowItems(),
        train_step=workload.train_step,
    )


def test_the_loader_alone_is_cut_short_after_its_seconds() -> None:
    runner = FedRunner(_slow(), StepSettings())
    trial = runner.load(0, 4, batches=50, timeout_s=5.0, seconds=0.2)
    assert trial.ok
    assert 1 <= trial.batches < 50  # 50 batches of 4 x 5 ms would take a second
    assert trial.seconds >= 0.2


def test_a_first_round_as_long_as_the_seconds_is_the_measurement() -> None:
    runner = FedRunner(_slow(), StepSettings())
    trial = runner.load(0, 64, batches=8, timeout_s=5.0, seconds=0.2)  # 64 x 5 ms = 0.32 s
    assert trial.ok
    assert trial.batches == 1
    assert trial.samples_per_s is not None
    assert trial.samples_per_s == pytest.approx(64 / trial.seconds)
    assert trial.seconds >= 0.32


@pytest.mark.parametrize(("workers", "threads"), [(0, None), (2, 1)])
def test_training_fed_by_workers_runs_with_the_threads_asked_for(
    workers: int, threads: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = torch.get_num_threads()
    seen: list[int] = []
    original = loop_module.train_step

    def spy(*args: object, **kwargs: object) -> None:
        seen.append(torch.get_num_threads())
        original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop_module, "train_step", spy)
    runner = FedRunner(_heavy(), StepSettings())
    trial = runner.fed(16, workers, threads, seconds=0.1)
    assert trial.ok, trial.error
    assert trial.samples_per_s is not None
    assert trial.samples_per_s > 0
    assert (trial.batch_size, trial.num_workers, trial.threads) == (16, workers, threads)
    assert set(seen) == {threads or before}  # every step, warm-up included
    assert len(seen) % max(1, workers) == 0  # whole rounds of one batch per worker
    assert torch.get_num_threads() == before


def test_a_variants_runner_still_feeds_training() -> None:
    from torch_autotune.probe.variants import compiled

    runner = FedRunner(_heavy(), StepSettings())
    assert isinstance(runner.variant(compiled("default")), FedRunner)


def test_the_benchs_loop_trains_whole_rounds_after_the_prefetched_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[int] = []
    original = loop_module.train_step

    def count(*args: object, **kwargs: object) -> None:
        steps.append(1)
        original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop_module, "train_step", count)
    loop = TrainingLoop(_heavy(), "cpu", warmup_steps=3, min_steps=3)
    assert loop.measure(TrainConfig(batch_size=8, num_workers=2, cpu_threads=1), 0.05) > 0
    # 3 warm-up steps and the 4 batches the two workers load ahead, in rounds of 2: 8;
    # then at least 3 timed steps in rounds of 2: 4 or more, and always whole rounds.
    assert len(steps) >= 12
    assert len(steps) % 2 == 0


@pytest.mark.slow
def test_the_workers_phase_on_a_cpu_heavy_dataset_feeds_real_training_and_keeps_its_time() -> None:
    """The workers phase on this CPU with the real runner, as ``tune()`` runs it last: the
    loader alone measured up to the usable CPUs, training fed by the plain alternative first,
    the choice within the tolerance of the best pass, the batch one that ran fed, and the
    phase over within a pass of its deadline. The machine is a recorded CPU laptop with this
    process's CPUs, so that it trains on the CPU on a GPU machine too.

    The phase alone, not a whole ``tune()``: the phases before it had its time on a loaded
    machine (a 45 s run at load 8 spent 20 s on a throughput phase allowed 2 s, and fed
    nothing). Whole runs where loading limits training are simulated (``test_workers_phase``);
    ``test_run`` tunes for real up to this phase."""
    from tests.rules.helpers import with_host
    from torch_autotune.probe.budget import Budget
    from torch_autotune.probe.workers_phase import measure_workers
    from torch_autotune.rules.engine import build_profile

    cpus = len(_affinity())
    laptop = with_host("cpu-laptop-linux", cpus_usable=cpus, cpu_affinity_count=cpus)
    profile = build_profile(laptop)
    data = CpuHeavyDataset(512, image_size=32, source_size=64, passes=4)  # 2-4 ms a sample
    workload = replace(_heavy(), make_batch=_images(32), dataset=data)
    runner = FedRunner(workload, StepSettings.from_profile(profile))
    step = runner(64)  # the step alone, as the search measured it
    assert step.fits, step
    assert step.step_s, step
    budget = Budget(30.0, time.perf_counter)
    outcome = measure_workers(
        workload=workload,
        profile=profile,
        runner=runner,
        batch_size=64,
        step_rates={64: 64 / step.step_s},
        budget=budget,
        progress=lambda _phase, _what: None,
        smaller=(32, 16),
        threads_for=lambda n: _threads_beside(laptop, n),
    )
    took = budget.elapsed()
    most = min(cpus, laptop.host.cpus_usable)
    assert max(r.num_workers for r in outcome.loader) <= most
    assert outcome.fed, outcome.reason  # the small net waits for its data: training is fed
    assert outcome.fed[0].num_workers == most
    best = max(r.samples_per_s or 0.0 for r in outcome.fed)
    chosen = [r.samples_per_s for r in outcome.fed if r.num_workers == outcome.num_workers]
    again = [r.num_workers for r in outcome.fed if r.round == 2]
    if again[1:] == [outcome.num_workers]:  # the second round kept the plain alternative
        assert outcome.num_workers == most  # and set the faster passes aside (probe.fed_rounds)
    else:
        assert max(s or 0.0 for s in chosen) >= best * (1 - FED_WITHIN)
    fed_at = {r.batch_size for r in outcome.fed if r.samples_per_s}
    assert (outcome.batch_size or 64) in fed_at  # the batch recommended trained fed
    assert took <= budget.total_s + 10  # one pass past the deadline at most


def _threads_beside(machine: HardwareSnapshot, workers: int) -> int | None:
    """The CPU threads the rules set beside ``workers`` DataLoader workers, as ``tune()``."""
    from torch_autotune.rules.context import Measurements
    from torch_autotune.rules.engine import build_profile

    return build_profile(machine, Measurements(num_workers=workers)).settings.cpu_threads


def _images(size: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    return lambda n: (torch.randn(n, 3, size, size), torch.randint(0, 10, (n,)))


def _affinity() -> set[int]:
    import os

    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(1))


def test_a_batch_larger_than_the_dataset_fails_the_pass_instead_of_looping() -> None:
    runner = FedRunner(_slow(), StepSettings())  # 64 samples
    trial = runner.fed(128, 0, None, seconds=0.1)
    assert not trial.ok
    assert trial.error == (
        "batch 128 is larger than the dataset (64 samples): the DataLoader, which drops an"
        " incomplete last batch, yields none"
    )
