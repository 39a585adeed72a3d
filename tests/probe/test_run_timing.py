"""``tune()``'s orchestration on simulated machines: the time model, the budget, steady points
and compile, driven by recorded timings through the ``trials`` seam (milliseconds per test)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.probe.fake_trials import cpu_machine, recorded, tune_on
from torch_autotune.api import tune
from torch_autotune.errors import ProbeError
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.probe.guard import NEAR_TIME_GUARD, TIME_GUARD
from torch_autotune.probe.judge import payoff_minutes
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.trials import StepSettings
from torch_autotune.probe.variants import compile_seconds
from torch_autotune.probe.workloads import Workload, resolve_workload
from torch_autotune.profile import Profile, Source
from torch_autotune.settings import memory_settings

H100 = recorded("h100-80gb-hbm3")
LAPTOP = recorded("cpu-laptop-linux")


def _workload() -> Workload:
    """The conv workload without a dataset: no real DataLoader in these tests."""
    return dataclasses.replace(resolve_workload("conv"), dataset=None, name="simulated")


def _tune(
    machine: SimulatedMachine, snapshot: HardwareSnapshot = H100, **options: object
) -> Profile:
    return tune_on(machine, _workload(), snapshot, **options)


def _ran(profile: Profile) -> set[int]:
    assert profile.evidence is not None
    return {t.batch_size for t in profile.evidence.search if t.fits}


def test_a_slow_first_step_does_not_stop_the_search_short() -> None:
    # The bug the first GPU run found: a sticky seconds-per-sample from the first trial
    # refused every size above 9. Here the first step is 10x slower than everything else.
    machine = SimulatedMachine(first_s=10 * 0.012 * 3, leaves=1)
    profile = _tune(machine, mode="balanced", budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.limited_by == "memory"
    assert evidence.max_batch_size == machine.limit  # exact: it ran, limit + 1 did not
    assert machine.limit + 1 in {t.batch_size for t in evidence.search if not t.fits}
    assert not [t for t in evidence.search if "time-guard" in t.step]


def test_the_h100_resnet_run_finds_the_limit_measures_compile_and_fits_180_s() -> None:
    # ResNet-50 on an H100: 14 s first step, 7 s autotuner, 80 s compile
    machine = SimulatedMachine()
    profile = _tune(machine)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.max_batch_size == machine.limit
    assert evidence.elapsed_s <= evidence.budget_s == 180
    record = evidence.compile
    assert record is not None
    assert record.measured
    assert record.kept
    assert record.compile_s == pytest.approx(80, abs=1)
    assert "1.23x" in record.reason
    assert "pays off after" in record.reason
    decision = profile.decision("compile.enabled")
    assert decision is not None
    assert decision.source is Source.MEASURED
    assert decision.value is True
    # the batch recommended ran compiled, and its throughput point is the compiled one
    assert profile.settings.batch.batch_size in _ran(profile)
    compiled = [r for r in evidence.throughput if r.compiled]
    # the compiled model's own search found its own limit (here the eager one: the default
    # machine needs no more memory compiled), and its points ran at its own candidates, on one
    # compiled module
    searched = [t for t in evidence.search if t.variant.startswith("compiled")]
    assert max(t.batch_size for t in searched if t.fits) == machine.limit
    assert [r.batch_size for r in compiled] == [1664, 832, 416]
    assert machine.compiled_once
    assert profile.settings.batch.batch_size in {r.batch_size for r in compiled}
    assert [p.name for p in evidence.phases] == ["search", "throughput", "compile", "workers"]
    # the steady compiled point ran after the search with the final settings: it confirms
    assert evidence.search[-1].step == "confirm (its throughput point)"
    assert evidence.search[-1].batch_size == profile.settings.batch.batch_size
    # compiled once: one compile for every compiled size
    assert machine.log.count("point " + str(compiled[0].batch_size) + " compiled") == 1


def test_compile_that_is_not_faster_is_dropped_with_the_numbers() -> None:
    machine = SimulatedMachine(compiled_speedup=1.01)
    profile = _tune(machine)
    decision = profile.decision("compile.enabled")
    assert decision is not None
    assert decision.value is False
    assert decision.source is Source.MEASURED
    assert "not faster beyond" in decision.reason
    assert profile.evidence is not None
    assert profile.settings.batch.batch_size == profile.evidence.fastest_batch_size


def test_a_compile_that_cannot_fit_the_budget_is_decided_by_the_rules_and_says_so() -> None:
    machine = SimulatedMachine(compile_s=60, leaves=400)  # predicted 240 s: more than the budget
    profile = _tune(machine, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.compile is not None
    assert not evidence.compile.measured
    assert "--budget" in evidence.compile.reason
    assert not [line for line in machine.log if "compiled" in line]
    decision = profile.decision("compile.enabled")
    assert decision is not None
    assert decision.source is not Source.MEASURED
    assert "not measured" in decision.reason
    assert any("not measured" in w for w in evidence.warnings)


def test_a_compiled_model_needing_more_memory_is_measured_at_a_smaller_size() -> None:
    # On the H100, dynamic-batch compiled ResNet-50 reserved 74.1 GiB at 1536 where eager
    # reserved 68.5 GiB: the eager limit does not carry over to the compiled model.
    machine = SimulatedMachine(compiled_limit=1000)
    profile = _tune(machine)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.compile is not None
    compiled = [r for r in evidence.throughput if r.compiled]
    assert compiled
    assert compiled[0].batch_size <= 1000
    assert profile.settings.batch.batch_size in _ran(profile)
    # its own search, on its own memory curve, found the compiled limit exactly, and its
    # points are its own candidates: 1000 less K2's 10%, rounded to 8, and halvings
    searched = [t for t in evidence.search if t.variant.startswith("compiled")]
    assert max(t.batch_size for t in searched if t.fits) == 1000
    assert min(t.batch_size for t in searched if not t.fits) == 1001
    assert [r.batch_size for r in compiled] == [896, 448, 224]
    # the profile's batch ran with the profile's settings that change memory
    assert profile.settings.batch.batch_size in evidence.ran(memory_settings(profile.settings))


def test_noisy_points_are_not_chosen_and_the_summary_warns() -> None:
    # the top candidate (1850 - 10%, by 8) is noisy
    machine = SimulatedMachine(noise={1664: 0.2}, leaves=1)
    profile = _tune(machine, mode="balanced")
    evidence = profile.evidence
    assert evidence is not None
    noisy = [r for r in evidence.throughput if not r.steady]
    assert [r.batch_size for r in noisy] == [1664]
    assert evidence.fastest_batch_size != 1664


def test_when_no_point_is_steady_the_fastest_that_ran_is_recommended_with_a_warning() -> None:
    machine = SimulatedMachine(noise={1664: 0.2, 832: 0.2, 416: 0.2}, leaves=1)
    profile = _tune(machine, mode="balanced")
    evidence = profile.evidence
    assert evidence is not None
    rates = {p.batch_size: p.samples_per_s for p in evidence.throughput}
    assert sorted(rates) == [416, 832, 1664]
    batch = profile.settings.batch.batch_size
    assert rates[batch] >= max(rates.values()) * 0.97  # the smallest within 3% of the fastest
    assert all(rates[b] < max(rates.values()) * 0.97 for b in rates if b < batch)
    (warning,) = [w for w in evidence.warnings if "no throughput point was steady" in w]
    # true whatever later phases make of the batch (a margin, the fed passes): it said "the
    # recommended batch is the largest that ran" where the fed passes recommended 64 of 512
    assert "the step's fastest batch is not known, and the size whose point ran fastest" in warning


def test_a_size_too_slow_for_the_time_left_is_skipped_with_its_prediction() -> None:
    # A slow machine: 2 s per sample. Batch 64 would take 6+ minutes: not in a 120 s budget.
    machine = SimulatedMachine(fixed_s=0.05, per_sample_s=2.0, first_s=1.0, limit=10_000, leaves=1)
    profile = _tune(machine, snapshot=LAPTOP, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    refused = [t for t in evidence.search if "time-guard" in t.step]
    assert refused
    for record in refused:
        assert record.predicted_s is not None
        assert record.left_s is not None
        assert record.predicted_s > 0
    assert evidence.limited_by in ("time", "budget")
    if evidence.limited_by == "budget":
        assert evidence.elapsed_s >= 0.9 * evidence.budget_s
    assert evidence.limit_reason is not None
    assert "predicted" in evidence.limit_reason or "spent" in evidence.limit_reason
    assert evidence.elapsed_s <= evidence.budget_s


def test_a_size_refused_beside_one_refused_for_time_says_so() -> None:
    """Found on an H100 (its GPU tier): a size within 25% of the largest that ran, beside a
    smaller size refused for time, was recorded as refused for time with no prediction, as if
    its own prediction had refused it. A slow decoder-like step on the recorded H100, 110 s."""
    machine = SimulatedMachine(
        fixed_s=0.0355, per_sample_s=0.424, first_s=3.82, limit=8458, compile_s=7.96, leaves=1
    )
    profile = _tune(machine, snapshot=recorded("h100-80gb-hbm3"), budget_s=110.3)
    evidence = profile.evidence
    assert evidence is not None
    by_time = [t for t in evidence.search if t.step == TIME_GUARD]
    beside = [t for t in evidence.search if t.step == NEAR_TIME_GUARD]
    assert by_time
    assert beside
    for record in by_time:  # refused by its own prediction: the record gives it
        assert record.predicted_s is not None
        assert record.left_s is not None
    for record in beside:  # a size refused for time lies within 25% of the largest that ran
        refused = [t.batch_size for t in by_time if t.variant == record.variant]
        ran = [t.batch_size for t in evidence.search if t.fits and t.variant == record.variant]
        assert min(refused) <= 1.25 * max(ran) < 1.25 * record.batch_size
        assert record.predicted_s is not None
    # time stopped it, and the summary says so: not "batch N ran out of memory" (the CPU's
    # transformer said that of a size it never ran, 2026-11-27)
    assert evidence.limited_by in ("time", "budget")
    assert "ran out of memory" not in (evidence.limit_reason or "")
    above = min(t.batch_size for t in evidence.search if t.batch_size > evidence.max_batch_size)
    if evidence.limited_by == "time" and above in {t.batch_size for t in beside}:
        assert evidence.limit_reason is not None
        assert evidence.limit_reason.startswith(
            f"batch {above} was not run: it is within 25% of the largest that ran, beside a"
            " size refused for time (batch "
        )


def test_the_cpu_search_reaches_the_cap() -> None:
    # This 2-core CPU, small conv net: about 0.02 s per sample per step.
    machine = cpu_machine(fixed_s=0.05, per_sample_s=0.02, first_s=0.3, autotune_s=0.0)
    profile = _tune(machine, snapshot=LAPTOP, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.limited_by == "cap"
    assert evidence.max_batch_size == 512
    assert "CPU cap of 512" in (evidence.limit_reason or "")


def test_a_cpu_that_gets_more_efficient_with_the_batch_still_reaches_the_cap() -> None:
    # Recorded on this 2-core CPU (small conv net, while other work ran): a step took 0.065 s
    # at batch 1, 0.39 s at 8 and 3.5 s at 191. Extrapolating from 1 and 8 alone predicts
    # 172 s for 512 and its measurement; sizes in between correct the model first.
    machine = cpu_machine(
        fixed_s=0.02,
        per_sample_s=0.05,
        exponent=0.69,
        first_s=0.37,
        new_shape_s=0.3,
        autotune_s=0.3,
    )
    profile = _tune(machine, snapshot=LAPTOP, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.max_batch_size == 512
    assert evidence.limited_by == "cap"
    assert evidence.elapsed_s <= 120
    # With half the time, 512 is not refused on the word of sizes 1 and 8: sizes in between
    # run first ("time model"), and the search ends at the cap or says what the time allowed.
    machine.restart()
    profile = _tune(machine, snapshot=LAPTOP, budget_s=60)
    evidence = profile.evidence
    assert evidence is not None
    assert [t.batch_size for t in evidence.search if t.step == "time model"]
    assert evidence.limited_by in ("cap", "time")
    assert evidence.max_batch_size >= 128
    assert evidence.elapsed_s <= 60


def test_when_the_smallest_candidate_is_fastest_smaller_sizes_are_measured_too() -> None:
    # On this 2-core CPU the small conv net ran 238, 292 and 371 samples/s at 512, 256 and
    # 128: throughput fell with the batch, so the fastest size lies lower.
    machine = cpu_machine(
        fixed_s=0.004,
        per_sample_s=0.0006,
        exponent=1.2,
        first_s=0.3,
        new_shape_s=0.1,
        autotune_s=0.1,
    )
    profile = _tune(machine, snapshot=LAPTOP, budget_s=120)
    evidence = profile.evidence
    assert evidence is not None
    measured = sorted(r.batch_size for r in evidence.throughput)
    assert measured[0] < 128  # halvings below the candidates 512, 256, 128
    best = max(evidence.throughput, key=lambda r: r.samples_per_s)
    chosen = next(r for r in evidence.throughput if r.batch_size == evidence.batch_size)
    assert evidence.batch_size < 128
    assert chosen.samples_per_s >= 0.97 * best.samples_per_s
    assert len(measured) <= 3 + 3


machines = st.builds(
    SimulatedMachine,
    limit=st.integers(1, 5000),
    fixed_s=st.floats(0.001, 0.5),
    per_sample_s=st.floats(1e-5, 0.2),
    first_s=st.floats(0.0, 30.0),
    new_shape_s=st.floats(0.0, 2.0),
    autotune_s=st.floats(0.0, 10.0),
    compile_s=st.floats(1.0, 120.0),
    exponent=st.floats(0.5, 1.0),
    leaves=st.just(20),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machine=machines, budget_s=st.floats(30.0, 300.0), cpu=st.booleans())
def test_the_budget_is_never_overrun_or_blamed_falsely(
    machine: SimulatedMachine, budget_s: float, cpu: bool
) -> None:
    profile = _tune(machine, snapshot=LAPTOP if cpu else H100, budget_s=budget_s)
    evidence = profile.evidence
    assert evidence is not None
    if evidence.limited_by == "budget":
        assert evidence.elapsed_s >= 0.9 * evidence.budget_s
    assert profile.settings.batch.batch_size in _ran(profile) | {
        r.batch_size for r in evidence.throughput
    }
    # One step beyond the deadline at most: the time model is exact here, warm-ups aside
    # (the compile warm-up and the first autotuned point are measured, not predicted).
    step = machine.fixed_s + machine.per_sample_s * machine.limit
    slack = machine.compile_s + machine.autotune_s + machine.first_s + 3 * step
    assert evidence.elapsed_s <= budget_s + slack


def test_a_budget_gone_before_the_first_trial_is_a_probe_error() -> None:
    machine = SimulatedMachine()
    ticks = iter(range(0, 10_000, 100))  # every clock read is 100 s later

    def trials(_workload: Workload, step: StepSettings) -> SimulatedTrials:
        return SimulatedTrials(machine, step)

    with pytest.raises(ProbeError, match="--budget"):
        tune(_workload(), snapshot=H100, budget_s=50, clock=lambda: next(ticks), trials=trials)


def test_compile_estimates_and_payoff() -> None:
    assert compile_seconds(137) == pytest.approx(82.2)
    assert compile_seconds(1) == 15.0
    # 80 s to compile for 5238 against 4253 samples/s: even after 80 * 5238 / 985 s
    assert payoff_minutes(80, 4253, 5238) == pytest.approx(80 * 5238 / 985 / 60)
    assert payoff_minutes(80, 100, 90) is None
