"""The bench's pure half: which arms run, what interleaved rounds mean, and what is dropped.

Throughputs come from a made-up speed model (each setting multiplies the rate by a factor),
with a different machine drift in every round: pairing within a round must cancel the drift.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rules.helpers import snapshot
from torch_autotune.bench import (
    KNOBS,
    MIN_EFFECT,
    ArmRecord,
    BenchEvidence,
    Plan,
    TrainConfig,
    apply_bench,
    arm_record,
    effect,
    final_config,
    judge,
    knob_value,
    plan_arms,
    round_order,
    tuned_config,
)
from torch_autotune.hardware import HardwareSnapshot
from torch_autotune.knobs import train_settings
from torch_autotune.profile import (
    Evidence,
    Mode,
    Preferences,
    Profile,
    SearchTrialRecord,
    Settings,
    Source,
    settings_paths,
)
from torch_autotune.profile_io import dump_profile, parse_profile
from torch_autotune.rules.context import Measurements
from torch_autotune.rules.engine import build_profile
from torch_autotune.settings import torch_defaults
from torch_autotune.store import machine_id

DRIFT = (1.0, 0.62, 1.35, 0.8, 1.1)  # the machine's speed in each round: noise that pairs away


def measured(
    machine: str | HardwareSnapshot,
    *,
    mode: Mode = Mode.SPEED,
    model_kind: str = "conv",
    batch: int = 256,
    workers: int | None = 4,
    workload: str = "conv",
) -> Profile:
    """A profile as the probe leaves it: a measured batch size with its search evidence.
    ``machine``: a recorded snapshot's name, or a snapshot (the GPU tier's: this machine)."""
    evidence = Evidence(
        workload=workload,
        device="cuda",
        max_batch_size=batch,
        fastest_batch_size=batch,
        batch_size=batch,
        limited_by="memory",
        search=(
            SearchTrialRecord(
                batch_size=batch, fits=True, peak_memory_bytes=1, seconds=1.0, step="verify"
            ),
        ),
        throughput=(),
        budget_s=120,
        elapsed_s=60,
    )
    return build_profile(
        snapshot(machine) if isinstance(machine, str) else machine,
        Measurements(batch_size=batch, num_workers=workers),
        Preferences(mode=mode, model_kind=model_kind),  # type: ignore[arg-type]
        evidence=evidence,
        host_id=machine_id(),  # as tune() leaves it: written by this machine
    )


def rounds_for(
    plan: Plan, factors: Mapping[str, float], *, interaction: float = 1.0
) -> list[list[float | None]]:
    """Samples/s of every arm in every round: 1000 x the factor of each knob the arm takes
    from the profile, x ``interaction`` for the full profile, x the round's drift."""

    def rate(config: TrainConfig) -> float:
        value = 1000.0
        for knob in plan.knobs:
            if knob_value(config, knob) == knob_value(plan.tuned, knob):
                value *= factors.get(knob.name, 1.0)
        return value * (interaction if config == plan.tuned else 1.0)

    return [[rate(c) * drift for c in plan.configs] for drift in DRIFT]


def bench_of(
    plan: Plan,
    rows: list[list[float | None]],
    mode: str = "speed",
    settings: Settings | None = None,
) -> BenchEvidence:
    """The bench's evidence of ``rows`` as ``ablate`` records it, the final arm (the profile
    without its dropped settings) included where no arm ran it; ``settings``: the profile's
    (default: the plan's tuned config on torch's CUDA defaults)."""
    tuned, effects = judge(plan, rows, mode=mode)
    settings = settings or train_settings(plan.tuned, torch_defaults("cuda"))
    final = final_config(plan, effects)
    final_arm: tuple[ArmRecord, ...] = ()
    if final != plan.tuned and final not in plan.configs:
        final_arm = (arm_record(("final",), final, (1000.0,) * len(rows), settings),)
    return BenchEvidence(
        workload="conv",
        device="cuda",
        rounds=len(rows),
        seconds_per_measurement=1.0,
        arms=tuple(
            arm_record(names, config, tuple(row[i] for row in rows), settings)
            for i, (names, config) in enumerate(zip(plan.names, plan.configs, strict=True))
        )
        + final_arm,
        tuned=tuned,
        settings=tuple(effects),
        reverted=tuned is not None and tuned.verdict == "slower",
        elapsed_s=1.0,
    )


# --- effect ------------------------------------------------------------------------------------


def test_an_effect_is_the_median_ratio_within_rounds() -> None:
    found = effect([110, 220, 330], [100, 200, 300])
    assert found is not None
    assert found.speedup == pytest.approx(1.1)
    assert (found.rounds, found.verdict) == (3, "faster")


def test_one_round_against_the_others_is_noise() -> None:
    found = effect([90, 180, 310], [100, 200, 300])  # two rounds slower, one faster
    assert found is not None
    assert found.verdict == "within noise"
    assert found.low == pytest.approx(0.9)
    assert found.high == pytest.approx(310 / 300)


def test_a_consistent_change_below_the_minimum_effect_is_noise() -> None:
    found = effect([99.5, 199, 298.5], [100, 200, 300])  # 0.5% slower in every round
    assert found is not None
    assert found.verdict == "within noise"


def test_failed_measurements_are_left_out_and_too_few_rounds_decide_nothing() -> None:
    found = effect([None, 50, 60, None], [100, 100, 100, 100])
    assert found is not None
    assert (found.rounds, found.verdict) == (2, "too few rounds")
    assert effect([None, None], [1.0, 2.0]) is None


rates = st.floats(min_value=1.0, max_value=1e6, allow_nan=False)


@given(st.lists(st.tuples(rates, rates), min_size=1, max_size=9).filter(lambda p: len(p) % 2))
def test_swapping_the_arms_inverts_the_effect(pairs: list[tuple[float, float]]) -> None:
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    forward, backward = effect(a, b), effect(b, a)
    assert forward is not None
    assert backward is not None
    assert forward.speedup * backward.speedup == pytest.approx(1.0)
    swapped = {"faster": "slower", "slower": "faster"}
    assert backward.verdict == swapped.get(forward.verdict, forward.verdict)


@given(
    st.lists(st.tuples(rates, rates), min_size=3, max_size=9),
    st.lists(st.floats(min_value=0.1, max_value=10), min_size=9, max_size=9),
)
def test_a_drift_shared_by_both_arms_of_a_round_changes_nothing(
    pairs: list[tuple[float, float]], drift: list[float]
) -> None:
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    plain = effect(a, b)
    drifted = effect(
        [x * d for x, d in zip(a, drift, strict=False)],
        [y * d for y, d in zip(b, drift, strict=False)],
    )
    assert plain is not None
    assert drifted is not None
    assert drifted.speedup == pytest.approx(plain.speedup, rel=1e-9)
    assert (
        drifted.verdict == plain.verdict
        or math.isclose(abs(plain.speedup - 1), MIN_EFFECT, rel_tol=1e-6)
        or any(math.isclose(x, y, rel_tol=1e-9) for x, y in pairs)
    )


@given(st.lists(st.tuples(rates, rates), min_size=1, max_size=9))
def test_slower_needs_every_round_slower_and_faster_every_round_faster(
    pairs: list[tuple[float, float]],
) -> None:
    found = effect([p[0] for p in pairs], [p[1] for p in pairs])
    assert found is not None
    if found.verdict == "slower":
        assert all(x < y for x, y in pairs)
        assert found.speedup < 1 - MIN_EFFECT
    if found.verdict == "faster":
        assert all(x > y for x, y in pairs)
        assert found.speedup > 1 + MIN_EFFECT


# --- arms ----------------------------------------------------------------------------------------


def test_the_a100_profile_ablates_each_setting_it_changes() -> None:
    profile = measured("a100-sxm4-80gb-8x")
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    names = {k.name for k in plan.knobs}
    assert {"precision", "batch_size", "tf32", "cudnn_benchmark", "num_workers"} <= names
    assert "cpu_threads" not in names or plan.tuned.cpu_threads is not None
    # baseline, tuned, and one on-alone and one off-alone arm per setting, none the same
    assert len(plan.configs) == 2 + 2 * len(plan.knobs)
    assert plan.configs[:2] == (TrainConfig(), plan.tuned)
    for knob in plan.knobs:
        assert plan.on_alone(knob) in plan.configs
        assert plan.off_alone(knob) in plan.configs


def test_with_one_setting_on_alone_is_the_profile_and_off_alone_the_baseline() -> None:
    plan = plan_arms(TrainConfig(), TrainConfig(batch_size=128))
    assert [k.name for k in plan.knobs] == ["batch_size"]
    assert plan.configs == (TrainConfig(), TrainConfig(batch_size=128))
    assert plan.names == (("baseline", "tuned - batch_size"), ("tuned", "baseline + batch_size"))


def test_a_profile_equal_to_the_baseline_has_nothing_to_ablate() -> None:
    plan = plan_arms(TrainConfig(), TrainConfig())
    assert plan.knobs == ()
    assert plan.configs == (TrainConfig(),)


@given(st.integers(min_value=1, max_value=12))
def test_every_arm_runs_once_per_round_and_once_in_each_position(arms: int) -> None:
    orders = [round_order(arms, r) for r in range(arms)]
    assert all(sorted(order) == list(range(arms)) for order in orders)
    for position in range(arms):
        assert sorted(order[position] for order in orders) == list(range(arms))


def test_prefetching_without_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="prefetch_factor needs num_workers"):
        TrainConfig(prefetch_factor=4)


def test_every_knob_maps_to_profile_settings() -> None:
    paths = settings_paths()
    for knob in KNOBS:
        for path in knob.paths(TrainConfig()):
            assert path in paths, (knob.name, path)


# --- never slower --------------------------------------------------------------------------------


def test_a_setting_that_measures_slower_is_dropped_with_its_measurement() -> None:
    profile = measured("a100-sxm4-80gb-8x")
    assert profile.settings.memory_format == "channels_last"
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    rows = rounds_for(plan, {"precision": 2.0, "batch_size": 1.5, "channels_last": 0.85})
    bench = bench_of(plan, rows)

    dropped = {s.setting: s for s in bench.settings if s.outcome == "dropped"}
    assert set(dropped) == {"channels_last"}
    off = dropped["channels_last"].off_alone
    assert off is not None
    assert off.verdict == "slower"
    assert off.speedup == pytest.approx(0.85)
    result = apply_bench(profile, plan, bench)

    assert result.settings.memory_format == "contiguous_format"
    decision = result.decision("memory_format")
    assert decision is not None
    assert (decision.rule, decision.source) == ("M1", Source.MEASURED)
    assert "measured slower" in decision.reason
    assert "0.85x" in decision.reason
    assert "5 interleaved rounds" in decision.reason
    assert "overrides H" in decision.reason  # the rule it overrode stays visible
    # everything else as the rules and the probe set it
    assert result.settings.precision == profile.settings.precision
    assert result.settings.batch == profile.settings.batch
    assert result.evidence is not None
    assert result.evidence.bench == bench


def test_settings_that_help_or_do_nothing_are_kept() -> None:
    profile = measured("a100-sxm4-80gb-8x")
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, {"precision": 2.0, "tf32": 1.0}))
    assert all(s.outcome == "kept" for s in bench.settings)
    precision = next(s for s in bench.settings if s.setting == "precision")
    assert precision.off_alone is not None
    assert precision.off_alone.verdict == "faster"
    tf32 = next(s for s in bench.settings if s.setting == "tf32")
    assert "no measurable effect" in tf32.reason
    assert apply_bench(profile, plan, bench).settings == profile.settings


def test_dropping_amp_takes_channels_last_with_it() -> None:
    profile = measured("a100-sxm4-80gb-8x")
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, {"precision": 0.7, "batch_size": 1.6}))
    result = apply_bench(profile, plan, bench)
    assert result.settings.precision.dtype == "float32"
    assert not result.settings.precision.autocast
    assert result.settings.memory_format == "contiguous_format"
    reason = result.decision("memory_format").reason  # type: ignore[union-attr]
    assert "goes with AMP" in reason


def test_a_slower_batch_size_goes_back_to_the_baseline_size_which_the_bench_ran() -> None:
    profile = measured("a100-sxm4-80gb-8x", batch=512)
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, {"batch_size": 0.9}))
    assert 32 in bench.ran()
    result = apply_bench(profile, plan, bench)
    assert result.settings.batch.batch_size == 32
    assert "measured slower" in result.decision("batch.batch_size").reason  # type: ignore[union-attr]


def test_a_size_no_arm_ran_is_never_handed_out() -> None:
    profile = measured("a100-sxm4-80gb-8x", batch=512)
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, {"batch_size": 0.9}))
    failed = tuple(
        arm.model_copy(update={"samples_per_s": (None,) * 5})
        if arm.config.batch_size == 32
        else arm
        for arm in bench.arms
    )
    result = apply_bench(profile, plan, bench.model_copy(update={"arms": failed}))
    assert result.settings.batch.batch_size == 512
    reason = result.decision("batch.batch_size").reason  # type: ignore[union-attr]
    assert "cannot be used here" in reason
    assert "not a size the probe ran" in reason


def test_a_profile_slower_than_the_baseline_as_a_whole_goes_back_to_it() -> None:
    profile = measured("a100-sxm4-80gb-8x")
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    # every setting helps alone and within the profile, yet together they lose (interaction)
    rows = rounds_for(plan, {k.name: 1.05 for k in plan.knobs}, interaction=0.3)
    bench = bench_of(plan, rows)
    assert bench.reverted
    assert bench.tuned is not None
    assert bench.tuned.verdict == "slower"
    result = apply_bench(profile, plan, bench)
    assert tuned_config(result) == TrainConfig()
    decision = result.decision("precision.dtype")
    assert decision is not None
    assert decision.rule == "M2"
    assert "slower than the baseline as a whole" in decision.reason


def test_what_the_reproducible_mode_needs_is_never_dropped() -> None:
    profile = measured("a100-sxm4-80gb-8x", mode=Mode.REPRODUCIBLE)
    assert profile.settings.matmul.tf32 is False
    assert profile.settings.matmul.api is not None
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, {"tf32": 0.6}), mode="reproducible")
    tf32 = next(s for s in bench.settings if s.setting == "tf32")
    assert tf32.outcome == "kept (required)"
    assert apply_bench(profile, plan, bench).settings.matmul.tf32 is False


def test_a_drop_the_machine_cannot_hold_is_not_made_and_says_why() -> None:
    profile = measured("tesla-v100-sxm2-16gb")  # fp16 + GradScaler
    assert profile.settings.precision.dtype == "float16"
    baseline = TrainConfig(precision="bfloat16")  # the user's own baseline: bf16 on a V100
    plan = plan_arms(baseline, tuned_config(profile, baseline))
    bench = bench_of(plan, rounds_for(plan, {"precision": 0.8}))
    result = apply_bench(profile, plan, bench)
    assert result.settings.precision.dtype == "float16"
    reason = result.decision("precision.autocast").reason  # type: ignore[union-attr]
    assert "cannot be used here" in reason
    assert "compute capability 8.0" in reason


def test_the_final_config_leaves_out_exactly_the_dropped_settings() -> None:
    profile = measured("rtx-4090")
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, {"num_workers": 0.8, "precision": 1.8}))
    final = final_config(plan, bench.settings)
    assert final.num_workers == 0
    assert final.precision == plan.tuned.precision


def test_a_benched_profile_round_trips_through_its_file() -> None:
    profile = measured("a100-sxm4-80gb-8x")
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    result = apply_bench(profile, plan, bench_of(plan, rounds_for(plan, {"channels_last": 0.8})))
    for fmt in ("yaml", "json"):
        text = dump_profile(result, fmt)  # type: ignore[arg-type]
        assert dump_profile(parse_profile(text, fmt=fmt), fmt) == text  # type: ignore[arg-type]


def test_a_rules_only_profile_cannot_be_benched() -> None:
    profile = build_profile(snapshot("rtx-4090"))
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    with pytest.raises(ValueError, match="needs a measured profile"):
        apply_bench(profile, plan, bench_of(plan, rounds_for(plan, {})))


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([k.name for k in KNOBS]), st.floats(min_value=0.5, max_value=2.0)
    ),
    st.sampled_from(["a100-sxm4-80gb-8x", "rtx-4090", "tesla-t4", "h100-80gb-hbm3"]),
)
def test_never_slower_holds_for_any_speed_model(factors: dict[str, float], machine: str) -> None:
    """Whatever each setting does, what remains measured no slower than without it, and the
    profile stays valid."""
    profile = measured(machine)
    plan = plan_arms(TrainConfig(), tuned_config(profile))
    bench = bench_of(plan, rounds_for(plan, factors))
    result = apply_bench(profile, plan, bench)  # validates every invariant
    for effect_ in bench.settings:
        factor = factors.get(effect_.setting, 1.0)
        if effect_.outcome == "dropped":
            assert factor < 1 - MIN_EFFECT
        elif factor < 1 - MIN_EFFECT:
            pytest.fail(f"{effect_.setting} measured {factor}x and was kept")
    assert isinstance(result, Profile)
