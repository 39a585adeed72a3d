"""The probe's variants (``probe.variants``): a declared change of settings, measured through
the seam's one method, judged once, and the profile's batch held to the settings that change
memory. On the simulated machine and, for the runner, on real torch on this CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.probe.fake_trials import recorded
from torch_autotune.errors import ProbeError
from torch_autotune.probe.budget import Budget
from torch_autotune.probe.judge import judge
from torch_autotune.probe.simulated import SimulatedMachine, SimulatedTrials
from torch_autotune.probe.timemodel import TimeModel
from torch_autotune.probe.trials import StepSettings, TrialRunner
from torch_autotune.probe.variant_phase import Bounds, VariantOutcome, measure_variant
from torch_autotune.probe.variants import BASE, Variant, compiled
from torch_autotune.probe.workloads import resolve_workload
from torch_autotune.profile import Preferences, Profile, ThroughputRecord
from torch_autotune.profile_io import load_profile
from torch_autotune.rules.engine import build_profile
from torch_autotune.settings import memory_settings

GOLDEN_2 = Path(__file__).parents[1] / "fixtures" / "profiles" / "schema-2.yaml"
H100 = recorded("h100-80gb-hbm3")

CHECKPOINTED = Variant(  # the shape of the next variant: a model of its own, less memory
    "checkpointed",
    (("memory_format", "contiguous_format"),),
    fresh_model=True,
    changes_memory=True,
    warmup_s=lambda leaves: 0.0,
    label="activation checkpointing",
    paid_for="to wrap the blocks",
    warmup_noun="the recompute",
)


def _point(
    rate: float, batch: int, variant: str = "eager", spread: float = 0.01
) -> ThroughputRecord:
    return ThroughputRecord(
        batch_size=batch, samples_per_s=rate, relative_spread=spread, variant=variant
    )


# --- the judgement --------------------------------------------------------------------------------


def test_one_judgement_writes_any_variant_with_its_own_words_and_numbers() -> None:
    base = _point(1000, 64)
    kept = judge(CHECKPOINTED, base, _point(1200, 256, "checkpointed"), 2.0)
    assert kept.kept
    assert kept.reason.startswith("activation checkpointing measured faster: 1.20x")
    assert (
        "1,200 samples/s checkpointed at batch 256 against 1,000 eager at batch 64" in kept.reason
    )
    assert "2 s to wrap the blocks" in kept.reason
    assert kept.payoff_minutes == pytest.approx(2.0 * 1200 / 200 / 60, abs=0.01)
    slower = judge(CHECKPOINTED, base, _point(1010, 256, "checkpointed"), 2.0)
    assert not slower.kept
    assert "not faster beyond the 3% noise; eager training avoids the recompute" in slower.reason
    noisy = judge(CHECKPOINTED, base, _point(1150, 256, "checkpointed", spread=0.2), 2.0)
    assert not noisy.kept  # 1.15x, but within its own 20% spread


def test_compiles_judgement_reads_as_it_did_before_variants() -> None:
    reason = judge(compiled("default"), _point(4253, 832), _point(5238, 832, "compiled"), 80).reason
    assert reason.startswith(
        "compile measured faster: 1.23x (5,238 samples/s compiled at batch 832 against 4,253"
        " eager at batch 832), 80 s to compile; it pays off after"
    )


# --- measuring a variant ------------------------------------------------------------------------


# --- measuring a variant ------------------------------------------------------------------------


def _measured(
    machine: SimulatedMachine, variant: Variant, floor: int = 1, budget: Budget | None = None
) -> VariantOutcome:
    """``variant`` measured against the base's point at 832 on ``machine`` (an H100 profile's
    settings for a conv net: the cuDNN autotuner on), with a search's bounds: no cap below the
    device's, 80 GiB, ``floor`` the smallest batch the model trains at."""
    profile = build_profile(H100, preferences=Preferences(model_kind="conv"))
    settings = StepSettings.from_profile(profile).with_variant(BASE)
    runner = machine.trials(resolve_workload("conv"), settings)
    base = runner.point(832, until=machine.clock() + 5)
    assert base.samples_per_s is not None
    bounds = Bounds(1 << 16, "the cap", 80 << 30, None, floor, multiple=8, fixed_shapes=True)
    return measure_variant(
        runner,
        variant,
        base_best=_point(base.samples_per_s, 832),
        base_sizes=[1664, 832, 416],
        base_model=TimeModel(),
        bounds=bounds,
        budget=budget or Budget(600, machine.clock),
        progress=lambda _phase, _what: None,
        reserve_s=0.0,
    )


def test_a_variant_that_needs_less_memory_searches_above_the_bases_limit() -> None:
    # What activation checkpointing will do: its own search, on its own curve, reaches sizes
    # the base could not (the base's limit is 1850 here, the variant's 3000).
    outcome = _measured(SimulatedMachine(compiled_limit=3000), compiled("default"))
    assert outcome.largest == 3000
    assert all(t.variant == "compiled, cuDNN autotuner off" for t in outcome.search)
    assert outcome.sizes == [2696, 1344, 672]  # 3000 less K2's 10%, to a multiple of 8
    assert {r.variant for r in outcome.points} == {"compiled"}
    assert outcome.judgement is not None


def test_a_variant_that_keeps_the_memory_curve_is_measured_at_the_bases_sizes() -> None:
    same = Variant("autotuned", (("backends.cudnn_benchmark", True),), label="the autotuner")
    machine = SimulatedMachine()
    outcome = _measured(machine, same)
    assert outcome.search == []
    assert outcome.largest is None
    assert [r.batch_size for r in outcome.points] == [1664, 832, 416]
    assert not [line for line in machine.log if line.startswith("trial")]


def test_a_variant_not_kept_lets_go_of_its_model_and_one_kept_does_not() -> None:
    """What follows (a fresh process for the allocator shares the GPU) must not find the model
    of a variant the profile does not train still on the device."""
    slower = _measured(SimulatedMachine(compiled_speedup=0.8), compiled("default"))
    assert slower.judgement is not None
    assert not slower.judgement.kept
    assert isinstance(slower.runner, SimulatedTrials)
    assert slower.runner.released == 1
    faster = _measured(SimulatedMachine(compiled_speedup=1.5), compiled("default"))
    assert faster.judgement is not None
    assert faster.judgement.kept
    assert isinstance(faster.runner, SimulatedTrials)
    assert faster.runner.released == 0


@pytest.mark.parametrize("ours", [False, True], ids=["the model's error", "ours"])
def test_a_variant_whose_training_raises_lets_go_of_its_model_first(
    ours: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpointing whose recompute differs raises in its search: the phase keeps it off and
    the probe goes on, so its model must not stay on the device (on every rank of a job);
    an error of ours ends the run and is passed on untouched."""
    made: list[SimulatedTrials] = []
    variant_of = SimulatedTrials.variant

    def variant(self: SimulatedTrials, chosen: Variant) -> SimulatedTrials:
        runner = variant_of(self, chosen)
        made.append(runner)
        return runner

    def raising(self: SimulatedTrials, batch_size: int) -> Any:
        raise ProbeError("ours") if ours else RuntimeError("recompute differs")

    monkeypatch.setattr(SimulatedTrials, "variant", variant)
    monkeypatch.setattr(SimulatedTrials, "__call__", raising)
    with pytest.raises(ProbeError if ours else RuntimeError):
        _measured(SimulatedMachine(compiled_limit=3000), compiled("default"))
    (runner,) = made
    assert runner.released == (0 if ours else 1)


def test_a_variant_that_fits_nothing_says_so() -> None:
    # the compiled model fits 400, and the model trains at no fewer than 450
    outcome = _measured(SimulatedMachine(compiled_limit=400), compiled("default"), floor=450)
    assert outcome.judgement is None
    assert outcome.failed is not None
    assert outcome.failed == "the compiled model ran out of memory at batch 450"


# --- the runner of a variant, on real torch ----------------------------------------------------


def test_a_variant_with_a_model_of_its_own_releases_the_bases_and_builds_its_own() -> None:
    workload = resolve_workload("mlp")
    base = TrialRunner(workload, StepSettings())
    base_model = base.model
    assert base(4).fits
    other = base.variant(CHECKPOINTED)
    assert base._model is None  # released before the variant's is built
    assert other(4).fits
    assert other.model is not base_model
    wrapped = TrialRunner(workload, StepSettings()).variant(BASE)
    assert wrapped.model is wrapped._base.model  # type: ignore[union-attr]  # shared, not rebuilt


# --- "ran" means ran with these settings ---------------------------------------------------------


def _golden() -> Profile:
    return load_profile(GOLDEN_2)


def _with_batch(profile: Profile, batch: int, **evidence: object) -> Profile:
    data = profile.model_dump()
    data["settings"]["batch"]["batch_size"] = batch
    for key, value in evidence.items():
        data["evidence"][key] = value
    return Profile.model_validate(data)


def test_a_batch_that_ran_only_eager_is_refused_for_a_profile_that_compiles() -> None:
    profile = _golden()  # compiled: its own search found 1000; eager ran up to 1850
    evidence = profile.evidence
    assert evidence is not None
    eager_only = {r.batch_size for r in evidence.throughput if r.variant == "eager"}
    eager_only -= evidence.ran(memory_settings(profile.settings))
    assert 1664 in eager_only
    with pytest.raises(ValidationError, match="never with these settings that change how much"):
        _with_batch(profile, 1664)
    assert _with_batch(profile, 448).settings.batch.batch_size == 448  # a compiled point


def test_a_batch_that_ran_only_in_the_search_without_the_autotuner_is_refused() -> None:
    # the cuDNN autotuner's workspaces need memory: the search ran without it
    profile = _golden()
    evidence = profile.evidence
    assert evidence is not None
    assert profile.settings.backends.cudnn_benchmark
    searched = {t.batch_size for t in evidence.search if t.fits}
    only_searched = searched - evidence.ran(memory_settings(profile.settings))
    assert 1000 in only_searched  # the compiled search's largest, autotuner off
    with pytest.raises(ValidationError, match="never with these settings"):
        _with_batch(profile, 1000)


def test_where_compile_was_not_measured_an_eager_batch_stands_as_its_reason_says() -> None:
    profile = _golden()
    evidence = profile.evidence
    assert evidence is not None
    assert evidence.compile is not None
    unmeasured = evidence.compile.model_copy(update={"measured": False}).model_dump()
    assert _with_batch(profile, 1664, compile=unmeasured).settings.batch.batch_size == 1664


def test_a_variant_out_of_its_phases_time_says_the_run_had_time_left() -> None:
    # The phase's share ran out, not the budget: the reason said "the time budget ran out"
    machine = SimulatedMachine()
    budget = Budget(600, machine.clock)
    with budget.phase("compile", 0.0):
        outcome = _measured(machine, compiled("default"), budget=budget)
    assert outcome.failed is not None
    assert "ran no throughput point in its phase's share of the time budget" in outcome.failed
    assert "ran out" not in outcome.failed
