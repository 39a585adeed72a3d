"""``tune()`` from the outside: the measured profile, its budget and errors, the phases it
reports, the user's settings, and the state it leaves. On the simulated machine of
``probe.simulated`` (milliseconds), and once end to end with real training on this CPU (slow)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from torch.utils.data import Subset

from tests.probe.fake_trials import mlp_machine, recorded, tune_on
from torch_autotune.api import tune
from torch_autotune.errors import EXIT_PROBE, ProbeError
from torch_autotune.probe.findings import epoch_note
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.probe.simulated import SimulatedTrials
from torch_autotune.probe.trials import PointOutcome, StepSettings
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile, Source

LAPTOP = recorded("cpu-laptop-linux")  # a CPU-only machine: the real probe runs on this CPU


def _tune(**options: object) -> Profile:
    """``tune("mlp")`` on the laptop, its training steps simulated."""
    return tune_on(mlp_machine(), "mlp", LAPTOP, **options)


def _assert_measured_within(profile: Profile, cap: int) -> None:
    """The batch size was measured, is one that ran, and the largest that ran is the limit."""
    evidence = profile.evidence
    assert evidence is not None
    assert profile.measured
    ran = {t.batch_size for t in evidence.search if t.fits}
    assert profile.settings.batch.batch_size == evidence.batch_size
    assert evidence.batch_size in ran  # never a size that did not run
    assert evidence.max_batch_size == max(ran) <= cap
    assert evidence.throughput  # samples/s measured at a few sizes
    decision = profile.decision("batch.batch_size")
    assert decision is not None
    assert decision.source is Source.MEASURED


def test_tune_measures_the_batch_and_says_so() -> None:
    _assert_measured_within(_tune(budget_s=20, max_batch_size=64), 64)


class _Unruly(SimulatedTrials):
    """Simulated trials that change what real training changes: the RNG, torch's thread
    count and the cuDNN autotuner."""

    def __call__(self, batch_size: int) -> TrialOutcome:
        self._disturb()
        return super().__call__(batch_size)

    def point(
        self, batch_size: int, *, until: float, deadline: float | None = None
    ) -> PointOutcome:
        self._disturb()
        return super().point(batch_size, until=until, deadline=deadline)

    @staticmethod
    def _disturb() -> None:
        torch.rand(1)
        torch.set_num_threads(torch.get_num_threads() + 1)
        torch.backends.cudnn.benchmark = True


def test_tune_leaves_rng_and_flags_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    threads = torch.get_num_threads()
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    machine = mlp_machine()

    def trials(workload: Workload, step: StepSettings) -> _Unruly:
        return _Unruly(machine, step, workload=workload)

    tune("mlp", snapshot=LAPTOP, budget_s=10, max_batch_size=16, clock=machine.clock, trials=trials)
    assert machine.log  # the trials ran, and disturbed
    assert torch.equal(torch.rand(2), expected)
    assert torch.backends.cudnn.benchmark is False
    assert torch.get_num_threads() == threads


def test_a_budget_too_small_for_one_step_is_a_probe_error() -> None:
    ticks: Iterator[float] = itertools.count(0.0, 100.0)  # every clock read is 100 s later
    with pytest.raises(ProbeError, match="--budget") as caught:
        tune("mlp", snapshot=LAPTOP, budget_s=50, clock=ticks.__next__)
    assert caught.value.exit_code == EXIT_PROBE


def test_progress_reports_each_phase() -> None:
    seen: list[str] = []
    _tune(budget_s=15, max_batch_size=32, progress=lambda p, _w: seen.append(p))
    assert seen[0] == "detect"
    assert {"search", "throughput", "workers"} <= set(seen)


def test_target_global_batch_sets_gradient_accumulation() -> None:
    profile = _tune(budget_s=15, max_batch_size=16, target_global_batch=256)
    batch = profile.settings.batch
    assert batch.batch_size is not None
    assert batch.grad_accum_steps * batch.batch_size >= 256
    assert (batch.grad_accum_steps - 1) * batch.batch_size < 256


def test_the_users_worker_count_is_used_and_not_measured() -> None:
    profile = _tune(budget_s=10, max_batch_size=8, num_workers=3)
    assert profile.settings.dataloader.num_workers == 3
    decision = profile.decision("dataloader.num_workers")
    assert decision is not None
    assert decision.source is Source.USER
    assert profile.evidence is not None
    assert profile.evidence.loader == ()


@pytest.mark.slow
def test_a_real_tune_on_this_cpu_measures_reports_and_restores() -> None:
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    benchmark = torch.backends.cudnn.benchmark
    seen: list[str] = []
    profile = tune(
        "mlp",
        snapshot=LAPTOP,
        budget_s=20,
        max_batch_size=64,
        progress=lambda p, _w: seen.append(p),
    )
    _assert_measured_within(profile, 64)
    assert seen[0] == "detect"
    assert {"search", "throughput", "workers"} <= set(seen)
    assert torch.equal(torch.rand(2), expected)
    assert torch.backends.cudnn.benchmark is benchmark


# --- what the batch leaves of an epoch ------------------------------------------------------


def _with_samples(samples: int, *, ranks: int = 1) -> Workload:
    conv = resolve_workload("conv")
    assert conv.dataset is not None
    data = Subset(conv.dataset, range(samples))
    return replace(conv, dataset=data, max_batch_size=samples, ranks_sharing_data=ranks)


def test_a_batch_of_more_than_half_the_dataset_is_said_to_leave_one_step_an_epoch() -> None:
    assert epoch_note(_with_samples(512), 256, drops_last=False) is None  # two steps
    note = epoch_note(_with_samples(512), 512, drops_last=False)
    assert note is not None
    assert note.startswith("batch 512 is more than half of the 512 samples the dataset holds")
    assert "drop_last" not in note
    assert note.endswith("cap the batch (--max-batch-size, or tune()'s max_batch_size)")
    # BatchNorm's profile drops the last batch: a split of the data it was tuned on has none
    dropped = epoch_note(_with_samples(512), 300, drops_last=True)
    assert dropped is not None
    assert "a training set of fewer than 300 samples has none" in dropped
    # two ranks draw 150 each of 300
    shared = epoch_note(_with_samples(300, ranks=2), 100, drops_last=False)
    assert shared is not None
    assert "of the 150 samples each rank draws" in shared


def test_a_run_whose_batch_is_the_whole_dataset_warns() -> None:
    profile = tune_on(mlp_machine(), _with_samples(96), LAPTOP, budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.batch_size * 2 > 96
    assert any(
        w.startswith(f"batch {evidence.batch_size} is more than half") for w in evidence.warnings
    )
