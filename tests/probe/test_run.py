"""The whole probe on this CPU with a real model: measured profile, budget, errors, state."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torch_autotune.errors import EXIT_PROBE, ProbeError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.run import _Clocked, tune
from torch_autotune.probe.search import TrialOutcome
from torch_autotune.profile import Source

SNAPSHOT_DIR = Path(__file__).parent.parent / "fixtures" / "snapshots"


@pytest.fixture(scope="module")
def laptop() -> HardwareSnapshot:
    """A recorded CPU-only machine: the probe runs here for real, on this CPU."""
    return HardwareSnapshot.model_validate_json(
        (SNAPSHOT_DIR / "cpu-laptop-linux.json").read_text()
    )


def test_tune_measures_the_batch_and_says_so(laptop: HardwareSnapshot) -> None:
    profile = tune("mlp", snapshot=laptop, budget_s=20, max_batch_size=64)
    evidence = profile.evidence
    assert evidence is not None
    assert profile.measured
    ran = {t.batch_size for t in evidence.search if t.fits}
    assert profile.settings.batch.batch_size == evidence.batch_size
    assert evidence.batch_size in ran  # never a size that did not run
    assert evidence.max_batch_size == max(ran) <= 64
    assert evidence.throughput  # samples/s measured at a few sizes
    decision = profile.decision("batch.batch_size")
    assert decision is not None
    assert decision.source is Source.MEASURED


def test_tune_leaves_rng_and_flags_as_they_were(laptop: HardwareSnapshot) -> None:
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    benchmark = torch.backends.cudnn.benchmark
    tune("mlp", snapshot=laptop, budget_s=10, max_batch_size=16)
    assert torch.equal(torch.rand(2), expected)
    assert torch.backends.cudnn.benchmark is benchmark


def test_a_budget_too_small_for_one_step_is_a_probe_error(laptop: HardwareSnapshot) -> None:
    ticks: Iterator[float] = itertools.count(0.0, 100.0)  # every clock read is 100 s later
    with pytest.raises(ProbeError, match="--budget") as caught:
        tune("mlp", snapshot=laptop, budget_s=50, clock=ticks.__next__)
    assert caught.value.exit_code == EXIT_PROBE


def test_progress_reports_each_phase(laptop: HardwareSnapshot) -> None:
    seen: list[str] = []
    tune(
        "mlp",
        snapshot=laptop,
        budget_s=15,
        max_batch_size=32,
        progress=lambda p, _w: seen.append(p),
    )
    assert seen[0] == "detect"
    assert {"search", "throughput", "confirm"} <= set(seen)


def test_target_global_batch_sets_gradient_accumulation(laptop: HardwareSnapshot) -> None:
    profile = tune("mlp", snapshot=laptop, budget_s=15, max_batch_size=16, target_global_batch=256)
    batch = profile.settings.batch
    assert batch.batch_size is not None
    assert batch.grad_accum_steps * batch.batch_size >= 256
    assert (batch.grad_accum_steps - 1) * batch.batch_size < 256


class _Runner:
    """Stands in for TrialRunner: each trial takes 0.01 s per sample and 1 MiB per sample."""

    def __init__(self) -> None:
        from torch_autotune.probe.trials import StepSettings

        self.settings = StepSettings(steps=3)
        self.ran: list[int] = []

    def __call__(self, batch_size: int) -> TrialOutcome:
        self.ran.append(batch_size)
        return TrialOutcome(True, (100 + batch_size) << 20, 0.02 * batch_size)


def _clocked(runner: _Runner, now: list[float], **fields: object) -> _Clocked:
    return _Clocked(runner, 100.0, lambda: now[0], lambda _p, _w: None, "search", [], **fields)  # type: ignore[arg-type]


def test_a_trial_too_slow_for_the_time_left_is_not_started() -> None:
    runner, now = _Runner(), [0.0]
    clocked = _clocked(runner, now)
    assert clocked(10).fits
    now[0] = 90.0  # 10 s left; a trial of 1000 samples is predicted to take ~45 s
    outcome = clocked(1000)
    assert outcome.fits is False
    assert runner.ran == [10]
    assert clocked.trials[-1].step == "time-guard (not run)"


def test_a_trial_predicted_to_exceed_host_ram_is_not_started() -> None:
    runner, now = _Runner(), [0.0]
    clocked = _clocked(runner, now, ram_budget_bytes=2 << 30)
    clocked(1)
    clocked(8)
    outcome = clocked(4096)  # ~4.1 GiB predicted from the two readings
    assert outcome.fits is False
    assert runner.ran == [1, 8]
    assert clocked.trials[-1].step == "ram-guard (not run)"
    assert clocked(1024).fits  # ~1.2 GiB fits and runs


def test_the_users_worker_count_is_used_and_not_measured(laptop: HardwareSnapshot) -> None:
    profile = tune("mlp", snapshot=laptop, budget_s=10, max_batch_size=8, num_workers=3)
    assert profile.settings.dataloader.num_workers == 3
    decision = profile.decision("dataloader.num_workers")
    assert decision is not None
    assert decision.source is Source.USER
    assert profile.evidence is not None
    assert profile.evidence.loader == ()
