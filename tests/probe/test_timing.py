"""Timing with an injected clock (``torch_autotune.probe.timing``).

A fake clock hands out known times and logs every read, so the tests see exactly what is timed:
warm-up calls are not, and the device is synchronised before every read. Summaries are checked
on known samples; one real measurement of a tiny CPU op checks only the shape of the result.
CUDA is never touched: ``is_initialized`` and ``synchronize`` are replaced by recorders.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_autotune.probe.timing import Timing, device_sync, measure


class Script:
    """A fake clock, a fake device sync and a function to time, logging calls in order."""

    def __init__(self, times: Iterable[float]) -> None:
        self.times = iter(times)
        self.log: list[str] = []

    def clock(self) -> float:
        self.log.append("clock")
        return next(self.times)

    def sync(self) -> None:
        self.log.append("sync")

    def fn(self) -> None:
        self.log.append("fn")


# --- measure -------------------------------------------------------------------------------------


def test_warmup_runs_but_is_not_timed() -> None:
    script = Script([10.0, 10.5, 20.0, 21.0])
    timing = measure(script.fn, repeats=2, warmup=3, clock=script.clock)
    assert script.log[:3] == ["fn", "fn", "fn"]
    assert script.log.count("fn") == 5
    assert timing.samples_s == (0.5, 1.0)


def test_sync_runs_before_every_clock_read() -> None:
    script = Script([0.0, 1.0, 1.0, 3.0])
    timing = measure(script.fn, repeats=2, warmup=1, clock=script.clock, sync=script.sync)
    one_sample = ["sync", "clock", "fn", "sync", "clock"]
    assert script.log == ["fn", *one_sample, *one_sample]
    assert timing.samples_s == (1.0, 2.0)


def test_without_sync_only_the_clock_is_read() -> None:
    script = Script([0.0, 0.25])
    measure(script.fn, repeats=1, warmup=0, clock=script.clock)
    assert script.log == ["clock", "fn", "clock"]


@pytest.mark.parametrize(
    ("repeats", "warmup", "message"),
    [
        pytest.param(0, 1, "repeats must be >= 1, got 0", id="no-repeats"),
        pytest.param(-2, 1, "repeats must be >= 1, got -2", id="negative-repeats"),
        pytest.param(3, -1, "warmup must be >= 0, got -1", id="negative-warmup"),
    ],
)
def test_counts_are_validated_before_anything_runs(repeats: int, warmup: int, message: str) -> None:
    script = Script([])
    with pytest.raises(ValueError, match=message):
        measure(script.fn, repeats=repeats, warmup=warmup, clock=script.clock)
    assert script.log == []


def test_a_clock_that_goes_backwards_is_refused() -> None:
    script = Script([5.0, 4.0])
    with pytest.raises(ValueError, match="is the clock monotonic"):
        measure(script.fn, repeats=1, warmup=0, clock=script.clock)


# --- Timing --------------------------------------------------------------------------------------


def test_median_and_interquartile_spread_from_four_samples_up() -> None:
    timing = Timing((4.0, 1.0, 3.0, 2.0, 100.0))
    assert timing.median_s == 3.0
    # inclusive quartiles of 1, 2, 3, 4, 100: 2.0 and 4.0; the outlier does not widen them
    assert timing.spread_s == pytest.approx(2.0)
    assert timing.min_s == 1.0
    assert timing.max_s == 100.0


def test_spread_of_four_samples_interpolates_quartiles() -> None:
    timing = Timing((1.0, 2.0, 3.0, 4.0))
    assert timing.median_s == 2.5
    assert timing.spread_s == pytest.approx(3.25 - 1.75)


def test_spread_below_four_samples_is_the_range() -> None:
    assert Timing((0.3, 0.1, 0.2)).spread_s == pytest.approx(0.2)
    assert Timing((0.5,)).spread_s == 0.0


@given(st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=1, max_size=50))
def test_summaries_stay_inside_the_samples(samples: list[float]) -> None:
    timing = Timing(tuple(samples))
    assert timing.min_s <= timing.median_s <= timing.max_s
    assert 0.0 <= timing.spread_s <= (timing.max_s - timing.min_s) * (1 + 1e-12)
    assert timing.samples_s == tuple(samples)


def test_timing_is_frozen() -> None:
    timing = Timing((1.0,))
    with pytest.raises(AttributeError):
        timing.median_s = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "samples",
    [
        pytest.param((), id="empty"),
        pytest.param((1.0, -0.1), id="negative"),
        pytest.param((float("nan"),), id="nan"),
        pytest.param((float("inf"),), id="inf"),
    ],
)
def test_timing_refuses_impossible_samples(samples: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="sample"):
        Timing(samples)


def test_throughput_is_items_per_second_at_the_median() -> None:
    timing = Timing((0.5, 0.25, 0.25, 1.0, 0.25))
    assert timing.throughput(64) == pytest.approx(64 / 0.25)


@pytest.mark.parametrize("items", [0, -8])
def test_throughput_needs_positive_items(items: int) -> None:
    with pytest.raises(ValueError, match="items_per_call must be > 0"):
        Timing((0.1,)).throughput(items)


def test_throughput_of_a_zero_median_is_refused_not_infinite() -> None:
    with pytest.raises(ValueError, match="median duration is 0 s"):
        Timing((0.0, 0.0, 1.0)).throughput(32)


def test_real_measurement_of_a_tiny_cpu_op() -> None:
    x = torch.ones(256)
    timing = measure(lambda: x.mul(2.0).sum(), repeats=3, warmup=1)
    assert len(timing.samples_s) == 3
    assert timing.median_s > 0
    assert timing.min_s <= timing.median_s <= timing.max_s


# --- device_sync ---------------------------------------------------------------------------------


class Recorder:
    """A stand-in for a torch function: records its arguments, returns None."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, *args: object) -> None:
        self.calls.append(args)


def test_cpu_needs_no_sync() -> None:
    assert device_sync("cpu") is None


def test_cuda_sync_waits_only_once_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    synchronize = Recorder()
    initialised = [False]
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised[0])
    sync = device_sync("cuda:1")
    assert sync is not None
    sync()
    assert synchronize.calls == []
    initialised[0] = True  # the step initialised CUDA during warm-up, after device_sync ran
    sync()
    assert synchronize.calls == [("cuda:1",)]


def test_mps_sync_is_torch_mps_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    synchronize = Recorder()
    monkeypatch.setattr(torch.mps, "synchronize", synchronize)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    sync = device_sync("mps")
    assert sync is synchronize


def test_mps_without_the_backend_needs_no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert device_sync("mps") is None


def test_device_sync_rejects_an_unknown_device() -> None:
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        device_sync("tpu")


def test_importing_timing_imports_no_torch() -> None:
    code = "import sys, torch_autotune.probe.timing; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
