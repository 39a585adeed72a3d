"""The bench held to --memory-limit on the CPU as the search is: an arm stopped between steps
once it has gone over, its growth counted from the same baseline as a search trial's, and the
numbers said so that they differ where the bytes do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from torch_autotune.bench import ArmFailed, TrainConfig
from torch_autotune.probe.guard import apart
from torch_autotune.probe.loop import TrainingLoop
from torch_autotune.probe.trials import StepSettings, TrialRunner
from torch_autotune.probe.workloads import as_workload

MIB = 1 << 20
linux_only = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")


def _workload(model: type[torch.nn.Module], name: str) -> Any:
    return as_workload(
        {
            "model": model,
            "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
            "example_batch": (torch.randn(4, 4), torch.randint(0, 2, (4,))),
        },
        name=name,
    )


_kept: list[torch.Tensor] = []


class _Leaking(torch.nn.Module):
    """Each step keeps 96 MiB of fresh host RAM (written, so resident), and counts itself."""

    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).steps += 1
        _kept.append(torch.ones(24 * MIB))  # 96 MiB
        return self.linear(x)


@linux_only
def test_an_arm_over_the_limit_is_stopped_between_steps_not_trained_to_its_end() -> None:
    """An arm that grew 16x past --memory-limit trained for 115 s, and only then failed: the
    loop now reads the resident high-water mark after each step and stops it there (the
    loop's first arm once past twice the cap: its baseline settles only after it)."""
    loop = TrainingLoop(
        _workload(_Leaking, "leaking"),
        "cpu",
        warmup_steps=2,
        min_steps=6,
        memory_limit_bytes=64 * MIB,
    )
    _Leaking.steps = 0
    try:
        with pytest.raises(ArmFailed) as failed:
            loop.measure(TrainConfig(batch_size=4), 0.0)
    finally:
        _kept.clear()
    assert _Leaking.steps == 2  # 96 MiB, then 192 MiB: past twice the 64 MiB cap; not 8 steps
    assert "was stopped: it had taken" in str(failed.value)
    assert "more than the 0.062 GiB the memory limit allows" in str(failed.value)


_cache: list[torch.Tensor] = []


class _FirstStepKeeps(torch.nn.Module):
    """The first step keeps 56 MiB for good (as torch's first step keeps its pools); every
    step takes 16 MiB more, let go when it ends: 72 MiB in all, over a 64 MiB cap."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _cache:
            _cache.append(torch.ones(14 * MIB))  # 56 MiB, kept
        scratch = torch.ones(4 * MIB)  # 16 MiB, let go
        return self.linear(x) + scratch[:1]


@linux_only
def test_the_bench_counts_an_arms_growth_from_the_baseline_a_search_trial_counts_from() -> None:
    """The search counts a trial's growth beyond what the process held once its first trial
    had run; the bench counted from as the arm began, so what torch's first step keeps made
    the first arm fail where the search's same batch fit (0.23 GiB over a 0.2 GiB limit at
    batch 1, the size the search had tuned). Both now count alike: the same step fits both."""
    cap = 64 * MIB
    workload = _workload(_FirstStepKeeps, "first-step-keeps")
    try:
        _cache.clear()
        trial = TrialRunner(workload, StepSettings(memory_limit_bytes=cap))(4)
        _cache.clear()
        loop = TrainingLoop(workload, "cpu", warmup_steps=1, min_steps=2, memory_limit_bytes=cap)
        rate = loop.measure(TrainConfig(batch_size=4), 0.0)
    finally:
        _cache.clear()
    assert trial.fits
    assert rate > 0


def test_a_limit_and_what_went_over_it_are_said_apart() -> None:
    """'took 0.2 GiB ..., more than the 0.2 GiB the memory limit allows' read as false."""
    limit = int(0.2 * 2**30)
    assert apart(int(0.2037 * 2**30), limit) == ("209 MiB", "205 MiB")
    assert apart(3 * 2**30, limit) == ("3.0 GiB", "0.2 GiB")
    said, allowed = apart(limit + 1000, limit)
    assert said != allowed


def _tuned_under_the_limit() -> tuple[Any, Any, int]:
    """As on the wide workload tuned under --memory-limit 0.2: only checkpointed batch 1 fit
    (0.12 GiB beyond what the process held), batch 2 went over (0.25 GiB); (settings of the
    profile, its evidence, the cap)."""
    from tests.test_bench import measured
    from torch_autotune.evidence import SearchTrialRecord, VariantRecord
    from torch_autotune.settings import memory_settings, torch_defaults

    cap, held = int(0.2 * 2**30), 414_699_520
    settings = torch_defaults("cpu").model_copy(update={"activation_checkpointing": True})
    evidence = measured("cpu-laptop-linux", workload="mlp").evidence
    assert evidence is not None
    search = (
        SearchTrialRecord(
            batch_size=1, fits=True, peak_memory_bytes=539_803_648, seconds=40.0, step="start"
        ),
        SearchTrialRecord(
            batch_size=2,
            fits=False,
            peak_memory_bytes=679_227_392,
            seconds=38.0,
            step="over --memory-limit",
        ),
    )
    evidence = evidence.model_copy(
        update={
            "search": search,
            "memory_limit_bytes": held + cap,
            "variants": (VariantRecord(name="eager", settings=memory_settings(settings)),),
        }
    )
    return settings, evidence, cap


def test_an_arm_predicted_over_the_limit_fails_with_the_prediction_and_is_not_run() -> None:
    """The default baseline (batch 32) of a profile tuned under --memory-limit 0.2 GiB trained
    for 115 s to 3.3 GiB before it failed: the search's peaks predicted it. It is now refused
    before it runs, and so is the checkpointed batch 32; batch 1, which fit, runs."""
    from torch_autotune.bench import plan_arms
    from torch_autotune.probe.ablation import run_arms
    from torch_autotune.probe.workloads import resolve_workload

    settings, evidence, cap = _tuned_under_the_limit()
    tuned = TrainConfig(batch_size=1, settings={"activation_checkpointing": True})
    plan = plan_arms(TrainConfig(), tuned)
    ran: list[TrainConfig] = []

    def measure(config: TrainConfig, _seconds: float) -> float:
        ran.append(config)
        return 10.0

    results = run_arms(
        plan,
        resolve_workload("mlp"),
        settings,
        mode="speed",
        rounds=1,
        seconds=0.1,
        measure=measure,
        memory_limit_bytes=cap,
        evidence=evidence,
    )
    assert ran
    assert all(config.batch_size == 1 for config in ran)
    errors = {r.config.batch_size: r.error for r in results.records}
    assert errors[1] is None
    assert errors[32] is not None
    assert errors[32].startswith("not run: predicted to take")
    assert "at batch 32 (from the search's peaks at batch 1 and 2)" in errors[32]
    assert "more than the 0.2 GiB the memory limit allows" in errors[32]
    baseline = next(r for r in results.records if r.names[0] == "baseline")
    assert "predicted to take at least 4.1 GiB" in str(baseline.error)  # from checkpointed peaks


def test_an_arm_that_failed_a_round_is_not_shown_as_a_rate_alone() -> None:
    """An arm failed round 1 over the limit, yet the table showed it at 2.6 samples/s (the
    median of the rounds that ran) as if that were its whole measurement."""
    import io

    from rich.console import Console

    from tests.test_bench import measured
    from torch_autotune.api import bench
    from torch_autotune.render.bench_results import render_bench

    profile = measured("a100-sxm4-80gb-8x")
    failed: list[TrainConfig] = []

    def measure(config: TrainConfig, _seconds: float) -> float:
        if config.batch_size != 32 and not failed:  # the tuned arm's first round
            failed.append(config)
            raise ArmFailed("took 209 MiB of host RAM beyond what the process held")
        return 2.6

    benched = bench(profile, "conv", rounds=3, seconds=0.1, measure=measure)
    out = io.StringIO()
    render_bench(benched, Console(file=out, width=400))
    rows = [line for line in out.getvalue().splitlines() if "took 209 MiB" in line]
    assert len(rows) == 1
    assert "2.6 (1 of 3 rounds failed)" in rows[0]


def test_the_first_estimate_counts_the_arms_of_the_baseline_given() -> None:
    """With a baseline at the profile's batch the bench said 'about 24 s: 4 arms', then '12 s
    for 2 arms' once it had planned them: the first estimate planned the default baseline's."""
    from tests.test_bench import measured
    from torch_autotune import api, compose

    profile = measured("a100-sxm4-80gb-8x")
    baseline = TrainConfig(batch_size=profile.settings.batch.batch_size or 1)
    plan, _ = compose.bench_plan(profile, baseline, has_dataset=True, workload="conv")
    _, how = api.bench_estimate(profile, 3, 1.0, None, baseline)
    assert f": {len(plan.configs)} arms x 3 rounds" in how
    assert len(plan.configs) != len(
        compose.bench_plan(profile, None, has_dataset=True, workload="conv")[0].configs
    )


def test_a_batch_the_search_ran_twice_is_named_once_in_the_prediction() -> None:
    """Batch 2 ran twice in the search (its confirmation): the reason said 'from the search's
    peaks at batch 2 and 2'; it names the two batches the prediction came from."""
    from torch_autotune.bench import plan_arms
    from torch_autotune.probe.ablation import predicted_over

    settings, evidence, cap = _tuned_under_the_limit()
    again = evidence.search[0].model_copy(update={"batch_size": 2, "fits": True})
    evidence = evidence.model_copy(update={"search": (*evidence.search, again)})
    tuned = TrainConfig(batch_size=1, settings={"activation_checkpointing": True})
    plan = plan_arms(TrainConfig(), tuned)
    refused = predicted_over(plan.configs, settings, evidence, cap)
    said = [why for config, why in refused.items() if config.batch_size == 32]
    assert said
    assert all("peaks at batch 1 and 2)" in why for why in said)


def test_the_high_water_mark_is_read_after_every_warm_up_step_and_seldom_in_timed_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading it costs 22 us on this CPU, 5% of a tiny MLP's 0.4 ms step, inside the timed
    steps: small batches' arms were slowed more than large ones'. In the timed rounds it is
    read at most every OVER_CHECK_S; after each warm-up step, always."""
    from torch_autotune.probe import loop as loop_module

    reads: list[int] = []
    monkeypatch.setattr(loop_module, "grown_since", lambda *_: reads.append(1) or 0)
    loop = TrainingLoop(_workload(_Leaking, "leaking"), "cpu", memory_limit_bytes=64 * MIB)
    loop._held = 0
    for _ in range(50):
        loop._stop_if_over()
    assert len(reads) == 50  # the warm-up's steps
    loop._timed = True
    for _ in range(50):
        loop._stop_if_over()
    assert len(reads) == 51  # 50 steps well within OVER_CHECK_S: one read
