"""The whole probe on this CPU with a real model: measured profile, budget, errors, state."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torch_autotune.errors import EXIT_PROBE, ProbeError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.run import tune
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
    assert {"search", "throughput", "workers"} <= set(seen)


def test_target_global_batch_sets_gradient_accumulation(laptop: HardwareSnapshot) -> None:
    profile = tune("mlp", snapshot=laptop, budget_s=15, max_batch_size=16, target_global_batch=256)
    batch = profile.settings.batch
    assert batch.batch_size is not None
    assert batch.grad_accum_steps * batch.batch_size >= 256
    assert (batch.grad_accum_steps - 1) * batch.batch_size < 256


def test_the_users_worker_count_is_used_and_not_measured(laptop: HardwareSnapshot) -> None:
    profile = tune("mlp", snapshot=laptop, budget_s=10, max_batch_size=8, num_workers=3)
    assert profile.settings.dataloader.num_workers == 3
    decision = profile.decision("dataloader.num_workers")
    assert decision is not None
    assert decision.source is Source.USER
    assert profile.evidence is not None
    assert profile.evidence.loader == ()
