"""The one timer, with an injected clock (``torch_autotune.probe.timing``).

A fake clock hands out known times and logs every read, so the tests see exactly what is timed
and that the device is synchronised before every read the timer times with; one real timing
of a tiny CPU op checks only that time passes.
CUDA is never touched: ``is_initialized`` and ``synchronize`` are replaced by recorders.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_autotune.probe.timing import Timer, device_sync


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


# --- Timer ---------------------------------------------------------------------------------------


def test_sync_runs_before_every_clock_read() -> None:
    script = Script([0.0, 1.5])
    timer = Timer(clock=script.clock, sync=script.sync)
    assert timer.seconds(script.fn, count=2) == 1.5
    assert script.log == ["sync", "clock", "fn", "fn", "sync", "clock"]


def test_on_the_cpu_only_the_clock_is_read() -> None:
    script = Script([0.0, 0.25])
    assert Timer("cpu", clock=script.clock).seconds(script.fn) == 0.25
    assert script.log == ["clock", "fn", "clock"]


def test_run_for_checks_the_deadline_on_the_clock_alone() -> None:
    # start 0 (synced); two calls unchecked; deadline checks 0.4, then 1.2 (past 1 s); end 1.3
    script = Script([0.0, 0.4, 1.2, 1.3])
    timer = Timer(clock=script.clock, sync=script.sync)
    calls, seconds = timer.run_for(script.fn, seconds=1.0, min_calls=2)
    assert (calls, seconds) == (3, 1.3)
    assert script.log == ["sync", "clock", "fn", "fn", "clock", "fn", "clock", "sync", "clock"]


@given(
    st.integers(min_value=0, max_value=20),
    st.lists(st.floats(min_value=1e-3, max_value=10.0), min_size=1, max_size=30),
    st.floats(min_value=0.0, max_value=5.0),
)
def test_run_for_runs_at_least_min_calls_and_until_the_time_is_up(
    min_calls: int, steps: list[float], seconds: float
) -> None:
    now = [0.0]
    durations = itertools.cycle(steps)  # as long as the run needs: 1 ms steps for 5 s

    def fn() -> None:
        now[0] += next(durations)

    calls, elapsed = Timer(clock=lambda: now[0], sync=lambda: None).run_for(
        fn, seconds=seconds, min_calls=min_calls
    )
    assert calls >= min_calls
    assert elapsed == pytest.approx(now[0])
    assert elapsed >= seconds
    assert calls == min_calls or elapsed - steps[(calls - 1) % len(steps)] < seconds + 1e-9


def test_real_timing_of_a_tiny_cpu_op() -> None:
    x = torch.ones(256)
    seconds = Timer("cpu").seconds(lambda: x.mul(2.0).sum(), count=3)
    assert seconds > 0


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


@pytest.mark.child_process
def test_importing_timing_imports_no_torch() -> None:
    code = "import sys, torch_autotune.probe.timing; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
