"""The time model and the budget: predictions from steady steps only, phases that cannot
overrun the run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_autotune.probe.budget import Budget
from torch_autotune.probe.timemodel import StepTiming, TimeModel


@given(
    fixed=st.floats(0.0, 1.0),
    per_sample=st.floats(1e-6, 0.1),
    sizes=st.lists(st.integers(1, 4096), min_size=2, max_size=6, unique=True),
    query=st.integers(1, 65536),
)
def test_an_affine_step_time_is_predicted_exactly_at_and_above_the_measured_sizes(
    fixed: float, per_sample: float, sizes: list[int], query: int
) -> None:
    model = TimeModel()
    for size in sorted(sizes):
        model.learn(StepTiming(size, 0.0, fixed + per_sample * size))
    fitted = model.step_seconds(query)
    assert fitted is not None
    if query >= min(sizes):
        assert fitted[0] == pytest.approx(fixed + per_sample * query, rel=1e-6, abs=1e-9)
    else:  # below the smallest size: that size's time, never less
        assert fitted[0] >= fixed + per_sample * query


def test_a_slow_first_step_never_enters_the_prediction() -> None:
    # The first GPU run: batch 1 took long (start-up), the sticky maximum then refused 587.
    model = TimeModel()
    model.learn(StepTiming(1, warmup_s=14.0, step_s=0.012))
    model.learn(StepTiming(8, warmup_s=0.2, step_s=0.014))
    model.learn(StepTiming(545, warmup_s=0.2, step_s=0.14))
    predicted = model.predict(587, 3)
    assert predicted is not None
    assert predicted.seconds < 1.0  # 0.2 s warm-up + 3 steps of about 0.15 s
    assert predicted.warmup_s == pytest.approx(0.2)


def test_one_size_predicts_nothing_above_it() -> None:
    # At batch 1 a step is nearly all fixed cost: scaling it by the batch is the old bug.
    model = TimeModel()
    model.learn(StepTiming(1, 0.0, 0.015))
    assert model.predict(65536, 3) is None
    assert model.predict(1, 3) is not None


def test_a_slope_made_negative_by_noise_is_not_extrapolated_downwards() -> None:
    model = TimeModel()
    model.learn(StepTiming(8, 0.0, 1.0))  # a hiccup
    model.learn(StepTiming(32, 0.0, 0.3))
    fitted = model.step_seconds(512)
    assert fitted is not None
    assert fitted[0] == pytest.approx(0.3)


def test_warm_ups_of_later_trials_are_interpolated_and_not_scaled_beyond() -> None:
    model = TimeModel()
    model.learn(StepTiming(1, 14.0, 0.01))  # the process's first step
    model.learn(StepTiming(256, 5.9, 0.065))  # H100, ResNet-50, cuDNN autotuner
    model.learn(StepTiming(1024, 6.3, 0.242))
    assert model.warmup_seconds(640) == pytest.approx(6.1)
    assert model.warmup_seconds(1536) == pytest.approx(6.1)  # median: not 9.4 by step ratio
    assert model.warmup_seconds(64) == pytest.approx(6.1)


def test_timings_must_be_finite_and_non_negative() -> None:
    with pytest.raises(ValueError, match="step_s"):
        StepTiming(8, 0.0, float("nan"))
    with pytest.raises(ValueError, match="batch_size"):
        StepTiming(0, 0.0, 1.0)


def test_a_phase_ends_at_its_share_or_the_run_whichever_is_first() -> None:
    now = [0.0]
    budget = Budget(100.0, lambda: now[0])
    with budget.phase("search", 30):
        assert budget.left() == 30
        now[0] = 20.0
        assert budget.affords(10)
        assert not budget.affords(10.5)
    with budget.phase("throughput", 500):  # never past the end of the run
        assert budget.left() == 80
        now[0] = 95.0
    assert budget.spent
    assert [(p.name, p.seconds) for p in budget.phases] == [("search", 20.0), ("throughput", 75.0)]
    with pytest.raises(ValueError, match="budget"):
        Budget(float("inf"), lambda: 0.0)
