"""``autotune bench`` ablates activation checkpointing with its coupling: its "off" arm trains at
the batch that ran without it (the profile's batch may not fit without it), a drop brings that
batch back with it, and where nothing trained without it, it is kept as required. The profiles
come from the simulated H100 of ``tests/probe/test_checkpointing.py``; the bench's arms train
on the same simulated machine (``measure``)."""

from __future__ import annotations

from tests.probe.fake_trials import recorded, tune_on
from tests.probe.test_checkpointing import (
    _balanced,
    _growing,
    _simulated_token_workload,
)
from torch_autotune import api, compose
from torch_autotune.bench import ArmFailed, TrainConfig
from torch_autotune.probe.simulated import SimulatedMachine
from torch_autotune.profile import Profile, Source

H100 = recorded("h100-80gb-hbm3")
NAME = "activation_checkpointing"


def _arms_on(machine: SimulatedMachine):  # type: ignore[no-untyped-def]
    """The bench's ``measure`` on ``machine``: samples/s of an arm, or ArmFailed where its
    batch does not fit (what a real arm's out-of-memory is)."""

    def measure(config: TrainConfig, _seconds: float) -> float:
        checkpointed = bool(config.settings.get(NAME))
        compiled = config.compile_mode is not None
        if not machine.fits(config.batch_size, compiled=compiled, checkpointed=checkpointed):
            raise ArmFailed(f"out of memory at batch {config.batch_size}")
        step = machine.step_s(config.batch_size, compiled=compiled, checkpointed=checkpointed)
        return config.batch_size / step

    return measure


def _kept() -> Profile:
    profile = _balanced(_growing(1.05))
    assert profile.settings.activation_checkpointing
    return profile


def _fastest_without(profile: Profile) -> int:
    assert profile.evidence is not None
    points = [t for t in profile.evidence.throughput if t.variant == "eager" and t.steady]
    return max(points, key=lambda t: t.samples_per_s).batch_size


def test_its_off_arm_trains_at_the_batch_that_ran_without_it() -> None:
    profile = _kept()
    plan, not_ablated = compose.bench_plan(profile, None, has_dataset=False, workload="decoder")
    assert not any("activation checkpointing" in line for line in not_ablated)
    without = _fastest_without(profile)
    assert without <= 120 < (profile.settings.batch.batch_size or 0)  # 120: its limit without
    assert plan.off_batch == {NAME: without}
    (off,) = [c for c, n in zip(plan.configs, plan.names, strict=True) if f"tuned - {NAME}" in n]
    assert NAME not in off.settings
    assert off.batch_size == without
    assert off.precision == plan.tuned.precision  # only the coupled two move


def test_kept_where_it_is_faster_on_the_bench_too() -> None:
    benched = api.bench(
        _kept(), _simulated_token_workload(), measure=_arms_on(_growing(1.05)), seconds=0.01
    )
    assert benched.settings.activation_checkpointing
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    (effect,) = [s for s in benched.evidence.bench.settings if s.setting == NAME]
    assert effect.outcome == "kept"
    assert effect.off_alone is not None
    assert effect.off_alone.verdict == "faster"


def test_dropped_with_the_batch_that_ran_without_it_where_it_measures_slower() -> None:
    profile = _kept()
    without = _fastest_without(profile)
    # on the bench the recompute doubles the step (the probe measured 5%): off is faster
    benched = api.bench(
        profile, _simulated_token_workload(), measure=_arms_on(_growing(2.0)), seconds=0.01
    )
    assert not benched.settings.activation_checkpointing
    assert benched.settings.batch.batch_size == without
    decision = benched.decision("batch.batch_size")
    assert decision is not None
    assert decision.rule == "M1"
    assert decision.source is Source.MEASURED
    assert decision.reason.startswith(f"{NAME} was dropped, and this batch ran without it: ")
    checkpointing = benched.decision(NAME)
    assert checkpointing is not None
    assert checkpointing.reason.startswith("measured slower on this machine")
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    assert benched.evidence.bench.final is not None  # the profile as handed out ran


def test_required_where_nothing_trained_without_it() -> None:
    machine = SimulatedMachine(limit=0, checkpointed_limit=12, leaves=1)
    profile = tune_on(machine, _simulated_token_workload(), H100, mode="balanced", budget_s=60)
    assert profile.settings.activation_checkpointing
    plan, _ = compose.bench_plan(profile, None, has_dataset=False, workload="decoder")
    assert NAME in plan.required
    assert "not even batch 1 trained without it" in plan.required[NAME]
    assert not any(f"tuned - {NAME}" in names for names in plan.names)
    benched = api.bench(
        profile, _simulated_token_workload(), measure=_arms_on(machine), seconds=0.01
    )
    assert benched.settings.activation_checkpointing
    assert benched.evidence is not None
    assert benched.evidence.bench is not None
    (effect,) = [s for s in benched.evidence.bench.settings if s.setting == NAME]
    assert effect.outcome == "kept (required)"
    assert effect.off_alone is None
