"""The batch-size search on simulated memory curves: exact, only sizes that ran, few trials."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_autotune.probe.search import (
    SearchResult,
    TrialOutcome,
    apply_margin,
    confirm,
    doubling_then_bisect,
    find_max_batch_size,
    round_down,
)

from .curves import MemoryCurve

MIB = 1 << 20


def trial_bound(cap: int) -> int:
    """Model + predictions + gallop + bisection never exceed twice bisection's count plus 7."""
    return 2 * math.ceil(math.log2(cap + 1)) + 7


def check(result: SearchResult, curve: MemoryCurve, cap: int) -> None:
    """The properties every search must have, on any curve."""
    expected = curve.limit(cap)
    assert result.max_batch_size == (expected or None)
    ran = {t.batch_size for t in result.trials if t.fits}
    failed = {t.batch_size for t in result.trials if not t.fits}
    if result.max_batch_size is not None:
        assert result.max_batch_size in ran  # never a size that failed or was not run
        assert result.max_batch_size not in failed
    assert all(1 <= t.batch_size <= cap for t in result.trials)  # never above the cap
    assert result.trial_count <= trial_bound(cap)


curves = st.builds(
    MemoryCurve,
    overhead=st.integers(0, 8 << 30),
    per_sample=st.integers(1, 256 * MIB),
    limit_bytes=st.integers(1, 96 << 30),
    noise=st.sampled_from([0.0, 0.001, 0.01, 0.05]),
    step_bytes=st.sampled_from([0, 0, 2 * MIB, 64 * MIB, 512 * MIB]),
    step_every=st.integers(1, 64),
    seed=st.integers(0, 1000),
)


@pytest.mark.slow  # 3,000 curves: seconds
@settings(max_examples=3000, deadline=None)
@given(curve=curves, cap=st.integers(1, 1 << 16))
def test_search_finds_the_exact_limit_on_any_curve(curve: MemoryCurve, cap: int) -> None:
    result = find_max_batch_size(curve, cap=cap, memory_limit_bytes=curve.limit_bytes)
    check(result, curve, cap)


@settings(max_examples=500, deadline=None)
@given(curve=curves, cap=st.integers(1, 1 << 16))
def test_without_memory_readings_the_search_is_still_exact(curve: MemoryCurve, cap: int) -> None:
    def blind(batch_size: int) -> TrialOutcome:
        return TrialOutcome(curve(batch_size).fits)  # e.g. an allocator that reports nothing

    check(find_max_batch_size(blind, cap=cap, memory_limit_bytes=curve.limit_bytes), curve, cap)
    check(doubling_then_bisect(curve, cap=cap), curve, cap)


@settings(max_examples=500, deadline=None)
@given(
    overhead=st.integers(0, 4 << 30),
    per_sample=st.integers(64 << 10, 64 * MIB),
    limit_samples=st.integers(16, 50_000),
)
def test_on_a_linear_curve_four_trials_suffice(
    overhead: int, per_sample: int, limit_samples: int
) -> None:
    curve = MemoryCurve(overhead, per_sample, overhead + per_sample * limit_samples)
    cap = 1 << 17
    result = find_max_batch_size(curve, cap=cap, memory_limit_bytes=curve.limit_bytes)
    check(result, curve, cap)
    assert result.trial_count <= 4
    assert doubling_then_bisect(curve, cap=cap).trial_count >= 2 * math.log2(limit_samples) - 1


@pytest.mark.parametrize(
    ("curve", "cap", "expected", "limited_by"),
    [
        pytest.param(MemoryCurve(0, 10, 10), 100, 1, "memory", id="limit-of-1"),
        pytest.param(MemoryCurve(0, 10, 5), 100, None, "start", id="nothing-fits"),
        pytest.param(MemoryCurve(0, 1, 10**9), 300, 300, "cap", id="limit-above-cap"),
        pytest.param(MemoryCurve(0, 1, 1), 1, 1, "cap", id="cap-of-1"),
        pytest.param(
            MemoryCurve(2 << 30, MIB, (2 << 30) + 777 * MIB),
            10_000,
            777,
            "memory",
            id="fixed-overhead",
        ),
        pytest.param(
            MemoryCurve(0, MIB, 1000 * MIB, step_bytes=64 * MIB, step_every=32),
            4096,
            None,
            "memory",
            id="fragmentation-steps",
        ),
    ],
)
def test_edge_curves(curve: MemoryCurve, cap: int, expected: int | None, limited_by: str) -> None:
    result = find_max_batch_size(curve, cap=cap, memory_limit_bytes=curve.limit_bytes)
    check(result, curve, cap)
    if expected is not None:
        assert result.max_batch_size == expected
    assert result.limited_by == limited_by


def test_start_above_the_limit_searches_below_it() -> None:
    curve = MemoryCurve(0, 10, 35)
    result = find_max_batch_size(curve, cap=100, memory_limit_bytes=35, start=8)
    assert result.max_batch_size == 3
    assert result.trials[0].step == "start"


def test_trace_records_every_trial_with_its_reading() -> None:
    curve = MemoryCurve(1000, 10, 1000 + 10 * 500)
    result = find_max_batch_size(curve, cap=10_000, memory_limit_bytes=curve.limit_bytes)
    assert [t.step for t in result.trials] == ["start", "model", "predict", "predict"]
    assert [t.batch_size for t in result.trials] == [1, 8, 500, 501]
    assert result.trials[2].peak_memory_bytes == 6000
    assert result.trials[3].fits is False


def test_a_start_near_the_limit_is_not_followed_by_8_where_a_trial_past_it_runs_on() -> None:
    """On the CPU under --memory-limit (``cautious``; on a GPU a size past the cap raises at
    once, and 8 gives the slope from farther, as measured on the H100). Batch 1 peaks at 652
    MB against a limit of 813 (GPT-2 on a CPU under --memory-limit 0.15, what the process held
    plus the cap): the second trial is 2, below the limit, not 8 (1192 MB, past it, which the
    search ran to the end)."""
    curve = MemoryCurve(575 * 10**6, 77 * 10**6, 813 * 10**6)
    result = find_max_batch_size(
        curve, cap=1024, memory_limit_bytes=curve.limit_bytes, cautious=True
    )
    assert [t.batch_size for t in result.trials[:2]] == [1, 2]
    assert result.max_batch_size == 3
    assert [t.batch_size for t in result.trials if not t.fits] == [4]


@pytest.mark.parametrize("bad", [{"cap": 0}, {"cap": 10, "start": 0}, {"cap": 10, "start": 11}])
def test_bad_arguments_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        find_max_batch_size(MemoryCurve(0, 1, 100), **bad)


def test_margin_and_rounding_are_separate_steps() -> None:
    assert apply_margin(100, 0.1) == 90
    assert apply_margin(1, 0.5) == 1
    assert round_down(90, 8) == 88
    assert round_down(5, 8) == 5  # below the multiple: keep what ran
    with pytest.raises(ValueError, match="margin"):
        apply_margin(10, 1.0)


def test_confirm_runs_the_final_size_and_steps_down_if_it_no_longer_fits() -> None:
    flaky = MemoryCurve(0, 10, 10 * 70)  # the limit dropped to 70 since the search
    confirmed = confirm(flaky, 88, multiple=8)
    assert confirmed.batch_size == 64  # 88 -> 80 -> 72 all fail, 64 runs
    assert [t.batch_size for t in confirmed.trials] == [88, 80, 72, 64]
    assert confirmed.trials[-1].fits


def test_confirm_never_returns_a_size_that_did_not_run() -> None:
    assert confirm(MemoryCurve(0, 10, 5), 16).batch_size is None
