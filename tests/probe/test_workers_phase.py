"""Which worker counts the workers phase measures: the recorded machine's CPUs, never more than
this process may run on (the workers start here)."""

from __future__ import annotations

import pytest

from tests.rules.helpers import snapshot, with_host
from torch_autotune.probe import workers_phase
from torch_autotune.rules.engine import build_profile


@pytest.mark.parametrize(
    ("recorded", "here", "expected"),
    [
        (16, 2, 1),  # a CPU profile measures half the CPUs: 8 on the laptop, 1 on this box
        (16, 64, 8),
        (4, 64, 2),
        (16, None, 8),  # no affinity to read: the recorded machine's own count
    ],
)
def test_a_cpu_profile_measures_at_most_the_cpus_this_process_has(
    monkeypatch: pytest.MonkeyPatch, recorded: int, here: int | None, expected: int
) -> None:
    machine = with_host("cpu-laptop-linux", cpus_usable=recorded)
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: here)
    profile = build_profile(machine)
    assert profile.device == "cpu"
    assert workers_phase._max_workers(profile) == expected


def test_a_gpu_profile_shares_the_cpus_among_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = snapshot("a100-sxm4-80gb-8x")
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 10_000)
    profile = build_profile(machine)
    gpus = len(machine.accelerators)
    assert workers_phase._max_workers(profile) == machine.host.cpus_usable // gpus
    monkeypatch.setattr(workers_phase, "_process_cpus", lambda: 2)
    assert workers_phase._max_workers(profile) == 1


def test_this_process_has_at_least_one_cpu() -> None:
    assert (workers_phase._process_cpus() or 1) >= 1
